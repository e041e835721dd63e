//===- ServingWalk.h - Acceptance in the order a server drafts --*- C++ -*-===//
//
// The serving-order acceptance of held-out rows (docs/runtime.md, "Serving
// tau"): the runs of docs/semantics.md section 10, not at uniformly sampled
// anchors but at the anchors a server drafts from. A row's walk starts at
// its first anchor candidate (sections 2 and 9) a; the block anchored at a
// accepts run(a) drafted tokens, the target adds its own next token, so the
// next block is anchored at a + 1 + run(a), or, where that is not a
// candidate, at the first candidate after it (the next assistant turn or
// conversation). Serving tau = sum of (1 + run) over the walked blocks /
// the walked blocks.
//
// The runs come from the evaluation program run with anchors = a row's
// candidates in order, N at a time (keep = 1, distinct, ascending): its
// per-slot hits and weights say where each block's run ends. ServingWalk
// plans those passes and walks the runs they report; the trainer and
// dflash-reference share it. Plain C++, no CUDA.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_TRAIN_SERVINGWALK_H
#define DFLASH_RUNTIME_TRAIN_SERVINGWALK_H

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dflash::rt {

/// What the walk of some rows adds up: summed over rows (and GPUs) first,
/// divided once.
struct ServingSums {
  double runs = 0;   ///< sum over walked blocks of 1 + run
  double blocks = 0; ///< walked blocks
  /// runs / blocks; NaN without a walked block.
  double tau() const;
  ServingSums &operator+=(const ServingSums &other) {
    runs += other.runs;
    blocks += other.blocks;
    return *this;
  }
};

/// The walk of one row: `candidates` ascending (anchorCandidates),
/// runs[i] the run of the block anchored at candidates[i].
ServingSums walkServingOrder(const std::vector<int32_t> &candidates,
                             const std::vector<int32_t> &runs);

/// The held-out rows an evaluation walks unless told otherwise: those of
/// 131072 tokens (ceil(131072 / seqLen), at least 1). The walk costs about
/// seqLen / N evaluation passes a batch of rows, so this keeps its cost near
/// 131072 / (N * rows a batch) passes whatever the row length (~6x the
/// uniform evaluation of the same rows; one row of 256 passes at 128K and
/// N = 512), and walks some 10^4 blocks of chat data: tau to about +-0.02.
int64_t defaultServingRows(int64_t seqLen);

/// The serving walk of a batch of B rows: which anchors each evaluation
/// pass takes, and the walk of the runs the passes report.
class ServingWalk {
public:
  /// B rows of S tokens, N anchor slots a row, blocks of bs.
  ServingWalk(int64_t B, int64_t S, int64_t N, int64_t bs);

  /// Starts a batch: lossMask [B, S], positionIds [B, S] (null: unpacked
  /// rows); only rows with walked[b] set are walked (the others get no
  /// kept anchor).
  void start(const uint8_t *lossMask, const int32_t *positionIds,
             const std::vector<bool> &walked);
  /// The passes the batch needs: ceil(max over its rows of candidates / N).
  int64_t passes() const { return passCount; }
  /// Pass p's inputs, [B, N] each: row b's candidates [p*N, (p+1)*N) in
  /// order with keep = 1, then anchor = 0, keep = 0 (docs/semantics.md
  /// section 2). Past passes() every slot is keep = 0.
  void anchorsOfPass(int64_t p, int32_t *anchors, uint8_t *keep) const;
  /// Records what pass p reported: hits [B, N*bs] (nonzero: argmax ==
  /// label) and weights [B, N*bs] of each slot.
  void record(int64_t p, const uint8_t *hits, const float *weights);
  /// The walk of every row of the batch, once each pass was recorded.
  ServingSums sums() const;
  /// Row b's candidates and the run of the block at each (once recorded).
  const std::vector<int32_t> &candidatesOf(int64_t b) const {
    return candidates[size_t(b)];
  }
  const std::vector<int32_t> &runsOf(int64_t b) const {
    return runs[size_t(b)];
  }

private:
  int64_t B, S, N, bs;
  int64_t passCount = 0;
  std::vector<std::vector<int32_t>> candidates; ///< per row
  std::vector<std::vector<int32_t>> runs;       ///< per row, per candidate
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_TRAIN_SERVINGWALK_H
