//===- ForwardSums.cpp - All-reducing a step's forward sums ---------------===//

#include "compiler/Transforms/ForwardSums.h"

#include "schema/StepBuffers.h"

#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mlir::dflash;

namespace dflash {

SmallVector<Value> allReduceForwardSums(OpBuilder &b, Location loc,
                                        ArrayRef<Value> sums) {
  const size_t lossIndex = size_t(ForwardSum::LossSum);
  // Per GPU, sum(w) / sum(w cov) is not the global ratio that "covered"
  // divides by, so the objective waits for the global sums.
  SelectorObjectiveOp objective;
  if (lossIndex < sums.size())
    objective = sums[lossIndex].getDefiningOp<SelectorObjectiveOp>();
  SmallVector<Value> reduce(sums);
  if (objective) {
    reduce[lossIndex] = objective.getUnarySum();
    for (Value v : {objective.getSelectorSum(), objective.getWeightSum(),
                    objective.getCoveredWeight()})
      if (!llvm::is_contained(reduce, v))
        reduce.push_back(v);
  }
  auto allReduce =
      AllReduceOp::create(b, loc, ValueRange(reduce).getTypes(), reduce);
  if (objective)
    objective->moveAfter(allReduce);
  // In place: the ops after it read the global sums, not the bytes the
  // all-reduce overwrote.
  for (auto [i, v] : llvm::enumerate(reduce))
    v.replaceUsesWithIf(allReduce.getResult(unsigned(i)), [&](OpOperand &use) {
      Operation *user = use.getOwner();
      return user != allReduce && user->getBlock() == allReduce->getBlock() &&
             allReduce->isBeforeInBlock(user);
    });
  b.setInsertionPointAfter(objective ? objective.getOperation()
                                     : allReduce.getOperation());
  SmallVector<Value> global;
  for (size_t i = 0; i < sums.size(); ++i)
    global.push_back(objective && i == lossIndex
                         ? objective.getResult()
                         : allReduce.getResult(unsigned(i)));
  return global;
}

} // namespace dflash
