//===- RecomputeActivations.cpp - Activations again in backward -----------===//
//
// Trades computation for stored tensors: a forward op whose result the
// backward pass reads is cloned right before its first backward reader, and
// the backward readers use the clone. Two kinds of op, each on its own
// switch:
// - the cheap ones (rms_norm, qk_norm_rope, swiglu): one memory-bound pass
//   each, and their inputs are live there already (their own gradients read
//   them);
// - the MLP's gate and up products (the linears a swiglu reads): two GEMMs
//   a layer, for the two largest tensors a layer keeps.
// A clone reads the clones of its recomputed inputs, which are moved before
// it where they came later, so the forward values die after the forward
// pass. The forward pass ends at lm_head_ce_fused (it computes the loss and
// the first gradient); what follows is the backward pass and the optimizer.
// With gradient accumulation each micro-batch has its own lm_head_ce_fused,
// which ends the forward ops after the one before it.
//
//===----------------------------------------------------------------------===//

#include "compiler/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <functional>

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

/// What to compute again.
struct Recompute {
  bool cheap = false;       ///< norms, q/k norm + RoPE, SwiGLU
  bool mlpProducts = false; ///< the gate and up linears
};

/// Whether a forward op is one `what` asks for: the cheap ops are row-wise
/// with their inputs read by their own gradients anyway; an MLP product is
/// a linear whose result a swiglu reads.
bool recomputable(Operation &op, Recompute what) {
  if (isa<RmsNormOp, QkNormRopeOp, SwigluOp>(op))
    return what.cheap;
  if (isa<LinearOp>(op) && what.mlpProducts)
    return llvm::any_of(op.getResult(0).getUsers(),
                        [](Operation *user) { return isa<SwigluOp>(user); });
  return false;
}

void recomputeIn(func::FuncOp f, Recompute what) {
  Block &body = f.front();
  // Each forward op with the lm_head_ce_fused that ends its forward pass:
  // the next one (one per micro-batch with gradient accumulation, which
  // dflash-interleave-micro-batches has put after its forward).
  SmallVector<std::pair<Operation *, Operation *>> forward;
  SmallVector<Operation *> pending;
  for (Operation &op : body) {
    if (isa<LmHeadCeFusedOp>(op)) {
      for (Operation *p : pending)
        forward.push_back({p, &op});
      pending.clear();
    } else if (recomputable(op, what)) {
      pending.push_back(&op);
    }
  }
  llvm::DenseMap<Value, Operation *> cloneOf; // forward result -> its clone
  llvm::SmallPtrSet<Operation *, 32> clones;
  // Moves a clone before `point`, and the clones it reads before it.
  std::function<void(Operation *, Operation *)> hoist = [&](Operation *clone,
                                                            Operation *point) {
    if (clone->isBeforeInBlock(point))
      return;
    clone->moveBefore(point);
    for (Value v : clone->getOperands())
      if (Operation *def = v.getDefiningOp(); def && clones.contains(def))
        hoist(def, clone);
  };
  for (auto [op, boundary] : forward) {
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
    clones.insert(again);
    for (OpOperand &operand : again->getOpOperands())
      if (auto known = cloneOf.find(operand.get()); known != cloneOf.end()) {
        hoist(known->second, again);
        operand.set(known->second->getResult(0));
      }
    for (OpOperand *use : backwardUses)
      use->set(again->getResult(0));
    cloneOf[result] = again;
  }
}

void RecomputeActivationsPass::runOnOperation() {
  ModuleOp module = getOperation();
  Recompute what;
  what.cheap = enabled || module->hasAttr(kRecomputeActivationsAttrName);
  what.mlpProducts =
      mlpProducts || module->hasAttr(kRecomputeMlpProductsAttrName);
  if (!what.cheap && !what.mlpProducts)
    return;
  for (func::FuncOp f : module.getOps<func::FuncOp>())
    if (!f.isExternal())
      recomputeIn(f, what);
}

} // namespace
