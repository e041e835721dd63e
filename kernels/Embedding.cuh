//===- Embedding.cuh - Rows of a table by token id -------------*- CUDA -*-===//
//
// out[r] = table[ids[r]] * scale for a target decoder's input tokens
// (ref::embed; the scale is dflash.embed's, 1 without one): one CTA per row
// (grid-strided), H/8 16-byte copies. The ids were checked against the
// vocabulary when the shard was read (runtime/data), so the kernel does not
// check them again.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_EMBEDDING_CUH
#define DFLASH_KERNELS_EMBEDDING_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/Reduce.cuh"

#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

namespace detail {

/// One 16-byte vector of an embedding row times `scale` in fp32, rounded
/// once (dflash.embed's scale, a DFlash2 drafter's input_embedding_scale).
/// A scale of 1 copies the bits, as an unscaled embed always did.
__device__ __forceinline__ uint4 scaledEmbedVector(uint4 v, float scale) {
  if (scale == 1.f)
    return v;
  float f[8];
  unpackBf16x8(v, f);
#pragma unroll
  for (int i = 0; i < 8; ++i)
    f[i] *= scale;
  return packBf16x8(f);
}

static __global__ void __launch_bounds__(128)
    embed_rows_bf16_kernel(const __nv_bfloat16 *table, const int32_t *ids,
                           __nv_bfloat16 *out, int64_t rows, int64_t H,
                           float scale) {
  const int64_t vectors = H / 8;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint4 *src = reinterpret_cast<const uint4 *>(
        table + static_cast<int64_t>(ids[r]) * H);
    uint4 *dst = reinterpret_cast<uint4 *>(out + r * H);
    for (int64_t c = threadIdx.x; c < vectors; c += blockDim.x)
      dst[c] = scaledEmbedVector(src[c], scale);
  }
}

} // namespace detail

/// out [rows, H] = table [V, H] at ids [rows] times scale (1: a copy); H a
/// multiple of 8.
inline void embed_rows_bf16(const __nv_bfloat16 *table, const int32_t *ids,
                            __nv_bfloat16 *out, int64_t rows, int64_t H,
                            float scale, cudaStream_t stream) {
  if (rows == 0)
    return;
  int64_t blocks = rows < 16384 ? rows : 16384;
  detail::embed_rows_bf16_kernel<<<unsigned(blocks), 128, 0, stream>>>(
      table, ids, out, rows, H, scale);
  DFLASH_CUDA_CHECK_LAUNCH("embed_rows_bf16");
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_EMBEDDING_CUH
