//===- SelectKernels.cpp - Each kernel op's kernel, constants, scratch ----===//
//
// The decisions between grouping ops into kernels and planning memory: which
// entry point of kernels/ runs each op, with which template constants, and
// how much scratch it needs, from the same plain headers the kernels use
// (kernels/AttentionLimits.h, kernels/GroupedConvLimits.h,
// kernels/Workspaces.h, kernels/AdamWTables.h).
// A shape no kernel supports is rejected here, naming the spec field, long
// before nvcc runs.
//
//===----------------------------------------------------------------------===//

#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Analysis/StepSignature.h"
#include "compiler/Transforms/Passes.h"
#include "kernels/AdamWTables.h"
#include "kernels/AttentionLimits.h"
#include "kernels/DeltaNetLimits.h"
#include "kernels/GemmLimits.h"
#include "kernels/GroupedConvLimits.h"
#include "kernels/Selector.h"
#include "kernels/Workspaces.h"
#include "schema/KernelEntryPoints.h"
#include "schema/ModelConfig.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/TypeSwitch.h"

namespace dflash {
#define GEN_PASS_DEF_SELECTKERNELS
#include "compiler/Transforms/Passes.h.inc"
} // namespace dflash

using namespace mlir;
using namespace mlir::dflash;
namespace kernels = ::dflash::kernels;

namespace {

RankedTensorType tensorOf(Value v) {
  return cast<RankedTensorType>(v.getType());
}
int64_t rowsOf(Value v) {
  auto t = tensorOf(v);
  return t.getNumElements() / t.getShape().back();
}

/// The lm_head kernel's row period: the block size when the loss weights are
/// dflash.draft_targets' (slot k = 0 of every block has weight 0 by its
/// [k > 0] factor, so the kernel leaves those rows out of both GEMMs), else
/// 0 (every row). The rows must be whole blocks, flattened like the
/// weights, and H a multiple of 8 (the row gather's 16-byte copies).
template <typename LmHeadOp>
int64_t lmHeadSkippedSlotPeriod(LmHeadOp op, int64_t rows, int64_t H) {
  // With gradient accumulation the weights are a micro-batch's rows of the
  // step's: whole rows of whole blocks, so the period holds in them too.
  Value weights = op.getWeights();
  if (auto slice = weights.template getDefiningOp<RowSliceOp>())
    weights = slice.getInput();
  auto targets = weights.template getDefiningOp<DraftTargetsOp>();
  if (!targets || targets.getWeights() != weights)
    return 0;
  int64_t bs = targets.getBlockSize();
  if (bs < 2 || rows % bs != 0 || H % 8 != 0 ||
      tensorOf(op.getWeights()).getNumElements() != rows)
    return 0;
  return bs;
}

static_assert(kernels::kGroupedConvMaxTaps == ::dflash::kMaxConvKernelSize,
              "the spec reader's limit on conv_kernel_size is the kernels'");

/// grouped_conv_bf16 / grouped_conv_grad_bf16's shapes (bf16, H channels in
/// 16-byte vectors, groups of 8 to 256 channels summed by warp shuffles,
/// at most kGroupedConvMaxTaps taps), each refusal naming its spec field.
LogicalResult checkGroupedConv(Operation *op, Value input, int64_t kc,
                               int64_t gs) {
  auto x = tensorOf(input);
  const int64_t H = x.getShape().back();
  if (!x.getElementType().isBF16())
    return op->emitOpError() << "has a grouped-convolution kernel for bf16 "
                                "tensors only, not "
                             << x.getElementType();
  if (H % 8 != 0)
    return op->emitOpError()
           << "has no grouped-convolution kernel for rows of " << H
           << ": 'drafter.hidden_size' must be a multiple of 8";
  if (kc < 1 || kc > kernels::kGroupedConvMaxTaps)
    return op->emitOpError()
           << "has no grouped-convolution kernel for " << kc
           << " taps: 'drafter.dflash2.conv_kernel_size' must be 1 to "
           << kernels::kGroupedConvMaxTaps;
  if (!kernels::groupedConvSupportsGroupSize(gs) || H % gs != 0)
    return op->emitOpError()
           << "has no grouped-convolution kernel for groups of " << gs
           << " channels: 'drafter.dflash2.conv_group_size' must be 8, 16, "
              "32, 64, 128 or "
           << kernels::kGroupedConvMaxGroupSize
           << " (a thread's 8 channels, summed over a power of two of warp "
              "lanes)";
  return success();
}

/// The top-K a DFlash2 selector folded into an lm_head op keeps (0: none).
int64_t lmHeadTopK(Operation *op) {
  if (auto fused = dyn_cast<LmHeadCeFusedOp>(op))
    return int64_t(fused.getTopK().value_or(0));
  if (auto topK = dyn_cast<LmHeadCeTopKOp>(op))
    return int64_t(topK.getTopK());
  return 0;
}

/// What one op runs: the attribute's fields before it is built.
struct Choice {
  std::string name;
  SmallVector<int64_t> constants;
  int64_t workspace = 0;
  int64_t tables = 0;
};

struct SelectKernelsPass
    : public ::dflash::impl::SelectKernelsBase<SelectKernelsPass> {
  using SelectKernelsBase::SelectKernelsBase;
  void runOnOperation() override;
};

/// The RMSNorm kernels read rows of H bf16 as 16-byte vectors.
LogicalResult checkNormWidth(Operation *op, int64_t H) {
  if (H % 8 == 0)
    return success();
  return op->emitOpError() << "has no RMSNorm kernel for rows of " << H
                           << ": 'drafter.hidden_size' must be a multiple "
                              "of 8";
}

/// The MoE row copies move 16-byte vectors of bf16 rows.
LogicalResult checkMoeRows(Operation *op, int64_t H) {
  if (H % 8 == 0 && tensorOf(op->getResult(0)).getElementType().isBF16())
    return success();
  return op->emitOpError() << "has no mixture-of-experts kernel for rows of "
                           << H
                           << ": 'hidden_size' must be a multiple of 8, "
                              "in bf16";
}

/// q/k norm + RoPE: D/16 lanes per head, each 8 dims of each half.
LogicalResult checkHeadDimForRope(Operation *op, int64_t D) {
  if (D % 16 == 0 && D <= 512)
    return success();
  return op->emitOpError() << "has no q/k-norm + RoPE kernel for head dim " << D
                           << ": 'drafter.head_dim' must be a multiple "
                              "of 16, at most 512";
}

/// The attention kernels' shapes (block_attention_fwd_bf16/_bwd_bf16).
LogicalResult checkAttention(Operation *op, int64_t D, int64_t BS, int64_t NH,
                             int64_t NKV) {
  if (!kernels::blockAttentionSupportsHeadDim(D))
    return op->emitOpError() << "has no attention kernel for head dim " << D
                             << ": 'drafter.head_dim' must be 64 or 128";
  if (BS > kernels::kBlockAttentionMaxBlockSize)
    return op->emitOpError() << "has no attention kernel for blocks of " << BS
                             << " tokens: 'drafter.block_size' must be at most "
                             << kernels::kBlockAttentionMaxBlockSize;
  const int64_t blockRows = BS * (NH / NKV);
  if (!kernels::blockAttentionSupportsBlockRows(blockRows))
    return op->emitOpError()
           << "has no attention kernel for " << blockRows
           << " query rows per block and kv head: 'drafter.block_size' x "
              "'drafter.num_heads' / 'drafter.num_kv_heads' must be at most "
              "64, or 128";
  return success();
}

/// Where the spec fixes the anchors of `op`'s rows: the step's `anchors`
/// argument (at `training.anchors_per_row`), under a micro-batch's row
/// slice; the op's own location where they come from elsewhere.
Location anchorsLocation(BlockAttentionGradOp op) {
  Value anchors = op.getAnchors();
  while (auto slice = anchors.getDefiningOp<RowSliceOp>())
    anchors = slice.getInput();
  return isa<BlockArgument>(anchors) ? anchors.getLoc() : op.getLoc();
}

/// The backward keeps every block's anchor in shared memory: a spec that
/// needs more than a CTA can have is rejected here, not at launch, at the
/// spec's anchors_per_row (the op's layer is not what to change).
LogicalResult checkAttentionBwdSharedMemory(BlockAttentionGradOp op, int64_t D,
                                            int64_t BS, int64_t NH, int64_t NKV,
                                            int64_t N) {
  const int64_t limit = kernels::kSharedMemoryPerBlockOptIn;
  auto smemFor = [&](int64_t n) {
    return kernels::blockAttentionBwdSmemBytes(D, BS, NH, NKV, n);
  };
  if (smemFor(N) <= limit)
    return success();
  int64_t fits = N;
  while (fits > 1 && smemFor(fits) > limit)
    --fits;
  return emitError(anchorsLocation(op))
         << "'" << op->getName() << "' op needs " << (smemFor(N) + 1023) / 1024
         << " KiB of shared memory per CTA for " << N
         << " anchors per row; sm_90 allows " << limit / 1024
         << " KiB: 'training.anchors_per_row' must be at most " << fits;
}

/// The attention op's constants: D, BS, NH, NKV, window, causal. The
/// forward runs the warp-specialised kernel where warpSpecialisedForwardPays
/// (with its consumers in turns where that may run),
/// the backward the cluster context kernel where clusterBackwardPays (short
/// rows, several to a GPU) and one (row, kv head) pair's key tiles at a time
/// where pairByPairBackwardPays (the longest rows), each where it may run
/// (`allowed`: also those it names before their GPU tests have passed).
FailureOr<Choice>
attention(Operation *op, bool backward,
          const ::dflash::UnvalidatedKernelAllowance &allowed) {
  const unsigned base = backward ? 1 : 0; // the gradient op starts with dOut
  auto q = tensorOf(op->getOperand(base)),
       k = tensorOf(op->getOperand(base + 1));
  const int64_t D = q.getDimSize(3), NH = q.getDimSize(2),
                NKV = k.getDimSize(2);
  const int64_t BS = op->getAttrOfType<IntegerAttr>("block_size").getInt();
  auto windowAttr = op->getAttrOfType<IntegerAttr>("window");
  const int64_t window = windowAttr ? windowAttr.getInt() : 0;
  const int64_t causal = op->hasAttr("causal") ? 1 : 0;
  if (failed(checkAttention(op, D, BS, NH, NKV)))
    return failure();
  namespace names = ::dflash::kernel_names;
  Choice c;
  c.constants = {D, BS, NH, NKV, window, causal};
  if (!backward) {
    const bool ws =
        kernels::warpSpecialisedForwardPays(D, BS, NH, NKV, window, causal,
                                            k.getDimSize(1)) &&
        ::dflash::kernelSelectable(names::kBlockAttentionFwdWs, allowed);
    // Its consumers in turns (FlashAttention-3's pingpong) on the same
    // layers, once validated; until its time is measured against the plain
    // schedule, only trainers built for its GPU test and that A/B run it.
    const bool pingpong =
        ws && ::dflash::kernelSelectable(names::kBlockAttentionFwdWsPingpong,
                                         allowed);
    c.name = pingpong ? names::kBlockAttentionFwdWsPingpong
             : ws     ? names::kBlockAttentionFwdWs
                      : names::kBlockAttentionFwd;
    return c;
  }
  const int64_t B = q.getDimSize(0), N = q.getDimSize(1) / BS;
  if (failed(checkAttentionBwdSharedMemory(cast<BlockAttentionGradOp>(op), D,
                                           BS, NH, NKV, N)))
    return failure();
  const int64_t S = k.getDimSize(1);
  const bool cluster =
      kernels::clusterBackwardPays(D, BS, NH, NKV, B, S, N) &&
      ::dflash::kernelSelectable(names::kBlockAttentionBwdCluster, allowed);
  const bool pairByPair =
      kernels::pairByPairBackwardPays(D, BS, NH, NKV, window, S, N) &&
      ::dflash::kernelSelectable(names::kBlockAttentionBwdPairByPair, allowed);
  c.name = cluster      ? names::kBlockAttentionBwdCluster
           : pairByPair ? names::kBlockAttentionBwdPairByPair
                        : names::kBlockAttentionBwd;
  c.workspace =
      int64_t(kernels::blockAttentionBwdWorkspaceBytes(D, BS, NH, B, N));
  return c;
}

Choice named(StringRef name, ArrayRef<int64_t> constants = {}) {
  Choice c;
  c.name = name.str();
  c.constants.assign(constants.begin(), constants.end());
  return c;
}

// The selector kernels keep the top-K in fixed-size arrays: every K the
// spec accepts must fit them.
static_assert(::dflash::kMaxSelectorTopK <= kernels::kSelectorKernelMaxTopK,
              "the selector kernels must take every top_k a spec may set");

/// The DFlash2 selector's ops (kernels/DFlash2Selector.cuh): bf16 tensors,
/// K within the kernels' arrays and the vocabulary, r within shared memory,
/// H a multiple of 8 (16-byte rows).
FailureOr<Choice> selectorKernel(Operation *op) {
  using Result = FailureOr<Choice>;
  auto bf16Operands = [&](std::initializer_list<Value> values) -> bool {
    return llvm::all_of(
        values, [](Value v) { return tensorOf(v).getElementType().isBF16(); });
  };
  auto notBf16 = [&]() -> Result {
    return op->emitOpError() << "has a kernel for bf16 inputs, weights and "
                                "codebooks only";
  };
  auto checkTopK = [&](int64_t K, int64_t V) -> LogicalResult {
    if (K <= kernels::kSelectorKernelMaxTopK && K <= V)
      return success();
    return op->emitOpError()
           << "has no kernel for the top " << K << " of a vocabulary of " << V
           << ": 'drafter.dflash2.selector_top_k' must be at most "
           << kernels::kSelectorKernelMaxTopK
           << " and at most 'target.vocab_size'";
  };
  auto checkHidden = [&](int64_t H) -> LogicalResult {
    if (H % 8 == 0)
      return success();
    return op->emitOpError() << "has no selector kernel for rows of " << H
                             << ": 'drafter.hidden_size' must be a multiple "
                                "of 8";
  };
  auto checkRank = [&](int64_t r) -> LogicalResult {
    if (r <= kernels::kSelectorKernelMaxRank)
      return success();
    return op->emitOpError() << "has no selector kernel for rank " << r
                             << ": 'drafter.dflash2.selector_rank' must be at "
                                "most "
                             << kernels::kSelectorKernelMaxRank;
  };
  // selector_candidates(_grad): the lm_head's logits, chunk by chunk.
  auto candidates = [&](auto o, bool backward) -> Result {
    auto w = tensorOf(o.getWeight());
    const int64_t V = w.getDimSize(0), H = w.getDimSize(1);
    if (!bf16Operands({o.getInput(), o.getWeight()}))
      return notBf16();
    if (failed(checkTopK(o.getTopK(), V)) || failed(checkHidden(H)))
      return failure();
    if (backward)
      return named(::dflash::kernel_names::kSelectorCandidatesGrad);
    const int64_t rows = rowsOf(o.getInput());
    Choice c = named(::dflash::kernel_names::kSelectorCandidates,
                     {kernels::selectorVocabChunk(rows, V)});
    c.workspace = int64_t(kernels::selectorCandidatesWorkspaceBytes(rows, V));
    return c;
  };
  // selector_loss(_grad): t = y Wh^T, then a CTA a row.
  auto loss = [&](auto o, bool backward) -> Result {
    auto codebook = tensorOf(o.getPredecessorCodebook());
    const int64_t V = codebook.getDimSize(0), r = codebook.getDimSize(1);
    const int64_t K = tensorOf(o.getValues()).getShape().back();
    if (!bf16Operands({o.getInput(), o.getProjection(),
                       o.getPredecessorCodebook(), o.getSuccessorCodebook()}))
      return notBf16();
    if (failed(checkTopK(K, V)) || failed(checkRank(r)) ||
        failed(checkHidden(tensorOf(o.getInput()).getShape().back())))
      return failure();
    const int64_t rows = rowsOf(o.getValues());
    Choice c = named(backward ? ::dflash::kernel_names::kSelectorLossGrad
                              : ::dflash::kernel_names::kSelectorLoss);
    c.workspace =
        int64_t(backward ? kernels::selectorLossGradWorkspaceBytes(rows, r, V)
                         : kernels::selectorLossWorkspaceBytes(rows, r));
    return c;
  };
  return llvm::TypeSwitch<Operation *, Result>(op)
      .Case([&](SelectorCandidatesOp o) { return candidates(o, false); })
      .Case([&](SelectorCandidatesGradOp o) { return candidates(o, true); })
      .Case([&](SelectorLossOp o) { return loss(o, false); })
      .Case([&](SelectorLossGradOp o) { return loss(o, true); })
      .Case([](DraftPredecessorsOp) -> Result {
        return named(::dflash::kernel_names::kDraftPredecessors);
      })
      .Case([](SelectorAlphaOp) -> Result {
        return named(::dflash::kernel_names::kSelectorAlpha);
      })
      .Case([](SelectorObjectiveOp) -> Result {
        return named(::dflash::kernel_names::kSelectorObjective);
      })
      .Case([](SelectorObjectiveGradOp) -> Result {
        return named(::dflash::kernel_names::kSelectorObjectiveGrad);
      })
      .Default([](Operation *o) -> Result {
        return o->emitOpError("is not a DFlash2 selector op");
      });
}

FailureOr<Choice> select(Operation *op,
                         const ::dflash::UnvalidatedKernelAllowance &allowed) {
  using Result = FailureOr<Choice>;
  return llvm::TypeSwitch<Operation *, Result>(op)
      .Case<LinearOp, BiasedLinearOp, LinearResidualOp, LinearGradInputOp,
            LinearGradWeightOp, AccumulateLinearGradOp>(
          [](Operation *) -> Result {
            return named(::dflash::kernel_names::kCublasLtGemm);
          })
      .Case<RmsNormOp, ResidualRmsNormOp>([](Operation *o) -> Result {
        int64_t H = tensorOf(o->getOperand(0)).getShape().back();
        if (failed(checkNormWidth(o, H)))
          return failure();
        return named(::dflash::kernel_names::kRmsNormFwd, {H});
      })
      .Case<RmsNormGradOp, RmsNormGradResidualOp>([](Operation *o) -> Result {
        int64_t H = tensorOf(o->getOperand(1)).getShape().back();
        if (failed(checkNormWidth(o, H)))
          return failure();
        Choice c = named(::dflash::kernel_names::kRmsNormBwd, {H});
        c.workspace = int64_t(kernels::rmsNormBwdWorkspaceBytes(H));
        return c;
      })
      .Case<QkNormRopeOp, QkNormRopeGradOp>([](Operation *o) -> Result {
        bool backward = isa<QkNormRopeGradOp>(o);
        auto x = tensorOf(o->getOperand(backward ? 1 : 0));
        int64_t heads = x.getDimSize(2), D = x.getDimSize(3);
        if (failed(checkHeadDimForRope(o, D)))
          return failure();
        Choice c = named(backward ? ::dflash::kernel_names::kQkNormRopeBwd
                                  : ::dflash::kernel_names::kQkNormRopeFwd,
                         {D, heads});
        if (backward)
          c.workspace = int64_t(kernels::qkNormRopeBwdWorkspaceBytes(D));
        return c;
      })
      // The hybrid targets' ops (kernels/HybridOps.cuh,
      // kernels/GatedDeltaRule.cuh); bf16 only.
      .Case([](CausalConvOp o) -> Result {
        auto w = tensorOf(o.getWeight());
        if (!tensorOf(o.getInput()).getElementType().isBF16() ||
            !kernels::causalConvSupports(w.getDimSize(0), w.getDimSize(1)))
          return o.emitOpError()
                 << "has no kernel for " << w.getDimSize(0) << " channels and "
                 << w.getDimSize(1)
                 << " taps: the channels must be a multiple of 8 and "
                    "'linear_conv_kernel_dim' at most "
                 << kernels::kCausalConvMaxTaps << " (bf16)";
        return named(::dflash::kernel_names::kCausalConv);
      })
      .Case<GatedRmsNormOp, ZeroCentredRmsNormOp, PartialRopeOp, SigmoidGateOp,
            SplitLastOp>([](Operation *o) -> Result {
        if (!tensorOf(o->getOperand(0)).getElementType().isBF16())
          return o->emitOpError() << "has a kernel for bf16 tensors only";
        return named(TypeSwitch<Operation *, std::string_view>(o)
                         .Case([](GatedRmsNormOp) {
                           return ::dflash::kernel_names::kGatedRmsNorm;
                         })
                         .Case([](ZeroCentredRmsNormOp) {
                           return ::dflash::kernel_names::kZeroCentredRmsNorm;
                         })
                         .Case([](PartialRopeOp) {
                           return ::dflash::kernel_names::kPartialRope;
                         })
                         .Case([](SigmoidGateOp) {
                           return ::dflash::kernel_names::kSigmoidGate;
                         })
                         .Default([](Operation *) {
                           // split_last: a strided copy a part.
                           return ::dflash::kernel_names::kCopyColumns;
                         }));
      })
      .Case([](GatedDeltaRuleOp o) -> Result {
        auto q = tensorOf(o.getQuery()), v = tensorOf(o.getValue());
        if (!q.getElementType().isBF16() ||
            !kernels::gatedDeltaRuleSupports(q.getDimSize(3), v.getDimSize(3)))
          return o.emitOpError()
                 << "has no kernel for key head dim " << q.getDimSize(3)
                 << " and value head dim " << v.getDimSize(3)
                 << ": 'linear_key_head_dim' and 'linear_value_head_dim' "
                    "must be equal, 32, 64 or 128 (bf16)";
        return named(::dflash::kernel_names::kGatedDeltaRule);
      })
      .Case([](ClampedSwigluOp o) -> Result {
        return o.emitOpError()
               << "has no kernel of its own: gpt-oss's clamped SwiGLU runs "
                  "in the experts' grouped GEMM (dflash-fuse-kernels fuses "
                  "it with the gate and up grouped_linear ops that feed it)";
      })
      .Case<RopeOp, ScaledRopeOp, YarnRopeOp>([](Operation *o) -> Result {
        // A target decoder's RoPE without q/k norms (the drafter's is
        // always fused with them).
        auto x = tensorOf(o->getOperand(0));
        int64_t heads = x.getDimSize(2), D = x.getDimSize(3);
        if (D % 16 != 0 || D > 512)
          return o->emitOpError()
                 << "has no RoPE kernel for head dim " << D
                 << ": the target's 'head_dim' must be a multiple of 16, at "
                    "most 512";
        return named(::dflash::kernel_names::kRopeFwd, {D, heads});
      })
      .Case([](CausalAttentionOp o) -> Result {
        auto q = tensorOf(o.getQuery()), k = tensorOf(o.getKeys());
        int64_t D = q.getDimSize(3), NH = q.getDimSize(2),
                NKV = k.getDimSize(2);
        if (!kernels::causalAttentionSupportsHeadDim(D))
          return o.emitOpError()
                 << "has no causal attention kernel for head dim " << D
                 << " (query heads " << NH << ", kv heads " << NKV
                 << "): the target's 'head_dim' must be 64, 128 or 256";
        return named(::dflash::kernel_names::kCausalAttentionFwd, {D, NH, NKV});
      })
      .Case([](EmbedOp o) -> Result {
        // A target's token embedding (the drafter's is draft_embed); a
        // scale is the kernel's float argument.
        int64_t H = tensorOf(o.getTable()).getDimSize(1);
        if (H % 8 != 0)
          return o.emitOpError() << "has no embedding kernel for rows of " << H
                                 << ": 'hidden_size' must be a multiple of 8";
        return named(::dflash::kernel_names::kEmbedRows);
      })
      .Case([](ConcatLastOp) -> Result {
        return named(::dflash::kernel_names::kCopyColumns);
      })
      .Case([&](BlockAttentionOp o) { return attention(o, false, allowed); })
      .Case([&](BlockAttentionGradOp o) { return attention(o, true, allowed); })
      .Case([](SwigluOp) -> Result {
        return named(::dflash::kernel_names::kSwigluFwd);
      })
      .Case([](LinearSwigluOp o) -> Result {
        auto w = tensorOf(o.getGateWeight());
        if (!w.getElementType().isBF16() ||
            !kernels::swigluGemmSupportsShape(w.getDimSize(0), w.getDimSize(1)))
          return o.emitOpError()
                 << "has no SwiGLU GEMM for weights " << w
                 << ": the target's 'intermediate_size' must be even and "
                    "'hidden_size' a multiple of 8, in bf16";
        return named(::dflash::kernel_names::kSwigluGemm);
      })
      .Case([](SwigluGradOp) -> Result {
        return named(::dflash::kernel_names::kSwigluBwd);
      })
      .Case([](AddOp o) -> Result {
        // bf16 activations and gradients; fp32 forward sums (the
        // micro-batches' of gradient accumulation).
        Type element = tensorOf(o.getResult()).getElementType();
        if (element.isF32())
          return named(::dflash::kernel_names::kAddF32);
        if (!element.isBF16())
          return o.emitOpError() << "has no add kernel for " << element
                                 << " elements (bf16 or f32)";
        return named(::dflash::kernel_names::kAdd);
      })
      .Case([](DraftEmbedOp o) -> Result {
        int64_t H = tensorOf(o.getTable()).getDimSize(1);
        if (H % 8 != 0)
          return o.emitOpError()
                 << "has no draft-embedding kernel for rows of " << H
                 << ": 'drafter.hidden_size' must be a multiple of 8";
        return named(::dflash::kernel_names::kDraftEmbed, {H});
      })
      .Case([](DraftPositionsOp) -> Result {
        return named(::dflash::kernel_names::kDraftPositions);
      })
      .Case([](DraftTargetsOp) -> Result {
        return named(::dflash::kernel_names::kDraftTargets);
      })
      .Case([](DraftAcceptanceOp o) -> Result {
        return named(::dflash::kernel_names::kDraftAcceptance,
                     {int64_t(o.getBlockSize()),
                      int64_t(o.getBucketEdges().size()) + 1});
      })
      .Case([](LossSeedOp) -> Result {
        return named(::dflash::kernel_names::kLossSeed);
      })
      .Case([](LossStatsOp) -> Result {
        return named(::dflash::kernel_names::kLossStats);
      })
      .Case<LmHeadCeFusedOp, LmHeadCeOp, LmHeadCeTopKOp>([](auto o) -> Result {
        // The forward alone (an evaluation program's) is the same
        // kernel without the dX GEMM. A folded top-K is a third
        // constant (none: two, as without DFlash2).
        int64_t rows = rowsOf(o.getInput());
        auto table = tensorOf(o.getWeight());
        int64_t V = table.getDimSize(0), H = table.getDimSize(1);
        int64_t blockSize = lmHeadSkippedSlotPeriod(o, rows, H);
        int64_t computed = kernels::lmHeadComputedRows(rows, blockSize);
        SmallVector<int64_t> constants = {kernels::lmHeadChunkRows(computed, V),
                                          blockSize};
        if (int64_t K = lmHeadTopK(o)) {
          if (K > kernels::kLmHeadMaxTopK)
            return o.emitOpError()
                   << "has no kernel for the top " << K
                   << " of the lm_head's logits: "
                      "'drafter.dflash2.selector_top_k' must be at most "
                   << kernels::kLmHeadMaxTopK;
          constants.push_back(K);
        }
        Choice c =
            named(::dflash::kernel_names::kLmHeadCrossEntropy, constants);
        c.workspace = int64_t(
            kernels::lmHeadCrossEntropyWorkspaceBytes(rows, V, H, blockSize));
        return c;
      })
      .Case([](GradientBucketOp) -> Result {
        return named(::dflash::kernel_names::kConvertBf16F32);
      })
      .Case([](AdamWMultiOp o) -> Result {
        int64_t chunks = 0;
        for (Value p : o.getParams())
          chunks += kernels::adamwChunkCount(tensorOf(p).getNumElements());
        Choice c = named(::dflash::kernel_names::kAdamWMultiTensor,
                         {o.getNumParams(), chunks});
        c.tables = kernels::adamwTableLayout(o.getNumParams(), chunks).bytes;
        return c;
      })
      .Case([](AdamWShardedOp o) -> Result {
        // A rank's pieces: at most one per tensor, and their chunks.
        int64_t chunks = o.getNumParams();
        for (GradientBucketOp bucket : shardedBuckets(o))
          chunks +=
              kernels::adamwChunkCount(bucket.getShardElementsAttr().getInt());
        Choice c = named(::dflash::kernel_names::kAdamWSharded,
                         {o.getNumParams(), chunks});
        c.tables = kernels::adamwTableLayout(o.getNumParams(), chunks).bytes;
        return c;
      })
      .Case([](MoeRouteOp o) -> Result {
        auto logits = tensorOf(o.getLogits());
        int64_t E = logits.getDimSize(1), k = o.getTopK();
        if (!logits.getElementType().isBF16() ||
            E > kernels::kGroupedGemmMaxExperts || k > kernels::kMoeMaxTopK)
          return o.emitOpError()
                 << "has no routing kernel for " << E << " experts, top " << k
                 << ": the target's 'num_experts' must be at most "
                 << kernels::kGroupedGemmMaxExperts
                 << " and 'num_experts_per_tok' at most "
                 << kernels::kMoeMaxTopK << ", in bf16";
        return named(::dflash::kernel_names::kMoeRoute);
      })
      .Case([](MoePermuteOp o) -> Result {
        auto x = tensorOf(o.getInput());
        int64_t E = tensorOf(o.getOffsets()).getDimSize(0) - 1;
        if (failed(checkMoeRows(o, x.getDimSize(1))))
          return failure();
        Choice c = named(::dflash::kernel_names::kMoePermute);
        c.workspace = int64_t(kernels::moePermuteWorkspaceBytes(
            tensorOf(o.getSource()).getDimSize(0), E));
        return c;
      })
      .Case<GroupedLinearOp, GroupedLinearSwigluOp>([](auto o) -> Result {
        auto w = tensorOf(o->getOperand(1));
        if (!w.getElementType().isBF16() ||
            !kernels::groupedGemmSupportsShape(w.getDimSize(0), w.getDimSize(1),
                                               w.getDimSize(2)))
          return o.emitOpError()
                 << "has no grouped GEMM for expert weights " << w
                 << ": the target's 'moe_intermediate_size' must be even, "
                    "'hidden_size' a multiple of 8 and 'num_experts' at most "
                 << kernels::kGroupedGemmMaxExperts << ", in bf16";
        return named(isa<GroupedLinearSwigluOp>(o.getOperation())
                         ? ::dflash::kernel_names::kGroupedLinearSwiglu
                         : ::dflash::kernel_names::kGroupedLinear);
      })
      .Case([](MoeUnpermuteOp o) -> Result {
        if (failed(checkMoeRows(o, tensorOf(o.getResult()).getDimSize(1))))
          return failure();
        Choice c = named(::dflash::kernel_names::kMoeUnpermute);
        c.workspace = int64_t(kernels::moeUnpermuteWorkspaceBytes(
            tensorOf(o.getSource()).getDimSize(0)));
        return c;
      })
      // DFlash2 drafters (docs/semantics.md section 13): the selector
      // (kernels/DFlash2Selector.cuh) and the convolutions
      // (kernels/DFlash2Conv.cuh).
      .Case<SelectorCandidatesOp, SelectorCandidatesGradOp, SelectorLossOp,
            SelectorLossGradOp, DraftPredecessorsOp, SelectorAlphaOp,
            SelectorObjectiveOp, SelectorObjectiveGradOp>(
          [](Operation *o) { return selectorKernel(o); })
      .Case([](GroupedConvOp o) -> Result {
        if (failed(checkGroupedConv(o, o.getInput(), o.getKernelSize(),
                                    o.getGroupSize())))
          return failure();
        return named(::dflash::kernel_names::kGroupedConv);
      })
      .Case([](GroupedConvGradOp o) -> Result {
        if (failed(checkGroupedConv(o, o.getInput(), o.getKernelSize(),
                                    o.getGroupSize())))
          return failure();
        auto x = tensorOf(o.getInput());
        Choice c = named(::dflash::kernel_names::kGroupedConvGrad);
        c.workspace = int64_t(kernels::groupedConvGradWorkspaceBytes(
            x.getDimSize(0) * (x.getDimSize(1) / int64_t(o.getBlockSize())),
            o.getKernelSize(), x.getDimSize(2)));
        return c;
      })
      .Default([](Operation *) -> Result { return Choice(); });
}

void SelectKernelsPass::runOnOperation() {
  ModuleOp module = getOperation();
  FailureOr<::dflash::StepSignature> sig = ::dflash::StepSignature::get(module);
  if (failed(sig))
    return signalPassFailure();
  Builder b(module.getContext());
  ::dflash::UnvalidatedKernelAllowance allowed;
  allowed.all = allowUnvalidatedKernels;
  allowed.names.assign(allowUnvalidatedKernelNames.begin(),
                       allowUnvalidatedKernelNames.end());
  bool ok = true;
  // An op refused once is refused in every layer: one error, then how many
  // more of the same op and operand types there are.
  struct Refusal {
    Operation *first;
    int64_t more = 0;
  };
  std::vector<std::pair<std::pair<OperationName, SmallVector<Type>>, Refusal>>
      refused;
  for (Operation &op : sig->func().front().without_terminator()) {
    auto key =
        std::make_pair(op.getName(), SmallVector<Type>(op.getOperandTypes()));
    auto seen =
        llvm::find_if(refused, [&](const auto &r) { return r.first == key; });
    if (seen != refused.end()) {
      ++seen->second.more;
      continue;
    }
    FailureOr<Choice> choice = select(&op, allowed);
    if (failed(choice)) {
      ok = false;
      refused.push_back({std::move(key), Refusal{&op}});
      continue;
    }
    // Views, collectives and ops no kernel runs get nothing;
    // dflash-verify-lowering rejects the last.
    if (choice->name.empty())
      continue;
    op.setAttr(::dflash::kKernelAttrName,
               KernelAttr::get(module.getContext(), choice->name,
                               b.getDenseI64ArrayAttr(choice->constants),
                               choice->workspace, choice->tables));
  }
  for (const auto &[key, r] : refused)
    if (r.more > 0)
      r.first->emitRemark()
          << "and " << r.more << " more '" << key.first.getStringRef()
          << "' ops of these operand types, refused alike";
  if (!ok)
    signalPassFailure();
}

} // namespace
