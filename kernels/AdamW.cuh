//===- AdamW.cuh - Multi-tensor AdamW with clipping ------------*- CUDA -*-===//
//
// The optimizer step of docs/semantics.md section 5 over every parameter in
// three launches, whatever the number of tensors:
//   1. sum of squares of the gradients, one fp64 partial per chunk;
//   2. one CTA: norm = sqrt(sum of partials) in a fixed order and the clip
//      coefficient c = min(1, max_norm / (norm + 1e-6)), both left on the
//      device (no host round trip, so the step can be a CUDA graph);
//   3. AdamW on the fp32 masters with gradient g * c, exactly the arithmetic
//      of torch.optim.AdamW (single-tensor path): p *= 1 - lr wd;
//      m = lerp(m, g, 1 - b1); v = b2 v + (1 - b2) g^2;
//      p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps);
//      then the bf16 parameter is rewritten from the master.
// The tensors and their chunks live in device tables built once at start-up
// (static shapes); lr and the 1-based step t are read from device memory so
// that a captured graph replays with the current values.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_ADAMW_CUH
#define DFLASH_KERNELS_ADAMW_CUH

#include "kernels/AdamWTables.h"
#include "kernels/CudaCheck.cuh"

#include <cstdint>
#include <cuda_bf16.h>
#include <vector>

namespace dflash::kernels {

/// One trainable tensor. GradT (the template argument of the kernels) is
/// __nv_bfloat16 or float.
struct AdamWTensor {
  __nv_bfloat16 *param; ///< bf16 copy the step reads
  float *master;        ///< fp32 master
  const void *grad;     ///< gradient, GradT
  float *m, *v;         ///< moments, fp32
  int64_t n;
};

/// A contiguous piece of one tensor processed by one CTA.
struct AdamWChunk {
  int32_t tensor;
  int32_t length;
  int64_t start;
};
static_assert(sizeof(AdamWTensor) == kAdamWTensorBytes &&
                  sizeof(AdamWChunk) == kAdamWChunkBytes,
              "kernels/AdamWTables.h sizes the tables with these");

/// Hyper-parameters as torch holds them (Python floats).
struct AdamWHyper {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.0;
  double maxNorm = 1.0; ///< <= 0 disables clipping
};

/// Device-side step inputs (written by the host or a schedule kernel).
struct AdamWStepState {
  float lr;
  int32_t step; ///< 1-based
};

/// Splits tensors into chunks (host side, once).
inline std::vector<AdamWChunk>
buildAdamWChunks(const std::vector<int64_t> &sizes) {
  std::vector<AdamWChunk> chunks;
  for (size_t t = 0; t < sizes.size(); ++t)
    for (int64_t s = 0; s < sizes[t]; s += kAdamWChunkElems) {
      int64_t len =
          sizes[t] - s < kAdamWChunkElems ? sizes[t] - s : kAdamWChunkElems;
      chunks.push_back({static_cast<int32_t>(t), static_cast<int32_t>(len), s});
    }
  return chunks;
}

namespace detail {

template <typename GradT>
__device__ __forceinline__ float gradAt(const void *g, int64_t i);
template <>
__device__ __forceinline__ float gradAt<float>(const void *g, int64_t i) {
  return static_cast<const float *>(g)[i];
}
template <>
__device__ __forceinline__ float gradAt<__nv_bfloat16>(const void *g,
                                                       int64_t i) {
  return __bfloat162float(static_cast<const __nv_bfloat16 *>(g)[i]);
}

template <typename GradT>
__global__ void __launch_bounds__(256)
    adamw_grad_sum_of_squares_kernel(const AdamWTensor *tensors,
                                     const AdamWChunk *chunks,
                                     double *partials) {
  __shared__ double part[8];
  const AdamWChunk c = chunks[blockIdx.x];
  const void *g = tensors[c.tensor].grad;
  float acc = 0.f;
  // Eight consecutive elements per thread and iteration whatever GradT is:
  // the same summation order for bf16 gradients and their fp32 all-reduced
  // copies, so both give the same norm, bit for bit.
  for (int i = 8 * threadIdx.x; i < c.length; i += 8 * 256) {
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (i + e < c.length) {
        float v = gradAt<GradT>(g, c.start + i + e);
        acc += v * v;
      }
  }
  double d = acc;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    d += __shfl_xor_sync(0xffffffffu, d, o);
  if (threadIdx.x % 32 == 0)
    part[threadIdx.x / 32] = d;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int w = 0; w < 8; ++w)
      t += part[w];
    partials[blockIdx.x] = t;
  }
}

/// The sum of numChunks partials in a fixed order (the same for any grid
/// that produced them), valid in thread 0 of a 1024-thread block.
__device__ __forceinline__ double sumPartialsInOrder(const double *partials,
                                                     int numChunks) {
  __shared__ double part[32];
  double acc = 0;
  for (int i = threadIdx.x; i < numChunks; i += 1024)
    acc += partials[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0)
    part[threadIdx.x / 32] = acc;
  __syncthreads();
  double t = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < 32; ++w)
      t += part[w];
  return t;
}

/// normAndClip[0] = global norm, normAndClip[1] = clip coefficient, from
/// the squared global norm.
__device__ __forceinline__ void
writeNormAndClip(double squareSum, double maxNorm, float *normAndClip) {
  double norm = sqrt(squareSum);
  double clip = 1.0;
  if (maxNorm > 0) {
    clip = maxNorm / (norm + 1e-6);
    if (clip > 1.0)
      clip = 1.0;
  }
  normAndClip[0] = static_cast<float>(norm);
  normAndClip[1] = static_cast<float>(clip);
}

/// normAndClip from the chunks' partial sums of squares.
static __global__ void __launch_bounds__(1024)
    adamw_clip_coefficient_kernel(const double *partials, int numChunks,
                                  double maxNorm, float *normAndClip) {
  double t = sumPartialsInOrder(partials, numChunks);
  if (threadIdx.x == 0)
    writeNormAndClip(t, maxNorm, normAndClip);
}

/// sumOfSquares[0] = the sum of the chunks' partials, in a fixed order
/// (ZeRO-1: one rank's share of the squared global norm).
static __global__ void __launch_bounds__(1024)
    adamw_square_sum_kernel(const double *partials, int numChunks,
                            float *sumOfSquares) {
  double t = sumPartialsInOrder(partials, numChunks);
  if (threadIdx.x == 0)
    sumOfSquares[0] = static_cast<float>(t);
}

/// normAndClip from the squared global norm (summed over the ranks).
static __global__ void
adamw_clip_from_square_sum_kernel(const float *sumOfSquares, double maxNorm,
                                  float *normAndClip) {
  writeNormAndClip(static_cast<double>(sumOfSquares[0]), maxNorm, normAndClip);
}

/// One element of the update; the scalars are fp32 as torch uses them.
struct AdamWScalars {
  float clip, stepSize, bc2Sqrt, decay, w1, beta2, w2, eps;
  bool decayOn;
};

__device__ __forceinline__ void adamwElement(float g, float &p, float &m,
                                             float &v, const AdamWScalars &k) {
  g *= k.clip;
  if (k.decayOn)
    p *= k.decay;
  m = m + k.w1 * (g - m); // torch lerp, weight < 0.5 branch
  v = v * k.beta2 + k.w2 * g * g;
  float denom = sqrtf(v) / k.bc2Sqrt + k.eps;
  p = p - k.stepSize * (m / denom);
}

template <typename GradT>
__global__ void __launch_bounds__(256)
    adamw_step_kernel(const AdamWTensor *tensors, const AdamWChunk *chunks,
                      const float *normAndClip, const AdamWStepState *state,
                      AdamWHyper hyper) {
  const AdamWChunk c = chunks[blockIdx.x];
  const AdamWTensor t = tensors[c.tensor];
  const double lr = state->lr;
  const int step = state->step;
  const double bc1 = 1.0 - pow(hyper.beta1, step);
  const double bc2 = 1.0 - pow(hyper.beta2, step);
  AdamWScalars k;
  k.clip = normAndClip ? normAndClip[1] : 1.f;
  k.stepSize = static_cast<float>(lr / bc1);
  k.bc2Sqrt = static_cast<float>(sqrt(bc2));
  k.decay = static_cast<float>(1.0 - lr * hyper.weightDecay);
  k.decayOn = hyper.weightDecay != 0.0;
  k.w1 = static_cast<float>(1.0 - hyper.beta1);
  k.beta2 = static_cast<float>(hyper.beta2);
  k.w2 = static_cast<float>(1.0 - hyper.beta2);
  k.eps = static_cast<float>(hyper.eps);

  const int64_t s = c.start;
  auto aligned = [](const void *ptr, int bytes) {
    return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
  };
  bool vec = c.length % 4 == 0 && s % 4 == 0 && aligned(t.master, 16) &&
             aligned(t.m, 16) && aligned(t.v, 16) && aligned(t.param, 8) &&
             aligned(t.grad, 4 * sizeof(GradT));
  if (vec) {
    for (int i = 4 * threadIdx.x; i < c.length; i += 4 * 256) {
      int64_t j = s + i;
      float4 p = *reinterpret_cast<const float4 *>(t.master + j);
      float4 m = *reinterpret_cast<const float4 *>(t.m + j);
      float4 v = *reinterpret_cast<const float4 *>(t.v + j);
      float g[4];
      if constexpr (sizeof(GradT) == 2) {
        uint2 raw = *reinterpret_cast<const uint2 *>(
            static_cast<const __nv_bfloat16 *>(t.grad) + j);
        float2 a = __bfloat1622float2(
            *reinterpret_cast<const __nv_bfloat162 *>(&raw.x));
        float2 b = __bfloat1622float2(
            *reinterpret_cast<const __nv_bfloat162 *>(&raw.y));
        g[0] = a.x, g[1] = a.y, g[2] = b.x, g[3] = b.y;
      } else {
        float4 gv = *reinterpret_cast<const float4 *>(
            static_cast<const float *>(t.grad) + j);
        g[0] = gv.x, g[1] = gv.y, g[2] = gv.z, g[3] = gv.w;
      }
      adamwElement(g[0], p.x, m.x, v.x, k);
      adamwElement(g[1], p.y, m.y, v.y, k);
      adamwElement(g[2], p.z, m.z, v.z, k);
      adamwElement(g[3], p.w, m.w, v.w, k);
      *reinterpret_cast<float4 *>(t.master + j) = p;
      *reinterpret_cast<float4 *>(t.m + j) = m;
      *reinterpret_cast<float4 *>(t.v + j) = v;
      __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y);
      __nv_bfloat162 hi = __floats2bfloat162_rn(p.z, p.w);
      uint2 out;
      out.x = *reinterpret_cast<uint32_t *>(&lo);
      out.y = *reinterpret_cast<uint32_t *>(&hi);
      *reinterpret_cast<uint2 *>(t.param + j) = out;
    }
  } else {
    for (int i = threadIdx.x; i < c.length; i += 256) {
      int64_t j = s + i;
      float p = t.master[j], m = t.m[j], v = t.v[j];
      adamwElement(gradAt<GradT>(t.grad, j), p, m, v, k);
      t.master[j] = p;
      t.m[j] = m;
      t.v[j] = v;
      t.param[j] = __float2bfloat16(p);
    }
  }
}

} // namespace detail

/// Device tables and scratch of the optimizer, owned by the caller.
struct AdamWTables {
  const AdamWTensor *tensors; ///< [numTensors], device
  const AdamWChunk *chunks;   ///< [numChunks], device
  int numChunks;
  double *partials;   ///< [numChunks], device scratch
  float *normAndClip; ///< [2], device: global norm, clip coefficient
};

/// Clip coefficient from the gradients' global norm, then one AdamW step.
template <typename GradT>
void adamw_multi_tensor_step(const AdamWTables &tables,
                             const AdamWStepState *state,
                             const AdamWHyper &hyper, cudaStream_t stream) {
  if (tables.numChunks == 0)
    return;
  detail::adamw_grad_sum_of_squares_kernel<GradT>
      <<<tables.numChunks, 256, 0, stream>>>(tables.tensors, tables.chunks,
                                             tables.partials);
  DFLASH_CUDA_CHECK_LAUNCH("adamw_grad_sum_of_squares");
  detail::adamw_clip_coefficient_kernel<<<1, 1024, 0, stream>>>(
      tables.partials, tables.numChunks, hyper.maxNorm, tables.normAndClip);
  DFLASH_CUDA_CHECK_LAUNCH("adamw_clip_coefficient");
  detail::adamw_step_kernel<GradT><<<tables.numChunks, 256, 0, stream>>>(
      tables.tensors, tables.chunks, tables.normAndClip, state, hyper);
  DFLASH_CUDA_CHECK_LAUNCH("adamw_step");
}

// ZeRO-1 (the sharded optimizer state): the same three stages, split so
// that the ranks' sums of squares can be summed between the first and the
// clip. Every rank's tables hold its pieces of the buckets' shards.

/// sumOfSquares[0] = sum of g^2 over every chunk of the tables (0 when
/// there is none), as a float for the float all-reduce.
template <typename GradT>
void adamw_grad_square_sum(const AdamWTables &tables, float *sumOfSquares,
                           cudaStream_t stream) {
  if (tables.numChunks > 0) {
    detail::adamw_grad_sum_of_squares_kernel<GradT>
        <<<tables.numChunks, 256, 0, stream>>>(tables.tensors, tables.chunks,
                                               tables.partials);
    DFLASH_CUDA_CHECK_LAUNCH("adamw_grad_sum_of_squares");
  }
  detail::adamw_square_sum_kernel<<<1, 1024, 0, stream>>>(
      tables.partials, tables.numChunks, sumOfSquares);
  DFLASH_CUDA_CHECK_LAUNCH("adamw_square_sum");
}

/// tables.normAndClip from the squared global norm of every rank.
inline void adamw_clip_from_square_sum(const AdamWTables &tables,
                                       const float *sumOfSquares,
                                       const AdamWHyper &hyper,
                                       cudaStream_t stream) {
  detail::adamw_clip_from_square_sum_kernel<<<1, 1, 0, stream>>>(
      sumOfSquares, hyper.maxNorm, tables.normAndClip);
  DFLASH_CUDA_CHECK_LAUNCH("adamw_clip_from_square_sum");
}

/// The AdamW update of every chunk with the clip in tables.normAndClip.
template <typename GradT>
void adamw_update(const AdamWTables &tables, const AdamWStepState *state,
                  const AdamWHyper &hyper, cudaStream_t stream) {
  if (tables.numChunks == 0)
    return;
  detail::adamw_step_kernel<GradT><<<tables.numChunks, 256, 0, stream>>>(
      tables.tensors, tables.chunks, tables.normAndClip, state, hyper);
  DFLASH_CUDA_CHECK_LAUNCH("adamw_step");
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_ADAMW_CUH
