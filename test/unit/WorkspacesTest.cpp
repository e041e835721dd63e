//===- WorkspacesTest.cpp - The kernels' plain sizes and row maps ---------===//
//
// kernels/Workspaces.h is shared by the planner and the kernels; the parts a
// GPU test cannot reach from the CPU are pinned here: which rows the fused
// lm_head computes when slot 0 of every block is skipped, and how its
// workspace grows; the DFlash2 convolution gradient's partials and the
// shapes its kernels take (kernels/GroupedConvLimits.h).
//
//===----------------------------------------------------------------------===//

#include "kernels/Workspaces.h"
#include "kernels/GroupedConvLimits.h"

#include <gtest/gtest.h>

#include <vector>

using namespace dflash::kernels;

TEST(LmHeadRows, SlotZeroOfEveryBlockIsLeftOutOnce) {
  for (int64_t bs : {2, 8, 10, 16}) {
    const int64_t rows = 7 * bs;
    const int64_t computed = lmHeadComputedRows(rows, bs);
    EXPECT_EQ(computed, 7 * (bs - 1)) << "bs " << bs;
    std::vector<int> seen(size_t(rows), 0);
    int64_t previous = -1;
    for (int64_t c = 0; c < computed; ++c) {
      int64_t row = lmHeadSourceRow(c, bs);
      ASSERT_GE(row, 0);
      ASSERT_LT(row, rows);
      EXPECT_NE(row % bs, 0) << "bs " << bs << " computed row " << c;
      EXPECT_GT(row, previous) << "in batch order";
      previous = row;
      ++seen[size_t(row)];
    }
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(seen[size_t(r)], r % bs == 0 ? 0 : 1)
          << "bs " << bs << " row " << r;
  }
}

TEST(LmHeadRows, WithoutBlocksEveryRow) {
  EXPECT_EQ(lmHeadComputedRows(300, 0), 300);
  EXPECT_EQ(lmHeadComputedRows(300, 1), 300);
  for (int64_t c : {0, 1, 299})
    EXPECT_EQ(lmHeadSourceRow(c, 0), c);
}

TEST(LmHeadWorkspace, GatherBuffersOnlyWhenBlocksAreSkipped) {
  const int64_t rows = 192, V = 1024, H = 256;
  // Every row: sums, 192 row terms, a 192-row logits chunk.
  EXPECT_EQ(lmHeadCrossEntropyWorkspaceBytes(rows, V, H, 0),
            256u + 3072u + 192u * 1024u * 2u);
  // Blocks of 8: 168 rows, their terms rounded up to 256 bytes, a 168-row
  // chunk and its gathered rows and gradient.
  EXPECT_EQ(lmHeadCrossEntropyWorkspaceBytes(rows, V, H, 8),
            256u + 2816u + 168u * 1024u * 2u + 2u * 168u * 256u * 2u);
  // Chunks stop at kLmHeadMaxChunkBytes of logits.
  const int64_t big = 32768, vocab = 151936;
  EXPECT_EQ(lmHeadChunkRows(lmHeadComputedRows(big, 16), vocab), 1728);
}

TEST(GroupedConvWorkspace, OnePartialABlockUpToTwoPerSm) {
  EXPECT_EQ(groupedConvGradPartials(1), 1);
  EXPECT_EQ(groupedConvGradPartials(4), 4);
  EXPECT_EQ(groupedConvGradPartials(264), 264);
  EXPECT_EQ(groupedConvGradPartials(100000), kGroupedConvGradPartials);
  // [P, kc, H] floats: tiny's 4 blocks of kc 2, H 256; the published
  // drafter's H 5120 with more blocks than partials.
  EXPECT_EQ(groupedConvGradWorkspaceBytes(4, 2, 256), 4u * 2u * 256u * 4u);
  EXPECT_EQ(groupedConvGradWorkspaceBytes(2048, 2, 5120),
            264u * 2u * 5120u * 4u);
}

TEST(GroupedConvLimits, GroupsOfAPowerOfTwoOfVectors) {
  for (int64_t gs : {8, 16, 32, 64, 128, 256})
    EXPECT_TRUE(groupedConvSupports(5120, 2, gs)) << gs;
  for (int64_t gs : {1, 4, 12, 24, 40, 512})
    EXPECT_FALSE(groupedConvSupportsGroupSize(gs)) << gs;
  EXPECT_TRUE(groupedConvSupports(264, 4, 8));
  EXPECT_FALSE(groupedConvSupports(260, 2, 4));  // rows not of whole vectors
  EXPECT_FALSE(groupedConvSupports(264, 2, 16)); // 16 does not divide 264
  EXPECT_FALSE(groupedConvSupports(256, 0, 16));
  EXPECT_FALSE(groupedConvSupports(256, kGroupedConvMaxTaps + 1, 16));
  EXPECT_TRUE(groupedConvSupports(256, kGroupedConvMaxTaps, 16));
}
