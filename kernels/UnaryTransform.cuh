//===- UnaryTransform.cuh - DFlash2's unary logits on device -*- CUDA -*-===//
//
// docs/semantics.md section 13, "Unary logits": u = T(z) = c tanh(m z / c),
// m = output_multiplier, c = final_logit_softcapping, or m z without a cap
// (c = 0), in fp32. The selector's candidates (kernels/DFlash2Selector.cuh)
// and the lm_head cross-entropy's CE_u (kernels/LmHeadCrossEntropy.cuh) take
// the same T; the CPU reference's is ref::unaryTransform(Grad)
// (kernels/reference/Reference.h).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_UNARYTRANSFORM_CUH
#define DFLASH_KERNELS_UNARYTRANSFORM_CUH

namespace dflash::kernels::detail {

/// T(z) = c tanh(m z / c), or m z without a cap (c = 0).
__device__ __forceinline__ float unaryLogit(float z, float m, float c) {
  return c != 0.f ? c * tanhf(m * z / c) : m * z;
}

/// T'(z) from u = T(z): m (1 - (u / c)^2) (tanh(m z / c) = u / c), or m
/// without a cap; no second tanh.
__device__ __forceinline__ float unaryLogitSlope(float u, float m, float c) {
  if (c == 0.f)
    return m;
  const float th = u / c;
  return m * (1.f - th * th);
}

} // namespace dflash::kernels::detail

#endif // DFLASH_KERNELS_UNARYTRANSFORM_CUH
