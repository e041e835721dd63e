//===- MemoryPlan.cpp - Sizes, aliases and lifetimes of step values -------===//

#include "compiler/Analysis/MemoryPlan.h"

#include "dialect/DFlashOps.h"

#include <algorithm>

namespace dflash {
using namespace mlir;
using namespace mlir::dflash;

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
  return (bucketResultOffsets(bucket).back() + tensorBytes(last.getType())) /
         4;
}

int64_t bucketSlotBytes(GradientBucketOp bucket) {
  int64_t bytes = bucketFlatElements(bucket) * 4;
  if (bucket.getWorldSizeAttr() && bucket.getShardElementsAttr())
    bytes = std::max(bytes, bucket.getWorldSizeAttr().getInt() *
                                bucket.getShardElementsAttr().getInt() * 4);
  return bytes;
}

int64_t lmHeadChunkRows(int64_t rows, int64_t vocab) {
  const int64_t maxBytes = int64_t(512) << 20;
  int64_t chunk = maxBytes / (vocab * 2);
  chunk = std::max<int64_t>(64, chunk / 64 * 64);
  return std::min(rows, chunk);
}

int64_t estimateWorkspaceBytes(func::FuncOp step) {
  int64_t most = 0;
  step.walk([&](Operation *op) {
    int64_t bytes = 0;
    if (auto grad = dyn_cast<BlockAttentionGradOp>(op)) {
      // fp32 dQ accumulator and one fp32 per query row.
      auto q = cast<RankedTensorType>(grad.getQuery().getType());
      int64_t rows = q.getNumElements() / q.getShape().back();
      bytes = q.getNumElements() * 4 + rows * 4;
    } else if (auto ce = dyn_cast<LmHeadCeFusedOp>(op)) {
      auto y = cast<RankedTensorType>(ce.getInput().getType());
      auto w = cast<RankedTensorType>(ce.getWeight().getType());
      int64_t rows = y.getNumElements() / y.getShape().back();
      bytes = lmHeadChunkRows(rows, w.getDimSize(0)) * w.getDimSize(0) * 2 +
              rows * 16;
    } else if (isa<RmsNormGradOp, RmsNormGradResidualOp, QkNormRopeGradOp>(
                   op)) {
      bytes = int64_t(4) << 20; // per-block partial sums of the weight grad
    } else if (auto adamw = dyn_cast<AdamWMultiOp>(op)) {
      int64_t elems = 0;
      for (Value p : adamw.getParams())
        elems += cast<RankedTensorType>(p.getType()).getNumElements();
      bytes = (elems / 16384 + adamw.getNumParams() + 1) * 64;
    } else if (auto sharded = dyn_cast<AdamWShardedOp>(op)) {
      // Pieces: at most one per parameter plus one per bucket boundary.
      int64_t elems = 0;
      for (Value m : sharded.getMasters())
        elems += cast<RankedTensorType>(m.getType()).getNumElements();
      bytes = (elems / 16384 + sharded.getNumParams() +
               sharded.getNumBuckets() + 1) *
              64;
    }
    most = std::max(most, bytes);
  });
  // cuBLASLt's workspace comes on top.
  return most + (int64_t(32) << 20);
}

} // namespace dflash
