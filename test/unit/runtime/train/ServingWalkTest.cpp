//===- ServingWalkTest.cpp - Serving-order acceptance ---------------------===//
//
// The serving walk of docs/runtime.md ("Serving tau") on hand-built rows:
// the expected sums are worked out by hand in the comments, from a drafter
// that predicts position p right from any anchor iff right[p].
//
//===----------------------------------------------------------------------===//

#include "runtime/train/ServingWalk.h"
#include "kernels/BlockRun.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

using namespace dflash::rt;

namespace {

/// One row, as the evaluation program sees it.
struct Row {
  std::vector<uint8_t> mask;
  std::vector<int32_t> positions; ///< position_ids
  std::vector<uint8_t> right;     ///< whether the drafter predicts p right

  int64_t size() const { return int64_t(mask.size()); }
};

Row unpacked(std::vector<uint8_t> mask, std::vector<uint8_t> right) {
  Row r{std::move(mask), {}, std::move(right)};
  r.positions.resize(r.mask.size());
  std::iota(r.positions.begin(), r.positions.end(), 0);
  return r;
}

/// docs/semantics.md sections 4 and 9, gamma aside: slot k > 0 of the block
/// anchored at a weighs 1 where a + k is in the row, supervised and in a's
/// conversation.
float weightOf(const Row &row, int64_t a, int64_t k) {
  const int64_t p = a + k;
  return k > 0 && p < row.size() && row.mask[size_t(p)] &&
                 row.positions[size_t(p)] == row.positions[size_t(a)] + k
             ? 1.0f
             : 0.0f;
}

/// Runs every pass of `walk` over `rows` as the evaluation program would:
/// hits and weights of each kept slot.
ServingSums runPasses(ServingWalk &walk, const std::vector<Row> &rows,
                      int64_t N, int64_t bs, std::vector<bool> walked = {}) {
  const int64_t B = int64_t(rows.size()), S = rows.front().size();
  std::vector<uint8_t> mask;
  std::vector<int32_t> positions;
  for (const Row &r : rows) {
    mask.insert(mask.end(), r.mask.begin(), r.mask.end());
    positions.insert(positions.end(), r.positions.begin(), r.positions.end());
  }
  if (walked.empty())
    walked.assign(size_t(B), true);
  walk.start(mask.data(), positions.data(), walked);
  for (int64_t p = 0; p < walk.passes(); ++p) {
    std::vector<int32_t> anchors(size_t(B * N), -1);
    std::vector<uint8_t> keep(size_t(B * N), 9);
    walk.anchorsOfPass(p, anchors.data(), keep.data());
    std::vector<uint8_t> hits(size_t(B * N * bs), 0);
    std::vector<float> weights(size_t(B * N * bs), 0.0f);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n) {
        if (!keep[size_t(b * N + n)])
          continue;
        const int64_t a = anchors[size_t(b * N + n)];
        for (int64_t k = 0; k < bs; ++k) {
          const size_t slot = size_t((b * N + n) * bs + k);
          weights[slot] = weightOf(rows[size_t(b)], a, k);
          hits[slot] =
              a + k < S ? rows[size_t(b)].right[size_t(a + k)] : uint8_t(0);
        }
      }
    walk.record(p, hits.data(), weights.data());
  }
  return walk.sums();
}

TEST(ServingWalk, BlockRunStopsAtAMissOrAZeroWeight) {
  const uint8_t hits[] = {0, 1, 1, 0, 1};
  const float weights[] = {0, 1, 1, 1, 1};
  EXPECT_EQ(dflash::kernels::blockRun(hits, weights, 5),
            2); // slot 0 is not looked at
  const float cut[] = {0, 1, 0, 1, 1};
  EXPECT_EQ(dflash::kernels::blockRun(hits, cut, 5), 1);
  const uint8_t all[] = {1, 1, 1, 1, 1};
  const float full[] = {0, 1, 1, 1, 1};
  EXPECT_EQ(dflash::kernels::blockRun(all, full, 5), 4); // bs - 1 at most
  const uint8_t none[] = {1, 0, 1, 1, 1};
  EXPECT_EQ(dflash::kernels::blockRun(none, full, 5), 0);
}

TEST(ServingWalk, WalksFromEachAcceptedEnd) {
  // Candidates 0..9 with runs r[i]: 0 (run 2) -> 3 (run 0) -> 4 (run 3)
  // -> 8 (run 1) -> 10, past the last: 3 + 1 + 4 + 2 over 4 blocks.
  std::vector<int32_t> c(10);
  std::iota(c.begin(), c.end(), 0);
  std::vector<int32_t> runs = {2, 9, 9, 0, 3, 9, 9, 9, 1, 9};
  ServingSums s = walkServingOrder(c, runs);
  EXPECT_EQ(s.blocks, 4);
  EXPECT_EQ(s.runs, 10);
  EXPECT_DOUBLE_EQ(s.tau(), 2.5);
  EXPECT_TRUE(std::isnan(walkServingOrder({}, {}).tau()));
}

TEST(ServingWalk, OneSpanOverSeveralPasses) {
  // Supervised 2..9, candidates 2..8 (7 of them: 4 passes of N = 2).
  // a = 2: 3, 4 right, 5 wrong: run 2. a = 5: 6, 7, 8 right: run 3 (bs -
  // 1). a = 9 is no candidate (10 unsupervised) and none follows.
  // (3 + 4) / 2 blocks.
  Row row = unpacked({0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
                     {0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 0, 0});
  ServingWalk walk(1, row.size(), 2, 4);
  ServingSums s = runPasses(walk, {row}, 2, 4);
  EXPECT_EQ(walk.passes(), 4);
  EXPECT_EQ(s.blocks, 2);
  EXPECT_EQ(s.runs, 7);
}

TEST(ServingWalk, ContinuesAtTheNextSpan) {
  // Two assistant spans, 2..6 and 9..13; 4 is predicted wrong.
  // a = 2: 3 right, 4 wrong: run 1. a = 4: 5, 6 right, 7 unsupervised: run
  // 2, reaching the span's end. a = 7 is no candidate: the next one is 9.
  // a = 9: 10, 11, 12 right: run 3. a = 13 is no candidate, none follows.
  // (2 + 3 + 4) / 3 blocks.
  Row row = unpacked({0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0},
                     {1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  ServingWalk walk(1, row.size(), 3, 4);
  ServingSums s = runPasses(walk, {row}, 3, 4);
  EXPECT_EQ(s.blocks, 3);
  EXPECT_EQ(s.runs, 9);
  EXPECT_DOUBLE_EQ(s.tau(), 3.0);
}

TEST(ServingWalk, PackedRowsRestartAtEachConversation) {
  // Two conversations of 6 tokens, supervised 3..5 and 6..8 (positions
  // 0..2 of the second). Candidates 3, 4, 6, 7 (5 -> 6 crosses into the
  // other conversation). Every prediction right. a = 3: 4, 5 right, 6 is
  // the other conversation's (weight 0): run 2. a = 6: 7, 8 right, 9
  // unsupervised: run 2. a = 9: none. (3 + 3) / 2 blocks.
  Row row;
  row.mask = {0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0};
  row.positions = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5};
  row.right.assign(12, 1);
  ServingWalk walk(1, row.size(), 4, 4);
  ServingSums s = runPasses(walk, {row}, 4, 4);
  EXPECT_EQ(walk.passes(), 1);
  std::vector<int32_t> anchors(4);
  std::vector<uint8_t> keep(4);
  walk.anchorsOfPass(0, anchors.data(), keep.data());
  EXPECT_EQ(anchors, (std::vector<int32_t>{3, 4, 6, 7}));
  EXPECT_EQ(keep, (std::vector<uint8_t>{1, 1, 1, 1}));
  EXPECT_EQ(s.blocks, 2);
  EXPECT_EQ(s.runs, 6);
}

TEST(ServingWalk, ABlockPastTheRowEnd) {
  // Supervised 5..7 of 8 tokens: candidates 5 and 6. a = 5: 6, 7 right,
  // slot k = 3 lies past the row (weight 0): run 2; a = 8: none. 3 / 1.
  Row row = unpacked({0, 0, 0, 0, 0, 1, 1, 1}, {1, 1, 1, 1, 1, 1, 1, 1});
  ServingWalk walk(1, row.size(), 1, 4);
  ServingSums s = runPasses(walk, {row}, 1, 4);
  EXPECT_EQ(walk.passes(), 2);
  EXPECT_EQ(s.blocks, 1);
  EXPECT_EQ(s.runs, 3);
}

TEST(ServingWalk, RowsOfABatchAdvanceTogether) {
  // Row 0: supervised 2..7, every prediction right: a = 2 runs 3, a = 6
  // runs 1 (8 is unsupervised): 4 + 2. Row 1: no candidate. Row 2 is left
  // out of the walk. Row 3: supervised 1..6, every prediction wrong: each
  // candidate 1..5 is walked with run 0, 5 blocks of 1.
  Row r0 =
      unpacked({0, 0, 1, 1, 1, 1, 1, 1, 0, 0}, std::vector<uint8_t>(10, 1));
  Row r1 =
      unpacked({0, 0, 0, 0, 1, 0, 0, 0, 0, 0}, std::vector<uint8_t>(10, 1));
  Row r2 = r0;
  Row r3 =
      unpacked({0, 1, 1, 1, 1, 1, 1, 0, 0, 0}, std::vector<uint8_t>(10, 0));
  ServingWalk walk(4, 10, 2, 4);
  ServingSums s =
      runPasses(walk, {r0, r1, r2, r3}, 2, 4, {true, true, false, true});
  EXPECT_EQ(walk.passes(), 3); // row 0's 5 and row 3's 5 candidates
  EXPECT_EQ(s.blocks, 2 + 5);
  EXPECT_EQ(s.runs, 4 + 2 + 5);
  // Past the last pass nothing is kept.
  std::vector<int32_t> anchors(8);
  std::vector<uint8_t> keep(8, 1);
  walk.anchorsOfPass(walk.passes(), anchors.data(), keep.data());
  EXPECT_EQ(keep, std::vector<uint8_t>(8, 0));
  EXPECT_EQ(anchors, std::vector<int32_t>(8, 0));
}

} // namespace
