//===- RmsNorm.cuh - RMSNorm with fused residual add -----------*- CUDA -*-===//
//
// y = x * rsqrt(mean(x^2) + eps) * w over rows of H bf16 values, fp32 math,
// one rounding at the end (docs/semantics.md section 3). The forward optionally
// adds a residual first (xSum = bf16(x + delta), stored, then normalised: the
// `x = x + attn; h = norm(x)` pair of the graph in one pass). The backward
// gives dx (optionally plus the residual stream's incoming gradient) and dw,
// reduced deterministically: per-CTA fp32 partials, then a column sum.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_RMSNORM_CUH
#define DFLASH_KERNELS_RMSNORM_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/Reduce.cuh"
#include "kernels/Workspaces.h"

#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

namespace detail {

/// One row per CTA pass, H / 8 16-byte vectors spread over Threads.
template <int H, int Threads> struct RmsNormTiling {
  static_assert(H % 8 == 0, "hidden size must be a multiple of 8");
  static constexpr int kVectors = H / 8;
  static constexpr int kThreads = Threads;
  static constexpr int kVecPerThread = (kVectors + kThreads - 1) / kThreads;
};
// The forward runs one CTA per row; the backward loops over rows in a fixed
// grid (for the weight partials), so it takes more threads per CTA to keep
// enough loads in flight.
constexpr int kRmsNormFwdThreads = 128;
constexpr int kRmsNormBwdThreads = 256;

template <int H>
__global__ void __launch_bounds__(kRmsNormFwdThreads)
    rms_norm_fwd_bf16_kernel(const __nv_bfloat16 *x, const __nv_bfloat16 *delta,
                             const __nv_bfloat16 *w, __nv_bfloat16 *xSum,
                             __nv_bfloat16 *y, float eps) {
  using T = RmsNormTiling<H, kRmsNormFwdThreads>;
  __shared__ float scratch[2 * T::kThreads / 32];
  const int64_t row = blockIdx.x;
  const uint4 *xv = reinterpret_cast<const uint4 *>(x + row * H);
  float v[T::kVecPerThread][8];
  float ss[1] = {0.f};
#pragma unroll
  for (int i = 0; i < T::kVecPerThread; ++i) {
    int c = threadIdx.x + i * T::kThreads;
    if (c >= T::kVectors)
      continue;
    unpackBf16x8(xv[c], v[i]);
    if (delta) {
      float d[8];
      unpackBf16x8(reinterpret_cast<const uint4 *>(delta + row * H)[c], d);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        v[i][e] += d[e];
      // The graph stores the sum in bf16 and normalises that stored value.
      uint4 packed = packBf16x8(v[i]);
      reinterpret_cast<uint4 *>(xSum + row * H)[c] = packed;
      unpackBf16x8(packed, v[i]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e)
      ss[0] += v[i][e] * v[i][e];
  }
  blockSum<1, T::kThreads>(ss, scratch, 0);
  const float r = rsqrtf(ss[0] / H + eps);
#pragma unroll
  for (int i = 0; i < T::kVecPerThread; ++i) {
    int c = threadIdx.x + i * T::kThreads;
    if (c >= T::kVectors)
      continue;
    float wf[8];
    unpackBf16x8(reinterpret_cast<const uint4 *>(w)[c], wf);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      v[i][e] = v[i][e] * r * wf[e];
    reinterpret_cast<uint4 *>(y + row * H)[c] = packBf16x8(v[i]);
  }
}

template <int H>
__global__ void __launch_bounds__(kRmsNormBwdThreads, 3)
    rms_norm_bwd_bf16_kernel(const __nv_bfloat16 *dy, const __nv_bfloat16 *x,
                             const __nv_bfloat16 *w,
                             const __nv_bfloat16 *dResidual, __nv_bfloat16 *dx,
                             float *dwPartials, int64_t rows, float eps) {
  using T = RmsNormTiling<H, kRmsNormBwdThreads>;
  __shared__ float scratch[2 * 2 * T::kThreads / 32];
  // w is re-read per row (L1-resident) rather than held: registers go to
  // loads in flight.
  const uint4 *wv = reinterpret_cast<const uint4 *>(w);
  float dw[T::kVecPerThread][8];
#pragma unroll
  for (int i = 0; i < T::kVecPerThread; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e)
      dw[i][e] = 0.f;
  int parity = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    // x and dy stay packed (bf16) between the two passes: registers go to
    // loads in flight.
    uint4 xv[T::kVecPerThread], gv[T::kVecPerThread];
    uint4 res[T::kVecPerThread]; // issued with the other loads
    float sums[2] = {0.f, 0.f};  // sum x^2, sum (dy w) x
#pragma unroll
    for (int i = 0; i < T::kVecPerThread; ++i) {
      int c = threadIdx.x + i * T::kThreads;
      if (c >= T::kVectors)
        continue;
      xv[i] = reinterpret_cast<const uint4 *>(x + row * H)[c];
      gv[i] = reinterpret_cast<const uint4 *>(dy + row * H)[c];
      if (dResidual)
        res[i] = reinterpret_cast<const uint4 *>(dResidual + row * H)[c];
    }
#pragma unroll
    for (int i = 0; i < T::kVecPerThread; ++i) {
      int c = threadIdx.x + i * T::kThreads;
      if (c >= T::kVectors)
        continue;
      float xf[8], g[8], wf[8];
      unpackBf16x8(xv[i], xf);
      unpackBf16x8(gv[i], g);
      unpackBf16x8(wv[c], wf);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        sums[0] += xf[e] * xf[e];
        sums[1] += g[e] * wf[e] * xf[e];
      }
    }
    blockSum<2, T::kThreads>(sums, scratch, parity);
    parity ^= 1;
    const float r = rsqrtf(sums[0] / H + eps);
    // dx = r (dy w) - x r^3 mean((dy w) x)
    const float c3 = r * r * r * sums[1] / H;
#pragma unroll
    for (int i = 0; i < T::kVecPerThread; ++i) {
      int c = threadIdx.x + i * T::kThreads;
      if (c >= T::kVectors)
        continue;
      float out[8], rf[8], wf[8], xf[8], g[8];
      unpackBf16x8(xv[i], xf);
      unpackBf16x8(gv[i], g);
      unpackBf16x8(wv[c], wf);
      if (dResidual)
        unpackBf16x8(res[i], rf);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        dw[i][e] += g[e] * xf[e] * r;
        out[e] = r * g[e] * wf[e] - xf[e] * c3;
        if (dResidual)
          out[e] += rf[e];
      }
      reinterpret_cast<uint4 *>(dx + row * H)[c] = packBf16x8(out);
    }
  }
  float *part = dwPartials + static_cast<int64_t>(blockIdx.x) * H;
#pragma unroll
  for (int i = 0; i < T::kVecPerThread; ++i) {
    int c = threadIdx.x + i * T::kThreads;
    if (c >= T::kVectors)
      continue;
#pragma unroll
    for (int e = 0; e < 8; e += 4)
      *reinterpret_cast<float4 *>(part + c * 8 + e) =
          make_float4(dw[i][e], dw[i][e + 1], dw[i][e + 2], dw[i][e + 3]);
  }
}

} // namespace detail

/// y = rmsnorm(x) * w, or with `delta`: xSum = bf16(x + delta) and
/// y = rmsnorm(xSum) * w. x, delta, xSum, y [rows, H]; w [H]. Pointers must be
/// 16-byte aligned.
template <int H>
void rms_norm_fwd_bf16(const __nv_bfloat16 *x, const __nv_bfloat16 *delta,
                       const __nv_bfloat16 *w, __nv_bfloat16 *xSum,
                       __nv_bfloat16 *y, int64_t rows, float eps,
                       cudaStream_t stream) {
  if (rows == 0)
    return;
  detail::rms_norm_fwd_bf16_kernel<H>
      <<<static_cast<unsigned>(rows), detail::kRmsNormFwdThreads, 0, stream>>>(
          x, delta, w, xSum, y, eps);
  DFLASH_CUDA_CHECK_LAUNCH("rms_norm_fwd_bf16");
}

/// dx = d rmsnorm(x) / dx applied to dy, plus dResidual when given (the
/// gradient already flowing into the residual stream); dw [H] (bf16 or fp32)
/// summed over rows. workspace: rmsNormBwdWorkspaceBytes(H).
template <int H, typename GradWeightT>
void rms_norm_bwd_bf16(const __nv_bfloat16 *dy, const __nv_bfloat16 *x,
                       const __nv_bfloat16 *w, const __nv_bfloat16 *dResidual,
                       __nv_bfloat16 *dx, GradWeightT *dw, int64_t rows,
                       float eps, float *workspace, cudaStream_t stream) {
  detail::rms_norm_bwd_bf16_kernel<H>
      <<<kRmsNormBwdPartials, detail::kRmsNormBwdThreads, 0, stream>>>(
          dy, x, w, dResidual, dx, workspace, rows, eps);
  DFLASH_CUDA_CHECK_LAUNCH("rms_norm_bwd_bf16");
  detail::columnSum<GradWeightT>(workspace, kRmsNormBwdPartials, H, dw, stream);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_RMSNORM_CUH
