//===- DrafterYarnTest.cpp - The drafter's YaRN frequencies ---------------===//
//
// [drafter.rope_scaling] of a Qwen3-like drafter (head dim 128, theta 1e6,
// factor 4 over 32768 positions) reaches the graph's dflash.rope as
// #dflash.yarn, whose frequencies, as the reference (the CPU interpreter)
// and the emitted kernels' ramp (kernels/RopeFrequencies.h) compute them,
// equal transformers' formula worked out here in double.
//
//===----------------------------------------------------------------------===//

#include "compiler/Import/ImportSpec.h"
#include "compiler/Interpreter/Interpreter.h"
#include "compiler/Spec/Spec.h"
#include "dialect/DFlashOps.h"
#include "kernels/RopeFrequencies.h"
#include "kernels/reference/Reference.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;
namespace ref = ::dflash::ref;

namespace {

const char *kSpec = R"(name = "qwen3-like-yarn"
[target]
num_layers = 36
hidden_size = 512
vocab_size = 1024
[drafter]
num_layers = 1
intermediate_size = 256
num_heads = 4
num_kv_heads = 2
head_dim = 128
rope_theta = 1000000.0
block_size = 4
mask_token_id = 1023
max_position_embeddings = 131072
[drafter.rope_scaling]
rope_type = "yarn"
factor = 4.0
original_max_position_embeddings = 32768
[training]
seq_len = 64
anchors_per_row = 4
rows_per_gpu = 1
gamma = 0.0
)";

/// transformers' _compute_yarn_parameters in double: the correction range
/// of beta_fast 32 and beta_slow 1 rotations, floored and ceiled, and the
/// blend of theta^(-2i/d) with it divided by the factor.
std::vector<double> yarnByFormula(int d, double theta, double factor,
                                  double original, double &low, double &high) {
  const double pi = std::acos(-1.0);
  auto dim = [&](double rotations) {
    return d * std::log(original / (rotations * 2 * pi)) /
           (2 * std::log(theta));
  };
  low = std::max(std::floor(dim(32.0)), 0.0);
  high = std::min(std::ceil(dim(1.0)), double(d - 1));
  std::vector<double> inv(size_t(d / 2));
  for (int i = 0; i < d / 2; ++i) {
    const double base = 1.0 / std::pow(theta, 2.0 * i / d);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    inv[size_t(i)] = base * (1 - ramp) + base / factor * ramp;
  }
  return inv;
}

TEST(DrafterYarn, FrequenciesOfAQwen3LikeDrafter) {
  SpecError error;
  std::optional<DrafterSpec> spec = parseSpec(kSpec, "yarn.toml", error);
  ASSERT_TRUE(spec) << error.str();
  EXPECT_DOUBLE_EQ(spec->ropeScalingAttentionFactor, 0.1 * std::log(4.0) + 1);

  MLIRContext context;
  OwningOpRef<ModuleOp> module = importSpec(context, *spec);
  ASSERT_TRUE(module);
  std::vector<RopeOp> ropes;
  module->walk([&](RopeOp rope) { ropes.push_back(rope); });
  ASSERT_GE(ropes.size(), 2u); // the drafter's q and keys
  for (RopeOp rope : ropes) {
    YarnAttr yarn = rope.getYarnAttr();
    ASSERT_TRUE(yarn);
    EXPECT_EQ(yarn.getFactor().getValueAsDouble(), 4.0);
    EXPECT_EQ(yarn.getBetaFast().getValueAsDouble(), 32.0);
    EXPECT_EQ(yarn.getBetaSlow().getValueAsDouble(), 1.0);
    EXPECT_EQ(yarn.getOriginalMaxPositions(), 32768);
    EXPECT_TRUE(yarn.getTruncate());
    EXPECT_DOUBLE_EQ(yarn.getAttentionFactor().getValueAsDouble(),
                     1.1386294361119891);
  }

  // The independent formula: the ramp runs over i in [23, 40] of 64.
  double low = 0, high = 0;
  std::vector<double> want = yarnByFormula(128, 1e6, 4.0, 32768, low, high);
  EXPECT_EQ(low, 23.0);
  EXPECT_EQ(high, 40.0);

  // The reference's frequencies from the graph's attribute (what the
  // interpreter rotates by), in fp32 as transformers keeps them.
  YarnAttr yarn = ropes[0].getYarnAttr();
  ref::YarnScaling scaling =
      referenceYarnScaling(ropes[0].getTheta().convertToDouble(), yarn);
  std::vector<float> inv(64);
  ref::yarnInverseFrequencies(128, scaling, inv.data());
  for (int i = 0; i < 64; ++i)
    EXPECT_NEAR(inv[size_t(i)], want[size_t(i)], 2e-6 * want[size_t(i)])
        << "i = " << i;
  // Below the ramp as unscaled RoPE, above it divided by the factor.
  EXPECT_NEAR(inv[0], 1.0, 1e-7);
  const double last = 1.0 / std::pow(1e6, 126.0 / 128);
  EXPECT_NEAR(inv[63] * 4.0, last, 1e-6 * last);

  // The ramp the emitted kernels get (LaunchPrinter: yarnRampRange).
  float kernelLow = 0, kernelHigh = 0;
  kernels::yarnRampRange(128, 1e6, 32.0, 1.0, 32768, true, kernelLow,
                         kernelHigh);
  EXPECT_EQ(kernelLow, 23.f);
  EXPECT_EQ(kernelHigh, 40.f);
}

} // namespace
