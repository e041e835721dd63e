//===- QkNormRope.cuh - Per-head q/k RMSNorm + RoPE ------------*- CUDA -*-===//
//
// y = rope(bf16(rmsnorm_d(x) * w)) for x [rows, HEADS, D]: the per-head norm
// of Qwen3 q/k projections followed by rotate-half RoPE at positions pos[row]
// (docs/semantics.md section 3). Angles as Hugging Face computes them, in fp32:
// inv_i = 1 / theta^(2i/D), angle = float(pos) * inv_i. The normalised value
// is rounded to bf16 before the rotation, as the unfused graph stores it.
//
// Thread layout: D/16 lanes per head vector, each lane 8 consecutive dims of
// each half (16-byte loads); every head of a row is loaded before the CTA
// computes the row's D/2 angles once into shared memory.
// rope_fwd_bf16 is the rotation alone (a target decoder without q/k norms),
// with Llama-3's or YaRN's frequency scaling where asked.
// Both take YaRN's frequencies (the drafter's rope scaling) where asked.
// The backward rotates dy back, applies the norm's backward and reduces the
// weight gradient through fp32 per-CTA partials and a column sum.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_QKNORMROPE_CUH
#define DFLASH_KERNELS_QKNORMROPE_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/Reduce.cuh"
#include "kernels/RopeFrequencies.h"
#include "kernels/Workspaces.h"

#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

namespace detail {

template <int D, int HEADS> struct QkNormRopeTiling {
  static_assert(D % 16 == 0, "head dim must be a multiple of 16");
  static constexpr int kLanesPerHead = D / 16;
  static_assert(32 % kLanesPerHead == 0, "head dim above 512");
  static constexpr int kSlots =
      HEADS < 128 / kLanesPerHead ? HEADS : 128 / kLanesPerHead;
  // Whole warps; the extra lanes of a partial warp idle.
  static constexpr int kThreads = (kSlots * kLanesPerHead + 31) / 32 * 32;
};

/// Sum over the kLanesPerHead lanes of one head (aligned lane groups).
template <int Lanes> __device__ __forceinline__ float headSum(float v) {
#pragma unroll
  for (int o = Lanes / 2; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Llama-3's rescaling of one inverse frequency, in double as
/// ref::scaledRope does it: wavelengths above original / lowFreqFactor are
/// divided by factor, those below original / highFreqFactor kept, those
/// between blended.
__device__ inline float scaledInverseFrequency(float inv,
                                               const RopeFrequencies &f) {
  const double original = f.originalMaxPositions;
  const double wavelength = 2.0 * 3.14159265358979323846 / inv;
  if (wavelength > original / f.lowFreqFactor)
    return static_cast<float>(inv / double(f.factor));
  if (wavelength >= original / f.highFreqFactor &&
      f.highFreqFactor != f.lowFreqFactor) {
    const double smooth = (original / wavelength - f.lowFreqFactor) /
                          (double(f.highFreqFactor) - f.lowFreqFactor);
    return static_cast<float>((1.0 - smooth) * inv / f.factor + smooth * inv);
  }
  return inv;
}

/// YaRN's blend of inverse frequency i, 1 / power with power = theta^(2i/D),
/// with 1 / (yarnFactor power), in fp32 as ref::yarnInverseFrequencies:
/// the first's share is 1 - clamp((i - low) / (high - low), 0, 1).
__device__ inline float yarnInverseFrequency(float power, int i,
                                             const RopeFrequencies &f) {
  const float ramp = fminf(
      fmaxf((static_cast<float>(i) - f.yarnLow) / (f.yarnHigh - f.yarnLow),
            0.f),
      1.f);
  const float keep = 1.f - ramp;
  const float extrapolation = 1.0f / power;
  const float interpolation = 1.0f / (f.yarnFactor * power);
  return interpolation * (1.f - keep) + extrapolation * keep;
}

/// The row's D/2 cos/sin pairs, computed once per row by the whole CTA into
/// one of two shared tables (alternating, so one barrier per row suffices):
/// inv_i = 1 / theta^(2i/D) once per CTA (then Llama-3's or YaRN's
/// scaling, where asked), angle = float(pos) * inv_i, cos and sin times
/// YaRN's attention factor.
template <int D> struct RopeTables {
  float inv[D / 2];
  float cos[2][D / 2];
  float sin[2][D / 2];
  float scale; ///< YaRN's attention factor (1 otherwise); after the tables,
               ///< which are read as float4

  __device__ void init(float theta) { init(RopeFrequencies{theta}); }
  __device__ void init(const RopeFrequencies &f) {
    for (int i = threadIdx.x; i < D / 2; i += blockDim.x) {
      const float power =
          powf(f.theta, static_cast<float>(2 * i) / static_cast<float>(D));
      float v = 1.0f / power;
      if (f.yarnFactor > 0)
        v = yarnInverseFrequency(power, i, f);
      inv[i] = f.factor > 0 ? scaledInverseFrequency(v, f) : v;
    }
    if (threadIdx.x == 0)
      scale = f.attentionFactor;
    __syncthreads();
  }
  /// Fills table `parity` for position pos; the caller's barrier publishes.
  __device__ void fill(int parity, int pos) {
    for (int i = threadIdx.x; i < D / 2; i += blockDim.x) {
      sincosf(static_cast<float>(pos) * inv[i], &sin[parity][i],
              &cos[parity][i]);
      sin[parity][i] *= scale;
      cos[parity][i] *= scale;
    }
  }
  __device__ void read(int parity, int i0, float (&c)[8], float (&s)[8]) const {
#pragma unroll
    for (int e = 0; e < 8; e += 4) {
      float4 cv = *reinterpret_cast<const float4 *>(&cos[parity][i0 + e]);
      float4 sv = *reinterpret_cast<const float4 *>(&sin[parity][i0 + e]);
      c[e] = cv.x, c[e + 1] = cv.y, c[e + 2] = cv.z, c[e + 3] = cv.w;
      s[e] = sv.x, s[e + 1] = sv.y, s[e + 2] = sv.z, s[e + 3] = sv.w;
    }
  }
};

/// RoPE of every head of a row, each head first RMS-normed and scaled by w
/// (bf16-rounded, as the reference does) when NORM: the drafter's and
/// Qwen3's q/k norms; alone otherwise (a Llama-3 target).
template <int D, int HEADS, bool NORM>
__global__ void __launch_bounds__((QkNormRopeTiling<D, HEADS>::kThreads))
    rope_rows_fwd_bf16_kernel(const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                              const int32_t *pos, __nv_bfloat16 *y,
                              int64_t rows, float eps, RopeFrequencies freq) {
  using T = QkNormRopeTiling<D, HEADS>;
  constexpr int L = T::kLanesPerHead;
  constexpr int kIters = (HEADS + T::kSlots - 1) / T::kSlots;
  __shared__ __align__(16) RopeTables<D> tables;
  const int slot = threadIdx.x / L, li = threadIdx.x % L;
  const bool active = slot < T::kSlots;
  const int i0 = li * 8;
  float w1[8], w2[8];
  if constexpr (NORM) {
    unpackBf16x8(reinterpret_cast<const uint4 *>(w + i0)[0], w1);
    unpackBf16x8(reinterpret_cast<const uint4 *>(w + D / 2 + i0)[0], w2);
  }
  tables.init(freq);
  int parity = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    // Every head's loads first, then the angles, then the math.
    uint4 ra[kIters], rb[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      int h = it * T::kSlots + slot;
      bool valid = active && h < HEADS;
      const __nv_bfloat16 *xr = x + (row * HEADS + (valid ? h : 0)) * D;
      ra[it] = *reinterpret_cast<const uint4 *>(xr + i0);
      rb[it] = *reinterpret_cast<const uint4 *>(xr + D / 2 + i0);
    }
    tables.fill(parity, pos[row]);
    __syncthreads();
    float c[8], s[8];
    tables.read(parity, i0, c, s);
    parity ^= 1;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      int h = it * T::kSlots + slot;
      // Lane groups stay whole, so the norm's shuffles see every lane.
      bool valid = active && h < HEADS;
      float a[8], b[8];
      unpackBf16x8(ra[it], a);
      unpackBf16x8(rb[it], b);
      if constexpr (NORM) {
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e)
          ss += a[e] * a[e] + b[e] * b[e];
        ss = headSum<L>(ss);
        float r = rsqrtf(ss / D + eps);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          a[e] = __bfloat162float(__float2bfloat16(a[e] * r * w1[e]));
          b[e] = __bfloat162float(__float2bfloat16(b[e] * r * w2[e]));
        }
      }
      float y1[8], y2[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        y1[e] = a[e] * c[e] - b[e] * s[e];
        y2[e] = b[e] * c[e] + a[e] * s[e];
      }
      if (valid) {
        __nv_bfloat16 *yr = y + (row * HEADS + h) * D;
        *reinterpret_cast<uint4 *>(yr + i0) = packBf16x8(y1);
        *reinterpret_cast<uint4 *>(yr + D / 2 + i0) = packBf16x8(y2);
      }
    }
  }
}

template <int D, int HEADS>
__global__ void __launch_bounds__((QkNormRopeTiling<D, HEADS>::kThreads))
    qk_norm_rope_bwd_bf16_kernel(const __nv_bfloat16 *dy,
                                 const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                                 const int32_t *pos, __nv_bfloat16 *dx,
                                 float *dwPartials, int64_t rows, float eps,
                                 RopeFrequencies freq) {
  using T = QkNormRopeTiling<D, HEADS>;
  constexpr int L = T::kLanesPerHead;
  constexpr int kIters = (HEADS + T::kSlots - 1) / T::kSlots;
  __shared__ __align__(16) RopeTables<D> tables;
  __shared__ float part[T::kSlots][D + 1];
  const int slot = threadIdx.x / L, li = threadIdx.x % L;
  const bool active = slot < T::kSlots;
  const int i0 = li * 8;
  float w1[8], w2[8], dw1[8] = {}, dw2[8] = {};
  unpackBf16x8(reinterpret_cast<const uint4 *>(w + i0)[0], w1);
  unpackBf16x8(reinterpret_cast<const uint4 *>(w + D / 2 + i0)[0], w2);
  tables.init(freq);
  int parity = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    uint4 ra[kIters], rb[kIters], ga[kIters], gb[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      int h = it * T::kSlots + slot;
      bool valid = active && h < HEADS;
      int64_t off = (row * HEADS + (valid ? h : 0)) * D;
      ra[it] = *reinterpret_cast<const uint4 *>(x + off + i0);
      rb[it] = *reinterpret_cast<const uint4 *>(x + off + D / 2 + i0);
      ga[it] = *reinterpret_cast<const uint4 *>(dy + off + i0);
      gb[it] = *reinterpret_cast<const uint4 *>(dy + off + D / 2 + i0);
    }
    tables.fill(parity, pos[row]);
    __syncthreads();
    float c[8], s[8];
    tables.read(parity, i0, c, s);
    parity ^= 1;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      int h = it * T::kSlots + slot;
      bool valid = active && h < HEADS;
      int64_t off = (row * HEADS + (valid ? h : 0)) * D;
      float a[8], b[8], n1[8], n2[8];
      unpackBf16x8(ra[it], a);
      unpackBf16x8(rb[it], b);
      {
        float g1[8], g2[8];
        unpackBf16x8(ga[it], g1);
        unpackBf16x8(gb[it], g2);
        // Rotate the gradient back (the transpose of the forward rotation):
        // n is the gradient of the normalised value.
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          n1[e] = g1[e] * c[e] + g2[e] * s[e];
          n2[e] = g2[e] * c[e] - g1[e] * s[e];
        }
      }
      float ss = 0.f, gx = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        ss += a[e] * a[e] + b[e] * b[e];
        gx += n1[e] * w1[e] * a[e] + n2[e] * w2[e] * b[e];
      }
      ss = headSum<L>(ss);
      gx = headSum<L>(gx);
      float r = rsqrtf(ss / D + eps);
      float c3 = r * r * r * gx / D;
      float o1[8], o2[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        o1[e] = r * n1[e] * w1[e] - a[e] * c3;
        o2[e] = r * n2[e] * w2[e] - b[e] * c3;
        if (valid) {
          dw1[e] += n1[e] * a[e] * r;
          dw2[e] += n2[e] * b[e] * r;
        }
      }
      if (valid) {
        *reinterpret_cast<uint4 *>(dx + off + i0) = packBf16x8(o1);
        *reinterpret_cast<uint4 *>(dx + off + D / 2 + i0) = packBf16x8(o2);
      }
    }
  }
  // Combine the slots of this CTA in a fixed order, then one partial row.
  if (active)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      part[slot][i0 + e] = dw1[e];
      part[slot][D / 2 + i0 + e] = dw2[e];
    }
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float t = 0.f;
    for (int sl = 0; sl < T::kSlots; ++sl)
      t += part[sl][d];
    dwPartials[static_cast<int64_t>(blockIdx.x) * D + d] = t;
  }
}

} // namespace detail

/// y [rows, HEADS, D] = rope(bf16(rmsnorm(x) * w)) at positions pos [rows],
/// with YaRN's frequencies where freq.yarnFactor > 0 (the drafter's
/// [drafter.rope_scaling]).
template <int D, int HEADS>
void qk_norm_rope_fwd_bf16(const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                           const int32_t *pos, __nv_bfloat16 *y, int64_t rows,
                           float eps, RopeFrequencies freq,
                           cudaStream_t stream) {
  if (rows == 0)
    return;
  // Several rows per CTA amortise the angle set-up.
  int64_t blocks = rows < 8192 ? rows : 8192;
  detail::rope_rows_fwd_bf16_kernel<D, HEADS, true>
      <<<static_cast<unsigned>(blocks),
         detail::QkNormRopeTiling<D, HEADS>::kThreads, 0, stream>>>(
          x, w, pos, y, rows, eps, freq);
  DFLASH_CUDA_CHECK_LAUNCH("qk_norm_rope_fwd_bf16");
}
template <int D, int HEADS>
void qk_norm_rope_fwd_bf16(const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                           const int32_t *pos, __nv_bfloat16 *y, int64_t rows,
                           float eps, float theta, cudaStream_t stream) {
  qk_norm_rope_fwd_bf16<D, HEADS>(x, w, pos, y, rows, eps,
                                  RopeFrequencies{theta}, stream);
}

/// y [rows, HEADS, D] = rope(x) at positions pos [rows] (ref::rope, or
/// ref::scaledRope where freq.factor > 0).
template <int D, int HEADS>
void rope_fwd_bf16(const __nv_bfloat16 *x, const int32_t *pos, __nv_bfloat16 *y,
                   int64_t rows, RopeFrequencies freq, cudaStream_t stream) {
  if (rows == 0)
    return;
  int64_t blocks = rows < 8192 ? rows : 8192;
  detail::rope_rows_fwd_bf16_kernel<D, HEADS, false>
      <<<static_cast<unsigned>(blocks),
         detail::QkNormRopeTiling<D, HEADS>::kThreads, 0, stream>>>(
          x, nullptr, pos, y, rows, 0.f, freq);
  DFLASH_CUDA_CHECK_LAUNCH("rope_fwd_bf16");
}

/// dx [rows, HEADS, D] and dw [D] (summed over rows and heads) of
/// qk_norm_rope_fwd_bf16. workspace: qkNormRopeBwdWorkspaceBytes(D).
template <int D, int HEADS, typename GradWeightT>
void qk_norm_rope_bwd_bf16(const __nv_bfloat16 *dy, const __nv_bfloat16 *x,
                           const __nv_bfloat16 *w, const int32_t *pos,
                           __nv_bfloat16 *dx, GradWeightT *dw, int64_t rows,
                           float eps, RopeFrequencies freq, float *workspace,
                           cudaStream_t stream) {
  detail::qk_norm_rope_bwd_bf16_kernel<D, HEADS>
      <<<kQkNormRopeBwdPartials, detail::QkNormRopeTiling<D, HEADS>::kThreads,
         0, stream>>>(dy, x, w, pos, dx, workspace, rows, eps, freq);
  DFLASH_CUDA_CHECK_LAUNCH("qk_norm_rope_bwd_bf16");
  detail::columnSum<GradWeightT>(workspace, kQkNormRopeBwdPartials, D, dw,
                                 stream);
}
template <int D, int HEADS, typename GradWeightT>
void qk_norm_rope_bwd_bf16(const __nv_bfloat16 *dy, const __nv_bfloat16 *x,
                           const __nv_bfloat16 *w, const int32_t *pos,
                           __nv_bfloat16 *dx, GradWeightT *dw, int64_t rows,
                           float eps, float theta, float *workspace,
                           cudaStream_t stream) {
  qk_norm_rope_bwd_bf16<D, HEADS, GradWeightT>(dy, x, w, pos, dx, dw, rows, eps,
                                               RopeFrequencies{theta},
                                               workspace, stream);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_QKNORMROPE_CUH
