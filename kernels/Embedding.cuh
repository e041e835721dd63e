//===- Embedding.cuh - Rows of a table by token id -------------*- CUDA -*-===//
//
// out[r] = table[ids[r]] for a target decoder's input tokens (ref::embed):
// one CTA per row (grid-strided), H/8 16-byte copies. The ids were checked
// against the vocabulary when the shard was read (runtime/data), so the
// kernel does not check them again.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_EMBEDDING_CUH
#define DFLASH_KERNELS_EMBEDDING_CUH

#include "kernels/CudaCheck.cuh"

#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

namespace detail {

static __global__ void __launch_bounds__(128)
    embed_rows_bf16_kernel(const __nv_bfloat16 *table, const int32_t *ids,
                           __nv_bfloat16 *out, int64_t rows, int64_t H) {
  const int64_t vectors = H / 8;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint4 *src = reinterpret_cast<const uint4 *>(
        table + static_cast<int64_t>(ids[r]) * H);
    uint4 *dst = reinterpret_cast<uint4 *>(out + r * H);
    for (int64_t c = threadIdx.x; c < vectors; c += blockDim.x)
      dst[c] = src[c];
  }
}

} // namespace detail

/// out [rows, H] = table [V, H] at ids [rows]; H a multiple of 8.
inline void embed_rows_bf16(const __nv_bfloat16 *table, const int32_t *ids,
                            __nv_bfloat16 *out, int64_t rows, int64_t H,
                            cudaStream_t stream) {
  if (rows == 0)
    return;
  int64_t blocks = rows < 16384 ? rows : 16384;
  detail::embed_rows_bf16_kernel<<<unsigned(blocks), 128, 0, stream>>>(
      table, ids, out, rows, H);
  DFLASH_CUDA_CHECK_LAUNCH("embed_rows_bf16");
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_EMBEDDING_CUH
