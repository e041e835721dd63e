//===- BlockAttentionArgs.h - Attention launch operands ---------*- C++ -*-===//
//
// What the attention entry points (kernels/BlockAttentionFwd.cuh,
// kernels/BlockAttentionBwd.cuh) take, as plain C++: code that only fills
// and passes the operands on (the generated kernels.h and step.cu) needs no
// kernel header. The kernels compute docs/semantics.md section 3: query (n, k)
// of a draft block sees the context keys [lo, anchor_n) (lo the start of
// the anchor's conversation, position_ids, or of the sliding window, per
// query row k) and the keys of its own block (all of them in a full layer,
// k' <= k in a sliding one). Layouts are those of ref::blockAttention:
//   q, out [B, Q, nh, d]; context K/V [B, S, nkv, d]; draft K/V [B, Q, nkv, d];
//   anchors int32 / keep uint8 [B, N]; positionIds int32 [B, S] (arange in
//   an unpacked row); lse fp32 [B, Q, nh] (natural log).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BLOCKATTENTIONARGS_H
#define DFLASH_KERNELS_BLOCKATTENTIONARGS_H

#include "kernels/Workspaces.h"

#include <cstddef>
#include <cstdint>

// <cuda_bf16.h>'s element type; only pointers to it are needed here.
struct __nv_bfloat16;

namespace dflash::kernels {

/// Forward operands; B, S, N are the runtime batch dimensions.
struct BlockAttentionFwdArgs {
  const __nv_bfloat16 *q;
  const __nv_bfloat16 *contextKeys, *contextValues;
  const __nv_bfloat16 *draftKeys, *draftValues;
  const int32_t *anchors;
  const uint8_t *keep;
  const int32_t *positionIds;
  __nv_bfloat16 *out;
  float *lse;
  int B, S, N;
};

/// Backward operands. dqAccum [B, Q, nh, d] and dOutDotOut [B, Q, nh] are fp32
/// workspace (Workspaces.h: blockAttentionBwdWorkspaceBytes, dOutDotOut at
/// blockAttentionBwdDotOffset); every output is overwritten.
struct BlockAttentionBwdArgs {
  const __nv_bfloat16 *dOut;
  const __nv_bfloat16 *q;
  const __nv_bfloat16 *contextKeys, *contextValues;
  const __nv_bfloat16 *draftKeys, *draftValues;
  const int32_t *anchors;
  const uint8_t *keep;
  const int32_t *positionIds;
  const __nv_bfloat16 *out;
  const float *lse;
  __nv_bfloat16 *dq;
  __nv_bfloat16 *dContextKeys, *dContextValues;
  __nv_bfloat16 *dDraftKeys, *dDraftValues;
  float *dqAccum;
  float *dOutDotOut;
  int B, S, N;
};

/// How the backward's context kernel adds its share of dQ into the fp32
/// accumulator. block_attention_bwd_bf16 picks RowsByAdders (wgmma, where the
/// row stage fits), AtomicVec2 (wgmma, larger N) or BulkReduce (mma.sync);
/// the others are measured alternatives that AttentionGpuTest keeps correct.
/// Variants that compute a wrong dQ to time the others live in bench/kernels.
enum class BlockAttentionDq {
  AtomicVec4,   ///< red.global.add.v4.f32 from the fragments after a lane-pair
                ///< exchange (both kernels; an alternative)
  AtomicVec2,   ///< (wgmma) red.global.add.v2.f32 of each thread's column
                ///< pairs, no exchange (picked where N is too large for rows)
  RowsVec4,     ///< (wgmma) each warp's fragment rows restaged in shared
                ///< memory, then red.global.add.v4.f32 of whole row segments
                ///< by the key warps (an alternative)
  RowsByAdders, ///< (wgmma) RowsVec4's rows added by a third warpgroup (bulk
                ///< reductions) while the two that hold keys go on (picked)
  BulkReduce,   ///< the tile staged in shared memory, one
                ///< cp.reduce.async.bulk per row (picked on mma.sync; an
                ///< alternative on wgmma)
};

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_BLOCKATTENTIONARGS_H
