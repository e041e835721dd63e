//===- RecomputeActivations.cpp - Cheap activations again in backward -----===//
//
// Trades one memory-bound pass for one stored tensor: a forward rms_norm,
// qk_norm_rope or swiglu whose result the backward pass reads is cloned
// right before its first backward reader, and the backward readers use the
// clone. The forward pass ends at lm_head_ce_fused (it computes the loss and
// the first gradient); what follows is the backward pass and the optimizer.
// The clones' inputs are live there already: the ops' own gradients read
// them.
//
//===----------------------------------------------------------------------===//

#include "compiler/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace dflash {
#define GEN_PASS_DEF_RECOMPUTEACTIVATIONS
#include "compiler/Transforms/Passes.h.inc"
} // namespace dflash

using namespace mlir;
using namespace mlir::dflash;

namespace {

struct RecomputeActivationsPass
    : public ::dflash::impl::RecomputeActivationsBase<
          RecomputeActivationsPass> {
  using RecomputeActivationsBase::RecomputeActivationsBase;
  void runOnOperation() override;
};

/// Whether an op is worth recomputing: row-wise, one pass over memory, and
/// its inputs are read by its own gradient anyway.
bool recomputable(Operation &op) {
  return isa<RmsNormOp, QkNormRopeOp, SwigluOp>(op);
}

void recomputeIn(func::FuncOp f) {
  Block &body = f.front();
  Operation *boundary = nullptr;
  for (Operation &op : body)
    if (isa<LmHeadCeFusedOp>(op)) {
      boundary = &op;
      break;
    }
  if (!boundary)
    return;
  SmallVector<Operation *> forward;
  for (Operation &op : body) {
    if (&op == boundary)
      break;
    if (recomputable(op))
      forward.push_back(&op);
  }
  for (Operation *op : forward) {
    Value result = op->getResult(0);
    SmallVector<OpOperand *> backwardUses;
    Operation *first = nullptr;
    for (OpOperand &use : result.getUses()) {
      Operation *user = use.getOwner();
      if (!boundary->isBeforeInBlock(user))
        continue;
      backwardUses.push_back(&use);
      if (!first || user->isBeforeInBlock(first))
        first = user;
    }
    if (!first)
      continue;
    OpBuilder b(first);
    Operation *again = b.clone(*op);
    for (OpOperand *use : backwardUses)
      use->set(again->getResult(0));
  }
}

void RecomputeActivationsPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (!enabled && !module->hasAttr(kRecomputeActivationsAttrName))
    return;
  for (func::FuncOp f : module.getOps<func::FuncOp>())
    if (!f.isExternal())
      recomputeIn(f);
}

} // namespace
