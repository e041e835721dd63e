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
      if (info.getRole() == ArgRole::Input && info.getName() == "loss_sum_grad")
        fromSeed.insert(step.getArgument(i));
  for (Operation &op : step.front().without_terminator()) {
    Phase phase = Forward;
    if (auto fused = dyn_cast<LmHeadCeFusedOp>(op)) {
      // Its logits are the forward pass, its input gradient the backward.
      int64_t half = fused.getFlopCount() / 2;
      count.byOp[Forward][op.getName().getStringRef()] += half;
      count.byOp[Backward][op.getName().getStringRef()] += half;
      count.total[Forward] += half;
      count.total[Backward] += half;
      fromSeed.insert(fused.getInputGrad());
      continue;
    }
    if (isa<AllReduceOp, LossStatsOp, LossSeedOp, ConvertOp, GlobalNormOp,
            ClipCoefficientOp, LrScheduleOp, AdamWOp, AdamWMultiOp,
            AdamWShardedOp, GradientBucketOp>(op)) {
      phase = Optimizer;
      if (auto stats = dyn_cast<LossStatsOp>(op))
        fromSeed.insert(stats.getLossSumGrad());
      if (auto seed = dyn_cast<LossSeedOp>(op))
        fromSeed.insert(seed.getLossSumGrad());
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

namespace dflash {
std::vector<AttentionKindFlops> attentionByKind(func::FuncOp step,
                                                int64_t rows) {
  std::vector<AttentionKindFlops> kinds;
  auto add = [&](auto op) {
    AttentionKindFlops kind;
    kind.window = op.getWindowAttr() ? op.getWindowAttr().getInt() : 0;
    kind.causal = op.getCausal();
    auto it = llvm::find_if(kinds, [&](const AttentionKindFlops &k) {
      return k.window == kind.window && k.causal == kind.causal;
    });
    if (it == kinds.end())
      it = kinds.insert(kinds.end(), kind);
    const int64_t batch = op.getQuery().getType().getDimSize(0);
    it->counted += double(op.getFlopCount());
    it->perPair +=
        blockAttentionFlopsPerPair(op) * double(batch) / double(rows);
  };
  step.walk([&](Operation *op) {
    if (auto fwd = dyn_cast<BlockAttentionOp>(op))
      add(fwd);
    else if (auto grad = dyn_cast<BlockAttentionGradOp>(op))
      add(grad);
  });
  return kinds;
}
} // namespace dflash
