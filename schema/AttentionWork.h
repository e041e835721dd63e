//===- AttentionWork.h - Block attention at the drawn anchors ---*- C++ -*-===//
//
// The compiler counts a step's FLOPs before any anchor is drawn: its block
// attention assumes every block kept and each anchor uniform over its row
// (dialect/DFlashFlops.cpp). The kernels' work depends on the anchors a step
// draws: where a row's answers follow a long prompt, as in long-context
// rows, its anchors see more context than that. The compiler hands the
// trainer its attention by layer kind (compiler/Analysis/FlopCount.h,
// attentionByKind), and the trainer counts the same attention at the anchors
// it drew: the metrics' "drawn_tflops" beside "tflops".
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_SCHEMA_ATTENTIONWORK_H
#define DFLASH_SCHEMA_ATTENTIONWORK_H

#include <cstdint>
#include <vector>

namespace dflash {

/// The block attention of one kind of layer in a step: its window and
/// in-block causality, the FLOPs the step's count gives it, and the FLOPs of
/// one visible (query slot, key) pair of one block of one of the step's rows,
/// every layer of the kind and every pass (forward, backward, recomputed
/// forward) together.
struct AttentionKindFlops {
  int64_t window = 0; ///< 0: a full layer
  bool causal = false;
  double counted = 0;
  double perPair = 0;
};

/// The inputs of one step that decide what its attention sees, row-major:
/// anchors and keep [rows, N], positionIds [rows, S] (each token's position
/// in its own conversation).
struct DrawnAnchors {
  int64_t rows = 0, S = 0, N = 0, blockSize = 0;
  const int32_t *anchors = nullptr;
  const uint8_t *keep = nullptr;
  const int32_t *positionIds = nullptr;
};

/// The (query slot, key) pairs that the blocks of `drawn` see in a layer of
/// `window` (0: full) and in-block causality `causal` (docs/semantics.md,
/// section 1): for slot k of a kept block, the context keys of its anchor's
/// conversation before the anchor (at most W - 1 - k of them in a sliding
/// layer), and k + 1 (causal) or blockSize slots of its own block; none for
/// a block with keep = 0.
double visiblePairs(const DrawnAnchors &drawn, int64_t window, bool causal);

/// `flopsPerStep` with each kind's counted attention replaced by its FLOPs
/// at the anchors drawn.
double drawnStepFlops(double flopsPerStep,
                      const std::vector<AttentionKindFlops> &kinds,
                      const DrawnAnchors &drawn);

} // namespace dflash

#endif // DFLASH_SCHEMA_ATTENTIONWORK_H
