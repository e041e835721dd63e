//===- Workspaces.h - Scratch memory each kernel needs ----------*- C++ -*-===//
//
// Plain C++ (no CUDA), so that the compiler's planner and the kernels size
// every workspace with the same functions: dflash-select-kernels records
// these sizes on each kernel op, dflash-plan-memory gives each one an arena
// slot, and the kernels' host code reads the same numbers. A size that the
// kernels need and the planner does not know cannot exist.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_WORKSPACES_H
#define DFLASH_KERNELS_WORKSPACES_H

#include <cstddef>
#include <cstdint>

namespace dflash::kernels {

/// cuBLASLt's workspace, allocated once per GPU beside the arena (the
/// GEMMs' algorithm search and split-K partials use it).
constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

/// Number of CTAs (and fp32 weight-gradient partials) of rms_norm_bwd_bf16:
/// three per SM of an H100/H200 (132 SMs), all resident at once, so no
/// partial last wave. A fixed number keeps the dw sum order, and so its
/// rounding, the same from run to run.
constexpr int kRmsNormBwdPartials = 396;

/// Workspace bytes of rms_norm_bwd_bf16 for hidden size H.
constexpr size_t rmsNormBwdWorkspaceBytes(int64_t H) {
  return static_cast<size_t>(kRmsNormBwdPartials) * size_t(H) * sizeof(float);
}

/// CTAs (and weight-gradient partials) of qk_norm_rope_bwd_bf16: four per SM
/// of an H100/H200, one full wave; fixed, so the dw sum order is too.
constexpr int kQkNormRopeBwdPartials = 528;

/// Workspace bytes of qk_norm_rope_bwd_bf16 for head dim D.
constexpr size_t qkNormRopeBwdWorkspaceBytes(int64_t D) {
  return static_cast<size_t>(kQkNormRopeBwdPartials) * size_t(D) *
         sizeof(float);
}

/// Bytes of the attention backward's fp32 workspace: the dQ accumulator
/// [rows, D], then one dOut . out term per query row (rows = B * N * BS *
/// NH). dOutDotOut starts at blockAttentionBwdDotOffset.
constexpr size_t blockAttentionBwdWorkspaceBytes(int64_t D, int64_t BS,
                                                 int64_t NH, int64_t B,
                                                 int64_t N) {
  const size_t rows = size_t(B) * size_t(N) * size_t(BS) * size_t(NH);
  return rows * size_t(D) * sizeof(float) + rows * sizeof(float);
}
/// Float offset of dOutDotOut inside that workspace.
constexpr size_t blockAttentionBwdDotOffset(int64_t D, int64_t BS, int64_t NH,
                                            int64_t B, int64_t N) {
  return size_t(B) * size_t(N) * size_t(BS) * size_t(NH) * size_t(D);
}

/// Bytes of the largest logits chunk lm_head_cross_entropy_bf16 keeps.
constexpr int64_t kLmHeadMaxChunkBytes = int64_t(512) << 20;

/// The most candidates per row lm_head_cross_entropy_bf16 keeps when a
/// DFlash2 selector's top-K is folded into it (one warp's list of two
/// entries a lane).
constexpr int64_t kLmHeadMaxTopK = 64;

/// Rows the fused lm_head + cross-entropy computes. With blockSize >= 2 the
/// rows are draft blocks of blockSize slots, and slot 0 of each (the
/// anchor's, whose weight docs/semantics.md section 4 fixes at 0 through
/// [k > 0]) is left out of both GEMMs; otherwise every row.
constexpr int64_t lmHeadComputedRows(int64_t rows, int64_t blockSize) {
  return blockSize >= 2 ? rows / blockSize * (blockSize - 1) : rows;
}

/// The batch row of computed row c: slot c % (bs - 1) + 1 of block
/// c / (bs - 1) when slot 0 of every block is skipped (bs >= 2), else c.
/// Device code calls it too (--expt-relaxed-constexpr).
constexpr int64_t lmHeadSourceRow(int64_t c, int64_t blockSize) {
  return blockSize >= 2
             ? c / (blockSize - 1) * blockSize + c % (blockSize - 1) + 1
             : c;
}

/// Rows per logits chunk of the fused lm_head + cross-entropy: as many as fit
/// kLmHeadMaxChunkBytes of bf16 logits, a multiple of 64, all rows if fewer.
constexpr int64_t lmHeadChunkRows(int64_t rows, int64_t vocab) {
  int64_t chunk = kLmHeadMaxChunkBytes / (vocab * 2);
  chunk = chunk / 64 * 64;
  if (chunk < 64)
    chunk = 64;
  return rows < chunk ? rows : chunk;
}

/// The fused lm_head + cross-entropy workspace, in order: the four fp32 sums
/// (a 256-byte block), the per-row terms [computed rows, 4] fp32 (rounded up
/// to 256 bytes), one bf16 logits chunk [chunkRows, V] and, when slot 0 of
/// each block is left out, the chunk's gathered rows and their gradient
/// ([chunkRows, H] bf16 each). chunkRows is lmHeadChunkRows of the computed
/// rows.
constexpr size_t kLmHeadSumsBytes = 256;
constexpr size_t lmHeadRowTermBytes(int64_t computedRows) {
  return (size_t(computedRows) * 4 * sizeof(float) + 255) / 256 * 256;
}
/// Rounded up to 256 bytes, so that the gather buffers after it stay
/// aligned for 16-byte copies whatever chunkRows * V is.
constexpr size_t lmHeadChunkBytes(int64_t chunkRows, int64_t vocab) {
  return (size_t(chunkRows) * size_t(vocab) * 2 + 255) / 256 * 256;
}
constexpr size_t lmHeadGatherBytes(int64_t chunkRows, int64_t hidden) {
  return size_t(chunkRows) * size_t(hidden) * 2;
}
constexpr size_t lmHeadCrossEntropyWorkspaceBytes(int64_t rows, int64_t vocab,
                                                  int64_t hidden,
                                                  int64_t blockSize) {
  const int64_t computed = lmHeadComputedRows(rows, blockSize);
  const int64_t chunkRows = lmHeadChunkRows(computed, vocab);
  return kLmHeadSumsBytes + lmHeadRowTermBytes(computed) +
         lmHeadChunkBytes(chunkRows, vocab) +
         (blockSize >= 2 ? 2 * lmHeadGatherBytes(chunkRows, hidden) : 0);
}

/// The DFlash2 selector (kernels/DFlash2Selector.cuh, docs/semantics.md
/// section 13). selector_candidates_bf16 streams the vocabulary: per chunk of
/// vocabulary columns one fp32 GEMM [rows, chunk] into its workspace, at most
/// kSelectorMaxChunkBytes, a multiple of 256 columns (at least 256), the
/// whole vocabulary if smaller.
constexpr int64_t kSelectorMaxChunkBytes = int64_t(512) << 20;
constexpr int64_t selectorVocabChunk(int64_t rows, int64_t vocab) {
  int64_t chunk = kSelectorMaxChunkBytes / ((rows > 0 ? rows : 1) * 4);
  chunk = chunk / 256 * 256;
  if (chunk < 256)
    chunk = 256;
  return vocab < chunk ? vocab : chunk;
}
constexpr size_t selectorCandidatesWorkspaceBytes(int64_t rows, int64_t vocab) {
  return size_t(rows) * size_t(selectorVocabChunk(rows, vocab)) * sizeof(float);
}

/// selector_loss_bf16's workspace: t = input @ projection^T [rows, r] fp32
/// (rounded up to 256 bytes), then two fp32 terms per row [rows, 2] (w cov
/// CE_s, w cov), summed in a fixed order.
constexpr size_t selectorProjectedBytes(int64_t rows, int64_t rank) {
  return (size_t(rows) * size_t(rank) * sizeof(float) + 255) / 256 * 256;
}
constexpr size_t selectorLossWorkspaceBytes(int64_t rows, int64_t rank) {
  return selectorProjectedBytes(rows, rank) + size_t(rows) * 2 * sizeof(float);
}
/// selector_loss_grad_bf16's workspace: t [rows, r] fp32 as above, then the
/// two codebook gradients' fp32 accumulators [V, r] each (their rows are
/// scatter-added, then rounded once into the bf16 results).
constexpr size_t selectorLossGradWorkspaceBytes(int64_t rows, int64_t rank,
                                                int64_t vocab) {
  return selectorProjectedBytes(rows, rank) +
         2 * size_t(vocab) * size_t(rank) * sizeof(float);
}

/// Routed rows (t * k + j) moe_permute_bf16 counts in one CTA: each row's
/// rank among its chunk's rows of the same expert is found by comparing it
/// with the rows before it, so the grouping is stable and deterministic.
constexpr int64_t kMoePermuteChunkRows = 1024;
constexpr int64_t moePermuteChunks(int64_t routedRows) {
  return (routedRows + kMoePermuteChunkRows - 1) / kMoePermuteChunkRows;
}
/// moe_permute_bf16's int32 workspace: each chunk's row count of each
/// expert [chunks, E] (then where the chunk's rows of it start), and each
/// routed row's rank within its chunk and expert [T * k].
constexpr size_t moePermuteWorkspaceBytes(int64_t routedRows, int64_t E) {
  return (size_t(moePermuteChunks(routedRows)) * size_t(E) +
          size_t(routedRows)) *
         sizeof(int32_t);
}
/// moe_unpermute_bf16's int32 workspace: the permuted row of each routed
/// row t * k + j (the inverse of `source`) [T * k].
constexpr size_t moeUnpermuteWorkspaceBytes(int64_t routedRows) {
  return size_t(routedRows) * sizeof(int32_t);
}

/// CTAs along the draft blocks (and fp32 base-gradient partials) of
/// grouped_conv_grad_bf16: two per SM of an H100/H200, fewer when there are
/// fewer blocks. Each CTA sums its blocks' base gradient in registers and
/// writes one partial; a second pass adds the partials in a fixed order, so
/// base_grad does not depend on scheduling as fp32 atomics would.
constexpr int64_t kGroupedConvGradPartials = 264;
constexpr int64_t groupedConvGradPartials(int64_t blocks) {
  return blocks < kGroupedConvGradPartials ? blocks : kGroupedConvGradPartials;
}
/// grouped_conv_grad_bf16's fp32 workspace: the partials [P, kc, H] for
/// `blocks` draft blocks (B * N) of kc taps and H channels.
constexpr size_t groupedConvGradWorkspaceBytes(int64_t blocks, int64_t kc,
                                               int64_t H) {
  return size_t(groupedConvGradPartials(blocks)) * size_t(kc) * size_t(H) *
         sizeof(float);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_WORKSPACES_H
