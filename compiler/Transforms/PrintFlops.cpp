//===- PrintFlops.cpp - Print the FLOPs of the step -----------------------===//

#include "compiler/Analysis/FlopCount.h"
#include "compiler/Analysis/StepSignature.h"
#include "compiler/Transforms/Passes.h"

#include "llvm/Support/raw_ostream.h"

namespace dflash {
#define GEN_PASS_DEF_PRINTFLOPS
#include "compiler/Transforms/Passes.h.inc"
} // namespace dflash

using namespace mlir;
using namespace ::dflash;

namespace {

struct PrintFlopsPass : public ::dflash::impl::PrintFlopsBase<PrintFlopsPass> {
  void runOnOperation() override {
    FailureOr<StepSignature> sig = StepSignature::get(getOperation());
    if (failed(sig))
      return signalPassFailure();
    FlopCount flops = FlopCount::of(sig->func());
    llvm::raw_ostream &os = llvm::outs();
    for (int p = 0; p < 3; ++p)
      for (auto &[op, n] : flops.byOp[p])
        os << "flops " << FlopCount::phaseNames[p] << " " << op << " " << n
           << "\n";
    os << "flops total forward=" << flops.total[FlopCount::Forward]
       << " backward=" << flops.total[FlopCount::Backward]
       << " optimizer=" << flops.total[FlopCount::Optimizer]
       << " step=" << flops.step() << "\n";
  }
};

} // namespace
