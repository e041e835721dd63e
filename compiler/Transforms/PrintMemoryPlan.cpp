//===- PrintMemoryPlan.cpp - Print the arena plan of the step -------------===//

#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Analysis/StepSignature.h"
#include "compiler/Transforms/Passes.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/raw_ostream.h"

namespace dflash {
#define GEN_PASS_DEF_PRINTMEMORYPLAN
#include "compiler/Transforms/Passes.h.inc"
} // namespace dflash

using namespace mlir;
using namespace ::dflash;

namespace {

struct PrintMemoryPlanPass
    : public ::dflash::impl::PrintMemoryPlanBase<PrintMemoryPlanPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<StepSignature> sig = StepSignature::get(module);
    if (failed(sig))
      return signalPassFailure();
    auto arena = module->getAttrOfType<IntegerAttr>(kArenaBytesAttrName);
    if (!arena) {
      module.emitError("the module has no memory plan: run "
                       "dflash-plan-memory first");
      return signalPassFailure();
    }
    Block &body = sig->func().front();
    llvm::DenseMap<Operation *, int64_t> index;
    int64_t n = 0;
    for (Operation &op : body)
      index[&op] = n++;
    // Each root once: its defining op, offset, size and live range.
    llvm::DenseMap<Value, int64_t> last;
    for (Operation &op : body)
      for (Value v : op.getOperands()) {
        Value root = storageRoot(v);
        last[root] = std::max(last.lookup(root), index[&op]);
      }
    llvm::raw_ostream &os = llvm::outs();
    int64_t liveBytes = 0, peak = 0;
    for (Operation &op : body.without_terminator()) {
      auto offsets = op.getAttrOfType<DenseI64ArrayAttr>(kOffsetsAttrName);
      for (auto [i, r] : llvm::enumerate(op.getResults())) {
        if (storageRoot(r) != r || !offsets || offsets[i] < 0)
          continue;
        int64_t bytes = tensorBytes(r.getType());
        os << "slot " << op.getName().getStringRef() << "#" << i
           << " offset=" << offsets[i] << " size=" << bytes << " live=["
           << index[&op] << ", " << last.lookup(r) << "]\n";
      }
    }
    // The peak of live bytes, for comparison with the arena size.
    for (Operation &op : body) {
      liveBytes = 0;
      int64_t at = index[&op];
      for (auto &[root, end] : last)
        if (auto res = dyn_cast<OpResult>(root))
          if (index.lookup(res.getOwner()) <= at && at <= end)
            liveBytes += tensorBytes(root.getType());
      peak = std::max(peak, liveBytes);
    }
    os << "arena " << arena.getInt() << " bytes, peak live " << peak
       << " bytes\n";
  }
};

} // namespace
