//===- PrintKernels.cpp - Print each op's kernel --------------------------===//

#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Analysis/StepSignature.h"
#include "compiler/Transforms/Passes.h"

#include "llvm/Support/raw_ostream.h"

namespace dflash {
#define GEN_PASS_DEF_PRINTKERNELS
#include "compiler/Transforms/Passes.h.inc"
} // namespace dflash

using namespace mlir;
using namespace ::dflash;

namespace {

struct PrintKernelsPass
    : public ::dflash::impl::PrintKernelsBase<PrintKernelsPass> {
  void runOnOperation() override {
    FailureOr<StepSignature> sig = StepSignature::get(getOperation());
    if (failed(sig))
      return signalPassFailure();
    llvm::raw_ostream &os = llvm::outs();
    for (Operation &op : sig->func().front().without_terminator()) {
      mlir::dflash::KernelAttr kernel = kernelOf(&op);
      if (!kernel)
        continue;
      os << "kernel " << op.getName().getStringRef() << " " << kernel.getName()
         << "[";
      llvm::interleaveComma(kernel.getConstants().asArrayRef(), os);
      os << "] workspace=" << kernel.getWorkspace()
         << " tables=" << kernel.getTables();
      if (auto name = dyn_cast<NameLoc>(op.getLoc()))
        os << " at " << name.getName().getValue();
      os << "\n";
    }
  }
};

} // namespace
