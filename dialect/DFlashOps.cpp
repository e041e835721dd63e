//===- DFlashOps.cpp - dflash op verifiers --------------------------------===//
//
// Each verifier checks the numbered constraints of its op in docs/dialect.md;
// the comment before each check names the constraint, and every message
// starts with it so that the negative tests can pin it.
//
//===----------------------------------------------------------------------===//

#include "dialect/DFlashOps.h"
#include "dialect/VerifyHelpers.h"
#include "schema/ModelConfig.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/Format.h"

using namespace mlir;
using namespace mlir::dflash;

#define GET_OP_CLASSES
#include "dialect/DFlashOps.cpp.inc"

using namespace mlir::dflash::verify;

//===----------------------------------------------------------------------===//
// Draft-block bookkeeping
//===----------------------------------------------------------------------===//

LogicalResult DraftPositionsOp::verify() {
  Operation *op = *this;
  // draft_positions C1
  if (failed(expectAtLeast(op, "C1", "block_size", getBlockSize(), 1)))
    return failure();
  // draft_positions C2
  if (failed(expectRank(op, "C2", "anchors", getAnchors(), 2)) ||
      failed(expectRank(op, "C2", "position_ids", getPositionIds(), 2)))
    return failure();
  auto a = tensorType(getAnchors()).getShape();
  auto p = tensorType(getPositionIds()).getShape();
  // draft_positions C3
  if (failed(expectShape(op, "C3", "position_ids", getPositionIds(),
                         {a[0], p[1]})))
    return failure();
  // draft_positions C4
  return expectShape(op, "C4", "result", getResult(),
                     {a[0], a[1] * int64_t(getBlockSize())});
}

/// C2-C4 of the ops that give each draft slot a token of its row
/// (draft_tokens, draft_predecessors): input_ids and anchors of rank 2,
/// anchors and keep [B, N], the result [B, N * block_size].
static LogicalResult verifyDraftSlotTokens(Operation *op, Value inputIds,
                                           Value anchors, Value keep,
                                           Value result, int64_t blockSize) {
  if (failed(expectRank(op, "C2", "input_ids", inputIds, 2)) ||
      failed(expectRank(op, "C2", "anchors", anchors, 2)))
    return failure();
  auto ids = tensorType(inputIds).getShape();
  auto a = tensorType(anchors).getShape();
  if (failed(expectShape(op, "C3", "anchors", anchors, {ids[0], a[1]})) ||
      failed(expectShape(op, "C3", "keep", keep, {ids[0], a[1]})))
    return failure();
  return expectShape(op, "C4", "result", result, {ids[0], a[1] * blockSize});
}

LogicalResult DraftTokensOp::verify() {
  Operation *op = *this;
  // draft_tokens C1
  if (failed(expectAtLeast(op, "C1", "block_size", getBlockSize(), 1)) ||
      failed(expectAtLeast(op, "C1", "mask_token_id", getMaskTokenId(), 0)))
    return failure();
  // draft_tokens C2-C4
  return verifyDraftSlotTokens(op, getInputIds(), getAnchors(), getKeep(),
                               getResult(), int64_t(getBlockSize()));
}

LogicalResult DraftTargetsOp::verify() {
  Operation *op = *this;
  // draft_targets C1
  if (failed(expectAtLeast(op, "C1", "block_size", getBlockSize(), 1)))
    return failure();
  if (!(getGamma().convertToDouble() >= 0))
    return emitOpError() << "(C1) gamma is "
                         << formatDouble(getGamma().convertToDouble())
                         << " but must be zero or positive";
  // draft_targets C2
  if (failed(expectRank(op, "C2", "input_ids", getInputIds(), 2)) ||
      failed(expectRank(op, "C2", "anchors", getAnchors(), 2)))
    return failure();
  auto ids = tensorType(getInputIds()).getShape();
  auto a = tensorType(getAnchors()).getShape();
  // draft_targets C3
  if (failed(expectShape(op, "C3", "loss_mask", getLossMask(), ids)) ||
      failed(expectShape(op, "C3", "position_ids", getPositionIds(), ids)) ||
      failed(expectShape(op, "C3", "anchors", getAnchors(), {ids[0], a[1]})) ||
      failed(expectShape(op, "C3", "keep", getKeep(), {ids[0], a[1]})))
    return failure();
  // draft_targets C4
  SmallVector<int64_t> q = {ids[0], a[1] * int64_t(getBlockSize())};
  if (failed(expectShape(op, "C4", "labels", getLabels(), q)) ||
      failed(expectShape(op, "C4", "weights", getWeights(), q)))
    return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// Dense layers
//===----------------------------------------------------------------------===//

LogicalResult EmbedOp::verify() {
  Operation *op = *this;
  // embed C1
  if (failed(expectRank(op, "C1", "table", getTable(), 2)))
    return failure();
  // embed C2
  auto ids = tensorType(getIds()).getShape();
  SmallVector<int64_t> shape(ids.begin(), ids.end());
  shape.push_back(tensorType(getTable()).getDimSize(1));
  if (failed(expectShape(op, "C2", "result", getResult(), shape)))
    return failure();
  // embed C3
  if (failed(expectSameElementType(op, "C3", "result", getResult(), "table",
                                   getTable())))
    return failure();
  // embed C4
  if (getScale() && !(getScale()->convertToDouble() > 0))
    return emitOpError() << "(C4) scale is "
                         << formatDouble(getScale()->convertToDouble())
                         << " but must be positive";
  return success();
}

/// linear's constraints (C1-C5), which biased_linear's input, weight and
/// result meet too.
static LogicalResult verifyLinear(Operation *op, Value input, Value weight,
                                  Value result) {
  RankedTensorType x = tensorType(input);
  // linear C1
  if (x.getRank() < 2)
    return op->emitOpError()
           << "(C1) input must have rank 2 or more but has rank "
           << x.getRank();
  // linear C2
  if (failed(expectRank(op, "C2", "weight", weight, 2)))
    return failure();
  RankedTensorType w = tensorType(weight);
  // linear C3
  if (x.getShape().back() != w.getDimSize(1))
    return op->emitOpError()
           << "(C3) input's last dimension (" << x.getShape().back()
           << ") must equal weight's input dimension (" << w.getDimSize(1)
           << ")";
  // linear C4
  SmallVector<int64_t> shape(x.getShape().drop_back());
  shape.push_back(w.getDimSize(0));
  if (failed(expectShape(op, "C4", "result", result, shape)))
    return failure();
  // linear C5
  if (failed(
          expectSameElementType(op, "C5", "input", input, "weight", weight)) ||
      failed(expectSameElementType(op, "C5", "input", input, "result", result)))
    return failure();
  return success();
}

LogicalResult LinearOp::verify() {
  return verifyLinear(*this, getInput(), getWeight(), getResult());
}

LogicalResult RmsNormOp::verify() {
  Operation *op = *this;
  // rms_norm C1
  if (!(getEps().convertToDouble() > 0))
    return emitOpError() << "(C1) eps is "
                         << formatDouble(getEps().convertToDouble())
                         << " but must be positive";
  // rms_norm C2
  int64_t last = tensorType(getInput()).getShape().empty()
                     ? -1
                     : tensorType(getInput()).getShape().back();
  if (failed(expectShape(op, "C2", "weight", getWeight(), {last})))
    return failure();
  // rms_norm C3
  if (failed(expectSameType(op, "C3", "result", getResult(), "input",
                            getInput())) ||
      failed(expectSameElementType(op, "C3", "weight", getWeight(), "input",
                                   getInput())))
    return failure();
  return success();
}

LogicalResult ReshapeOp::verify() {
  RankedTensorType in = tensorType(getInput()), out = tensorType(getResult());
  // reshape C1
  if (in.getNumElements() != out.getNumElements())
    return emitOpError() << "(C1) input has " << in.getNumElements()
                         << " elements but the result has "
                         << out.getNumElements();
  // reshape C2
  return expectSameElementType(*this, "C2", "input", getInput(), "result",
                               getResult());
}

LogicalResult RowSliceOp::verify() {
  RankedTensorType in = tensorType(getInput()), out = tensorType(getResult());
  // row_slice C1
  if (in.getRank() < 1 || in.getRank() != out.getRank())
    return emitOpError() << "(C1) input has rank " << in.getRank()
                         << " and the result rank " << out.getRank()
                         << ": both must have the same rank, at least 1";
  // row_slice C2
  for (int64_t d = 1; d < in.getRank(); ++d)
    if (in.getDimSize(d) != out.getDimSize(d))
      return emitOpError() << "(C2) dimension " << d << " is "
                           << in.getDimSize(d) << " in the input but "
                           << out.getDimSize(d) << " in the result";
  // row_slice C3
  int64_t offset = getOffset(), rows = out.getDimSize(0);
  if (offset < 0 || rows < 1 || offset + rows > in.getDimSize(0))
    return emitOpError() << "(C3) rows [" << offset << ", " << offset + rows
                         << ") are not inside the input's " << in.getDimSize(0)
                         << " rows";
  // row_slice C4
  return expectSameElementType(*this, "C4", "input", getInput(), "result",
                               getResult());
}

LogicalResult RopeOp::verify() {
  Operation *op = *this;
  // rope C1
  if (!(getTheta().convertToDouble() > 0))
    return emitOpError() << "(C1) theta is "
                         << formatDouble(getTheta().convertToDouble())
                         << " but must be positive";
  // rope C2
  if (failed(expectRank(op, "C2", "input", getInput(), 4)))
    return failure();
  auto x = tensorType(getInput()).getShape();
  // rope C3
  if (x[3] % 2 != 0)
    return emitOpError() << "(C3) head dimension (" << x[3] << ") must be even";
  // rope C4
  if (failed(expectShape(op, "C4", "positions", getPositions(), {x[0], x[1]})))
    return failure();
  // rope C5
  return expectSameType(op, "C5", "result", getResult(), "input", getInput());
}

/// The constraints block_attention and block_attention_grad share, checked
/// on the forward operands.
static LogicalResult
verifyAttentionOperands(Operation *op, Value query, Value contextKeys,
                        Value contextValues, Value draftKeys, Value draftValues,
                        Value anchors, Value keep, Value positionIds,
                        int64_t bs, IntegerAttr window) {
  // block_attention C1
  if (failed(expectAtLeast(op, "C1", "block_size", bs, 1)))
    return failure();
  // block_attention C2
  if (window && window.getInt() <= 0)
    return op->emitOpError()
           << "(C2) window is " << window.getInt() << " but must be positive";
  // block_attention C3
  if (failed(expectRank(op, "C3", "query", query, 4)) ||
      failed(expectRank(op, "C3", "context_keys", contextKeys, 4)) ||
      failed(expectRank(op, "C3", "anchors", anchors, 2)))
    return failure();
  auto q = tensorType(query).getShape();
  auto kc = tensorType(contextKeys).getShape();
  auto a = tensorType(anchors).getShape();
  int64_t B = q[0], Q = q[1], nh = q[2], d = q[3];
  int64_t S = kc[1], nkv = kc[2];
  // block_attention C4
  if (failed(
          expectShape(op, "C4", "context_keys", contextKeys, {B, S, nkv, d})) ||
      failed(expectSameType(op, "C4", "context_values", contextValues,
                            "context_keys", contextKeys)))
    return failure();
  // block_attention C5
  if (nkv <= 0 || nh % nkv != 0)
    return op->emitOpError()
           << "(C5) num_heads (" << nh
           << ") must be a multiple of num_kv_heads (" << nkv << ")";
  // block_attention C6
  if (failed(expectShape(op, "C6", "draft_keys", draftKeys, {B, Q, nkv, d})) ||
      failed(expectSameType(op, "C6", "draft_values", draftValues, "draft_keys",
                            draftKeys)))
    return failure();
  // block_attention C7
  if (failed(expectShape(op, "C7", "anchors", anchors, {B, a[1]})) ||
      failed(expectShape(op, "C7", "keep", keep, {B, a[1]})) ||
      failed(expectShape(op, "C7", "position_ids", positionIds, {B, S})))
    return failure();
  if (a[1] * bs != Q)
    return op->emitOpError()
           << "(C7) query length (" << Q << ") must equal anchors per row ("
           << a[1] << ") times block_size (" << bs << ")";
  // block_attention C8
  if (failed(expectSameElementType(op, "C8", "query", query, "context_keys",
                                   contextKeys)) ||
      failed(expectSameElementType(op, "C8", "query", query, "draft_keys",
                                   draftKeys)))
    return failure();
  return success();
}

LogicalResult BlockAttentionOp::verify() {
  Operation *op = *this;
  if (failed(verifyAttentionOperands(
          op, getQuery(), getContextKeys(), getContextValues(), getDraftKeys(),
          getDraftValues(), getAnchors(), getKeep(), getPositionIds(),
          getBlockSize(), getWindowAttr())))
    return failure();
  auto q = tensorType(getQuery()).getShape();
  // block_attention C9
  if (failed(expectSameType(op, "C9", "result", getResult(), "query",
                            getQuery())) ||
      failed(expectShape(op, "C9", "lse", getLse(), {q[0], q[1], q[2]})))
    return failure();
  return success();
}

LogicalResult ScaledRopeOp::verify() {
  Operation *op = *this;
  // scaled_rope C1
  for (auto [name, v] :
       {std::pair<StringRef, double>{"theta", getTheta().convertToDouble()},
        {"factor", getFactor().convertToDouble()},
        {"low_freq_factor", getLowFreqFactor().convertToDouble()},
        {"high_freq_factor", getHighFreqFactor().convertToDouble()}})
    if (!(v > 0))
      return emitOpError() << "(C1) " << name << " is " << formatDouble(v)
                           << " but must be positive";
  if (getOriginalMaxPositions() <= 0)
    return emitOpError() << "(C1) original_max_positions is "
                         << getOriginalMaxPositions()
                         << " but must be positive";
  // scaled_rope C2
  if (getHighFreqFactor().convertToDouble() <
      getLowFreqFactor().convertToDouble())
    return emitOpError() << "(C2) high_freq_factor must be at least "
                            "low_freq_factor";
  // scaled_rope C3-C5: as rope's C2-C5
  if (failed(expectRank(op, "C3", "input", getInput(), 4)))
    return failure();
  auto x = tensorType(getInput()).getShape();
  if (x[3] % 2 != 0)
    return emitOpError() << "(C4) head dimension (" << x[3] << ") must be even";
  if (failed(expectShape(op, "C5", "positions", getPositions(), {x[0], x[1]})))
    return failure();
  return expectSameType(op, "C5", "result", getResult(), "input", getInput());
}

LogicalResult CausalAttentionOp::verify() {
  Operation *op = *this;
  // causal_attention C1
  if (failed(expectRank(op, "C1", "query", getQuery(), 4)) ||
      failed(expectRank(op, "C1", "keys", getKeys(), 4)))
    return failure();
  auto q = tensorType(getQuery()).getShape();
  auto k = tensorType(getKeys()).getShape();
  // causal_attention C2
  if (k[0] != q[0] || k[1] != q[1] || k[3] != q[3])
    return emitOpError() << "(C2) keys " << shapeString(k)
                         << " must have the rows, positions and head "
                            "dimension of query "
                         << shapeString(q);
  if (failed(
          expectSameType(op, "C2", "values", getValues(), "keys", getKeys())))
    return failure();
  // causal_attention C3
  if (q[2] % k[2] != 0)
    return emitOpError() << "(C3) query heads (" << q[2]
                         << ") must be a multiple of key/value heads (" << k[2]
                         << ")";
  // causal_attention C4
  if (failed(expectShape(op, "C4", "position_ids", getPositionIds(),
                         {q[0], q[1]})))
    return failure();
  // causal_attention C5
  if (failed(
          expectSameType(op, "C5", "result", getResult(), "query", getQuery())))
    return failure();
  // causal_attention C6
  if (getWindowAttr().getInt() < 0)
    return emitOpError() << "(C6) window is " << getWindowAttr().getInt()
                         << " but must be 0 (none) or positive";
  // causal_attention C7
  if (getSinks() && failed(expectShape(op, "C7", "sinks", getSinks(), {q[2]})))
    return failure();
  return success();
}

LogicalResult BiasedLinearOp::verify() {
  // biased_linear C1-C5: linear's
  if (failed(verifyLinear(*this, getInput(), getWeight(), getResult())))
    return failure();
  // biased_linear C6
  int64_t N = tensorType(getWeight()).getDimSize(0);
  if (failed(expectShape(*this, "C6", "bias", getBias(), {N})))
    return failure();
  return expectSameElementType(*this, "C6", "bias", getBias(), "input",
                               getInput());
}

LogicalResult YarnRopeOp::verify() {
  Operation *op = *this;
  // yarn_rope C1
  for (auto [name, v] :
       {std::pair<StringRef, double>{"theta", getTheta().convertToDouble()},
        {"factor", getFactor().convertToDouble()},
        {"beta_fast", getBetaFast().convertToDouble()},
        {"beta_slow", getBetaSlow().convertToDouble()},
        {"attention_factor", getAttentionFactor().convertToDouble()}})
    if (!(v > 0))
      return emitOpError() << "(C1) " << name << " is " << formatDouble(v)
                           << " but must be positive";
  if (getOriginalMaxPositions() <= 0)
    return emitOpError() << "(C1) original_max_positions is "
                         << getOriginalMaxPositions()
                         << " but must be positive";
  // yarn_rope C2
  if (getBetaFast().convertToDouble() < getBetaSlow().convertToDouble())
    return emitOpError() << "(C2) beta_fast must be at least beta_slow";
  // yarn_rope C3-C5: as rope's C2-C5
  if (failed(expectRank(op, "C3", "input", getInput(), 4)))
    return failure();
  auto x = tensorType(getInput()).getShape();
  if (x[3] % 2 != 0)
    return emitOpError() << "(C4) head dimension (" << x[3] << ") must be even";
  if (failed(expectShape(op, "C5", "positions", getPositions(), {x[0], x[1]})))
    return failure();
  return expectSameType(op, "C5", "result", getResult(), "input", getInput());
}

LogicalResult ClampedSwigluOp::verify() {
  // clamped_swiglu C1
  if (failed(expectSameType(*this, "C1", "gate", getGate(), "up", getUp())) ||
      failed(expectSameType(*this, "C1", "result", getResult(), "gate",
                            getGate())))
    return failure();
  // clamped_swiglu C2
  if (!(getLimit().convertToDouble() > 0) ||
      !(getAlpha().convertToDouble() > 0))
    return emitOpError() << "(C2) alpha and limit must be positive";
  return success();
}

LogicalResult ConcatLastOp::verify() {
  // concat_last C1
  if (getInputs().empty())
    return emitOpError() << "(C1) needs at least one input";
  auto first = tensorType(getInputs().front());
  SmallVector<int64_t> shape(first.getShape());
  if (shape.empty())
    return emitOpError() << "(C1) inputs must have rank at least 1";
  int64_t last = 0;
  for (Value v : getInputs()) {
    auto t = tensorType(v);
    // concat_last C2
    if (t.getElementType() != first.getElementType() ||
        t.getRank() != first.getRank() ||
        t.getShape().drop_back() != first.getShape().drop_back())
      return emitOpError() << "(C2) every input must have the element type "
                              "and leading dimensions of the first, "
                           << shapeString(first.getShape());
    last += t.getShape().back();
  }
  shape.back() = last;
  // concat_last C3
  auto result = tensorType(getResult());
  if (result.getElementType() != first.getElementType())
    return emitOpError() << "(C3) result must have the inputs' element type";
  return expectShape(*this, "C3", "result", getResult(), shape);
}

LogicalResult SwigluOp::verify() {
  // swiglu C1
  if (failed(expectSameType(*this, "C1", "gate", getGate(), "up", getUp())) ||
      failed(expectSameType(*this, "C1", "result", getResult(), "gate",
                            getGate())))
    return failure();
  return success();
}

LogicalResult AddOp::verify() {
  // add C1
  if (failed(expectSameType(*this, "C1", "lhs", getLhs(), "rhs", getRhs())) ||
      failed(
          expectSameType(*this, "C1", "result", getResult(), "lhs", getLhs())))
    return failure();
  return success();
}

LogicalResult LmHeadCeOp::verify() {
  Operation *op = *this;
  // lm_head_ce C1
  if (failed(expectRank(op, "C1", "weight", getWeight(), 2)))
    return failure();
  RankedTensorType y = tensorType(getInput());
  if (y.getRank() < 2)
    return emitOpError() << "(C1) input must have rank 2 or more but has rank "
                         << y.getRank();
  // lm_head_ce C2
  int64_t H = y.getShape().back();
  if (tensorType(getWeight()).getDimSize(1) != H)
    return emitOpError() << "(C2) weight's hidden dimension ("
                         << tensorType(getWeight()).getDimSize(1)
                         << ") must equal the input's last dimension (" << H
                         << ")";
  if (failed(expectSameElementType(op, "C2", "input", getInput(), "weight",
                                   getWeight())))
    return failure();
  // lm_head_ce C3
  ArrayRef<int64_t> rows = y.getShape().drop_back();
  if (failed(expectShape(op, "C3", "labels", getLabels(), rows)) ||
      failed(expectShape(op, "C3", "weights", getWeights(), rows)) ||
      failed(expectShape(op, "C3", "hits", getHits(), rows)))
    return failure();
  // lm_head_ce C4
  return expectUnaryTransform(op, "C4", getMultiplier().convertToDouble(),
                              getSoftcap().convertToDouble());
}

LogicalResult DraftAcceptanceOp::verify() {
  Operation *op = *this;
  // draft_acceptance C1
  if (failed(expectAtLeast(op, "C1", "block_size", getBlockSize(), 1)))
    return failure();
  if (getBlockSize() > 64)
    return emitOpError() << "(C1) block_size is " << getBlockSize()
                         << " but must be at most 64";
  // draft_acceptance C2
  if (failed(expectRank(op, "C2", "keep", getKeep(), 2)))
    return failure();
  auto keep = tensorType(getKeep()).getShape();
  SmallVector<int64_t> slots = {keep[0], keep[1] * int64_t(getBlockSize())};
  if (failed(expectShape(op, "C2", "hits", getHits(), slots)) ||
      failed(expectShape(op, "C2", "weights", getWeights(), slots)))
    return failure();
  // draft_acceptance C3
  SmallVector<int64_t> positions = {int64_t(getBlockSize())};
  if (failed(expectShape(op, "C3", "position_hits", getPositionHits(),
                         positions)) ||
      failed(expectShape(op, "C3", "position_counts", getPositionCounts(),
                         positions)))
    return failure();
  // draft_acceptance C4
  if (failed(expectShape(op, "C4", "anchors", getAnchors(), keep)) ||
      failed(expectRank(op, "C4", "position_ids", getPositionIds(), 2)))
    return failure();
  int64_t S = tensorType(getPositionIds()).getDimSize(1);
  if (tensorType(getPositionIds()).getDimSize(0) != keep[0])
    return emitOpError() << "(C4) position_ids has "
                         << tensorType(getPositionIds()).getDimSize(0)
                         << " rows but keep has " << keep[0];
  // draft_acceptance C5
  ArrayRef<int64_t> edges = getBucketEdges();
  if (int64_t(edges.size()) > ::dflash::kMaxPositionBuckets - 1)
    return emitOpError() << "(C5) bucket_edges has " << edges.size()
                         << " edges but at most "
                         << ::dflash::kMaxPositionBuckets - 1
                         << " are supported";
  for (size_t i = 0; i < edges.size(); ++i)
    if (edges[i] < 1 || edges[i] >= S || (i > 0 && edges[i] <= edges[i - 1]))
      return emitOpError() << "(C5) bucket_edges must be strictly increasing "
                              "in [1, "
                           << S << ") but entry " << i << " is " << edges[i];
  // draft_acceptance C6
  SmallVector<int64_t> buckets = {int64_t(edges.size()) + 1};
  if (failed(expectShape(op, "C6", "bucket_runs", getBucketRuns(), buckets)) ||
      failed(
          expectShape(op, "C6", "bucket_blocks", getBucketBlocks(), buckets)) ||
      failed(expectShape(op, "C6", "bucket_hits", getBucketHits(), buckets)) ||
      failed(
          expectShape(op, "C6", "bucket_counts", getBucketCounts(), buckets)))
    return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// DFlash2 drafters
//===----------------------------------------------------------------------===//

/// grouped_conv's C1-C5 and C6's element types, which grouped_conv_grad
/// checks on the same forward operands.
static LogicalResult verifyGroupedConvOperands(Operation *op, Value input,
                                               Value delta, Value base,
                                               int64_t bs, int64_t kc,
                                               int64_t gs, int64_t half) {
  // grouped_conv C1
  if (failed(expectAtLeast(op, "C1", "block_size", bs, 1)) ||
      failed(expectAtLeast(op, "C1", "kernel_size", kc, 1)) ||
      failed(expectAtLeast(op, "C1", "group_size", gs, 1)))
    return failure();
  if (half != 0 && half != 1)
    return op->emitOpError() << "(C1) half is " << half
                             << " but must be 0 (before the sublayer) or 1 "
                                "(after it)";
  // grouped_conv C2
  if (failed(expectRank(op, "C2", "input", input, 3)))
    return failure();
  auto x = tensorType(input).getShape();
  int64_t B = x[0], Q = x[1], H = x[2];
  if (Q % bs != 0)
    return op->emitOpError()
           << "(C2) input's " << Q
           << " slots must be a multiple of block_size (" << bs << ")";
  // grouped_conv C3
  if (H % gs != 0)
    return op->emitOpError()
           << "(C3) hidden size " << H << " must be a multiple of group_size ("
           << gs << ")";
  // grouped_conv C4
  if (failed(expectShape(op, "C4", "delta", delta, {B, Q, 2 * kc * (H / gs)})))
    return failure();
  // grouped_conv C5
  auto w = tensorType(base).getShape();
  if (w != ArrayRef<int64_t>{kc, H} && w != ArrayRef<int64_t>{2, kc, H})
    return op->emitOpError()
           << "(C5) base must have shape " << shapeString({kc, H}) << " or "
           << shapeString({2, kc, H}) << " but has " << shapeString(w);
  // grouped_conv C6 (element types)
  if (failed(expectSameElementType(op, "C6", "input", input, "delta", delta)) ||
      failed(expectSameElementType(op, "C6", "input", input, "base", base)))
    return failure();
  return success();
}

LogicalResult GroupedConvOp::verify() {
  if (failed(verifyGroupedConvOperands(*this, getInput(), getDelta(), getBase(),
                                       getBlockSize(), getKernelSize(),
                                       getGroupSize(), getHalf())))
    return failure();
  // grouped_conv C6
  return expectSameType(*this, "C6", "result", getResult(), "input",
                        getInput());
}

/// selector_candidates' C1-C4, which selector_candidates_grad checks too.
/// `rows` gets the input's shape without its last dimension.
static LogicalResult verifyCandidatesOperands(Operation *op, Value input,
                                              Value weight, Value labels,
                                              Value weights, int64_t topK,
                                              double multiplier, double softcap,
                                              SmallVectorImpl<int64_t> &rows) {
  // selector_candidates C1
  if (failed(expectAtLeast(op, "C1", "top_k", topK, 1)) ||
      failed(expectUnaryTransform(op, "C1", multiplier, softcap)))
    return failure();
  // selector_candidates C2
  if (failed(expectRank(op, "C2", "weight", weight, 2)))
    return failure();
  RankedTensorType y = tensorType(input);
  if (y.getRank() < 2)
    return op->emitOpError()
           << "(C2) input must have rank 2 or more but has rank "
           << y.getRank();
  auto w = tensorType(weight).getShape();
  if (w[1] != y.getShape().back())
    return op->emitOpError() << "(C2) weight's hidden dimension (" << w[1]
                             << ") must equal the input's last dimension ("
                             << y.getShape().back() << ")";
  if (failed(expectSameElementType(op, "C2", "input", input, "weight", weight)))
    return failure();
  // selector_candidates C3
  if (topK > w[0])
    return op->emitOpError()
           << "(C3) top_k is " << topK
           << " but must be at most the vocabulary (" << w[0] << ")";
  // selector_candidates C4
  rows.assign(y.getShape().begin(), y.getShape().end() - 1);
  if (failed(expectShape(op, "C4", "labels", labels, rows)) ||
      failed(expectShape(op, "C4", "weights", weights, rows)))
    return failure();
  return success();
}

LogicalResult SelectorCandidatesOp::verify() {
  Operation *op = *this;
  SmallVector<int64_t> rows;
  if (failed(verifyCandidatesOperands(op, getInput(), getWeight(), getLabels(),
                                      getWeights(), getTopK(),
                                      getMultiplier().convertToDouble(),
                                      getSoftcap().convertToDouble(), rows)))
    return failure();
  // selector_candidates C5
  SmallVector<int64_t> perCandidate(rows);
  perCandidate.push_back(getTopK());
  if (failed(expectShape(op, "C5", "values", getValues(), perCandidate)) ||
      failed(
          expectShape(op, "C5", "candidates", getCandidates(), perCandidate)) ||
      failed(expectShape(op, "C5", "label_values", getLabelValues(), rows)))
    return failure();
  return success();
}

/// selector_loss' C1-C4, which selector_loss_grad checks too. `rows` gets
/// the values' shape without its last dimension.
static LogicalResult verifySelectorOperands(
    Operation *op, StringRef gold, Value values, Value candidates,
    Value labelValues, Value input, Value projection, Value predecessors,
    Value labels, Value weights, Value predecessorCodebook,
    Value successorCodebook, SmallVectorImpl<int64_t> &rows) {
  // selector_loss C1
  if (gold != "topk" && gold != "inject")
    return op->emitOpError() << "(C1) gold is \"" << gold
                             << "\" but must be \"topk\" or \"inject\"";
  // selector_loss C2
  RankedTensorType v = tensorType(values);
  if (v.getRank() < 2)
    return op->emitOpError()
           << "(C2) values must have rank 2 or more but has rank "
           << v.getRank();
  rows.assign(v.getShape().begin(), v.getShape().end() - 1);
  const int64_t K = v.getShape().back();
  if (failed(expectShape(op, "C2", "candidates", candidates, v.getShape())) ||
      failed(expectShape(op, "C2", "label_values", labelValues, rows)) ||
      failed(expectShape(op, "C2", "predecessors", predecessors, rows)) ||
      failed(expectShape(op, "C2", "labels", labels, rows)) ||
      failed(expectShape(op, "C2", "weights", weights, rows)))
    return failure();
  // selector_loss C3
  if (failed(expectRank(op, "C3", "input", input, v.getRank())) ||
      failed(expectRank(op, "C3", "projection", projection, 2)))
    return failure();
  const int64_t H = tensorType(input).getShape().back();
  const int64_t r = tensorType(projection).getDimSize(0);
  SmallVector<int64_t> inputShape(rows.begin(), rows.end());
  inputShape.push_back(H);
  if (failed(expectShape(op, "C3", "input", input, inputShape)) ||
      failed(expectShape(op, "C3", "projection", projection, {r, H})) ||
      failed(expectSameElementType(op, "C3", "input", input, "projection",
                                   projection)))
    return failure();
  // selector_loss C4
  if (failed(
          expectRank(op, "C4", "predecessor_codebook", predecessorCodebook, 2)))
    return failure();
  const int64_t V = tensorType(predecessorCodebook).getDimSize(0);
  if (failed(expectShape(op, "C4", "predecessor_codebook", predecessorCodebook,
                         {V, r})) ||
      failed(expectSameType(op, "C4", "successor_codebook", successorCodebook,
                            "predecessor_codebook", predecessorCodebook)) ||
      failed(expectSameElementType(op, "C4", "predecessor_codebook",
                                   predecessorCodebook, "input", input)))
    return failure();
  if (K > V)
    return op->emitOpError() << "(C4) " << K
                             << " candidates per row but the codebooks hold "
                                "a vocabulary of "
                             << V;
  return success();
}

LogicalResult SelectorLossOp::verify() {
  SmallVector<int64_t> rows;
  if (failed(verifySelectorOperands(
          *this, getGold(), getValues(), getCandidates(), getLabelValues(),
          getInput(), getProjection(), getPredecessors(), getLabels(),
          getWeights(), getPredecessorCodebook(), getSuccessorCodebook(),
          rows)))
    return failure();
  // selector_loss C5
  return expectShape(*this, "C5", "hits", getHits(), rows);
}

LogicalResult DraftPredecessorsOp::verify() {
  Operation *op = *this;
  // draft_predecessors C1
  if (failed(expectAtLeast(op, "C1", "block_size", getBlockSize(), 1)))
    return failure();
  // draft_predecessors C2-C4
  return verifyDraftSlotTokens(op, getInputIds(), getAnchors(), getKeep(),
                               getResult(), int64_t(getBlockSize()));
}

LogicalResult SelectorAlphaOp::verify() {
  // selector_alpha C1
  double alpha = getAlpha().convertToDouble();
  double warm = getWarmupRatio().convertToDouble();
  double ramp = getRampRatio().convertToDouble();
  if (!(alpha >= 0))
    return emitOpError() << "(C1) alpha is " << formatDouble(alpha)
                         << " but must be zero or positive";
  // selector_alpha C2
  if (!(warm >= 0 && warm < 1) || !(ramp >= 0 && warm + ramp <= 1))
    return emitOpError() << "(C2) warmup_ratio " << formatDouble(warm)
                         << " and ramp_ratio " << formatDouble(ramp)
                         << " must lie in [0, 1) and [0, 1] with a sum of at "
                            "most 1";
  return success();
}

LogicalResult SelectorObjectiveOp::verify() { return success(); }

//===----------------------------------------------------------------------===//
// Gradient ops
//===----------------------------------------------------------------------===//

LogicalResult LinearGradInputOp::verify() {
  Operation *op = *this;
  RankedTensorType dy = tensorType(getGrad());
  // linear_grad_input C1
  if (dy.getRank() < 2)
    return emitOpError() << "(C1) grad must have rank 2 or more but has rank "
                         << dy.getRank();
  if (failed(expectRank(op, "C1", "weight", getWeight(), 2)))
    return failure();
  RankedTensorType w = tensorType(getWeight());
  // linear_grad_input C2
  if (dy.getShape().back() != w.getDimSize(0))
    return emitOpError() << "(C2) grad's last dimension ("
                         << dy.getShape().back()
                         << ") must equal weight's output dimension ("
                         << w.getDimSize(0) << ")";
  // linear_grad_input C3
  SmallVector<int64_t> shape(dy.getShape().drop_back());
  shape.push_back(w.getDimSize(1));
  if (failed(expectShape(op, "C3", "result", getResult(), shape)))
    return failure();
  // linear_grad_input C4
  if (failed(expectSameElementType(op, "C4", "grad", getGrad(), "weight",
                                   getWeight())) ||
      failed(expectSameElementType(op, "C4", "grad", getGrad(), "result",
                                   getResult())))
    return failure();
  return success();
}

LogicalResult LinearGradWeightOp::verify() {
  Operation *op = *this;
  RankedTensorType dy = tensorType(getGrad()), x = tensorType(getInput());
  // linear_grad_weight C1
  if (dy.getRank() < 2 || dy.getRank() != x.getRank() ||
      dy.getShape().drop_back() != x.getShape().drop_back())
    return emitOpError() << "(C1) grad " << shapeString(dy.getShape())
                         << " and input " << shapeString(x.getShape())
                         << " must have rank 2 or more and the same leading "
                            "dimensions";
  // linear_grad_weight C2
  if (failed(expectShape(op, "C2", "result", getResult(),
                         {dy.getShape().back(), x.getShape().back()})))
    return failure();
  // linear_grad_weight C3
  if (failed(expectSameElementType(op, "C3", "grad", getGrad(), "input",
                                   getInput())) ||
      failed(expectSameElementType(op, "C3", "grad", getGrad(), "result",
                                   getResult())))
    return failure();
  return success();
}

LogicalResult RmsNormGradOp::verify() {
  Operation *op = *this;
  // rms_norm_grad C1
  if (!(getEps().convertToDouble() > 0))
    return emitOpError() << "(C1) eps is "
                         << formatDouble(getEps().convertToDouble())
                         << " but must be positive";
  // rms_norm_grad C2
  auto x = tensorType(getInput()).getShape();
  if (failed(
          expectSameType(op, "C2", "grad", getGrad(), "input", getInput())) ||
      failed(expectShape(op, "C2", "weight", getWeight(),
                         {x.empty() ? -1 : x.back()})))
    return failure();
  // rms_norm_grad C3
  if (failed(expectSameType(op, "C3", "input_grad", getInputGrad(), "input",
                            getInput())) ||
      failed(expectSameType(op, "C3", "weight_grad", getWeightGrad(), "weight",
                            getWeight())))
    return failure();
  return success();
}

LogicalResult RopeGradOp::verify() {
  Operation *op = *this;
  // rope_grad C1
  if (!(getTheta().convertToDouble() > 0))
    return emitOpError() << "(C1) theta is "
                         << formatDouble(getTheta().convertToDouble())
                         << " but must be positive";
  // rope_grad C2
  if (failed(expectRank(op, "C2", "grad", getGrad(), 4)))
    return failure();
  auto x = tensorType(getGrad()).getShape();
  // rope_grad C3
  if (x[3] % 2 != 0)
    return emitOpError() << "(C3) head dimension (" << x[3] << ") must be even";
  // rope_grad C4
  if (failed(expectShape(op, "C4", "positions", getPositions(), {x[0], x[1]})))
    return failure();
  // rope_grad C5
  return expectSameType(op, "C5", "result", getResult(), "grad", getGrad());
}

LogicalResult BlockAttentionGradOp::verify() {
  Operation *op = *this;
  // block_attention_grad C1-C8: those of block_attention.
  if (failed(verifyAttentionOperands(
          op, getQuery(), getContextKeys(), getContextValues(), getDraftKeys(),
          getDraftValues(), getAnchors(), getKeep(), getPositionIds(),
          getBlockSize(), getWindowAttr())))
    return failure();
  auto q = tensorType(getQuery()).getShape();
  // block_attention_grad C9
  if (failed(
          expectSameType(op, "C9", "grad", getGrad(), "query", getQuery())) ||
      failed(expectSameType(op, "C9", "output", getOutput(), "query",
                            getQuery())) ||
      failed(expectShape(op, "C9", "lse", getLse(), {q[0], q[1], q[2]})))
    return failure();
  // block_attention_grad C10
  if (failed(expectSameType(op, "C10", "query_grad", getQueryGrad(), "query",
                            getQuery())) ||
      failed(expectSameType(op, "C10", "context_keys_grad",
                            getContextKeysGrad(), "context_keys",
                            getContextKeys())) ||
      failed(expectSameType(op, "C10", "context_values_grad",
                            getContextValuesGrad(), "context_values",
                            getContextValues())) ||
      failed(expectSameType(op, "C10", "draft_keys_grad", getDraftKeysGrad(),
                            "draft_keys", getDraftKeys())) ||
      failed(expectSameType(op, "C10", "draft_values_grad",
                            getDraftValuesGrad(), "draft_values",
                            getDraftValues())))
    return failure();
  return success();
}

LogicalResult SwigluGradOp::verify() {
  Operation *op = *this;
  // swiglu_grad C1
  for (auto [name, v] : {std::pair<StringRef, Value>{"gate", getGate()},
                         {"up", getUp()},
                         {"gate_grad", getGateGrad()},
                         {"up_grad", getUpGrad()}})
    if (failed(expectSameType(op, "C1", name, v, "grad", getGrad())))
      return failure();
  return success();
}

LogicalResult LmHeadCeGradOp::verify() {
  Operation *op = *this;
  // lm_head_ce_grad C1
  if (failed(expectRank(op, "C1", "weight", getWeight(), 2)))
    return failure();
  RankedTensorType y = tensorType(getInput());
  if (y.getRank() < 2)
    return emitOpError() << "(C1) input must have rank 2 or more but has rank "
                         << y.getRank();
  // lm_head_ce_grad C2
  if (tensorType(getWeight()).getDimSize(1) != y.getShape().back())
    return emitOpError() << "(C2) weight's hidden dimension ("
                         << tensorType(getWeight()).getDimSize(1)
                         << ") must equal the input's last dimension ("
                         << y.getShape().back() << ")";
  // lm_head_ce_grad C3
  ArrayRef<int64_t> rows = y.getShape().drop_back();
  if (failed(expectShape(op, "C3", "labels", getLabels(), rows)) ||
      failed(expectShape(op, "C3", "weights", getWeights(), rows)))
    return failure();
  // lm_head_ce_grad C4
  if (failed(
          expectSameType(op, "C4", "result", getResult(), "input", getInput())))
    return failure();
  // lm_head_ce_grad C5
  return expectUnaryTransform(op, "C5", getMultiplier().convertToDouble(),
                              getSoftcap().convertToDouble());
}

LogicalResult GroupedConvGradOp::verify() {
  Operation *op = *this;
  // grouped_conv_grad C1-C6: those of grouped_conv, grad in the result's
  // place.
  if (failed(verifyGroupedConvOperands(op, getInput(), getDelta(), getBase(),
                                       getBlockSize(), getKernelSize(),
                                       getGroupSize(), getHalf())) ||
      failed(expectSameType(op, "C6", "grad", getGrad(), "input", getInput())))
    return failure();
  // grouped_conv_grad C7
  if (failed(expectSameType(op, "C7", "input_grad", getInputGrad(), "input",
                            getInput())) ||
      failed(expectSameType(op, "C7", "delta_grad", getDeltaGrad(), "delta",
                            getDelta())) ||
      failed(expectSameType(op, "C7", "base_grad", getBaseGrad(), "base",
                            getBase())))
    return failure();
  return success();
}

LogicalResult SelectorCandidatesGradOp::verify() {
  Operation *op = *this;
  // selector_candidates_grad C1-C4: those of selector_candidates.
  SmallVector<int64_t> rows;
  if (failed(verifyCandidatesOperands(op, getInput(), getWeight(), getLabels(),
                                      getWeights(), getTopK(),
                                      getMultiplier().convertToDouble(),
                                      getSoftcap().convertToDouble(), rows)))
    return failure();
  // selector_candidates_grad C5
  SmallVector<int64_t> perCandidate(rows);
  perCandidate.push_back(getTopK());
  if (failed(
          expectShape(op, "C5", "candidates", getCandidates(), perCandidate)))
    return failure();
  if (!getValuesGrad() && !getLabelValuesGrad())
    return emitOpError() << "(C5) needs values_grad, label_values_grad or both";
  if ((getValuesGrad() && failed(expectShape(op, "C5", "values_grad",
                                             getValuesGrad(), perCandidate))) ||
      (getLabelValuesGrad() && failed(expectShape(op, "C5", "label_values_grad",
                                                  getLabelValuesGrad(), rows))))
    return failure();
  // selector_candidates_grad C6
  return expectSameType(op, "C6", "result", getResult(), "input", getInput());
}

LogicalResult SelectorLossGradOp::verify() {
  Operation *op = *this;
  // selector_loss_grad C1-C4: those of selector_loss.
  SmallVector<int64_t> rows;
  if (failed(verifySelectorOperands(
          op, getGold(), getValues(), getCandidates(), getLabelValues(),
          getInput(), getProjection(), getPredecessors(), getLabels(),
          getWeights(), getPredecessorCodebook(), getSuccessorCodebook(),
          rows)))
    return failure();
  // selector_loss_grad C5
  if (failed(expectSameType(op, "C5", "values_grad", getValuesGrad(), "values",
                            getValues())) ||
      failed(expectSameType(op, "C5", "label_values_grad", getLabelValuesGrad(),
                            "label_values", getLabelValues())))
    return failure();
  // selector_loss_grad C6
  SmallVector<int64_t> projected(rows);
  projected.push_back(tensorType(getProjection()).getDimSize(0));
  if (failed(expectShape(op, "C6", "projected_grad", getProjectedGrad(),
                         projected)) ||
      failed(expectSameElementType(op, "C6", "projected_grad",
                                   getProjectedGrad(), "input", getInput())) ||
      failed(expectSameType(
          op, "C6", "predecessor_codebook_grad", getPredecessorCodebookGrad(),
          "predecessor_codebook", getPredecessorCodebook())) ||
      failed(expectSameType(op, "C6", "successor_codebook_grad",
                            getSuccessorCodebookGrad(), "successor_codebook",
                            getSuccessorCodebook())))
    return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// Optimizer ops
//===----------------------------------------------------------------------===//

LogicalResult AllReduceOp::verify() {
  // all_reduce C1
  if (getInputs().size() != getResults().size())
    return emitOpError() << "(C1) has " << getInputs().size()
                         << " operands but " << getResults().size()
                         << " results";
  for (auto [in, out] : llvm::zip(getInputs(), getResults()))
    if (in.getType() != out.getType())
      return emitOpError() << "(C1) result type " << out.getType()
                           << " must equal its operand's type " << in.getType();
  return success();
}

LogicalResult LossStatsOp::verify() { return success(); }

LogicalResult SelectorObjectiveGradOp::verify() { return success(); }

LogicalResult ConvertOp::verify() {
  // convert C1
  if (tensorType(getInput()).getShape() != tensorType(getResult()).getShape())
    return emitOpError() << "(C1) input "
                         << shapeString(tensorType(getInput()).getShape())
                         << " and result "
                         << shapeString(tensorType(getResult()).getShape())
                         << " must have the same shape";
  return success();
}

LogicalResult GlobalNormOp::verify() {
  // global_norm C1
  if (getInputs().empty())
    return emitOpError() << "(C1) needs at least one operand";
  return success();
}

LogicalResult ClipCoefficientOp::verify() {
  // clip_coefficient C1
  if (!(getMaxNorm().convertToDouble() > 0))
    return emitOpError() << "(C1) max_norm is "
                         << formatDouble(getMaxNorm().convertToDouble())
                         << " but must be positive";
  return success();
}

LogicalResult LrScheduleOp::verify() {
  // lr_schedule C1
  if (!(getLr().convertToDouble() > 0))
    return emitOpError() << "(C1) lr is "
                         << formatDouble(getLr().convertToDouble())
                         << " but must be positive";
  // lr_schedule C2
  double w = getWarmupRatio().convertToDouble();
  if (!(w >= 0 && w < 1))
    return emitOpError() << "(C2) warmup_ratio is " << formatDouble(w)
                         << " but must be in [0, 1)";
  return success();
}

LogicalResult AdamWOp::verify() {
  Operation *op = *this;
  // adamw C1
  for (auto [name, v] : {std::pair<StringRef, Value>{"grad", getGrad()},
                         {"moment1", getMoment1()},
                         {"moment2", getMoment2()},
                         {"new_master", getNewMaster()},
                         {"new_moment1", getNewMoment1()},
                         {"new_moment2", getNewMoment2()}})
    if (failed(expectSameType(op, "C1", name, v, "master", getMaster())))
      return failure();
  // adamw C2
  if (failed(expectShape(op, "C2", "new_parameter", getNewParameter(),
                         tensorType(getMaster()).getShape())))
    return failure();
  // adamw C3
  double b1 = getBeta1().convertToDouble(), b2 = getBeta2().convertToDouble();
  if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1))
    return emitOpError() << "(C3) beta1 (" << formatDouble(b1)
                         << ") and beta2 (" << formatDouble(b2)
                         << ") must be in [0, 1)";
  if (!(getEps().convertToDouble() > 0) ||
      !(getWeightDecay().convertToDouble() >= 0))
    return emitOpError() << "(C3) eps must be positive and weight_decay "
                            "zero or positive";
  return success();
}
