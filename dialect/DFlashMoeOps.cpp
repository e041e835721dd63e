//===- DFlashMoeOps.cpp - Verifiers and FLOPs of the MoE ops --------------===//
//
// The numbered constraints of docs/dialect.md's mixture-of-experts section;
// each message starts with its constraint.
//
//===----------------------------------------------------------------------===//

#include "dialect/DFlashOps.h"
#include "dialect/VerifyHelpers.h"

using namespace mlir;
using namespace mlir::dflash;
using namespace mlir::dflash::verify;

LogicalResult MoeRouteOp::verify() {
  Operation *op = *this;
  // moe_route C1
  if (failed(expectRank(op, "C1", "logits", getLogits(), 2)))
    return failure();
  int64_t T = tensorType(getLogits()).getDimSize(0);
  int64_t E = tensorType(getLogits()).getDimSize(1);
  // moe_route C2
  int64_t k = getTopK();
  if (k < 1 || k > E)
    return emitOpError() << "(C2) top_k is " << k << " but must be in [1, " << E
                         << "] (the experts)";
  // moe_route C3
  if (getScoring() != "softmax_topk" && getScoring() != "topk_softmax")
    return emitOpError() << "(C3) scoring is '" << getScoring()
                         << "': 'softmax_topk' (softmax over every expert, "
                            "then the top k) or 'topk_softmax' (the top k, "
                            "then softmax over them) are defined";
  if (getScoring() == "topk_softmax" && getNormalize())
    return emitOpError() << "(C3) normalize is only for 'softmax_topk': "
                            "'topk_softmax' weights already sum to 1";
  // moe_route C4
  if (failed(expectShape(op, "C4", "weights", getWeights(), {T, k})) ||
      failed(expectShape(op, "C4", "experts", getExperts(), {T, k})))
    return failure();
  return success();
}

LogicalResult MoePermuteOp::verify() {
  Operation *op = *this;
  // moe_permute C1
  if (failed(expectRank(op, "C1", "input", getInput(), 2)) ||
      failed(expectRank(op, "C1", "experts", getExperts(), 2)) ||
      failed(expectRank(op, "C1", "offsets", getOffsets(), 1)))
    return failure();
  auto x = tensorType(getInput()), e = tensorType(getExperts());
  int64_t T = x.getDimSize(0), H = x.getDimSize(1), k = e.getDimSize(1);
  // moe_permute C2
  if (e.getDimSize(0) != T)
    return emitOpError() << "(C2) experts has " << e.getDimSize(0)
                         << " rows but input has " << T << " tokens";
  // moe_permute C3
  if (failed(expectShape(op, "C3", "permuted", getPermuted(), {T * k, H})) ||
      failed(expectShape(op, "C3", "source", getSource(), {T * k})))
    return failure();
  if (tensorType(getPermuted()).getElementType() != x.getElementType())
    return emitOpError() << "(C3) permuted must have input's element type";
  // moe_permute C4
  if (tensorType(getOffsets()).getDimSize(0) < 2)
    return emitOpError() << "(C4) offsets must have at least 2 entries "
                            "(one expert and the end)";
  return success();
}

/// grouped_linear's constraints (C1-C4), which grouped_linear_swiglu's
/// gate and up weights each meet.
static LogicalResult verifyGroupedLinear(Operation *op, Value input,
                                         Value weight, Value offsets,
                                         Value result) {
  // grouped_linear C1
  if (failed(expectRank(op, "C1", "input", input, 2)) ||
      failed(expectRank(op, "C1", "weight", weight, 3)) ||
      failed(expectRank(op, "C1", "offsets", offsets, 1)))
    return failure();
  auto x = tensorType(input), w = tensorType(weight);
  int64_t R = x.getDimSize(0), E = w.getDimSize(0), N = w.getDimSize(1);
  // grouped_linear C2
  if (w.getDimSize(2) != x.getDimSize(1))
    return op->emitOpError()
           << "(C2) weight " << w << " must have the input's "
           << x.getDimSize(1) << " columns in its last dimension";
  // grouped_linear C3
  if (failed(expectShape(op, "C3", "offsets", offsets, {E + 1})))
    return failure();
  // grouped_linear C4
  if (failed(expectShape(op, "C4", "result", result, {R, N})))
    return failure();
  if (w.getElementType() != x.getElementType() ||
      tensorType(result).getElementType() != x.getElementType())
    return op->emitOpError() << "(C4) input, weight and result must share an "
                                "element type";
  return success();
}

/// grouped_linear C5: a bias is [E, N] of the weight's element type.
static LogicalResult verifyExpertBias(Operation *op, StringRef name, Value bias,
                                      Value weight) {
  if (!bias)
    return success();
  auto w = tensorType(weight);
  if (failed(expectShape(op, "C5", name, bias,
                         {w.getDimSize(0), w.getDimSize(1)})))
    return failure();
  return expectSameElementType(op, "C5", name, bias, "weight", weight);
}

LogicalResult GroupedLinearOp::verify() {
  if (failed(verifyGroupedLinear(*this, getInput(), getWeight(), getOffsets(),
                                 getResult())))
    return failure();
  return verifyExpertBias(*this, "bias", getBias(), getWeight());
}

LogicalResult GroupedLinearSwigluOp::verify() {
  // grouped_linear_swiglu C1
  if (getGateWeight().getType() != getUpWeight().getType())
    return emitOpError() << "(C1) gate weight " << getGateWeight().getType()
                         << " and up weight " << getUpWeight().getType()
                         << " must be one [E, N, K] type";
  // grouped_linear_swiglu C2
  if (failed(verifyGroupedLinear(*this, getInput(), getGateWeight(),
                                 getOffsets(), getResult())) ||
      failed(verifyExpertBias(*this, "gate_bias", getGateBias(),
                              getGateWeight())) ||
      failed(verifyExpertBias(*this, "up_bias", getUpBias(), getUpWeight())))
    return failure();
  // grouped_linear_swiglu C3
  if (bool(getGateBias()) != bool(getUpBias()))
    return emitOpError() << "(C3) has a gate bias or an up bias without the "
                            "other";
  // grouped_linear_swiglu C4
  if (bool(getAlphaAttr()) != bool(getLimitAttr()))
    return emitOpError() << "(C4) the clamped form needs both alpha and limit";
  if (getLimitAttr() && (!(getLimit()->convertToDouble() > 0) ||
                         !(getAlpha()->convertToDouble() > 0)))
    return emitOpError() << "(C4) alpha and limit must be positive";
  return success();
}

LogicalResult MoeUnpermuteOp::verify() {
  Operation *op = *this;
  // moe_unpermute C1
  if (failed(expectRank(op, "C1", "permuted", getPermuted(), 2)) ||
      failed(expectRank(op, "C1", "weights", getWeights(), 2)))
    return failure();
  auto ys = tensorType(getPermuted()), w = tensorType(getWeights());
  int64_t T = w.getDimSize(0), k = w.getDimSize(1), H = ys.getDimSize(1);
  // moe_unpermute C2
  if (ys.getDimSize(0) != T * k)
    return emitOpError() << "(C2) permuted has " << ys.getDimSize(0)
                         << " rows but weights route " << T << " tokens to "
                         << k << " experts (" << T * k << " rows)";
  if (failed(expectShape(op, "C2", "source", getSource(), {T * k})))
    return failure();
  // moe_unpermute C3
  if (failed(expectShape(op, "C3", "result", getResult(), {T, H})))
    return failure();
  if (tensorType(getResult()).getElementType() != ys.getElementType())
    return emitOpError() << "(C3) result must have permuted's element type";
  return success();
}

// Routing and the permutations move data; the grouped GEMM does the work,
// counted over the T*k rows that are routed (the active experts).
int64_t MoeRouteOp::getFlopCount() { return 0; }
int64_t MoePermuteOp::getFlopCount() { return 0; }
int64_t MoeUnpermuteOp::getFlopCount() {
  return 2 * tensorType(getPermuted()).getNumElements();
}
int64_t GroupedLinearOp::getFlopCount() {
  auto w = tensorType(getWeight());
  return (2 * w.getDimSize(2) + (getBias() ? 1 : 0)) *
         tensorType(getInput()).getDimSize(0) * w.getDimSize(1);
}
int64_t GroupedLinearSwigluOp::getFlopCount() {
  // Both products and the elementwise SwiGLU (SwigluOp's count).
  auto w = tensorType(getGateWeight());
  return 2 * 2 * tensorType(getInput()).getDimSize(0) * w.getDimSize(1) *
             w.getDimSize(2) +
         5 * tensorType(getResult()).getNumElements();
}
