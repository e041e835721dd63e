//===- DFlashOps.cpp - dflash op verifiers --------------------------------===//
//
// Each verifier checks the numbered constraints of its op in docs/dialect.md;
// the comment before each check names the constraint, and every message
// starts with it so that the negative tests can pin it.
//
//===----------------------------------------------------------------------===//

#include "dialect/DFlashOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/Format.h"

using namespace mlir;
using namespace mlir::dflash;

#define GET_OP_CLASSES
#include "dialect/DFlashOps.cpp.inc"

namespace {

std::string shapeString(ArrayRef<int64_t> shape) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "[";
  llvm::interleave(shape, os, "x");
  os << "]";
  return s;
}

/// A double as "%g" writes it ("-1", "1e-06"), for messages.
std::string formatDouble(double v) {
  std::string s;
  llvm::raw_string_ostream(s) << llvm::format("%g", v);
  return s;
}

RankedTensorType tensorType(Value v) {
  return cast<RankedTensorType>(v.getType());
}

/// Emits "(Cn) <what> must have shape [..] but has [..]" unless `v` has
/// exactly `shape`.
LogicalResult expectShape(Operation *op, StringRef c, StringRef what, Value v,
                          ArrayRef<int64_t> shape) {
  ArrayRef<int64_t> actual = tensorType(v).getShape();
  if (actual == shape)
    return success();
  return op->emitOpError() << "(" << c << ") " << what << " must have shape "
                           << shapeString(shape) << " but has "
                           << shapeString(actual);
}

LogicalResult expectRank(Operation *op, StringRef c, StringRef what, Value v,
                         int64_t rank) {
  int64_t actual = tensorType(v).getRank();
  if (actual == rank)
    return success();
  return op->emitOpError() << "(" << c << ") " << what << " must have rank "
                           << rank << " but has rank " << actual;
}

LogicalResult expectSameType(Operation *op, StringRef c, StringRef what,
                             Value a, StringRef whatB, Value b) {
  if (a.getType() == b.getType())
    return success();
  return op->emitOpError() << "(" << c << ") " << what << " (" << a.getType()
                           << ") and " << whatB << " (" << b.getType()
                           << ") must have the same type";
}

LogicalResult expectSameElementType(Operation *op, StringRef c, StringRef what,
                                    Value a, StringRef whatB, Value b) {
  if (tensorType(a).getElementType() == tensorType(b).getElementType())
    return success();
  return op->emitOpError() << "(" << c << ") " << what << " and " << whatB
                           << " must have the same element type";
}

LogicalResult expectAtLeast(Operation *op, StringRef c, StringRef what,
                            int64_t value, int64_t min) {
  if (value >= min)
    return success();
  return op->emitOpError() << "(" << c << ") " << what << " is " << value
                           << " but must be at least " << min;
}

} // namespace

//===----------------------------------------------------------------------===//
// Draft-block bookkeeping
//===----------------------------------------------------------------------===//

LogicalResult SequencePositionsOp::verify() {
  // sequence_positions C1
  return expectRank(*this, "C1", "result", getResult(), 2);
}

LogicalResult DraftPositionsOp::verify() {
  Operation *op = *this;
  // draft_positions C1
  if (failed(expectAtLeast(op, "C1", "block_size", getBlockSize(), 1)))
    return failure();
  // draft_positions C2
  if (failed(expectRank(op, "C2", "anchors", getAnchors(), 2)))
    return failure();
  auto a = tensorType(getAnchors()).getShape();
  // draft_positions C3
  return expectShape(op, "C3", "result", getResult(),
                     {a[0], a[1] * int64_t(getBlockSize())});
}

LogicalResult DraftTokensOp::verify() {
  Operation *op = *this;
  // draft_tokens C1
  if (failed(expectAtLeast(op, "C1", "block_size", getBlockSize(), 1)) ||
      failed(expectAtLeast(op, "C1", "mask_token_id", getMaskTokenId(), 0)))
    return failure();
  // draft_tokens C2
  if (failed(expectRank(op, "C2", "input_ids", getInputIds(), 2)) ||
      failed(expectRank(op, "C2", "anchors", getAnchors(), 2)))
    return failure();
  auto ids = tensorType(getInputIds()).getShape();
  auto a = tensorType(getAnchors()).getShape();
  // draft_tokens C3
  if (failed(expectShape(op, "C3", "anchors", getAnchors(), {ids[0], a[1]})) ||
      failed(expectShape(op, "C3", "keep", getKeep(), {ids[0], a[1]})))
    return failure();
  // draft_tokens C4
  return expectShape(op, "C4", "result", getResult(),
                     {ids[0], a[1] * int64_t(getBlockSize())});
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
  return expectSameElementType(op, "C3", "result", getResult(), "table",
                               getTable());
}

LogicalResult LinearOp::verify() {
  Operation *op = *this;
  RankedTensorType x = tensorType(getInput());
  // linear C1
  if (x.getRank() < 2)
    return emitOpError() << "(C1) input must have rank 2 or more but has rank "
                         << x.getRank();
  // linear C2
  if (failed(expectRank(op, "C2", "weight", getWeight(), 2)))
    return failure();
  RankedTensorType w = tensorType(getWeight());
  // linear C3
  if (x.getShape().back() != w.getDimSize(1))
    return emitOpError() << "(C3) input's last dimension ("
                         << x.getShape().back()
                         << ") must equal weight's input dimension ("
                         << w.getDimSize(1) << ")";
  // linear C4
  SmallVector<int64_t> shape(x.getShape().drop_back());
  shape.push_back(w.getDimSize(0));
  if (failed(expectShape(op, "C4", "result", getResult(), shape)))
    return failure();
  // linear C5
  if (failed(expectSameElementType(op, "C5", "input", getInput(), "weight",
                                   getWeight())) ||
      failed(expectSameElementType(op, "C5", "input", getInput(), "result",
                                   getResult())))
    return failure();
  return success();
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

LogicalResult BlockAttentionOp::verify() {
  Operation *op = *this;
  int64_t bs = getBlockSize();
  // block_attention C1
  if (failed(expectAtLeast(op, "C1", "block_size", bs, 1)))
    return failure();
  // block_attention C2
  if (IntegerAttr w = getWindowAttr(); w && w.getInt() <= 0)
    return emitOpError() << "(C2) window is " << w.getInt()
                         << " but must be positive";
  // block_attention C3
  if (failed(expectRank(op, "C3", "query", getQuery(), 4)) ||
      failed(expectRank(op, "C3", "context_keys", getContextKeys(), 4)) ||
      failed(expectRank(op, "C3", "anchors", getAnchors(), 2)))
    return failure();
  auto q = tensorType(getQuery()).getShape();
  auto kc = tensorType(getContextKeys()).getShape();
  auto a = tensorType(getAnchors()).getShape();
  int64_t B = q[0], Q = q[1], nh = q[2], d = q[3];
  int64_t S = kc[1], nkv = kc[2];
  // block_attention C4
  if (failed(expectShape(op, "C4", "context_keys", getContextKeys(),
                         {B, S, nkv, d})) ||
      failed(expectSameType(op, "C4", "context_values", getContextValues(),
                            "context_keys", getContextKeys())))
    return failure();
  // block_attention C5
  if (nkv <= 0 || nh % nkv != 0)
    return emitOpError() << "(C5) num_heads (" << nh
                         << ") must be a multiple of num_kv_heads (" << nkv
                         << ")";
  // block_attention C6
  if (failed(expectShape(op, "C6", "draft_keys", getDraftKeys(),
                         {B, Q, nkv, d})) ||
      failed(expectSameType(op, "C6", "draft_values", getDraftValues(),
                            "draft_keys", getDraftKeys())))
    return failure();
  // block_attention C7
  if (failed(expectShape(op, "C7", "anchors", getAnchors(), {B, a[1]})) ||
      failed(expectShape(op, "C7", "keep", getKeep(), {B, a[1]})))
    return failure();
  if (a[1] * bs != Q)
    return emitOpError() << "(C7) query length (" << Q
                         << ") must equal anchors per row (" << a[1]
                         << ") times block_size (" << bs << ")";
  // block_attention C8
  if (failed(expectSameElementType(op, "C8", "query", getQuery(),
                                   "context_keys", getContextKeys())) ||
      failed(expectSameElementType(op, "C8", "query", getQuery(), "draft_keys",
                                   getDraftKeys())))
    return failure();
  // block_attention C9
  if (failed(expectSameType(op, "C9", "result", getResult(), "query",
                            getQuery())) ||
      failed(expectShape(op, "C9", "lse", getLse(), {B, Q, nh})))
    return failure();
  return success();
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
      failed(expectShape(op, "C3", "weights", getWeights(), rows)))
    return failure();
  return success();
}
