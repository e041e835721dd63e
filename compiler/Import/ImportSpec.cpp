//===- ImportSpec.cpp - Spec to dflash forward graph ----------------------===//
//
// Writes the forward pass of SEMANTICS.md section 3 and the loss of section 4
// op by op. Shapes come from the spec: B rows, S context positions, N anchors,
// Q = N * block_size draft slots per row.
//
//===----------------------------------------------------------------------===//

#include "compiler/Import/ImportSpec.h"

#include "dialect/DFlashOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"

using namespace mlir;
using namespace mlir::dflash;

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
  SmallVector<Type> argTypes;
  SmallVector<Attribute> argAttrs;
  SmallVector<Location> argLocs;
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

  /// Declares a function argument; returns its index.
  unsigned addArg(Type type, ArgRole role, StringRef name, Location l) {
    argTypes.push_back(type);
    argAttrs.push_back(ArgAttr::get(&ctx, role, name));
    argLocs.push_back(l);
    return argTypes.size() - 1;
  }

  Value linear(Value x, Value w, Location l) {
    auto xt = cast<RankedTensorType>(x.getType());
    auto wt = cast<RankedTensorType>(w.getType());
    SmallVector<int64_t> shape(xt.getShape().drop_back());
    shape.push_back(wt.getDimSize(0));
    return LinearOp::create(b, l, t(shape, xt.getElementType()), x, w);
  }
  Value rmsNorm(Value x, Value w, Location l) {
    return RmsNormOp::create(b, l, x.getType(), x, w,
                             b.getF64FloatAttr(spec.rmsNormEps));
  }
  Value reshape(Value x, ArrayRef<int64_t> shape, Location l) {
    auto xt = cast<RankedTensorType>(x.getType());
    return ReshapeOp::create(b, l, t(shape, xt.getElementType()), x);
  }
  Value rope(Value x, Value positions, Location l) {
    return RopeOp::create(b, l, x.getType(), x, positions,
                          b.getF64FloatAttr(spec.ropeTheta));
  }
};

OwningOpRef<ModuleOp> GraphBuilder::build() {
  const int64_t B = spec.rowsPerGpu, S = spec.seqLen, N = spec.anchorsPerRow;
  const int64_t bs = spec.blockSize, Q = spec.draftLength();
  const int64_t H = spec.hiddenSize, L = spec.numTaps(), V = spec.vocabSize;
  const int64_t I = spec.intermediateSize, nh = spec.numHeads,
                nkv = spec.numKvHeads, d = spec.headDim;
  Type i32 = b.getI32Type(), i8 = b.getI8Type(), f32 = b.getF32Type();

  Location specLoc = loc("name", spec.name);
  OwningOpRef<ModuleOp> module = ModuleOp::create(specLoc, spec.name);

  // Arguments, in the order the runtime binds them.
  Location dataLoc = loc("training", "data");
  unsigned aIds = addArg(t({B, S}, i32), ArgRole::Input, "input_ids", dataLoc);
  unsigned aMask = addArg(t({B, S}, i8), ArgRole::Input, "loss_mask", dataLoc);
  unsigned aHidden = addArg(t({B, S, L * H}, bf16()), ArgRole::Input,
                            "target_hidden", loc("target.layer_ids", "taps"));
  unsigned aAnchors = addArg(t({B, N}, i32), ArgRole::Input, "anchors",
                             loc("training.anchors_per_row", "anchors"));
  unsigned aKeep = addArg(t({B, N}, i8), ArgRole::Input, "keep",
                          loc("training.anchors_per_row", "anchors"));
  Location targetLoc = loc("target", "target");
  unsigned aEmbed =
      addArg(t({V, H}, bf16()), ArgRole::Frozen, "embed", targetLoc);
  // A tied target has one tensor for both.
  unsigned aHead =
      spec.tieWordEmbeddings
          ? aEmbed
          : addArg(t({V, H}, bf16()), ArgRole::Frozen, "lm_head", targetLoc);

  auto param = [&](ArrayRef<int64_t> shape, const std::string &name,
                   Location l) {
    return addArg(t(shape, bf16()), ArgRole::Parameter, name, l);
  };
  unsigned aFc = param({H, L * H}, "fc.weight", loc("target.layer_ids", "fc"));
  unsigned aHiddenNorm =
      param({H}, "hidden_norm.weight", loc("drafter", "hidden_norm"));
  struct LayerArgs {
    unsigned inNorm, q, k, v, o, qNorm, kNorm, postNorm, gate, up, down;
  };
  SmallVector<LayerArgs> layerArgs;
  for (int64_t i = 0; i < spec.numLayers; ++i) {
    std::string p = "layers." + std::to_string(i) + ".";
    Location l = loc(layerKey(i), "layers." + std::to_string(i));
    LayerArgs la;
    la.inNorm = param({H}, p + "input_layernorm.weight", l);
    la.q = param({nh * d, H}, p + "self_attn.q_proj.weight", l);
    la.k = param({nkv * d, H}, p + "self_attn.k_proj.weight", l);
    la.v = param({nkv * d, H}, p + "self_attn.v_proj.weight", l);
    la.o = param({H, nh * d}, p + "self_attn.o_proj.weight", l);
    la.qNorm = param({d}, p + "self_attn.q_norm.weight", l);
    la.kNorm = param({d}, p + "self_attn.k_norm.weight", l);
    la.postNorm = param({H}, p + "post_attention_layernorm.weight", l);
    la.gate = param({I, H}, p + "mlp.gate_proj.weight", l);
    la.up = param({I, H}, p + "mlp.up_proj.weight", l);
    la.down = param({H, I}, p + "mlp.down_proj.weight", l);
    layerArgs.push_back(la);
  }
  unsigned aNorm = param({H}, "norm.weight", loc("drafter", "norm"));

  Type scalar = RankedTensorType::get({}, f32);
  SmallVector<Type> resultTypes(4, scalar);
  b.setInsertionPointToEnd(module->getBody());
  func = func::FuncOp::create(b, specLoc, "step",
                              b.getFunctionType(argTypes, resultTypes));
  for (unsigned i = 0; i < argAttrs.size(); ++i)
    func.setArgAttr(i, kArgAttrName, argAttrs[i]);
  const char *sums[] = {"loss_sum", "weight_sum", "correct", "count"};
  for (unsigned i = 0; i < 4; ++i)
    func.setResultAttr(i, kArgAttrName,
                       ArgAttr::get(&ctx, ArgRole::Metric, sums[i]));
  (*module)->setAttr(
      kOptimizerAttrName,
      OptimizerAttr::get(&ctx, b.getF64FloatAttr(spec.lr),
                         b.getF64FloatAttr(spec.warmupRatio),
                         b.getF64FloatAttr(spec.maxGradNorm),
                         b.getF64FloatAttr(spec.beta1),
                         b.getF64FloatAttr(spec.beta2),
                         b.getF64FloatAttr(spec.adamEps),
                         b.getF64FloatAttr(spec.weightDecay)));
  (*module)->setAttr("dflash.bucket_mib",
                     b.getI64IntegerAttr(spec.bucketMiB));
  if (spec.shardOptimizerState)
    (*module)->setAttr(
        kShardOptimizerStateAttrName,
        b.getI64IntegerAttr(int64_t(spec.gpusPerNode) * spec.nodes));
  if (spec.gpuMemoryGiB > 0)
    (*module)->setAttr("dflash.memory_budget_gib",
                       b.getF64FloatAttr(spec.gpuMemoryGiB));
  Block *entry = func.addEntryBlock();
  for (unsigned i = 0; i < argLocs.size(); ++i)
    entry->getArgument(i).setLoc(argLocs[i]);
  b.setInsertionPointToStart(entry);
  auto arg = [&](unsigned i) -> Value { return entry->getArgument(i); };

  // 1. Context features, shared by every layer.
  Location fcLoc = loc("target.layer_ids", "fc");
  Value ctx = rmsNorm(linear(arg(aHidden), arg(aFc), fcLoc), arg(aHiddenNorm),
                      loc("drafter", "hidden_norm"));

  // 2-3. Draft stream and positions; labels and loss weights.
  Location blockLoc = loc("drafter.block_size", "draft_blocks");
  Value noiseIds = DraftTokensOp::create(
      b, loc("drafter.mask_token_id", "draft_tokens"), t({B, Q}, i32),
      arg(aIds), arg(aAnchors), arg(aKeep), b.getI64IntegerAttr(bs),
      b.getI64IntegerAttr(spec.maskTokenId));
  Value x = EmbedOp::create(b, loc("target", "embed"), t({B, Q, H}, bf16()),
                            arg(aEmbed), noiseIds);
  Value draftPos = DraftPositionsOp::create(b, blockLoc, t({B, Q}, i32),
                                            arg(aAnchors),
                                            b.getI64IntegerAttr(bs));
  Value ctxPos = SequencePositionsOp::create(b, loc("training.seq_len", "ctx"),
                                             t({B, S}, i32));
  auto targets = DraftTargetsOp::create(
      b, loc("training.gamma", "draft_targets"), t({B, Q}, i32),
      t({B, Q}, f32), arg(aIds), arg(aMask), arg(aAnchors), arg(aKeep),
      b.getI64IntegerAttr(bs), b.getF64FloatAttr(spec.gamma));

  // 4. Layers.
  for (int64_t i = 0; i < spec.numLayers; ++i) {
    const LayerArgs &la = layerArgs[i];
    const ::dflash::LayerSpec &ls = spec.layers[i];
    std::string p = "layers." + std::to_string(i) + ".";
    std::string key = layerKey(i);
    Location attnLoc = loc(key, p + "self_attn");
    Location mlpLoc = loc(key, p + "mlp");

    Value h = rmsNorm(x, arg(la.inNorm), loc(key, p + "input_layernorm"));
    Value q = reshape(linear(h, arg(la.q), attnLoc), {B, Q, nh, d}, attnLoc);
    q = rope(rmsNorm(q, arg(la.qNorm), attnLoc), draftPos, attnLoc);
    auto keys = [&](Value src, int64_t rows, Value pos) {
      Value k =
          reshape(linear(src, arg(la.k), attnLoc), {B, rows, nkv, d}, attnLoc);
      return rope(rmsNorm(k, arg(la.kNorm), attnLoc), pos, attnLoc);
    };
    auto values = [&](Value src, int64_t rows) {
      return reshape(linear(src, arg(la.v), attnLoc), {B, rows, nkv, d},
                     attnLoc);
    };
    Value kc = keys(ctx, S, ctxPos), vc = values(ctx, S);
    Value kd = keys(h, Q, draftPos), vd = values(h, Q);

    bool sliding = ls.kind == ::dflash::AttentionKind::Sliding;
    IntegerAttr window = sliding ? b.getI64IntegerAttr(ls.window) : nullptr;
    UnitAttr causal = sliding ? b.getUnitAttr() : nullptr;
    auto attn = BlockAttentionOp::create(
        b, attnLoc, TypeRange{q.getType(), t({B, Q, nh}, f32)}, q, kc, vc, kd,
        vd, arg(aAnchors), arg(aKeep), b.getI64IntegerAttr(bs), window,
        causal);
    Value o = reshape(attn.getResult(), {B, Q, nh * d}, attnLoc);
    x = AddOp::create(b, attnLoc, x.getType(), x,
                      linear(o, arg(la.o), attnLoc));

    Value h2 = rmsNorm(x, arg(la.postNorm),
                       loc(key, p + "post_attention_layernorm"));
    Value g = linear(h2, arg(la.gate), mlpLoc);
    Value u = linear(h2, arg(la.up), mlpLoc);
    Value s = SwigluOp::create(b, mlpLoc, g.getType(), g, u);
    x = AddOp::create(b, mlpLoc, x.getType(), x,
                      linear(s, arg(la.down), mlpLoc));
  }

  // 5. Final norm, lm_head and the weighted cross-entropy.
  Value y = rmsNorm(x, arg(aNorm), loc("drafter", "norm"));
  auto ce = LmHeadCeOp::create(
      b, loc("target.vocab_size", "lm_head_ce"), scalar, scalar, scalar,
      scalar, y, arg(aHead), targets.getLabels(), targets.getWeights());
  func::ReturnOp::create(b, specLoc, ce.getResults());
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
