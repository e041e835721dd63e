//===- FlopCount.cpp - FLOPs of a step, by op kind ------------------------===//

#include "compiler/Analysis/FlopCount.h"

#include "dialect/DFlashOps.h"

using namespace dflash;

FlopCount FlopCount::of(mlir::Operation *root) {
  FlopCount count;
  root->walk([&](mlir::dflash::FlopCountOpInterface op) {
    int64_t flops = op.getFlopCount();
    count.byOp[op->getName().getStringRef()] += flops;
    count.total += flops;
  });
  return count;
}
