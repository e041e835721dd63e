//===- DFlashVJP.cpp - Vector-Jacobian products of the forward ops --------===//
//
// One rule per differentiable op: given its result gradients, build the
// gradient ops of its operands. Indices, flags and frozen tables get none.
//
//===----------------------------------------------------------------------===//

#include "dialect/DFlashOps.h"

#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace mlir::dflash;

SmallVector<Value> LinearOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads) {
  Value dy = grads[0];
  Value dx = LinearGradInputOp::create(b, getLoc(), getInput().getType(), dy,
                                       getWeight());
  Value dw = LinearGradWeightOp::create(b, getLoc(), getWeight().getType(), dy,
                                        getInput());
  return {dx, dw};
}

SmallVector<Value> RmsNormOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads) {
  auto g = RmsNormGradOp::create(b, getLoc(), getInput().getType(),
                                 getWeight().getType(), grads[0], getInput(),
                                 getWeight(), getEpsAttr());
  return {g.getInputGrad(), g.getWeightGrad()};
}

SmallVector<Value> ReshapeOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads) {
  return {ReshapeOp::create(b, getLoc(), getInput().getType(), grads[0])};
}

SmallVector<Value> RopeOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads) {
  Value dx = RopeGradOp::create(b, getLoc(), getInput().getType(), grads[0],
                                getPositions(), getThetaAttr(), getYarnAttr());
  return {dx, Value()};
}

SmallVector<Value> BlockAttentionOp::buildVJP(OpBuilder &b,
                                              ArrayRef<Value> grads) {
  // The log-sum-exp is kept for the backward pass only; it has no gradient.
  auto g = BlockAttentionGradOp::create(
      b, getLoc(),
      TypeRange{getQuery().getType(), getContextKeys().getType(),
                getContextValues().getType(), getDraftKeys().getType(),
                getDraftValues().getType()},
      grads[0], getQuery(), getContextKeys(), getContextValues(),
      getDraftKeys(), getDraftValues(), getAnchors(), getKeep(),
      getPositionIds(), getResult(), getLse(), getBlockSizeAttr(),
      getWindowAttr(), getCausalAttr());
  return {g.getQueryGrad(),
          g.getContextKeysGrad(),
          g.getContextValuesGrad(),
          g.getDraftKeysGrad(),
          g.getDraftValuesGrad(),
          Value(),
          Value(),
          Value()};
}

SmallVector<Value> SwigluOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads) {
  auto g =
      SwigluGradOp::create(b, getLoc(), getGate().getType(), getUp().getType(),
                           grads[0], getGate(), getUp());
  return {g.getGateGrad(), g.getUpGrad()};
}

SmallVector<Value> AddOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads) {
  return {grads[0], grads[0]};
}

SmallVector<Value> SelectorObjectiveOp::buildVJP(OpBuilder &b,
                                                 ArrayRef<Value> grads) {
  // Linear in the two sums; alpha and the sums of weights are data.
  SmallVector<Value> result(getOperation()->getNumOperands(), Value());
  if (!grads[0])
    return result;
  result[getUnarySumMutable().getOperandNumber()] = grads[0];
  result[getSelectorSumMutable().getOperandNumber()] =
      SelectorObjectiveGradOp::create(b, getLoc(), grads[0].getType(), grads[0],
                                      getAlpha(), getWeightSum(),
                                      getCoveredWeight(), getCoveredAttr());
  return result;
}

SmallVector<Value> LmHeadCeOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads) {
  // Only loss_sum is differentiable; the weight is frozen.
  if (!grads[0])
    return {Value(), Value(), Value(), Value()};
  Value dy = LmHeadCeGradOp::create(
      b, getLoc(), getInput().getType(), getInput(), getWeight(), getLabels(),
      getWeights(), grads[0], getMultiplierAttr(), getSoftcapAttr());
  return {dy, Value(), Value(), Value()};
}

SmallVector<Value> GroupedConvOp::buildVJP(OpBuilder &b,
                                           ArrayRef<Value> grads) {
  auto g = GroupedConvGradOp::create(
      b, getLoc(),
      TypeRange{getInput().getType(), getDelta().getType(),
                getBase().getType()},
      grads[0], getInput(), getDelta(), getBase(), getBlockSizeAttr(),
      getKernelSizeAttr(), getGroupSizeAttr(), getHalfAttr());
  return {g.getInputGrad(), g.getDeltaGrad(), g.getBaseGrad()};
}

SmallVector<Value> SelectorCandidatesOp::buildVJP(OpBuilder &b,
                                                  ArrayRef<Value> grads) {
  // candidates are indices; the weight is frozen.
  SmallVector<Value> result(4, Value());
  if (grads[0] || grads[2])
    result[0] = SelectorCandidatesGradOp::create(
        b, getLoc(), getInput().getType(), getInput(), getWeight(),
        getCandidates(), getLabels(), getWeights(), grads[0], grads[2],
        getTopKAttr(), getMultiplierAttr(), getSoftcapAttr());
  return result;
}

SmallVector<Value> SelectorLossOp::buildVJP(OpBuilder &b,
                                            ArrayRef<Value> grads) {
  // Only loss_sum is differentiable (covered_weight is piecewise
  // constant); indices, labels and weights get nothing.
  SmallVector<Value> result(getOperation()->getNumOperands(), Value());
  if (!grads[0])
    return result;
  auto input = cast<RankedTensorType>(getInput().getType());
  SmallVector<int64_t> projected(input.getShape().drop_back());
  projected.push_back(
      cast<RankedTensorType>(getProjection().getType()).getDimSize(0));
  auto g = SelectorLossGradOp::create(
      b, getLoc(),
      TypeRange{getValues().getType(), getLabelValues().getType(),
                RankedTensorType::get(projected, input.getElementType()),
                getPredecessorCodebook().getType(),
                getSuccessorCodebook().getType()},
      getValues(), getCandidates(), getLabelValues(), getInput(),
      getProjection(), getPredecessors(), getLabels(), getWeights(),
      getPredecessorCodebook(), getSuccessorCodebook(), grads[0], getGoldAttr(),
      getStopGradientAttr());
  // t = input @ projection^T: Wh always learns from dt; with stop_gradient
  // nothing of the selector reaches the input or the unary logits.
  result[getProjectionMutable().getOperandNumber()] =
      LinearGradWeightOp::create(b, getLoc(), getProjection().getType(),
                                 g.getProjectedGrad(), getInput());
  result[getPredecessorCodebookMutable().getOperandNumber()] =
      g.getPredecessorCodebookGrad();
  result[getSuccessorCodebookMutable().getOperandNumber()] =
      g.getSuccessorCodebookGrad();
  if (getStopGradient())
    return result;
  result[getInputMutable().getOperandNumber()] = LinearGradInputOp::create(
      b, getLoc(), getInput().getType(), g.getProjectedGrad(), getProjection());
  result[getValuesMutable().getOperandNumber()] = g.getValuesGrad();
  // A label value scores only an injected label.
  if (getGold() == "inject")
    result[getLabelValuesMutable().getOperandNumber()] = g.getLabelValuesGrad();
  return result;
}
