//===- StepGradientTest.cpp - The compiled step against its own math ------===//
//
// Runs the IR of specs/tiny.toml in the reference interpreter, in fp64:
// - the gradients that dflash-generate-backward builds equal finite
//   differences of the forward graph's loss, for every parameter, with a
//   sliding layer and keep = 0 blocks present;
// - the two traps of docs/semantics.md section 8: labels are same-position, and
//   an anchor's own context position is invisible to its block;
// - the same gradients for specs/tiny-dflash2.toml (section 13), with each of
//   the selector's loss options and alpha_t in its warmup, ramp and full.
//
//===----------------------------------------------------------------------===//

#include "compiler/Analysis/MemoryPlan.h"
#include "compiler/Analysis/StepSignature.h"
#include "compiler/Import/ImportSpec.h"
#include "compiler/Interpreter/Interpreter.h"
#include "compiler/Pipelines/Pipelines.h"
#include "compiler/Transforms/Passes.h"
#include "kernels/reference/DFlash2.h"
#include "schema/Parameters.h"
#include "test/unit/StepGradientSupport.h"

#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace {

class StepTest : public ::testing::Test {
protected:
  void SetUp() override {
    SpecError error;
    auto loaded = loadSpec(
        std::string(DFLASH_SPECS_DIR) + "/" + specName() + ".toml", error);
    ASSERT_TRUE(loaded) << error.str();
    spec = *loaded;
    configure(spec);
    forward = importSpec(context, spec);
    ASSERT_TRUE(forward);
    backward = forward->clone();
    PassManager pm(&context);
    pm.addPass(createGenerateBackward());
    ASSERT_TRUE(succeeded(pm.run(*backward)));
  }

  /// The shipped spec (specs/NAME.toml) and what changes it before its graph
  /// is built (tiny.toml as it is here).
  virtual const char *specName() const { return "tiny"; }
  virtual void configure(DrafterSpec &) {}

  /// Each gradient within `tolerance` (relative) of central differences
  /// with step `h`.
  void checkGradients(double tolerance = 1e-6, double h = 1e-5);

  /// The results of two forms of one step on the same random inputs.
  struct TwoRuns {
    FailureOr<std::vector<HostTensor>> first, second;
  };
  TwoRuns runBoth(func::FuncOp first, func::FuncOp second, uint64_t seed,
                  Precision precision) {
    std::vector<HostTensor> args = randomArgs(first, seed);
    return {StepInterpreter(first, precision).run(args),
            StepInterpreter(second, precision).run(args)};
  }

  /// Every result of the second run within 1e-9 of the first's, relative
  /// to its norm (fp64: the two differ only in the order of sums).
  static void expectSameResults(const TwoRuns &runs) {
    ASSERT_TRUE(succeeded(runs.first));
    ASSERT_TRUE(succeeded(runs.second));
    const std::vector<HostTensor> &want = *runs.first, &got = *runs.second;
    ASSERT_EQ(want.size(), got.size());
    for (size_t r = 0; r < want.size(); ++r) {
      double err = 0, ref = 0;
      for (size_t i = 0; i < want[r].data.size(); ++i) {
        double d = want[r].data[i] - got[r].data[i];
        err += d * d;
        ref += want[r].data[i] * want[r].data[i];
      }
      EXPECT_LE(std::sqrt(err), 1e-9 * std::max(1.0, std::sqrt(ref)))
          << "result " << r;
    }
  }

  /// Random inputs for `step`: anchors distinct and ascending with keep = 0
  /// on two blocks, a loss mask with holes, weights of the scale training
  /// sees (norm weights near 1).
  std::vector<HostTensor> randomArgs(func::FuncOp step, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal;
    std::uniform_real_distribution<double> uniform;
    FailureOr<StepSignature> sig =
        StepSignature::get(step->getParentOfType<ModuleOp>());
    EXPECT_TRUE(succeeded(sig));
    std::vector<HostTensor> args;
    const int64_t B = spec.rowsPerStep(), S = spec.seqLen,
                  N = spec.anchorsPerRow;
    for (unsigned i = 0; i < step.getNumArguments(); ++i) {
      auto type = cast<RankedTensorType>(step.getArgument(i).getType());
      HostTensor t(
          std::vector<int64_t>(type.getShape().begin(), type.getShape().end()));
      ArgAttr info = sig->argInfo(i);
      StringRef name = info.getName();
      if (name == "input_ids") {
        for (double &x : t.data)
          x = double(rng() % (spec.vocabSize - 1));
      } else if (name == "loss_mask") {
        for (double &x : t.data)
          x = uniform(rng) < 0.8 ? 1 : 0;
      } else if (name == "anchors") {
        for (int64_t b = 0; b < B; ++b) {
          std::vector<int> all(S - 1);
          for (int j = 0; j < S - 1; ++j)
            all[j] = j;
          std::shuffle(all.begin(), all.end(), rng);
          std::sort(all.begin(), all.begin() + N);
          // Anchors near both ends of the row.
          all[0] = 0;
          all[N - 1] = int(S - 2);
          std::sort(all.begin(), all.begin() + N);
          for (int64_t n = 0; n < N; ++n)
            t.data[b * N + n] = all[n];
        }
      } else if (name == "position_ids") { // unpacked rows
        for (int64_t i = 0; i < B * S; ++i)
          t.data[i] = double(i % S);
      } else if (name == "keep") {
        for (double &x : t.data)
          x = 1;
        t.data[1] = 0;
        t.data[N + 4] = 0;
      } else if (name == "loss_sum_grad") {
        t.data[0] = 1;
      } else if (info.getRole() == ArgRole::Counter) {
        t.data[0] = name == "step" ? 3 : 10;
      } else if (info.getRole() == ArgRole::Moment2) {
        for (double &x : t.data)
          x = 1e-4 * std::abs(normal(rng));
      } else if (info.getRole() == ArgRole::Parameter && type.getRank() == 1) {
        for (double &x : t.data)
          x = 1 + 0.1 * normal(rng);
      } else {
        double scale = info.getRole() == ArgRole::Input ? 1.0 : 0.05;
        for (double &x : t.data)
          x = scale * normal(rng);
      }
      args.push_back(std::move(t));
    }
    return args;
  }

  double forwardLoss(const std::vector<HostTensor> &args) {
    func::FuncOp step = forward->lookupSymbol<func::FuncOp>("step");
    StepInterpreter interp(step, Precision::Exact);
    // The forward graph has every argument of the backward one but the seed.
    std::vector<HostTensor> fwdArgs(args.begin(),
                                    args.begin() + step.getNumArguments());
    auto out = interp.run(fwdArgs);
    EXPECT_TRUE(succeeded(out));
    return (*out)[0].data[0];
  }

  MLIRContext context;
  DrafterSpec spec;
  OwningOpRef<ModuleOp> forward, backward;
};

/// tiny.toml with YaRN over an original context of 16 positions (its rows
/// hold 128): the rotation's transpose, scaled by the attention factor, is
/// the gradient of the rotation.
class YarnStepTest : public StepTest {
protected:
  void configure(DrafterSpec &s) override {
    s.ropeScalingFactor = 4;
    s.ropeScalingOriginalMaxPositions = 16;
    s.ropeScalingAttentionFactor = 0.1 * std::log(4.0) + 1;
  }
};

TEST_F(StepTest, GradientsMatchFiniteDifferences) { checkGradients(); }

TEST_F(YarnStepTest, GradientsMatchFiniteDifferences) {
  bool scaled = false;
  forward->walk([&](RopeOp rope) { scaled |= bool(rope.getYarnAttr()); });
  EXPECT_TRUE(scaled);
  // Logits scaled by the attention factor squared curve the loss more: the
  // differences' own error is about 1e-6 (a wrong transpose or factor is
  // off by far more).
  checkGradients(1e-5);
}

void StepTest::checkGradients(double tolerance, double h) {
  func::FuncOp step = backward->lookupSymbol<func::FuncOp>("step");
  std::vector<HostTensor> args = randomArgs(step, 7);
  StepInterpreter interp(step, Precision::Exact);
  auto out = interp.run(args);
  ASSERT_TRUE(succeeded(out));
  FailureOr<StepSignature> sig = StepSignature::get(*backward);
  ASSERT_TRUE(succeeded(sig));

  // Directional derivative along a random direction per parameter tensor:
  // (L(p + h d) - L(p - h d)) / 2h against <grad, d>.
  std::mt19937_64 rng(11);
  double errSq = 0, refSq = 0;
  int checked = 0;
  for (unsigned r : sig->resultsWithRole(ArgRole::Gradient)) {
    StringRef name = sig->resultInfo(r).getName();
    unsigned p = *sig->findArg(ArgRole::Parameter, name);
    steptest::DirectionalDerivative d = steptest::directionalDerivative(
        args, p, (*out)[r],
        [&](const std::vector<HostTensor> &a) { return forwardLoss(a); }, h,
        rng);
    EXPECT_LT(d.relativeError(), tolerance)
        << name.str() << ": analytic " << d.analytic << " numeric "
        << d.numeric;
    errSq += (d.numeric - d.analytic) * (d.numeric - d.analytic);
    refSq += d.analytic * d.analytic;
    ++checked;
  }
  // tiny: fc, hidden_norm, 2 layers x 11, norm; tiny-dflash2 4 more a layer
  // and the selector's 3.
  EXPECT_EQ(checked, spec.dflash2 ? 36 : 25);
  EXPECT_EQ(size_t(checked), parameterTable(spec).size());
  EXPECT_LT(std::sqrt(errSq / refSq), tolerance);
}

/// specs/tiny-dflash2.toml, run at step 3 of 10 (randomArgs' counters), with
/// random convolution and selector weights (not their identity start). The
/// selector's loss options and its alpha_t schedule come from the test.
struct DFlash2Options {
  const char *name;
  bool inject, covered, stopGradient;
  double warmupRatio, rampRatio; ///< of 10 steps; at step 3
};

class DFlash2StepTest : public StepTest,
                        public ::testing::WithParamInterface<DFlash2Options> {
protected:
  const char *specName() const override { return "tiny-dflash2"; }
  void configure(DrafterSpec &s) override {
    const DFlash2Options &o = GetParam();
    s.selectorGoldInject = o.inject;
    s.selectorDenominatorCovered = o.covered;
    s.selectorStopGradient = o.stopGradient;
    s.selectorAlpha = 0.7;
    s.selectorWarmupRatio = o.warmupRatio;
    s.selectorRampRatio = o.rampRatio;
  }
};

TEST_P(DFlash2StepTest, GradientsMatchFiniteDifferences) {
  ASSERT_TRUE(spec.dflash2);
  // A smaller step: the top-K is piecewise constant, and with "inject" a
  // step of 1e-5 crosses a near-tie of the unary logits, which changes the
  // set of candidates (a jump, not a wrong gradient). At 1e-6 the
  // differences' rounding is about 1e-7 of a loss sum near 1e3: a few 1e-6
  // relative on the smallest gradients (0.05); a wrong one is off by far
  // more.
  checkGradients(1e-5, 1e-6);
}

// alpha_t as docs/semantics.md section 13 defines it, at step 3 of 10.
TEST(DFlash2Schedule, SelectorAlpha) {
  EXPECT_EQ(ref::selectorAlphaAt(3, 10, 0.7, 0.5, 0.0), 0.0); // warm 5
  EXPECT_DOUBLE_EQ(ref::selectorAlphaAt(3, 10, 0.7, 0.2, 0.5),
                   0.7 * 2 / 5); // warm 2, the 2nd of 5 ramp steps
  EXPECT_EQ(ref::selectorAlphaAt(3, 10, 0.7, 0.0, 0.0), 0.7);
  EXPECT_EQ(ref::selectorAlphaAt(3, 10, 0.7, 0.1, 0.2), 0.7); // ramped at 2
  EXPECT_EQ(ref::selectorAlphaAt(0, 0, 0.7, 0.5, 0.5), 0.7);  // no schedule
}

INSTANTIATE_TEST_SUITE_P(
    Options, DFlash2StepTest,
    ::testing::Values(DFlash2Options{"topk_all", false, false, false, 0, 0},
                      DFlash2Options{"inject", true, false, false, 0, 0},
                      DFlash2Options{"covered", false, true, false, 0, 0},
                      DFlash2Options{"stop_gradient", false, false, true, 0, 0},
                      DFlash2Options{"warmup", false, false, false, 0.5, 0},
                      DFlash2Options{"ramp", false, true, false, 0.2, 0.5}),
    [](const ::testing::TestParamInfo<DFlash2Options> &info) {
      return std::string(info.param.name);
    });

TEST_F(StepTest, AnchorsOwnContextPositionIsInvisible) {
  func::FuncOp step = forward->lookupSymbol<func::FuncOp>("step");
  std::vector<HostTensor> args = randomArgs(step, 3);
  FailureOr<StepSignature> sig = StepSignature::get(*forward);
  unsigned anchorsArg = *sig->findArg(ArgRole::Input, "anchors");
  unsigned keepArg = *sig->findArg(ArgRole::Input, "keep");
  unsigned hiddenArg = *sig->findArg(ArgRole::Input, "target_hidden");
  const int64_t S = spec.seqLen;
  const int64_t width = spec.numTaps() * spec.hiddenSize;
  // Only block 5 of row 0 counts.
  for (double &k : args[keepArg].data)
    k = 0;
  args[keepArg].data[5] = 1;
  int64_t a = int64_t(args[anchorsArg].data[5]);
  ASSERT_GT(a, 0);
  ASSERT_LT(a, S - 1);
  double base = forwardLoss(args);

  auto perturbed = [&](int64_t position) {
    std::vector<HostTensor> changed = args;
    for (int64_t c = 0; c < width; ++c)
      changed[hiddenArg].data[position * width + c] += 1.0;
    return forwardLoss(changed);
  };
  // The anchor's own feature and those after it do not exist yet at
  // inference: the loss must not move at all.
  EXPECT_EQ(perturbed(a), base);
  EXPECT_EQ(perturbed(a + 1), base);
  // The position just before the anchor is visible.
  EXPECT_NE(perturbed(a - 1), base);
}

TEST_F(StepTest, LabelsAreSamePosition) {
  func::FuncOp step = forward->lookupSymbol<func::FuncOp>("step");
  std::vector<HostTensor> args = randomArgs(step, 5);
  FailureOr<StepSignature> sig = StepSignature::get(*forward);
  unsigned idsArg = *sig->findArg(ArgRole::Input, "input_ids");
  unsigned maskArg = *sig->findArg(ArgRole::Input, "loss_mask");
  unsigned anchorsArg = *sig->findArg(ArgRole::Input, "anchors");
  unsigned keepArg = *sig->findArg(ArgRole::Input, "keep");
  // One kept block (row 0, block 3) whose only supervised slot is k = 1,
  // at position a + 1: its label must be input_ids[a + 1].
  for (double &k : args[keepArg].data)
    k = 0;
  args[keepArg].data[3] = 1;
  int64_t a = int64_t(args[anchorsArg].data[3]);
  ASSERT_LT(a + 2, spec.seqLen);
  for (double &m : args[maskArg].data)
    m = 0;
  args[maskArg].data[a] = 1;
  args[maskArg].data[a + 1] = 1;
  double base = forwardLoss(args);
  ASSERT_GT(base, 0);

  auto withToken = [&](int64_t position) {
    std::vector<HostTensor> changed = args;
    double &id = changed[idsArg].data[position];
    id = double((int64_t(id) + 1) % (spec.vocabSize - 1));
    return forwardLoss(changed);
  };
  EXPECT_NE(withToken(a + 1), base); // the label of slot k = 1
  EXPECT_EQ(withToken(a + 2), base); // a shifted label would read this
}

// dflash-fuse-kernels regroups ops and dflash-bucket-gradients adds the fp32
// all-reduce buckets; the step they compute must not change.
TEST_F(StepTest, FusedKernelsComputeTheSameStep) {
  OwningOpRef<ModuleOp> train = forward->clone();
  PassManager pm(&context);
  buildTrainStepPipeline(pm);
  ASSERT_TRUE(succeeded(pm.run(*train)));
  OwningOpRef<ModuleOp> fused = train->clone();
  PassManager fuse(&context);
  fuse.addPass(createFuseKernels());
  BucketGradientsOptions buckets;
  buckets.bucketMiB = 1; // several buckets even for tiny
  fuse.addPass(createBucketGradients(buckets));
  ASSERT_TRUE(succeeded(fuse.run(*fused)));
  int numBuckets = 0;
  fused->walk([&](GradientBucketOp) { ++numBuckets; });
  EXPECT_GT(numBuckets, 1);
  // Something was fused.
  int graphLevel = 0;
  fused->walk([&](Operation *op) {
    graphLevel += isa<LmHeadCeOp, LmHeadCeGradOp, AdamWOp, RopeOp>(op);
  });
  EXPECT_EQ(graphLevel, 0);
  // Two residual adds a layer went into their GEMMs' epilogues.
  int linearResiduals = 0;
  fused->walk([&](LinearResidualOp) { ++linearResiduals; });
  EXPECT_EQ(linearResiduals, 2 * spec.numLayers);

  func::FuncOp trainStep = train->lookupSymbol<func::FuncOp>("step");
  func::FuncOp fusedStep = fused->lookupSymbol<func::FuncOp>("step");
  ASSERT_EQ(trainStep.getNumArguments(), fusedStep.getNumArguments());
  expectSameResults(runBoth(trainStep, fusedStep, 13, Precision::Exact));
}

// Gradient accumulation lowered: 4 micro-batches of 2 rows, fused (one
// loss seed), interleaved (each micro-batch's forward and backward before
// the next), their cheap activations recomputed and their gradients
// bucketed, compute the training step of 8 rows at once: the same inputs,
// the same results up to the order of the sums (fp64).
TEST_F(StepTest, AccumulatedMicroBatchesComputeTheStepOfAllTheirRows) {
  DrafterSpec whole = spec, micro = spec;
  whole.rowsPerGpu = 8;
  micro.rowsPerGpu = 2;
  micro.gradientAccumulation = 4;
  auto trainStep = [&](const DrafterSpec &s) {
    OwningOpRef<ModuleOp> m = importSpec(context, s);
    EXPECT_TRUE(m);
    PassManager pm(&context);
    buildTrainStepPipeline(pm);
    EXPECT_TRUE(succeeded(pm.run(*m)));
    return m;
  };
  OwningOpRef<ModuleOp> expected = trainStep(whole);
  OwningOpRef<ModuleOp> lowered = trainStep(micro);
  PassManager pm(&context);
  pm.addPass(createFuseKernels());
  pm.addPass(createInterleaveMicroBatches());
  RecomputeActivationsOptions recompute;
  recompute.enabled = true;
  pm.addPass(createRecomputeActivations(recompute));
  pm.addPass(createBucketGradients());
  ASSERT_TRUE(succeeded(pm.run(*lowered)));
  int seeds = 0, heads = 0;
  lowered->walk([&](LossSeedOp) { ++seeds; });
  lowered->walk([&](LmHeadCeFusedOp) { ++heads; });
  EXPECT_EQ(seeds, 1);
  EXPECT_EQ(heads, 4);

  spec = whole; // randomArgs: 8 rows a step
  func::FuncOp a = expected->lookupSymbol<func::FuncOp>("step");
  func::FuncOp b = lowered->lookupSymbol<func::FuncOp>("step");
  ASSERT_EQ(a.getFunctionType(), b.getFunctionType());
  expectSameResults(runBoth(a, b, 29, Precision::Exact));
}

// dflash-recompute-activations computes the norms, q/k norm + RoPE and
// SwiGLU again for the backward pass, and with mlp-products the gate and up
// products: the step must compute the same values (exactly: the clones are
// the same ops on the same inputs).
class RecomputeTest
    : public StepTest,
      public testing::WithParamInterface<std::pair<bool, bool>> {};

TEST_P(RecomputeTest, ComputesTheSameStep) {
  auto [cheap, mlpProducts] = GetParam();
  OwningOpRef<ModuleOp> fused = forward->clone();
  PassManager pm(&context);
  buildTrainStepPipeline(pm);
  pm.addPass(createFuseKernels());
  ASSERT_TRUE(succeeded(pm.run(*fused)));
  OwningOpRef<ModuleOp> recomputed = fused->clone();
  PassManager again(&context);
  RecomputeActivationsOptions options;
  options.enabled = cheap;
  options.mlpProducts = mlpProducts;
  again.addPass(createRecomputeActivations(options));
  ASSERT_TRUE(succeeded(again.run(*recomputed)));
  auto count = [](ModuleOp m, auto isKind) {
    int n = 0;
    m.walk([&](Operation *op) { n += isKind(op); });
    return n;
  };
  auto isCheap = [](Operation *op) {
    return isa<RmsNormOp, QkNormRopeOp, SwigluOp>(op);
  };
  auto isLinear = [](Operation *op) { return isa<LinearOp>(op); };
  // Per layer: its two norms, the q/k norm + RoPE of q, of the draft keys
  // and of the context keys, and SwiGLU; and the context's hidden norm (the
  // final norm feeds only the fused lm_head, which is forward). The MLP
  // products: gate and up, two a layer.
  EXPECT_EQ(count(*recomputed, isCheap) - count(*fused, isCheap),
            cheap ? 6 * spec.numLayers + 1 : 0);
  EXPECT_EQ(count(*recomputed, isLinear) - count(*fused, isLinear),
            mlpProducts ? 2 * spec.numLayers : 0);

  func::FuncOp keptStep = fused->lookupSymbol<func::FuncOp>("step");
  func::FuncOp againStep = recomputed->lookupSymbol<func::FuncOp>("step");
  auto [expected, actual] =
      runBoth(keptStep, againStep, 17, Precision::Storage);
  ASSERT_TRUE(succeeded(expected));
  ASSERT_TRUE(succeeded(actual));
  ASSERT_EQ(expected->size(), actual->size());
  for (size_t r = 0; r < expected->size(); ++r)
    EXPECT_EQ((*expected)[r].data, (*actual)[r].data) << "result " << r;
}

INSTANTIATE_TEST_SUITE_P(
    RecomputedActivations, RecomputeTest,
    testing::Values(std::make_pair(true, false), std::make_pair(true, true),
                    std::make_pair(false, true)),
    [](const testing::TestParamInfo<std::pair<bool, bool>> &info) {
      return std::string(info.param.first ? "Cheap" : "") +
             (info.param.second ? "MlpProducts" : "");
    });

// dflash-shard-optimizer-state moves the optimizer state into one shard
// per bucket; over one GPU the shard is the bucket's whole flat range and
// the step must compute exactly what the per-tensor state computes.
TEST_F(StepTest, ShardedOptimizerStateComputesTheSameStep) {
  OwningOpRef<ModuleOp> fused = forward->clone();
  PassManager pm(&context);
  buildTrainStepPipeline(pm);
  pm.addPass(createFuseKernels());
  BucketGradientsOptions buckets;
  buckets.bucketMiB = 1;
  pm.addPass(createBucketGradients(buckets));
  ASSERT_TRUE(succeeded(pm.run(*fused)));
  OwningOpRef<ModuleOp> sharded = fused->clone();
  PassManager shard(&context);
  ShardOptimizerStateOptions options;
  options.worldSize = 1;
  shard.addPass(createShardOptimizerState(options));
  ASSERT_TRUE(succeeded(shard.run(*sharded)));

  FailureOr<StepSignature> whole = StepSignature::get(*fused);
  FailureOr<StepSignature> split = StepSignature::get(*sharded);
  ASSERT_TRUE(succeeded(whole) && succeeded(split));
  AdamWShardedOp update;
  split->func().walk([&](AdamWShardedOp op) { update = op; });
  ASSERT_TRUE(update);
  SmallVector<GradientBucketOp> groups = shardedBuckets(update);
  ASSERT_GT(groups.size(), 1u);
  EXPECT_TRUE(split->argsWithRole(ArgRole::Master).size() == groups.size());

  // Where each tensor's state lives in its bucket's shard.
  struct Place {
    unsigned bucket;
    int64_t offset;
  };
  std::map<std::string, Place> places;
  for (auto [k, bucket] : llvm::enumerate(groups)) {
    SmallVector<int64_t> offsets = bucketResultOffsets(bucket);
    for (auto [r, offset] : llvm::zip(bucket.getResults(), offsets)) {
      unsigned i = unsigned(llvm::find(update.getGrads(), r) -
                            update.getGrads().begin());
      auto param = cast<BlockArgument>(update.getParams()[i]);
      std::string name = split->argInfo(param.getArgNumber()).getName().str();
      places[name] = {unsigned(k), offset / 4};
    }
  }
  ASSERT_EQ(places.size(), update.getParams().size());

  std::vector<HostTensor> wholeArgs = randomArgs(whole->func(), 29);
  std::vector<HostTensor> splitArgs;
  for (unsigned i = 0; i < split->func().getNumArguments(); ++i) {
    ArgAttr info = split->argInfo(i);
    std::optional<unsigned> same =
        whole->findArg(info.getRole(), info.getName());
    if (same) {
      splitArgs.push_back(wholeArgs[*same]);
      continue;
    }
    // A bucket's shard: each tensor's state at its place, zero padding.
    auto type = cast<RankedTensorType>(split->func().getArgument(i).getType());
    HostTensor t({type.getDimSize(0)});
    unsigned k = unsigned(std::stoul(info.getName().str().substr(7)));
    for (const auto &[name, place] : places) {
      if (place.bucket != k)
        continue;
      std::optional<unsigned> state = whole->findArg(info.getRole(), name);
      ASSERT_TRUE(state) << name;
      const HostTensor &full = wholeArgs[*state];
      std::copy(full.data.begin(), full.data.end(),
                t.data.begin() + place.offset);
    }
    splitArgs.push_back(std::move(t));
  }

  auto expected =
      StepInterpreter(whole->func(), Precision::Exact).run(wholeArgs);
  auto actual = StepInterpreter(split->func(), Precision::Exact).run(splitArgs);
  ASSERT_TRUE(succeeded(expected));
  ASSERT_TRUE(succeeded(actual));
  int compared = 0;
  for (unsigned r = 0; r < split->func().getNumResults(); ++r) {
    ArgAttr info = split->resultInfo(r);
    const HostTensor &got = (*actual)[r];
    if (std::optional<unsigned> same =
            whole->findResult(info.getRole(), info.getName())) {
      EXPECT_EQ(got.data, (*expected)[*same].data) << info.getName().str();
      ++compared;
      continue;
    }
    unsigned k = unsigned(std::stoul(info.getName().str().substr(7)));
    for (const auto &[name, place] : places) {
      if (place.bucket != k)
        continue;
      std::optional<unsigned> state = whole->findResult(info.getRole(), name);
      ASSERT_TRUE(state) << name;
      const HostTensor &full = (*expected)[*state];
      std::vector<double> part(got.data.begin() + place.offset,
                               got.data.begin() + place.offset + full.numel());
      EXPECT_EQ(part, full.data) << name;
      ++compared;
    }
  }
  // Parameters, metrics and every tensor's three state groups.
  EXPECT_EQ(compared, int(whole->func().getNumResults()));
}

} // namespace
