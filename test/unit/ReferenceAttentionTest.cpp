//===- ReferenceAttentionTest.cpp - Tests of the attention reference ------===//
//
// blockAttention against a dense-mask implementation written from the text
// of docs/semantics.md, its gradient against central finite differences, and
// the visibility traps of docs/semantics.md section 8 at the op level.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"
#include "test/unit/ReferenceTestSupport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace dflash::ref;
using namespace dflash::reftest;

namespace {

/// One attention problem: shape, anchors, keep flags and random tensors.
struct AttentionCase {
  std::string name;
  AttentionShape shape;
  std::vector<int32_t> anchors;
  std::vector<uint8_t> keep;
  /// [B, S]: arange in each row, or restarting at each packed conversation.
  std::vector<int32_t> positions;
  Vector q, contextKeys, contextValues, draftKeys, draftValues;

  int64_t queryCount() const { return shape.B * shape.Q(); }
  int64_t qSize() const { return queryCount() * shape.nh * shape.d; }
  int64_t contextSize() const {
    return shape.B * shape.S * shape.nkv * shape.d;
  }
  int64_t draftSize() const { return queryCount() * shape.nkv * shape.d; }
};

AttentionCase makeCase(std::string name, AttentionShape shape,
                       std::vector<int32_t> anchors, std::vector<uint8_t> keep,
                       uint64_t seed) {
  AttentionCase c{std::move(name),
                  shape,
                  std::move(anchors),
                  std::move(keep),
                  {},
                  {},
                  {},
                  {},
                  {},
                  {}};
  for (int64_t i = 0; i < shape.B * shape.S; ++i)
    c.positions.push_back(int32_t(i % shape.S));
  std::mt19937_64 rng(seed);
  c.q = randomVector(rng, c.qSize());
  c.contextKeys = randomVector(rng, c.contextSize());
  c.contextValues = randomVector(rng, c.contextSize());
  c.draftKeys = randomVector(rng, c.draftSize());
  c.draftValues = randomVector(rng, c.draftSize());
  return c;
}

/// `c` with its rows packed: every row's positions restart at 0 at each
/// column of `starts` (docs/semantics.md section 9).
AttentionCase packed(AttentionCase c, const std::vector<int64_t> &starts) {
  const int64_t S = c.shape.S;
  for (int64_t b = 0; b < c.shape.B; ++b) {
    int32_t p = 0;
    for (int64_t j = 0; j < S; ++j) {
      if (std::find(starts.begin(), starts.end(), j) != starts.end())
        p = 0;
      c.positions[size_t(b * S + j)] = p++;
    }
  }
  c.name += "_packed";
  return c;
}

AttentionShape attentionShape(int64_t B, int64_t S, int64_t N, int64_t bs,
                              int64_t nh, int64_t nkv, int64_t d,
                              int64_t window, bool causal) {
  AttentionShape shape{B, S, N, bs, nh, nkv, d};
  shape.window = window;
  shape.causal = causal;
  return shape;
}

/// The cases every attention test runs over: full and sliding+causal
/// layers, a window wider than the context, GQA ratios 1, 2 and 4, unused
/// slots, anchors 0, 1 and S-2, odd anchors, block sizes 3, 4 and 8.
std::vector<AttentionCase> attentionCases() {
  std::vector<AttentionCase> cases;
  cases.push_back(makeCase("full_gqa2_bs4",
                           attentionShape(2, 12, 3, 4, 4, 2, 8, 0, false),
                           {0, 5, 10, 1, 3, 7}, {1, 1, 1, 1, 0, 1}, 11));
  cases.push_back(makeCase(
      "sliding_causal_gqa4_bs3", attentionShape(2, 13, 4, 3, 4, 1, 6, 3, true),
      {1, 4, 7, 11, 0, 3, 9, 0}, {1, 1, 1, 1, 1, 1, 1, 0}, 12));
  cases.push_back(makeCase("sliding_window_wider_than_context_bs8",
                           attentionShape(1, 10, 3, 8, 2, 2, 4, 50, true),
                           {1, 5, 8}, {1, 1, 1}, 13));
  cases.push_back(makeCase("full_gqa4_bs8",
                           attentionShape(2, 11, 2, 8, 8, 2, 4, 0, false),
                           {3, 9, 0, 0}, {1, 1, 1, 0}, 14));
  cases.push_back(makeCase("sliding_noncausal_window5_bs4",
                           attentionShape(1, 16, 3, 4, 2, 1, 4, 5, false),
                           {2, 9, 14}, {1, 1, 1}, 15));
  cases.push_back(makeCase("full_causal_mha_bs3",
                           attentionShape(1, 9, 3, 3, 2, 2, 4, 0, true),
                           {0, 3, 7}, {1, 1, 1}, 16));
  // Packed rows: anchors at, just after and well past a conversation start,
  // blocks that run into the next conversation, a window that reaches back
  // over a boundary.
  cases.push_back(packed(
      makeCase("full_gqa2_bs4", attentionShape(2, 12, 3, 4, 4, 2, 8, 0, false),
               {0, 5, 10, 1, 4, 7}, {1, 1, 1, 1, 1, 1}, 17),
      {4, 7}));
  cases.push_back(
      packed(makeCase("sliding_causal_gqa4_bs3",
                      attentionShape(2, 13, 4, 3, 4, 1, 6, 3, true),
                      {1, 5, 7, 11, 0, 3, 9, 10}, {1, 1, 1, 1, 1, 1, 1, 1}, 18),
             {5, 9}));
  return cases;
}

struct AttentionResult {
  Vector out, lse;
};

AttentionResult runAttention(const AttentionCase &c) {
  AttentionResult result{Vector(c.qSize()),
                         Vector(c.queryCount() * c.shape.nh)};
  blockAttention(c.q.data(), c.contextKeys.data(), c.contextValues.data(),
                 c.draftKeys.data(), c.draftValues.data(), c.anchors.data(),
                 c.keep.data(), c.positions.data(), result.out.data(),
                 result.lse.data(), c.shape);
  return result;
}

struct AttentionGradients {
  Vector dq, dContextKeys, dContextValues, dDraftKeys, dDraftValues;
};

AttentionGradients runAttentionGrad(const AttentionCase &c,
                                    const Vector &dOut) {
  const AttentionResult forward = runAttention(c);
  AttentionGradients grads{Vector(c.qSize()), Vector(c.contextSize()),
                           Vector(c.contextSize()), Vector(c.draftSize()),
                           Vector(c.draftSize())};
  blockAttentionGrad(
      dOut.data(), c.q.data(), c.contextKeys.data(), c.contextValues.data(),
      c.draftKeys.data(), c.draftValues.data(), c.anchors.data(), c.keep.data(),
      c.positions.data(), forward.out.data(), forward.lse.data(),
      grads.dq.data(), grads.dContextKeys.data(), grads.dContextValues.data(),
      grads.dDraftKeys.data(), grads.dDraftValues.data(), c.shape);
  return grads;
}

/// Written from the words of docs/semantics.md section 3, item 4 (and section 9
/// for packed rows: doc_start(j) = j - position_ids[j]), independently
/// of the reference: a [Q, S + Q] visibility mask per row, then a plain
/// softmax over the visible columns of the scaled scores.
AttentionResult denseMaskAttention(const AttentionCase &c) {
  const AttentionShape &s = c.shape;
  const int64_t Q = s.Q();
  AttentionResult result{Vector(c.qSize(), 0.0),
                         Vector(c.queryCount() * s.nh, 0.0)};
  for (int64_t b = 0; b < s.B; ++b) {
    // mask[i][col]: query i of this row may see column col of
    // [context (S) | draft (Q)].
    std::vector<std::vector<bool>> mask(Q, std::vector<bool>(s.S + Q, false));
    for (int64_t i = 0; i < Q; ++i) {
      const int64_t n = i / s.bs, k = i % s.bs;
      const int64_t anchor = c.anchors[b * s.N + n];
      if (!c.keep[b * s.N + n])
        continue;
      const int64_t docStart = anchor - c.positions[b * s.S + anchor];
      for (int64_t j = 0; j < s.S; ++j) {
        bool visible = j < anchor && j >= docStart;
        if (s.window > 0 && j < anchor + k - (s.window - 1))
          visible = false;
        mask[i][j] = visible;
      }
      for (int64_t kPrime = 0; kPrime < s.bs; ++kPrime)
        mask[i][s.S + n * s.bs + kPrime] = !s.causal || kPrime <= k;
    }
    for (int64_t i = 0; i < Q; ++i) {
      for (int64_t h = 0; h < s.nh; ++h) {
        const int64_t kvHead = h / (s.nh / s.nkv);
        const double *query = &c.q[((b * Q + i) * s.nh + h) * s.d];
        Vector weights(s.S + Q, 0.0);
        double total = 0;
        for (int64_t col = 0; col < s.S + Q; ++col) {
          if (!mask[i][col])
            continue;
          const double *key =
              col < s.S
                  ? &c.contextKeys[((b * s.S + col) * s.nkv + kvHead) * s.d]
                  : &c.draftKeys[((b * Q + col - s.S) * s.nkv + kvHead) * s.d];
          double score = 0;
          for (int64_t e = 0; e < s.d; ++e)
            score += query[e] * key[e];
          weights[col] = std::exp(score / std::sqrt(double(s.d)));
          total += weights[col];
        }
        double *out = &result.out[((b * Q + i) * s.nh + h) * s.d];
        result.lse[(b * Q + i) * s.nh + h] =
            total > 0 ? std::log(total)
                      : -std::numeric_limits<double>::infinity();
        if (total == 0)
          continue;
        for (int64_t col = 0; col < s.S + Q; ++col) {
          if (!mask[i][col])
            continue;
          const double *value =
              col < s.S
                  ? &c.contextValues[((b * s.S + col) * s.nkv + kvHead) * s.d]
                  : &c.draftValues[((b * Q + col - s.S) * s.nkv + kvHead) *
                                   s.d];
          for (int64_t e = 0; e < s.d; ++e)
            out[e] += weights[col] / total * value[e];
        }
      }
    }
  }
  return result;
}

/// Central differences of sum(r * out) with respect to every element of
/// `input`, a tensor of `c` (a copy, so the caller's case is not touched).
Vector attentionFiniteDifferences(AttentionCase c, Vector AttentionCase::*input,
                                  const Vector &r) {
  return finiteDifferences(c.*input,
                           [&] { return dotProduct(r, runAttention(c).out); });
}

bool allZero(const Vector &x) {
  for (double value : x)
    if (value != 0)
      return false;
  return true;
}

TEST(ReferenceAttention, MatchesDenseMaskImplementation) {
  double worst = 0;
  for (const AttentionCase &c : attentionCases()) {
    SCOPED_TRACE(c.name);
    const AttentionResult actual = runAttention(c);
    const AttentionResult expected = denseMaskAttention(c);
    const double error = relativeError(actual.out, expected.out);
    EXPECT_LT(error, 1e-12);
    worst = std::max(worst, error);
    for (size_t i = 0; i < expected.lse.size(); ++i) {
      if (std::isinf(expected.lse[i]))
        EXPECT_EQ(actual.lse[i], expected.lse[i]) << "lse " << i;
      else
        EXPECT_NEAR(actual.lse[i], expected.lse[i],
                    1e-12 * std::abs(expected.lse[i]) + 1e-14)
            << "lse " << i;
    }
  }
  std::printf("dense-mask attention: worst relative error %.3g\n", worst);
}

TEST(ReferenceAttention, GradientsMatchFiniteDifferences) {
  double worst = 0;
  for (const AttentionCase &c : attentionCases()) {
    SCOPED_TRACE(c.name);
    std::mt19937_64 rng(99);
    const Vector r = randomVector(rng, c.qSize());
    const AttentionGradients grads = runAttentionGrad(c, r);
    const std::pair<Vector AttentionCase::*, const Vector *> inputs[] = {
        {&AttentionCase::q, &grads.dq},
        {&AttentionCase::contextKeys, &grads.dContextKeys},
        {&AttentionCase::contextValues, &grads.dContextValues},
        {&AttentionCase::draftKeys, &grads.dDraftKeys},
        {&AttentionCase::draftValues, &grads.dDraftValues}};
    const char *names[] = {"dq", "dContextKeys", "dContextValues", "dDraftKeys",
                           "dDraftValues"};
    for (int i = 0; i < 5; ++i) {
      SCOPED_TRACE(names[i]);
      const Vector fd = attentionFiniteDifferences(c, inputs[i].first, r);
      ASSERT_GT(norm(*inputs[i].second), 0);
      const double error = relativeError(fd, *inputs[i].second);
      EXPECT_LT(error, 1e-6);
      worst = std::max(worst, error);
    }
  }
  std::printf("attention gradients: worst relative error %.3g\n", worst);
}

/// Indices of the outputs of block (b, n): every k and head.
std::vector<int64_t> blockOutputIndices(const AttentionShape &s, int64_t b,
                                        int64_t n) {
  std::vector<int64_t> indices;
  for (int64_t k = 0; k < s.bs; ++k)
    for (int64_t e = 0; e < s.nh * s.d; ++e)
      indices.push_back(((b * s.Q() + n * s.bs + k) * s.nh) * s.d + e);
  return indices;
}

/// The outputs of block (b, n) after adding `delta` to context key and value
/// row j (every kv head) of row b.
Vector blockOutputsWithContextChanged(AttentionCase c, int64_t b, int64_t n,
                                      int64_t j, double delta) {
  const AttentionShape &s = c.shape;
  for (int64_t e = 0; e < s.nkv * s.d; ++e) {
    c.contextKeys[(b * s.S + j) * s.nkv * s.d + e] += delta;
    c.contextValues[(b * s.S + j) * s.nkv * s.d + e] += 2 * delta;
  }
  const AttentionResult result = runAttention(c);
  Vector block;
  for (int64_t index : blockOutputIndices(s, b, n))
    block.push_back(result.out[index]);
  return block;
}

// docs/semantics.md section 8: a block must not see the target feature at its
// own anchor (nor after it), and must see the one just before it.
TEST(ReferenceAttention, TrapAnchorContextIsInvisible) {
  int checkedBefore = 0;
  for (const AttentionCase &c : attentionCases()) {
    SCOPED_TRACE(c.name);
    const AttentionShape &s = c.shape;
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t n = 0; n < s.N; ++n) {
        if (!c.keep[b * s.N + n])
          continue;
        const int64_t anchor = c.anchors[b * s.N + n];
        const Vector baseline = blockOutputsWithContextChanged(c, b, n, 0, 0.0);
        for (int64_t j = anchor; j < s.S; ++j)
          EXPECT_EQ(blockOutputsWithContextChanged(c, b, n, j, 0.5), baseline)
              << "block " << n << " of row " << b << " sees context " << j;
        // At a conversation's first token there is nothing before it to see.
        if (anchor == 0 || c.positions[size_t(b * s.S + anchor)] == 0)
          continue;
        const Vector changed =
            blockOutputsWithContextChanged(c, b, n, anchor - 1, 0.5);
        EXPECT_GT(relativeError(changed, baseline), 1e-3)
            << "block " << n << " of row " << b << " misses context "
            << anchor - 1;
        ++checkedBefore;
      }
    }
  }
  EXPECT_GT(checkedBefore, 10);
}

// docs/semantics.md section 9: a block of a packed row sees the first token of
// its anchor's conversation and nothing of the conversation before.
TEST(ReferenceAttention, ConversationStartBoundsTheContext) {
  // Conversations start at 0, 6 and 11; blocks anchored at 3, 9 and 14.
  const AttentionCase c =
      packed(makeCase("bounds", attentionShape(1, 18, 3, 4, 2, 1, 4, 0, false),
                      {3, 9, 14}, {1, 1, 1}, 22),
             {6, 11});
  const int64_t starts[] = {0, 6, 11};
  for (int64_t n = 0; n < 3; ++n) {
    const Vector baseline = blockOutputsWithContextChanged(c, 0, n, 0, 0.0);
    EXPECT_GT(
        relativeError(blockOutputsWithContextChanged(c, 0, n, starts[n], 0.5),
                      baseline),
        1e-3)
        << "block " << n << " misses its conversation's first token";
    for (int64_t j = 0; j < starts[n]; ++j)
      EXPECT_EQ(blockOutputsWithContextChanged(c, 0, n, j, 0.5), baseline)
          << "block " << n << " sees " << j << " of an earlier conversation";
  }
}

// The window edge: query (n, k) sees context a + k - (W - 1) but not
// a + k - W, checked one query at a time.
TEST(ReferenceAttention, SlidingWindowEdge) {
  AttentionCase c =
      makeCase("window4", attentionShape(1, 24, 2, 4, 2, 1, 4, 4, true),
               {9, 20}, {1, 1}, 21);
  const AttentionShape &s = c.shape;
  const AttentionResult baseline = runAttention(c);
  for (int64_t n = 0; n < s.N; ++n) {
    const int64_t anchor = c.anchors[n];
    for (int64_t k = 0; k < s.window - 1; ++k) {
      const int64_t firstVisible = anchor + k - (s.window - 1);
      for (int64_t j : {firstVisible - 1, firstVisible}) {
        AttentionCase changed = c;
        for (int64_t e = 0; e < s.d; ++e)
          changed.contextValues[j * s.d + e] += 1.0;
        const AttentionResult result = runAttention(changed);
        const int64_t offset = (n * s.bs + k) * s.nh * s.d;
        const Vector before(baseline.out.begin() + offset,
                            baseline.out.begin() + offset + s.nh * s.d);
        const Vector after(result.out.begin() + offset,
                           result.out.begin() + offset + s.nh * s.d);
        if (j == firstVisible)
          EXPECT_NE(before, after) << "query " << k << " misses " << j;
        else
          EXPECT_EQ(before, after) << "query " << k << " sees " << j;
      }
    }
  }
}

// Draft keys: never across blocks; within a block all of them (full) or the
// ones up to the query (causal).
TEST(ReferenceAttention, DraftKeysStayInTheirBlock) {
  for (const AttentionCase &c : attentionCases()) {
    SCOPED_TRACE(c.name);
    const AttentionShape &s = c.shape;
    const AttentionResult baseline = runAttention(c);
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t slot = 0; slot < s.Q(); ++slot) {
        AttentionCase changed = c;
        for (int64_t e = 0; e < s.nkv * s.d; ++e)
          changed.draftValues[(b * s.Q() + slot) * s.nkv * s.d + e] += 1.0;
        const AttentionResult result = runAttention(changed);
        for (int64_t query = 0; query < s.Q(); ++query) {
          const int64_t offset = (b * s.Q() + query) * s.nh * s.d;
          const bool same = std::equal(result.out.begin() + offset,
                                       result.out.begin() + offset + s.nh * s.d,
                                       baseline.out.begin() + offset);
          const bool sameBlock = query / s.bs == slot / s.bs;
          const bool visible = sameBlock && c.keep[b * s.N + query / s.bs] &&
                               (!s.causal || slot % s.bs <= query % s.bs);
          EXPECT_EQ(same, !visible)
              << "row " << b << " query " << query << " draft key " << slot;
        }
      }
    }
  }
}

TEST(ReferenceAttention, UnusedBlocksAreZero) {
  for (const AttentionCase &c : attentionCases()) {
    SCOPED_TRACE(c.name);
    const AttentionShape &s = c.shape;
    std::mt19937_64 rng(5);
    const Vector dOut = randomVector(rng, c.qSize());
    const AttentionResult result = runAttention(c);
    const AttentionGradients grads = runAttentionGrad(c, dOut);
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t n = 0; n < s.N; ++n) {
        if (c.keep[b * s.N + n])
          continue;
        for (int64_t index : blockOutputIndices(s, b, n)) {
          EXPECT_EQ(result.out[index], 0.0);
          EXPECT_EQ(grads.dq[index], 0.0);
        }
        for (int64_t k = 0; k < s.bs; ++k) {
          const int64_t query = b * s.Q() + n * s.bs + k;
          for (int64_t h = 0; h < s.nh; ++h)
            EXPECT_EQ(result.lse[query * s.nh + h],
                      -std::numeric_limits<double>::infinity());
          for (int64_t e = 0; e < s.nkv * s.d; ++e) {
            EXPECT_EQ(grads.dDraftKeys[query * s.nkv * s.d + e], 0.0);
            EXPECT_EQ(grads.dDraftValues[query * s.nkv * s.d + e], 0.0);
          }
        }
      }
    }
  }
  // With every slot unused nothing is seen, so every gradient is zero.
  AttentionCase c = attentionCases().front();
  std::fill(c.keep.begin(), c.keep.end(), 0);
  std::mt19937_64 rng(6);
  const AttentionGradients grads =
      runAttentionGrad(c, randomVector(rng, c.qSize()));
  EXPECT_TRUE(allZero(runAttention(c).out));
  EXPECT_TRUE(allZero(grads.dq));
  EXPECT_TRUE(allZero(grads.dContextKeys));
  EXPECT_TRUE(allZero(grads.dContextValues));
  EXPECT_TRUE(allZero(grads.dDraftKeys));
  EXPECT_TRUE(allZero(grads.dDraftValues));
}

// Gradient functions overwrite their outputs: stale values in the output
// buffers must not leak through.
TEST(ReferenceAttention, GradientOverwritesOutputs) {
  const AttentionCase c = attentionCases().front();
  std::mt19937_64 rng(8);
  const Vector dOut = randomVector(rng, c.qSize());
  const AttentionGradients clean = runAttentionGrad(c, dOut);
  const AttentionResult forward = runAttention(c);
  AttentionGradients dirty{Vector(c.qSize(), 7.0), Vector(c.contextSize(), 7.0),
                           Vector(c.contextSize(), 7.0),
                           Vector(c.draftSize(), 7.0),
                           Vector(c.draftSize(), 7.0)};
  blockAttentionGrad(
      dOut.data(), c.q.data(), c.contextKeys.data(), c.contextValues.data(),
      c.draftKeys.data(), c.draftValues.data(), c.anchors.data(), c.keep.data(),
      c.positions.data(), forward.out.data(), forward.lse.data(),
      dirty.dq.data(), dirty.dContextKeys.data(), dirty.dContextValues.data(),
      dirty.dDraftKeys.data(), dirty.dDraftValues.data(), c.shape);
  EXPECT_EQ(dirty.dq, clean.dq);
  EXPECT_EQ(dirty.dContextKeys, clean.dContextKeys);
  EXPECT_EQ(dirty.dContextValues, clean.dContextValues);
  EXPECT_EQ(dirty.dDraftKeys, clean.dDraftKeys);
  EXPECT_EQ(dirty.dDraftValues, clean.dDraftValues);
}

// The float instantiation computes the same function.
TEST(ReferenceAttention, FloatMatchesDouble) {
  const AttentionCase c = attentionCases()[1];
  const AttentionResult expected = runAttention(c);
  auto toFloat = [](const Vector &x) {
    return std::vector<float>(x.begin(), x.end());
  };
  const std::vector<float> q = toFloat(c.q), ck = toFloat(c.contextKeys),
                           cv = toFloat(c.contextValues),
                           dk = toFloat(c.draftKeys),
                           dv = toFloat(c.draftValues);
  std::vector<float> out(c.qSize()), lse(c.queryCount() * c.shape.nh);
  blockAttention(q.data(), ck.data(), cv.data(), dk.data(), dv.data(),
                 c.anchors.data(), c.keep.data(), c.positions.data(),
                 out.data(), lse.data(), c.shape);
  EXPECT_LT(relativeError(Vector(out.begin(), out.end()), expected.out), 1e-6);
}

} // namespace
