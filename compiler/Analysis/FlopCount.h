//===- FlopCount.h - FLOPs of a step, by phase and op kind ------*- C++ -*-===//

#ifndef DFLASH_COMPILER_ANALYSIS_FLOPCOUNT_H
#define DFLASH_COMPILER_ANALYSIS_FLOPCOUNT_H

#include "schema/AttentionWork.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringRef.h"

namespace dflash {

/// FLOPs of every op of a step that implements FlopCountOpInterface, summed
/// by phase and op name. The phase follows from the data flow: optimizer ops
/// by kind; the backward pass is everything downstream of the loss gradient
/// (the `loss_sum_grad` argument or dflash.loss_stats' seed); the rest is
/// forward.
struct FlopCount {
  enum Phase { Forward = 0, Backward = 1, Optimizer = 2 };
  static constexpr const char *phaseNames[3] = {"forward", "backward",
                                                "optimizer"};
  llvm::MapVector<llvm::StringRef, int64_t> byOp[3];
  int64_t total[3] = {0, 0, 0};

  int64_t step() const { return total[0] + total[1] + total[2]; }

  static FlopCount of(mlir::func::FuncOp step);
};

/// The block attention of `step` by kind of layer (window, in-block
/// causality), for a trainer to count at the anchors it draws
/// (schema/AttentionWork.h): each kind's FLOPs as `of` counts them, and its
/// FLOPs per visible pair of one block of one of the step's `rows` rows (an
/// op over B of them, a micro-batch, weighs B / rows).
std::vector<AttentionKindFlops> attentionByKind(mlir::func::FuncOp step,
                                                int64_t rows);

} // namespace dflash

#endif // DFLASH_COMPILER_ANALYSIS_FLOPCOUNT_H
