//===- SwiGlu.cuh - SwiGLU forward and backward ----------------*- CUDA -*-===//
//
// y = silu(gate) * up elementwise over [rows, cols] views with row strides,
// so gate and up may be the two halves of one fused [rows, 2I] projection.
// fp32 math, one bf16 rounding per output. 16-byte vectors when every stride
// and pointer allows, scalars otherwise.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_SWIGLU_CUH
#define DFLASH_KERNELS_SWIGLU_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/Reduce.cuh"

#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

/// Row-strided [rows, cols] bf16 view.
struct StridedBf16 {
  const __nv_bfloat16 *data;
  int64_t ld;
};
struct MutableStridedBf16 {
  __nv_bfloat16 *data;
  int64_t ld;
};

namespace detail {

__device__ __forceinline__ float sigmoidf(float x) {
  return 1.f / (1.f + expf(-x));
}

/// Vec = 8: 16-byte vectors; Vec = 1: scalars. blockIdx.y strides rows.
template <int Vec>
__global__ void __launch_bounds__(256)
    swiglu_fwd_bf16_kernel(StridedBf16 gate, StridedBf16 up,
                           MutableStridedBf16 y, int64_t rows, int64_t cols) {
  const int64_t units = cols / Vec;
  const int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (u >= units)
    return;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    if constexpr (Vec == 8) {
      float g[8], v[8];
      unpackBf16x8(
          reinterpret_cast<const uint4 *>(gate.data + row * gate.ld)[u], g);
      unpackBf16x8(reinterpret_cast<const uint4 *>(up.data + row * up.ld)[u],
                   v);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        g[e] = g[e] * sigmoidf(g[e]) * v[e];
      reinterpret_cast<uint4 *>(y.data + row * y.ld)[u] = packBf16x8(g);
    } else {
      float g = __bfloat162float(gate.data[row * gate.ld + u]);
      float v = __bfloat162float(up.data[row * up.ld + u]);
      y.data[row * y.ld + u] = __float2bfloat16(g * sigmoidf(g) * v);
    }
  }
}

template <int Vec>
__global__ void __launch_bounds__(256)
    swiglu_bwd_bf16_kernel(StridedBf16 dy, StridedBf16 gate, StridedBf16 up,
                           MutableStridedBf16 dGate, MutableStridedBf16 dUp,
                           int64_t rows, int64_t cols) {
  const int64_t units = cols / Vec;
  const int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (u >= units)
    return;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    float d[Vec], g[Vec], v[Vec];
    if constexpr (Vec == 8) {
      unpackBf16x8(reinterpret_cast<const uint4 *>(dy.data + row * dy.ld)[u],
                   d);
      unpackBf16x8(
          reinterpret_cast<const uint4 *>(gate.data + row * gate.ld)[u], g);
      unpackBf16x8(reinterpret_cast<const uint4 *>(up.data + row * up.ld)[u],
                   v);
    } else {
      d[0] = __bfloat162float(dy.data[row * dy.ld + u]);
      g[0] = __bfloat162float(gate.data[row * gate.ld + u]);
      v[0] = __bfloat162float(up.data[row * up.ld + u]);
    }
    float dg[Vec], du[Vec];
#pragma unroll
    for (int e = 0; e < Vec; ++e) {
      float s = sigmoidf(g[e]);
      float silu = g[e] * s;
      du[e] = d[e] * silu;
      dg[e] = d[e] * v[e] * s * (1.f + g[e] * (1.f - s));
    }
    if constexpr (Vec == 8) {
      reinterpret_cast<uint4 *>(dGate.data + row * dGate.ld)[u] =
          packBf16x8(dg);
      reinterpret_cast<uint4 *>(dUp.data + row * dUp.ld)[u] = packBf16x8(du);
    } else {
      dGate.data[row * dGate.ld + u] = __float2bfloat16(dg[0]);
      dUp.data[row * dUp.ld + u] = __float2bfloat16(du[0]);
    }
  }
}

inline bool vectorizable(const void *p, int64_t ld) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % 8 == 0;
}

inline dim3 elementwiseGrid(int64_t units, int64_t rows) {
  int64_t x = (units + 255) / 256;
  int64_t y = rows < 65535 ? rows : 65535;
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y > 0 ? y : 1));
}

} // namespace detail

/// y = silu(gate) * up over [rows, cols].
inline void swiglu_fwd_bf16(StridedBf16 gate, StridedBf16 up,
                            MutableStridedBf16 y, int64_t rows, int64_t cols,
                            cudaStream_t stream) {
  if (rows == 0 || cols == 0)
    return;
  bool vec = cols % 8 == 0 && detail::vectorizable(gate.data, gate.ld) &&
             detail::vectorizable(up.data, up.ld) &&
             detail::vectorizable(y.data, y.ld);
  if (vec)
    detail::swiglu_fwd_bf16_kernel<8>
        <<<detail::elementwiseGrid(cols / 8, rows), 256, 0, stream>>>(
            gate, up, y, rows, cols);
  else
    detail::swiglu_fwd_bf16_kernel<1>
        <<<detail::elementwiseGrid(cols, rows), 256, 0, stream>>>(gate, up, y,
                                                                  rows, cols);
  DFLASH_CUDA_CHECK_LAUNCH("swiglu_fwd_bf16");
}

/// dGate, dUp of swiglu_fwd_bf16 given dy.
inline void swiglu_bwd_bf16(StridedBf16 dy, StridedBf16 gate, StridedBf16 up,
                            MutableStridedBf16 dGate, MutableStridedBf16 dUp,
                            int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0)
    return;
  bool vec = cols % 8 == 0 && detail::vectorizable(dy.data, dy.ld) &&
             detail::vectorizable(gate.data, gate.ld) &&
             detail::vectorizable(up.data, up.ld) &&
             detail::vectorizable(dGate.data, dGate.ld) &&
             detail::vectorizable(dUp.data, dUp.ld);
  if (vec)
    detail::swiglu_bwd_bf16_kernel<8>
        <<<detail::elementwiseGrid(cols / 8, rows), 256, 0, stream>>>(
            dy, gate, up, dGate, dUp, rows, cols);
  else
    detail::swiglu_bwd_bf16_kernel<1>
        <<<detail::elementwiseGrid(cols, rows), 256, 0, stream>>>(
            dy, gate, up, dGate, dUp, rows, cols);
  DFLASH_CUDA_CHECK_LAUNCH("swiglu_bwd_bf16");
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_SWIGLU_CUH
