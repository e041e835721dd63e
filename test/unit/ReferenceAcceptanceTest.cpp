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

TEST(ReferenceAcceptance, PerAnchorPositionBucket) {
  // Two rows of S = 8, three blocks each of bs = 4; row 1 packs two
  // conversations (positions restart at t = 5). Edges {2, 5}: buckets
  // [0, 2), [2, 5), [5, 8).
  const int64_t bs = 4, N = 3, S = 8;
  const std::vector<int32_t> positionIds = {0, 1, 2, 3, 4, 5, 6, 7, //
                                            0, 1, 2, 3, 4, 0, 1, 2};
  // Row 0: anchors at 1 (bucket 0), 6 (bucket 2), 3 (bucket 1);
  // row 1: anchors at t = 4 (position 4: bucket 1), t = 5 (position 0:
  // bucket 0), t = 7 (position 2: bucket 1, dropped).
  const std::vector<int32_t> anchors = {1, 6, 3, 4, 5, 7};
  const std::vector<uint8_t> keep = {1, 1, 1, 1, 1, 0};
  std::vector<uint8_t> hits(2 * N * bs, 1);
  std::vector<double> weights(2 * N * bs, 1.0);
  for (int64_t n = 0; n < 2 * N; ++n)
    weights[size_t(n * bs)] = 0;
  hits[size_t(1 * bs + 2)] = 0;    // row 0, block 1: run 1
  weights[size_t(3 * bs + 3)] = 0; // row 1, block 0: run 2, k = 3 unweighted
  hits[size_t(4 * bs + 1)] = 0;    // row 1, block 1: run 0
  const int64_t edges[] = {2, 5};
  AnchorPositions where{anchors.data(), positionIds.data(), S, edges, 2};
  const AcceptanceSums sums = draftAcceptance(hits.data(), weights.data(),
                                              keep.data(), 2, N, bs, where);
  // Bucket 0: row 0 block 0 (run 3), row 1 block 1 (run 0).
  EXPECT_EQ(sums.bucketBlocks[0], 2);
  EXPECT_EQ(sums.bucketRuns[0], 4 + 1);
  EXPECT_EQ(sums.bucketCounts[0], 3 + 3);
  EXPECT_EQ(sums.bucketHits[0], 3 + 2);
  // Bucket 1: row 0 block 2 (run 3), row 1 block 0 (run 2).
  EXPECT_EQ(sums.bucketBlocks[1], 2);
  EXPECT_EQ(sums.bucketRuns[1], 4 + 3);
  EXPECT_EQ(sums.bucketCounts[1], 3 + 2);
  EXPECT_EQ(sums.bucketHits[1], 3 + 2);
  // Bucket 2: row 0 block 1 (run 1).
  EXPECT_EQ(sums.bucketBlocks[2], 1);
  EXPECT_EQ(sums.bucketRuns[2], 2);
  EXPECT_EQ(sums.bucketCounts[2], 3);
  EXPECT_EQ(sums.bucketHits[2], 2);
  // They add up to the totals.
  EXPECT_EQ(sums.keptBlocks, 5);
  EXPECT_EQ(sums.runSum, 5 + 7 + 2);
  double counts = 0, hitsAll = 0;
  for (int64_t k = 0; k < bs; ++k) {
    counts += sums.positionCounts[k];
    hitsAll += sums.positionHits[k];
  }
  EXPECT_EQ(counts, 6 + 5 + 3);
  EXPECT_EQ(hitsAll, 5 + 5 + 2);
  // Without anchors: every block in bucket 0.
  const AcceptanceSums plain =
      draftAcceptance(hits.data(), weights.data(), keep.data(), 2, N, bs);
  EXPECT_EQ(plain.bucketBlocks[0], 5);
  EXPECT_EQ(plain.bucketRuns[0], plain.runSum);
  EXPECT_EQ(plain.bucketBlocks[1], 0);
}

} // namespace
