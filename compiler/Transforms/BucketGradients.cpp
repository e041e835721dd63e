//===- BucketGradients.cpp - fp32 gradient buckets for the all-reduce -----===//
//
// The optimizer needs every gradient in fp32 and summed over the GPUs. One
// collective per parameter would pay the latency of dozens of small
// all-reduces; one for all of them would start only when the backward pass
// ends. So gradients are grouped into buckets of about `bucket-mib` MiB of
// fp32, in the order the backward pass finishes them (last layer first), and
// each bucket is placed right after its last gradient: its all-reduce can
// then run while the backward pass computes the next bucket.
//
//===----------------------------------------------------------------------===//

#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Analysis/StepSignature.h"
#include "compiler/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"

#include <algorithm>

namespace dflash {
#define GEN_PASS_DEF_BUCKETGRADIENTS
#include "compiler/Transforms/Passes.h.inc"
} // namespace dflash

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace {

struct BucketGradientsPass
    : public ::dflash::impl::BucketGradientsBase<BucketGradientsPass> {
  using BucketGradientsBase::BucketGradientsBase;
  void runOnOperation() override;
};

void BucketGradientsPass::runOnOperation() {
  ModuleOp module = getOperation();
  FailureOr<StepSignature> sig = StepSignature::get(module);
  if (failed(sig))
    return signalPassFailure();
  AdamWMultiOp adamw;
  sig->func().walk([&](AdamWMultiOp op) { adamw = op; });
  if (!adamw) {
    module.emitError("@step has no dflash.adamw_multi: run "
                     "dflash-fuse-kernels before dflash-bucket-gradients");
    return signalPassFailure();
  }
  int64_t mib = bucketMiB;
  if (mib <= 0)
    if (auto attr = module->getAttrOfType<IntegerAttr>("dflash.bucket_mib"))
      mib = attr.getInt();
  if (mib <= 0)
    mib = 64;
  const int64_t bucketBytes = mib << 20;

  // Gradients in the order they are final.
  llvm::DenseMap<Operation *, int64_t> index;
  int64_t n = 0;
  for (Operation &op : sig->func().front())
    index[&op] = n++;
  struct Grad {
    unsigned param;
    Value value;
    int64_t ready;
  };
  std::vector<Grad> grads;
  for (auto [i, g] : llvm::enumerate(adamw.getGrads())) {
    if (!cast<RankedTensorType>(g.getType()).getElementType().isBF16()) {
      adamw.emitOpError() << "expects bf16 gradients, but gradient " << i
                          << " is " << g.getType()
                          << ": each gradient is bucketed once";
      return signalPassFailure();
    }
    Operation *def = g.getDefiningOp();
    grads.push_back({unsigned(i), g, def ? index[def] : -1});
  }
  std::stable_sort(
      grads.begin(), grads.end(),
      [](const Grad &a, const Grad &b) { return a.ready < b.ready; });

  SmallVector<Value> newGrads(adamw.getGrads().begin(), adamw.getGrads().end());
  OpBuilder b(module.getContext());
  size_t start = 0;
  while (start < grads.size()) {
    size_t end = start;
    int64_t bytes = 0;
    do {
      auto t = cast<RankedTensorType>(grads[end].value.getType());
      bytes += t.getNumElements() * 4;
      ++end;
    } while (end < grads.size() && bytes < bucketBytes);
    // After the last gradient of the bucket (or at the start when every
    // gradient is an argument).
    Value last = grads[end - 1].value;
    if (Operation *def = last.getDefiningOp())
      b.setInsertionPointAfter(def);
    else
      b.setInsertionPointToStart(&sig->func().front());
    SmallVector<Value> operands;
    SmallVector<Type> types;
    for (size_t i = start; i < end; ++i) {
      auto t = cast<RankedTensorType>(grads[i].value.getType());
      operands.push_back(grads[i].value);
      types.push_back(RankedTensorType::get(t.getShape(), b.getF32Type()));
    }
    auto bucket = GradientBucketOp::create(b, last.getLoc(), types, operands);
    for (size_t i = start; i < end; ++i)
      newGrads[grads[i].param] = bucket.getResult(i - start);
    start = end;
  }
  adamw.getGradsMutable().assign(newGrads);
}

} // namespace
