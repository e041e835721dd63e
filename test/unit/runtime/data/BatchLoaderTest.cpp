//===- BatchLoaderTest.cpp - Data order, rank sharding, resume ------------===//

#include "runtime/data/BatchLoader.h"
#include "runtime/data/ParallelFor.h"
#include "test/unit/runtime/RuntimeTestSupport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include <cstring>
#include <map>
#include <set>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;

namespace {

/// The one-layer drafter made narrower, with no target model: the loader
/// only looks at the batch and row shapes.
ModelConfig smallConfig() {
  ModelConfig c = oneLayerDrafterConfig();
  c.name = "loader";
  c.targetModel.clear();
  c.targetHiddenSize = c.hiddenSize = 8;
  c.vocabSize = 50;
  c.intermediateSize = 16;
  c.headDim = 4;
  c.blockSize = 2;
  c.maskTokenId = 49;
  c.maxPositionEmbeddings = 64;
  c.seqLen = 16;
  return c;
}

/// Row i holds token i everywhere and is fully supervised; the rows in
/// `poisoned` have a NaN feature.
class CountingSource : public RowSource {
public:
  CountingSource(const ModelConfig &c, int64_t rows,
                 std::vector<int64_t> poisoned = {})
      : config(c), rows(rows), poisoned(std::move(poisoned)) {}
  int64_t numRows() const override { return rows; }
  bool hasPinnedAnchors() const override { return false; }
  Status readRow(int64_t index, const RowBuffers &out) const override {
    ++readCounts[index];
    for (int64_t t = 0; t < config.seqLen; ++t) {
      out.inputIds[t] = int32_t(index);
      out.lossMask[t] = 1;
      out.positionIds[t] = int32_t(t);
    }
    std::memset(out.hiddenStates, 0,
                size_t(config.seqLen * config.contextWidth()) * 2);
    if (std::find(poisoned.begin(), poisoned.end(), index) != poisoned.end())
      out.hiddenStates[5 * config.contextWidth() + 3] = 0x7fc0; // NaN
    return Status::success();
  }
  std::string describeRow(int64_t index) const override {
    return "shard-7.safetensors row " + std::to_string(index);
  }
  /// How often row `index` was read.
  int64_t reads(int64_t index) const {
    auto it = readCounts.find(index);
    return it == readCounts.end() ? 0 : it->second;
  }

private:
  ModelConfig config;
  int64_t rows;
  std::vector<int64_t> poisoned;
  mutable std::map<int64_t, int64_t> readCounts;
};

std::vector<int64_t> rowsOf(BatchLoader &loader) {
  HostBatch batch;
  EXPECT_TRUE(loader.next(batch).ok());
  return batch.rows;
}

TEST(RuntimeBatchLoader, EpochIsAPermutationAndRanksReadDistinctRows) {
  ModelConfig c = smallConfig();
  CountingSource source(c, 12);
  BatchLoader rank0(source, c, 9, 0, 2), rank1(source, c, 9, 1, 2);
  std::set<int64_t> seen;
  for (int step = 0; step < 3; ++step) { // 3 steps x 2 ranks x 2 rows = 12
    for (int64_t r : rowsOf(rank0))
      EXPECT_TRUE(seen.insert(r).second) << "row " << r << " read twice";
    for (int64_t r : rowsOf(rank1))
      EXPECT_TRUE(seen.insert(r).second) << "row " << r << " read twice";
  }
  EXPECT_EQ(seen.size(), 12u);
  EXPECT_EQ(rank0.position().epoch, 0);
  EXPECT_EQ(rank0.position().row, 12);
  rowsOf(rank0); // the next step starts epoch 1
  EXPECT_EQ(rank0.position().epoch, 1);
}

TEST(RuntimeBatchLoader, SeededAndResumable) {
  ModelConfig c = smallConfig();
  CountingSource source(c, 10);
  BatchLoader a(source, c, 4), b(source, c, 4), other(source, c, 5);
  HostBatch x, y;
  ASSERT_TRUE(a.next(x).ok());
  ASSERT_TRUE(b.next(y).ok());
  EXPECT_EQ(x.rows, y.rows);
  EXPECT_EQ(x.anchors, y.anchors);
  // Resume: a fresh loader seeked to a's position continues exactly.
  for (int i = 0; i < 6; ++i)
    ASSERT_TRUE(a.next(x).ok());
  BatchLoader resumed(source, c, 4);
  ASSERT_TRUE(resumed.seek(a.position(), a.anchorRngState()).ok());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(a.next(x).ok());
    ASSERT_TRUE(resumed.next(y).ok());
    EXPECT_EQ(x.rows, y.rows);
    EXPECT_EQ(x.anchors, y.anchors);
    EXPECT_EQ(x.keep, y.keep);
  }
  // Another seed gives another order.
  bool differs = false;
  BatchLoader c1(source, c, 4);
  for (int i = 0; i < 5; ++i)
    differs |= rowsOf(c1) != rowsOf(other);
  EXPECT_TRUE(differs);
}

TEST(RuntimeBatchLoader, RejectsTooLittleDataAndNonFiniteFeatures) {
  ModelConfig c = smallConfig();
  CountingSource few(c, 3);
  BatchLoader loader(few, c, 1, 0, 2);
  HostBatch batch;
  Status s = loader.next(batch);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "the data has 3 rows but one step needs 4 (2 rows "
                         "per GPU x 2 GPUs)");

  CountingSource poisoned(c, 2, /*poisoned=*/{1});
  BatchLoader nan(poisoned, c, 1);
  s = nan.next(batch);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "shard-7.safetensors row 1: hidden_states has a "
                         "non-finite value at position 5, feature 3 (row 1 "
                         "with non-finite features; at most 0 are skipped: "
                         "check the data, or raise --max-bad-rows)");
}

/// A source whose rows are long enough that the non-finite scan splits
/// them into chunks (kParallelChunk elements): NaNs at `bad` elements of
/// every row, or no features at all (token shards: readRow leaves
/// hidden_states alone).
class LongRowSource : public RowSource {
public:
  LongRowSource(const ModelConfig &c, std::vector<size_t> bad, bool features)
      : config(c), bad(std::move(bad)), features(features) {}
  int64_t numRows() const override { return 2; }
  bool hasPinnedAnchors() const override { return false; }
  bool hasFeatures() const override { return features; }
  Status readRow(int64_t index, const RowBuffers &out) const override {
    for (int64_t t = 0; t < config.seqLen; ++t) {
      out.inputIds[t] = int32_t(index + 1);
      out.lossMask[t] = 1;
      out.positionIds[t] = int32_t(t);
    }
    if (!features)
      return Status::success();
    const size_t count = size_t(config.seqLen * config.contextWidth());
    for (size_t i = 0; i < count; ++i)
      out.hiddenStates[i] = uint16_t(0x3f80 + (i + size_t(index)) % 64);
    for (size_t at : bad)
      out.hiddenStates[at] = 0x7f80; // +inf
    return Status::success();
  }
  std::string describeRow(int64_t index) const override {
    return "long row " + std::to_string(index);
  }

private:
  ModelConfig config;
  std::vector<size_t> bad;
  bool features;
};

/// smallConfig with rows of 2^16 tokens x 2 taps x 160: 20 Mi features a
/// row, two chunks of the scan.
ModelConfig longRowConfig() {
  ModelConfig c = smallConfig();
  c.seqLen = 65536;
  c.maxPositionEmbeddings = 65536 + 16;
  c.targetHiddenSize = c.hiddenSize = 160;
  c.targetLayerIds = {0, 1};
  return c;
}

TEST(RuntimeBatchLoader, WritesTheCallersBuffersAsHostBatch) {
  // The prefetch thread's slot is written in place: every element the same
  // as a HostBatch gets, whatever the slot held before.
  ModelConfig c = longRowConfig();
  LongRowSource source(c, {}, /*features=*/true);
  BatchLoader a(source, c, 3), b(source, c, 3);
  HostBatch expected;
  ASSERT_TRUE(a.next(expected).ok());
  HostBatch slot;
  slot.resize(c);
  std::fill(slot.inputIds.begin(), slot.inputIds.end(), -7);
  std::fill(slot.lossMask.begin(), slot.lossMask.end(), uint8_t(9));
  std::fill(slot.hiddenStates.begin(), slot.hiddenStates.end(),
            uint16_t(0x1234));
  std::fill(slot.anchors.begin(), slot.anchors.end(), -7);
  std::fill(slot.keep.begin(), slot.keep.end(), uint8_t(9));
  std::fill(slot.positionIds.begin(), slot.positionIds.end(), -7);
  slot.skippedRows.push_back({5, "stale"});
  ASSERT_TRUE(b.next(slot.buffers()).ok());
  EXPECT_EQ(slot.inputIds, expected.inputIds);
  EXPECT_EQ(slot.lossMask, expected.lossMask);
  EXPECT_TRUE(slot.hiddenStates == expected.hiddenStates);
  EXPECT_EQ(slot.anchors, expected.anchors);
  EXPECT_EQ(slot.keep, expected.keep);
  EXPECT_EQ(slot.positionIds, expected.positionIds);
  EXPECT_EQ(slot.rows, expected.rows);
  EXPECT_TRUE(slot.skippedRows.empty());
}

TEST(RuntimeBatchLoader, NamesTheFirstNonFiniteFeatureOfALongRow) {
  // Infinities in the second chunk and the first: the first is named.
  ModelConfig c = longRowConfig();
  const size_t W = size_t(c.contextWidth());
  const size_t late = kParallelChunk + 17, early = 3 * W + 5;
  LongRowSource source(c, {late, early}, /*features=*/true);
  BatchLoader loader(source, c, 1);
  HostBatch batch;
  Status s = loader.next(batch);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("non-finite value at position 3, feature 5 "),
            std::string::npos)
      << s.message();
  LongRowSource lateOnly(c, {late}, /*features=*/true);
  BatchLoader second(lateOnly, c, 1);
  s = second.next(batch);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("non-finite value at position " +
                             std::to_string(late / W) + ", feature " +
                             std::to_string(late % W) + " "),
            std::string::npos)
      << s.message();
}

TEST(RuntimeBatchLoader, RowsWithoutFeaturesAreNotScanned) {
  // Token shards leave hidden_states as it was: a NaN there is none of the
  // row's, and the online target overwrites the features on the GPU.
  ModelConfig c = longRowConfig();
  LongRowSource source(c, {}, /*features=*/false);
  BatchLoader loader(source, c, 1);
  HostBatch batch;
  batch.resize(c);
  std::fill(batch.hiddenStates.begin(), batch.hiddenStates.end(),
            uint16_t(0x7fc0));
  EXPECT_TRUE(loader.next(batch.buffers()).ok());
}

// Up to the limit, a row with a non-finite feature is skipped: its slot
// becomes an empty row (nothing supervised, no features), the others are
// untouched, and the batch names it; the next one past the limit fails,
// naming that row.
TEST(RuntimeBatchLoader, SkipsNonFiniteRowsUpToTheLimit) {
  ModelConfig c = smallConfig();
  const int64_t B = c.rowsPerGpu, S = c.seqLen, W = c.contextWidth();
  CountingSource source(c, 8, /*poisoned=*/{2, 5, 6});
  BatchLoader loader(source, c, 1);
  loader.setMaxBadRows(2);
  std::vector<std::string> named;
  Status s;
  HostBatch batch;
  int64_t batches = 0;
  while ((s = loader.next(batch)).ok() && batches < 8) {
    ++batches;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t row = batch.rows[size_t(b)];
      const bool bad = row == 2 || row == 5 || row == 6;
      for (int64_t t = 0; t < S; ++t) {
        EXPECT_EQ(batch.inputIds[size_t(b * S + t)], bad ? 0 : row);
        EXPECT_EQ(batch.lossMask[size_t(b * S + t)], bad ? 0 : 1);
      }
      for (int64_t i = 0; i < S * W; ++i)
        ASSERT_EQ(batch.hiddenStates[size_t(b * S * W + i)], 0);
      // An empty row keeps no anchor.
      for (int64_t n = 0; n < c.anchorsPerRow && bad; ++n)
        EXPECT_EQ(batch.keep[size_t(b * c.anchorsPerRow + n)], 0);
    }
    for (const SkippedRow &row : batch.skippedRows) {
      EXPECT_TRUE(row.row == 2 || row.row == 5 || row.row == 6) << row.row;
      named.push_back(row.what);
    }
  }
  // The third bad row of the epoch stops the run, naming it.
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("(row 3 with non-finite features; at most 2 are "
                             "skipped"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(loader.badRowsSeen(), 3);
  ASSERT_EQ(named.size(), 2u);
  for (const std::string &row : named)
    EXPECT_NE(row.find("hidden_states has a non-finite value at position 5, "
                       "feature 3"),
              std::string::npos)
        << row;
}

// A bad row is counted and named once: met again in later epochs it is
// skipped without counting against the limit.
TEST(RuntimeBatchLoader, CountsEachBadRowOnceAcrossEpochs) {
  ModelConfig c = smallConfig();
  CountingSource source(c, 8, /*poisoned=*/{2, 5});
  BatchLoader loader(source, c, 1);
  loader.setMaxBadRows(2);
  HostBatch batch;
  size_t named = 0;
  for (int i = 0; i < 12; ++i) { // three epochs of four batches
    ASSERT_TRUE(loader.next(batch).ok()) << "batch " << i;
    named += batch.skippedRows.size();
    for (int64_t b = 0; b < c.rowsPerGpu; ++b) {
      const int64_t row = batch.rows[size_t(b)];
      if (row != 2 && row != 5)
        continue;
      for (int64_t t = 0; t < c.seqLen; ++t)
        EXPECT_EQ(batch.lossMask[size_t(b * c.seqLen + t)], 0);
    }
  }
  EXPECT_EQ(loader.position().epoch, 2);
  EXPECT_EQ(loader.badRowsSeen(), 2);
  EXPECT_EQ(named, 2u);
}

// Rows a resumed state knew as bad are skipped unread: not read, counted or
// named, and not against the limit (0 here: a new bad row would fail).
TEST(RuntimeBatchLoader, KnownBadRowsAreSkippedUnread) {
  ModelConfig c = smallConfig();
  CountingSource source(c, 8, /*poisoned=*/{2, 5});
  BatchLoader loader(source, c, 1);
  loader.setMaxBadRows(0);
  loader.addKnownBadRows({2, 5});
  HostBatch batch;
  int64_t emptied = 0;
  for (int i = 0; i < 8; ++i) { // two epochs
    ASSERT_TRUE(loader.next(batch).ok()) << "batch " << i;
    EXPECT_TRUE(batch.skippedRows.empty());
    for (int64_t b = 0; b < c.rowsPerGpu; ++b) {
      const int64_t row = batch.rows[size_t(b)];
      if (row != 2 && row != 5)
        continue;
      ++emptied;
      for (int64_t t = 0; t < c.seqLen; ++t)
        EXPECT_EQ(batch.lossMask[size_t(b * c.seqLen + t)], 0);
    }
  }
  EXPECT_EQ(emptied, 4);
  EXPECT_EQ(loader.badRowsSeen(), 0);
  EXPECT_EQ(source.reads(2) + source.reads(5), 0);
}

// An evaluation reads every row exactly once, in source order, over its
// ranks; the slots past the last row are empty (nothing supervised, no kept
// block), and a set smaller than one global batch is evaluated too.
TEST(RuntimeBatchLoader, EvaluationReadsEveryRowOnce) {
  ModelConfig c = smallConfig();
  const int64_t world = 2, B = c.rowsPerGpu;
  for (int64_t rows : {int64_t(1), 2 * B * world, 2 * B * world + 1}) {
    CountingSource source(c, rows);
    std::vector<int64_t> seen;
    int64_t batches = -1;
    for (int64_t rank = 0; rank < world; ++rank) {
      BatchLoader loader(source, c, 3, rank, world);
      loader.setEvaluationOrder();
      ASSERT_TRUE(loader.validate().ok()) << rows;
      batches = loader.batchesPerPass();
      EXPECT_EQ(batches, (rows + B * world - 1) / (B * world)) << rows;
      HostBatch batch;
      for (int64_t g = 0; g < batches; ++g) {
        ASSERT_TRUE(loader.next(batch).ok()) << rows << " batch " << g;
        for (int64_t b = 0; b < B; ++b) {
          const int64_t row = batch.rows[size_t(b)];
          EXPECT_EQ(row, g * B * world + rank * B + b < rows
                             ? g * B * world + rank * B + b
                             : -1);
          if (row >= 0) {
            seen.push_back(row);
            continue;
          }
          for (int64_t t = 0; t < c.seqLen; ++t)
            EXPECT_EQ(batch.lossMask[size_t(b * c.seqLen + t)], 0);
          for (int64_t n = 0; n < c.anchorsPerRow; ++n)
            EXPECT_EQ(batch.keep[size_t(b * c.anchorsPerRow + n)], 0);
        }
      }
      // Nothing is read twice: the pass is over.
      Status again = loader.next(batch);
      ASSERT_FALSE(again.ok());
      EXPECT_NE(again.message().find("read every row already"),
                std::string::npos);
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(static_cast<size_t>(rows));
    std::iota(all.begin(), all.end(), int64_t(0));
    EXPECT_EQ(seen, all) << rows << " rows";
  }
}

} // namespace
