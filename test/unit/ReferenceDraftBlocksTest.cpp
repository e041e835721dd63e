//===- ReferenceDraftBlocksTest.cpp - Tests of draft-block bookkeeping ----===//
//
// Positions, draft tokens, labels and weights on small hand-checked cases,
// including the same-position label trap of docs/semantics.md section 8.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

using namespace dflash::ref;

namespace {

/// arange(S) in each of B rows: the positions of unpacked rows.
std::vector<int32_t> unpacked(int64_t B, int64_t S) {
  std::vector<int32_t> p(size_t(B * S));
  for (int64_t i = 0; i < B * S; ++i)
    p[size_t(i)] = int32_t(i % S);
  return p;
}

TEST(ReferenceDraftBlocks, DraftPositions) {
  const std::vector<int32_t> anchors = {3, 7, 0, 5};
  std::vector<int32_t> out(12, -1);
  draftPositions(anchors.data(), unpacked(2, 10).data(), out.data(), 2, 10, 2,
                 3);
  EXPECT_EQ(out, (std::vector<int32_t>{3, 4, 5, 7, 8, 9, 0, 1, 2, 5, 6, 7}));
}

// A packed row (docs/semantics.md section 9): conversations of 4 and 6 tokens;
// a draft slot sits at its anchor's position in the anchor's conversation.
TEST(ReferenceDraftBlocks, DraftPositionsInAPackedRow) {
  const std::vector<int32_t> positions = {0, 1, 2, 3, 0, 1, 2, 3, 4, 5};
  const std::vector<int32_t> anchors = {1, 6};
  std::vector<int32_t> out(6, -1);
  draftPositions(anchors.data(), positions.data(), out.data(), 1, 10, 2, 3);
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3, 2, 3, 4}));
}

// Weights stop where the anchor's conversation ends, even where the next
// one is supervised; labels are still the row's tokens.
TEST(ReferenceDraftBlocks, DraftTargetsStopAtTheConversationEnd) {
  const std::vector<int32_t> ids = {10, 11, 12, 13, 14, 15, 16, 17};
  const std::vector<uint8_t> lossMask(8, 1);
  const std::vector<int32_t> positions = {0, 1, 2, 0, 1, 2, 3, 4};
  const std::vector<int32_t> anchors = {1, 3};
  const std::vector<uint8_t> keep = {1, 1};
  std::vector<int32_t> labels(8, -1);
  std::vector<double> weights(8, -1.0);
  draftTargets(ids.data(), lossMask.data(), anchors.data(), keep.data(),
               positions.data(), labels.data(), weights.data(), 1, 8, 2, 4,
               0.0);
  EXPECT_EQ(labels, (std::vector<int32_t>{11, 12, 13, 14, 13, 14, 15, 16}));
  // Block 0 (anchor 1 of the first conversation): 12 only; 13 and 14 are
  // the second's. Block 1 (anchor 3, the second's start): 14, 15, 16.
  EXPECT_EQ(weights, (std::vector<double>{0, 1, 0, 0, 0, 1, 1, 1}));
}

TEST(ReferenceDraftBlocks, DraftTokens) {
  // Two rows of S = 6; the anchor token opens each used block, everything
  // else is the mask token, an unused slot is all mask.
  const std::vector<int32_t> ids = {10, 11, 12, 13, 14, 15,
                                    20, 21, 22, 23, 24, 25};
  const std::vector<int32_t> anchors = {0, 5, 2, 0};
  const std::vector<uint8_t> keep = {1, 1, 1, 0};
  std::vector<int32_t> out(12, -1);
  draftTokens(ids.data(), anchors.data(), keep.data(), out.data(), 2, 6, 2, 3,
              99);
  EXPECT_EQ(out, (std::vector<int32_t>{10, 99, 99, 15, 99, 99, 22, 99, 99, 99,
                                       99, 99}));
}

TEST(ReferenceDraftBlocks, DraftTargetsHandChecked) {
  // One row, S = 8, bs = 4, gamma = 4: anchors 1 (used), 5 (used, runs past
  // the end), 0 (unused).
  const std::vector<int32_t> ids = {100, 101, 102, 103, 104, 105, 106, 107};
  const std::vector<uint8_t> lossMask = {0, 1, 1, 0, 1, 1, 1, 1};
  const std::vector<int32_t> anchors = {1, 5, 0};
  const std::vector<uint8_t> keep = {1, 1, 0};
  std::vector<int32_t> labels(12, -1);
  std::vector<double> weights(12, -1.0);
  draftTargets(ids.data(), lossMask.data(), anchors.data(), keep.data(),
               unpacked(1, 8).data(), labels.data(), weights.data(), 1, 8, 3, 4,
               4.0);
  // Same position, no shift; 0 past the end.
  EXPECT_EQ(labels, (std::vector<int32_t>{101, 102, 103, 104, 105, 106, 107, 0,
                                          100, 101, 102, 103}));
  const double d1 = 1.0, d2 = std::exp(-0.25), d3 = std::exp(-0.5);
  // Block 0: k = 0 never weighs; position 3 is unsupervised.
  // Block 1: positions 5, 6, 7 then past the end.
  // Block 2: unused.
  const std::vector<double> expected = {0, d1, 0, d3, 0, d1, d2, 0, 0, 0, 0, 0};
  for (int i = 0; i < 12; ++i)
    EXPECT_DOUBLE_EQ(weights[i], expected[i]) << "slot " << i;
}

TEST(ReferenceDraftBlocks, DraftTargetsDecay) {
  // bs = 16, gamma = 7 (the b16 default) and gamma = 0 (no decay), every
  // token supervised.
  const int64_t S = 20, bs = 16;
  std::vector<int32_t> ids(S);
  for (int64_t i = 0; i < S; ++i)
    ids[i] = static_cast<int32_t>(1000 + i);
  const std::vector<uint8_t> lossMask(S, 1), keep = {1};
  const std::vector<int32_t> anchors = {2};
  for (double gamma : {7.0, 0.0, -1.0}) {
    std::vector<int32_t> labels(bs);
    std::vector<float> weights(bs);
    draftTargets(ids.data(), lossMask.data(), anchors.data(), keep.data(),
                 unpacked(1, S).data(), labels.data(), weights.data(), 1, S, 1,
                 bs, gamma);
    EXPECT_EQ(weights[0], 0.0f);
    for (int64_t k = 1; k < bs; ++k) {
      const double expected = gamma > 0 ? std::exp(-(k - 1) / gamma) : 1.0;
      EXPECT_FLOAT_EQ(weights[k], static_cast<float>(expected)) << k;
    }
  }
}

// docs/semantics.md section 8: labels are the tokens at the same positions as
// the outputs, never the next ones.
TEST(ReferenceDraftBlocks, TrapLabelsAreSamePosition) {
  const int64_t B = 2, S = 32, N = 5, bs = 8;
  std::vector<int32_t> ids(B * S);
  for (int64_t i = 0; i < B * S; ++i)
    ids[i] = static_cast<int32_t>((i * 7919) % 1000 + 1);
  const std::vector<uint8_t> lossMask(B * S, 1);
  const std::vector<int32_t> anchors = {0, 3, 11, 20, 30, 1, 2, 17, 24, 29};
  const std::vector<uint8_t> keep(B * N, 1);
  std::vector<int32_t> labels(B * N * bs), tokens(B * N * bs);
  std::vector<double> weights(B * N * bs);
  draftTargets(ids.data(), lossMask.data(), anchors.data(), keep.data(),
               unpacked(B, S).data(), labels.data(), weights.data(), B, S, N,
               bs, 4.0);
  draftTokens(ids.data(), anchors.data(), keep.data(), tokens.data(), B, S, N,
              bs, 0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t a = anchors[b * N + n];
      const int64_t block = (b * N + n) * bs;
      // The output at the anchor slot is labelled with the very token given
      // as input there.
      EXPECT_EQ(labels[block], tokens[block]);
      EXPECT_EQ(weights[block], 0.0);
      for (int64_t k = 0; k < bs; ++k) {
        if (a + k < S) {
          EXPECT_EQ(labels[block + k], ids[b * S + a + k]);
          EXPECT_EQ(weights[block + k] > 0, k > 0);
        } else {
          EXPECT_EQ(labels[block + k], 0);
          EXPECT_EQ(weights[block + k], 0.0);
        }
      }
    }
  }
}

} // namespace
