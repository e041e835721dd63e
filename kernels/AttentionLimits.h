//===- AttentionLimits.h - Which attention kernel, and its shared memory -===//
//
// Plain C++ (no CUDA), so that the compiler can include it: it picks the
// attention kernels the way the generated step's dispatchers do
// (block_attention_fwd_bf16, block_attention_bwd_bf16), and it rejects a
// spec whose attention backward would need more shared memory per CTA than
// the GPU has, before nvcc runs. The backward's context kernels keep every
// block's anchor and the list of query tiles in shared memory, so their
// need grows with the anchors per row; everything else is fixed. The CUDA
// headers compute their launch sizes with these functions.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_ATTENTIONLIMITS_H
#define DFLASH_KERNELS_ATTENTIONLIMITS_H

#include <cstdint>

namespace dflash::kernels {

/// Dynamic shared memory one CTA may opt in to on sm_90 (H100, H200).
constexpr int64_t kSharedMemoryPerBlockOptIn = 227 * 1024;

/// The shapes the attention kernels exist for (BlockAttentionTiling asserts
/// the same; dflash-select-kernels rejects the rest, naming the spec field):
/// head dim 64 or 128, blocks of at most 64 tokens, and bs * (nh / nkv)
/// query rows per block and kv head of at most 64 (whole blocks per query
/// tile), or exactly 128 (half a block per tile).
constexpr bool blockAttentionSupportsHeadDim(int64_t d) {
  return d == 64 || d == 128;
}
constexpr int64_t kBlockAttentionMaxBlockSize = 64;
/// The target decoder's causal attention (causal_attention_fwd_bf16): head
/// dim 64, 128 or 256 (Qwen3.5/3.6's full attention), any heads with nh a
/// multiple of nkv; each dim passed CausalAttentionGpuTest on the GPU
/// machine before it was accepted here.
constexpr bool causalAttentionSupportsHeadDim(int64_t d) {
  return d == 64 || d == 128 || d == 256;
}
constexpr bool blockAttentionSupportsBlockRows(int64_t rows) {
  return rows > 0 && (rows <= 64 || rows == 128);
}

/// The wgmma forward: one block of 64 query rows per warpgroup.
constexpr bool wgmmaForwardSupports(int64_t d, int64_t bs, int64_t nh,
                                    int64_t nkv) {
  return (d == 64 || d == 128) && nkv > 0 && nh % nkv == 0 &&
         bs * (nh / nkv) == 64;
}

/// The most context keys a block of a layer sees in a row of seqLen tokens:
/// the row, or the window of a sliding layer if smaller (what the
/// warp-specialised forward's rule below counts).
constexpr int64_t layerContextKeys(int64_t window, int64_t seqLen) {
  return window > 0 && window < seqLen ? window : seqLen;
}

/// The warp-specialised wgmma forward (BlockAttentionWgmmaFwdWs.cuh):
/// dflash-select-kernels picks it for layers whose blocks see at least
/// kWarpSpecialisedForwardMinKeys context keys (the row's S, or the window
/// of a sliding layer if smaller): there its 128-key tiles and the softmax
/// under the previous tile's P V pay for the producer warpgroup. Measured
/// beside the TMA forward on one row at qwen3-8b shapes (H100, KernelBench
/// attention-long): 0.93x at 3072 keys, 1.03x at 8192, 1.08x at 32768,
/// 1.12x at 131072 (docs/kernels.md). Only the shapes its GPU test
/// (AttentionGpuTest BlockAttentionWgmmaWs) passed: d 128 with blocks of 16
/// and 4 query heads per kv head (qwen3), d 64 with blocks of 8 and 8
/// (gpt-oss), full or causal sliding layers (not DFlash2's bidirectional
/// windows); other shapes keep the TMA forward.
constexpr int64_t kWarpSpecialisedForwardMinKeys = 8192;
constexpr bool warpSpecialisedForwardPays(int64_t d, int64_t bs, int64_t nh,
                                          int64_t nkv, int64_t window,
                                          bool causal, int64_t seqLen) {
  if (!wgmmaForwardSupports(d, bs, nh, nkv) || (window > 0 && !causal))
    return false;
  const int64_t g = nh / nkv;
  const bool validatedShape =
      (d == 128 && bs == 16 && g == 4) || (d == 64 && bs == 8 && g == 8);
  return validatedShape &&
         layerContextKeys(window, seqLen) >= kWarpSpecialisedForwardMinKeys;
}

/// The wgmma backward: head dim 128, 64-row query tiles of whole blocks
/// (bs * nh / nkv dividing 64) or of half blocks (128 rows per block).
constexpr bool wgmmaBackwardSupports(int64_t d, int64_t bs, int64_t nh,
                                     int64_t nkv) {
  return d == 128 && nkv > 0 && nh % nkv == 0 && bs <= 64 &&
         (64 % (bs * (nh / nkv)) == 0 || bs * (nh / nkv) == 128);
}

/// Query rows per tile of the mma.sync context backward: whole blocks up to
/// 64 rows, or half a block of 128.
constexpr int64_t mmaSyncBwdQueryTileRows(int64_t blockRows) {
  return blockRows <= 64 ? (64 / blockRows) * blockRows : 64;
}

/// Shared memory of the mma.sync context backward for N anchors per row:
/// K/V tiles of 128 keys, Q/dO double buffers of 64 rows, the P^T stage,
/// per-row terms, then anchors and conversation starts [N] and the tile
/// list; with bulk dQ
/// reductions, an fp32 [64 x (d + 4)] stage and its barrier.
constexpr int64_t mmaSyncBwdContextSmemBytes(int64_t d, int64_t blockRows,
                                             int64_t n, bool bulkReduce) {
  const int64_t tileRows = mmaSyncBwdQueryTileRows(blockRows);
  const int64_t tiles = (n * blockRows + tileRows - 1) / tileRows;
  return (2 * 128 * d + 4 * 64 * d + 128 * 64) * 2 +
         (8 * 64 + 8 + 2 * n + tiles) * 4 +
         (bulkReduce ? 16 + 64 * (d + 4) * 4 : 0);
}

/// The fp32 dQ stage of the wgmma context backward, by how dQ is added:
/// none (atomics from the fragments), the whole 64-row tile [64 x (d + 4)]
/// (bulk reductions), or each warp's 16 fragment rows of one 64-column panel
/// [16 x kWgmmaDqRowStride] (row atomics: 8 fp32 of padding keep the
/// fragment's 8-byte stores free of bank conflicts).
enum class WgmmaDqStage { None, Tile, WarpRows };
constexpr int64_t kWgmmaDqRowStride = 72;

constexpr int64_t wgmmaBwdDqStageBytes(int64_t d, int64_t wgs,
                                       WgmmaDqStage stage) {
  return stage == WgmmaDqStage::Tile ? 64 * (d + 4) * 4
         : stage == WgmmaDqStage::WarpRows
             ? 4 * wgs * 16 * kWgmmaDqRowStride * 4
             : 0;
}

/// The fixed part of the wgmma context backward's shared memory: K/V of
/// 64 * wgs keys, `stages` Q/dO buffers of 64 rows, dS^T, the dQ stage,
/// per-row terms, the stages' barriers and the warp counts (4 per
/// warpgroup, extraWarps more for warps that do not hold keys).
constexpr int64_t wgmmaBwdContextFixedBytes(int64_t d, int64_t wgs,
                                            WgmmaDqStage dqStage,
                                            int64_t stages,
                                            int64_t extraWarps = 0,
                                            int64_t cluster = 1) {
  const int64_t keys = 64 * wgs;
  // Each stage's transaction barrier, and in clusters its "empty" one.
  const int64_t barriers = cluster > 1 ? 2 * stages : stages;
  return 2 * keys * d * 2 + 2 * stages * 64 * d * 2 + keys * 64 * 2 +
         wgmmaBwdDqStageBytes(d, wgs, dqStage) + 4 * stages * 64 * 4 +
         8 * barriers + (4 * wgs + extraWarps) * 4;
}

/// The alignment of the wgmma kernels' 128B-swizzled tiles (one swizzle
/// atom: 8 rows of 128 bytes); their dynamic shared memory starts with up to
/// this much slack.
constexpr int64_t kWgmmaTileAlignBytes = 1024;

/// All of it for N anchors per row: the fixed part after the alignment
/// slack, then anchors and conversation starts [N] and the list of 64-row
/// query tiles.
constexpr int64_t wgmmaBwdContextSmemBytes(int64_t fixedBytes,
                                           int64_t blockRows, int64_t n) {
  return kWgmmaTileAlignBytes + fixedBytes +
         (2 * n + (n * blockRows + 63) / 64) * 4;
}

/// The warps of the wgmma context backward's adder warpgroup
/// (BlockAttentionDq::RowsByAdders): one warpgroup, two key warps' slices
/// of the row stage per warp.
constexpr int64_t kWgmmaBwdAdderWarps = 4;

/// Whether the wgmma context backward's row stage with its adder warpgroup
/// (BlockAttentionDq::RowsByAdders: two warpgroups holding keys, four adder
/// warps, two stages; in clusters of `cluster` CTAs, each stage's second
/// barrier too) fits beside N anchors per row; block_attention_bwd_bf16
/// adds from the fragments instead where not.
constexpr bool wgmmaBwdRowStageFits(int64_t d, int64_t bs, int64_t nh,
                                    int64_t nkv, int64_t n,
                                    int64_t cluster = 1) {
  return wgmmaBwdContextSmemBytes(
             wgmmaBwdContextFixedBytes(d, 2, WgmmaDqStage::WarpRows, 2,
                                       kWgmmaBwdAdderWarps, cluster),
             bs * (nh / nkv), n) <= kSharedMemoryPerBlockOptIn;
}

/// qwen3-8b-b16's attention heads (d 128, blocks of 16, 4 query heads per kv
/// head): the one shape the backward's launch-order variants below were timed
/// at, so the only one they are picked for.
constexpr bool isQwen3BackwardTimedShape(int64_t d, int64_t bs, int64_t nh,
                                         int64_t nkv) {
  return d == 128 && bs == 16 && nh == 4 * nkv;
}

/// The wgmma context backward in clusters of two adjacent key tiles that walk
/// one query tile list, each Q / dO tile read from L2 once and multicast to
/// both (sm90a_block_attention_bwd_wgmma_bf16 with CLUSTER = 2, the
/// default's row stage and adder warpgroup otherwise): dflash-select-kernels
/// picks it (block_attention_bwd_cluster_bf16) where it measured faster than
/// one key tile a CTA. KernelBench on an H100 at qwen3-8b-b16's heads (d 128,
/// blocks of 16, 4 query heads per kv head), 512 anchors a row: 4 rows of
/// 3072 tokens 1.18x (full layer) and 1.29x (sliding 2048); one row of 3072
/// 0.96x (192 key tiles, 1.5 waves; why it loses there was not profiled) and
/// one row of 131072 0.97x (docs/kernels.md). So: rows of at most
/// kClusterBackwardMaxSeqLen tokens, at least kClusterBackwardMinKeyTiles key
/// tiles in the launch (rows x kv heads x tiles a row; about four waves of
/// an H100's 132 SMs), that shape, and N leaving room for its row stage.
constexpr int64_t kClusterBackwardMaxSeqLen = 4096;
constexpr int64_t kClusterBackwardMinKeyTiles = 512;
constexpr bool clusterBackwardPays(int64_t d, int64_t bs, int64_t nh,
                                   int64_t nkv, int64_t rows, int64_t seqLen,
                                   int64_t n) {
  if (!isQwen3BackwardTimedShape(d, bs, nh, nkv))
    return false;
  const int64_t keysPerTile = 2 * 64; // two warpgroups of 64 keys
  const int64_t keyTiles =
      rows * nkv * ((seqLen + keysPerTile - 1) / keysPerTile);
  return wgmmaBwdRowStageFits(d, bs, nh, nkv, n, /*cluster=*/2) &&
         seqLen <= kClusterBackwardMaxSeqLen &&
         keyTiles >= kClusterBackwardMinKeyTiles;
}

/// The wgmma context backward launching the key tiles of one (row, kv head)
/// pair at a time (sm90a_block_attention_bwd_wgmma_bf16 with GROUP = 1, the
/// default's row stage and adder warpgroup otherwise;
/// block_attention_bwd_pair_by_pair_bf16) instead of eight pairs together.
/// On a long row a pair has more key tiles than the GPU holds CTAs, so the
/// CTAs running at once all add into one pair's fp32 dQ accumulator and read
/// its Q / dO: at qwen3-8b-b16's 512 anchors those are 33 MB, inside an
/// H100's 50 MB L2, where eight pairs' 268 MB are not. Against that, more
/// CTAs add into the same query tiles at the same time. Timed so far only in
/// KernelBench attention-long-dq and the step at one row of 131072 tokens,
/// full layers (the suite long-context-levers, not yet run), so: that shape,
/// layers whose blocks see at least kPairByPairBackwardMinKeys context keys
/// (a sliding layer's window bounds them), N leaving room for the row stage.
constexpr int64_t kPairByPairBackwardMinKeys = 131072;
constexpr bool pairByPairBackwardPays(int64_t d, int64_t bs, int64_t nh,
                                      int64_t nkv, int64_t window,
                                      int64_t seqLen, int64_t n) {
  return isQwen3BackwardTimedShape(d, bs, nh, nkv) &&
         wgmmaBwdRowStageFits(d, bs, nh, nkv, n) &&
         layerContextKeys(window, seqLen) >= kPairByPairBackwardMinKeys;
}

/// Shared memory of the context kernel that block_attention_bwd_bf16 runs
/// at least (wgmma with two warpgroups, two stages and dQ atomics from the
/// fragments, where N is too large for the faster row stage; else mma.sync
/// with bulk reductions).
constexpr int64_t blockAttentionBwdSmemBytes(int64_t d, int64_t bs, int64_t nh,
                                             int64_t nkv, int64_t n) {
  const int64_t blockRows = bs * (nh / nkv);
  if (wgmmaBackwardSupports(d, bs, nh, nkv))
    return wgmmaBwdContextSmemBytes(
        wgmmaBwdContextFixedBytes(d, 2, WgmmaDqStage::None, 2), blockRows, n);
  return mmaSyncBwdContextSmemBytes(d, blockRows, n, /*bulkReduce=*/true);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_ATTENTIONLIMITS_H
