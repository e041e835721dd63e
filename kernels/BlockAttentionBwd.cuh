//===- BlockAttentionBwd.cuh - Attention backward entry --------*- CUDA -*-===//
//
// block_attention_bwd_bf16, what the generated step calls for a
// dflash.block_attention_grad op: the wgmma context kernel where the shape
// allows (wgmmaBackwardSupports), with its row stage and adder warpgroup
// where N leaves room for them (wgmmaBwdRowStageFits), else with 8-byte
// atomics from the fragments, all pairs at once as measured (the N that
// dflashc accepts: blockAttentionBwdSmemBytes); else the mma.sync backward.
// block_attention_bwd_cluster_bf16 runs the context kernel in clusters of
// two key tiles, for short rows several to a GPU;
// block_attention_bwd_pair_by_pair_bf16 launches the key tiles of one (row,
// kv head) pair at a time, for the longest rows. Same outputs and workspace
// (blockAttentionBwdWorkspaceBytes) every way.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BLOCKATTENTIONBWD_CUH
#define DFLASH_KERNELS_BLOCKATTENTIONBWD_CUH

#include "kernels/AttentionLimits.h"
#include "kernels/BlockAttentionArgs.h"
#include "kernels/BlockAttentionMmaSyncBwd.cuh"
#include "kernels/BlockAttentionWgmmaBwd.cuh"

namespace dflash::kernels {

/// Backward: dq, dK / dV of context and draft keys (all overwritten); the
/// same template arguments as block_attention_fwd_bf16.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL>
void block_attention_bwd_bf16(const BlockAttentionBwdArgs &args,
                              cudaStream_t stream) {
  if constexpr (wgmmaBackwardSupports(D, BS, NH, NKV)) {
    if (wgmmaBwdRowStageFits(D, BS, NH, NKV, args.N))
      sm90a_block_attention_bwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(
          args, stream);
    else
      sm90a_block_attention_bwd_wgmma_bf16<
          D, BS, NH, NKV, WINDOW, CAUSAL,
          WgmmaBwdDqAdd<BlockAttentionDq::AtomicVec2>, 2, true, 0>(args,
                                                                   stream);
  } else
    mma_sync_block_attention_bwd_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(args,
                                                                      stream);
}

/// The same backward with the context kernel in clusters of two key tiles
/// (Q / dO multicast), which dflash-select-kernels picks for short rows
/// (clusterBackwardPays in kernels/AttentionLimits.h).
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL>
void block_attention_bwd_cluster_bf16(const BlockAttentionBwdArgs &args,
                                      cudaStream_t stream) {
  static_assert(wgmmaBackwardSupports(D, BS, NH, NKV),
                "the cluster backward takes the wgmma backward's shapes only");
  sm90a_block_attention_bwd_wgmma_bf16<
      D, BS, NH, NKV, WINDOW, CAUSAL,
      WgmmaBwdDqAdd<BlockAttentionDq::RowsByAdders>, 2, true,
      kWgmmaBwdPairsPerGroup, 2, /*CLUSTER=*/2>(args, stream);
}

/// The same backward launching the key tiles of one (row, kv head) pair at a
/// time (GROUP = 1), which dflash-select-kernels picks for the longest rows
/// (pairByPairBackwardPays in kernels/AttentionLimits.h).
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL>
void block_attention_bwd_pair_by_pair_bf16(const BlockAttentionBwdArgs &args,
                                           cudaStream_t stream) {
  static_assert(wgmmaBackwardSupports(D, BS, NH, NKV),
                "the pair-by-pair backward takes the wgmma backward's shapes "
                "only");
  sm90a_block_attention_bwd_wgmma_bf16<
      D, BS, NH, NKV, WINDOW, CAUSAL,
      WgmmaBwdDqAdd<BlockAttentionDq::RowsByAdders>, 2, true, /*GROUP=*/1>(
      args, stream);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_BLOCKATTENTIONBWD_CUH
