//===- WgmmaBwdDqTiming.cuh - Timing-only dQ policies ----------*- CUDA -*-===//
//
// dQ-add policies of the wgmma attention backward
// (kernels/BlockAttentionWgmmaBwdDq.cuh) that compute a wrong dQ on purpose:
// KernelBench runs them to measure what the dQ phase of the context kernel
// costs. Nothing outside bench/ may use them.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_BENCH_KERNELS_WGMMABWDDQTIMING_CUH
#define DFLASH_BENCH_KERNELS_WGMMABWDDQTIMING_CUH

#include "kernels/BlockAttentionWgmmaBwdDq.cuh"

namespace dflash::kernels::bench {

/// dS^T stored and dQ = dS K formed, but never added: the adds' cost.
struct WgmmaBwdDqProductOnlyForTiming : WgmmaBwdDqAddBase {};

/// No dQ phase at all (no dS^T stores, no product): the whole phase's cost.
struct WgmmaBwdDqOmittedForTiming : WgmmaBwdDqAddBase {
  static constexpr bool kDqProduct = false;
};

} // namespace dflash::kernels::bench

#endif // DFLASH_BENCH_KERNELS_WGMMABWDDQTIMING_CUH
