//===- GenerateBackward.cpp - Reverse-mode autodiff of @step --------------===//
//
// Walks the forward ops backwards from `loss_sum`, asking each active op for
// its vector-Jacobian product. An op is active when it lies on a path from a
// parameter to the loss: only those get gradients, so nothing flows into the
// data, the target features or the frozen embedding and lm_head.
//
//===----------------------------------------------------------------------===//

#include "compiler/Analysis/StepSignature.h"
#include "compiler/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/DenseSet.h"

namespace dflash {
#define GEN_PASS_DEF_GENERATEBACKWARD
#include "compiler/Transforms/Passes.h.inc"
} // namespace dflash

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace {

struct GenerateBackwardPass
    : public ::dflash::impl::GenerateBackwardBase<GenerateBackwardPass> {
  void runOnOperation() override;
};

/// Values that depend on a parameter and that the loss depends on.
llvm::DenseSet<Value> activeValues(func::FuncOp step, ArrayRef<unsigned> params,
                                   Value loss) {
  llvm::DenseSet<Value> varied;
  for (unsigned i : params)
    varied.insert(step.getArgument(i));
  Block &body = step.front();
  for (Operation &op : body.without_terminator())
    if (llvm::any_of(op.getOperands(),
                     [&](Value v) { return varied.contains(v); }))
      varied.insert(op.getResults().begin(), op.getResults().end());

  llvm::DenseSet<Value> useful;
  useful.insert(loss);
  for (Operation &op : llvm::reverse(body.without_terminator()))
    if (llvm::any_of(op.getResults(),
                     [&](Value v) { return useful.contains(v); }))
      useful.insert(op.getOperands().begin(), op.getOperands().end());

  llvm::DenseSet<Value> active;
  for (Value v : varied)
    if (useful.contains(v))
      active.insert(v);
  return active;
}

void GenerateBackwardPass::runOnOperation() {
  ModuleOp module = getOperation();
  FailureOr<StepSignature> sig = StepSignature::get(module);
  if (failed(sig))
    return signalPassFailure();
  func::FuncOp step = sig->func();
  if (!sig->resultsWithRole(ArgRole::Gradient).empty()) {
    step.emitError("@step already has gradient results: "
                   "dflash-generate-backward runs once");
    return signalPassFailure();
  }
  std::optional<unsigned> lossIndex =
      sig->findResult(ArgRole::Metric, "loss_sum");
  if (!lossIndex) {
    step.emitError("@step has no result #dflash.arg<metric, \"loss_sum\"> to "
                   "differentiate");
    return signalPassFailure();
  }
  SmallVector<unsigned> params = sig->argsWithRole(ArgRole::Parameter);
  func::ReturnOp ret = sig->returnOp();
  Value loss = ret.getOperand(*lossIndex);
  llvm::DenseSet<Value> active = activeValues(step, params, loss);

  // The seed d(objective)/d(loss_sum) is an argument until
  // dflash-append-optimizer computes it.
  MLIRContext *ctx = &getContext();
  Type scalar = RankedTensorType::get({}, Float32Type::get(ctx));
  unsigned seedIndex = step.getNumArguments();
  if (failed(step.insertArgument(
          seedIndex, scalar,
          DictionaryAttr::get(
              ctx, {NamedAttribute(
                       StringAttr::get(ctx, kArgAttrName),
                       ArgAttr::get(ctx, ArgRole::Input, "loss_sum_grad"))}),
          loss.getLoc()))) {
    step.emitError("cannot add the loss_sum_grad argument");
    return signalPassFailure();
  }

  llvm::DenseMap<Value, Value> grads;
  grads[loss] = step.getArgument(seedIndex);
  OpBuilder b(ret);
  auto accumulate = [&](Value v, Value g, Location loc) {
    Value &slot = grads[v];
    slot = slot ? AddOp::create(b, loc, v.getType(), slot, g).getResult() : g;
  };

  SmallVector<Operation *> forward;
  for (Operation &op : step.front().without_terminator())
    forward.push_back(&op);
  for (Operation *op : llvm::reverse(forward)) {
    SmallVector<Value> resultGrads;
    bool any = false;
    for (Value r : op->getResults()) {
      Value g = active.contains(r) ? grads.lookup(r) : Value();
      resultGrads.push_back(g);
      any |= bool(g);
    }
    if (!any)
      continue;
    auto diff = dyn_cast<DifferentiableOpInterface>(op);
    if (!diff) {
      op->emitOpError("lies on the path from a parameter to the loss but has "
                      "no gradient rule (DifferentiableOpInterface)");
      return signalPassFailure();
    }
    SmallVector<Value> operandGrads = diff.buildVJP(b, resultGrads);
    for (auto [operand, g] : llvm::zip(op->getOperands(), operandGrads))
      if (g && active.contains(operand))
        accumulate(operand, g, op->getLoc());
  }

  // Gradients become results, in parameter order.
  SmallVector<Value> results(ret.getOperands());
  SmallVector<Attribute> resultAttrs;
  for (unsigned i = 0; i < step.getNumResults(); ++i)
    resultAttrs.push_back(step.getResultAttrDict(i));
  for (unsigned i : params) {
    Value g = grads.lookup(step.getArgument(i));
    StringRef name = sig->argInfo(i).getName();
    if (!g) {
      step.emitError() << "parameter '" << name << "' does not reach the loss";
      return signalPassFailure();
    }
    results.push_back(g);
    resultAttrs.push_back(DictionaryAttr::get(
        ctx, {NamedAttribute(StringAttr::get(ctx, kArgAttrName),
                             ArgAttr::get(ctx, ArgRole::Gradient, name))}));
  }
  func::ReturnOp::create(b, ret.getLoc(), results);
  ret.erase();
  step.setType(FunctionType::get(ctx, step.getArgumentTypes(),
                                 ValueRange(results).getTypes()));
  step.setAllResultAttrs(resultAttrs);

  // VJP rules build every operand gradient; drop those nobody needs (the
  // input gradient of the first layer, the target features' gradient...).
  SmallVector<Operation *> ops;
  for (Operation &op : step.front().without_terminator())
    ops.push_back(&op);
  for (Operation *op : llvm::reverse(ops))
    if (isOpTriviallyDead(op))
      op->erase();
}

} // namespace
