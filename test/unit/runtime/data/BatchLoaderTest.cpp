//===- BatchLoaderTest.cpp - Data order, rank sharding, resume ------------===//

#include "runtime/data/BatchLoader.h"
#include "test/unit/runtime/RuntimeTestSupport.h"

#include <gtest/gtest.h>

#include <cstring>
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

/// Row i holds token i everywhere and is fully supervised; row `poisoned`
/// has a NaN feature.
class CountingSource : public RowSource {
public:
  CountingSource(const ModelConfig &c, int64_t rows, int64_t poisoned = -1)
      : config(c), rows(rows), poisoned(poisoned) {}
  int64_t numRows() const override { return rows; }
  bool hasPinnedAnchors() const override { return false; }
  Status readRow(int64_t index, const RowBuffers &out) const override {
    for (int64_t t = 0; t < config.seqLen; ++t) {
      out.inputIds[t] = int32_t(index);
      out.lossMask[t] = 1;
    }
    std::memset(out.hiddenStates, 0,
                size_t(config.seqLen * config.contextWidth()) * 2);
    if (index == poisoned)
      out.hiddenStates[5 * config.contextWidth() + 3] = 0x7fc0; // NaN
    return Status::success();
  }
  std::string describeRow(int64_t index) const override {
    return "shard-7.safetensors row " + std::to_string(index);
  }

private:
  ModelConfig config;
  int64_t rows, poisoned;
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

  CountingSource poisoned(c, 2, /*poisoned=*/1);
  BatchLoader nan(poisoned, c, 1);
  s = nan.next(batch);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "shard-7.safetensors row 1: hidden_states has a "
                         "non-finite value at position 5, feature 3");
}

} // namespace
