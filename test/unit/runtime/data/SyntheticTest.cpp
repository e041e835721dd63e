//===- SyntheticTest.cpp - The synthetic problem --------------------------===//

#include "kernels/Bf16.h"
#include "runtime/data/AnchorSampler.h"
#include "runtime/data/InitialParameters.h"
#include "runtime/io/Checkpoint.h"
#include "test/unit/runtime/RuntimeTestSupport.h"
#include "tools/dflash-synth/SyntheticFiles.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
namespace fs = std::filesystem;

namespace {

ModelConfig testConfig() {
  ModelConfig c = twoLayerDrafterConfig();
  c.vocabSize = 50;
  c.maskTokenId = 20; // inside the vocabulary, not at its end
  c.seqLen = 64;
  return c;
}

struct Row {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  std::vector<uint16_t> hidden;
};

Row generate(const SyntheticProblem &problem, int64_t index) {
  const ModelConfig &c = problem.config();
  Row row{std::vector<int32_t>(size_t(c.seqLen)),
          std::vector<uint8_t>(size_t(c.seqLen)),
          std::vector<uint16_t>(size_t(c.seqLen * c.contextWidth()))};
  problem.generateRow(index, row.ids.data(), row.mask.data(),
                      row.hidden.data());
  return row;
}

TEST(RuntimeSynthetic, Deterministic) {
  ModelConfig c = testConfig();
  SyntheticProblem a, b, other;
  ASSERT_TRUE(a.init(c, 1).ok());
  ASSERT_TRUE(b.init(c, 1).ok());
  ASSERT_TRUE(other.init(c, 2).ok());
  EXPECT_EQ(a.target().embed, b.target().embed);
  EXPECT_EQ(a.target().lmHead, b.target().lmHead);
  EXPECT_NE(a.target().embed, other.target().embed);
  // lm_head holds the embedding's values (Synthetic.h says why).
  EXPECT_EQ(a.target().embed, a.target().lmHead);
  for (int64_t i : {0, 1, 17}) {
    Row x = generate(a, i), y = generate(b, i), z = generate(other, i);
    EXPECT_EQ(x.ids, y.ids);
    EXPECT_EQ(x.mask, y.mask);
    EXPECT_EQ(x.hidden, y.hidden);
    EXPECT_NE(x.ids, z.ids);
  }
  // Rows do not depend on which rows were generated before.
  Row late = generate(a, 5);
  SyntheticProblem fresh;
  ASSERT_TRUE(fresh.init(c, 1).ok());
  EXPECT_EQ(generate(fresh, 5).hidden, late.hidden);
  EXPECT_EQ(a.initialParameters(), initialParameters(c, 1));
}

TEST(RuntimeSynthetic, RowStructure) {
  ModelConfig c = testConfig();
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(c, 3).ok());
  int64_t S = c.seqLen, LH = c.contextWidth();
  int padded = 0;
  for (int64_t i = 0; i < 200; ++i) {
    Row row = generate(problem, i);
    // Prompt zeros, answer ones, then padding zeros.
    int64_t t = 0;
    while (t < S && !row.mask[size_t(t)])
      ++t;
    int64_t prompt = t;
    EXPECT_GE(prompt, S / 8);
    EXPECT_LE(prompt, S / 4);
    while (t < S && row.mask[size_t(t)])
      ++t;
    int64_t length = t;
    EXPECT_GE(length - prompt, 2) << "row " << i;
    EXPECT_GT(countAnchorCandidates(row.mask.data(), nullptr, S), 0);
    padded += length < S;
    for (; t < S; ++t) {
      ASSERT_EQ(row.mask[size_t(t)], 0);
      ASSERT_EQ(row.ids[size_t(t)], 0);
      for (int64_t k = 0; k < LH; ++k)
        ASSERT_EQ(row.hidden[size_t(t * LH + k)], 0);
    }
    for (int64_t p = 0; p < length; ++p) {
      ASSERT_GE(row.ids[size_t(p)], 0);
      ASSERT_LT(row.ids[size_t(p)], c.vocabSize);
      ASSERT_NE(row.ids[size_t(p)], c.maskTokenId);
    }
  }
  EXPECT_GT(padded, 25);
  EXPECT_LT(padded, 80);
}

TEST(RuntimeSynthetic, TokensFollowTheChain) {
  ModelConfig c = testConfig();
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(c, 4).ok());
  int64_t follows = 0, transitions = 0;
  for (int64_t i = 0; i < 200; ++i) {
    Row row = generate(problem, i);
    for (int64_t t = 0; t + 1 < c.seqLen; ++t) {
      bool inside =
          t + 1 < c.seqLen && (row.mask[size_t(t + 1)] || t + 1 < c.seqLen / 8);
      if (!inside)
        continue;
      ++transitions;
      follows +=
          row.ids[size_t(t + 1)] == problem.successor(row.ids[size_t(t)]);
    }
  }
  double rate = double(follows) / double(transitions);
  EXPECT_NEAR(rate, 0.8 + 0.2 / 49, 0.03);
}

TEST(RuntimeSynthetic, FeaturesEncodeTheNextTokens) {
  // Positions whose current token and tokens one block ahead (offsets bs,
  // bs+1) agree have nearly equal features (only the noise differs); others
  // do not.
  ModelConfig c = testConfig();
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(c, 5).ok());
  int64_t S = c.seqLen, LH = c.contextWidth();
  std::map<std::vector<int32_t>, std::vector<float>> seen;
  double sameMax = 0, differentMin = 1e30;
  int sameCount = 0;
  for (int64_t i = 0; i < 50; ++i) {
    Row row = generate(problem, i);
    int64_t length = S;
    while (length > 0 && row.mask[size_t(length - 1)] == 0)
      --length;
    const int64_t bs = c.blockSize;
    for (int64_t t = 0; t + bs + 2 <= length; ++t) {
      std::vector<int32_t> key = {row.ids[size_t(t)], row.ids[size_t(t + bs)],
                                  row.ids[size_t(t + bs + 1)]};
      std::vector<float> feature(static_cast<size_t>(LH));
      for (int64_t k = 0; k < LH; ++k)
        feature[size_t(k)] = bf16ToFloat(row.hidden[size_t(t * LH + k)]);
      auto it = seen.find(key);
      if (it == seen.end()) {
        if (seen.size() < 200) {
          for (auto &[otherKey, otherFeature] : seen) {
            double distance = 0;
            for (int64_t k = 0; k < LH; ++k)
              distance = std::max(distance,
                                  double(std::fabs(feature[size_t(k)] -
                                                   otherFeature[size_t(k)])));
            differentMin = std::min(differentMin, distance);
          }
          seen[key] = feature;
        }
        continue;
      }
      ++sameCount;
      for (int64_t k = 0; k < LH; ++k)
        sameMax = std::max(sameMax, double(std::fabs(feature[size_t(k)] -
                                                     it->second[size_t(k)])));
    }
  }
  EXPECT_GT(sameCount, 10);
  // Noise is +-0.05 per element, plus bf16 rounding of values up to ~5.
  EXPECT_LT(sameMax, 0.2);
  EXPECT_GT(differentMin, 0.5);
}

TEST(RuntimeSynthetic, RowSourceAndPinnedAnchors) {
  ModelConfig c = testConfig();
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(c, 6).ok());
  SyntheticRowSource source(problem, 4, true);
  EXPECT_EQ(source.numRows(), 4);
  EXPECT_TRUE(source.hasPinnedAnchors());
  int64_t S = c.seqLen, N = c.anchorsPerRow;
  std::vector<int32_t> ids(static_cast<size_t>(S)),
      anchors(static_cast<size_t>(N));
  std::vector<uint8_t> mask(static_cast<size_t>(S)),
      keep(static_cast<size_t>(N));
  std::vector<uint16_t> hidden(size_t(S * c.contextWidth()));
  RowBuffers out{ids.data(), mask.data(), hidden.data(), anchors.data(),
                 keep.data()};
  ASSERT_TRUE(source.readRow(2, out).ok());
  EXPECT_EQ(ids, generate(problem, 2).ids);
  int64_t kept = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (!keep[size_t(n)])
      continue;
    ++kept;
    int32_t a = anchors[size_t(n)];
    EXPECT_TRUE(mask[size_t(a)] && mask[size_t(a + 1)]);
  }
  EXPECT_EQ(kept, std::min<int64_t>(
                      N, countAnchorCandidates(mask.data(), nullptr, S)));
  EXPECT_EQ(source.readRow(4, out).message(),
            "synthetic data: row 4 is outside [0, 4)");
}

// The manifest counts block attention for anchors spread evenly over a row,
// a mean of (S - 2) / 2 context keys (dialect/DFlashFlops.cpp). Synthetic
// rows hold no anchors in their prompt, so the trainer's long-row
// benchmarks (`train --data synthetic --seed 0`, rows 0 and 1) do more
// attention than that count: the sampler draws evenly over the answer, so
// the mean anchor is the answer's middle. Prints each row's factor
// (docs/long-context.md quotes them).
TEST(RuntimeSynthetic, LongRowAnchorWork) {
  for (int64_t S : {32768, 65536, 131072}) {
    ModelConfig c = testConfig();
    c.seqLen = S;
    c.anchorsPerRow = 512;
    SyntheticProblem problem;
    ASSERT_TRUE(problem.init(c, 0).ok());
    for (int64_t index : {0, 1}) {
      Row row = generate(problem, index);
      std::vector<int32_t> anchors(size_t(c.anchorsPerRow));
      std::vector<uint8_t> keep(size_t(c.anchorsPerRow));
      problem.pinnedAnchors(index, row.mask.data(), anchors.data(),
                            keep.data());
      int64_t first = -1, last = -1;
      for (int64_t t = 0; t < S; ++t)
        if (row.mask[size_t(t)]) {
          first = first < 0 ? t : first;
          last = t;
        }
      ASSERT_GE(first, S / 8) << "the prompt is at least S/8 tokens";
      double sum = 0;
      int64_t kept = 0;
      for (int64_t n = 0; n < c.anchorsPerRow; ++n) {
        if (!keep[size_t(n)])
          continue;
        ++kept;
        EXPECT_GE(anchors[size_t(n)], first) << "an anchor in the prompt";
        sum += anchors[size_t(n)];
      }
      ASSERT_EQ(kept, c.anchorsPerRow);
      const double factor = sum / (double(kept) * double(S - 2) / 2);
      const double middle = double(first + last) / double(S - 2);
      EXPECT_NEAR(factor, middle, 0.03) << "anchors even over the answer";
      std::printf("S %lld row %lld: answer [%lld, %lld], its anchors see "
                  "%.4f times the manifest's context\n",
                  static_cast<long long>(S), static_cast<long long>(index),
                  static_cast<long long>(first), static_cast<long long>(last),
                  factor);
    }
  }
}

TEST(RuntimeSynthetic, InitCheckpoint) {
  TempDir dir;
  ModelConfig c = testConfig();
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(c, 7).ok());
  ASSERT_TRUE(writeSyntheticInit(dir / "init", problem).ok());
  std::vector<std::vector<uint16_t>> loaded;
  Status status = loadCheckpoint(dir / "init", c, loaded);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(loaded, problem.initialParameters());
}

TEST(RuntimeSynthetic, RejectsBadInput) {
  ModelConfig c = testConfig();
  SyntheticProblem problem;
  c.numHeads = 3;
  EXPECT_FALSE(problem.init(c, 1).ok());
  c = testConfig();
  ASSERT_TRUE(problem.init(c, 1).ok());
  TempDir dir;
  EXPECT_EQ(writeSyntheticShards(dir / "d", problem, 0, 4, false).message(),
            dir / "d" + ": the number of rows must be positive, not 0");
  EXPECT_EQ(writeSyntheticShards(dir / "d", problem, 4, 0, false).message(),
            dir / "d" + ": the rows per shard must be positive, not 0");
  EXPECT_FALSE(fs::exists(dir / "d"));
}

} // namespace
