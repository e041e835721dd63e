//===- DFlash2Conv.cuh - The DFlash2 grouped convolution -------*- CUDA -*-===//
//
// dflash.grouped_conv and dflash.grouped_conv_grad (docs/semantics.md
// section 13, "Convolution"; ref::groupedConv, ref::groupedConvGrad) on bf16
// tensors, fp32 arithmetic, each result rounded once:
// - grouped_conv_bf16: a thread takes 8 channels (one 16-byte vector) of one
//   draft block and walks its bs slots, the kc inputs its taps read sliding
//   in registers, so the input is read once, the result written once and
//   each slot's kc deltas read once per thread (the gs / 8 threads of a group
//   read the same ones: one transaction);
// - grouped_conv_grad_bf16: the same walk over dy and the input. input_grad
//   is scattered: slot s adds its taps' (base + delta) * dy[s] to the kc
//   slots it read, held in registers until no later slot reads them; the
//   delta gradient of a group is its gs / 8 threads' dot products summed by
//   warp shuffles; the base gradient is summed in registers over the blocks
//   a CTA walks, one fp32 partial a CTA, then added over the partials in a
//   fixed order (detail::columnSum), so it does not depend on scheduling as
//   fp32 atomics would.
// The op is memory-bound (kc multiply-adds a loaded element) and runs as its
// own pass: at the 27B shape both kernels are 1.8% of the step, and fusion
// into the neighbouring norm or GEMM would win only part of that
// (docs/kernels.md).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_DFLASH2CONV_CUH
#define DFLASH_KERNELS_DFLASH2CONV_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/GroupedConvLimits.h"
#include "kernels/Reduce.cuh"
#include "kernels/Workspaces.h"

#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

namespace detail {

constexpr int kGroupedConvThreads = 128;

/// A CTA's threads for `vectors` 16-byte vectors a row: whole warps (the
/// gradient's shuffles take every lane), at most kGroupedConvThreads.
inline int groupedConvThreads(int64_t vectors) {
  const int64_t t = (vectors + 31) / 32 * 32;
  return int(t < kGroupedConvThreads ? t : kGroupedConvThreads);
}

/// 8 bf16 of `p` (16-byte aligned) as floats.
__device__ __forceinline__ void loadBf16x8(const __nv_bfloat16 *p,
                                           float (&f)[8]) {
  unpackBf16x8(*reinterpret_cast<const uint4 *>(p), f);
}

/// blockIdx.x: a draft block (b * N + n); blockIdx.y * blockDim.x +
/// threadIdx.x: a vector of 8 channels. `base` is the half's [K, H] row,
/// `delta` the whole D [rows, 2 * K * G].
template <int K>
__global__ void __launch_bounds__(kGroupedConvThreads)
    groupedConvKernel(const __nv_bfloat16 *x, const __nv_bfloat16 *delta,
                      const __nv_bfloat16 *base, __nv_bfloat16 *y, int H,
                      int bs, int gs, int half) {
  const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
  if (c0 >= H)
    return;
  const int G = H / gs;
  const int64_t stride = int64_t(2) * K * G;
  const int64_t slot0 = int64_t(blockIdx.x) * bs;
  float w[K][8];
#pragma unroll
  for (int o = 0; o < K; ++o)
    loadBf16x8(base + o * H + c0, w[o]);
  // in[o]: the input at slot s - o (never read before the block: o <= k).
  float in[K][8] = {};
  const __nv_bfloat16 *d = delta + slot0 * stride + half * K * G + c0 / gs;
  for (int k = 0; k < bs; ++k) {
    const int64_t s = slot0 + k;
#pragma unroll
    for (int o = K - 1; o > 0; --o)
#pragma unroll
      for (int c = 0; c < 8; ++c)
        in[o][c] = in[o - 1][c];
    loadBf16x8(x + s * H + c0, in[0]);
    float acc[8] = {};
#pragma unroll
    for (int o = 0; o < K; ++o) {
      if (o > k)
        break;
      const float t = __bfloat162float(d[k * stride + o * G]);
#pragma unroll
      for (int c = 0; c < 8; ++c)
        acc[c] += (w[o][c] + t) * in[o][c];
    }
    *reinterpret_cast<uint4 *>(y + s * H + c0) = packBf16x8(acc);
  }
}

/// blockIdx.x: partial p, which walks draft blocks p, p + gridDim.x, ...;
/// blockIdx.y * blockDim.x + threadIdx.x: a vector of 8 channels. Every
/// lane runs every step (lanes past H with zeros) for the group shuffles.
/// Writes dx, both halves of dDelta (the other one 0) and partials
/// [gridDim.x, K, H].
template <int K>
__global__ void __launch_bounds__(kGroupedConvThreads)
    groupedConvGradKernel(const __nv_bfloat16 *dy, const __nv_bfloat16 *x,
                          const __nv_bfloat16 *delta, const __nv_bfloat16 *base,
                          __nv_bfloat16 *dx, __nv_bfloat16 *dDelta,
                          float *partials, int64_t blocks, int H, int bs,
                          int gs, int half) {
  const int v = blockIdx.y * blockDim.x + threadIdx.x;
  const int c0 = v * 8;
  const bool active = c0 < H;
  const int G = H / gs, g = active ? c0 / gs : 0;
  // A group's threads: a power of two of at most 32 (groupedConvSupports),
  // aligned in the warp, since blockDim.x is whole warps.
  const int lanes = gs / 8;
  const bool leader = active && v % lanes == 0;
  const int64_t stride = int64_t(2) * K * G;
  const int own = half * K * G + g, other = (1 - half) * K * G + g;
  float w[K][8] = {};
  if (active)
#pragma unroll
    for (int o = 0; o < K; ++o)
      loadBf16x8(base + o * H + c0, w[o]);
  float baseAcc[K][8] = {};
  for (int64_t r = blockIdx.x; r < blocks; r += gridDim.x) {
    const int64_t slot0 = r * bs;
    // in[o]: the input at slot s - o; acc[j]: dx at slot s - j, still
    // taking the terms of later slots.
    float in[K][8] = {}, acc[K][8] = {};
    for (int k = 0; k < bs; ++k) {
      const int64_t s = slot0 + k;
      // dx at s - K has every term (outputs s - K .. s - 1 read it).
      if (active && k >= K)
        *reinterpret_cast<uint4 *>(dx + (s - K) * H + c0) =
            packBf16x8(acc[K - 1]);
#pragma unroll
      for (int o = K - 1; o > 0; --o)
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          in[o][c] = in[o - 1][c];
          acc[o][c] = acc[o - 1][c];
        }
      float gy[8] = {};
#pragma unroll
      for (int c = 0; c < 8; ++c)
        acc[0][c] = in[0][c] = 0.f;
      if (active) {
        loadBf16x8(x + s * H + c0, in[0]);
        loadBf16x8(dy + s * H + c0, gy);
      }
#pragma unroll
      for (int o = 0; o < K; ++o) {
        float dot = 0.f;
        if (o <= k && active) {
          const float t = __bfloat162float(delta[s * stride + own + o * G]);
#pragma unroll
          for (int c = 0; c < 8; ++c) {
            acc[o][c] += (w[o][c] + t) * gy[c];
            const float p = gy[c] * in[o][c];
            dot += p;
            baseAcc[o][c] += p;
          }
        }
        // The group's sum (o and k are the same in every lane).
        for (int m = lanes / 2; m > 0; m /= 2)
          dot += __shfl_xor_sync(0xffffffffu, dot, m);
        if (leader) {
          dDelta[s * stride + own + o * G] = __float2bfloat16(dot);
          dDelta[s * stride + other + o * G] = __float2bfloat16(0.f);
        }
      }
    }
    // The block's last min(K, bs) slots.
    if (active)
#pragma unroll
      for (int j = 0; j < K; ++j)
        if (j < bs)
          *reinterpret_cast<uint4 *>(dx + (slot0 + bs - 1 - j) * H + c0) =
              packBf16x8(acc[j]);
  }
  if (active)
#pragma unroll
    for (int o = 0; o < K; ++o) {
      float4 *p = reinterpret_cast<float4 *>(
          partials + (int64_t(blockIdx.x) * K + o) * H + c0);
      p[0] = make_float4(baseAcc[o][0], baseAcc[o][1], baseAcc[o][2],
                         baseAcc[o][3]);
      p[1] = make_float4(baseAcc[o][4], baseAcc[o][5], baseAcc[o][6],
                         baseAcc[o][7]);
    }
}

/// Refuses a shape the kernels were not built for (dflash-select-kernels
/// refuses it first, naming the spec field).
inline void checkGroupedConvShape(const GroupedConvShape &shape,
                                  const char *name) {
  if (!groupedConvSupports(shape.H, shape.kc, shape.gs) || shape.bs < 1 ||
      shape.Q % shape.bs != 0 || (shape.half != 0 && shape.half != 1))
    reportCudaFailure(__FILE__, __LINE__, name,
                      "H a multiple of 8 and of the group size, groups of 8 "
                      "to 256 channels (a power of two of vectors), 1 to 4 "
                      "taps, whole blocks, half 0 or 1");
}

} // namespace detail

/// y [B, Q, H] = the grouped convolution of x [B, Q, H] (ref::groupedConv):
/// delta the layer's whole D [B, Q, 2 * kc * G] of which half `shape.half`
/// is read, base [kc, H] or (wholeBase) [2, kc, H] of which that row is.
inline void grouped_conv_bf16(const __nv_bfloat16 *x,
                              const __nv_bfloat16 *delta,
                              const __nv_bfloat16 *base, __nv_bfloat16 *y,
                              GroupedConvShape shape, cudaStream_t stream) {
  detail::checkGroupedConvShape(shape, "grouped_conv_bf16");
  const int64_t blocks = shape.blocks();
  if (blocks <= 0)
    return;
  const int64_t vectors = shape.H / 8;
  const int threads = detail::groupedConvThreads(vectors);
  const dim3 grid(unsigned(blocks),
                  unsigned((vectors + threads - 1) / threads));
  const __nv_bfloat16 *w =
      base + (shape.wholeBase ? shape.half * shape.kc * shape.H : 0);
  auto launch = [&](auto kernel) {
    kernel<<<grid, threads, 0, stream>>>(x, delta, w, y, int(shape.H),
                                         int(shape.bs), int(shape.gs),
                                         int(shape.half));
  };
  if (shape.kc == 1)
    launch(detail::groupedConvKernel<1>);
  else if (shape.kc == 2)
    launch(detail::groupedConvKernel<2>);
  else if (shape.kc == 3)
    launch(detail::groupedConvKernel<3>);
  else
    launch(detail::groupedConvKernel<4>);
  DFLASH_CUDA_CHECK_LAUNCH("grouped_conv_bf16");
}

/// The gradients of grouped_conv_bf16 given dy [B, Q, H]
/// (ref::groupedConvGrad): dx [B, Q, H]; dDelta [B, Q, 2 * kc * G], this
/// half's entries and 0 in the other half's; dBase like base, row `half` of
/// a [2, kc, H] one and 0 in the other row. workspace: fp32,
/// groupedConvGradWorkspaceBytes(shape.blocks(), kc, H) bytes.
inline void grouped_conv_grad_bf16(const __nv_bfloat16 *dy,
                                   const __nv_bfloat16 *x,
                                   const __nv_bfloat16 *delta,
                                   const __nv_bfloat16 *base, __nv_bfloat16 *dx,
                                   __nv_bfloat16 *dDelta, __nv_bfloat16 *dBase,
                                   float *workspace, GroupedConvShape shape,
                                   cudaStream_t stream) {
  detail::checkGroupedConvShape(shape, "grouped_conv_grad_bf16");
  const int64_t blocks = shape.blocks();
  const int64_t baseRow = shape.kc * shape.H;
  const int64_t own = shape.wholeBase ? shape.half * baseRow : 0;
  if (shape.wholeBase)
    DFLASH_CUDA_CHECK(cudaMemsetAsync(dBase + (1 - shape.half) * baseRow, 0,
                                      size_t(baseRow) * sizeof(__nv_bfloat16),
                                      stream));
  if (blocks <= 0) {
    DFLASH_CUDA_CHECK(cudaMemsetAsync(
        dBase + own, 0, size_t(baseRow) * sizeof(__nv_bfloat16), stream));
    return;
  }
  const int64_t partials = groupedConvGradPartials(blocks);
  const int64_t vectors = shape.H / 8;
  const int threads = detail::groupedConvThreads(vectors);
  const dim3 grid(unsigned(partials),
                  unsigned((vectors + threads - 1) / threads));
  auto launch = [&](auto kernel) {
    kernel<<<grid, threads, 0, stream>>>(
        dy, x, delta, base + own, dx, dDelta, workspace, blocks, int(shape.H),
        int(shape.bs), int(shape.gs), int(shape.half));
  };
  if (shape.kc == 1)
    launch(detail::groupedConvGradKernel<1>);
  else if (shape.kc == 2)
    launch(detail::groupedConvGradKernel<2>);
  else if (shape.kc == 3)
    launch(detail::groupedConvGradKernel<3>);
  else
    launch(detail::groupedConvGradKernel<4>);
  DFLASH_CUDA_CHECK_LAUNCH("grouped_conv_grad_bf16");
  detail::columnSum(workspace, int(partials), int(baseRow), dBase + own,
                    stream);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_DFLASH2CONV_CUH
