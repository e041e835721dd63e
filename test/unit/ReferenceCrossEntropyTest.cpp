//===- ReferenceCrossEntropyTest.cpp - Tests of the lm_head loss ----------===//
//
// lmHeadCrossEntropy against a direct computation, its argmax tie rule and
// counts, and lmHeadCrossEntropyGrad against central finite differences,
// with the identity and with DFlash2's unary transforms (a multiplier, a
// softcap, both).
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"
#include "test/unit/ReferenceTestSupport.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using namespace dflash::ref;
using namespace dflash::reftest;

namespace {

/// The sums computed the plain way: every logit, log of a sum of exps.
/// With a transform, T of each logit.
CrossEntropySums directSums(const Vector &y, const Vector &w,
                            const std::vector<int32_t> &labels,
                            const Vector &weights, int64_t V, int64_t H,
                            const UnaryTransform &transform = {}) {
  CrossEntropySums sums;
  for (size_t r = 0; r < labels.size(); ++r) {
    Vector logits(V, 0.0);
    for (int64_t v = 0; v < V; ++v)
      for (int64_t h = 0; h < H; ++h)
        logits[v] += y[r * H + h] * w[v * H + h];
    unaryTransform(logits.data(), logits.data(), V, transform);
    double sumExp = 0;
    int64_t argmax = 0;
    for (int64_t v = 0; v < V; ++v) {
      sumExp += std::exp(logits[v]);
      if (logits[v] > logits[argmax])
        argmax = v;
    }
    sums.lossSum += weights[r] * (std::log(sumExp) - logits[labels[r]]);
    sums.weightSum += weights[r];
    if (weights[r] > 0) {
      sums.count += 1;
      sums.correct += argmax == labels[r];
    }
  }
  return sums;
}

struct LossCase {
  int64_t rows, V, H;
  Vector y, w, weights;
  std::vector<int32_t> labels;
};

/// Random rows with a mix of zero, full and decayed weights.
LossCase randomCase(int64_t rows, int64_t V, int64_t H, uint64_t seed) {
  std::mt19937_64 rng(seed);
  LossCase c{
      rows,         V, H, randomVector(rng, rows * H), randomVector(rng, V * H),
      Vector(rows), {}};
  for (double &value : c.w)
    value *= 3; // logits of order a few units
  for (int64_t r = 0; r < rows; ++r) {
    c.weights[r] = r % 4 == 0 ? 0.0 : std::exp(-(r % 4 - 1) / 4.0);
    c.labels.push_back(static_cast<int32_t>(rng() % V));
  }
  return c;
}

CrossEntropySums runLoss(const LossCase &c,
                         const UnaryTransform &transform = {}) {
  return lmHeadCrossEntropy(c.y.data(), c.w.data(), c.labels.data(),
                            c.weights.data(), c.rows, c.V, c.H, nullptr,
                            transform);
}

/// DFlash2's transforms (docs/semantics.md section 13, "Unary logits"): a
/// multiplier alone, a softcap alone that the logits of randomCase (a few
/// units to a dozen) saturate, and both.
const UnaryTransform kTransforms[] = {{1.5, 0.0}, {1.0, 4.0}, {2.5, 6.0}};

TEST(ReferenceCrossEntropy, MatchesDirectComputation) {
  // 150 rows: more than one chunk of rows.
  for (int64_t rows : {5, 150}) {
    const LossCase c = randomCase(rows, 11, 6, 31 + rows);
    const CrossEntropySums actual = runLoss(c);
    const CrossEntropySums expected =
        directSums(c.y, c.w, c.labels, c.weights, c.V, c.H);
    EXPECT_NEAR(actual.lossSum, expected.lossSum,
                1e-13 * std::abs(expected.lossSum));
    EXPECT_NEAR(actual.weightSum, expected.weightSum, 1e-13);
    EXPECT_EQ(actual.count, expected.count);
    EXPECT_EQ(actual.correct, expected.correct);
    EXPECT_GT(actual.lossSum, 0);
  }
}

TEST(ReferenceCrossEntropy, SingleRowByHand) {
  // H = 1, y = 1: the logits are the lm_head column {0, ln 2, ln 3}, so the
  // softmax is {1, 2, 3} / 6 and CE for label 1 is ln 3.
  const Vector y = {1.0}, w = {0.0, std::log(2.0), std::log(3.0)};
  const std::vector<int32_t> labels = {1};
  const Vector weights = {0.5};
  const CrossEntropySums sums = lmHeadCrossEntropy(
      y.data(), w.data(), labels.data(), weights.data(), 1, 3, 1);
  EXPECT_NEAR(sums.lossSum, 0.5 * std::log(3.0), 1e-15);
  EXPECT_EQ(sums.weightSum, 0.5);
  EXPECT_EQ(sums.count, 1);
  EXPECT_EQ(sums.correct, 0); // the argmax is 2
}

TEST(ReferenceCrossEntropy, ArgmaxTieTakesFirstAndCountsWeightedRows) {
  // Vocabulary rows 1 and 3 are identical and dominant: every logit row
  // ties between them.
  const int64_t V = 5, H = 2;
  const Vector w = {0.1, 0.0, 2.0, 2.0, 0.3, -0.2, 2.0, 2.0, -0.5, 0.4};
  const Vector y = {1.0, 1.0, 0.5, 0.7, 1.0, 1.0, 0.9, 0.3};
  const std::vector<int32_t> labels = {1, 3, 1, 1};
  // Row 2 would be correct but weighs nothing; row 3 weighs a fraction.
  const Vector weights = {1.0, 1.0, 0.0, 0.25};
  std::vector<uint8_t> hits(4, 7);
  const CrossEntropySums sums = lmHeadCrossEntropy(
      y.data(), w.data(), labels.data(), weights.data(), 4, V, H, hits.data());
  EXPECT_EQ(sums.count, 3);
  EXPECT_EQ(sums.correct, 2); // rows 0 and 3; row 1's label is the second max
  EXPECT_EQ(sums.weightSum, 2.25);
  // The same per row: row 2 is right but weighs nothing, so it is no hit.
  EXPECT_EQ(hits, (std::vector<uint8_t>{1, 0, 0, 1}));
}

TEST(ReferenceCrossEntropy, GradientMatchesFiniteDifferences) {
  LossCase c = randomCase(9, 13, 7, 41);
  const double dLossSum = 0.37;
  Vector dy(c.rows * c.H, 9.0);
  lmHeadCrossEntropyGrad(c.y.data(), c.w.data(), c.labels.data(),
                         c.weights.data(), dLossSum, dy.data(), c.rows, c.V,
                         c.H);
  const Vector fd =
      finiteDifferences(c.y, [&] { return dLossSum * runLoss(c).lossSum; });
  const double error = relativeError(fd, dy);
  EXPECT_LT(error, 1e-6);
  std::printf("lmHeadCrossEntropyGrad: relative error %.3g\n", error);
  // Rows that weigh nothing get exactly zero gradient.
  for (int64_t r = 0; r < c.rows; ++r) {
    if (c.weights[r] != 0)
      continue;
    for (int64_t h = 0; h < c.H; ++h)
      EXPECT_EQ(dy[r * c.H + h], 0.0);
  }
}

TEST(ReferenceCrossEntropy, UnaryTransformMatchesDirectComputation) {
  const LossCase c = randomCase(150, 11, 6, 61);
  const CrossEntropySums plain = runLoss(c);
  std::vector<uint8_t> plainHits(c.rows), hits(c.rows);
  lmHeadCrossEntropy(c.y.data(), c.w.data(), c.labels.data(), c.weights.data(),
                     c.rows, c.V, c.H, plainHits.data());
  for (const UnaryTransform &t : kTransforms) {
    const CrossEntropySums actual =
        lmHeadCrossEntropy(c.y.data(), c.w.data(), c.labels.data(),
                           c.weights.data(), c.rows, c.V, c.H, hits.data(), t);
    const CrossEntropySums expected =
        directSums(c.y, c.w, c.labels, c.weights, c.V, c.H, t);
    EXPECT_NEAR(actual.lossSum, expected.lossSum,
                1e-13 * std::abs(expected.lossSum));
    EXPECT_EQ(actual.weightSum, plain.weightSum);
    EXPECT_EQ(actual.count, expected.count);
    EXPECT_EQ(actual.correct, expected.correct);
    // T is monotonic: the argmax, so the hits, are those of the logits; the
    // loss is not.
    EXPECT_EQ(actual.correct, plain.correct);
    EXPECT_EQ(hits, plainHits);
    EXPECT_GT(std::abs(actual.lossSum - plain.lossSum), 1e-3 * plain.lossSum);
  }
}

TEST(ReferenceCrossEntropy, UnaryTransformGradientMatchesFiniteDifferences) {
  LossCase c = randomCase(9, 13, 7, 71);
  const double dLossSum = 0.37;
  for (const UnaryTransform &t : kTransforms) {
    Vector dy(c.rows * c.H, 9.0), plainDy(c.rows * c.H);
    lmHeadCrossEntropyGrad(c.y.data(), c.w.data(), c.labels.data(),
                           c.weights.data(), dLossSum, dy.data(), c.rows, c.V,
                           c.H, t);
    const Vector fd = finiteDifferences(
        c.y, [&] { return dLossSum * runLoss(c, t).lossSum; });
    const double error = relativeError(fd, dy);
    EXPECT_LT(error, 1e-6) << "multiplier " << t.multiplier << ", softcap "
                           << t.softcap;
    std::printf("lmHeadCrossEntropyGrad (multiplier %g, softcap %g): "
                "relative error %.3g\n",
                t.multiplier, t.softcap, error);
    // The transform's factor is there: the plain gradient is far off.
    lmHeadCrossEntropyGrad(c.y.data(), c.w.data(), c.labels.data(),
                           c.weights.data(), dLossSum, plainDy.data(), c.rows,
                           c.V, c.H);
    EXPECT_GT(relativeError(fd, plainDy), 1e-2);
  }
}

TEST(ReferenceCrossEntropy, FloatMatchesDouble) {
  const LossCase c = randomCase(70, 33, 16, 51);
  const std::vector<float> y(c.y.begin(), c.y.end()), w(c.w.begin(), c.w.end()),
      weights(c.weights.begin(), c.weights.end());
  const CrossEntropySums expected = runLoss(c);
  const CrossEntropySums actual = lmHeadCrossEntropy(
      y.data(), w.data(), c.labels.data(), weights.data(), c.rows, c.V, c.H);
  EXPECT_NEAR(actual.lossSum, expected.lossSum, 1e-5 * expected.lossSum);
  Vector dy(c.rows * c.H);
  std::vector<float> dyFloat(c.rows * c.H);
  lmHeadCrossEntropyGrad(c.y.data(), c.w.data(), c.labels.data(),
                         c.weights.data(), 1.0, dy.data(), c.rows, c.V, c.H);
  lmHeadCrossEntropyGrad(y.data(), w.data(), c.labels.data(), weights.data(),
                         1.0, dyFloat.data(), c.rows, c.V, c.H);
  EXPECT_LT(relativeError(Vector(dyFloat.begin(), dyFloat.end()), dy), 1e-5);
}

} // namespace
