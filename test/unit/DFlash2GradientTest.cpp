//===- DFlash2GradientTest.cpp - DFlash2's ops through generate-backward --===//
//
// Small hand-written @step functions with the DFlash2 ops of
// docs/semantics.md section 13, differentiated by dflash-generate-backward
// and run in the reference interpreter in fp64: every parameter's gradient
// equals central differences of the interpreted forward, on fresh random
// inputs; the scaled embedding through dflash-fuse-kernels; and the
// selector's top-K that dflash-fuse-kernels folds into the lm_head ops: the
// fused ops interpret as the ops they replace.
//
//===----------------------------------------------------------------------===//

#include "compiler/Analysis/StepSignature.h"
#include "compiler/Interpreter/Interpreter.h"
#include "compiler/Transforms/Passes.h"
#include "test/unit/StepGradientSupport.h"

#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace {

/// Replaces every `{NAME}` of `text` by its value.
std::string
substitute(std::string text,
           const std::vector<std::pair<std::string, std::string>> &values) {
  for (const auto &[name, value] : values) {
    const std::string key = "{" + name + "}";
    for (size_t at = text.find(key); at != std::string::npos;
         at = text.find(key, at + value.size()))
      text.replace(at, key.size(), value);
  }
  return text;
}

/// One step: its forward graph and what dflash-generate-backward makes of it.
class Step {
public:
  explicit Step(const std::string &text) {
    context.loadDialect<DFlashDialect, func::FuncDialect>();
    forward = parseSourceString<ModuleOp>(text, &context);
    if (!forward)
      return;
    backward = forward->clone();
    PassManager pm(&context);
    pm.addPass(createGenerateBackward());
    if (failed(pm.run(*backward)))
      backward = nullptr;
  }

  bool ok() const { return forward && backward; }
  func::FuncOp forwardStep() {
    return forward->lookupSymbol<func::FuncOp>("step");
  }
  func::FuncOp backwardStep() {
    return backward->lookupSymbol<func::FuncOp>("step");
  }
  StepSignature signature(ModuleOp module) {
    return *StepSignature::get(module);
  }

  /// Random arguments of the backward step (the forward's and the seed 1):
  /// labels in the vocabulary `V`, loss weights 0 at each block's slot 0
  /// and in (0.5, 1.5) elsewhere, every other float normal times `scale`
  /// (inputs 1).
  std::vector<HostTensor> randomArgs(uint64_t seed, int64_t V, int64_t bs,
                                     double scale = 0.1) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal;
    std::uniform_real_distribution<double> uniform(0.5, 1.5);
    func::FuncOp step = backwardStep();
    StepSignature sig = signature(*backward);
    std::vector<HostTensor> args;
    for (unsigned i = 0; i < step.getNumArguments(); ++i) {
      auto type = cast<RankedTensorType>(step.getArgument(i).getType());
      HostTensor t(
          std::vector<int64_t>(type.getShape().begin(), type.getShape().end()));
      ArgAttr info = sig.argInfo(i);
      StringRef name = info.getName();
      if (name == "loss_sum_grad") {
        t.data[0] = 1;
      } else if (type.getElementType().isInteger(32)) { // token ids
        for (double &x : t.data)
          x = double(rng() % uint64_t(V));
      } else if (name == "weights") {
        for (size_t s = 0; s < t.data.size(); ++s)
          t.data[s] = int64_t(s) % bs == 0 ? 0.0 : uniform(rng);
      } else {
        double sigma = info.getRole() == ArgRole::Input ? 1.0 : scale;
        for (double &x : t.data)
          x = sigma * normal(rng);
      }
      args.push_back(std::move(t));
    }
    return args;
  }

  /// The forward step's results on the backward step's arguments.
  std::vector<HostTensor> runForward(const std::vector<HostTensor> &args) {
    func::FuncOp step = forwardStep();
    std::vector<HostTensor> fwdArgs(args.begin(),
                                    args.begin() + step.getNumArguments());
    auto out = StepInterpreter(step, Precision::Exact).run(fwdArgs);
    EXPECT_TRUE(succeeded(out));
    return succeeded(out) ? *out : std::vector<HostTensor>();
  }

  double forwardLoss(const std::vector<HostTensor> &args) {
    std::vector<HostTensor> out = runForward(args);
    return out.empty() ? NAN : out[0].data[0];
  }

  /// The gradients generate-backward builds, by parameter name.
  std::map<std::string, HostTensor>
  gradients(const std::vector<HostTensor> &args) {
    auto out = StepInterpreter(backwardStep(), Precision::Exact).run(args);
    EXPECT_TRUE(succeeded(out));
    std::map<std::string, HostTensor> grads;
    if (failed(out))
      return grads;
    StepSignature sig = signature(*backward);
    for (unsigned r : sig.resultsWithRole(ArgRole::Gradient))
      grads[sig.resultInfo(r).getName().str()] = (*out)[r];
    return grads;
  }

  /// Each parameter's gradient against central differences of the forward
  /// loss along a random direction: (L(p + h d) - L(p - h d)) / 2h against
  /// <grad, d>, within `tolerance` relative. Returns how many it checked.
  int checkGradients(const std::vector<HostTensor> &args, double tolerance) {
    std::map<std::string, HostTensor> grads = gradients(args);
    StepSignature sig = signature(*backward);
    std::mt19937_64 rng(11);
    int checked = 0;
    for (const auto &[name, grad] : grads) {
      unsigned p = *sig.findArg(ArgRole::Parameter, name);
      steptest::DirectionalDerivative d = steptest::directionalDerivative(
          args, p, grad,
          [&](const std::vector<HostTensor> &a) { return forwardLoss(a); },
          1e-6, rng);
      EXPECT_LT(d.relativeError(), tolerance)
          << name << ": analytic " << d.analytic << " numeric " << d.numeric;
      ++checked;
    }
    return checked;
  }

  MLIRContext context;
  OwningOpRef<ModuleOp> forward, backward;
};

//===----------------------------------------------------------------------===//
// Grouped convolution
//===----------------------------------------------------------------------===//

/// B 2, two blocks of 4 (Q 8), H 32, groups of 16 (G 2), V 16. One D feeds
/// three convolutions: half 0 and half 1 of a whole [2, kc, H] base around
/// a linear "sublayer", then half 1 again with a [kc, H] base.
const char *kConvStep = R"mlir(
func.func @step(%x: tensor<2x8x32xf32> {dflash.arg = #dflash.arg<input, "target_hidden">},
                %wc: tensor<{D}x32xf32> {dflash.arg = #dflash.arg<parameter, "wc">},
                %base: tensor<2x{kc}x32xf32> {dflash.arg = #dflash.arg<parameter, "base">},
                %wm: tensor<32x32xf32> {dflash.arg = #dflash.arg<parameter, "wm">},
                %b1: tensor<{kc}x32xf32> {dflash.arg = #dflash.arg<parameter, "b1">},
                %head: tensor<16x32xf32> {dflash.arg = #dflash.arg<frozen, "lm_head">},
                %labels: tensor<2x8xi32> {dflash.arg = #dflash.arg<input, "labels">},
                %weights: tensor<2x8xf32> {dflash.arg = #dflash.arg<input, "weights">})
    -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">}) {
  %d = dflash.linear %x, %wc : (tensor<2x8x32xf32>, tensor<{D}x32xf32>) -> tensor<2x8x{D}xf32>
  %h = dflash.grouped_conv %x, %d, %base {block_size = 4 : i64, kernel_size = {kc} : i64, group_size = 16 : i64, half = 0 : i64}
      : (tensor<2x8x32xf32>, tensor<2x8x{D}xf32>, tensor<2x{kc}x32xf32>) -> tensor<2x8x32xf32>
  %m = dflash.linear %h, %wm : (tensor<2x8x32xf32>, tensor<32x32xf32>) -> tensor<2x8x32xf32>
  %o = dflash.grouped_conv %m, %d, %base {block_size = 4 : i64, kernel_size = {kc} : i64, group_size = 16 : i64, half = 1 : i64}
      : (tensor<2x8x32xf32>, tensor<2x8x{D}xf32>, tensor<2x{kc}x32xf32>) -> tensor<2x8x32xf32>
  %y = dflash.add %x, %o : (tensor<2x8x32xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
  %y2 = dflash.grouped_conv %y, %d, %b1 {block_size = 4 : i64, kernel_size = {kc} : i64, group_size = 16 : i64, half = 1 : i64}
      : (tensor<2x8x32xf32>, tensor<2x8x{D}xf32>, tensor<{kc}x32xf32>) -> tensor<2x8x32xf32>
  %ls, %ws, %c, %n, %hits = dflash.lm_head_ce %y2, %head, %labels, %weights
      : (tensor<2x8x32xf32>, tensor<16x32xf32>, tensor<2x8xi32>, tensor<2x8xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  return %ls : tensor<f32>
}
)mlir";

TEST(DFlash2Gradient, GroupedConvMatchesFiniteDifferences) {
  // kc 5 > bs 4: taps past a block's start read nothing.
  for (int kc : {1, 2, 5}) {
    Step step(substitute(kConvStep, {{"kc", std::to_string(kc)},
                                     {"D", std::to_string(2 * kc * 2)}}));
    ASSERT_TRUE(step.ok()) << "kc " << kc;
    std::vector<HostTensor> args = step.randomArgs(100 + kc, 16, 4);
    EXPECT_EQ(step.checkGradients(args, 1e-6), 4) << "kc " << kc;
  }
}

/// A gradient op leaves the half of D (and of a whole base) that its
/// convolution does not read at 0, so that the dflash.add of a sublayer's
/// two convolutions' gradients is each half's own.
const char *kConvGradOp = R"mlir(
func.func @step(%g: tensor<2x8x32xf32>, %x: tensor<2x8x32xf32>,
                %d: tensor<2x8x8xf32>, %b: tensor<2x2x32xf32>)
    -> (tensor<2x8x32xf32>, tensor<2x8x8xf32>, tensor<2x2x32xf32>) {
  %dx, %dd, %db = dflash.grouped_conv_grad %g, %x, %d, %b
      {block_size = 4 : i64, kernel_size = 2 : i64, group_size = 16 : i64, half = {half} : i64}
      : (tensor<2x8x32xf32>, tensor<2x8x32xf32>, tensor<2x8x8xf32>, tensor<2x2x32xf32>)
      -> (tensor<2x8x32xf32>, tensor<2x8x8xf32>, tensor<2x2x32xf32>)
  return %dx, %dd, %db : tensor<2x8x32xf32>, tensor<2x8x8xf32>, tensor<2x2x32xf32>
}
)mlir";

TEST(DFlash2Gradient, GroupedConvGradientLeavesTheOtherHalfZero) {
  for (int64_t half : {0, 1}) {
    MLIRContext context;
    context.loadDialect<DFlashDialect, func::FuncDialect>();
    OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(
        substitute(kConvGradOp, {{"half", std::to_string(half)}}), &context);
    ASSERT_TRUE(module);
    func::FuncOp fn = module->lookupSymbol<func::FuncOp>("step");
    std::mt19937_64 rng(20 + half);
    std::normal_distribution<double> normal;
    std::vector<HostTensor> args;
    for (Type t : fn.getArgumentTypes()) {
      auto shape = cast<RankedTensorType>(t).getShape();
      HostTensor x(std::vector<int64_t>(shape.begin(), shape.end()));
      for (double &v : x.data)
        v = normal(rng);
      args.push_back(std::move(x));
    }
    auto out = StepInterpreter(fn, Precision::Exact).run(args);
    ASSERT_TRUE(succeeded(out));
    // D [2, 8, 2 halves x 4]; base [2 halves, 64].
    auto halfSums = [](const HostTensor &t, int64_t perHalf) {
      std::array<double, 2> sums = {0, 0};
      for (size_t i = 0; i < t.data.size(); ++i)
        sums[int64_t(i) / perHalf % 2] += std::abs(t.data[i]);
      return sums;
    };
    for (auto [sums, what] :
         {std::pair{halfSums((*out)[1], 4), "delta_grad"},
          std::pair{halfSums((*out)[2], 64), "base_grad"}}) {
      EXPECT_GT(sums[half], 0) << what << " half " << half;
      EXPECT_EQ(sums[1 - half], 0) << what << " half " << half;
    }
  }
}

//===----------------------------------------------------------------------===//
// The selector
//===----------------------------------------------------------------------===//

/// B 2, Q 8 (blocks of 4), H 32, V 64, top 4, rank 8. y = x @ wy^T feeds
/// the unary top-K, lm_head_ce (CE_u) and the selector; the loss is their
/// sum. The step also returns the selector's covered weight and hits, the
/// candidates (to pick labels among them) and CE_u alone.
const char *kSelectorStep = R"mlir(
func.func @step(%x: tensor<2x8x32xf32> {dflash.arg = #dflash.arg<input, "target_hidden">},
                %wy: tensor<32x32xf32> {dflash.arg = #dflash.arg<parameter, "wy">},
                %wh: tensor<8x32xf32> {dflash.arg = #dflash.arg<parameter, "candidate_selector.hidden_projection.weight">},
                %pcb: tensor<64x8xf32> {dflash.arg = #dflash.arg<parameter, "candidate_selector.predecessor_codebook">},
                %scb: tensor<64x8xf32> {dflash.arg = #dflash.arg<parameter, "candidate_selector.successor_codebook">},
                %head: tensor<64x32xf32> {dflash.arg = #dflash.arg<frozen, "lm_head">},
                %labels: tensor<2x8xi32> {dflash.arg = #dflash.arg<input, "labels">},
                %preds: tensor<2x8xi32> {dflash.arg = #dflash.arg<input, "predecessors">},
                %weights: tensor<2x8xf32> {dflash.arg = #dflash.arg<input, "weights">})
    -> (tensor<f32> {dflash.arg = #dflash.arg<metric, "loss_sum">},
        tensor<f32> {dflash.arg = #dflash.arg<metric, "covered_weight">},
        tensor<2x8xi8> {dflash.arg = #dflash.arg<metric, "hits">},
        tensor<2x8x4xi32> {dflash.arg = #dflash.arg<metric, "candidates">},
        tensor<f32> {dflash.arg = #dflash.arg<metric, "ce_u">}) {
  %y = dflash.linear %x, %wy : (tensor<2x8x32xf32>, tensor<32x32xf32>) -> tensor<2x8x32xf32>
  %v, %c, %lv = dflash.selector_candidates %y, %head, %labels, %weights
      {top_k = 4 : i64, multiplier = {m} : f64, softcap = {cap} : f64}
      : (tensor<2x8x32xf32>, tensor<64x32xf32>, tensor<2x8xi32>, tensor<2x8xf32>)
      -> (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>)
  %ce, %ws, %correct, %count, %ce_hits = dflash.lm_head_ce %y, %head, %labels, %weights
      : (tensor<2x8x32xf32>, tensor<64x32xf32>, tensor<2x8xi32>, tensor<2x8xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  %sel, %covered, %hits = dflash.selector_loss %v, %c, %lv, %y, %wh, %preds, %labels, %weights, %pcb, %scb
      {gold = "{gold}"{stop}}
      : (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>, tensor<2x8x32xf32>,
         tensor<8x32xf32>, tensor<2x8xi32>, tensor<2x8xi32>, tensor<2x8xf32>,
         tensor<64x8xf32>, tensor<64x8xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  %loss = dflash.add %ce, %sel : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return %loss, %covered, %hits, %c, %ce : tensor<f32>, tensor<f32>, tensor<2x8xi8>, tensor<2x8x4xi32>, tensor<f32>
}
)mlir";

struct SelectorCase {
  const char *gold;
  bool stopGradient;
  double multiplier, softcap;
};

std::string selectorStep(const SelectorCase &c) {
  char m[32], cap[32];
  std::snprintf(m, sizeof m, "%.17e", c.multiplier);
  std::snprintf(cap, sizeof cap, "%.17e", c.softcap);
  return substitute(kSelectorStep,
                    {{"gold", c.gold},
                     {"stop", c.stopGradient ? ", stop_gradient" : ""},
                     {"m", m},
                     {"cap", cap}});
}

constexpr int64_t kSelectorV = 64, kSelectorK = 4, kSelectorBs = 4;
enum SelectorResult { Loss, CoveredWeight, Hits, Candidates, CeU };

/// Random arguments whose labels are, for two slots in three, one of the
/// slot's candidates (a different rank each time), and a random token
/// (almost always outside the top-K) for the third.
std::vector<HostTensor> selectorArgs(Step &step, uint64_t seed) {
  std::vector<HostTensor> args =
      step.randomArgs(seed, kSelectorV, kSelectorBs, 0.3);
  StepSignature sig = step.signature(*step.backward);
  unsigned labels = *sig.findArg(ArgRole::Input, "labels");
  std::vector<HostTensor> out = step.runForward(args);
  EXPECT_EQ(out.size(), 5u);
  if (out.size() != 5)
    return args;
  const HostTensor &candidates = out[Candidates];
  for (size_t s = 0; s < args[labels].data.size(); ++s)
    if (s % 3 != 0 && candidates.data[s * kSelectorK] >= 0)
      args[labels].data[s] = candidates.data[s * kSelectorK + s % kSelectorK];
  return args;
}

TEST(DFlash2Gradient, SelectorMatchesFiniteDifferences) {
  for (SelectorCase c : {SelectorCase{"topk", false, 1.0, 0.0},
                         SelectorCase{"topk", false, 1.5, 3.0},
                         SelectorCase{"inject", false, 1.0, 0.0},
                         SelectorCase{"inject", false, 0.7, 2.0}}) {
    Step step(selectorStep(c));
    ASSERT_TRUE(step.ok()) << c.gold;
    std::vector<HostTensor> args = selectorArgs(step, 31);
    std::vector<HostTensor> out = step.runForward(args);
    ASSERT_EQ(out.size(), 5u);
    // Both kinds of slot are present: covered ones, and (with "topk") ones
    // without a selector term.
    double weightSum = 0;
    for (double w : args[*step.signature(*step.backward)
                              .findArg(ArgRole::Input, "weights")]
                        .data)
      weightSum += w;
    const double covered = out[CoveredWeight].data[0];
    EXPECT_GT(covered, 0) << c.gold;
    if (std::string(c.gold) == "inject")
      EXPECT_NEAR(covered, weightSum, 1e-12);
    else
      EXPECT_LT(covered, weightSum - 0.5);
    EXPECT_EQ(step.checkGradients(args, 1e-6), 4)
        << c.gold << " multiplier " << c.multiplier << " softcap " << c.softcap;
  }
}

/// With stop_gradient the selector still trains Wh and both codebooks (the
/// true gradients), and nothing of it reaches y: wy's gradient is CE_u's.
TEST(DFlash2Gradient, SelectorStopGradientReachesOnlyItsOwnWeights) {
  Step stopped(selectorStep({"inject", true, 1.5, 3.0}));
  Step full(selectorStep({"inject", false, 1.5, 3.0}));
  ASSERT_TRUE(stopped.ok() && full.ok());
  std::vector<HostTensor> args = selectorArgs(stopped, 41);
  std::map<std::string, HostTensor> stoppedGrads = stopped.gradients(args);
  std::map<std::string, HostTensor> fullGrads = full.gradients(args);
  ASSERT_EQ(stoppedGrads.size(), 4u);
  for (const auto &[name, grad] : stoppedGrads) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < grad.data.size(); ++i) {
      diff += std::abs(grad.data[i] - fullGrads[name].data[i]);
      norm += std::abs(fullGrads[name].data[i]);
    }
    if (name == "wy")
      EXPECT_GT(diff, 1e-3 * norm) << name;
    else
      EXPECT_EQ(diff, 0) << name;
  }
  // wy's gradient against central differences of CE_u alone.
  StepSignature sig = stopped.signature(*stopped.backward);
  unsigned wy = *sig.findArg(ArgRole::Parameter, "wy");
  std::mt19937_64 rng(5);
  steptest::DirectionalDerivative d = steptest::directionalDerivative(
      args, wy, stoppedGrads["wy"],
      [&](const std::vector<HostTensor> &a) {
        return stopped.runForward(a)[CeU].data[0];
      },
      1e-6, rng);
  EXPECT_LT(d.relativeError(), 1e-6)
      << "analytic " << d.analytic << " numeric " << d.numeric;
  // Those of the other three, equal to the full step's, are the whole
  // loss's.
  EXPECT_EQ(full.checkGradients(args, 1e-6), 4);
}

// A DFlash2 drafter's scaled embedding of the draft tokens: after
// dflash-fuse-kernels the scale rides on draft_embed (whose kernel takes
// it), and the interpreter gives the fused op what it gave the pair.
TEST(DFlash2Gradient, ScaledEmbeddingKeepsItsScaleWhenFused) {
  const char *text = R"(
func.func @step(%ids: tensor<1x12xi32> {dflash.arg = #dflash.arg<input, "input_ids">},
                %anchors: tensor<1x2xi32> {dflash.arg = #dflash.arg<input, "anchors">},
                %keep: tensor<1x2xi8> {dflash.arg = #dflash.arg<input, "keep">},
                %table: tensor<16x8xbf16> {dflash.arg = #dflash.arg<frozen, "embed">})
    -> (tensor<1x8x8xbf16> {dflash.arg = #dflash.arg<metric, "x">}) {
  %t = dflash.draft_tokens %ids, %anchors, %keep {block_size = 4 : i64, mask_token_id = 15 : i64}
      : (tensor<1x12xi32>, tensor<1x2xi32>, tensor<1x2xi8>) -> tensor<1x8xi32>
  %x = dflash.embed %table, %t {scale = 2.5 : f64}
      : (tensor<16x8xbf16>, tensor<1x8xi32>) -> tensor<1x8x8xbf16>
  return %x : tensor<1x8x8xbf16>
})";
  MLIRContext context;
  context.loadDialect<DFlashDialect, func::FuncDialect>();
  OwningOpRef<ModuleOp> graph = parseSourceString<ModuleOp>(text, &context);
  ASSERT_TRUE(graph);
  OwningOpRef<ModuleOp> fused = graph->clone();
  PassManager pm(&context);
  pm.addPass(createFuseKernels());
  ASSERT_TRUE(succeeded(pm.run(*fused)));
  auto fusedStep = fused->lookupSymbol<func::FuncOp>("step");
  DraftEmbedOp embed;
  fusedStep.walk([&](DraftEmbedOp o) { embed = o; });
  ASSERT_TRUE(embed) << "draft_tokens + embed were not fused";
  ASSERT_TRUE(embed.getScale().has_value());
  EXPECT_EQ(embed.getScale()->convertToDouble(), 2.5);

  std::mt19937_64 rng(21);
  std::normal_distribution<double> normal;
  std::vector<HostTensor> args = {HostTensor({1, 12}), HostTensor({1, 2}),
                                  HostTensor({1, 2}), HostTensor({16, 8})};
  for (double &id : args[0].data)
    id = double(rng() % 15);
  args[1].data = {0, 5};
  args[2].data = {1, 1};
  for (double &w : args[3].data)
    w = normal(rng);
  auto want = StepInterpreter(graph->lookupSymbol<func::FuncOp>("step"),
                              Precision::Exact)
                  .run(args);
  auto got = StepInterpreter(fusedStep, Precision::Exact).run(args);
  ASSERT_TRUE(succeeded(want) && succeeded(got));
  EXPECT_EQ((*got)[0].data, (*want)[0].data);
  // The scale is there: the anchor's row is 2.5 times its table row.
  const int64_t token = int64_t(args[0].data[0]);
  for (int64_t c = 0; c < 8; ++c)
    EXPECT_EQ((*got)[0].data[size_t(c)],
              2.5 * args[3].data[size_t(token * 8 + c)]);
}

//===----------------------------------------------------------------------===//
// The top-K folded into the lm_head ops
//===----------------------------------------------------------------------===//

/// selector_candidates (before the loss: the fused op takes its place)
/// beside lm_head_ce with and without its gradient, all of one unary
/// transform (multiplier @M, softcap @C): what dflash-fuse-kernels folds
/// into lm_head_ce_fused {top_k} and lm_head_ce_top_k. The weights are an
/// op's (the fused loss seed is placed after it): wa + wb.
const char *kFoldedTopK = R"mlir(
func.func @train(%y: tensor<2x8x32xf32>, %head: tensor<64x32xf32>, %labels: tensor<2x8xi32>,
                 %wa: tensor<2x8xf32>, %wb: tensor<2x8xf32>, %seed: tensor<f32>)
    -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x8xi8>, tensor<2x8x32xf32>,
        tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>) {
  %weights = dflash.add %wa, %wb : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %v, %c, %lv = dflash.selector_candidates %y, %head, %labels, %weights
      {top_k = 4 : i64, multiplier = @M : f64, softcap = @C : f64}
      : (tensor<2x8x32xf32>, tensor<64x32xf32>, tensor<2x8xi32>, tensor<2x8xf32>)
      -> (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>)
  %ls, %ws, %correct, %count, %hits = dflash.lm_head_ce %y, %head, %labels, %weights
      {multiplier = @M : f64, softcap = @C : f64}
      : (tensor<2x8x32xf32>, tensor<64x32xf32>, tensor<2x8xi32>, tensor<2x8xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  %dy = dflash.lm_head_ce_grad %y, %head, %labels, %weights, %seed
      {multiplier = @M : f64, softcap = @C : f64}
      : (tensor<2x8x32xf32>, tensor<64x32xf32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<f32>)
      -> tensor<2x8x32xf32>
  return %ls, %ws, %correct, %count, %hits, %dy, %v, %c, %lv
      : tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x8xi8>, tensor<2x8x32xf32>,
        tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>
}
func.func @eval(%y: tensor<2x8x32xf32>, %head: tensor<64x32xf32>, %labels: tensor<2x8xi32>,
                %wa: tensor<2x8xf32>, %wb: tensor<2x8xf32>)
    -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x8xi8>,
        tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>) {
  %weights = dflash.add %wa, %wb : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %ls, %ws, %correct, %count, %hits = dflash.lm_head_ce %y, %head, %labels, %weights
      {multiplier = @M : f64, softcap = @C : f64}
      : (tensor<2x8x32xf32>, tensor<64x32xf32>, tensor<2x8xi32>, tensor<2x8xf32>)
      -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x8xi8>)
  %v, %c, %lv = dflash.selector_candidates %y, %head, %labels, %weights
      {top_k = 4 : i64, multiplier = @M : f64, softcap = @C : f64}
      : (tensor<2x8x32xf32>, tensor<64x32xf32>, tensor<2x8xi32>, tensor<2x8xf32>)
      -> (tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>)
  return %ls, %ws, %correct, %count, %hits, %v, %c, %lv
      : tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<2x8xi8>,
        tensor<2x8x4xf32>, tensor<2x8x4xi32>, tensor<2x8xf32>
}
)mlir";

/// kFoldedTopK with the transform's multiplier and softcap.
std::string foldedTopK(const char *multiplier, const char *softcap) {
  std::string text = kFoldedTopK;
  for (auto [token, value] :
       {std::pair<std::string, const char *>{"@M", multiplier},
        {"@C", softcap}})
    for (size_t at = text.find(token); at != std::string::npos;
         at = text.find(token, at))
      text.replace(at, token.size(), value);
  return text;
}

// The interpreter runs the fused ops with the results of the ops they
// replace: the same sums, hits, top-K and label values, and the same input
// gradient (up to the seed: the fused op's is 1 / sum(w) of loss_seed).
void foldedTopKCase(const char *multiplier, const char *softcap) {
  SCOPED_TRACE(testing::Message()
               << "multiplier " << multiplier << ", softcap " << softcap);
  MLIRContext context;
  context.loadDialect<DFlashDialect, func::FuncDialect>();
  OwningOpRef<ModuleOp> separate =
      parseSourceString<ModuleOp>(foldedTopK(multiplier, softcap), &context);
  ASSERT_TRUE(separate);
  OwningOpRef<ModuleOp> fused = separate->clone();
  PassManager pm(&context);
  pm.addPass(createFuseKernels());
  ASSERT_TRUE(succeeded(pm.run(*fused)));
  int folded = 0, left = 0;
  fused->walk([&](Operation *op) {
    if (auto f = dyn_cast<LmHeadCeFusedOp>(op))
      folded += f.getTopK() == 4u;
    folded += isa<LmHeadCeTopKOp>(op);
    left += isa<SelectorCandidatesOp, LmHeadCeOp>(op);
  });
  ASSERT_EQ(folded, 2);
  ASSERT_EQ(left, 0);

  std::mt19937_64 rng(31);
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<int> token(0, 63);
  const int64_t rows = 16;
  HostTensor y({2, 8, 32}), head({64, 32}), labels({2, 8}), wa({2, 8}),
      wb({2, 8}), seed(std::vector<int64_t>{});
  for (HostTensor *t : {&y, &head})
    for (double &v : t->data)
      v = normal(rng);
  double sum = 0;
  for (int64_t r = 0; r < rows; ++r) {
    labels.data[r] = token(rng);
    // Rows of weight 0 (candidates -1, values 0) among weighted ones.
    wa.data[r] = r % 3 == 0 ? 0.0 : std::exp(-std::abs(normal(rng)));
    wb.data[r] = 0.0;
    sum += wa.data[r];
  }
  seed.data[0] = 1.0 / sum;
  for (const char *name : {"train", "eval"}) {
    SCOPED_TRACE(name);
    const bool train = std::string(name) == "train";
    std::vector<HostTensor> args = {y, head, labels, wa, wb};
    if (train)
      args.push_back(seed);
    auto a = StepInterpreter(separate->lookupSymbol<func::FuncOp>(name),
                             Precision::Exact)
                 .run(args);
    auto b = StepInterpreter(fused->lookupSymbol<func::FuncOp>(name),
                             Precision::Exact)
                 .run(args);
    ASSERT_TRUE(succeeded(a));
    ASSERT_TRUE(succeeded(b));
    ASSERT_EQ(a->size(), b->size());
    const size_t dy = train ? 5 : size_t(-1);
    for (size_t i = 0; i < a->size(); ++i) {
      const std::vector<double> &x = (*a)[i].data, &z = (*b)[i].data;
      ASSERT_EQ(x.size(), z.size()) << "result " << i;
      for (size_t e = 0; e < x.size(); ++e) {
        if (i == dy)
          EXPECT_NEAR(z[e], x[e], 1e-12 * (1 + std::abs(x[e])))
              << "input gradient " << e;
        else
          EXPECT_EQ(z[e], x[e]) << "result " << i << " element " << e;
      }
    }
    // Weighted rows have their top 4, the others -1.
    const std::vector<double> &candidates = (*b)[train ? 7 : 6].data;
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(candidates[size_t(r * 4)] < 0, r % 3 == 0) << "row " << r;
  }
}

// With the identity and with a DFlash2 unary transform, which the fused ops
// must carry for the results to be the same.
TEST(DFlash2Gradient, FoldedTopKInterpretsAsTheSeparateOps) {
  for (auto [multiplier, softcap] :
       {std::pair<const char *, const char *>{"1.0", "0.0"}, {"1.5", "4.0"}})
    foldedTopKCase(multiplier, softcap);
}

} // namespace
