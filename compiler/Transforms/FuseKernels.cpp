//===- FuseKernels.cpp - Group graph ops into kernels ---------------------===//
//
// Rewrites the training step so that every op left is one kernel of
// kernels/ (or one cuBLASLt call). The groups:
// - draft_tokens + embed                  -> draft_embed
// - add(residual, linear)                 -> linear_residual (beta = 1):
//   first, so that the add a norm follows is gone and the norm reads one
//   tensor instead of two (the linear's output is never stored)
// - swiglu(linear(x, Wg), linear(x, Wu))  -> linear_swiglu: one GEMM
//   applies SwiGLU to its fp32 products (kernels/SwiGluGemm.cuh), where
//   nothing else reads them (the target's MLP; the drafter's backward reads
//   its own) and the kernel takes the shape; only when asked (`[memory]
//   fuse_target_mlp`): it saves memory, not time
// - swiglu(grouped_linear(x, Wg), grouped_linear(x, Wu))
//                                         -> grouped_linear_swiglu: the
//   same for a mixture-of-experts' experts, always (both are our kernels;
//   kernels/Moe.cuh), where the grouped GEMM takes the shape
// - add (residual) + rms_norm             -> residual_rms_norm
// - rms_norm (per head) + rope            -> qk_norm_rope
// - rope_grad + rms_norm_grad             -> qk_norm_rope_grad
// - add(g, rms_norm_grad) (residual grad) -> rms_norm_grad_residual
// - add(g, linear_grad_*)                 -> accumulate_linear_grad (beta=1)
// - lm_head_ce + lm_head_ce_grad          -> loss_seed + lm_head_ce_fused:
//   the seed 1/sum(w) only needs the weights, so it is computed first and
//   the logits of each chunk are made once, for the loss and the gradient;
//   micro-batches (gradient accumulation) share one seed over the step's
//   weights, of which theirs are row slices
// - lm_head_ce (+ lm_head_ce_grad) + selector_candidates of the same
//   operands, multiplier 1 and no softcap (a DFlash2 drafter's top-K of
//   its unary logits, which are CE_u's)
//                                         -> lm_head_ce_fused {top_k}, or
//   lm_head_ce_top_k without the gradient (an evaluation): the top-K comes
//   from the logits the loss makes anyway, not from a second lm_head GEMM
// - convert, all_reduce, global_norm, clip_coefficient, lr_schedule and
//   one adamw per parameter               -> adamw_multi
// Each rewrite needs the intermediate values to have no other use, so no
// value is computed twice and nothing the backward pass reads disappears.
//
//===----------------------------------------------------------------------===//

#include "compiler/Analysis/StepSignature.h"
#include "compiler/Transforms/Passes.h"
#include "kernels/GemmLimits.h"
#include "kernels/Workspaces.h"

#include "mlir/IR/Builders.h"

namespace dflash {
#define GEN_PASS_DEF_FUSEKERNELS
#include "compiler/Transforms/Passes.h.inc"
} // namespace dflash

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace {

struct FuseKernelsPass
    : public ::dflash::impl::FuseKernelsBase<FuseKernelsPass> {
  using FuseKernelsBase::FuseKernelsBase;
  void runOnOperation() override;
};

template <typename OpTy> OpTy singleUser(Value v) {
  if (!v.hasOneUse())
    return nullptr;
  return dyn_cast<OpTy>(*v.getUsers().begin());
}

/// The other operand of a binary add, given one of them.
Value otherOperand(AddOp add, Value one) {
  return add.getLhs() == one ? add.getRhs() : add.getLhs();
}

void fuseDraftEmbed(func::FuncOp step) {
  step.walk([](EmbedOp embed) {
    auto tokens = embed.getIds().getDefiningOp<DraftTokensOp>();
    if (!tokens || !tokens.getResult().hasOneUse())
      return;
    OpBuilder b(embed);
    // A DFlash2 drafter's scale goes with it (docs/semantics.md section 13).
    Value x = DraftEmbedOp::create(
        b, embed.getLoc(), embed.getType(), embed.getTable(),
        tokens.getInputIds(), tokens.getAnchors(), tokens.getKeep(),
        tokens.getBlockSizeAttr(), tokens.getMaskTokenIdAttr(),
        embed.getScaleAttr());
    embed.getResult().replaceAllUsesWith(x);
    embed.erase();
    tokens.erase();
  });
}

void fuseLinearResidual(func::FuncOp step) {
  step.walk([](AddOp add) {
    for (Value side : {add.getRhs(), add.getLhs()}) {
      auto linear = side.getDefiningOp<LinearOp>();
      if (!linear || !side.hasOneUse())
        continue;
      OpBuilder b(add);
      Value sum = LinearResidualOp::create(
          b, add.getLoc(), add.getType(), otherOperand(add, side),
          linear.getInput(), linear.getWeight());
      add.getResult().replaceAllUsesWith(sum);
      add.erase();
      linear.erase();
      return;
    }
  });
}

void fuseLinearSwiglu(func::FuncOp step) {
  step.walk([](SwigluOp swiglu) {
    auto gate = swiglu.getGate().getDefiningOp<LinearOp>();
    auto up = swiglu.getUp().getDefiningOp<LinearOp>();
    if (!gate || !up || gate.getInput() != up.getInput() ||
        !gate.getResult().hasOneUse() || !up.getResult().hasOneUse())
      return;
    auto wg = cast<RankedTensorType>(gate.getWeight().getType());
    auto wu = cast<RankedTensorType>(up.getWeight().getType());
    if (wg.getShape() != wu.getShape() || !wg.getElementType().isBF16() ||
        !kernels::swigluGemmSupportsShape(wg.getDimSize(0), wg.getDimSize(1)))
      return;
    OpBuilder b(swiglu);
    Value y = LinearSwigluOp::create(b, swiglu.getLoc(), swiglu.getType(),
                                     gate.getInput(), gate.getWeight(),
                                     up.getWeight());
    swiglu.getResult().replaceAllUsesWith(y);
    swiglu.erase();
    gate.erase();
    up.erase();
  });
}

/// The gate and up grouped GEMMs (with their biases, if any) and their
/// activation, SwiGLU or gpt-oss's clamped form, as one grouped GEMM.
void fuseGroupedLinearSwiglu(func::FuncOp step) {
  step.walk([](Operation *act) {
    auto plain = dyn_cast<SwigluOp>(act);
    auto clamped = dyn_cast<ClampedSwigluOp>(act);
    if (!plain && !clamped)
      return;
    auto gate = act->getOperand(0).getDefiningOp<GroupedLinearOp>();
    auto up = act->getOperand(1).getDefiningOp<GroupedLinearOp>();
    if (!gate || !up || gate.getInput() != up.getInput() ||
        gate.getOffsets() != up.getOffsets() || !gate.getResult().hasOneUse() ||
        !up.getResult().hasOneUse() ||
        bool(gate.getBias()) != bool(up.getBias()))
      return;
    auto w = cast<RankedTensorType>(gate.getWeight().getType());
    if (w != up.getWeight().getType() || !w.getElementType().isBF16() ||
        !kernels::groupedGemmSupportsShape(w.getDimSize(0), w.getDimSize(1),
                                           w.getDimSize(2)))
      return;
    OpBuilder b(act);
    Value y = GroupedLinearSwigluOp::create(
        b, act->getLoc(), act->getResult(0).getType(), gate.getInput(),
        gate.getWeight(), up.getWeight(), gate.getOffsets(), gate.getBias(),
        up.getBias(), clamped ? clamped.getAlphaAttr() : FloatAttr(),
        clamped ? clamped.getLimitAttr() : FloatAttr());
    act->getResult(0).replaceAllUsesWith(y);
    act->erase();
    gate.erase();
    up.erase();
  });
}

void fuseResidualNorm(func::FuncOp step) {
  step.walk([](RmsNormOp norm) {
    auto add = norm.getInput().getDefiningOp<AddOp>();
    if (!add)
      return;
    OpBuilder b(norm);
    auto fused = ResidualRmsNormOp::create(
        b, norm.getLoc(), add.getType(), norm.getType(), add.getLhs(),
        add.getRhs(), norm.getWeight(), norm.getEpsAttr());
    add.getResult().replaceAllUsesWith(fused.getSum());
    norm.getResult().replaceAllUsesWith(fused.getResult());
    norm.erase();
    add.erase();
  });
}

void fuseQkNormRope(func::FuncOp step) {
  step.walk([](RopeOp rope) {
    auto norm = rope.getInput().getDefiningOp<RmsNormOp>();
    if (!norm || !norm.getResult().hasOneUse())
      return;
    OpBuilder b(rope);
    Value y = QkNormRopeOp::create(b, rope.getLoc(), rope.getType(),
                                   norm.getInput(), norm.getWeight(),
                                   rope.getPositions(), norm.getEpsAttr(),
                                   rope.getThetaAttr(), rope.getYarnAttr());
    rope.getResult().replaceAllUsesWith(y);
    rope.erase();
    norm.erase();
  });
  step.walk([](RmsNormGradOp normGrad) {
    auto ropeGrad = normGrad.getGrad().getDefiningOp<RopeGradOp>();
    if (!ropeGrad || !ropeGrad.getResult().hasOneUse())
      return;
    OpBuilder b(normGrad);
    auto fused = QkNormRopeGradOp::create(
        b, normGrad.getLoc(), normGrad.getInputGrad().getType(),
        normGrad.getWeightGrad().getType(), ropeGrad.getGrad(),
        normGrad.getInput(), normGrad.getWeight(), ropeGrad.getPositions(),
        normGrad.getEpsAttr(), ropeGrad.getThetaAttr(), ropeGrad.getYarnAttr());
    normGrad.getInputGrad().replaceAllUsesWith(fused.getInputGrad());
    normGrad.getWeightGrad().replaceAllUsesWith(fused.getWeightGrad());
    normGrad.erase();
    ropeGrad.erase();
  });
}

void fuseResidualNormGrad(func::FuncOp step) {
  step.walk([](AddOp add) {
    for (Value side : {add.getLhs(), add.getRhs()}) {
      // The norm's input gradient (not its weight's, which micro-batches
      // add up with gradient accumulation).
      auto normGrad = side.getDefiningOp<RmsNormGradOp>();
      if (!normGrad || side != normGrad.getInputGrad() || !side.hasOneUse())
        continue;
      Value residual = otherOperand(add, side);
      // The residual gradient must exist before the norm's gradient op.
      if (Operation *def = residual.getDefiningOp())
        if (!def->isBeforeInBlock(normGrad))
          continue;
      OpBuilder b(normGrad);
      auto fused = RmsNormGradResidualOp::create(
          b, normGrad.getLoc(), normGrad.getInputGrad().getType(),
          normGrad.getWeightGrad().getType(), normGrad.getGrad(),
          normGrad.getInput(), normGrad.getWeight(), residual,
          normGrad.getEpsAttr());
      add.getResult().replaceAllUsesWith(fused.getInputGrad());
      normGrad.getWeightGrad().replaceAllUsesWith(fused.getWeightGrad());
      add.erase();
      normGrad.erase();
      return;
    }
  });
}

void fuseGradientAccumulation(func::FuncOp step) {
  step.walk([](AddOp add) {
    for (Value side : {add.getRhs(), add.getLhs()}) {
      Operation *def = side.getDefiningOp();
      if (!def || !side.hasOneUse() ||
          !isa<LinearGradInputOp, LinearGradWeightOp>(def))
        continue;
      Value acc = otherOperand(add, side);
      OpBuilder b(add);
      Value fused;
      if (auto g = dyn_cast<LinearGradWeightOp>(def))
        fused = AccumulateLinearGradOp::create(b, add.getLoc(), add.getType(),
                                               acc, g.getGrad(), g.getInput(),
                                               b.getUnitAttr());
      else {
        auto gi = cast<LinearGradInputOp>(def);
        fused = AccumulateLinearGradOp::create(b, add.getLoc(), add.getType(),
                                               acc, gi.getGrad(),
                                               gi.getWeight(), UnitAttr());
      }
      add.getResult().replaceAllUsesWith(fused);
      add.erase();
      def->erase();
      return;
    }
  });
}

/// The selector_candidates that can share `loss`'s logits: the same four
/// operands and the same unary transform as the cross-entropy's, with a
/// top-K the lm_head kernel keeps.
SelectorCandidatesOp foldableCandidates(LmHeadCeOp loss) {
  for (Operation *user : loss.getInput().getUsers())
    if (auto c = dyn_cast<SelectorCandidatesOp>(user))
      if (c.getWeight() == loss.getWeight() &&
          c.getLabels() == loss.getLabels() &&
          c.getWeights() == loss.getWeights() &&
          c.getMultiplier() == loss.getMultiplier() &&
          c.getSoftcap() == loss.getSoftcap() &&
          int64_t(c.getTopK()) <= kernels::kLmHeadMaxTopK)
        return c;
  return nullptr;
}

LogicalResult fuseLmHead(func::FuncOp step) {
  SmallVector<LmHeadCeOp> losses;
  step.walk([&](LmHeadCeOp op) { losses.push_back(op); });
  llvm::DenseMap<Value, LossSeedOp> seeds; // by the weights they sum
  for (LmHeadCeOp loss : losses) {
    LmHeadCeGradOp grad;
    for (Operation *user : loss.getInput().getUsers())
      if (auto g = dyn_cast<LmHeadCeGradOp>(user))
        if (g.getWeight() == loss.getWeight() &&
            g.getLabels() == loss.getLabels() &&
            g.getWeights() == loss.getWeights() &&
            g.getMultiplier() == loss.getMultiplier() &&
            g.getSoftcap() == loss.getSoftcap())
          grad = g;
    SelectorCandidatesOp candidates = foldableCandidates(loss);
    // The fused op takes the place of the first of the two forward ops: the
    // users of either come after it.
    Operation *first = loss;
    if (candidates && candidates->isBeforeInBlock(loss))
      first = candidates;
    Type scalar =
        RankedTensorType::get({}, Float32Type::get(step.getContext()));
    SmallVector<Type> topKTypes;
    if (candidates)
      topKTypes.assign(candidates->getResultTypes().begin(),
                       candidates->getResultTypes().end());
    auto foldCandidates = [&](ValueRange topK) {
      for (unsigned i = 0; i < 3; ++i)
        candidates->getResult(i).replaceAllUsesWith(topK[i]);
      candidates.erase();
    };
    if (!grad) {
      // The forward alone (an evaluation program's): only the top-K folds.
      if (!candidates)
        continue;
      OpBuilder b(first);
      SmallVector<Type> types(4, scalar);
      types.push_back(loss.getHits().getType());
      types.append(topKTypes);
      auto fused = LmHeadCeTopKOp::create(
          b, loss.getLoc(), types, loss.getInput(), loss.getWeight(),
          loss.getLabels(), loss.getWeights(), candidates.getTopKAttr(),
          loss.getMultiplierAttr(), loss.getSoftcapAttr());
      for (unsigned i = 0; i < 5; ++i)
        loss.getResult(i).replaceAllUsesWith(fused->getResult(i));
      foldCandidates(fused->getResults().drop_front(5));
      loss.erase();
      continue;
    }
    // The seed right after the loss weights exist. With gradient
    // accumulation each micro-batch's weights are rows of the step's: one
    // seed over all of them, shared by every micro-batch's loss.
    Value stepWeights = loss.getWeights();
    if (auto rows = stepWeights.getDefiningOp<RowSliceOp>())
      stepWeights = rows.getInput();
    Operation *weightsDef = stepWeights.getDefiningOp();
    if (!weightsDef)
      return loss.emitOpError("needs its loss weights computed by an op, not "
                              "passed as an argument: the loss seed is placed "
                              "right after them");
    OpBuilder b(weightsDef->getContext());
    LossSeedOp &seed = seeds[stepWeights];
    if (!seed) {
      b.setInsertionPointAfter(weightsDef);
      seed = LossSeedOp::create(b, loss.getLoc(), scalar, scalar, stepWeights);
    }
    b.setInsertionPoint(first);
    auto fused = LmHeadCeFusedOp::create(
        b, loss.getLoc(), scalar, scalar, scalar, scalar,
        loss.getHits().getType(), grad.getResult().getType(), topKTypes,
        loss.getInput(), loss.getWeight(), loss.getLabels(), loss.getWeights(),
        seed.getLossSumGrad(),
        candidates ? candidates.getTopKAttr() : IntegerAttr(),
        loss.getMultiplierAttr(), loss.getSoftcapAttr());
    for (unsigned i = 0; i < 5; ++i)
      loss.getResult(i).replaceAllUsesWith(fused.getResult(i));
    grad.getResult().replaceAllUsesWith(fused.getInputGrad());
    if (candidates)
      foldCandidates(fused.getTopKResults());
    grad.erase();
    loss.erase();
  }
  return success();
}

/// Rebuilds the optimizer tail appended by dflash-append-optimizer as one
/// adamw_multi. Leaves the step unchanged when it does not have that shape.
LogicalResult fuseOptimizer(func::FuncOp step) {
  SmallVector<AdamWOp> updates;
  step.walk([&](AdamWOp op) { updates.push_back(op); });
  if (updates.empty())
    return success();
  auto lr = updates.front().getLr().getDefiningOp<LrScheduleOp>();
  auto clip = updates.front().getClip().getDefiningOp<ClipCoefficientOp>();
  GlobalNormOp norm =
      clip ? clip.getNorm().getDefiningOp<GlobalNormOp>() : GlobalNormOp();
  if (!lr || !clip || !norm)
    return step.emitError("the first dflash.adamw's learning rate and clip "
                          "must come from dflash.lr_schedule and from "
                          "dflash.clip_coefficient of a dflash.global_norm");
  SmallVector<Value> params, masters, m, v, grads;
  for (AdamWOp u : updates) {
    if (u.getLr() != lr.getResult() || u.getClip() != clip.getResult())
      return u.emitOpError("must use the learning rate and clip of the first "
                           "dflash.adamw");
    // grad = all_reduce(convert(bf16 gradient)).
    Value g = u.getGrad();
    auto reduce = g.getDefiningOp<AllReduceOp>();
    ConvertOp convert;
    if (reduce)
      convert = reduce.getInputs()[cast<OpResult>(g).getResultNumber()]
                    .getDefiningOp<ConvertOp>();
    if (!convert)
      return u.emitOpError("expects its gradient from dflash.convert through "
                           "dflash.all_reduce");
    masters.push_back(u.getMaster());
    m.push_back(u.getMoment1());
    v.push_back(u.getMoment2());
    grads.push_back(convert.getInput());
    params.push_back(Value()); // filled below from the signature
  }
  // The bf16 parameter of each update: the argument whose master is the
  // update's master.
  FailureOr<StepSignature> sig =
      StepSignature::get(step->getParentOfType<ModuleOp>());
  if (failed(sig))
    return failure();
  for (auto [i, u] : llvm::enumerate(updates)) {
    auto master = dyn_cast<BlockArgument>(u.getMaster());
    if (!master)
      return u.emitOpError("expects its master to be an argument of @step");
    StringRef name = sig->argInfo(master.getArgNumber()).getName();
    std::optional<unsigned> p = sig->findArg(ArgRole::Parameter, name);
    if (!p)
      return u.emitOpError() << "has no parameter argument named '" << name
                             << "' like its master";
    params[i] = step.getArgument(*p);
  }

  OpBuilder b(updates.back());
  b.setInsertionPointAfter(updates.back());
  SmallVector<Type> stateTypes;
  for (auto *group : {&params, &masters, &m, &v})
    for (Value x : *group)
      stateTypes.push_back(x.getType());
  Type scalar = RankedTensorType::get({}, b.getF32Type());
  AdamWOp first = updates.front();
  auto multi = AdamWMultiOp::create(
      b, first.getLoc(), stateTypes, scalar, scalar, params, masters, m, v,
      grads, lr.getStep(), lr.getTotal(), lr.getLrAttr(),
      lr.getWarmupRatioAttr(), clip.getMaxNormAttr(), first.getBeta1Attr(),
      first.getBeta2Attr(), first.getEpsAttr(), first.getWeightDecayAttr());
  for (auto [i, u] : llvm::enumerate(updates)) {
    u.getNewParameter().replaceAllUsesWith(multi.getNewParam(i));
    u.getNewMaster().replaceAllUsesWith(multi.getNewMaster(i));
    u.getNewMoment1().replaceAllUsesWith(multi.getNewMoment1(i));
    u.getNewMoment2().replaceAllUsesWith(multi.getNewMoment2(i));
  }
  norm.getResult().replaceAllUsesWith(multi.getGradNorm());
  lr.getResult().replaceAllUsesWith(multi.getLrValue());
  for (AdamWOp u : updates)
    u.erase();
  // The rest is dead now: clip, norm, lr, the gradient all-reduce and the
  // conversions.
  SmallVector<Operation *> ops;
  for (Operation &op : step.front().without_terminator())
    ops.push_back(&op);
  for (Operation *op : llvm::reverse(ops))
    if (isa<ClipCoefficientOp, GlobalNormOp, LrScheduleOp, AllReduceOp,
            ConvertOp>(op) &&
        op->use_empty())
      op->erase();
  return success();
}

void FuseKernelsPass::runOnOperation() {
  // The groups are local patterns and apply to any function; the optimizer
  // group needs @step's signature to find the parameters.
  for (func::FuncOp f : getOperation().getOps<func::FuncOp>()) {
    if (f.isExternal())
      continue;
    fuseDraftEmbed(f);
    fuseLinearResidual(f);
    if (linearSwiglu || getOperation()->hasAttr(kFuseTargetMlpAttrName))
      fuseLinearSwiglu(f);
    fuseGroupedLinearSwiglu(f);
    fuseResidualNorm(f);
    fuseQkNormRope(f);
    fuseResidualNormGrad(f);
    fuseGradientAccumulation(f);
    if (failed(fuseLmHead(f)) ||
        (f.getSymName() == "step" && failed(fuseOptimizer(f))))
      return signalPassFailure();
  }
}

} // namespace
