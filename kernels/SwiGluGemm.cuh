//===- SwiGluGemm.cuh - The MLP's gate/up GEMM with SwiGLU applied -*- CUDA
//-*-===//
//
// y [M, F] = silu(x Wg^T) * (x Wu^T), x [M, K], Wg and Wu [F, K] (all
// row-major bf16, K contiguous: Hugging Face's Linear weights as stored).
// The products accumulate in fp32 and SwiGLU reads the accumulators, so y is
// rounded once and neither [M, F] product is ever stored: against two GEMMs
// and the elementwise pass (kernels/SwiGlu.cuh) it writes a third of the
// bytes and reads none back. cuBLASLt has no such epilogue. Inference only
// (the target model's MLP): the backward needs the products it drops.
//
// The kernel is kernels/WgmmaGemm.cuh's with the SwiGLU epilogue and the
// dense schedule: tiles of 128 x 128 outputs, each stage's weight operand the
// gate's 128 rows above the up projection's, so one m64n256k16 computes both
// products of a tile.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_SWIGLUGEMM_CUH
#define DFLASH_KERNELS_SWIGLUGEMM_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/GemmLimits.h"
#include "kernels/SwiGlu.cuh"
#include "kernels/WgmmaGemm.cuh"

#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

struct SwiGluGemmArgs {
  __nv_bfloat16 *y; ///< [M, F]
  int64_t M, F, K;
};

/// Whether swiglu_gemm_bf16 takes these: the shape (kernels/GemmLimits.h)
/// and 16-byte aligned bases (TMA's).
inline bool swigluGemmSupports(const void *x, const void *wGate,
                               const void *wUp, const void *y, int64_t M,
                               int64_t F, int64_t K) {
  auto aligned = [](const void *p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
  };
  return aligned(x) && aligned(wGate) && aligned(wUp) && aligned(y) && M > 0 &&
         M < (int64_t(1) << 31) && swigluGemmSupportsShape(F, K);
}

namespace detail {

/// Launches the Cluster form on `stream`: one CTA an SM (as many clusters as
/// can be resident at once), each going round the work units.
template <int Cluster>
void launchSwiGluGemm(const __nv_bfloat16 *x, const __nv_bfloat16 *wGate,
                      const __nv_bfloat16 *wUp, SwiGluGemmArgs args,
                      cudaStream_t stream) {
  launchWgmmaGemm<GemmEpilogue::SwiGlu, Cluster>(
      DenseSchedule<GemmEpilogue::SwiGlu, Cluster>{args.M, args.F}, x, wGate,
      wUp, args.F, args.y, args.K, stream, "swiglu_gemm x or weights");
}

/// The form swiglu_gemm_bf16 launches: one CTA (clusters of two were no
/// faster on the H200, bench/RESULTS.md).
constexpr int kSwiGluGemmCluster = 1;

} // namespace detail

/// y = silu(x Wg^T) * (x Wu^T) (see the file comment); `stream` orders it.
/// The caller checks swigluGemmSupports first.
inline void swiglu_gemm_bf16(const __nv_bfloat16 *x, const __nv_bfloat16 *wGate,
                             const __nv_bfloat16 *wUp, SwiGluGemmArgs args,
                             cudaStream_t stream) {
  if (!swigluGemmSupports(x, wGate, wUp, args.y, args.M, args.F, args.K))
    detail::reportCudaFailure(__FILE__, __LINE__, "swiglu_gemm_bf16",
                              "unsupported shape or alignment (16-byte "
                              "bases, K a multiple of 8, F even)");
  detail::launchSwiGluGemm<detail::kSwiGluGemmCluster>(x, wGate, wUp, args,
                                                       stream);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_SWIGLUGEMM_CUH
