//===- MakeEvalProgram.cpp - The forward graph as an evaluation program ---===//
//
// An evaluation reads held-out rows in fixed batches and reports global
// sums; the runtime adds them up over the batches and divides once, so that
// a batch with few supervised slots weighs what its slots weigh (a DFlash2
// "covered" objective, a ratio, reports its parts instead). The
// program is the forward graph with its sums all-reduced; it is compiled as
// a module of its own, beside the step's (the step's passes would
// differentiate and update it). It also returns each draft slot's hit and
// weight, which the runtime walks in serving order (ServingWalk.h).
//
//===----------------------------------------------------------------------===//

#include "compiler/Analysis/StepSignature.h"
#include "compiler/Transforms/ForwardSums.h"
#include "compiler/Transforms/Passes.h"
#include "schema/StepBuffers.h"

#include "mlir/IR/Builders.h"

namespace dflash {
#define GEN_PASS_DEF_MAKEEVALPROGRAM
#include "compiler/Transforms/Passes.h.inc"
} // namespace dflash

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace {

struct MakeEvalProgramPass
    : public ::dflash::impl::MakeEvalProgramBase<MakeEvalProgramPass> {
  void runOnOperation() override;
};

void MakeEvalProgramPass::runOnOperation() {
  ModuleOp module = getOperation();
  auto step = module.lookupSymbol<func::FuncOp>(kStepFunctionName);
  if (!step || step.isExternal()) {
    module.emitError("the module has no forward graph func.func @step to "
                     "evaluate");
    return signalPassFailure();
  }
  FailureOr<StepSignature> sig = StepSignature::get(module);
  if (failed(sig))
    return signalPassFailure();
  // Exactly the forward graph: its results are the sums, nothing more.
  func::ReturnOp ret = sig->returnOp();
  if (ret.getNumOperands() != unsigned(kNumForwardSums)) {
    step.emitError() << "@step returns " << ret.getNumOperands()
                     << " results but the forward graph returns the "
                     << kNumForwardSums
                     << " forward sums: make the evaluation program from "
                        "dflashc --emit=graph";
    return signalPassFailure();
  }
  for (int k = 0; k < kNumForwardSums; ++k) {
    ArgAttr info = sig->resultInfo(unsigned(k));
    if (info.getRole() != ArgRole::Metric ||
        info.getName() != nameOf(ForwardSum(k))) {
      step.emitError() << "result " << k << " of @step is '" << info.getName()
                       << "' but the forward graph's is '"
                       << nameOf(ForwardSum(k)) << "'";
      return signalPassFailure();
    }
  }

  OpBuilder b(ret);
  SmallVector<Value> sums(ret.getOperands());
  const size_t lossIndex = size_t(ForwardSum::LossSum);
  auto covered = sums[lossIndex].getDefiningOp<SelectorObjectiveOp>();
  if (covered && !covered.getCovered())
    covered = nullptr;
  SmallVector<Value> results = allReduceForwardSums(b, ret.getLoc(), sums);
  // A "covered" objective divides by sum(w * cov), a ratio that does not add
  // up over an evaluation's batches: loss_sum becomes the linear objective
  // of the same global sums, and the unary sum and covered weight go last
  // (schema ObjectivePart), for the runtime to form the objective from the
  // totals.
  SmallVector<Value> parts;
  if (covered) {
    results[lossIndex] = SelectorObjectiveOp::create(
        b, covered.getLoc(), covered.getType(), covered.getUnarySum(),
        covered.getSelectorSum(), covered.getAlpha(), covered.getWeightSum(),
        covered.getCoveredWeight(), /*covered=*/nullptr);
    parts = {covered.getUnarySum(), covered.getCoveredWeight()};
  }
  // Each micro-batch's per-slot hits and weights, this GPU's own, for the
  // serving walk on the host (schema DraftSlots, in micro-batch order).
  SmallVector<std::string> names;
  step.walk([&](DraftAcceptanceOp accepted) {
    results.push_back(accepted.getHits());
    names.push_back(nameOf(DraftSlots::Hits));
    results.push_back(accepted.getWeights());
    names.push_back(nameOf(DraftSlots::Weights));
  });
  for (auto [k, part] : llvm::enumerate(parts)) {
    results.push_back(part);
    names.push_back(nameOf(ObjectivePart(k)));
  }
  ret->setOperands(results);
  if (covered && covered->use_empty())
    covered->erase();
  SmallVector<Attribute> resultAttrs;
  for (unsigned k = 0; k < results.size(); ++k)
    resultAttrs.push_back(
        k < unsigned(kNumForwardSums)
            ? Attribute(step.getResultAttrDict(k))
            : Attribute(b.getDictionaryAttr(b.getNamedAttr(
                  kArgAttrName,
                  ArgAttr::get(b.getContext(), ArgRole::Metric,
                               names[k - unsigned(kNumForwardSums)])))));
  step.setFunctionType(b.getFunctionType(step.getArgumentTypes(),
                                         ValueRange(results).getTypes()));
  step.setAllResultAttrs(resultAttrs);
  step.setSymName(kEvalFunctionName);
}

} // namespace
