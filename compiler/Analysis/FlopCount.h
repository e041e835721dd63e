//===- FlopCount.h - FLOPs of a step, by op kind ----------------*- C++ -*-===//

#ifndef DFLASH_COMPILER_ANALYSIS_FLOPCOUNT_H
#define DFLASH_COMPILER_ANALYSIS_FLOPCOUNT_H

#include "mlir/IR/Operation.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringRef.h"

namespace dflash {

/// FLOPs of every op under `root` that implements FlopCountOpInterface,
/// summed by op name ("dflash.linear"), in first-seen order.
struct FlopCount {
  llvm::MapVector<llvm::StringRef, int64_t> byOp;
  int64_t total = 0;

  static FlopCount of(mlir::Operation *root);
};

} // namespace dflash

#endif // DFLASH_COMPILER_ANALYSIS_FLOPCOUNT_H
