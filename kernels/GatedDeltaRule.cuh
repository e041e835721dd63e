//===- GatedDeltaRule.cuh - The gated delta rule, chunk-wise --*- CUDA -*-===//
//
// dflash.gated_delta_rule (docs/dialect.md) on bf16 tensors, in the
// chunk-wise form of docs/kernels.md ("The gated delta rule, chunk-wise"):
// the entry point the generated step calls, and the shapes it takes. The
// kernel is the tensor-core one of GatedDeltaRuleMmaSync.cuh (chunks of 64
// that never cross a conversation start), at every head dim the op has
// (32, 64 or 128, keys and values alike). The first kernel, on CUDA cores
// (chunks of 32), left the shipped code once this one had passed
// DeltaNetGpuTest at every one of those dims: no shape needed it
// (docs/kernels.md).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_GATEDDELTARULE_CUH
#define DFLASH_KERNELS_GATEDDELTARULE_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/DeltaNetLimits.h"
#include "kernels/GatedDeltaRuleMmaSync.cuh"

#include <cstdint>
#include <cuda_bf16.h>
#include <type_traits>

namespace dflash::kernels {

namespace detail {

/// Runs launch(std::integral_constant<int, d>{}) for head dim d (keys and
/// values alike), after checking the shapes the kernel takes.
template <typename Launch>
void forGatedDeltaRuleShape(const char *kernel, int64_t Hk, int64_t Hv,
                            int64_t dk, int64_t dv, Launch launch) {
  if (!gatedDeltaRuleSupports(dk, dv) || Hk < 1 || Hv % Hk != 0)
    reportCudaFailure(__FILE__, __LINE__, kernel,
                      "head dims 32, 64 or 128 (keys and values alike), "
                      "value heads a multiple of key heads");
  if (dk == 32)
    launch(std::integral_constant<int, 32>{});
  else if (dk == 64)
    launch(std::integral_constant<int, 64>{});
  else
    launch(std::integral_constant<int, 128>{});
}

} // namespace detail

/// out [B, S, Hv, dv] of q, k [B, S, Hk, dk], v [B, S, Hv, dv], a and beta's
/// logits [B, S, Hv], aLog and dtBias [Hv], pos [B, S] (docs/dialect.md), on
/// tensor cores (kernels/GatedDeltaRuleMmaSync.cuh).
inline void
gated_delta_rule_bf16(const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                      const __nv_bfloat16 *v, const __nv_bfloat16 *a,
                      const __nv_bfloat16 *beta, const __nv_bfloat16 *aLog,
                      const __nv_bfloat16 *dtBias, const int32_t *pos,
                      __nv_bfloat16 *out, int64_t B, int64_t S, int64_t Hk,
                      int64_t Hv, int64_t dk, int64_t dv, cudaStream_t stream) {
  if (B <= 0 || S <= 0)
    return;
  detail::forGatedDeltaRuleShape(
      "gated_delta_rule_bf16", Hk, Hv, dk, dv, [&](auto d) {
        detail::launchMmaSyncGatedDeltaRule<d(), d()>(
            q, k, v, a, beta, aLog, dtBias, pos, out, B, S, Hk, Hv, stream);
      });
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_GATEDDELTARULE_CUH
