//===- Reduce.cuh - Block sums, column sums --------------------*- CUDA -*-===//
//
// Shared pieces of the norm kernels: a block-wide sum of a few floats, 16-byte
// bf16 vector conversions, and the second pass of the weight gradients, which
// sums per-CTA fp32 partials [P, D] over P in a fixed order (so the result
// does not depend on scheduling).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_REDUCE_CUH
#define DFLASH_KERNELS_REDUCE_CUH

#include "kernels/CudaCheck.cuh"

#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels::detail {

/// Eight bf16 values of a 16-byte vector as floats.
__device__ __forceinline__ void unpackBf16x8(const uint4 &v, float (&f)[8]) {
  const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 p = __bfloat1622float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

/// Eight floats rounded to bf16 as a 16-byte vector.
__device__ __forceinline__ uint4 packBf16x8(const float (&f)[8]) {
  uint4 v;
  __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

__device__ __forceinline__ float warpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Block-wide sums of V values per thread. `scratch` holds 2 * V * warps
/// floats; alternating `parity` between consecutive calls lets one barrier
/// per call suffice.
template <int V, int Threads>
__device__ __forceinline__ void blockSum(float (&v)[V], float *scratch,
                                         int parity) {
  constexpr int kWarps = Threads / 32;
  static_assert(Threads % 32 == 0, "whole warps");
  float *slot = scratch + parity * V * kWarps;
#pragma unroll
  for (int i = 0; i < V; ++i)
    v[i] = warpSum(v[i]);
  if (threadIdx.x % 32 == 0)
#pragma unroll
    for (int i = 0; i < V; ++i)
      slot[i * kWarps + threadIdx.x / 32] = v[i];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < V; ++i) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      s += slot[i * kWarps + w];
    v[i] = s;
  }
}

template <typename OutT> __device__ __forceinline__ OutT fromFloat(float v);
template <> __device__ __forceinline__ float fromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}

/// out[c] = sum over p of partials[p, c], for c < cols. Each CTA owns 32
/// columns; its 8 warps sum interleaved p, then combine in a fixed order.
template <typename OutT>
__global__ void __launch_bounds__(256)
    column_sum_f32_kernel(const float *partials, int numPartials, int cols,
                          OutT *out) {
  __shared__ float part[8][33];
  int c = blockIdx.x * 32 + threadIdx.x % 32;
  int w = threadIdx.x / 32;
  float s = 0.f;
  if (c < cols)
    for (int p = w; p < numPartials; p += 8)
      s += partials[static_cast<int64_t>(p) * cols + c];
  part[w][threadIdx.x % 32] = s;
  __syncthreads();
  if (w == 0 && c < cols) {
    float t = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      t += part[i][threadIdx.x];
    out[c] = fromFloat<OutT>(t);
  }
}

template <typename OutT>
void columnSum(const float *partials, int numPartials, int cols, OutT *out,
               cudaStream_t stream) {
  column_sum_f32_kernel<OutT>
      <<<(cols + 31) / 32, 256, 0, stream>>>(partials, numPartials, cols, out);
  DFLASH_CUDA_CHECK_LAUNCH("column_sum_f32");
}

} // namespace dflash::kernels::detail

#endif // DFLASH_KERNELS_REDUCE_CUH
