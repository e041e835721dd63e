//===- ImportSpec.cpp - Spec to dflash forward graph ----------------------===//
//
// Writes the forward pass of docs/semantics.md section 3 and the loss of
// section 4 op by op; for a DFlash2 drafter, section 13's convolutions,
// selector and loss. Shapes come from the spec: B rows, S context positions, N
// anchors, Q = N * block_size draft slots per row.
//
//===----------------------------------------------------------------------===//

#include "compiler/Import/ImportSpec.h"

#include "compiler/Import/GraphBuilding.h"

#include "compiler/Analysis/ModelConfigAttr.h"
#include "dialect/DFlashOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"
#include "schema/Parameters.h"
#include "schema/StepBuffers.h"

using namespace mlir;
using namespace mlir::dflash;
using ::dflash::FrozenWeight;
using ::dflash::kFcParam;
using ::dflash::kHiddenNormParam;
using ::dflash::LayerParam;
using ::dflash::ParamInfo;
using ::dflash::SelectorParam;
using ::dflash::StepInput;

namespace {

class GraphBuilder {
public:
  GraphBuilder(MLIRContext &ctx, const ::dflash::DrafterSpec &spec)
      : ctx(ctx), spec(spec), b(&ctx) {}

  OwningOpRef<ModuleOp> build();

private:
  MLIRContext &ctx;
  const ::dflash::DrafterSpec &spec;
  OpBuilder b;
  ::dflash::import::FunctionArguments args;
  func::FuncOp func;

  Type bf16() { return b.getBF16Type(); }
  RankedTensorType t(ArrayRef<int64_t> shape, Type elt) {
    return RankedTensorType::get(shape, elt);
  }

  /// The spec location of `key` named `name`, for ops built from it.
  Location loc(const std::string &key, StringRef name) {
    ::dflash::SourceLoc l = spec.locationOf(key);
    Location file = FileLineColLoc::get(&ctx, spec.file, l.line, l.column);
    return NameLoc::get(StringAttr::get(&ctx, name), file);
  }
  /// The spec entry that fixes layer `i`: its attention kind if listed, else
  /// the layer count.
  std::string layerKey(int64_t i) {
    std::string k = "attention.layers." + std::to_string(i);
    return spec.locations.count(k) ? k : "drafter.num_layers";
  }

  unsigned addArg(Type type, ArgRole role, StringRef name, Location l) {
    return args.add(ctx, type, role, name, l);
  }
  Value linear(Value x, Value w, Location l) {
    return ::dflash::import::linear(b, l, x, w);
  }
  Value rmsNorm(Value x, Value w, Location l) {
    return ::dflash::import::rmsNorm(b, l, x, w, spec.rmsNormEps);
  }
  Value reshape(Value x, ArrayRef<int64_t> shape, Location l) {
    return ::dflash::import::reshape(b, l, x, shape);
  }
  Value rope(Value x, Value positions, Location l) {
    YarnAttr yarn;
    if (spec.ropeScaled())
      yarn = YarnAttr::get(&ctx, b.getF64FloatAttr(spec.ropeScalingFactor),
                           b.getF64FloatAttr(spec.ropeScalingBetaFast),
                           b.getF64FloatAttr(spec.ropeScalingBetaSlow),
                           spec.ropeScalingOriginalMaxPositions,
                           spec.ropeScalingTruncate,
                           b.getF64FloatAttr(spec.ropeScalingAttentionFactor));
    return RopeOp::create(b, l, x.getType(), x, positions,
                          b.getF64FloatAttr(spec.ropeTheta), yarn);
  }
};

OwningOpRef<ModuleOp> GraphBuilder::build() {
  const int64_t B = spec.rowsPerGpu, S = spec.seqLen;
  const int64_t bs = spec.blockSize, Q = spec.draftLength();
  const int64_t H = spec.hiddenSize, V = spec.vocabSize;
  const int64_t nh = spec.numHeads, nkv = spec.numKvHeads, d = spec.headDim;
  Type i32 = b.getI32Type(), i8 = b.getI8Type(), f32 = b.getF32Type();

  Location specLoc = loc("name", spec.name);
  OwningOpRef<ModuleOp> module = ModuleOp::create(specLoc, spec.name);

  // Arguments, in the order the runtime binds them; names and shapes from
  // the schema (schema/StepBuffers.h, schema/Parameters.h).
  Location dataLoc = loc("training", "data");
  auto input = [&](StepInput which, Type elt, Location l) {
    return addArg(t(shapeOf(which, spec), elt), ArgRole::Input, nameOf(which),
                  l);
  };
  Location anchorsLoc = loc("training.anchors_per_row", "anchors");
  unsigned aIds = input(StepInput::InputIds, i32, dataLoc);
  unsigned aMask = input(StepInput::LossMask, i8, dataLoc);
  unsigned aHidden =
      input(StepInput::TargetHidden, bf16(), loc("target.layer_ids", "taps"));
  unsigned aAnchors = input(StepInput::Anchors, i32, anchorsLoc);
  unsigned aKeep = input(StepInput::Keep, i8, anchorsLoc);
  unsigned aPositions = input(StepInput::PositionIds, i32, dataLoc);
  Location targetLoc = loc("target", "target");
  unsigned aEmbed = addArg(t({V, H}, bf16()), ArgRole::Frozen,
                           nameOf(FrozenWeight::Embed), targetLoc);
  // A tied target has one tensor for both.
  unsigned aHead = spec.tieWordEmbeddings
                       ? aEmbed
                       : addArg(t({V, H}, bf16()), ArgRole::Frozen,
                                nameOf(FrozenWeight::LmHead), targetLoc);

  // Every trainable tensor, in the schema's order; paramArgs[i] is the
  // argument of parameterTable(spec)[i].
  SmallVector<unsigned> paramArgs;
  for (const ParamInfo &p : parameterTable(spec)) {
    int64_t index = int64_t(paramArgs.size());
    Location l = p.layer >= 0        ? loc(layerKey(p.layer),
                                           "layers." + std::to_string(p.layer))
                 : index == kFcParam ? loc("target.layer_ids", "fc")
                 : index == kHiddenNormParam ? loc("drafter", "hidden_norm")
                 : index > finalNormParamIndex(spec)
                     ? loc("drafter.dflash2", "candidate_selector")
                     : loc("drafter", "norm");
    paramArgs.push_back(
        addArg(t(p.shape, bf16()), ArgRole::Parameter, p.name, l));
  }
  auto layerArg = [&](int64_t layer, LayerParam which) {
    return paramArgs[size_t(layerParamIndex(spec, layer, which))];
  };
  auto selectorArg = [&](SelectorParam which) {
    return paramArgs[size_t(selectorParamIndex(spec, which))];
  };
  // A DFlash2 drafter's alpha_t reads the optimizer step (section 13,
  // "Loss"); dflash-append-optimizer's schedule reads the same counters.
  Value alpha;
  unsigned aStep = 0, aTotal = 0;
  if (spec.dflash2) {
    Location l = loc("training.dflash2", "selector_alpha");
    Type counter = t({}, i32);
    aStep = addArg(counter, ArgRole::Counter,
                   ::dflash::nameOf(::dflash::StepCounter::Step), l);
    aTotal = addArg(counter, ArgRole::Counter,
                    ::dflash::nameOf(::dflash::StepCounter::TotalSteps), l);
  }
  unsigned aFc = paramArgs[kFcParam];
  unsigned aHiddenNorm = paramArgs[kHiddenNormParam];
  unsigned aNorm = paramArgs[size_t(finalNormParamIndex(spec))];
  Type scalar = RankedTensorType::get({}, f32);
  Type perPosition = RankedTensorType::get({bs}, f32);
  Type perBucket = RankedTensorType::get({spec.numPositionBuckets()}, f32);
  SmallVector<Type> resultTypes;
  for (int k = 0; k < ::dflash::kNumForwardSums; ++k) {
    auto sum = ::dflash::ForwardSum(k);
    resultTypes.push_back(::dflash::isPerPosition(sum) ? perPosition
                          : ::dflash::isPerBucket(sum) ? perBucket
                                                       : scalar);
  }
  b.setInsertionPointToEnd(module->getBody());
  func = func::FuncOp::create(b, specLoc, "step",
                              b.getFunctionType(args.types, resultTypes));
  Block *entry = args.addEntryBlock(func);
  for (int k = 0; k < ::dflash::kNumForwardSums; ++k)
    func.setResultAttr(unsigned(k), kArgAttrName,
                       ArgAttr::get(&ctx, ArgRole::Metric,
                                    ::dflash::nameOf(::dflash::ForwardSum(k))));
  // The drafter, for every later stage (the emitter prints it from here).
  (*module)->setAttr(::dflash::kModelConfigAttrName,
                     ::dflash::modelConfigToAttr(&ctx, spec));
  (*module)->setAttr(
      kOptimizerAttrName,
      OptimizerAttr::get(
          &ctx, b.getF64FloatAttr(spec.lr), b.getF64FloatAttr(spec.warmupRatio),
          b.getF64FloatAttr(spec.maxGradNorm), b.getF64FloatAttr(spec.beta1),
          b.getF64FloatAttr(spec.beta2), b.getF64FloatAttr(spec.adamEps),
          b.getF64FloatAttr(spec.weightDecay)));
  (*module)->setAttr("dflash.bucket_mib", b.getI64IntegerAttr(spec.bucketMiB));
  if (spec.shardOptimizerState)
    (*module)->setAttr(
        kShardOptimizerStateAttrName,
        b.getI64IntegerAttr(int64_t(spec.gpusPerNode) * spec.nodes));
  if (spec.gpuMemoryGiB > 0)
    (*module)->setAttr("dflash.memory_budget_gib",
                       b.getF64FloatAttr(spec.gpuMemoryGiB));
  if (spec.recomputeActivations)
    (*module)->setAttr(kRecomputeActivationsAttrName, b.getUnitAttr());
  if (spec.recomputeMlpProducts)
    (*module)->setAttr(kRecomputeMlpProductsAttrName, b.getUnitAttr());
  b.setInsertionPointToStart(entry);
  auto arg = [&](unsigned i) -> Value { return entry->getArgument(i); };
  if (spec.dflash2)
    alpha = SelectorAlphaOp::create(
        b, loc("training.dflash2", "selector_alpha"), scalar, arg(aStep),
        arg(aTotal), b.getF64FloatAttr(spec.selectorAlpha),
        b.getF64FloatAttr(spec.selectorWarmupRatio),
        b.getF64FloatAttr(spec.selectorRampRatio));

  // One micro-batch's forward graph: B rows of the inputs (the whole step
  // without accumulation), its labels and weights when the step computed
  // them; its forward sums.
  auto microBatch = [&](Value ids, Value mask, Value hidden, Value anchors,
                        Value keep, Value positions, Value embed, Value head,
                        Value stepLabels,
                        Value stepWeights) -> SmallVector<Value> {
    // 1. Context features, shared by every layer.
    Location fcLoc = loc("target.layer_ids", "fc");
    Value ctx = rmsNorm(linear(hidden, arg(aFc), fcLoc), arg(aHiddenNorm),
                        loc("drafter", "hidden_norm"));

    // 2-3. Draft stream and positions; labels and loss weights.
    Location blockLoc = loc("drafter.block_size", "draft_blocks");
    Value noiseIds = DraftTokensOp::create(
        b, loc("drafter.mask_token_id", "draft_tokens"), t({B, Q}, i32), ids,
        anchors, keep, b.getI64IntegerAttr(bs),
        b.getI64IntegerAttr(spec.maskTokenId));
    // A DFlash2 drafter's embedding is scaled (section 13, "Unary logits").
    FloatAttr embedScale;
    if (spec.dflash2 && spec.inputEmbeddingScale != 1)
      embedScale = b.getF64FloatAttr(spec.inputEmbeddingScale);
    Value x = EmbedOp::create(b, loc("target", "embed"), t({B, Q, H}, bf16()),
                              embed, noiseIds, embedScale);
    Value draftPos =
        DraftPositionsOp::create(b, blockLoc, t({B, Q}, i32), anchors,
                                 positions, b.getI64IntegerAttr(bs));
    Value ctxPos = positions;
    Value labels = stepLabels, weights = stepWeights;
    if (!labels) {
      auto targets = DraftTargetsOp::create(
          b, loc("training.gamma", "draft_targets"), t({B, Q}, i32),
          t({B, Q}, f32), ids, mask, anchors, keep, positions,
          b.getI64IntegerAttr(bs), b.getF64FloatAttr(spec.gamma));
      labels = targets.getLabels();
      weights = targets.getWeights();
    }

    // 4. Layers.
    for (int64_t i = 0; i < spec.numLayers; ++i) {
      auto la = [&](LayerParam which) { return layerArg(i, which); };
      std::string p = "layers." + std::to_string(i) + ".";
      std::string key = layerKey(i);
      Location attnLoc = loc(key, p + "self_attn");
      Location mlpLoc = loc(key, p + "mlp");

      // A DFlash2 layer's convolution `half` of a sublayer (section 13,
      // "Convolution"): its projection D is the sublayer input's.
      Location convLoc = loc("drafter.dflash2", p + "conv");
      auto conv = [&](Value in, Value d, LayerParam base, int64_t half) {
        return GroupedConvOp::create(b, convLoc, in.getType(), in, d,
                                     arg(la(base)), b.getI64IntegerAttr(bs),
                                     b.getI64IntegerAttr(spec.convKernelSize),
                                     b.getI64IntegerAttr(spec.convGroupSize),
                                     b.getI64IntegerAttr(half))
            .getResult();
      };

      Value h = rmsNorm(x, arg(la(LayerParam::InputNorm)),
                        loc(key, p + "input_layernorm"));
      Value dAttn, hd = h;
      if (spec.dflash2) {
        dAttn = linear(h, arg(la(LayerParam::AttentionConvProj)), convLoc);
        hd = conv(h, dAttn, LayerParam::AttentionConvBase, 0);
      }
      Value q = reshape(linear(hd, arg(la(LayerParam::QProj)), attnLoc),
                        {B, Q, nh, d}, attnLoc);
      q = rope(rmsNorm(q, arg(la(LayerParam::QNorm)), attnLoc), draftPos,
               attnLoc);
      auto keys = [&](Value src, int64_t rows, Value pos) {
        Value k = reshape(linear(src, arg(la(LayerParam::KProj)), attnLoc),
                          {B, rows, nkv, d}, attnLoc);
        return rope(rmsNorm(k, arg(la(LayerParam::KNorm)), attnLoc), pos,
                    attnLoc);
      };
      auto values = [&](Value src, int64_t rows) {
        return reshape(linear(src, arg(la(LayerParam::VProj)), attnLoc),
                       {B, rows, nkv, d}, attnLoc);
      };
      Value kc = keys(ctx, S, ctxPos), vc = values(ctx, S);
      // The context is not convolved.
      Value kd = keys(hd, Q, draftPos), vd = values(hd, Q);

      bool sliding = spec.layerSlides(i);
      IntegerAttr window =
          sliding ? b.getI64IntegerAttr(spec.layerWindows[size_t(i)]) : nullptr;
      UnitAttr causal = spec.blockCausal(i) ? b.getUnitAttr() : nullptr;
      auto attn = BlockAttentionOp::create(
          b, attnLoc, TypeRange{q.getType(), t({B, Q, nh}, f32)}, q, kc, vc, kd,
          vd, anchors, keep, positions, b.getI64IntegerAttr(bs), window,
          causal);
      Value o = reshape(attn.getResult(), {B, Q, nh * d}, attnLoc);
      Value attnOut = linear(o, arg(la(LayerParam::OProj)), attnLoc);
      if (spec.dflash2)
        attnOut = conv(attnOut, dAttn, LayerParam::AttentionConvBase, 1);
      x = AddOp::create(b, attnLoc, x.getType(), x, attnOut);

      Value h2 = rmsNorm(x, arg(la(LayerParam::PostNorm)),
                         loc(key, p + "post_attention_layernorm"));
      Value dMlp, h2d = h2;
      if (spec.dflash2) {
        dMlp = linear(h2, arg(la(LayerParam::MlpConvProj)), convLoc);
        h2d = conv(h2, dMlp, LayerParam::MlpConvBase, 0);
      }
      Value g = linear(h2d, arg(la(LayerParam::GateProj)), mlpLoc);
      Value u = linear(h2d, arg(la(LayerParam::UpProj)), mlpLoc);
      Value s = SwigluOp::create(b, mlpLoc, g.getType(), g, u);
      Value mlpOut = linear(s, arg(la(LayerParam::DownProj)), mlpLoc);
      if (spec.dflash2)
        mlpOut = conv(mlpOut, dMlp, LayerParam::MlpConvBase, 1);
      x = AddOp::create(b, mlpLoc, x.getType(), x, mlpOut);
    }

    // 5. Final norm, lm_head and the weighted cross-entropy.
    Value y = rmsNorm(x, arg(aNorm), loc("drafter", "norm"));
    // A DFlash2 drafter's CE_u is on the unary logits (section 13, "Unary
    // logits"); the defaults (multiplier 1, no cap) are left out of the IR.
    FloatAttr multiplier, softcap;
    if (spec.dflash2 && spec.outputMultiplier != 1)
      multiplier = b.getF64FloatAttr(spec.outputMultiplier);
    if (spec.dflash2 && spec.finalLogitSoftcapping != 0)
      softcap = b.getF64FloatAttr(spec.finalLogitSoftcapping);
    auto ce = LmHeadCeOp::create(b, loc("target.vocab_size", "lm_head_ce"),
                                 scalar, scalar, scalar, scalar, t({B, Q}, i8),
                                 y, head, labels, weights, multiplier, softcap);
    // A DFlash2 drafter's selector (section 13, "Selector" and "Loss"),
    // teacher-forced: its sums join the loss after every micro-batch's, and
    // greedy serving picks its argmax.
    Value hits = ce.getHits(), selectorSum, coveredWeight;
    if (spec.dflash2) {
      Location selLoc = loc("drafter.dflash2", "candidate_selector");
      const int64_t K = spec.selectorTopK;
      auto candidates = SelectorCandidatesOp::create(
          b, selLoc,
          TypeRange{t({B, Q, K}, f32), t({B, Q, K}, i32), t({B, Q}, f32)}, y,
          head, labels, weights, b.getI64IntegerAttr(K),
          b.getF64FloatAttr(spec.outputMultiplier),
          b.getF64FloatAttr(spec.finalLogitSoftcapping));
      Value predecessors =
          DraftPredecessorsOp::create(b, selLoc, t({B, Q}, i32), ids, anchors,
                                      keep, b.getI64IntegerAttr(bs));
      auto selector = SelectorLossOp::create(
          b, selLoc, TypeRange{scalar, scalar, t({B, Q}, i8)},
          candidates.getValues(), candidates.getCandidates(),
          candidates.getLabelValues(), y,
          arg(selectorArg(SelectorParam::HiddenProjection)), predecessors,
          labels, weights, arg(selectorArg(SelectorParam::PredecessorCodebook)),
          arg(selectorArg(SelectorParam::SuccessorCodebook)),
          b.getStringAttr(spec.selectorGoldInject ? "inject" : "topk"),
          spec.selectorStopGradient ? b.getUnitAttr() : nullptr);
      hits = selector.getHits();
      selectorSum = selector.getLossSum();
      coveredWeight = selector.getCoveredWeight();
    }
    // What greedy verification would accept (docs/semantics.md section 10),
    // also per bucket of anchor position (section 14).
    auto accepted = DraftAcceptanceOp::create(
        b, blockLoc, scalar, scalar, perPosition, perPosition, perBucket,
        perBucket, perBucket, perBucket, hits, weights, keep, anchors,
        positions, b.getI64IntegerAttr(bs),
        b.getDenseI64ArrayAttr(spec.positionBuckets));
    // In ForwardSum order, then a DFlash2 drafter's selector sums.
    SmallVector<Value> sums = {ce.getLossSum(),
                               ce.getWeightSum(),
                               ce.getCorrect(),
                               ce.getCount(),
                               accepted.getRunSum(),
                               accepted.getKeptBlocks(),
                               accepted.getPositionHits(),
                               accepted.getPositionCounts(),
                               accepted.getBucketRuns(),
                               accepted.getBucketBlocks(),
                               accepted.getBucketHits(),
                               accepted.getBucketCounts()};
    if (spec.dflash2)
      sums.append({selectorSum, coveredWeight});
    return sums;
  };

  // With gradient accumulation the step's rows are K micro-batches of B
  // rows (row slices of the inputs, read in place); each runs the whole
  // forward graph, and the step's sums are theirs added up. The labels and
  // loss weights of every row come first, in one op: the backward pass's
  // seed 1/sum(w) needs the weights of every micro-batch.
  const int64_t K = spec.gradientAccumulation;
  Location accumulationLoc =
      loc("training.gradient_accumulation", "micro_batch");
  DraftTargetsOp stepTargets;
  if (K > 1)
    stepTargets = DraftTargetsOp::create(
        b, loc("training.gamma", "draft_targets"), t({K * B, Q}, i32),
        t({K * B, Q}, f32), arg(aIds), arg(aMask), arg(aAnchors), arg(aKeep),
        arg(aPositions), b.getI64IntegerAttr(bs),
        b.getF64FloatAttr(spec.gamma));
  SmallVector<Value> stepSums;
  for (int64_t m = 0; m < K; ++m) {
    // Rows [m B, (m + 1) B) of a step-wide value.
    auto rows = [&](Value v) -> Value {
      if (K == 1)
        return v;
      auto type = cast<RankedTensorType>(v.getType());
      SmallVector<int64_t> shape(type.getShape());
      shape[0] = B;
      return RowSliceOp::create(
          b, accumulationLoc,
          RankedTensorType::get(shape, type.getElementType()), v,
          b.getI64IntegerAttr(m * B));
    };
    Value ids = rows(arg(aIds)), mask = rows(arg(aMask));
    Value hidden = rows(arg(aHidden)), anchors = rows(arg(aAnchors));
    Value keep = rows(arg(aKeep)), positions = rows(arg(aPositions));
    SmallVector<Value> sums = microBatch(
        ids, mask, hidden, anchors, keep, positions, arg(aEmbed), arg(aHead),
        stepTargets ? rows(stepTargets.getLabels()) : Value(),
        stepTargets ? rows(stepTargets.getWeights()) : Value());
    if (m == 0) {
      stepSums = sums;
      continue;
    }
    for (auto [total, part] : llvm::zip(stepSums, sums))
      total = AddOp::create(b, accumulationLoc, total.getType(), total, part);
  }
  if (spec.dflash2) {
    // loss_sum / sum(w) is section 13's loss: the selector's sum joins
    // CE_u's scaled by alpha_t (and for "covered" by sum(w) / sum(w cov)),
    // from the sums of every micro-batch.
    auto sum = [](::dflash::ForwardSum k) { return size_t(k); };
    Value &lossSum = stepSums[sum(::dflash::ForwardSum::LossSum)];
    lossSum = SelectorObjectiveOp::create(
        b, loc("training.dflash2", "selector_loss"), scalar, lossSum,
        stepSums[::dflash::kNumForwardSums], alpha,
        stepSums[sum(::dflash::ForwardSum::WeightSum)],
        stepSums[::dflash::kNumForwardSums + 1],
        spec.selectorDenominatorCovered ? b.getUnitAttr() : nullptr);
    stepSums.resize(::dflash::kNumForwardSums);
  }
  // In ForwardSum order.
  func::ReturnOp::create(b, specLoc, stepSums);
  return module;
}

} // namespace

namespace dflash {
OwningOpRef<ModuleOp> importSpec(MLIRContext &context,
                                 const DrafterSpec &spec) {
  context.loadDialect<DFlashDialect, func::FuncDialect>();
  GraphBuilder builder(context, spec);
  OwningOpRef<ModuleOp> module = builder.build();
  if (failed(verify(*module)))
    return nullptr;
  return module;
}
} // namespace dflash
