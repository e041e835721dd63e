//===- MemoryPlan.cpp - Sizes, aliases and lifetimes of step values -------===//

#include "compiler/Analysis/MemoryPlan.h"

#include "dialect/DFlashOps.h"

#include <algorithm>

namespace dflash {
using namespace mlir;
using namespace mlir::dflash;

/// Whether `op` is the last op that reads `v`, and reads it once: a value
/// that an op computed into storage of its own (not an argument or an
/// alias), so that op may write over it.
static bool isLastReadBy(Value v, Operation *op) {
  if (isa<BlockArgument>(v) || storageRoot(v) != v)
    return false;
  unsigned uses = 0;
  for (OpOperand &use : v.getUses()) {
    Operation *user = use.getOwner();
    if (user == op)
      ++uses;
    else if (user->getBlock() != op->getBlock() || !user->isBeforeInBlock(op))
      return false;
  }
  return uses == 1;
}

int64_t tensorBytes(Type type) {
  auto t = cast<RankedTensorType>(type);
  int64_t bits = t.getElementType().getIntOrFloatBitWidth();
  return t.getNumElements() * std::max<int64_t>(1, bits / 8);
}

Value storageRoot(Value v) {
  while (true) {
    auto result = dyn_cast<OpResult>(v);
    if (!result)
      return v;
    Operation *op = result.getOwner();
    if (auto reshape = dyn_cast<ReshapeOp>(op)) {
      v = reshape.getInput();
    } else if (auto reduce = dyn_cast<AllReduceOp>(op)) {
      // Collectives sum in place.
      v = reduce.getInputs()[result.getResultNumber()];
    } else if (auto acc = dyn_cast<AccumulateLinearGradOp>(op)) {
      // beta = 1 GEMM into the accumulator, when nothing else reads it.
      Value a = acc.getAccumulator();
      if (isa<BlockArgument>(a) || !a.hasOneUse())
        return v;
      v = a;
    } else if (auto sum = dyn_cast<LinearResidualOp>(op)) {
      // The same into the residual.
      Value r = sum.getResidual();
      if (isa<BlockArgument>(r) || !r.hasOneUse())
        return v;
      v = r;
    } else if (auto grad = dyn_cast<SwigluGradOp>(op)) {
      // Elementwise, each element read before it is written: the gate's and
      // the up's gradients over the gate and the up, where this op reads
      // them last.
      Value in = result.getResultNumber() == 0 ? grad.getGate() : grad.getUp();
      if (!isLastReadBy(in, op) || in.getType() != v.getType())
        return v;
      v = in;
    } else if (auto adamw = dyn_cast<AdamWMultiOp>(op)) {
      unsigned i = result.getResultNumber();
      unsigned n = adamw.getNumParams();
      if (i >= 4 * n)
        return v;
      ValueRange groups[] = {adamw.getParams(), adamw.getMasters(),
                             adamw.getMoment1(), adamw.getMoment2()};
      v = groups[i / n][i % n];
    } else if (auto sharded = dyn_cast<AdamWShardedOp>(op)) {
      unsigned i = result.getResultNumber();
      unsigned n = sharded.getNumParams(), k = sharded.getNumBuckets();
      if (i >= n + 3 * k)
        return v;
      if (i < n) {
        v = sharded.getParams()[i];
      } else {
        ValueRange groups[] = {sharded.getMasters(), sharded.getMoment1(),
                               sharded.getMoment2()};
        v = groups[(i - n) / k][(i - n) % k];
      }
    } else {
      return v;
    }
  }
}

SmallVector<int64_t> bucketResultOffsets(GradientBucketOp bucket) {
  SmallVector<int64_t> offsets;
  int64_t bytes = 0;
  for (Value r : bucket.getResults()) {
    offsets.push_back(bytes);
    int64_t size = tensorBytes(r.getType());
    bytes += (size + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  }
  return offsets;
}

int64_t bucketFlatElements(GradientBucketOp bucket) {
  Value last = bucket.getResults().back();
  return (bucketResultOffsets(bucket).back() + tensorBytes(last.getType())) / 4;
}

int64_t bucketSlotBytes(GradientBucketOp bucket) {
  int64_t bytes = bucketFlatElements(bucket) * 4;
  if (bucket.getWorldSizeAttr() && bucket.getShardElementsAttr())
    bytes = std::max(bytes, bucket.getWorldSizeAttr().getInt() *
                                bucket.getShardElementsAttr().getInt() * 4);
  return bytes;
}

KernelAttr kernelOf(Operation *op) {
  return op->getAttrOfType<KernelAttr>(kKernelAttrName);
}

} // namespace dflash
