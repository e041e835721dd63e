//===- DFlashFlops.cpp - FLOP counts of dflash ops ------------------------===//
//
// The FLOP counts that benchmarks divide by: a multiply-add is 2 operations.
// Attention counts only the (query, key) pairs a query can see; since anchors
// are only known at run time, the count assumes every block is kept and its
// anchor is uniform over [0, S-2] (docs/dialect.md).
//
//===----------------------------------------------------------------------===//

#include "dialect/DFlashOps.h"

using namespace mlir;
using namespace mlir::dflash;

static int64_t numElements(Value v) {
  return cast<RankedTensorType>(v.getType()).getNumElements();
}

int64_t SequencePositionsOp::getFlopCount() { return 0; }
int64_t DraftPositionsOp::getFlopCount() { return 0; }
int64_t DraftTokensOp::getFlopCount() { return 0; }
int64_t DraftTargetsOp::getFlopCount() { return 0; }
int64_t EmbedOp::getFlopCount() { return 0; }
int64_t ReshapeOp::getFlopCount() { return 0; }

int64_t LinearOp::getFlopCount() {
  auto w = cast<RankedTensorType>(getWeight().getType());
  int64_t rows = numElements(getInput()) / w.getDimSize(1);
  return 2 * rows * w.getDimSize(0) * w.getDimSize(1);
}

// Square, sum, scale by the inverse RMS and by the weight.
int64_t RmsNormOp::getFlopCount() { return 4 * numElements(getInput()); }

// Two multiplies and one add per element.
int64_t RopeOp::getFlopCount() { return 3 * numElements(getInput()); }

// sigmoid (about 3), two multiplies.
int64_t SwigluOp::getFlopCount() { return 5 * numElements(getGate()); }

int64_t AddOp::getFlopCount() { return numElements(getLhs()); }

int64_t BlockAttentionOp::getFlopCount() {
  auto q = cast<RankedTensorType>(getQuery().getType()).getShape();
  int64_t S = cast<RankedTensorType>(getContextKeys().getType()).getDimSize(1);
  int64_t B = q[0], Q = q[1], nh = q[2], d = q[3];
  int64_t bs = getBlockSize();
  std::optional<int64_t> window;
  if (IntegerAttr w = getWindowAttr())
    window = w.getInt();
  // Visible keys summed over the slots k of one block, averaged over the
  // anchor a in [0, S-2].
  double visible = 0;
  for (int64_t k = 0; k < bs; ++k) {
    double ctx = 0;
    for (int64_t a = 0; a <= S - 2; ++a)
      ctx += window ? std::max<int64_t>(0, std::min(a, *window - 1 - k)) : a;
    visible += ctx / double(std::max<int64_t>(1, S - 1));
    visible += getCausal() ? double(k + 1) : double(bs);
  }
  int64_t blocks = B * (Q / bs);
  // QK^T and PV: 2*d each per visible pair and query head.
  return int64_t(double(blocks) * double(nh) * 4.0 * double(d) * visible);
}

int64_t LmHeadCeOp::getFlopCount() {
  auto w = cast<RankedTensorType>(getWeight().getType());
  int64_t rows = numElements(getLabels());
  return 2 * rows * w.getDimSize(0) * w.getDimSize(1);
}
