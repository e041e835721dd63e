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

SmallVector<Value> LmHeadCeOp::buildVJP(OpBuilder &b, ArrayRef<Value> grads) {
  // Only loss_sum is differentiable; the weight is frozen.
  if (!grads[0])
    return {Value(), Value(), Value(), Value()};
  Value dy =
      LmHeadCeGradOp::create(b, getLoc(), getInput().getType(), getInput(),
                             getWeight(), getLabels(), getWeights(), grads[0]);
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
