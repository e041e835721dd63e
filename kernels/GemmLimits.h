//===- GemmLimits.h - Which shapes the hand-written GEMMs take ----------===//
//
// Plain C++ (no CUDA), so that the compiler can include it: dflash-fuse-
// kernels forms a dflash.linear_swiglu only where swiglu_gemm_bf16
// (kernels/SwiGluGemm.cuh, which checks the same at launch) takes the shape;
// elsewhere the two products stay cuBLASLt's and SwiGLU its own pass.
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

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_GEMMLIMITS_H
