//===- FlopCount.cpp - FLOPs of a step, by phase and op kind --------------===//

#include "compiler/Analysis/FlopCount.h"

#include "dialect/DFlashOps.h"
#include "llvm/ADT/DenseSet.h"

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

FlopCount FlopCount::of(func::FuncOp step) {
  FlopCount count;
  llvm::DenseSet<Value> fromSeed;
  for (unsigned i = 0; i < step.getNumArguments(); ++i)
    if (auto info = step.getArgAttrOfType<ArgAttr>(i, kArgAttrName))
      if (info.getRole() == ArgRole::Input &&
          info.getName() == "loss_sum_grad")
        fromSeed.insert(step.getArgument(i));
  for (Operation &op : step.front().without_terminator()) {
    Phase phase = Forward;
    if (isa<AllReduceOp, LossStatsOp, ConvertOp, GlobalNormOp,
            ClipCoefficientOp, LrScheduleOp, AdamWOp>(op)) {
      phase = Optimizer;
      if (auto stats = dyn_cast<LossStatsOp>(op))
        fromSeed.insert(stats.getLossSumGrad());
    } else if (llvm::any_of(op.getOperands(),
                            [&](Value v) { return fromSeed.contains(v); })) {
      phase = Backward;
      fromSeed.insert(op.getResults().begin(), op.getResults().end());
    }
    auto counted = dyn_cast<FlopCountOpInterface>(op);
    if (!counted)
      continue;
    int64_t flops = counted.getFlopCount();
    count.byOp[phase][op.getName().getStringRef()] += flops;
    count.total[phase] += flops;
  }
  return count;
}
