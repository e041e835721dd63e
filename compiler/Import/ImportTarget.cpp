//===- ImportTarget.cpp - The online target's forward graph ---------------===//
//
// Writes the target decoder of config.json as `func.func @target`: the
// token embedding, then each decoder layer up to the last tapped one
// (pre-norm causal GQA attention with q/k norms where the model has them
// and RoPE, optionally Llama-3- or YaRN-scaled; pre-norm SwiGLU MLP, or
// Qwen3-MoE's routed experts where the layer is sparse; residual adds; for
// gpt-oss also the q/k/v/o biases, each head's sink, sliding layers and
// routed experts with biases and the clamped SwiGLU; for the Qwen3.5/3.6/
// Next hybrids Gated DeltaNet layers where config.json says, gated full
// attention with partial rotary elsewhere, zero-centred norms, and routed
// plus shared experts in the MoE forms),
// returning the residual stream after each tapped layer side by side: the
// step's `target_hidden` [B, S, L*H] (docs/semantics.md section 1), and after
// it each compiled sparse layer's chosen experts, `model.layers.<i>.mlp.
// expert_ids` [B*S, k] I32 (metrics the runtime only reports: what
// `target-features --experts` writes, to count the tokens whose experts
// differ from transformers'). Weights are
// frozen arguments named as in the Hugging Face checkpoint; a MoE layer's
// experts are stacked `mlp.experts.<proj>.weight` [E, N, K] (and gpt-oss's
// `.bias` [E, N]) whatever layout the checkpoint stores them in (the
// loader's part, runtime/io/TargetWeights.cpp).
//
//===----------------------------------------------------------------------===//

#include "compiler/Import/ImportTarget.h"

#include "compiler/Analysis/ModelConfigAttr.h"
#include "compiler/Import/DeltaNetGraph.h"
#include "compiler/Import/GraphBuilding.h"

#include "dialect/DFlashOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::dflash;

namespace {

class TargetGraphBuilder {
public:
  TargetGraphBuilder(MLIRContext &ctx, const ::dflash::DrafterSpec &spec,
                     const ::dflash::TargetModelConfig &target)
      : ctx(ctx), spec(spec), target(target), b(&ctx) {}

  OwningOpRef<ModuleOp> build();

private:
  MLIRContext &ctx;
  const ::dflash::DrafterSpec &spec;
  const ::dflash::TargetModelConfig &target;
  OpBuilder b;
  ::dflash::import::FunctionArguments args;
  /// Each sparse layer's chosen experts, by layer, in layer order.
  SmallVector<std::pair<int64_t, Value>> expertIds;

  Type bf16() { return b.getBF16Type(); }
  RankedTensorType t(ArrayRef<int64_t> shape, Type elt) {
    return RankedTensorType::get(shape, elt);
  }
  /// Ops of a checkpoint tensor group carry its name over config.json.
  Location loc(StringRef name) {
    return NameLoc::get(StringAttr::get(&ctx, name),
                        FileLineColLoc::get(&ctx, target.configPath, 0, 0));
  }
  unsigned addArg(Type type, ArgRole role, StringRef name) {
    return args.add(ctx, type, role, name, loc(name));
  }
  Value linear(Value x, Value w, Location l) {
    return ::dflash::import::linear(b, l, x, w);
  }
  /// x W^T (+ bias where the model has one).
  Value linear(Value x, Value w, Value bias, Location l) {
    if (!bias)
      return linear(x, w, l);
    auto shape = cast<RankedTensorType>(x.getType()).getShape();
    SmallVector<int64_t> out(shape.drop_back());
    out.push_back(cast<RankedTensorType>(w.getType()).getDimSize(0));
    return BiasedLinearOp::create(b, l, t(out, bf16()), x, w, bias);
  }
  /// The model's RMSNorm: zero-centred (x * (1 + w)) in the hybrid family.
  Value rmsNorm(Value x, Value w, Location l) {
    if (target.hybrid)
      return ZeroCentredRmsNormOp::create(b, l, x.getType(), x, w,
                                          b.getF64FloatAttr(target.rmsNormEps));
    return ::dflash::import::rmsNorm(b, l, x, w, target.rmsNormEps);
  }
  Value reshape(Value x, ArrayRef<int64_t> shape, Location l) {
    return ::dflash::import::reshape(b, l, x, shape);
  }
  Value denseMlp(Value h, Value gate, Value up, Value down, Location l) {
    Value g = linear(h, gate, l), u = linear(h, up, l);
    Value act = SwigluOp::create(b, l, g.getType(), g, u);
    return linear(act, down, l);
  }
  /// A sparse layer's weights: the router's, the stacked experts' and (for
  /// gpt-oss) their biases.
  struct SparseWeights {
    Value router, gate, up, down;
    Value routerBias, gateBias, upBias, downBias;
    /// The hybrid MoE forms' shared expert and its per-token gate [1, H].
    Value sharedGate, sharedUp, sharedDown, sharedExpertGate;
  };
  /// A sparse MLP over the T = B*S tokens: the router's top-k experts, the
  /// T*k routed rows grouped by expert through each expert's SwiGLU MLP
  /// (gpt-oss: biased and clamped), and back to the tokens weighted by the
  /// router (Qwen3-MoE: softmax then top-k; gpt-oss: top-k then softmax).
  Value sparseMlp(int64_t layer, Value h, const SparseWeights &w, Location l) {
    auto shape = cast<RankedTensorType>(h.getType()).getShape();
    const int64_t T = shape[0] * shape[1], H = shape[2];
    const int64_t E = target.numExperts, k = target.numExpertsPerToken;
    const int64_t I = target.moeIntermediateSize;
    Type i32 = b.getI32Type();
    Value tokens = reshape(h, {T, H}, l);
    Value logits = linear(tokens, w.router, w.routerBias, l);
    auto route = MoeRouteOp::create(
        b, l, t({T, k}, bf16()), t({T, k}, i32), logits, b.getI64IntegerAttr(k),
        b.getStringAttr(target.gptOss ? "topk_softmax" : "softmax_topk"),
        target.normTopkProb ? b.getUnitAttr() : UnitAttr());
    expertIds.push_back({layer, route.getExperts()});
    auto rows =
        MoePermuteOp::create(b, l, t({T * k, H}, bf16()), t({E + 1}, i32),
                             t({T * k}, i32), tokens, route.getExperts());
    auto grouped = [&](Value x, Value weight, Value bias, int64_t n) -> Value {
      return GroupedLinearOp::create(b, l, t({T * k, n}, bf16()), x, weight,
                                     rows.getOffsets(), bias);
    };
    Value g = grouped(rows.getPermuted(), w.gate, w.gateBias, I);
    Value u = grouped(rows.getPermuted(), w.up, w.upBias, I);
    Value act;
    if (target.gptOss)
      act = ClampedSwigluOp::create(b, l, g.getType(), g, u,
                                    b.getF64FloatAttr(target.swigluAlpha),
                                    b.getF64FloatAttr(target.swigluLimit));
    else
      act = SwigluOp::create(b, l, g.getType(), g, u);
    Value y = MoeUnpermuteOp::create(b, l, t({T, H}, bf16()),
                                     grouped(act, w.down, w.downBias, H),
                                     rows.getSource(), route.getWeights());
    if (w.sharedGate) {
      // Every token also goes through the shared expert, scaled by
      // sigmoid(shared_expert_gate(x)), one gate a token.
      Value shared =
          denseMlp(tokens, w.sharedGate, w.sharedUp, w.sharedDown, l);
      Value gate = linear(tokens, w.sharedExpertGate, l);
      y = AddOp::create(
          b, l, y.getType(), y,
          SigmoidGateOp::create(b, l, shared.getType(), shared, gate));
    }
    return reshape(y, shape, l);
  }
  Value rope(Value x, Value positions, Location l) {
    if (target.hybrid)
      return PartialRopeOp::create(b, l, x.getType(), x, positions,
                                   b.getF64FloatAttr(target.ropeTheta),
                                   b.getI64IntegerAttr(target.rotaryDim));
    if (target.yarn) {
      const ::dflash::YarnRopeScaling &y = *target.yarn;
      return YarnRopeOp::create(
          b, l, x.getType(), x, positions, b.getF64FloatAttr(target.ropeTheta),
          b.getF64FloatAttr(y.factor), b.getF64FloatAttr(y.betaFast),
          b.getF64FloatAttr(y.betaSlow),
          b.getI64IntegerAttr(y.originalMaxPositions),
          b.getBoolAttr(y.truncate), b.getF64FloatAttr(y.attentionFactor));
    }
    if (!target.ropeScaling)
      return RopeOp::create(b, l, x.getType(), x, positions,
                            b.getF64FloatAttr(target.ropeTheta), YarnAttr());
    const ::dflash::Llama3RopeScaling &s = *target.ropeScaling;
    return ScaledRopeOp::create(
        b, l, x.getType(), x, positions, b.getF64FloatAttr(target.ropeTheta),
        b.getF64FloatAttr(s.factor), b.getF64FloatAttr(s.lowFreqFactor),
        b.getF64FloatAttr(s.highFreqFactor),
        b.getI64IntegerAttr(s.originalMaxPositions));
  }
};

OwningOpRef<ModuleOp> TargetGraphBuilder::build() {
  const int64_t B = spec.rowsPerStep(), S = spec.seqLen;
  const int64_t H = target.hiddenSize, I = target.intermediateSize;
  const int64_t nh = target.numHeads, nkv = target.numKvHeads;
  const int64_t d = target.headDim, V = target.vocabSize;
  const int64_t lastTap = spec.targetLayerIds.back();
  Type i32 = b.getI32Type();

  Location moduleLoc = loc(spec.name + "-target");
  OwningOpRef<ModuleOp> module =
      ModuleOp::create(moduleLoc, spec.name + "-target");
  // The drafter it feeds: the emitter names the pair's programs from it.
  (*module)->setAttr(::dflash::kModelConfigAttrName,
                     ::dflash::modelConfigToAttr(&ctx, spec));
  if (spec.fuseTargetMlp)
    (*module)->setAttr(kFuseTargetMlpAttrName, b.getUnitAttr());

  unsigned aIds = addArg(t({B, S}, i32), ArgRole::Input, "input_ids");
  unsigned aPositions = addArg(t({B, S}, i32), ArgRole::Input, "position_ids");
  unsigned aEmbed =
      addArg(t({V, H}, bf16()), ArgRole::Frozen, "model.embed_tokens.weight");
  /// Argument indices; kNone where the model has no such tensor.
  constexpr unsigned kNone = ~0u;
  struct LayerArgs {
    unsigned inputNorm, q, k, v, o, qNorm, kNorm, postNorm, gate, up, down;
    bool sparse; ///< a mixture-of-experts MLP: router, stacked experts
    unsigned router;
    unsigned qBias = kNone, kBias = kNone, vBias = kNone, oBias = kNone;
    unsigned sinks = kNone, routerBias = kNone, gateBias = kNone,
             upBias = kNone, downBias = kNone;
    int64_t window = 0; ///< a sliding layer's keys; 0: full attention
    /// A Gated DeltaNet layer (no q/k/v/o), and its weights.
    bool linear = false;
    unsigned inProjQkv = kNone, inProjZ = kNone, inProjB = kNone,
             inProjA = kNone, conv = kNone, dtBias = kNone, aLog = kNone,
             deltaNorm = kNone, outProj = kNone;
    unsigned sharedGate = kNone, sharedUp = kNone, sharedDown = kNone,
             sharedExpertGate = kNone;
  };
  const int64_t E = target.numExperts, I2 = target.moeIntermediateSize;
  SmallVector<LayerArgs> layers;
  for (int64_t i = 0; i <= lastTap; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    LayerArgs a{};
    auto tensor = [&](ArrayRef<int64_t> shape, const std::string &name) {
      return addArg(t(shape, bf16()), ArgRole::Frozen, p + name);
    };
    auto frozen = [&](ArrayRef<int64_t> shape, const std::string &name) {
      return tensor(shape, name + ".weight");
    };
    a.inputNorm = frozen({H}, "input_layernorm");
    a.linear = target.linearLayer(i);
    if (a.linear) {
      const int64_t Kd = target.linearKeyDim(), Vd = target.linearValueDim();
      const int64_t Hv = target.linearValueHeads;
      // The loader reads conv1d.weight [C, 1, K] as [C, K].
      if (target.fusedLinearProjections) {
        a.inProjQkv = frozen({2 * Kd + 2 * Vd, H}, "linear_attn.in_proj_qkvz");
        a.inProjB = frozen({2 * Hv, H}, "linear_attn.in_proj_ba");
      } else {
        a.inProjQkv = frozen({2 * Kd + Vd, H}, "linear_attn.in_proj_qkv");
        a.inProjZ = frozen({Vd, H}, "linear_attn.in_proj_z");
        a.inProjB = frozen({Hv, H}, "linear_attn.in_proj_b");
        a.inProjA = frozen({Hv, H}, "linear_attn.in_proj_a");
      }
      a.conv =
          frozen({2 * Kd + Vd, target.linearConvKernel}, "linear_attn.conv1d");
      a.dtBias = tensor({Hv}, "linear_attn.dt_bias");
      a.aLog = tensor({Hv}, "linear_attn.A_log");
      a.deltaNorm = frozen({target.linearValueHeadDim}, "linear_attn.norm");
      a.outProj = frozen({H, Vd}, "linear_attn.out_proj");
    } else {
      // The hybrids' q_proj holds each head's query, then its output gate.
      a.q = frozen({(target.hybrid ? 2 : 1) * nh * d, H}, "self_attn.q_proj");
      a.k = frozen({nkv * d, H}, "self_attn.k_proj");
      a.v = frozen({nkv * d, H}, "self_attn.v_proj");
      a.o = frozen({H, nh * d}, "self_attn.o_proj");
    }
    if (target.gptOss) {
      a.qBias = tensor({nh * d}, "self_attn.q_proj.bias");
      a.kBias = tensor({nkv * d}, "self_attn.k_proj.bias");
      a.vBias = tensor({nkv * d}, "self_attn.v_proj.bias");
      a.oBias = tensor({H}, "self_attn.o_proj.bias");
      a.sinks = tensor({nh}, "self_attn.sinks");
      if (target.slidingLayers[size_t(i)])
        a.window = target.slidingWindow;
    }
    if (target.qkNorm && !a.linear) {
      a.qNorm = frozen({d}, "self_attn.q_norm");
      a.kNorm = frozen({d}, "self_attn.k_norm");
    }
    a.postNorm = frozen({H}, "post_attention_layernorm");
    a.sparse = target.sparseLayer(i);
    if (a.sparse) {
      // Each expert's three weights, stacked over the experts (the loader
      // reads experts.<j>.gate_proj.weight and the rest into them).
      a.router = frozen({E, H}, target.gptOss ? "mlp.router" : "mlp.gate");
      a.gate = frozen({E, I2, H}, "mlp.experts.gate_proj");
      a.up = frozen({E, I2, H}, "mlp.experts.up_proj");
      a.down = frozen({E, H, I2}, "mlp.experts.down_proj");
      if (const int64_t Is = target.sharedExpertIntermediateSize) {
        a.sharedGate = frozen({Is, H}, "mlp.shared_expert.gate_proj");
        a.sharedUp = frozen({Is, H}, "mlp.shared_expert.up_proj");
        a.sharedDown = frozen({H, Is}, "mlp.shared_expert.down_proj");
        a.sharedExpertGate = frozen({1, H}, "mlp.shared_expert_gate");
      }
      if (target.gptOss) {
        a.routerBias = tensor({E}, "mlp.router.bias");
        a.gateBias = tensor({E, I2}, "mlp.experts.gate_proj.bias");
        a.upBias = tensor({E, I2}, "mlp.experts.up_proj.bias");
        a.downBias = tensor({E, H}, "mlp.experts.down_proj.bias");
      }
    } else {
      a.gate = frozen({I, H}, "mlp.gate_proj");
      a.up = frozen({I, H}, "mlp.up_proj");
      a.down = frozen({H, I}, "mlp.down_proj");
    }
    layers.push_back(a);
  }

  const int64_t L = spec.numTaps();
  Type resultType = t({B, S, L * H}, bf16());
  b.setInsertionPointToEnd(module->getBody());
  // Its results are typed once the body is built (the expert ids follow).
  auto func = func::FuncOp::create(b, moduleLoc, "target",
                                   b.getFunctionType(args.types, {resultType}));
  Block *entry = args.addEntryBlock(func);
  b.setInsertionPointToStart(entry);
  auto arg = [&](unsigned i) -> Value {
    return i == kNone ? Value() : entry->getArgument(i);
  };
  Value positions = arg(aPositions);

  Value x = EmbedOp::create(b, loc("model.embed_tokens"), t({B, S, H}, bf16()),
                            arg(aEmbed), arg(aIds), /*scale=*/FloatAttr());
  SmallVector<Value> taps;
  for (int64_t i = 0; i <= lastTap; ++i) {
    const LayerArgs &a = layers[size_t(i)];
    std::string p = "model.layers." + std::to_string(i);
    Location attn = loc(p + ".self_attn"), mlp = loc(p + ".mlp");
    Value h = rmsNorm(x, arg(a.inputNorm), loc(p + ".input_layernorm"));
    auto heads = [&](Value y, int64_t n, unsigned norm) {
      if (y.getType() != t({B, S, n, d}, bf16()))
        y = reshape(y, {B, S, n, d}, attn);
      if (target.qkNorm && norm != kNone)
        y = rmsNorm(y, arg(norm), attn);
      return y;
    };
    auto projected = [&](unsigned w, unsigned bias, int64_t n, unsigned norm) {
      return heads(linear(h, arg(w), arg(bias), attn), n, norm);
    };
    if (a.linear) {
      Location delta = loc(p + ".linear_attn");
      x = AddOp::create(b, delta, x.getType(), x,
                        ::dflash::import::gatedDeltaNet(
                            b, delta, target, h,
                            {arg(a.inProjQkv), arg(a.inProjZ), arg(a.inProjB),
                             arg(a.inProjA), arg(a.conv), arg(a.dtBias),
                             arg(a.aLog), arg(a.deltaNorm), arg(a.outProj)},
                            positions));
    } else {
      // The hybrids' output gate: each head's second half of q_proj.
      Value q, gate;
      if (target.hybrid) {
        auto halves = SplitLastOp::create(
            b, attn,
            TypeRange{t({B, S, nh, d}, bf16()), t({B, S, nh, d}, bf16())},
            reshape(linear(h, arg(a.q), attn), {B, S, nh, 2 * d}, attn),
            b.getDenseI64ArrayAttr({d, d}));
        q = heads(halves.getResult(0), nh, a.qNorm);
        gate = reshape(halves.getResult(1), {B, S, nh * d}, attn);
      } else {
        q = projected(a.q, a.qBias, nh, a.qNorm);
      }
      q = rope(q, positions, attn);
      Value k = rope(projected(a.k, a.kBias, nkv, a.kNorm), positions, attn);
      Value v = projected(a.v, a.vBias, nkv, kNone);
      Value o =
          reshape(CausalAttentionOp::create(b, attn, q.getType(), q, k, v,
                                            positions, arg(a.sinks), a.window),
                  {B, S, nh * d}, attn);
      if (gate)
        o = SigmoidGateOp::create(b, attn, o.getType(), o, gate);
      x = AddOp::create(b, attn, x.getType(), x,
                        linear(o, arg(a.o), arg(a.oBias), attn));
    }
    Value h2 =
        rmsNorm(x, arg(a.postNorm), loc(p + ".post_attention_layernorm"));
    Value y =
        a.sparse
            ? sparseMlp(i, h2,
                        {arg(a.router), arg(a.gate), arg(a.up), arg(a.down),
                         arg(a.routerBias), arg(a.gateBias), arg(a.upBias),
                         arg(a.downBias), arg(a.sharedGate), arg(a.sharedUp),
                         arg(a.sharedDown), arg(a.sharedExpertGate)},
                        mlp)
            : denseMlp(h2, arg(a.gate), arg(a.up), arg(a.down), mlp);
    x = AddOp::create(b, mlp, x.getType(), x, y);
    if (std::find(spec.targetLayerIds.begin(), spec.targetLayerIds.end(), i) !=
        spec.targetLayerIds.end())
      taps.push_back(x);
  }
  Value features =
      ConcatLastOp::create(b, loc("taps"), resultType, ValueRange(taps));
  SmallVector<Value> results{features};
  SmallVector<Type> resultTypes{resultType};
  for (auto [layer, ids] : expertIds) {
    results.push_back(ids);
    resultTypes.push_back(ids.getType());
  }
  func::ReturnOp::create(b, loc("taps"), results);
  func.setFunctionType(b.getFunctionType(args.types, resultTypes));
  // The first is what the drafter's step reads as its input.
  func.setResultAttr(0, kArgAttrName,
                     ArgAttr::get(&ctx, ArgRole::Input, "target_hidden"));
  for (auto [k, route] : llvm::enumerate(expertIds))
    func.setResultAttr(unsigned(k + 1), kArgAttrName,
                       ArgAttr::get(&ctx, ArgRole::Metric,
                                    "model.layers." +
                                        std::to_string(route.first) +
                                        ".mlp.expert_ids"));
  if (failed(verify(*module)))
    return nullptr;
  return module;
}

} // namespace

namespace dflash {
OwningOpRef<ModuleOp> importTarget(MLIRContext &context,
                                   const DrafterSpec &spec,
                                   const TargetModelConfig &target) {
  context.loadDialect<DFlashDialect, func::FuncDialect>();
  return TargetGraphBuilder(context, spec, target).build();
}
} // namespace dflash
