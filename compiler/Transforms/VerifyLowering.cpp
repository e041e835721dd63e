//===- VerifyLowering.cpp - Only translatable ops reach the emitter -------===//
//
// Every op of a lowered program must have a kernel and a memory plan, and
// the plan must hold when the program runs in order (checkPlannedArena: no
// value is read after another was planned over its bytes).
//
//===----------------------------------------------------------------------===//

#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Analysis/StepSignature.h"
#include "compiler/Transforms/Passes.h"

namespace dflash {
#define GEN_PASS_DEF_VERIFYLOWERING
#include "compiler/Transforms/Passes.h.inc"
} // namespace dflash

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace {

struct VerifyLoweringPass
    : public ::dflash::impl::VerifyLoweringBase<VerifyLoweringPass> {
  void runOnOperation() override {
    FailureOr<StepSignature> sig = StepSignature::get(getOperation());
    if (failed(sig))
      return signalPassFailure();
    bool ok = true;
    for (Operation &op : sig->func().front().without_terminator()) {
      bool isDFlash = op.getDialect() ==
                      sig->func()->getContext()->getLoadedDialect("dflash");
      // Graph-level ops that dflash-fuse-kernels groups into a kernel.
      // (An lm_head_ce without its gradient, as an evaluation has, runs
      // as it is.)
      // (embed and rope run alone in a target decoder, which has no draft
      // tokens and, in Llama, no q/k norms.)
      if (isa<DraftTokensOp, RopeGradOp, LmHeadCeGradOp, ConvertOp,
              GlobalNormOp, ClipCoefficientOp, LrScheduleOp, AdamWOp>(op) ||
          !isDFlash) {
        if (isDFlash)
          op.emitOpError("has no kernel: it must be grouped by "
                         "dflash-fuse-kernels before translation to CUDA");
        else
          op.emitOpError("has no kernel: only dflash ops translate to CUDA");
        ok = false;
        continue;
      }
      auto offsets = op.getAttrOfType<DenseI64ArrayAttr>(kOffsetsAttrName);
      if (!offsets) {
        op.emitOpError("has no memory plan: run dflash-plan-memory before "
                       "translation to CUDA");
        ok = false;
      } else if (offsets.size() != int64_t(op.getNumResults())) {
        op.emitOpError() << "has a memory plan of " << offsets.size()
                         << " offsets, not one per result ("
                         << op.getNumResults() << ")";
        ok = false;
      }
    }
    if (ok && failed(checkPlannedArena(sig->func())))
      ok = false;
    if (!ok)
      signalPassFailure();
  }
};

} // namespace
