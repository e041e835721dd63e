//===- ReferenceAcceptanceTest.cpp - Acceptance length --------------------===//
//
// ref::draftAcceptance (docs/semantics.md section 10) on hand-made
// predictions: runs stop at the first miss or at the first slot without
// weight (past the row, the loss mask or the anchor's conversation), slot 0
// never counts, dropped blocks neither, and the per-position counts are those
// of the accuracy.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"

#include <gtest/gtest.h>

#include <vector>

using namespace dflash::ref;

namespace {

TEST(ReferenceAcceptance, RunsStopAtTheFirstMissOrUnweightedSlot) {
  // One row, four blocks of bs = 4 (slots k = 0..3).
  const std::vector<uint8_t> hits = {
      1, 1, 1, 0, // block 0: k = 1, 2 right, k = 3 wrong: run 2
      0, 0, 1, 1, // block 1: k = 1 wrong: run 0 (later hits do not count)
      0, 1, 1, 1, // block 2: all right, but k = 3 weighs nothing: run 2
      1, 1, 1, 1, // block 3: dropped (keep = 0)
  };
  const std::vector<double> weights = {
      0, 1, 0.8, 0.6, //
      0, 1, 0.8, 0.6, //
      0, 1, 0.8, 0,   //
      0, 1, 0.8, 0.6, //
  };
  const std::vector<uint8_t> keep = {1, 1, 1, 0};
  const AcceptanceSums sums =
      draftAcceptance(hits.data(), weights.data(), keep.data(), 1, 4, 4);
  EXPECT_EQ(sums.keptBlocks, 3);
  EXPECT_EQ(sums.runSum, (1 + 2) + (1 + 0) + (1 + 2)); // tau = 7 / 3
  // Positions: k = 0 never counts; k = 3 only where it weighs.
  EXPECT_EQ(sums.positionCounts[0], 0);
  EXPECT_EQ(sums.positionCounts[1], 3);
  EXPECT_EQ(sums.positionHits[1], 2);
  EXPECT_EQ(sums.positionCounts[2], 3);
  EXPECT_EQ(sums.positionHits[2], 3);
  EXPECT_EQ(sums.positionCounts[3], 2);
  EXPECT_EQ(sums.positionHits[3], 1);
}

TEST(ReferenceAcceptance, PerfectAndEmptyBlocks) {
  // bs = 16: a perfect block accepts all 15 drafted tokens (tau 16); a kept
  // block whose anchor is the row's last candidate (only k = 1 weighs)
  // accepts at most one.
  const int64_t bs = 16;
  std::vector<uint8_t> hits(2 * bs, 1);
  std::vector<float> weights(2 * bs, 1.0f);
  weights[0] = weights[bs] = 0;
  for (int64_t k = 2; k < bs; ++k)
    weights[size_t(bs + k)] = 0;
  const std::vector<uint8_t> keep = {1, 1};
  AcceptanceSums sums =
      draftAcceptance(hits.data(), weights.data(), keep.data(), 2, 1, bs);
  EXPECT_EQ(sums.runSum, 16 + 2);
  EXPECT_EQ(sums.keptBlocks, 2);
  // Nothing kept: no blocks, no runs.
  const std::vector<uint8_t> none = {0, 0};
  sums = draftAcceptance(hits.data(), weights.data(), none.data(), 2, 1, bs);
  EXPECT_EQ(sums.keptBlocks, 0);
  EXPECT_EQ(sums.runSum, 0);
}

} // namespace
