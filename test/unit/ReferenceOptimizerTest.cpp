//===- ReferenceOptimizerTest.cpp - Tests of clipping and AdamW -----------===//
//
// sumOfSquares, clipCoefficient and two AdamW steps against the
// torch.optim.AdamW formulas evaluated by hand.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

using namespace dflash::ref;

namespace {

TEST(ReferenceOptimizer, SumOfSquares) {
  const std::vector<double> x = {1.0, -2.0, 3.0};
  EXPECT_EQ(sumOfSquares(x.data(), 3), 14.0);
  const std::vector<float> xf = {0.5f, -0.25f};
  EXPECT_EQ(sumOfSquares(xf.data(), 2), 0.3125);
  // Accumulates in double: 1e4 ones of 1e-4 squared in float would drift.
  const std::vector<float> many(10000, 0.1f);
  EXPECT_NEAR(sumOfSquares(many.data(), 10000),
              10000.0 * double(0.1f) * double(0.1f), 1e-10);
}

TEST(ReferenceOptimizer, ClipCoefficient) {
  EXPECT_EQ(clipCoefficient(0.0, 1.0), 1.0);
  EXPECT_EQ(clipCoefficient(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(clipCoefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6));
  EXPECT_DOUBLE_EQ(clipCoefficient(10.0, 2.0), 2.0 / (10.0 + 1e-6));
  // Just at max_norm the 1e-6 keeps it barely below 1.
  EXPECT_LT(clipCoefficient(1.0, 1.0), 1.0);
}

/// One torch.optim.AdamW step written from the torch code: decay, lerp of
/// the first moment, addcmul of the second, addcdiv with the bias-corrected
/// denominator.
void torchAdamW(std::vector<double> &p, const std::vector<double> &grad,
                std::vector<double> &m, std::vector<double> &v, int t,
                double scale, double lr, double wd) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (size_t i = 0; i < p.size(); ++i) {
    const double g = grad[i] * scale;
    p[i] *= 1 - lr * wd;
    m[i] += (g - m[i]) * (1 - b1);
    v[i] = v[i] * b2 + (1 - b2) * g * g;
    const double stepSize = lr / (1 - std::pow(b1, t));
    const double denominator =
        std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps;
    p[i] -= stepSize * m[i] / denominator;
  }
}

TEST(ReferenceOptimizer, AdamWTwoStepsMatchTorch) {
  const int64_t n = 16;
  const double lr = 3e-3, wd = 0.1, scale = 0.6;
  std::mt19937_64 rng(61);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<double> p(n), g1(n), g2(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = uniform(rng);
    g1[i] = uniform(rng);
    g2[i] = uniform(rng);
  }
  std::vector<double> expectedP = p, expectedM(n, 0.0), expectedV(n, 0.0);
  std::vector<double> m(n, 0.0), v(n, 0.0);
  AdamWConfig config;
  config.lr = lr;
  config.weightDecay = wd;

  adamw(p.data(), g1.data(), m.data(), v.data(), n, 1, scale, config);
  // Step 1 in closed form: m/(1-b1) = g and sqrt(v/(1-b2)) = |g|, so the
  // parameter moves by lr * g / (|g| + eps) after the decay.
  for (int64_t i = 0; i < n; ++i) {
    const double g = g1[i] * scale;
    EXPECT_NEAR(p[i],
                expectedP[i] * (1 - lr * wd) - lr * g / (std::abs(g) + 1e-8),
                1e-15);
  }
  torchAdamW(expectedP, g1, expectedM, expectedV, 1, scale, lr, wd);
  adamw(p.data(), g2.data(), m.data(), v.data(), n, 2, scale, config);
  torchAdamW(expectedP, g2, expectedM, expectedV, 2, scale, lr, wd);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(p[i], expectedP[i], 1e-15) << i;
    EXPECT_NEAR(m[i], expectedM[i], 1e-16) << i;
    EXPECT_NEAR(v[i], expectedV[i], 1e-18) << i;
  }
}

TEST(ReferenceOptimizer, AdamWHandValues) {
  // One parameter, lr 0.1, no decay, no clipping: g = 2 then g = -1.
  // Step 1: m = 0.2, v = 0.004, update 0.1 * 2 / (2 + 1e-8).
  // Step 2: m = 0.18 - 0.1 = 0.08, v = 0.003996 + 0.001 = 0.004996;
  //   mhat = 0.08 / 0.19, vhat = 0.004996 / (1 - 0.999^2).
  AdamWConfig config;
  config.lr = 0.1;
  double p = 1.0, m = 0.0, v = 0.0;
  const double g1 = 2.0, g2 = -1.0;
  adamw(&p, &g1, &m, &v, 1, 1, 1.0, config);
  EXPECT_NEAR(m, 0.2, 1e-16);
  EXPECT_NEAR(v, 0.004, 1e-17);
  const double p1 = 1.0 - 0.1 * 2.0 / (2.0 + 1e-8);
  EXPECT_NEAR(p, p1, 1e-15);
  adamw(&p, &g2, &m, &v, 1, 2, 1.0, config);
  EXPECT_NEAR(m, 0.08, 1e-16);
  EXPECT_NEAR(v, 0.004996, 1e-17);
  const double p2 =
      p1 - 0.1 / 0.19 * 0.08 /
               (std::sqrt(0.004996) / std::sqrt(1 - 0.999 * 0.999) + 1e-8);
  EXPECT_NEAR(p, p2, 1e-15);
}

TEST(ReferenceOptimizer, AdamWFloatMatchesDouble) {
  const int64_t n = 8;
  AdamWConfig config;
  config.lr = 6e-4;
  config.weightDecay = 0.01;
  std::vector<double> p(n), g(n), m(n, 0.0), v(n, 0.0);
  std::mt19937_64 rng(62);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = static_cast<float>(uniform(rng));
    g[i] = static_cast<float>(uniform(rng));
  }
  std::vector<float> pf(p.begin(), p.end()), gf(g.begin(), g.end()),
      mf(n, 0.0f), vf(n, 0.0f);
  for (int64_t t = 1; t <= 3; ++t) {
    adamw(p.data(), g.data(), m.data(), v.data(), n, t, 0.5, config);
    adamw(pf.data(), gf.data(), mf.data(), vf.data(), n, t, 0.5, config);
  }
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(pf[i], p[i], 1e-6) << i;
}

} // namespace

// The schedule of docs/semantics.md section 5 (dflash.lr_schedule's reference).
TEST(ReferenceLrSchedule, WarmupPeakAndCosine) {
  const double lr = 6e-4;
  // total 100, ratio 0.04: 4 warmup steps.
  EXPECT_DOUBLE_EQ(learningRate(0, 100, lr, 0.04), lr / 4);
  EXPECT_DOUBLE_EQ(learningRate(1, 100, lr, 0.04), lr / 2);
  EXPECT_DOUBLE_EQ(learningRate(3, 100, lr, 0.04), lr);
  // The first cosine step is the peak, the middle is half of it.
  EXPECT_DOUBLE_EQ(learningRate(4, 100, lr, 0.04), lr);
  EXPECT_DOUBLE_EQ(learningRate(52, 100, lr, 0.04), lr * 0.5);
  EXPECT_NEAR(learningRate(99, 100, lr, 0.04),
              lr * 0.5 * (1 + std::cos(M_PI * 95.0 / 96.0)), 1e-18);
  EXPECT_GT(learningRate(99, 100, lr, 0.04), 0.0);
  EXPECT_EQ(learningRate(100, 100, lr, 0.04), 0.0);
  EXPECT_EQ(learningRate(500, 100, lr, 0.04), 0.0);
}

TEST(ReferenceLrSchedule, NoWarmup) {
  EXPECT_DOUBLE_EQ(learningRate(0, 100, 1.0, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(learningRate(50, 100, 1.0, 0.0), 0.5);
}

TEST(ReferenceLrSchedule, WarmupTruncatesLikePython) {
  // int(0.07 * 100) == 7 warmup steps: step 6 reaches the peak.
  EXPECT_DOUBLE_EQ(learningRate(5, 100, 1.0, 0.07), 6.0 / 7.0);
  EXPECT_DOUBLE_EQ(learningRate(6, 100, 1.0, 0.07), 1.0);
  // int(0.04 * 10) == 0: no warmup at all.
  EXPECT_DOUBLE_EQ(learningRate(0, 10, 1.0, 0.04), 1.0);
}

TEST(ReferenceLrSchedule, AllWarmup) {
  // total == warm: the warmup reaches lr at the last step, then 0.
  EXPECT_DOUBLE_EQ(learningRate(0, 4, 1.0, 1.0), 0.25);
  EXPECT_DOUBLE_EQ(learningRate(3, 4, 1.0, 1.0), 1.0);
  EXPECT_EQ(learningRate(4, 4, 1.0, 1.0), 0.0);
}
