//===- GemmLimits.h - Which shapes the hand-written GEMMs take ----------===//
//
// Plain C++ (no CUDA), so that the compiler can include it: dflash-fuse-
// kernels forms a dflash.linear_swiglu only where swiglu_gemm_bf16
// (kernels/SwiGluGemm.cuh, which checks the same at launch) takes the shape;
// elsewhere the two products stay cuBLASLt's and SwiGLU its own pass.
// dflash-select-kernels refuses a mixture-of-experts shape the grouped
// GEMMs (kernels/Moe.cuh) do not take.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_GEMMLIMITS_H
#define DFLASH_KERNELS_GEMMLIMITS_H

#include <cstdint>

namespace dflash::kernels {

/// The SwiGLU GEMM's weights [F, K]: TMA reads rows of 16-byte multiples
/// (K a multiple of 8 bf16), the epilogue stores bf16 pairs (F even), and
/// tile coordinates are 32-bit.
constexpr bool swigluGemmSupportsShape(int64_t F, int64_t K) {
  return F > 0 && K > 0 && K % 8 == 0 && F % 2 == 0 && F < (int64_t(1) << 31) &&
         K < (int64_t(1) << 31);
}

/// The grouped expert GEMMs (kernels/Moe.cuh): each CTA counts the
/// experts' row tiles in shared memory, one int pair an expert.
constexpr int kGroupedGemmMaxExperts = 512;
/// moe_route_bf16 (kernels/Moe.cuh): one warp a token, a lane each chosen
/// expert's weight.
constexpr int kMoeMaxTopK = 32;

/// The grouped GEMMs' stacked weights [E, N, K]: TMA rows of 16-byte
/// multiples, bf16 pairs stored, 32-bit tile coordinates over all E * N rows.
constexpr bool groupedGemmSupportsShape(int64_t E, int64_t N, int64_t K) {
  return E > 0 && E <= kGroupedGemmMaxExperts && N > 0 && K > 0 && K % 8 == 0 &&
         N % 2 == 0 && E * N < (int64_t(1) << 31) && K < (int64_t(1) << 31);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_GEMMLIMITS_H
