//===- ReferenceDenseTest.cpp - Tests of the dense-op references ----------===//
//
// embed, linear, RMSNorm, RoPE and SwiGLU: forward values against direct
// computations and every gradient against central finite differences.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"
#include "test/unit/ReferenceTestSupport.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

using namespace dflash::ref;
using namespace dflash::reftest;

namespace {

/// Checks an analytic gradient against finite differences, records the
/// error under `what` and returns it.
double expectGradient(const Vector &fd, const Vector &analytic,
                      const char *what) {
  EXPECT_GT(norm(analytic), 0) << what;
  const double error = relativeError(fd, analytic);
  EXPECT_LT(error, 1e-6) << what;
  std::printf("%s: relative error %.3g\n", what, error);
  return error;
}

TEST(ReferenceDense, EmbedGathersRows) {
  const Vector table = {0, 1, 10, 11, 20, 21, 30, 31};
  const std::vector<int32_t> ids = {3, 0, 3, 2};
  Vector out(8);
  embed(table.data(), ids.data(), out.data(), 4, 2);
  EXPECT_EQ(out, (Vector{30, 31, 0, 1, 30, 31, 20, 21}));
}

TEST(ReferenceDense, LinearMatchesDirectProduct) {
  // N = 150 spans several column tiles, one of them partial.
  const int64_t M = 5, N = 150, K = 7;
  std::mt19937_64 rng(1);
  const Vector x = randomVector(rng, M * K), w = randomVector(rng, N * K);
  Vector y(M * N), expected(M * N, 0.0);
  linear(x.data(), w.data(), y.data(), M, N, K);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        expected[m * N + n] += x[m * K + k] * w[n * K + k];
  EXPECT_LT(relativeError(y, expected), 1e-15);

  const std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end());
  std::vector<float> yf(M * N);
  linear(xf.data(), wf.data(), yf.data(), M, N, K);
  EXPECT_LT(relativeError(Vector(yf.begin(), yf.end()), expected), 1e-6);
}

TEST(ReferenceDense, LinearGradients) {
  const int64_t M = 3, N = 70, K = 5;
  std::mt19937_64 rng(2);
  Vector x = randomVector(rng, M * K), w = randomVector(rng, N * K);
  const Vector r = randomVector(rng, M * N);
  auto objective = [&] {
    Vector y(M * N);
    linear(x.data(), w.data(), y.data(), M, N, K);
    return dotProduct(r, y);
  };
  Vector dx(M * K, 9.0), dw(N * K, 9.0);
  linearGradInput(r.data(), w.data(), dx.data(), M, N, K);
  linearGradWeight(r.data(), x.data(), dw.data(), M, N, K);
  expectGradient(finiteDifferences(x, objective), dx, "linearGradInput");
  expectGradient(finiteDifferences(w, objective), dw, "linearGradWeight");
}

TEST(ReferenceDense, RmsNormMatchesDirectComputation) {
  const int64_t rows = 3, D = 10;
  const double eps = 1e-6;
  std::mt19937_64 rng(3);
  const Vector x = randomVector(rng, rows * D),
               w = randomVector(rng, D, 0.5, 1.5);
  Vector y(rows * D);
  rmsNorm(x.data(), w.data(), y.data(), rows, D, eps);
  for (int64_t r = 0; r < rows; ++r) {
    double meanSquare = 0;
    for (int64_t i = 0; i < D; ++i)
      meanSquare += x[r * D + i] * x[r * D + i] / D;
    for (int64_t i = 0; i < D; ++i)
      EXPECT_NEAR(y[r * D + i],
                  x[r * D + i] / std::sqrt(meanSquare + eps) * w[i], 1e-14);
  }
  // eps matters on a small row: x = 1e-3 everywhere with eps = 1e-6 gives
  // 1e-3 / sqrt(2e-6).
  const Vector small(4, 1e-3), ones(4, 1.0);
  Vector ySmall(4);
  rmsNorm(small.data(), ones.data(), ySmall.data(), 1, 4, 1e-6);
  EXPECT_NEAR(ySmall[0], 1e-3 / std::sqrt(2e-6), 1e-14);
}

TEST(ReferenceDense, RmsNormGradients) {
  const int64_t rows = 4, D = 16;
  const double eps = 1e-6;
  std::mt19937_64 rng(4);
  Vector x = randomVector(rng, rows * D), w = randomVector(rng, D, 0.5, 1.5);
  const Vector r = randomVector(rng, rows * D);
  auto objective = [&] {
    Vector y(rows * D);
    rmsNorm(x.data(), w.data(), y.data(), rows, D, eps);
    return dotProduct(r, y);
  };
  Vector dx(rows * D, 9.0), dw(D, 9.0);
  rmsNormGrad(r.data(), x.data(), w.data(), dx.data(), dw.data(), rows, D, eps);
  expectGradient(finiteDifferences(x, objective), dx, "rmsNormGrad dx");
  expectGradient(finiteDifferences(w, objective), dw, "rmsNormGrad dw");
}

TEST(ReferenceDense, RopeHandValues) {
  // d = 4, theta = 100: inv_freq = {1, 1/10}; position 3 gives angles
  // {3, 0.3} (in fp32).
  const Vector x = {1, 2, 3, 4};
  const std::vector<int32_t> pos = {3};
  Vector y(4);
  rope(x.data(), pos.data(), y.data(), 1, 1, 4, 100.0);
  const double a0 = static_cast<float>(3.0f * 1.0f);
  const double a1 = static_cast<float>(3.0f * (1.0f / ::powf(100.0f, 0.5f)));
  EXPECT_NEAR(y[0], 1 * std::cos(a0) - 3 * std::sin(a0), 1e-15);
  EXPECT_NEAR(y[1], 2 * std::cos(a1) - 4 * std::sin(a1), 1e-15);
  EXPECT_NEAR(y[2], 3 * std::cos(a0) + 1 * std::sin(a0), 1e-15);
  EXPECT_NEAR(y[3], 4 * std::cos(a1) + 2 * std::sin(a1), 1e-15);
}

// The angles are fp32 products of fp32 frequencies, as in the Hugging Face
// rotary embedding; at a long position this differs visibly from angles in
// double.
TEST(ReferenceDense, RopeAnglesAreFloat32) {
  const int64_t d = 128;
  const double theta = 1e6;
  const int32_t position = 3001;
  Vector x(d, 0.0);
  x[5] = 1.0; // y[5] = cos(angle_5), y[5 + d/2] = sin(angle_5)
  Vector y(d);
  rope(x.data(), &position, y.data(), 1, 1, d, theta);
  const float invFreq =
      1.0f / ::powf(static_cast<float>(theta), 10.0f / static_cast<float>(d));
  const double angle32 = static_cast<float>(3001.0f * invFreq);
  EXPECT_NEAR(y[5], std::cos(angle32), 1e-15);
  EXPECT_NEAR(y[5 + d / 2], std::sin(angle32), 1e-15);
  const double angle64 = 3001.0 / std::pow(theta, 10.0 / d);
  EXPECT_GT(std::abs(y[5] - std::cos(angle64)), 1e-9);
}

TEST(ReferenceDense, RopeProperties) {
  const int64_t rows = 6, heads = 3, d = 16, half = d / 2;
  const double theta = 10000.0;
  std::mt19937_64 rng(5);
  const Vector x = randomVector(rng, rows * heads * d);
  const std::vector<int32_t> pos = {0, 1, 7, 128, 3071, 40000};
  Vector y(x.size()), back(x.size());
  rope(x.data(), pos.data(), y.data(), rows, heads, d, theta);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (r * heads + h) * d;
      for (int64_t i = 0; i < half; ++i) {
        const double before =
            x[base + i] * x[base + i] + x[base + i + half] * x[base + i + half];
        const double after =
            y[base + i] * y[base + i] + y[base + i + half] * y[base + i + half];
        EXPECT_NEAR(after, before, 1e-15) << "pair norm at row " << r;
        if (pos[r] == 0) {
          EXPECT_EQ(y[base + i], x[base + i]);
          EXPECT_EQ(y[base + i + half], x[base + i + half]);
        }
      }
    }
  }
  // The gradient is the inverse rotation: it undoes the forward.
  ropeGrad(y.data(), pos.data(), back.data(), rows, heads, d, theta);
  EXPECT_LT(relativeError(back, x), 1e-15);
}

TEST(ReferenceDense, RopeGradient) {
  const int64_t rows = 5, heads = 2, d = 8;
  const double theta = 10000.0;
  std::mt19937_64 rng(6);
  Vector x = randomVector(rng, rows * heads * d);
  const Vector r = randomVector(rng, x.size());
  const std::vector<int32_t> pos = {0, 1, 5, 999, 3070};
  auto objective = [&] {
    Vector y(x.size());
    rope(x.data(), pos.data(), y.data(), rows, heads, d, theta);
    return dotProduct(r, y);
  };
  Vector dx(x.size(), 9.0);
  ropeGrad(r.data(), pos.data(), dx.data(), rows, heads, d, theta);
  expectGradient(finiteDifferences(x, objective), dx, "ropeGrad");
}

TEST(ReferenceDense, SwigluValues) {
  const Vector g = {0.0, 1.0, -2.0, 30.0, -800.0},
               u = {5.0, 2.0, 3.0, 1.0, 1.0};
  Vector y(5);
  swiglu(g.data(), u.data(), y.data(), 5);
  for (int i = 0; i < 5; ++i)
    EXPECT_NEAR(y[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-15) << i;
  EXPECT_EQ(y[4], 0.0); // no NaN where e^-g overflows
}

TEST(ReferenceDense, SwigluGradients) {
  const int64_t n = 40;
  std::mt19937_64 rng(7);
  Vector g = randomVector(rng, n, -5.0, 5.0), u = randomVector(rng, n);
  const Vector r = randomVector(rng, n);
  auto objective = [&] {
    Vector y(n);
    swiglu(g.data(), u.data(), y.data(), n);
    return dotProduct(r, y);
  };
  Vector dg(n, 9.0), du(n, 9.0);
  swigluGrad(r.data(), g.data(), u.data(), dg.data(), du.data(), n);
  expectGradient(finiteDifferences(g, objective), dg, "swigluGrad dg");
  expectGradient(finiteDifferences(u, objective), du, "swigluGrad du");
}

} // namespace
