//===- DFlashHybridOps.cpp - Verifiers and FLOPs of the hybrid ops --------===//
//
// The numbered constraints of docs/dialect.md's Gated DeltaNet section;
// each message starts with its constraint.
//
//===----------------------------------------------------------------------===//

#include "dialect/DFlashOps.h"
#include "dialect/VerifyHelpers.h"

using namespace mlir;
using namespace mlir::dflash;
using namespace mlir::dflash::verify;

namespace {
int64_t numElements(Value v) { return tensorType(v).getNumElements(); }

/// (Cn) position_ids is [B, S] of `x` [B, S, ...].
LogicalResult expectPositions(Operation *op, StringRef c, Value positions,
                              Value x) {
  auto s = tensorType(x).getShape();
  return expectShape(op, c, "position_ids", positions, {s[0], s[1]});
}
} // namespace

LogicalResult CausalConvOp::verify() {
  Operation *op = *this;
  // causal_conv C1
  if (failed(expectRank(op, "C1", "input", getInput(), 3)) ||
      failed(expectRank(op, "C1", "weight", getWeight(), 2)))
    return failure();
  // causal_conv C2
  int64_t C = tensorType(getInput()).getDimSize(2);
  if (tensorType(getWeight()).getDimSize(0) != C)
    return emitOpError() << "(C2) weight has "
                         << tensorType(getWeight()).getDimSize(0)
                         << " channels but input has " << C;
  // causal_conv C3
  if (failed(expectPositions(op, "C3", getPositionIds(), getInput())) ||
      failed(
          expectSameType(op, "C3", "result", getResult(), "input", getInput())))
    return failure();
  return success();
}

LogicalResult GatedDeltaRuleOp::verify() {
  Operation *op = *this;
  // gated_delta_rule C1
  if (failed(expectRank(op, "C1", "query", getQuery(), 4)) ||
      failed(expectSameType(op, "C1", "key", getKey(), "query", getQuery())) ||
      failed(expectRank(op, "C1", "value", getValue(), 4)))
    return failure();
  auto q = tensorType(getQuery()).getShape();
  auto v = tensorType(getValue()).getShape();
  const int64_t B = q[0], S = q[1], Hk = q[2], Hv = v[2];
  // gated_delta_rule C2
  if (v[0] != B || v[1] != S)
    return emitOpError() << "(C2) value is " << shapeString(v)
                         << " but query is " << shapeString(q)
                         << ": they must share [B, S]";
  if (Hv % Hk != 0)
    return emitOpError() << "(C2) value has " << Hv
                         << " heads, not a multiple of the query's " << Hk;
  // gated_delta_rule C3
  if (failed(expectShape(op, "C3", "a", getA(), {B, S, Hv})) ||
      failed(expectShape(op, "C3", "b", getB(), {B, S, Hv})) ||
      failed(expectShape(op, "C3", "a_log", getALog(), {Hv})) ||
      failed(expectShape(op, "C3", "dt_bias", getDtBias(), {Hv})) ||
      failed(expectPositions(op, "C3", getPositionIds(), getQuery())))
    return failure();
  // gated_delta_rule C4
  return expectSameType(op, "C4", "result", getResult(), "value", getValue());
}

LogicalResult GatedRmsNormOp::verify() {
  Operation *op = *this;
  // gated_rms_norm C1
  if (failed(
          expectSameType(op, "C1", "gate", getGate(), "input", getInput())) ||
      failed(
          expectSameType(op, "C1", "result", getResult(), "input", getInput())))
    return failure();
  // gated_rms_norm C2
  auto x = tensorType(getInput());
  if (failed(
          expectShape(op, "C2", "weight", getWeight(), {x.getShape().back()})))
    return failure();
  // gated_rms_norm C3
  if (!(getEps().convertToDouble() > 0))
    return emitOpError() << "(C3) eps must be positive";
  return success();
}

LogicalResult ZeroCentredRmsNormOp::verify() {
  Operation *op = *this;
  // zero_centred_rms_norm C1
  if (failed(expectSameType(op, "C1", "result", getResult(), "input",
                            getInput())) ||
      failed(expectShape(op, "C1", "weight", getWeight(),
                         {tensorType(getInput()).getShape().back()})))
    return failure();
  // zero_centred_rms_norm C2
  if (!(getEps().convertToDouble() > 0))
    return emitOpError() << "(C2) eps must be positive";
  return success();
}

LogicalResult PartialRopeOp::verify() {
  Operation *op = *this;
  // partial_rope C1
  if (failed(expectRank(op, "C1", "input", getInput(), 4)) ||
      failed(expectPositions(op, "C1", getPositions(), getInput())) ||
      failed(
          expectSameType(op, "C1", "result", getResult(), "input", getInput())))
    return failure();
  // partial_rope C2
  int64_t d = tensorType(getInput()).getDimSize(3), r = getRotaryDim();
  if (r < 2 || r > d || r % 2 != 0)
    return emitOpError() << "(C2) rotary_dim is " << r
                         << " but must be even and in [2, " << d
                         << "] (the head dimension)";
  return success();
}

LogicalResult SplitLastOp::verify() {
  Operation *op = *this;
  auto x = tensorType(getInput());
  ArrayRef<int64_t> sizes = getSizes();
  // split_last C1
  if (x.getRank() < 1 || sizes.empty() || sizes.size() != getParts().size())
    return emitOpError() << "(C1) has " << getParts().size() << " results and "
                         << sizes.size()
                         << " sizes: one result for each size, at least one, "
                            "of an input of rank 1 or more";
  // split_last C2
  int64_t total = 0;
  for (int64_t n : sizes) {
    if (n < 1)
      return emitOpError() << "(C2) sizes must be positive, got " << n;
    total += n;
  }
  if (total != x.getShape().back())
    return emitOpError() << "(C2) sizes sum to " << total
                         << " but the input's last dimension is "
                         << x.getShape().back();
  // split_last C3
  SmallVector<int64_t> shape(x.getShape());
  for (auto [n, part] : llvm::zip(sizes, getParts())) {
    shape.back() = n;
    if (failed(expectShape(op, "C3", "each result", part, shape)) ||
        failed(expectSameElementType(op, "C3", "each result", part, "input",
                                     getInput())))
      return failure();
  }
  return success();
}

LogicalResult SigmoidGateOp::verify() {
  Operation *op = *this;
  // sigmoid_gate C1
  if (failed(
          expectSameType(op, "C1", "result", getResult(), "input", getInput())))
    return failure();
  // sigmoid_gate C2
  auto x = tensorType(getInput()).getShape();
  SmallVector<int64_t> one(x);
  if (!one.empty())
    one.back() = 1;
  auto g = tensorType(getGate()).getShape();
  if (g != x && ArrayRef<int64_t>(one) != g)
    return emitOpError() << "(C2) gate is " << shapeString(g) << " but must be "
                         << shapeString(x) << " or " << shapeString(one);
  return success();
}

// Taps times channels, a multiply and an add each.
int64_t CausalConvOp::getFlopCount() {
  return 2 * numElements(getInput()) * tensorType(getWeight()).getDimSize(1);
}

// The recurrence per token and value head: M^T k, the rank-1 update and
// M^T q, 2 dk dv each, and the decay, dk dv. (The chunk-wise kernel does
// more, on tensor cores; this is the work the result needs.)
int64_t GatedDeltaRuleOp::getFlopCount() {
  auto q = tensorType(getQuery()).getShape();
  auto v = tensorType(getValue()).getShape();
  return v[0] * v[1] * v[2] * 7 * q[3] * v[3];
}

int64_t GatedRmsNormOp::getFlopCount() { return 6 * numElements(getInput()); }
int64_t ZeroCentredRmsNormOp::getFlopCount() {
  return 4 * numElements(getInput());
}
int64_t PartialRopeOp::getFlopCount() {
  auto s = tensorType(getInput()).getShape();
  return 3 * s[0] * s[1] * s[2] * getRotaryDim();
}
int64_t SplitLastOp::getFlopCount() { return 0; }
int64_t SigmoidGateOp::getFlopCount() { return 3 * numElements(getInput()); }
