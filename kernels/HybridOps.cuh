//===- HybridOps.cuh - The hybrid targets' elementwise kernels -*- CUDA -*-===//
//
// The Qwen3.5 / Qwen3-Next ops beside the gated delta rule
// (GatedDeltaRule.cuh), on bf16 tensors with fp32 arithmetic, each the
// semantics of its dflash op (docs/dialect.md):
// - causal_conv_bf16: a thread 8 channels of a run of 16 tokens, the taps
//   in the token's conversation, then SiLU;
// - zero_centred_rms_norm_bf16: a warp a row, x rsqrt(mean x^2 + eps)
//   (1 + w);
// - gated_rms_norm_bf16: a warp a row, x rsqrt(mean x^2 + eps) w silu(z);
// - partial_rope_bf16: a thread a (row, head, dimension), rope of the first
//   rotaryDim dimensions, the rest copied;
// - sigmoid_gate_bf16: x sigmoid(gate), one gate a row or one an element.
// dflash-select-kernels picks them for the hybrid ops; split_last is a
// strided copy (CompiledStep::copyBand), not a kernel here.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_HYBRIDOPS_CUH
#define DFLASH_KERNELS_HYBRIDOPS_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/DeltaNetLimits.h"
#include "kernels/Reduce.cuh"

#include <climits>
#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

namespace detail {

constexpr int kHybridThreads = 256;

inline unsigned hybridBlocks(int64_t n) {
  return unsigned((n + kHybridThreads - 1) / kHybridThreads);
}

__device__ inline float siluf(float x) { return x / (1.f + __expf(-x)); }

/// causal_conv_bf16's tiling: a thread holds kConvChannels consecutive
/// channels (one 16-byte vector of x and y a token) and walks kConvTokens
/// tokens, its K taps' inputs sliding in registers, so that x is read about
/// once (plus K - 1 tokens before each run) and y written once: the op is
/// memory-bound, and a thread a (token, channel) with 64-bit index
/// arithmetic ran it at a ninth of the copy rate.
constexpr int kConvChannels = 8;
constexpr int kConvTokens = 16;
constexpr int kConvThreads = 128;

template <int K>
static __global__ void __launch_bounds__(kConvThreads)
    causalConvKernel(const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                     const int32_t *pos, __nv_bfloat16 *y, int S, int C) {
  const int group = blockIdx.x * blockDim.x + threadIdx.x;
  if (group * kConvChannels >= C)
    return;
  const int c0 = group * kConvChannels, t0 = blockIdx.y * kConvTokens;
  const int64_t rowBase = int64_t(blockIdx.z) * S;
  const int32_t *p = pos + rowBase;
  // Taps [j][channel] of w [C, K]: tap j multiplies token t - (K - 1) + j.
  float taps[K][kConvChannels];
#pragma unroll
  for (int c = 0; c < kConvChannels; ++c)
#pragma unroll
    for (int j = 0; j < K; ++j)
      taps[j][c] = __bfloat162float(w[int64_t(c0 + c) * K + j]);
  // The window of inputs and their positions: slot j holds token
  // t - (K - 1) + j (zeros and an impossible position before the row).
  float in[K][kConvChannels];
  int inPos[K];
  auto load = [&](int slot, int t) {
    if (t >= 0 && t < S) {
      unpackBf16x8(*reinterpret_cast<const uint4 *>(x + (rowBase + t) * C + c0),
                   in[slot]);
      inPos[slot] = p[t];
    } else {
#pragma unroll
      for (int c = 0; c < kConvChannels; ++c)
        in[slot][c] = 0.f;
      inPos[slot] = INT_MIN;
    }
  };
#pragma unroll
  for (int j = 0; j < K - 1; ++j)
    load(j, t0 - (K - 1) + j);
  const int tEnd = min(S, t0 + kConvTokens);
  for (int t = t0; t < tEnd; ++t) {
    load(K - 1, t);
    float acc[kConvChannels] = {};
#pragma unroll
    for (int j = 0; j < K; ++j) {
      // Token t - (K - 1 - j) is in t's conversation iff the positions
      // step by one from it to t (the reference's rule).
      const bool seen =
          inPos[j] != INT_MIN && inPos[K - 1] - inPos[j] == K - 1 - j;
      if (seen)
#pragma unroll
        for (int c = 0; c < kConvChannels; ++c)
          acc[c] += taps[j][c] * in[j][c];
    }
#pragma unroll
    for (int c = 0; c < kConvChannels; ++c)
      acc[c] = siluf(acc[c]);
    *reinterpret_cast<uint4 *>(y + (rowBase + t) * C + c0) = packBf16x8(acc);
#pragma unroll
    for (int j = 0; j + 1 < K; ++j) {
      inPos[j] = inPos[j + 1];
#pragma unroll
      for (int c = 0; c < kConvChannels; ++c)
        in[j][c] = in[j + 1][c];
    }
  }
}

/// A warp a row of D: rsqrt(mean(x^2) + eps) of the row.
__device__ inline float warpInverseRms(const __nv_bfloat16 *x, int64_t D,
                                       float eps) {
  float s = 0.f;
  for (int64_t i = threadIdx.x % 32; i < D; i += 32) {
    const float v = __bfloat162float(x[i]);
    s += v * v;
  }
  for (int o = 16; o > 0; o /= 2)
    s += __shfl_xor_sync(0xffffffffu, s, o);
  return rsqrtf(s / float(D) + eps);
}

/// gate == nullptr: zero-centred (1 + w); else w silu(gate).
static __global__ void hybridRmsNormKernel(const __nv_bfloat16 *x,
                                           const __nv_bfloat16 *gate,
                                           const __nv_bfloat16 *w,
                                           __nv_bfloat16 *y, int64_t rows,
                                           int64_t D, float eps) {
  const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (r >= rows)
    return;
  const __nv_bfloat16 *xr = x + r * D;
  const float inv = warpInverseRms(xr, D, eps);
  for (int64_t i = threadIdx.x % 32; i < D; i += 32) {
    const float n = __bfloat162float(xr[i]) * inv;
    const float wi = __bfloat162float(w[i]);
    const float out = gate ? n * wi * siluf(__bfloat162float(gate[r * D + i]))
                           : n * (1.f + wi);
    y[r * D + i] = __float2bfloat16(out);
  }
}

static __global__ void partialRopeKernel(const __nv_bfloat16 *x,
                                         const int32_t *pos, __nv_bfloat16 *y,
                                         int64_t rows, int64_t heads, int d,
                                         int rotaryDim, float theta) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= rows * heads * d)
    return;
  const int i = int(e % d);
  const int64_t vec = e / d, row = vec / heads;
  const __nv_bfloat16 *xv = x + vec * d;
  if (i >= rotaryDim) {
    y[e] = xv[i];
    return;
  }
  const int half = rotaryDim / 2, f = i % half;
  const float inv = 1.f / powf(theta, float(2 * f) / float(rotaryDim));
  float s, c;
  sincosf(float(pos[row]) * inv, &s, &c);
  const float self = __bfloat162float(xv[i]);
  const float other = __bfloat162float(xv[i < half ? i + half : i - half]);
  y[e] =
      __float2bfloat16(i < half ? self * c - other * s : self * c + other * s);
}

static __global__ void sigmoidGateKernel(const __nv_bfloat16 *x,
                                         const __nv_bfloat16 *gate,
                                         __nv_bfloat16 *y, int64_t n,
                                         int64_t perGate) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  const float g = __bfloat162float(gate[i / perGate]);
  y[i] = __float2bfloat16(__bfloat162float(x[i]) / (1.f + __expf(-g)));
}

} // namespace detail

/// y [B, S, C] = silu of the causal depthwise conv of x [B, S, C] by w
/// [C, K] within each token's conversation (pos [B, S]); C a multiple of 8
/// and K of 1 to kCausalConvMaxTaps (causalConvSupports, DeltaNetLimits.h).
inline void causal_conv_bf16(const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                             const int32_t *pos, __nv_bfloat16 *y, int64_t B,
                             int64_t S, int64_t C, int64_t K,
                             cudaStream_t stream) {
  if (!causalConvSupports(C, K))
    detail::reportCudaFailure(__FILE__, __LINE__, "causal_conv_bf16",
                              "channels a multiple of 8, 1 to 4 taps");
  if (B <= 0 || S <= 0)
    return;
  const dim3 grid(
      unsigned((C / detail::kConvChannels + detail::kConvThreads - 1) /
               detail::kConvThreads),
      unsigned((S + detail::kConvTokens - 1) / detail::kConvTokens),
      unsigned(B));
  auto launch = [&](auto kernel) {
    kernel<<<grid, detail::kConvThreads, 0, stream>>>(x, w, pos, y, int(S),
                                                      int(C));
  };
  if (K == 1)
    launch(detail::causalConvKernel<1>);
  else if (K == 2)
    launch(detail::causalConvKernel<2>);
  else if (K == 3)
    launch(detail::causalConvKernel<3>);
  else
    launch(detail::causalConvKernel<4>);
  DFLASH_CUDA_CHECK_LAUNCH("causal_conv_bf16");
}

/// y = x rsqrt(mean(x^2) + eps) (1 + w), rows of D.
inline void zero_centred_rms_norm_bf16(const __nv_bfloat16 *x,
                                       const __nv_bfloat16 *w, __nv_bfloat16 *y,
                                       int64_t rows, int64_t D, float eps,
                                       cudaStream_t stream) {
  detail::hybridRmsNormKernel<<<detail::hybridBlocks(rows * 32),
                                detail::kHybridThreads, 0, stream>>>(
      x, nullptr, w, y, rows, D, eps);
  DFLASH_CUDA_CHECK_LAUNCH("hybridRmsNormKernel");
}

/// y = x rsqrt(mean(x^2) + eps) w silu(gate), rows of D.
inline void gated_rms_norm_bf16(const __nv_bfloat16 *x,
                                const __nv_bfloat16 *gate,
                                const __nv_bfloat16 *w, __nv_bfloat16 *y,
                                int64_t rows, int64_t D, float eps,
                                cudaStream_t stream) {
  detail::hybridRmsNormKernel<<<detail::hybridBlocks(rows * 32),
                                detail::kHybridThreads, 0, stream>>>(
      x, gate, w, y, rows, D, eps);
  DFLASH_CUDA_CHECK_LAUNCH("hybridRmsNormKernel");
}

/// rope of the first rotaryDim dimensions of each head of x [rows, heads,
/// d] at pos [rows] (frequencies over rotaryDim); the rest copied.
inline void partial_rope_bf16(const __nv_bfloat16 *x, const int32_t *pos,
                              __nv_bfloat16 *y, int64_t rows, int64_t heads,
                              int64_t d, int64_t rotaryDim, float theta,
                              cudaStream_t stream) {
  detail::partialRopeKernel<<<detail::hybridBlocks(rows * heads * d),
                              detail::kHybridThreads, 0, stream>>>(
      x, pos, y, rows, heads, int(d), int(rotaryDim), theta);
  DFLASH_CUDA_CHECK_LAUNCH("partialRopeKernel");
}

/// y [n] = x sigmoid(gate), gate[i / perGate] (perGate 1: one an element;
/// the last dimension: one a row).
inline void sigmoid_gate_bf16(const __nv_bfloat16 *x, const __nv_bfloat16 *gate,
                              __nv_bfloat16 *y, int64_t n, int64_t perGate,
                              cudaStream_t stream) {
  detail::sigmoidGateKernel<<<detail::hybridBlocks(n), detail::kHybridThreads,
                              0, stream>>>(x, gate, y, n, perGate);
  DFLASH_CUDA_CHECK_LAUNCH("sigmoidGateKernel");
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_HYBRIDOPS_CUH
