//===- AppendOptimizer.cpp - Loss normalisation, clip and AdamW -----------===//
//
// Turns the differentiated @step into the whole training step of
// docs/semantics.md sections 4-5. The backward seed 1/sum(w) needs the global
// weight sum before the backward pass starts, so the forward sums are
// all-reduced right after the loss op; gradients are all-reduced after.
//
//===----------------------------------------------------------------------===//

#include "compiler/Analysis/StepSignature.h"
#include "compiler/Transforms/ForwardSums.h"
#include "compiler/Transforms/Passes.h"
#include "schema/StepBuffers.h"

#include "mlir/IR/Builders.h"

#include <iterator>

namespace dflash {
#define GEN_PASS_DEF_APPENDOPTIMIZER
#include "compiler/Transforms/Passes.h.inc"
} // namespace dflash

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace {

struct AppendOptimizerPass
    : public ::dflash::impl::AppendOptimizerBase<AppendOptimizerPass> {
  void runOnOperation() override;
};

void AppendOptimizerPass::runOnOperation() {
  ModuleOp module = getOperation();
  MLIRContext *ctx = &getContext();
  auto hyper = module->getAttrOfType<OptimizerAttr>(kOptimizerAttrName);
  if (!hyper) {
    module.emitError() << "the module has no '" << kOptimizerAttrName
                       << "' attribute with the optimizer's hyperparameters";
    return signalPassFailure();
  }
  FailureOr<StepSignature> sig = StepSignature::get(module);
  if (failed(sig))
    return signalPassFailure();
  func::FuncOp step = sig->func();
  std::optional<unsigned> seedArg =
      sig->findArg(ArgRole::Input, "loss_sum_grad");
  SmallVector<unsigned> gradResults = sig->resultsWithRole(ArgRole::Gradient);
  if (!seedArg || gradResults.empty()) {
    step.emitError("@step has no gradients: run dflash-generate-backward "
                   "before dflash-append-optimizer");
    return signalPassFailure();
  }
  func::ReturnOp ret = sig->returnOp();
  SmallVector<Value> sums; // ForwardSum order
  for (int k = 0; k < kNumForwardSums; ++k) {
    const char *name = nameOf(ForwardSum(k));
    std::optional<unsigned> i = sig->findResult(ArgRole::Metric, name);
    if (!i) {
      step.emitError() << "@step has no result #dflash.arg<metric, \"" << name
                       << "\">";
      return signalPassFailure();
    }
    sums.push_back(ret.getOperand(*i));
  }
  // The sums are all known after the last op that defines one (the loss
  // and acceptance ops, or with gradient accumulation the adds of every
  // micro-batch's).
  Operation *lastSum = nullptr;
  for (Value v : sums) {
    Operation *def = v.getDefiningOp();
    if (!def || def->getBlock() != &step.front()) {
      step.emitError("the forward sums must be computed by ops of @step");
      return signalPassFailure();
    }
    if (!lastSum || lastSum->isBeforeInBlock(def))
      lastSum = def;
  }

  // Global sums, then the seed of the backward pass.
  OpBuilder b(ctx);
  b.setInsertionPointAfter(lastSum);
  Location loc = sums[0].getDefiningOp()->getLoc();
  Type scalar = RankedTensorType::get({}, Float32Type::get(ctx));
  // The selector objective's gradient, after it, reads the global sum(w)
  // and sum(w cov) too.
  SmallVector<Value> global = allReduceForwardSums(b, loc, sums);
  auto stats = LossStatsOp::create(b, loc, scalar, scalar, scalar, scalar,
                                   global[0], global[1], global[2], global[3],
                                   global[4], global[5]);
  step.getArgument(*seedArg).replaceAllUsesWith(stats.getLossSumGrad());

  // Optimizer state arguments, appended in parameter order.
  SmallVector<unsigned> params = sig->argsWithRole(ArgRole::Parameter);
  struct State {
    Value param, master, m, v, grad;
    StringRef name;
  };
  SmallVector<State> states;
  for (unsigned gi : gradResults) {
    StringRef name = sig->resultInfo(gi).getName();
    std::optional<unsigned> pi = sig->findArg(ArgRole::Parameter, name);
    if (!pi) {
      step.emitError() << "gradient '" << name << "' has no parameter";
      return signalPassFailure();
    }
    states.push_back(
        {step.getArgument(*pi), {}, {}, {}, ret.getOperand(gi), name});
  }
  if (states.size() != params.size()) {
    step.emitError("every parameter needs exactly one gradient");
    return signalPassFailure();
  }
  auto appendArg = [&](Type type, ArgRole role, StringRef name) -> Value {
    unsigned index = step.getNumArguments();
    if (failed(step.insertArgument(index, type, argAttrDict(ctx, role, name),
                                   step.getLoc())))
      return Value();
    return step.getArgument(index);
  };
  for (State &s : states) {
    auto t = cast<RankedTensorType>(s.param.getType());
    Type f32 = RankedTensorType::get(t.getShape(), Float32Type::get(ctx));
    s.master = appendArg(f32, ArgRole::Master, s.name);
    s.m = appendArg(f32, ArgRole::Moment1, s.name);
    s.v = appendArg(f32, ArgRole::Moment2, s.name);
  }
  // A DFlash2 forward graph already reads the counters (its selector's
  // alpha_t, docs/semantics.md section 13): the schedule reads the same ones.
  Type counter = RankedTensorType::get({}, IntegerType::get(ctx, 32));
  auto counterArg = [&](StepCounter which) -> Value {
    const char *name = nameOf(which);
    if (std::optional<unsigned> i = sig->findArg(ArgRole::Counter, name))
      return step.getArgument(*i);
    return appendArg(counter, ArgRole::Counter, name);
  };
  Value stepArg = counterArg(StepCounter::Step);
  Value totalArg = counterArg(StepCounter::TotalSteps);
  if (!stepArg || !totalArg) {
    step.emitError("cannot add the optimizer's arguments");
    return signalPassFailure();
  }
  if (failed(step.eraseArgument(*seedArg))) {
    step.emitError("cannot remove the loss_sum_grad argument");
    return signalPassFailure();
  }

  // fp32 gradients, summed over the GPUs, clipped by their global norm.
  b.setInsertionPoint(ret);
  loc = ret.getLoc();
  SmallVector<Value> grads32;
  for (State &s : states) {
    auto t = cast<RankedTensorType>(s.grad.getType());
    grads32.push_back(ConvertOp::create(
        b, loc, RankedTensorType::get(t.getShape(), Float32Type::get(ctx)),
        s.grad));
  }
  auto summed =
      AllReduceOp::create(b, loc, ValueRange(grads32).getTypes(), grads32);
  Value norm = GlobalNormOp::create(b, loc, scalar, summed.getResults());
  Value clip =
      ClipCoefficientOp::create(b, loc, scalar, norm, hyper.getMaxGradNorm());
  Value lr = LrScheduleOp::create(b, loc, scalar, stepArg, totalArg,
                                  hyper.getLr(), hyper.getWarmupRatio());

  SmallVector<Value> newParams, newMasters, newM, newV;
  for (auto [s, g] : llvm::zip(states, summed.getResults())) {
    auto update =
        AdamWOp::create(b, s.param.getLoc(), s.master.getType(), s.m.getType(),
                        s.v.getType(), s.param.getType(), s.master, g, s.m, s.v,
                        stepArg, lr, clip, hyper.getBeta1(), hyper.getBeta2(),
                        hyper.getEps(), hyper.getWeightDecay());
    newMasters.push_back(update.getNewMaster());
    newM.push_back(update.getNewMoment1());
    newV.push_back(update.getNewMoment2());
    newParams.push_back(update.getNewParameter());
  }

  // Results: updated state in parameter order, then the metrics.
  SmallVector<Value> results;
  SmallVector<Attribute> attrs;
  auto add = [&](ArrayRef<Value> values, ArgRole role) {
    for (auto [v, s] : llvm::zip(values, states)) {
      results.push_back(v);
      attrs.push_back(argAttrDict(ctx, role, s.name));
    }
  };
  add(newParams, ArgRole::Parameter);
  add(newMasters, ArgRole::Master);
  add(newM, ArgRole::Moment1);
  add(newV, ArgRole::Moment2);
  // In StepMetric order.
  Value metrics[] = {stats.getLoss(),
                     stats.getAcc(),
                     norm,
                     lr,
                     stats.getTau(),
                     global[size_t(ForwardSum::PositionHits)],
                     global[size_t(ForwardSum::PositionCounts)],
                     global[size_t(ForwardSum::BucketRuns)],
                     global[size_t(ForwardSum::BucketBlocks)],
                     global[size_t(ForwardSum::BucketHits)],
                     global[size_t(ForwardSum::BucketCounts)]};
  static_assert(std::size(metrics) == kNumStepMetrics, "one per StepMetric");
  for (auto [k, v] : llvm::enumerate(metrics)) {
    results.push_back(v);
    attrs.push_back(argAttrDict(ctx, ArgRole::Metric, nameOf(StepMetric(k))));
  }
  func::ReturnOp::create(b, loc, results);
  ret.erase();
  step.setType(FunctionType::get(ctx, step.getArgumentTypes(),
                                 ValueRange(results).getTypes()));
  step.setAllResultAttrs(attrs);
}

} // namespace
