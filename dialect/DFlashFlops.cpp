//===- DFlashFlops.cpp - FLOP counts of dflash ops ------------------------===//
//
// The FLOP counts that benchmarks divide by: a multiply-add is 2 operations.
// Attention counts only the (query, key) pairs a query can see; since anchors
// are only known at run time, the count assumes every block is kept and its
// anchor is uniform over [0, S-2] (docs/dialect.md).
//
//===----------------------------------------------------------------------===//

#include "dialect/DFlashOps.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::dflash;

static int64_t numElements(Value v) {
  return cast<RankedTensorType>(v.getType()).getNumElements();
}

int64_t DraftPositionsOp::getFlopCount() { return 0; }
int64_t DraftTokensOp::getFlopCount() { return 0; }
int64_t DraftTargetsOp::getFlopCount() { return 0; }
int64_t DraftAcceptanceOp::getFlopCount() { return 0; }
int64_t EmbedOp::getFlopCount() { return 0; }
int64_t DraftPredecessorsOp::getFlopCount() { return 0; }
// Scalars.
int64_t SelectorAlphaOp::getFlopCount() { return 0; }
int64_t SelectorObjectiveOp::getFlopCount() { return 0; }
int64_t SelectorObjectiveGradOp::getFlopCount() { return 0; }
int64_t ReshapeOp::getFlopCount() { return 0; }
int64_t RowSliceOp::getFlopCount() { return 0; }

int64_t LinearOp::getFlopCount() {
  auto w = cast<RankedTensorType>(getWeight().getType());
  int64_t rows = numElements(getInput()) / w.getDimSize(1);
  return 2 * rows * w.getDimSize(0) * w.getDimSize(1);
}

int64_t BiasedLinearOp::getFlopCount() {
  auto w = cast<RankedTensorType>(getWeight().getType());
  int64_t rows = numElements(getInput()) / w.getDimSize(1);
  return (2 * w.getDimSize(1) + 1) * rows * w.getDimSize(0);
}

// Square, sum, scale by the inverse RMS and by the weight.
int64_t RmsNormOp::getFlopCount() { return 4 * numElements(getInput()); }

// Two multiplies and one add per element.
int64_t RopeOp::getFlopCount() { return 3 * numElements(getInput()); }
int64_t ScaledRopeOp::getFlopCount() { return 3 * numElements(getInput()); }
int64_t YarnRopeOp::getFlopCount() { return 3 * numElements(getInput()); }
int64_t ConcatLastOp::getFlopCount() { return 0; }

// sigmoid (about 3), two multiplies.
int64_t SwigluOp::getFlopCount() { return 5 * numElements(getGate()); }
// Two clamps, sigmoid (about 3), an add and two multiplies.
int64_t ClampedSwigluOp::getFlopCount() { return 8 * numElements(getGate()); }

int64_t AddOp::getFlopCount() { return numElements(getLhs()); }

/// Forward FLOPs of one visible (query slot, key) pair over the query heads:
/// QK^T and PV, 2 d each.
static double forwardFlopsPerPair(Value query) {
  auto q = cast<RankedTensorType>(query.getType()).getShape();
  return 4.0 * double(q[3]) * double(q[2]);
}

/// Forward FLOPs of block attention (see the file comment).
static int64_t attentionFlops(Value query, Value contextKeys, int64_t bs,
                              IntegerAttr windowAttr, bool causal) {
  auto q = cast<RankedTensorType>(query.getType()).getShape();
  int64_t S = cast<RankedTensorType>(contextKeys.getType()).getDimSize(1);
  int64_t B = q[0], Q = q[1];
  std::optional<int64_t> window;
  if (windowAttr)
    window = windowAttr.getInt();
  // Visible keys summed over the slots k of one block, averaged over the
  // anchor a in [0, S-2].
  double visible = 0;
  for (int64_t k = 0; k < bs; ++k) {
    double ctx = 0;
    for (int64_t a = 0; a <= S - 2; ++a)
      ctx += window ? std::max<int64_t>(0, std::min(a, *window - 1 - k)) : a;
    visible += ctx / double(std::max<int64_t>(1, S - 1));
    visible += causal ? double(k + 1) : double(bs);
  }
  int64_t blocks = B * (Q / bs);
  return int64_t(double(blocks) * forwardFlopsPerPair(query) * visible);
}

int64_t BlockAttentionOp::getFlopCount() {
  return attentionFlops(getQuery(), getContextKeys(), getBlockSize(),
                        getWindowAttr(), getCausal());
}

// Recompute QK^T, then dV, dP, dQ, dK: 2.5 times the forward (the
// FlashAttention convention).
int64_t BlockAttentionGradOp::getFlopCount() {
  return attentionFlops(getQuery(), getContextKeys(), getBlockSize(),
                        getWindowAttr(), getCausal()) *
         5 / 2;
}

double mlir::dflash::blockAttentionFlopsPerPair(Operation *op) {
  if (auto fwd = dyn_cast<BlockAttentionOp>(op))
    return forwardFlopsPerPair(fwd.getQuery());
  if (auto grad = dyn_cast<BlockAttentionGradOp>(op))
    return forwardFlopsPerPair(grad.getQuery()) * 5 / 2;
  return 0;
}

int64_t LinearGradInputOp::getFlopCount() {
  auto w = cast<RankedTensorType>(getWeight().getType());
  int64_t rows = numElements(getGrad()) / w.getDimSize(0);
  return 2 * rows * w.getDimSize(0) * w.getDimSize(1);
}

int64_t LinearGradWeightOp::getFlopCount() {
  auto dw = cast<RankedTensorType>(getResult().getType());
  int64_t rows = numElements(getGrad()) / dw.getDimSize(0);
  return 2 * rows * dw.getDimSize(0) * dw.getDimSize(1);
}

int64_t RmsNormGradOp::getFlopCount() { return 8 * numElements(getInput()); }
int64_t RopeGradOp::getFlopCount() { return 3 * numElements(getGrad()); }
int64_t SwigluGradOp::getFlopCount() { return 8 * numElements(getGate()); }

// The logits are recomputed, then multiplied back: two GEMMs.
int64_t LmHeadCeGradOp::getFlopCount() {
  auto w = cast<RankedTensorType>(getWeight().getType());
  int64_t rows = numElements(getLabels());
  return 4 * rows * w.getDimSize(0) * w.getDimSize(1);
}

int64_t AllReduceOp::getFlopCount() { return 0; }
int64_t LossStatsOp::getFlopCount() { return 0; }
int64_t ConvertOp::getFlopCount() { return 0; }
int64_t ClipCoefficientOp::getFlopCount() { return 0; }
int64_t LrScheduleOp::getFlopCount() { return 0; }

int64_t GlobalNormOp::getFlopCount() {
  int64_t n = 0;
  for (Value v : getInputs())
    n += numElements(v);
  return 2 * n;
}

// Moments, bias corrections, the update and the weight decay.
int64_t AdamWOp::getFlopCount() { return 12 * numElements(getMaster()); }

int64_t LmHeadCeOp::getFlopCount() {
  auto w = cast<RankedTensorType>(getWeight().getType());
  int64_t rows = numElements(getLabels());
  return 2 * rows * w.getDimSize(0) * w.getDimSize(1);
}

// Every query sees its earlier keys (a row of one conversation; packed rows
// see fewer): S (S + 1) / 2 pairs per row and head, 2d for the scores and
// 2d for the values each.
int64_t CausalAttentionOp::getFlopCount() {
  auto q = cast<RankedTensorType>(getQuery().getType()).getShape();
  int64_t S = q[1], pairs = S * (S + 1) / 2;
  // A window W keeps min(i + 1, W) keys of query i.
  if (int64_t W = getWindowAttr().getInt(); W > 0 && W < S)
    pairs = W * (W + 1) / 2 + (S - W) * W;
  return q[0] * q[2] * pairs * 4 * q[3];
}

/// (slot, tap) pairs of a grouped convolution's input [B, Q, H] that lie
/// inside their block, times H: slot k of a block reads min(kc, k + 1) taps.
static int64_t convolutionTaps(Value input, int64_t bs, int64_t kc) {
  auto x = cast<RankedTensorType>(input.getType()).getShape();
  int64_t perBlock = 0;
  for (int64_t k = 0; k < bs; ++k)
    perBlock += std::min(kc, k + 1);
  return x[0] * (x[1] / bs) * perBlock * x[2];
}

// Per tap and channel: base + delta, then a multiply-add.
int64_t GroupedConvOp::getFlopCount() {
  return 3 * convolutionTaps(getInput(), getBlockSize(), getKernelSize());
}

// Per tap and channel: the input gradient's 3, the delta gradient's
// multiply-add, and the product's add into the base gradient.
int64_t GroupedConvGradOp::getFlopCount() {
  return 6 * convolutionTaps(getInput(), getBlockSize(), getKernelSize());
}

/// Rows and K of a selector op's values [rows..., K].
static std::pair<int64_t, int64_t> selectorRows(Value values) {
  auto v = cast<RankedTensorType>(values.getType());
  return {v.getNumElements() / v.getShape().back(), v.getShape().back()};
}

// The logits' GEMM (the transform and the top-K are not counted, as
// lm_head_ce does not count its softmax).
int64_t SelectorCandidatesOp::getFlopCount() {
  auto w = cast<RankedTensorType>(getWeight().getType());
  int64_t rows = numElements(getLabels());
  return 2 * rows * w.getDimSize(0) * w.getDimSize(1);
}

// Per row, K + 1 lm_head rows: their logits again, then into the input
// gradient.
int64_t SelectorCandidatesGradOp::getFlopCount() {
  auto w = cast<RankedTensorType>(getWeight().getType());
  int64_t rows = numElements(getLabels());
  return 4 * rows * (getTopK() + 1) * w.getDimSize(1);
}

// t = input @ Wh^T (2 r H a row), z = P[p] * t (r), the K scores (2 K r).
int64_t SelectorLossOp::getFlopCount() {
  auto [rows, K] = selectorRows(getValues());
  auto wh = cast<RankedTensorType>(getProjection().getType());
  int64_t r = wh.getDimSize(0), H = wh.getDimSize(1);
  return rows * (2 * r * H + r + 2 * K * r);
}

// The forward again, then dz (2 K r), the K successor rows (K r), dt and
// the predecessor row (2 r).
int64_t SelectorLossGradOp::getFlopCount() {
  auto [rows, K] = selectorRows(getValues());
  auto wh = cast<RankedTensorType>(getProjection().getType());
  int64_t r = wh.getDimSize(0), H = wh.getDimSize(1);
  return rows * (2 * r * H + 3 * r + 5 * K * r);
}
