//===- BlockAttentionFwd.cuh - Attention forward entry ---------*- CUDA -*-===//
//
// block_attention_fwd_bf16, what the generated step calls for a
// dflash.block_attention op: the wgmma kernel where the shape allows
// (wgmmaForwardSupports in kernels/AttentionLimits.h, the test that
// dflashc's summary prints too), else the mma.sync one; and
// block_attention_fwd_ws_bf16, the warp-specialised wgmma kernel that
// dflash-select-kernels picks for long contexts, and
// block_attention_fwd_ws_pingpong_bf16, the same with its consumers issuing
// in turns. All produce the same outputs (kernels/BlockAttentionArgs.h
// describes the operands).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BLOCKATTENTIONFWD_CUH
#define DFLASH_KERNELS_BLOCKATTENTIONFWD_CUH

#include "kernels/AttentionLimits.h"
#include "kernels/BlockAttentionArgs.h"
#include "kernels/BlockAttentionMmaSyncFwd.cuh"
#include "kernels/BlockAttentionWgmmaFwd.cuh"
#include "kernels/BlockAttentionWgmmaFwdWs.cuh"

namespace dflash::kernels {

/// Forward: out and lse of every query row. Template arguments decide code:
/// head dim D, block size BS, query/kv heads NH/NKV, WINDOW (0 = full layer),
/// CAUSAL (in-block causality of sliding layers).
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL>
void block_attention_fwd_bf16(const BlockAttentionFwdArgs &args,
                              cudaStream_t stream) {
  if constexpr (wgmmaForwardSupports(D, BS, NH, NKV))
    sm90a_block_attention_fwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(
        args, stream);
  else
    mma_sync_block_attention_fwd_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(args,
                                                                      stream);
}

/// The same forward by the warp-specialised wgmma kernel, which
/// dflash-select-kernels picks for long contexts (warpSpecialisedForwardPays
/// in kernels/AttentionLimits.h). PINGPONG: its two consumer warpgroups
/// issue their products in turns.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          bool PINGPONG = false>
void block_attention_fwd_ws_bf16(const BlockAttentionFwdArgs &args,
                                 cudaStream_t stream) {
  static_assert(wgmmaForwardSupports(D, BS, NH, NKV),
                "the warp-specialised forward takes the wgmma forward's "
                "shapes only");
  sm90a_block_attention_fwd_wgmma_ws_bf16<D, BS, NH, NKV, WINDOW, CAUSAL,
                                          /*CLUSTER=*/1, PINGPONG>(args,
                                                                   stream);
}

/// Its pingpong form, on the same layers once its GPU test has passed
/// (schema/KernelEntryPoints.h, kUnvalidatedKernels).
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL>
void block_attention_fwd_ws_pingpong_bf16(const BlockAttentionFwdArgs &args,
                                          cudaStream_t stream) {
  block_attention_fwd_ws_bf16<D, BS, NH, NKV, WINDOW, CAUSAL,
                              /*PINGPONG=*/true>(args, stream);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_BLOCKATTENTIONFWD_CUH
