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

/// The step's dQ rows (RowsByAdders) staged and handed to the adder
/// warpgroup, which releases each slice without adding it: the staging and
/// its barriers without the L2's reductions.
struct WgmmaBwdDqStagedNotAddedForTiming
    : WgmmaBwdDqAdd<BlockAttentionDq::RowsByAdders> {
  using Staged = WgmmaBwdDqAdd<BlockAttentionDq::RowsByAdders>;
  template <class C, class ListAt, class RowIndex>
  static __device__ __forceinline__ void runAdders(const WgmmaBwdDqTarget &to,
                                                   int count, const ListAt &,
                                                   const RowIndex &) {
    const int x =
        Staged::kSlicesPerAdderWarp * to.warp + to.lane / Staged::kSliceRows;
    for (int it = 0; it < count; ++it) {
      tma::waitParity(Staged::sliceBarrier(to.stage, x, 0), it & 1);
      tma::arrive(Staged::sliceBarrier(to.stage, x, 1));
    }
  }
};

} // namespace dflash::kernels::bench

#endif // DFLASH_BENCH_KERNELS_WGMMABWDDQTIMING_CUH
