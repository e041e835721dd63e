//===- ReferenceDFlash2Test.cpp - Tests of the DFlash2 reference ----------===//
//
// groupedConv against per-channel banded matrices built from the formula,
// its block boundary, and every gradient (convolution, unary transform,
// selector) against central finite differences; the selector's forward
// against a direct computation, its tie rules, the inject option,
// stop-gradient, skipped rows and K = 1.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/DFlash2.h"
#include "test/unit/ReferenceTestSupport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

using namespace dflash::ref;
using namespace dflash::reftest;

namespace {

//===----------------------------------------------------------------------===//
// Grouped convolution
//===----------------------------------------------------------------------===//

/// A convolution over half `half` of a full [B, Q, 2*kc*G] projection D.
struct ConvCase {
  GroupedConvShape shape;
  int64_t half;
  Vector in, D, base;
  const double *delta() const { return D.data() + half * shape.kc * shape.G(); }
  Vector run() const {
    Vector out(shape.B * shape.Q() * shape.H, -9.0);
    groupedConv(in.data(), delta(), base.data(), out.data(), shape);
    return out;
  }
};

ConvCase randomConvCase(int64_t kc, int64_t half, uint64_t seed) {
  std::mt19937_64 rng(seed);
  GroupedConvShape shape{2, 3, 4, 8, kc, 4};
  shape.deltaStride = 2 * kc * shape.G();
  const int64_t slots = shape.B * shape.Q();
  return {shape, half, randomVector(rng, slots * shape.H),
          randomVector(rng, slots * shape.deltaStride),
          randomVector(rng, kc * shape.H)};
}

/// The formula as one bs x bs matrix per (b, n, c): M[k][k - o] = base[o, c]
/// + D[b, n*bs + k, half, o, c / gs] for taps o < kc with k - o >= 0, and
/// out[b, n, :, c] = M in[b, n, :, c].
Vector denseConv(const ConvCase &c) {
  const GroupedConvShape &s = c.shape;
  const int64_t Q = s.Q(), G = s.H / s.gs, perSlot = 2 * s.kc * G;
  Vector out(s.B * Q * s.H, 0.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t ch = 0; ch < s.H; ++ch) {
        std::vector<Vector> M(s.bs, Vector(s.bs, 0.0));
        for (int64_t k = 0; k < s.bs; ++k)
          for (int64_t o = 0; o < s.kc; ++o) {
            if (k - o < 0)
              continue;
            const int64_t slot = b * Q + n * s.bs + k;
            M[k][k - o] =
                c.base[o * s.H + ch] +
                c.D[slot * perSlot + (c.half * s.kc + o) * G + ch / s.gs];
          }
        for (int64_t k = 0; k < s.bs; ++k)
          for (int64_t j = 0; j < s.bs; ++j)
            out[(b * Q + n * s.bs + k) * s.H + ch] +=
                M[k][j] * c.in[(b * Q + n * s.bs + j) * s.H + ch];
      }
  return out;
}

TEST(ReferenceDFlash2, GroupedConvMatchesBandedMatrices) {
  // kc = 5 > bs = 4: the taps past a block's start read nothing.
  for (int64_t kc : {1, 2, 3, 5})
    for (int64_t half : {0, 1}) {
      const ConvCase c = randomConvCase(kc, half, 100 + kc * 2 + half);
      const double error = relativeError(c.run(), denseConv(c));
      EXPECT_LT(error, 1e-14) << "kc " << kc << " half " << half;
    }
}

TEST(ReferenceDFlash2, GroupedConvCompactDeltaMatchesStrided) {
  const ConvCase c = randomConvCase(2, 1, 7);
  const GroupedConvShape &s = c.shape;
  const int64_t perHalf = s.kc * s.G();
  Vector compact;
  for (int64_t slot = 0; slot < s.B * s.Q(); ++slot)
    for (int64_t i = 0; i < perHalf; ++i)
      compact.push_back(c.delta()[slot * s.deltaStride + i]);
  GroupedConvShape compactShape = s;
  compactShape.deltaStride = 0;
  Vector out(c.in.size());
  groupedConv(c.in.data(), compact.data(), c.base.data(), out.data(),
              compactShape);
  EXPECT_EQ(out, c.run());
}

TEST(ReferenceDFlash2, GroupedConvStaysInsideItsBlock) {
  ConvCase c = randomConvCase(3, 0, 11);
  const GroupedConvShape &s = c.shape;
  const int64_t H = s.H, bs = s.bs;
  const Vector before = c.run();
  // Slot bs-1 of block 0 of row 0: its input and its delta.
  const int64_t last = bs - 1;
  for (int64_t ch = 0; ch < H; ++ch)
    c.in[last * H + ch] += 0.5;
  for (int64_t i = 0; i < s.deltaStride; ++i)
    c.D[last * s.deltaStride + i] -= 0.25;
  const Vector after = c.run();
  for (int64_t ch = 0; ch < H; ++ch) {
    EXPECT_NE(after[last * H + ch], before[last * H + ch]);
    // Block 1 is untouched, to the bit.
    for (int64_t k = 0; k < bs; ++k)
      EXPECT_EQ(after[(bs + k) * H + ch], before[(bs + k) * H + ch]);
  }
  // Slot 0 of every block sees only itself through tap 0.
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t ch = 0; ch < H; ++ch) {
      const int64_t slot = n * bs;
      const double weight = c.base[ch] + c.D[slot * s.deltaStride + ch / s.gs];
      EXPECT_DOUBLE_EQ(after[slot * H + ch], weight * c.in[slot * H + ch]);
    }
  // And backwards: a gradient at block 1 alone reaches nothing of block 0.
  Vector dOut(after.size(), 0.0);
  for (int64_t i = bs * H; i < 2 * bs * H; ++i)
    dOut[i] = 1.0;
  Vector dIn(c.in.size()), dD(c.D.size(), 0.0), dBase(c.base.size());
  groupedConvGrad(dOut.data(), c.in.data(), c.delta(), c.base.data(),
                  dIn.data(), dD.data(), dBase.data(), s);
  for (int64_t i = 0; i < bs * H; ++i)
    EXPECT_EQ(dIn[i], 0.0);
}

TEST(ReferenceDFlash2, GroupedConvGradientMatchesFiniteDifferences) {
  for (int64_t kc : {1, 2, 3})
    for (int64_t half : {0, 1}) {
      ConvCase c = randomConvCase(kc, half, 200 + kc * 2 + half);
      const GroupedConvShape &s = c.shape;
      std::mt19937_64 rng(300 + kc);
      const Vector dOut = randomVector(rng, s.B * s.Q() * s.H);
      auto loss = [&] { return dotProduct(dOut, c.run()); };
      const int64_t perHalf = s.kc * s.G();
      Vector dIn(c.in.size()), dD(c.D.size(), 7.0), dBase(c.base.size());
      groupedConvGrad(dOut.data(), c.in.data(), c.delta(), c.base.data(),
                      dIn.data(), dD.data() + half * perHalf, dBase.data(), s);
      // The other half of each slot's D is not written; its gradient is 0.
      for (int64_t slot = 0; slot < s.B * s.Q(); ++slot)
        for (int64_t i = 0; i < perHalf; ++i) {
          double &other = dD[slot * s.deltaStride + (1 - half) * perHalf + i];
          EXPECT_EQ(other, 7.0);
          other = 0.0;
        }
      const double inError = relativeError(dIn, finiteDifferences(c.in, loss));
      const double dError = relativeError(dD, finiteDifferences(c.D, loss));
      const double baseError =
          relativeError(dBase, finiteDifferences(c.base, loss));
      EXPECT_LT(inError, 1e-8) << "kc " << kc;
      EXPECT_LT(dError, 1e-8) << "kc " << kc;
      EXPECT_LT(baseError, 1e-8) << "kc " << kc;
      std::printf("groupedConvGrad kc %lld half %lld: relative errors in "
                  "%.3g delta %.3g base %.3g\n",
                  static_cast<long long>(kc), static_cast<long long>(half),
                  inError, dError, baseError);
    }
}

//===----------------------------------------------------------------------===//
// Unary transform
//===----------------------------------------------------------------------===//

TEST(ReferenceDFlash2, UnaryTransformValuesAndGradient) {
  std::mt19937_64 rng(5);
  Vector z = randomVector(rng, 40, -60.0, 60.0);
  for (const UnaryTransform t :
       {UnaryTransform{}, UnaryTransform{0.5, 0.0}, UnaryTransform{1.0, 30.0},
        UnaryTransform{2.5, 15.0}}) {
    Vector u(z.size());
    unaryTransform(z.data(), u.data(), int64_t(z.size()), t);
    for (size_t i = 0; i < z.size(); ++i) {
      const double expected =
          t.softcap == 0.0
              ? t.multiplier * z[i]
              : t.softcap * std::tanh(t.multiplier * z[i] / t.softcap);
      EXPECT_NEAR(u[i], expected, 1e-14 * 60);
      if (t.softcap != 0.0) {
        EXPECT_LE(std::abs(u[i]), t.softcap);
      }
    }
    const Vector du = randomVector(rng, int64_t(z.size()));
    Vector dz(z.size());
    unaryTransformGrad(du.data(), z.data(), dz.data(), int64_t(z.size()), t);
    const Vector fd = finiteDifferences(z, [&] {
      Vector v(z.size());
      unaryTransform(z.data(), v.data(), int64_t(z.size()), t);
      return dotProduct(du, v);
    });
    // Saturated entries have tiny derivatives: the differences' rounding
    // (of a sum of 40 values up to 150) is what is left.
    const double error = relativeError(dz, fd);
    EXPECT_LT(error, 1e-7) << "m " << t.multiplier << " c " << t.softcap;
  }
}

//===----------------------------------------------------------------------===//
// The selector
//===----------------------------------------------------------------------===//

TEST(ReferenceDFlash2, TopKTiesGoToTheLowerIndex) {
  const Vector u = {1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 2.0};
  std::vector<int32_t> top(4, -1);
  topK(u.data(), 7, 4, top.data());
  EXPECT_EQ(top, (std::vector<int32_t>{1, 2, 4, 3}));
  std::vector<int32_t> two(2, -1);
  topK(u.data(), 7, 2, two.data());
  EXPECT_EQ(two, (std::vector<int32_t>{1, 2}));
  std::vector<int32_t> all(7, -1);
  topK(u.data(), 7, 7, all.data());
  EXPECT_EQ(all, (std::vector<int32_t>{1, 2, 4, 3, 6, 0, 5}));
}

/// Owns the selector's inputs.
struct SelectorCase {
  int64_t rows, V, r, K;
  Vector u, t, P, S, weights;
  std::vector<int32_t> predecessors, labels;
  SelectorGold gold = SelectorGold::Skip;
  SelectorInputs<double> inputs() const {
    SelectorInputs<double> in;
    in.u = u.data();
    in.t = t.data();
    in.predecessors = predecessors.data();
    in.labels = labels.data();
    in.weights = weights.data();
    in.P = P.data();
    in.S = S.data();
    in.rows = rows;
    in.V = V;
    in.r = r;
    in.K = K;
    in.gold = gold;
    return in;
  }
  SelectorForward<double> forward() const { return selectorForward(inputs()); }
};

/// The indices of u by descending value, ties to the lower index, by a
/// stable sort of the whole row (not topK's partial sort).
std::vector<int32_t> sortedIndices(const double *u, int64_t V) {
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [u](int32_t a, int32_t b) { return u[a] > u[b]; });
  return order;
}

/// Random rows: row 0 weighs nothing, labels alternate between the row's
/// maximum (covered), its minimum (never covered when K < V) and a random
/// token.
SelectorCase randomSelectorCase(int64_t rows, int64_t V, int64_t r, int64_t K,
                                SelectorGold gold, uint64_t seed) {
  std::mt19937_64 rng(seed);
  SelectorCase c{rows,
                 V,
                 r,
                 K,
                 randomVector(rng, rows * V, -2.0, 2.0),
                 randomVector(rng, rows * r),
                 randomVector(rng, V * r),
                 randomVector(rng, V * r),
                 Vector(rows),
                 {},
                 {},
                 gold};
  for (int64_t row = 0; row < rows; ++row) {
    c.weights[row] = row == 0 ? 0.0 : std::exp(-double(row % 3) / 2.0);
    c.predecessors.push_back(static_cast<int32_t>(rng() % V));
    const std::vector<int32_t> order = sortedIndices(c.u.data() + row * V, V);
    const int32_t choice[] = {order.front(), order.back(),
                              static_cast<int32_t>(rng() % V)};
    c.labels.push_back(choice[row % 3]);
  }
  return c;
}

TEST(ReferenceDFlash2, SelectorForwardMatchesDirectComputation) {
  for (SelectorGold gold : {SelectorGold::Skip, SelectorGold::Inject}) {
    const SelectorCase c = randomSelectorCase(9, 15, 6, 5, gold, 21);
    const SelectorForward<double> f = c.forward();
    double lossSum = 0, coveredWeight = 0;
    for (int64_t row = 1; row < c.rows; ++row) {
      const double *u = c.u.data() + row * c.V;
      std::vector<int32_t> candidates = sortedIndices(u, c.V);
      candidates.resize(c.K);
      auto score = [&](int32_t token) {
        double s = u[token];
        for (int64_t i = 0; i < c.r; ++i)
          s += c.P[c.predecessors[row] * c.r + i] * c.t[row * c.r + i] *
               c.S[token * c.r + i];
        return s;
      };
      // Greedy over the true top-K, first maximum.
      int32_t choice = candidates[0];
      for (int32_t token : candidates)
        if (score(token) > score(choice))
          choice = token;
      EXPECT_EQ(f.choice[row], choice);
      EXPECT_EQ(f.hits[row], choice == c.labels[row]);
      auto at = std::find(candidates.begin(), candidates.end(), c.labels[row]);
      int64_t goldIndex = at - candidates.begin();
      if (at == candidates.end()) {
        goldIndex = -1;
        if (gold == SelectorGold::Inject) {
          candidates.back() = c.labels[row];
          goldIndex = c.K - 1;
        }
      }
      EXPECT_EQ(f.gold[row], goldIndex) << "row " << row;
      EXPECT_EQ(f.cov[row], goldIndex >= 0 ? 1 : 0);
      double sumExp = 0;
      for (int64_t j = 0; j < c.K; ++j) {
        EXPECT_EQ(f.candidates[row * c.K + j], candidates[j]);
        EXPECT_EQ(f.values[row * c.K + j], u[candidates[j]]);
        EXPECT_NEAR(f.scores[row * c.K + j], score(candidates[j]), 1e-14);
        sumExp += std::exp(score(candidates[j]));
      }
      const double ce =
          goldIndex < 0 ? 0.0 : std::log(sumExp) - score(candidates[goldIndex]);
      EXPECT_NEAR(f.ce[row], ce, 1e-13);
      if (goldIndex >= 0) {
        lossSum += c.weights[row] * ce;
        coveredWeight += c.weights[row];
      }
    }
    EXPECT_NEAR(f.lossSum, lossSum, 1e-13);
    EXPECT_NEAR(f.coveredWeight, coveredWeight, 1e-15);
    // The case holds both covered and uncovered labels.
    EXPECT_GT(coveredWeight, 0);
    EXPECT_EQ(f.gold[2], gold == SelectorGold::Inject ? c.K - 1 : -1);
  }
}

TEST(ReferenceDFlash2, SelectorSkipsWeightlessRowsWithoutReadingThem) {
  SelectorCase c = randomSelectorCase(4, 10, 3, 3, SelectorGold::Inject, 3);
  // Row 0 weighs nothing: out-of-range tokens there are never read.
  c.predecessors[0] = -5;
  c.labels[0] = 1000;
  const SelectorForward<double> f = c.forward();
  EXPECT_EQ(f.cov[0], 0);
  EXPECT_EQ(f.gold[0], -1);
  EXPECT_EQ(f.choice[0], -1);
  EXPECT_EQ(f.hits[0], 0);
  EXPECT_EQ(f.ce[0], 0.0);
  for (int64_t j = 0; j < c.K; ++j)
    EXPECT_EQ(f.candidates[j], -1);
  Vector du(c.rows * c.V), dt(c.rows * c.r);
  RowGradients<double> dP, dS;
  selectorBackward(c.inputs(), f, 1.0, false, du.data(), dt.data(), dP, dS);
  for (int64_t v = 0; v < c.V; ++v)
    EXPECT_EQ(du[v], 0.0);
  EXPECT_EQ(std::count(dP.rows.begin(), dP.rows.end(), -5), 0);
}

/// The selector's gradients as dense arrays: u, t, P, S.
struct SelectorGradients {
  Vector du, dt, dP, dS;
};

SelectorGradients selectorGradients(const SelectorCase &c, double scale,
                                    bool stopGradient) {
  const SelectorForward<double> f = c.forward();
  SelectorGradients g{Vector(c.rows * c.V, 9.0), Vector(c.rows * c.r, 9.0),
                      Vector(c.V * c.r, 0.0), Vector(c.V * c.r, 0.0)};
  RowGradients<double> dP, dS;
  selectorBackward(c.inputs(), f, scale, stopGradient, g.du.data(), g.dt.data(),
                   dP, dS);
  EXPECT_EQ(dP.width, c.r);
  EXPECT_EQ(dS.width, c.r);
  EXPECT_TRUE(scatterAddRows(dP, g.dP.data(), c.V));
  EXPECT_TRUE(scatterAddRows(dS, g.dS.data(), c.V));
  // One dP entry per covered row and K dS entries: sparse, never [V, r].
  int64_t covered = 0;
  for (uint8_t cov : f.cov)
    covered += cov;
  EXPECT_EQ(int64_t(dP.rows.size()), covered);
  EXPECT_EQ(int64_t(dS.rows.size()), covered * c.K);
  return g;
}

TEST(ReferenceDFlash2, SelectorGradientMatchesFiniteDifferences) {
  for (SelectorGold gold : {SelectorGold::Skip, SelectorGold::Inject})
    for (int64_t K : {1, 4}) {
      SelectorCase c = randomSelectorCase(7, 12, 5, K, gold, 41 + K);
      // Two rows share a predecessor, and a candidate is some row's
      // predecessor, so dP and dS sum several entries into one row.
      c.predecessors[2] = c.predecessors[1];
      const double scale = 0.7;
      const SelectorGradients g = selectorGradients(c, scale, false);
      auto loss = [&] { return scale * c.forward().lossSum; };
      const Vector fdU = finiteDifferences(c.u, loss);
      const Vector fdT = finiteDifferences(c.t, loss);
      const Vector fdP = finiteDifferences(c.P, loss);
      const Vector fdS = finiteDifferences(c.S, loss);
      if (K == 1) {
        // One candidate: CE_s = 0 whatever the inputs, so no gradient.
        for (const Vector *grad : {&g.du, &g.dt, &g.dP, &g.dS})
          for (double value : *grad)
            EXPECT_EQ(value, 0.0);
        EXPECT_LT(norm(fdU) + norm(fdT) + norm(fdP) + norm(fdS), 1e-8);
        continue;
      }
      const double errors[] = {
          relativeError(g.du, fdU), relativeError(g.dt, fdT),
          relativeError(g.dP, fdP), relativeError(g.dS, fdS)};
      for (double error : errors)
        EXPECT_LT(error, 1e-7) << "gold " << int(gold);
      std::printf("selectorBackward gold %d: relative errors u %.3g t %.3g "
                  "P %.3g S %.3g\n",
                  int(gold), errors[0], errors[1], errors[2], errors[3]);
      // u's gradient lies on the candidates only.
      const SelectorForward<double> f = c.forward();
      for (int64_t row = 0; row < c.rows; ++row)
        for (int32_t v = 0; v < c.V; ++v) {
          const int32_t *candidates = f.candidates.data() + row * c.K;
          if (std::find(candidates, candidates + c.K, v) == candidates + c.K) {
            EXPECT_EQ(g.du[row * c.V + v], 0.0);
          }
        }
    }
}

TEST(ReferenceDFlash2, SelectorStopGradientZeroesUOnly) {
  const SelectorCase c =
      randomSelectorCase(6, 11, 4, 3, SelectorGold::Inject, 61);
  const SelectorGradients full = selectorGradients(c, 1.3, false);
  const SelectorGradients stopped = selectorGradients(c, 1.3, true);
  EXPECT_GT(norm(full.du), 0);
  for (double value : stopped.du)
    EXPECT_EQ(value, 0.0);
  // t's gradient is what Wh learns from; the caller stops it before y.
  EXPECT_EQ(stopped.dt, full.dt);
  EXPECT_EQ(stopped.dP, full.dP);
  EXPECT_EQ(stopped.dS, full.dS);
  EXPECT_GT(norm(full.dt), 0);
}

TEST(ReferenceDFlash2, SelectorInjectsTheLabelAsTheLastCandidate) {
  // V 6, K 3, r 1, z = P[p] t = 1: s = u + S[c].
  SelectorCase c{1,
                 6,
                 1,
                 3,
                 {0.5, 2.0, -1.0, 1.0, 3.0, 0.0},
                 {2.0},
                 Vector(6, 0.5),
                 {0.0, 0.1, 0.2, 0.3, 0.4, 0.5},
                 {1.0},
                 {4},
                 {2},
                 SelectorGold::Skip};
  const SelectorForward<double> skipped = c.forward();
  EXPECT_EQ(skipped.candidates, (std::vector<int32_t>{4, 1, 3}));
  EXPECT_EQ(skipped.cov[0], 0);
  EXPECT_EQ(skipped.ce[0], 0.0);
  EXPECT_EQ(skipped.lossSum, 0.0);
  c.gold = SelectorGold::Inject;
  const SelectorForward<double> injected = c.forward();
  EXPECT_EQ(injected.candidates, (std::vector<int32_t>{4, 1, 2}));
  EXPECT_EQ(injected.values, (Vector{3.0, 2.0, -1.0}));
  EXPECT_NEAR(injected.scores[2], -1.0 + 0.2, 1e-15);
  EXPECT_EQ(injected.cov[0], 1);
  EXPECT_EQ(injected.gold[0], 2);
  EXPECT_GT(injected.ce[0], 0);
  EXPECT_EQ(injected.coveredWeight, 1.0);
  // The greedy choice is serving's: over the true top-K, not a hit.
  EXPECT_EQ(injected.choice[0], 4);
  EXPECT_EQ(injected.hits[0], 0);
  // The injected label's own logit gets its gradient.
  const SelectorGradients g = selectorGradients(c, 1.0, false);
  EXPECT_LT(g.du[2], 0);
  // A covered label is the same under both options.
  c.labels[0] = 3;
  const SelectorForward<double> covered = c.forward();
  c.gold = SelectorGold::Skip;
  const SelectorForward<double> coveredSkip = c.forward();
  EXPECT_EQ(covered.candidates, coveredSkip.candidates);
  EXPECT_EQ(covered.gold[0], 2);
  EXPECT_EQ(covered.ce[0], coveredSkip.ce[0]);
}

TEST(ReferenceDFlash2, SelectorGreedyChoiceTiesGoToTheLowerCandidate) {
  // z = 1: s = u + S[c]. Candidates 2 (u 3.0) and 0 (u 2.5); S[0] = 0.5
  // ties their scores, so candidate j = 0 (token 2) wins.
  SelectorCase c{1,
                 4,
                 1,
                 2,
                 {2.5, -1.0, 3.0, 0.0},
                 {1.0},
                 Vector(4, 1.0),
                 {0.5, 0.0, 0.0, 0.0},
                 {1.0},
                 {1},
                 {0},
                 SelectorGold::Skip};
  SelectorForward<double> f = c.forward();
  EXPECT_EQ(f.candidates, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(f.scores[0], f.scores[1]);
  EXPECT_EQ(f.choice[0], 2);
  EXPECT_EQ(f.hits[0], 0);
  // A little more on S[0] and the selector re-ranks: token 0 is chosen.
  c.S[0] = 0.75;
  f = c.forward();
  EXPECT_EQ(f.choice[0], 0);
  EXPECT_EQ(f.hits[0], 1);
  EXPECT_EQ(f.gold[0], 1);
}

TEST(ReferenceDFlash2, SelectorWithOneCandidate) {
  const SelectorCase c = randomSelectorCase(6, 9, 3, 1, SelectorGold::Skip, 71);
  const SelectorForward<double> f = c.forward();
  for (int64_t row = 1; row < c.rows; ++row) {
    const int32_t top = sortedIndices(c.u.data() + row * c.V, c.V).front();
    EXPECT_EQ(f.candidates[row], top);
    EXPECT_EQ(f.choice[row], top);
    EXPECT_EQ(f.cov[row], c.labels[row] == top ? 1 : 0);
    EXPECT_EQ(f.hits[row], f.cov[row]);
    EXPECT_EQ(f.ce[row], 0.0);
  }
}

TEST(ReferenceDFlash2, FloatMatchesDouble) {
  const SelectorCase c =
      randomSelectorCase(8, 20, 6, 5, SelectorGold::Inject, 81);
  auto toFloat = [](const Vector &x) {
    return std::vector<float>(x.begin(), x.end());
  };
  const std::vector<float> u = toFloat(c.u), t = toFloat(c.t), P = toFloat(c.P),
                           S = toFloat(c.S), w = toFloat(c.weights);
  SelectorInputs<float> in;
  in.u = u.data();
  in.t = t.data();
  in.predecessors = c.predecessors.data();
  in.labels = c.labels.data();
  in.weights = w.data();
  in.P = P.data();
  in.S = S.data();
  in.rows = c.rows;
  in.V = c.V;
  in.r = c.r;
  in.K = c.K;
  in.gold = c.gold;
  const SelectorForward<float> f = selectorForward(in);
  const SelectorForward<double> expected = c.forward();
  EXPECT_EQ(f.candidates, expected.candidates);
  EXPECT_NEAR(f.lossSum, expected.lossSum, 1e-5 * expected.lossSum);

  const ConvCase conv = randomConvCase(2, 1, 91);
  const std::vector<float> in32 = toFloat(conv.in), D32 = toFloat(conv.D),
                           base32 = toFloat(conv.base);
  std::vector<float> out32(in32.size());
  groupedConv(in32.data(), D32.data() + conv.shape.kc * conv.shape.G(),
              base32.data(), out32.data(), conv.shape);
  EXPECT_LT(relativeError(Vector(out32.begin(), out32.end()), conv.run()),
            1e-6);
}

} // namespace
