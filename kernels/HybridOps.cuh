//===- HybridOps.cuh - The hybrid targets' elementwise kernels -*- CUDA -*-===//
//
// The Qwen3.5 / Qwen3-Next ops beside the gated delta rule
// (GatedDeltaRule.cuh), on bf16 tensors with fp32 arithmetic, each the
// semantics of its dflash op (docs/dialect.md):
// - causal_conv_bf16: a thread a (token, channel), the taps in the token's
//   conversation, then SiLU;
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

#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

namespace detail {

constexpr int kHybridThreads = 256;

inline unsigned hybridBlocks(int64_t n) {
  return unsigned((n + kHybridThreads - 1) / kHybridThreads);
}

__device__ inline float siluf(float x) { return x / (1.f + __expf(-x)); }

static __global__ void causalConvKernel(const __nv_bfloat16 *x,
                                        const __nv_bfloat16 *w,
                                        const int32_t *pos, __nv_bfloat16 *y,
                                        int64_t B, int64_t S, int64_t C,
                                        int K) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= B * S * C)
    return;
  const int64_t c = i % C, token = i / C, t = token % S, row = token / S;
  const int32_t *p = pos + row * S;
  float acc = 0.f;
  for (int j = 0; j < K; ++j) {
    const int64_t src = t - (K - 1) + j;
    if (src >= 0 && int64_t(p[t]) - int64_t(p[src]) == t - src)
      acc += __bfloat162float(w[c * K + j]) *
             __bfloat162float(x[(row * S + src) * C + c]);
  }
  y[i] = __float2bfloat16(siluf(acc));
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
/// [C, K] within each token's conversation (pos [B, S]).
inline void causal_conv_bf16(const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                             const int32_t *pos, __nv_bfloat16 *y, int64_t B,
                             int64_t S, int64_t C, int64_t K,
                             cudaStream_t stream) {
  detail::causalConvKernel<<<detail::hybridBlocks(B * S * C),
                             detail::kHybridThreads, 0, stream>>>(
      x, w, pos, y, B, S, C, int(K));
  DFLASH_CUDA_CHECK_LAUNCH("causalConvKernel");
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
