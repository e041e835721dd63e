//===- ReferenceStepTest.cpp - A whole training step from reference ops ---===//
//
// Composes the reference ops into the forward, loss and backward of
// docs/semantics.md sections 3 and 4, then checks the composed gradient of the
// loss against central finite differences (so the op gradients fit
// together: shared k/v weights over context and draft, the context feeding
// every layer, per-head norms), that a packed row gives each of its
// conversations what it gets alone (docs/semantics.md section 9), and times a
// whole step of the tiny spec.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using namespace dflash::ref;

namespace {

struct LayerKind {
  int64_t window;
  bool causal;
};

struct StepConfig {
  int64_t B, S, N, bs, H, taps, nh, nkv, d, I, V;
  std::vector<LayerKind> layers;
  double eps = 1e-6, theta = 10000.0, gamma = 4.0;
  int64_t maskTokenId = 0;
  int64_t Q() const { return N * bs; }
};

template <typename T> struct LayerWeights {
  std::vector<T> inputNorm, q, k, v, o, qNorm, kNorm, postNorm, gate, up, down;

  std::vector<std::vector<T> *> all() {
    return {&inputNorm, &q,        &k,    &v,  &o,   &qNorm,
            &kNorm,     &postNorm, &gate, &up, &down};
  }
};

template <typename T> struct DrafterWeights {
  std::vector<T> fc, hiddenNorm, finalNorm;
  std::vector<LayerWeights<T>> layers;

  std::vector<std::vector<T> *> all() {
    std::vector<std::vector<T> *> tensors = {&fc, &hiddenNorm, &finalNorm};
    for (LayerWeights<T> &layer : layers)
      for (std::vector<T> *tensor : layer.all())
        tensors.push_back(tensor);
    return tensors;
  }
};

/// One step's inputs and the frozen target tensors.
template <typename T> struct StepInputs {
  std::vector<int32_t> inputIds, anchors, positionIds;
  std::vector<uint8_t> lossMask, keep;
  std::vector<T> targetHidden, embedding, lmHead;
};

template <typename T> std::vector<T> zerosLike(const std::vector<T> &x) {
  return std::vector<T>(x.size(), T(0));
}

template <typename T>
void addInto(std::vector<T> &acc, const std::vector<T> &x) {
  for (size_t i = 0; i < acc.size(); ++i)
    acc[i] += x[i];
}

template <typename T>
DrafterWeights<T> randomWeights(const StepConfig &c, std::mt19937_64 &rng,
                                double linearScale) {
  std::normal_distribution<double> normal(0.0, 1.0);
  auto linearWeight = [&](int64_t n) {
    std::vector<T> w(n);
    for (T &value : w)
      value = static_cast<T>(linearScale * normal(rng));
    return w;
  };
  // Norm weights near 1, not exactly 1, so their gradients are exercised.
  auto normWeight = [&](int64_t n) {
    std::vector<T> w(n);
    for (T &value : w)
      value = static_cast<T>(1.0 + 0.1 * normal(rng));
    return w;
  };
  DrafterWeights<T> w;
  w.fc = linearWeight(c.H * c.taps * c.H);
  w.hiddenNorm = normWeight(c.H);
  w.finalNorm = normWeight(c.H);
  for (size_t l = 0; l < c.layers.size(); ++l) {
    LayerWeights<T> layer;
    layer.inputNorm = normWeight(c.H);
    layer.q = linearWeight(c.nh * c.d * c.H);
    layer.k = linearWeight(c.nkv * c.d * c.H);
    layer.v = linearWeight(c.nkv * c.d * c.H);
    layer.o = linearWeight(c.H * c.nh * c.d);
    layer.qNorm = normWeight(c.d);
    layer.kNorm = normWeight(c.d);
    layer.postNorm = normWeight(c.H);
    layer.gate = linearWeight(c.I * c.H);
    layer.up = linearWeight(c.I * c.H);
    layer.down = linearWeight(c.H * c.I);
    w.layers.push_back(std::move(layer));
  }
  return w;
}

template <typename T>
StepInputs<T> randomInputs(const StepConfig &c, std::mt19937_64 &rng,
                           std::vector<int32_t> anchors,
                           std::vector<uint8_t> keep) {
  std::normal_distribution<double> normal(0.0, 1.0);
  StepInputs<T> in;
  in.anchors = std::move(anchors);
  in.keep = std::move(keep);
  for (int64_t i = 0; i < c.B * c.S; ++i) {
    in.inputIds.push_back(static_cast<int32_t>(rng() % (c.V - 1)));
    in.lossMask.push_back(rng() % 5 != 0);
    in.positionIds.push_back(static_cast<int32_t>(i % c.S));
  }
  auto fill = [&](int64_t n) {
    std::vector<T> x(n);
    for (T &value : x)
      value = static_cast<T>(normal(rng));
    return x;
  };
  in.targetHidden = fill(c.B * c.S * c.taps * c.H);
  in.embedding = fill(c.V * c.H);
  in.lmHead = fill(c.V * c.H);
  // Logits of standard deviation 0.5 whatever H is.
  for (T &value : in.lmHead)
    value *= static_cast<T>(0.5 / std::sqrt(static_cast<double>(c.H)));
  return in;
}

/// Activations of one layer that its backward needs.
template <typename T> struct LayerActivations {
  std::vector<T> x, h, qProj, qNormed, q, contextKeysProj, contextKeysNormed,
      contextKeys, contextValues, draftKeysProj, draftKeysNormed, draftKeys,
      draftValues, attn, lse, x1, h2, gate, up, act;
};

template <typename T> struct StepResult {
  double loss = 0;
  CrossEntropySums sums;
  DrafterWeights<T> grads;
};

/// Forward, loss and (when `grads` is set) backward of one step.
template <typename T>
StepResult<T> runStep(const StepConfig &c, DrafterWeights<T> &w,
                      const StepInputs<T> &in, bool grads) {
  const int64_t B = c.B, S = c.S, Q = c.Q(), H = c.H, d = c.d;
  const int64_t draftRows = B * Q, contextRows = B * S;
  const int64_t qWidth = c.nh * d, kvWidth = c.nkv * d;

  // Context, shared by every layer.
  std::vector<T> contextProj(contextRows * H), context(contextRows * H);
  linear(in.targetHidden.data(), w.fc.data(), contextProj.data(), contextRows,
         H, c.taps * H);
  rmsNorm(contextProj.data(), w.hiddenNorm.data(), context.data(), contextRows,
          H, c.eps);

  std::vector<int32_t> noise(draftRows), draftPos(draftRows), labels(draftRows);
  const std::vector<int32_t> &contextPositions = in.positionIds;
  std::vector<T> lossWeights(draftRows);
  draftTokens(in.inputIds.data(), in.anchors.data(), in.keep.data(),
              noise.data(), B, S, c.N, c.bs, c.maskTokenId);
  draftPositions(in.anchors.data(), in.positionIds.data(), draftPos.data(), B,
                 S, c.N, c.bs);
  draftTargets(in.inputIds.data(), in.lossMask.data(), in.anchors.data(),
               in.keep.data(), in.positionIds.data(), labels.data(),
               lossWeights.data(), B, S, c.N, c.bs, c.gamma);

  std::vector<T> x(draftRows * H);
  embed(in.embedding.data(), noise.data(), x.data(), draftRows, H);

  std::vector<LayerActivations<T>> saved(c.layers.size());
  for (size_t l = 0; l < c.layers.size(); ++l) {
    LayerWeights<T> &lw = w.layers[l];
    LayerActivations<T> &a = saved[l];
    AttentionShape shape{B, S, c.N, c.bs, c.nh, c.nkv, d};
    shape.window = c.layers[l].window;
    shape.causal = c.layers[l].causal;
    a.x = x;
    a.h.resize(draftRows * H);
    rmsNorm(x.data(), lw.inputNorm.data(), a.h.data(), draftRows, H, c.eps);
    // Queries: projection, per-head norm, rope at the draft positions.
    a.qProj.resize(draftRows * qWidth);
    a.qNormed.resize(draftRows * qWidth);
    a.q.resize(draftRows * qWidth);
    linear(a.h.data(), lw.q.data(), a.qProj.data(), draftRows, qWidth, H);
    rmsNorm(a.qProj.data(), lw.qNorm.data(), a.qNormed.data(), draftRows * c.nh,
            d, c.eps);
    rope(a.qNormed.data(), draftPos.data(), a.q.data(), draftRows, c.nh, d,
         c.theta);
    // Keys and values of the context and of the draft, same weights.
    auto keysAndValues = [&](const std::vector<T> &source, int64_t rows,
                             const int32_t *positions, std::vector<T> &proj,
                             std::vector<T> &normed, std::vector<T> &keys,
                             std::vector<T> &values) {
      proj.resize(rows * kvWidth);
      normed.resize(rows * kvWidth);
      keys.resize(rows * kvWidth);
      values.resize(rows * kvWidth);
      linear(source.data(), lw.k.data(), proj.data(), rows, kvWidth, H);
      rmsNorm(proj.data(), lw.kNorm.data(), normed.data(), rows * c.nkv, d,
              c.eps);
      rope(normed.data(), positions, keys.data(), rows, c.nkv, d, c.theta);
      linear(source.data(), lw.v.data(), values.data(), rows, kvWidth, H);
    };
    keysAndValues(context, contextRows, contextPositions.data(),
                  a.contextKeysProj, a.contextKeysNormed, a.contextKeys,
                  a.contextValues);
    keysAndValues(a.h, draftRows, draftPos.data(), a.draftKeysProj,
                  a.draftKeysNormed, a.draftKeys, a.draftValues);
    a.attn.resize(draftRows * qWidth);
    a.lse.resize(draftRows * c.nh);
    blockAttention(a.q.data(), a.contextKeys.data(), a.contextValues.data(),
                   a.draftKeys.data(), a.draftValues.data(), in.anchors.data(),
                   in.keep.data(), in.positionIds.data(), a.attn.data(),
                   a.lse.data(), shape);
    std::vector<T> projected(draftRows * H);
    linear(a.attn.data(), lw.o.data(), projected.data(), draftRows, H, qWidth);
    a.x1 = x;
    addInto(a.x1, projected);
    a.h2.resize(draftRows * H);
    rmsNorm(a.x1.data(), lw.postNorm.data(), a.h2.data(), draftRows, H, c.eps);
    a.gate.resize(draftRows * c.I);
    a.up.resize(draftRows * c.I);
    a.act.resize(draftRows * c.I);
    linear(a.h2.data(), lw.gate.data(), a.gate.data(), draftRows, c.I, H);
    linear(a.h2.data(), lw.up.data(), a.up.data(), draftRows, c.I, H);
    swiglu(a.gate.data(), a.up.data(), a.act.data(), draftRows * c.I);
    linear(a.act.data(), lw.down.data(), projected.data(), draftRows, H, c.I);
    x = a.x1;
    addInto(x, projected);
  }

  std::vector<T> y(draftRows * H);
  rmsNorm(x.data(), w.finalNorm.data(), y.data(), draftRows, H, c.eps);
  StepResult<T> result;
  result.sums = lmHeadCrossEntropy(y.data(), in.lmHead.data(), labels.data(),
                                   lossWeights.data(), draftRows, c.V, H);
  result.loss = result.sums.lossSum / result.sums.weightSum;
  if (!grads)
    return result;

  // Backward.
  DrafterWeights<T> &g = result.grads;
  g = w;
  for (std::vector<T> *tensor : g.all())
    std::fill(tensor->begin(), tensor->end(), T(0));
  std::vector<T> dy(draftRows * H), dx(draftRows * H);
  lmHeadCrossEntropyGrad(y.data(), in.lmHead.data(), labels.data(),
                         lossWeights.data(), 1.0 / result.sums.weightSum,
                         dy.data(), draftRows, c.V, H);
  rmsNormGrad(dy.data(), x.data(), w.finalNorm.data(), dx.data(),
              g.finalNorm.data(), draftRows, H, c.eps);
  std::vector<T> dContext(contextRows * H, T(0));
  for (size_t l = c.layers.size(); l-- > 0;) {
    LayerWeights<T> &lw = w.layers[l];
    LayerWeights<T> &lg = g.layers[l];
    LayerActivations<T> &a = saved[l];
    AttentionShape shape{B, S, c.N, c.bs, c.nh, c.nkv, d};
    shape.window = c.layers[l].window;
    shape.causal = c.layers[l].causal;
    // MLP: x = x1 + down(swiglu(gate(h2), up(h2))).
    std::vector<T> dAct(draftRows * c.I), dGate(draftRows * c.I),
        dUp(draftRows * c.I), dh2(draftRows * H), dh2Up(draftRows * H),
        dx1(draftRows * H);
    linearGradInput(dx.data(), lw.down.data(), dAct.data(), draftRows, H, c.I);
    linearGradWeight(dx.data(), a.act.data(), lg.down.data(), draftRows, H,
                     c.I);
    swigluGrad(dAct.data(), a.gate.data(), a.up.data(), dGate.data(),
               dUp.data(), draftRows * c.I);
    linearGradInput(dGate.data(), lw.gate.data(), dh2.data(), draftRows, c.I,
                    H);
    linearGradInput(dUp.data(), lw.up.data(), dh2Up.data(), draftRows, c.I, H);
    addInto(dh2, dh2Up);
    linearGradWeight(dGate.data(), a.h2.data(), lg.gate.data(), draftRows, c.I,
                     H);
    linearGradWeight(dUp.data(), a.h2.data(), lg.up.data(), draftRows, c.I, H);
    rmsNormGrad(dh2.data(), a.x1.data(), lw.postNorm.data(), dx1.data(),
                lg.postNorm.data(), draftRows, H, c.eps);
    addInto(dx1, dx);
    // Attention: x1 = x + o(attn).
    std::vector<T> dAttn(draftRows * qWidth), dq(draftRows * qWidth),
        dContextKeys(contextRows * kvWidth),
        dContextValues(contextRows * kvWidth), dDraftKeys(draftRows * kvWidth),
        dDraftValues(draftRows * kvWidth);
    linearGradInput(dx1.data(), lw.o.data(), dAttn.data(), draftRows, H,
                    qWidth);
    linearGradWeight(dx1.data(), a.attn.data(), lg.o.data(), draftRows, H,
                     qWidth);
    blockAttentionGrad(dAttn.data(), a.q.data(), a.contextKeys.data(),
                       a.contextValues.data(), a.draftKeys.data(),
                       a.draftValues.data(), in.anchors.data(), in.keep.data(),
                       in.positionIds.data(), a.attn.data(), a.lse.data(),
                       dq.data(), dContextKeys.data(), dContextValues.data(),
                       dDraftKeys.data(), dDraftValues.data(), shape);
    std::vector<T> dh(draftRows * H, T(0));
    // dSource += d(proj)/d(source), dWeight += d(proj)/d(weight).
    auto backLinear = [&](const std::vector<T> &dProj,
                          const std::vector<T> &source,
                          const std::vector<T> &weight, std::vector<T> &dWeight,
                          std::vector<T> &dSource, int64_t rows, int64_t out) {
      std::vector<T> dIn(rows * H), dW(weight.size());
      linearGradInput(dProj.data(), weight.data(), dIn.data(), rows, out, H);
      linearGradWeight(dProj.data(), source.data(), dW.data(), rows, out, H);
      addInto(dSource, dIn);
      addInto(dWeight, dW);
    };
    // rope then the per-head norm, backwards; returns d(projection).
    auto backRopeNorm =
        [&](const std::vector<T> &dRoped, const int32_t *positions,
            const std::vector<T> &proj, const std::vector<T> &normW,
            std::vector<T> &dNormW, int64_t rows, int64_t heads) {
          std::vector<T> dNormed(dRoped.size()), dProj(dRoped.size()),
              dW(normW.size());
          ropeGrad(dRoped.data(), positions, dNormed.data(), rows, heads, d,
                   c.theta);
          rmsNormGrad(dNormed.data(), proj.data(), normW.data(), dProj.data(),
                      dW.data(), rows * heads, d, c.eps);
          addInto(dNormW, dW);
          return dProj;
        };
    const std::vector<T> dqProj = backRopeNorm(
        dq, draftPos.data(), a.qProj, lw.qNorm, lg.qNorm, draftRows, c.nh);
    backLinear(dqProj, a.h, lw.q, lg.q, dh, draftRows, qWidth);
    const std::vector<T> dContextKeysProj =
        backRopeNorm(dContextKeys, contextPositions.data(), a.contextKeysProj,
                     lw.kNorm, lg.kNorm, contextRows, c.nkv);
    const std::vector<T> dDraftKeysProj =
        backRopeNorm(dDraftKeys, draftPos.data(), a.draftKeysProj, lw.kNorm,
                     lg.kNorm, draftRows, c.nkv);
    backLinear(dContextKeysProj, context, lw.k, lg.k, dContext, contextRows,
               kvWidth);
    backLinear(dDraftKeysProj, a.h, lw.k, lg.k, dh, draftRows, kvWidth);
    backLinear(dContextValues, context, lw.v, lg.v, dContext, contextRows,
               kvWidth);
    backLinear(dDraftValues, a.h, lw.v, lg.v, dh, draftRows, kvWidth);
    rmsNormGrad(dh.data(), a.x.data(), lw.inputNorm.data(), dx.data(),
                lg.inputNorm.data(), draftRows, H, c.eps);
    addInto(dx, dx1);
  }
  // dx now reaches the frozen embedding and stops.
  std::vector<T> dContextProj(contextRows * H);
  rmsNormGrad(dContext.data(), contextProj.data(), w.hiddenNorm.data(),
              dContextProj.data(), g.hiddenNorm.data(), contextRows, H, c.eps);
  linearGradWeight(dContextProj.data(), in.targetHidden.data(), g.fc.data(),
                   contextRows, H, c.taps * H);
  return result;
}

TEST(ReferenceStep, ComposedGradientMatchesFiniteDifferences) {
  // Two rows, a sliding causal layer and a full one, GQA 2, anchors at 0,
  // odd, near the end, and an unused slot.
  StepConfig c{2, 14, 3, 4, 12, 2, 4, 2, 4, 20, 37, {{5, true}, {0, false}}};
  c.maskTokenId = 36;
  std::mt19937_64 rng(71);
  DrafterWeights<double> w = randomWeights<double>(c, rng, 0.3);
  StepInputs<double> in =
      randomInputs<double>(c, rng, {0, 5, 12, 3, 8, 0}, {1, 1, 1, 1, 1, 0});
  std::fill(in.lossMask.begin(), in.lossMask.end(), 1);
  const StepResult<double> analytic = runStep(c, w, in, true);
  ASSERT_GT(analytic.sums.weightSum, 0);
  ASSERT_TRUE(std::isfinite(analytic.loss));

  DrafterWeights<double> analyticGrads = analytic.grads;
  const std::vector<std::vector<double> *> params = w.all();
  const std::vector<std::vector<double> *> grads = analyticGrads.all();
  constexpr double step = 1e-6;
  double worst = 0;
  for (size_t t = 0; t < params.size(); ++t) {
    std::vector<double> &p = *params[t];
    // Every element of the small tensors, a random sample of the others.
    std::vector<size_t> picks;
    for (size_t i = 0; i < p.size(); ++i)
      if (p.size() <= 16 || rng() % 8 == 0)
        picks.push_back(i);
    double diffSquares = 0, normSquares = 0;
    for (size_t i : picks) {
      const double saved = p[i];
      p[i] = saved + step;
      const double plus = runStep(c, w, in, false).loss;
      p[i] = saved - step;
      const double minus = runStep(c, w, in, false).loss;
      p[i] = saved;
      const double fd = (plus - minus) / (2 * step);
      diffSquares += (fd - (*grads[t])[i]) * (fd - (*grads[t])[i]);
      normSquares += (*grads[t])[i] * (*grads[t])[i];
    }
    ASSERT_GT(normSquares, 0) << "tensor " << t;
    const double error = std::sqrt(diffSquares / normSquares);
    EXPECT_LT(error, 1e-6) << "tensor " << t;
    worst = std::max(worst, error);
  }
  std::printf("composed step gradient: worst relative error %.3g over %zu "
              "tensors\n",
              worst, params.size());
}

// docs/semantics.md section 9: two conversations packed into one row (positions
// restarting at the second) give the loss sums and the gradients that the
// same conversations get alone, each in a row of its own, with the same
// anchors. A block of the first conversation runs into the second (its
// weights must stop there), and a sliding layer and a full one both see
// only their own conversation.
TEST(ReferenceStep, PackedRowEqualsItsConversationsAlone) {
  StepConfig c{2, 16, 3, 4, 12, 2, 4, 2, 4, 20, 37, {{5, true}, {0, false}}};
  c.maskTokenId = 36;
  const int64_t first = 7, second = 9, S = c.S, width = c.taps * c.H;
  std::mt19937_64 rng(73);
  DrafterWeights<double> w = randomWeights<double>(c, rng, 0.3);
  // Random tokens, features and frozen tensors; the layouts are set below.
  StepInputs<double> alone =
      randomInputs<double>(c, rng, {1, 4, 0, 2, 0, 0}, {1, 1, 0, 1, 0, 0});
  // Alone: conversation 1 in row 0, conversation 2 in row 1, padding after.
  for (int64_t b = 0; b < 2; ++b) {
    int64_t length = b == 0 ? first : second;
    for (int64_t t = length; t < S; ++t) {
      alone.inputIds[size_t(b * S + t)] = 0;
      alone.lossMask[size_t(b * S + t)] = 0;
      std::fill_n(alone.targetHidden.begin() + (b * S + t) * width, width, 0.0);
    }
    alone.lossMask[size_t(b * S + 1)] = alone.lossMask[size_t(b * S + 2)] = 1;
  }
  alone.lossMask[4] = alone.lossMask[5] = 1;
  // Packed: both in row 0 (the second at column 7, positions from 0 again),
  // row 1 empty; the second conversation's anchor moves with it.
  StepInputs<double> packed = alone;
  packed.anchors = {1, 4, int32_t(first + 2), 0, 0, 0};
  packed.keep = {1, 1, 1, 0, 0, 0};
  for (int64_t t = 0; t < second; ++t) {
    packed.inputIds[size_t(first + t)] = alone.inputIds[size_t(S + t)];
    packed.lossMask[size_t(first + t)] = alone.lossMask[size_t(S + t)];
    packed.positionIds[size_t(first + t)] = int32_t(t);
    std::copy_n(alone.targetHidden.begin() + (S + t) * width, width,
                packed.targetHidden.begin() + (first + t) * width);
  }
  std::fill_n(packed.inputIds.begin() + S, S, 0);
  std::fill_n(packed.lossMask.begin() + S, S, uint8_t(0));
  std::fill_n(packed.targetHidden.begin() + S * width, S * width, 0.0);

  const StepResult<double> a = runStep(c, w, alone, true);
  const StepResult<double> p = runStep(c, w, packed, true);
  ASSERT_GT(a.sums.weightSum, 0);
  EXPECT_NEAR(p.sums.lossSum, a.sums.lossSum, 1e-12 * a.sums.lossSum);
  EXPECT_NEAR(p.sums.weightSum, a.sums.weightSum, 1e-12);
  EXPECT_EQ(p.sums.correct, a.sums.correct);
  EXPECT_EQ(p.sums.count, a.sums.count);
  DrafterWeights<double> ga = a.grads, gp = p.grads;
  const std::vector<std::vector<double> *> alone_ = ga.all(),
                                           packed_ = gp.all();
  double worst = 0;
  for (size_t t = 0; t < alone_.size(); ++t) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < alone_[t]->size(); ++i) {
      double x = (*alone_[t])[i], y = (*packed_[t])[i];
      diff += (x - y) * (x - y);
      norm += x * x;
    }
    ASSERT_GT(norm, 0) << "tensor " << t;
    worst = std::max(worst, std::sqrt(diff / norm));
  }
  EXPECT_LT(worst, 1e-12);
  std::printf("packed row vs conversations alone: loss %.6f vs %.6f, worst "
              "gradient relative difference %.3g\n",
              p.loss, a.loss, worst);

  // The test can fail: without position_ids (an unpacked row) the second
  // conversation sees the first and the sums change.
  StepInputs<double> unpacked = packed;
  for (int64_t i = 0; i < 2 * S; ++i)
    unpacked.positionIds[size_t(i)] = int32_t(i % S);
  const StepResult<double> u = runStep(c, w, unpacked, false);
  EXPECT_GT(std::fabs(u.sums.lossSum - a.sums.lossSum), 1e-6);
}

// The tiny spec (specs/tiny.toml) in float: forward, backward and AdamW of a
// whole step, timed so a slow reference shows up here first.
TEST(ReferenceStep, TinySpecStepInFloat) {
  StepConfig c{2, 128, 12, 8,   256,  2,
               4, 2,   64, 512, 1024, {{32, true}, {0, false}}};
  c.maskTokenId = 1023;
  std::mt19937_64 rng(72);
  DrafterWeights<float> w = randomWeights<float>(c, rng, 0.02);
  std::vector<int32_t> anchors;
  std::vector<uint8_t> keep;
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t n = 0; n < c.N; ++n) {
      anchors.push_back(static_cast<int32_t>(1 + n * 10 + b));
      keep.push_back(n < c.N - 1 || b == 0);
    }
  }
  const StepInputs<float> in = randomInputs<float>(c, rng, anchors, keep);
  const auto start = std::chrono::steady_clock::now();
  StepResult<float> result = runStep(c, w, in, true);
  const std::vector<std::vector<float> *> params = w.all();
  const std::vector<std::vector<float> *> grads = result.grads.all();
  double sumSquares = 0;
  for (std::vector<float> *grad : grads)
    sumSquares +=
        sumOfSquares(grad->data(), static_cast<int64_t>(grad->size()));
  const double scale = clipCoefficient(std::sqrt(sumSquares), 1.0);
  AdamWConfig config;
  config.lr = 3e-3;
  for (size_t t = 0; t < params.size(); ++t) {
    std::vector<float> m(params[t]->size(), 0.0f), v(params[t]->size(), 0.0f);
    adamw(params[t]->data(), grads[t]->data(), m.data(), v.data(),
          static_cast<int64_t>(m.size()), 1, scale, config);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf("tiny spec step: loss %.4f, acc %.4f, %.3f s\n", result.loss,
              result.sums.correct / result.sums.count, seconds);
  EXPECT_TRUE(std::isfinite(result.loss));
  // Logits of standard deviation 0.5 give a loss near ln V + 0.5^2 / 2.
  EXPECT_NEAR(result.loss, std::log(1024.0) + 0.125, 0.1);
  // Generous against a loaded machine; the budget is well under a second.
  EXPECT_LT(seconds, 5.0);
}

} // namespace
