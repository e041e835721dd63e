//===- InterleaveMicroBatches.cpp - One micro-batch at a time -------------===//
//
// With gradient accumulation the importer builds the forward graphs of the
// K micro-batches one after another, and the backward pass follows them
// all: every micro-batch's activations would be live at once. This pass
// reorders the step so that each micro-batch runs its forward and its
// backward before the next one starts, and its activations die there.
//
// An op's micro-batch is the latest one it reads (a row slice of rows
// [m B, (m + 1) B) starts micro-batch m; what reads none, such as the
// step's labels and loss seed, comes first). Micro-batches run last rows
// first, K-1 down to 0, the order the backward pass already adds their
// gradients in: the accumulation chains read straight through. The order
// is a stable sort of the op list by (position, index), so it stays
// topological: an op's position is at least that of each op it reads, and
// within a position the original order holds.
//
//===----------------------------------------------------------------------===//

#include "compiler/Transforms/Passes.h"

#include "llvm/ADT/DenseMap.h"

#include <algorithm>

namespace dflash {
#define GEN_PASS_DEF_INTERLEAVEMICROBATCHES
#include "compiler/Transforms/Passes.h.inc"
} // namespace dflash

using namespace mlir;
using namespace mlir::dflash;

namespace {

struct InterleaveMicroBatchesPass
    : public ::dflash::impl::InterleaveMicroBatchesBase<
          InterleaveMicroBatchesPass> {
  void runOnOperation() override;
};

/// Where a row slice starts its micro-batch in the new order (0 runs
/// first), or an error when the slices do not cut the step into K equal
/// micro-batches.
FailureOr<int64_t> positionOf(RowSliceOp slice, int64_t &numMicroBatches) {
  int64_t rows = cast<RankedTensorType>(slice.getType()).getDimSize(0);
  int64_t total =
      cast<RankedTensorType>(slice.getInput().getType()).getDimSize(0);
  int64_t offset = slice.getOffset();
  if (total % rows != 0 || offset % rows != 0 ||
      (numMicroBatches && numMicroBatches != total / rows))
    return slice.emitOpError()
           << "takes rows [" << offset << ", " << offset + rows << ") of "
           << total << ": the micro-batches of a step must be equal row blocks";
  numMicroBatches = total / rows;
  return numMicroBatches - 1 - offset / rows;
}

LogicalResult interleave(func::FuncOp f) {
  Block &body = f.front();
  llvm::DenseMap<Operation *, int64_t> position;
  SmallVector<Operation *> ops;
  int64_t numMicroBatches = 0;
  for (Operation &op : body.without_terminator()) {
    int64_t p = -1; // before every micro-batch
    if (auto slice = dyn_cast<RowSliceOp>(op)) {
      FailureOr<int64_t> start = positionOf(slice, numMicroBatches);
      if (failed(start))
        return failure();
      p = *start;
    }
    for (Value v : op.getOperands())
      if (Operation *def = v.getDefiningOp())
        p = std::max(p, position.lookup(def));
    position[&op] = p;
    ops.push_back(&op);
  }
  if (numMicroBatches <= 1)
    return success();
  std::stable_sort(ops.begin(), ops.end(), [&](Operation *a, Operation *b) {
    return position.lookup(a) < position.lookup(b);
  });
  Operation *terminator = body.getTerminator();
  for (Operation *op : ops)
    op->moveBefore(terminator);
  return success();
}

void InterleaveMicroBatchesPass::runOnOperation() {
  for (func::FuncOp f : getOperation().getOps<func::FuncOp>())
    if (!f.isExternal() && failed(interleave(f)))
      return signalPassFailure();
}

} // namespace
