//===- TargetForwardTest.cpp - The online target's graph on the CPU -------===//
//
// Builds the target forward of a small Qwen3-style, a Llama-3-style
// (rope-scaled) and a Qwen3.5-MoE-style hybrid decoder (Gated DeltaNet and
// gated attention layers, routed and shared experts) for specs/tiny.toml
// (2 rows of 128 tokens, taps 1 and 5) and runs it in the reference
// interpreter, in fp64:
// - packed rows: a conversation's features do not depend on what else its
//   row holds or where in the row it starts (row 0 packs A then B, row 1 B
//   then A: the features agree exactly, moved), and the control, the same
//   row with one conversation's positions, differs;
// - causality: changing a later token leaves every earlier feature as is,
//   and reaches the next position;
// - dflash-fuse-kernels (linear_residual, qk_norm_rope and, as `[memory]
//   fuse_target_mlp` asks, linear_swiglu) leaves the features as they were.
//
//===----------------------------------------------------------------------===//

#include "compiler/Import/ImportTarget.h"
#include "compiler/Interpreter/Interpreter.h"
#include "compiler/Transforms/Passes.h"
#include "dialect/DFlashOps.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace mlir;
using namespace ::dflash;

namespace {

TargetModelConfig qwen3Like(const DrafterSpec &spec) {
  TargetModelConfig c;
  c.configPath = "qwen3/config.json";
  c.modelType = "qwen3";
  c.hiddenSize = spec.targetHiddenSize;
  c.intermediateSize = 384;
  c.numLayers = spec.targetNumLayers;
  c.numHeads = 4;
  c.numKvHeads = 2;
  c.headDim = 32;
  c.vocabSize = spec.vocabSize;
  c.ropeTheta = 1e6;
  c.qkNorm = true;
  return c;
}

TargetModelConfig llamaLike(const DrafterSpec &spec) {
  TargetModelConfig c = qwen3Like(spec);
  c.configPath = "llama/config.json";
  c.modelType = "llama";
  c.numHeads = 8;
  c.headDim = c.hiddenSize / c.numHeads;
  c.qkNorm = false;
  c.ropeTheta = 5e5;
  // A short original context, so that all three bands of the scaling occur
  // within 128 positions' frequencies.
  c.ropeScaling = Llama3RopeScaling{8.0, 1.0, 4.0, 64};
  return c;
}

/// Qwen3.5-MoE's shapes, small: layers 3 and 7 full attention (the
/// default interval), the rest Gated DeltaNet; every MLP routed (8
/// experts, 2 a token) beside a shared expert.
TargetModelConfig hybridLike(const DrafterSpec &spec) {
  TargetModelConfig c = qwen3Like(spec);
  c.configPath = "qwen3_5_moe/config.json";
  c.modelType = "qwen3_5_moe_text";
  c.hybrid = true;
  c.ropeTheta = 1e7;
  c.rotaryDim = 8;
  c.linearLayers.assign(size_t(c.numLayers), true);
  for (int64_t i = 3; i < c.numLayers; i += 4)
    c.linearLayers[size_t(i)] = false;
  c.linearKeyHeads = 2;
  c.linearValueHeads = 4;
  c.linearKeyHeadDim = 32;
  c.linearValueHeadDim = 32;
  c.linearConvKernel = 4;
  c.numExperts = 8;
  c.numExpertsPerToken = 2;
  c.moeIntermediateSize = 64;
  c.normTopkProb = true;
  c.sharedExpertIntermediateSize = 96;
  return c;
}

enum class Decoder { Qwen3, Llama3Scaled, Qwen35MoeHybrid };

class TargetForward : public ::testing::TestWithParam<Decoder> {
protected:
  void SetUp() override {
    SpecError error;
    auto loaded = loadSpec(std::string(DFLASH_SPECS_DIR) + "/tiny.toml", error);
    ASSERT_TRUE(loaded) << error.str();
    spec = *loaded;
    target = GetParam() == Decoder::Llama3Scaled      ? llamaLike(spec)
             : GetParam() == Decoder::Qwen35MoeHybrid ? hybridLike(spec)
                                                      : qwen3Like(spec);
    module = importTarget(context, spec, target);
    ASSERT_TRUE(module);
    func = cast<func::FuncOp>(module->getBody()->front());
    // Weights: linears N(0, 0.05), norms near 1; one set for every run.
    std::mt19937_64 rng(7);
    std::normal_distribution<double> normal;
    weights.resize(func.getNumArguments() - 2);
    for (unsigned i = 2; i < func.getNumArguments(); ++i) {
      auto type = cast<RankedTensorType>(func.getArgument(i).getType());
      HostTensor t(std::vector<int64_t>(type.getShape()));
      bool norm = type.getRank() == 1;
      for (double &v : t.data)
        v = norm ? 1.0 + 0.1 * normal(rng) : 0.05 * normal(rng);
      weights[i - 2] = std::move(t);
    }
  }

  /// The features [B, S, L*H] of ids and positions ([B, S] each), by `f`
  /// (the imported graph unless given).
  std::vector<double> run(const std::vector<int32_t> &ids,
                          const std::vector<int32_t> &positions,
                          func::FuncOp f = nullptr) {
    const int64_t B = spec.rowsPerGpu, S = spec.seqLen;
    std::vector<HostTensor> args;
    for (const std::vector<int32_t> *v : {&ids, &positions}) {
      HostTensor t({B, S});
      for (size_t i = 0; i < v->size(); ++i)
        t.data[i] = (*v)[i];
      args.push_back(std::move(t));
    }
    args.insert(args.end(), weights.begin(), weights.end());
    StepInterpreter interpreter(f ? f : func, Precision::Exact);
    FailureOr<std::vector<HostTensor>> out = interpreter.run(args);
    EXPECT_TRUE(succeeded(out));
    if (failed(out))
      return {};
    return (*out)[0].data;
  }

  MLIRContext context;
  DrafterSpec spec;
  TargetModelConfig target;
  OwningOpRef<ModuleOp> module;
  func::FuncOp func;
  std::vector<HostTensor> weights;
};

TEST_P(TargetForward, PackedConversationsAreIndependent) {
  const int64_t S = spec.seqLen, a = 50,
                width = spec.numTaps() * spec.hiddenSize;
  ASSERT_EQ(spec.rowsPerGpu, 2);
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int32_t> token(0, int32_t(spec.vocabSize - 1));
  std::vector<int32_t> A(a), Bc(S - a);
  for (int32_t &t : A)
    t = token(rng);
  for (int32_t &t : Bc)
    t = token(rng);
  // Row 0: A then B; row 1: B then A; positions restart per conversation.
  std::vector<int32_t> ids(size_t(2 * S)), pos(size_t(2 * S));
  size_t filled = 0;
  auto append = [&](const std::vector<int32_t> &conv) {
    for (size_t p = 0; p < conv.size(); ++p, ++filled) {
      ids[filled] = conv[p];
      pos[filled] = int32_t(p);
    }
  };
  append(A);
  append(Bc);
  append(Bc);
  append(A);
  std::vector<double> f = run(ids, pos);
  ASSERT_EQ(int64_t(f.size()), 2 * S * width);
  auto feature = [&](int64_t row, int64_t t) {
    return &f[(row * S + t) * width];
  };
  int64_t differ = 0;
  for (int64_t t = 0; t < a; ++t) // A: row 0 at t, row 1 at S - a + t
    for (int64_t e = 0; e < width; ++e)
      differ += feature(0, t)[e] != feature(1, S - a + t)[e];
  for (int64_t t = 0; t < S - a; ++t) // B: row 0 at a + t, row 1 at t
    for (int64_t e = 0; e < width; ++e)
      differ += feature(0, a + t)[e] != feature(1, t)[e];
  EXPECT_EQ(differ, 0) << "a conversation's features depend on its row";

  // Control: row 0 as one conversation; B's tokens there now see A.
  std::vector<int32_t> plain = pos;
  for (int64_t t = 0; t < S; ++t)
    plain[size_t(t)] = int32_t(t);
  std::vector<double> g = run(ids, plain);
  int64_t moved = 0;
  for (int64_t e = 0; e < width; ++e)
    moved += g[size_t((0 * S + a) * width + e)] != feature(1, 0)[e];
  EXPECT_GT(moved, 0) << "positions do not separate conversations";
  // ... while A, first in the row, is the same either way.
  for (int64_t e = 0; e < width; ++e)
    EXPECT_EQ(g[size_t(e)], feature(0, 0)[e]);
}

TEST_P(TargetForward, LaterTokensDoNotReachEarlierFeatures) {
  const int64_t S = spec.seqLen, width = spec.numTaps() * spec.hiddenSize;
  std::mt19937_64 rng(12);
  std::uniform_int_distribution<int32_t> token(0, int32_t(spec.vocabSize - 1));
  std::vector<int32_t> ids(size_t(2 * S)), pos(size_t(2 * S));
  for (int64_t i = 0; i < 2 * S; ++i) {
    ids[size_t(i)] = token(rng);
    pos[size_t(i)] = int32_t(i % S);
  }
  std::vector<double> before = run(ids, pos);
  const int64_t changed = 90;
  ids[size_t(changed)] = (ids[size_t(changed)] + 1) % int32_t(spec.vocabSize);
  std::vector<double> after = run(ids, pos);
  for (int64_t t = 0; t < changed; ++t)
    for (int64_t e = 0; e < width; ++e)
      ASSERT_EQ(before[size_t(t * width + e)], after[size_t(t * width + e)])
          << "position " << t;
  int64_t reached = 0;
  for (int64_t e = 0; e < width; ++e)
    reached += before[size_t((changed + 1) * width + e)] !=
               after[size_t((changed + 1) * width + e)];
  EXPECT_GT(reached, 0) << "the changed token reaches later positions";
  // Row 1 is untouched.
  for (int64_t i = S * width; i < 2 * S * width; ++i)
    ASSERT_EQ(before[size_t(i)], after[size_t(i)]);
}

// The kernel groups compute the same features: in fp64 the fused ops (the
// MLP's gate/up GEMM with SwiGLU among them) round nothing the separate ops
// do not.
TEST_P(TargetForward, FusedKernelsGiveTheSameFeatures) {
  OwningOpRef<ModuleOp> fused = module->clone();
  PassManager pm(&context);
  ::dflash::FuseKernelsOptions options;
  options.linearSwiglu = true; // [memory] fuse_target_mlp
  pm.addPass(::dflash::createFuseKernels(options));
  ASSERT_TRUE(succeeded(pm.run(*fused)));
  int mlps = 0, swiglus = 0;
  fused->walk([&](Operation *op) {
    mlps += isa<mlir::dflash::LinearSwigluOp>(op);
    swiglus += isa<mlir::dflash::SwigluOp>(op);
  });
  // tiny taps layers 1 and 5: layers 0..5 are compiled.
  EXPECT_EQ(mlps, 6);
  EXPECT_EQ(swiglus, 0);
  const int64_t S = spec.seqLen;
  std::mt19937_64 rng(13);
  std::uniform_int_distribution<int32_t> token(0, int32_t(spec.vocabSize - 1));
  std::vector<int32_t> ids(size_t(2 * S)), pos(size_t(2 * S));
  for (int64_t i = 0; i < 2 * S; ++i) {
    ids[size_t(i)] = token(rng);
    pos[size_t(i)] = int32_t(i % 70); // row 0 packs two conversations
  }
  std::vector<double> want = run(ids, pos);
  std::vector<double> got =
      run(ids, pos, cast<func::FuncOp>(fused->getBody()->front()));
  ASSERT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  EXPECT_GT(den, 0);
  EXPECT_LE(std::sqrt(num / den), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Decoders, TargetForward,
                         ::testing::Values(Decoder::Qwen3,
                                           Decoder::Llama3Scaled,
                                           Decoder::Qwen35MoeHybrid),
                         [](const ::testing::TestParamInfo<Decoder> &info) {
                           switch (info.param) {
                           case Decoder::Qwen3:
                             return "Qwen3";
                           case Decoder::Llama3Scaled:
                             return "Llama3Scaled";
                           default:
                             return "Qwen35MoeHybrid";
                           }
                         });

} // namespace
