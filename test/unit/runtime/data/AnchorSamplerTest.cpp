//===- AnchorSamplerTest.cpp - Anchor sampling ----------------------------===//
//
// The anchor sampling of docs/semantics.md section 2.
//
//===----------------------------------------------------------------------===//

#include "runtime/data/AnchorSampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

using namespace dflash;
using namespace dflash::rt;

namespace {

struct Sampled {
  std::vector<int32_t> anchors;
  std::vector<uint8_t> keep;
  int64_t nEff = 0;
};

Sampled sampleBatch(const std::vector<uint8_t> &mask, int64_t B, int64_t S,
                    int64_t N, Rng &rng) {
  Sampled out;
  out.anchors.assign(size_t(B * N), -1);
  out.keep.assign(size_t(B * N), 7);
  AnchorSampler sampler(B, S, N);
  out.nEff = sampler.sample(mask.data(), nullptr, rng, out.anchors.data(),
                            out.keep.data());
  return out;
}

/// A mask [B, S] with 1s on [from, to) in each row.
std::vector<uint8_t> spans(int64_t S,
                           const std::vector<std::pair<int, int>> &rows) {
  std::vector<uint8_t> mask(rows.size() * size_t(S), 0);
  for (size_t b = 0; b < rows.size(); ++b)
    for (int t = rows[b].first; t < rows[b].second; ++t)
      mask[b * size_t(S) + size_t(t)] = 1;
  return mask;
}

TEST(RuntimeAnchorSampler, Candidates) {
  std::vector<uint8_t> mask = {0, 1, 1, 0, 1, 1, 1, 0, 1, 1};
  std::vector<int32_t> candidates;
  anchorCandidates(mask.data(), nullptr, 10, candidates);
  // Position 8 qualifies (8 and 9 set); 9 cannot (no position 10).
  EXPECT_EQ(candidates, (std::vector<int32_t>{1, 4, 5, 8}));
  EXPECT_EQ(countAnchorCandidates(mask.data(), nullptr, 10), 4);
  std::vector<uint8_t> isolated = {1, 0, 1, 0, 1};
  EXPECT_EQ(countAnchorCandidates(isolated.data(), nullptr, 5), 0);
}

// docs/semantics.md section 9: in a packed row a + 1 must be in a's
// conversation, so the last token of one is no candidate even where the
// next conversation's first token is supervised.
TEST(RuntimeAnchorSampler, PackedCandidatesStayInTheirConversation) {
  std::vector<uint8_t> mask = {0, 1, 1, 1, 1, 1, 0, 1, 1, 1};
  std::vector<int32_t> positions = {0, 1, 2, 3, 0, 1, 2, 0, 1, 2};
  std::vector<int32_t> candidates;
  anchorCandidates(mask.data(), positions.data(), 10, candidates);
  EXPECT_EQ(candidates, (std::vector<int32_t>{1, 2, 4, 7, 8}));
  EXPECT_EQ(countAnchorCandidates(mask.data(), positions.data(), 10), 5);
  // Unpacked, 3 is one too.
  EXPECT_EQ(countAnchorCandidates(mask.data(), nullptr, 10), 6);
  // The sampler draws from the same candidates.
  AnchorSampler sampler(1, 10, 5);
  Rng rng(3);
  int32_t anchors[5];
  uint8_t keep[5];
  EXPECT_EQ(sampler.sample(mask.data(), positions.data(), rng, anchors, keep),
            5);
  EXPECT_EQ(std::vector<int32_t>(anchors, anchors + 5), candidates);
}

TEST(RuntimeAnchorSampler, ValidDistinctAscending) {
  const int64_t B = 4, S = 64, N = 10;
  Rng maskRng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint8_t> mask(size_t(B * S));
    for (uint8_t &flag : mask)
      flag = maskRng.uniform(3) != 0;
    Rng rng{uint64_t(trial)};
    Sampled s = sampleBatch(mask, B, S, N, rng);
    for (int64_t b = 0; b < B; ++b) {
      const uint8_t *row = mask.data() + b * S;
      int64_t count = countAnchorCandidates(row, nullptr, S);
      int64_t expectedKept = std::min(s.nEff, count);
      int64_t kept = 0, previous = -1;
      for (int64_t n = 0; n < N; ++n) {
        int32_t a = s.anchors[size_t(b * N + n)];
        uint8_t k = s.keep[size_t(b * N + n)];
        ASSERT_LE(k, 1);
        if (!k) {
          EXPECT_EQ(a, 0);
          continue;
        }
        // Kept slots come first.
        EXPECT_EQ(n, kept);
        ++kept;
        ASSERT_GE(a, 0);
        ASSERT_LE(a, S - 2);
        EXPECT_TRUE(row[a] && row[a + 1]) << "anchor " << a;
        EXPECT_GT(a, previous);
        previous = a;
      }
      EXPECT_EQ(kept, expectedKept);
    }
  }
}

TEST(RuntimeAnchorSampler, EffectiveCountAcrossTheBatch) {
  const int64_t S = 32, N = 5;
  // Row 0: 3 candidates, row 1: 10 candidates, row 2: none.
  std::vector<uint8_t> mask = spans(S, {{2, 6}, {10, 21}, {0, 1}});
  Rng rng(1);
  Sampled s = sampleBatch(mask, 3, S, N, rng);
  EXPECT_EQ(s.nEff, 5);
  EXPECT_EQ(std::vector<uint8_t>(s.keep.begin(), s.keep.begin() + 5),
            (std::vector<uint8_t>{1, 1, 1, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(s.anchors.begin(), s.anchors.begin() + 3),
            (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(std::count(s.keep.begin() + 5, s.keep.begin() + 10, 1), 5);
  EXPECT_EQ(std::count(s.keep.begin() + 10, s.keep.end(), 1), 0);
  EXPECT_EQ(std::count(s.anchors.begin() + 10, s.anchors.end(), 0), 5);

  // Every row has at most 2 candidates: N_eff = 2, static N = 5 slots.
  std::vector<uint8_t> small = spans(S, {{4, 7}, {20, 22}});
  Sampled t = sampleBatch(small, 2, S, N, rng);
  EXPECT_EQ(t.nEff, 2);
  EXPECT_EQ(t.anchors, (std::vector<int32_t>{4, 5, 0, 0, 0, 20, 0, 0, 0, 0}));
  EXPECT_EQ(t.keep, (std::vector<uint8_t>{1, 1, 0, 0, 0, 1, 0, 0, 0, 0}));

  // No candidates anywhere: everything unused.
  std::vector<uint8_t> none(size_t(2 * S), 0);
  Sampled u = sampleBatch(none, 2, S, N, rng);
  EXPECT_EQ(u.nEff, 0);
  EXPECT_EQ(std::count(u.keep.begin(), u.keep.end(), 0), 10);
}

TEST(RuntimeAnchorSampler, SeededAndReproducible) {
  const int64_t S = 128, N = 8;
  std::vector<uint8_t> mask = spans(S, {{10, 120}, {0, 128}});
  Rng a(77), b(77), c(78);
  Sampled first = sampleBatch(mask, 2, S, N, a);
  Sampled second = sampleBatch(mask, 2, S, N, b);
  Sampled other = sampleBatch(mask, 2, S, N, c);
  EXPECT_EQ(first.anchors, second.anchors);
  EXPECT_EQ(first.keep, second.keep);
  EXPECT_NE(first.anchors, other.anchors);
  // The generator advanced identically too.
  EXPECT_EQ(a.next(), b.next());
}

TEST(RuntimeAnchorSampler, FollowsTheDocumentedDrawOrder) {
  const int64_t S = 40, N = 6;
  std::vector<uint8_t> mask = spans(S, {{3, 30}, {0, 5}, {10, 40}});
  Rng rng(2024), mirror(2024);
  Sampled s = sampleBatch(mask, 3, S, N, rng);
  for (int64_t b = 0; b < 3; ++b) {
    std::vector<int32_t> c;
    anchorCandidates(mask.data() + b * S, nullptr, S, c);
    int64_t draws = std::min<int64_t>(s.nEff, int64_t(c.size()));
    for (int64_t i = 0; i < draws; ++i)
      std::swap(c[size_t(i)],
                c[size_t(i + int64_t(mirror.uniform(c.size() - size_t(i))))]);
    std::sort(c.begin(), c.begin() + draws);
    for (int64_t n = 0; n < draws; ++n)
      EXPECT_EQ(s.anchors[size_t(b * N + n)], c[size_t(n)]);
  }
  EXPECT_EQ(rng.state(), mirror.state());
}

TEST(RuntimeAnchorSampler, RoughlyUniform) {
  // 10 candidates, 3 draws: each is picked with probability 0.3.
  const int64_t S = 11, N = 3;
  std::vector<uint8_t> mask(size_t(S), 1);
  Rng rng(9);
  AnchorSampler sampler(1, S, N);
  std::vector<int> picks(size_t(S), 0);
  const int trials = 30000;
  int32_t anchors[N];
  uint8_t keep[N];
  for (int trial = 0; trial < trials; ++trial) {
    sampler.sample(mask.data(), nullptr, rng, anchors, keep);
    for (int n = 0; n < N; ++n)
      ++picks[size_t(anchors[n])];
  }
  for (int a = 0; a < 10; ++a)
    EXPECT_NEAR(picks[size_t(a)], 0.3 * trials, 400) << "candidate " << a;
  EXPECT_EQ(picks[10], 0);
}

} // namespace
