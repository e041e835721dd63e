//===- ForwardSums.h - All-reducing a step's forward sums -------*- C++ -*-===//
//
// The training step (dflash-append-optimizer) and the evaluation program
// (dflash-make-eval-program) both sum the forward graph's sums over the
// GPUs in one dflash.all_reduce. One rule applies to both, so it is written
// once here: a DFlash2 drafter's loss sum is not a sum but its selector
// objective of sums (docs/semantics.md section 13, "Loss", where the sums
// are global), so the objective's own operands are reduced and it is
// computed from the global ones after the all-reduce.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_TRANSFORMS_FORWARDSUMS_H
#define DFLASH_COMPILER_TRANSFORMS_FORWARDSUMS_H

#include "dialect/DFlashOps.h"

#include "mlir/IR/Builders.h"

namespace dflash {

/// All-reduces `sums` (ForwardSum order, values of one block) at `b`'s
/// insertion point and returns the global sums in the same order, leaving
/// `b` after the ops that make them. The all-reduce sums in place, so every
/// later op of the block that reads a reduced value reads the global one. A
/// loss sum made by dflash.selector_objective moves after the all-reduce,
/// which reduces its unary and selector sums, sum(w) and sum(w cov) instead.
llvm::SmallVector<mlir::Value>
allReduceForwardSums(mlir::OpBuilder &b, mlir::Location loc,
                     llvm::ArrayRef<mlir::Value> sums);

} // namespace dflash

#endif // DFLASH_COMPILER_TRANSFORMS_FORWARDSUMS_H
