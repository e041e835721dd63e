//===- PrefetchTest.cpp - The prefetch thread, without a GPU --------------===//
//
// BatchPrefetcher over pageable memory: the loader's batches, positions and
// anchor states in order (a rank's too), a read error delivered in its
// place in the order, and no batch read past the run's limit.
//
//===----------------------------------------------------------------------===//

#include "runtime/data/Prefetch.h"
#include "runtime/data/BatchLoader.h"
#include "runtime/data/RowSource.h"
#include "runtime/data/Synthetic.h"
#include "test/unit/runtime/RuntimeTestSupport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::trainhost;

TEST(TrainDataParallel, PrefetchedBatchesCarryTheRanksState) {
  ModelConfig c = smallConfig();
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(c, 7).ok());
  SyntheticRowSource rows(problem, 8, false);
  BatchLoader direct(rows, c, 7, 1, 2), ahead(rows, c, 7, 1, 2);
  BatchPrefetcher prefetcher(ahead, c, HostMemory::Pageable, 2);
  ASSERT_TRUE(prefetcher.start().ok());
  HostBatch expected;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(direct.next(expected).ok());
    PrefetchedBatch *batch = nullptr;
    ASSERT_TRUE(prefetcher.acquire(batch).ok());
    EXPECT_EQ(batch->rows, expected.rows);
    EXPECT_EQ(batch->positionAfter.row, direct.position().row);
    EXPECT_EQ(batch->anchorRngAfter, direct.anchorRngState());
    prefetcher.release(batch);
  }
}

namespace {
/// Rows of the synthetic problem; row `failing` cannot be read.
class FailingSource : public RowSource {
public:
  FailingSource(const RowSource &inner, int64_t failing)
      : inner(inner), failing(failing) {}
  int64_t numRows() const override { return inner.numRows(); }
  bool hasPinnedAnchors() const override { return false; }
  Status readRow(int64_t index, const RowBuffers &out) const override {
    if (index == failing)
      return Status::error("shard-3.safetensors row 1: read failed");
    return inner.readRow(index, out);
  }

private:
  const RowSource &inner;
  int64_t failing;
};
} // namespace

TEST(TrainPrefetch, SameBatchesAndPositionsAsTheLoader) {
  ModelConfig c = smallConfig();
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(c, 7).ok());
  SyntheticRowSource rows(problem, 7, false);
  BatchLoader direct(rows, c, 7), ahead(rows, c, 7);
  BatchPrefetcher prefetcher(ahead, c, HostMemory::Pageable, 2);
  ASSERT_TRUE(prefetcher.start().ok());
  HostBatch expected;
  // 7 rows, 2 per step: 3 steps per epoch, so this crosses epochs.
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(direct.next(expected).ok());
    PrefetchedBatch *batch = nullptr;
    ASSERT_TRUE(prefetcher.acquire(batch).ok());
    EXPECT_EQ(batch->sequence, i);
    EXPECT_EQ(batch->rows, expected.rows);
    size_t BS = size_t(c.rowsPerGpu * c.seqLen);
    size_t BN = size_t(c.rowsPerGpu * c.anchorsPerRow);
    EXPECT_TRUE(std::equal(expected.inputIds.begin(), expected.inputIds.end(),
                           batch->inputIds));
    EXPECT_TRUE(std::equal(expected.lossMask.begin(), expected.lossMask.end(),
                           batch->lossMask));
    EXPECT_TRUE(std::equal(expected.hiddenStates.begin(),
                           expected.hiddenStates.end(), batch->hiddenStates));
    EXPECT_TRUE(std::equal(expected.anchors.begin(), expected.anchors.end(),
                           batch->anchors));
    EXPECT_TRUE(
        std::equal(expected.keep.begin(), expected.keep.end(), batch->keep));
    EXPECT_EQ(expected.inputIds.size(), BS);
    EXPECT_EQ(expected.anchors.size(), BN);
    EXPECT_EQ(batch->positionAfter.epoch, direct.position().epoch);
    EXPECT_EQ(batch->positionAfter.row, direct.position().row);
    EXPECT_EQ(batch->anchorRngAfter, direct.anchorRngState());
    prefetcher.release(batch);
  }
  prefetcher.stop();
}

/// A loader over the synthetic rows whose third batch starts with a row that
/// cannot be read.
class TrainPrefetchThirdBatchFails : public ::testing::Test {
protected:
  void SetUp() override {
    ASSERT_TRUE(problem.init(c, 7).ok());
    rows = std::make_unique<SyntheticRowSource>(problem, 8, false);
    BatchLoader probe(*rows, c, 7);
    HostBatch batch;
    for (int i = 0; i < 3; ++i)
      ASSERT_TRUE(probe.next(batch).ok());
    failing = std::make_unique<FailingSource>(*rows, batch.rows[0]);
    loader = std::make_unique<BatchLoader>(*failing, c, 7);
  }

  ModelConfig c = smallConfig();
  SyntheticProblem problem;
  std::unique_ptr<SyntheticRowSource> rows;
  std::unique_ptr<FailingSource> failing;
  std::unique_ptr<BatchLoader> loader;
};

TEST_F(TrainPrefetchThirdBatchFails, ReadErrorArrivesInOrder) {
  BatchPrefetcher prefetcher(*loader, c, HostMemory::Pageable, 3);
  ASSERT_TRUE(prefetcher.start().ok());
  for (int i = 0; i < 2; ++i) {
    PrefetchedBatch *b = nullptr;
    ASSERT_TRUE(prefetcher.acquire(b).ok());
    prefetcher.release(b);
  }
  PrefetchedBatch *b = nullptr;
  Status s = prefetcher.acquire(b);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "shard-3.safetensors row 1: read failed");
}

// The thread reads only the batches the run has left: a limit of two never
// touches the failing row, and a third acquire names the limit instead of
// hanging.
TEST_F(TrainPrefetchThirdBatchFails, ReadsNoMoreThanItsLimit) {
  BatchPrefetcher prefetcher(*loader, c, HostMemory::Pageable, 3);
  ASSERT_TRUE(prefetcher.start(2).ok());
  for (int i = 0; i < 2; ++i) {
    PrefetchedBatch *b = nullptr;
    Status s = prefetcher.acquire(b);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(b->sequence, i);
    prefetcher.release(b);
  }
  PrefetchedBatch *b = nullptr;
  Status s = prefetcher.acquire(b);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "the batch prefetcher was asked for more than its 2 batches");
  prefetcher.stop();
  // The loader stopped after two batches: the next one it gives is the
  // third, which reads the failing row.
  HostBatch batch;
  EXPECT_FALSE(loader->next(batch).ok());
}
