//===- BatchLoaderRanksTest.cpp - The loader's data-parallel ranks --------===//
//
// Ranks of B rows read their parts of the one-GPU batch of world x B rows
// across epochs, each from its own anchor stream, and resume from a
// checkpoint that holds every rank's stream. Beside BatchLoaderTest.cpp,
// which runs a narrower drafter of its own.
//
//===----------------------------------------------------------------------===//

#include "runtime/data/BatchLoader.h"
#include "runtime/data/InitialParameters.h"
#include "runtime/data/Synthetic.h"
#include "runtime/io/Checkpoint.h"
#include "test/unit/runtime/RuntimeTestSupport.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::trainhost;

namespace {
template <typename T>
std::vector<T> joined(const std::vector<T> &a, const std::vector<T> &b) {
  std::vector<T> all = a;
  all.insert(all.end(), b.begin(), b.end());
  return all;
}
} // namespace

TEST(TrainDataParallel, RanksSplitTheGlobalBatchAndResumeTheirOwnAnchors) {
  ModelConfig c = smallConfig(); // 2 rows per GPU
  ModelConfig wide = c;
  wide.rowsPerGpu = 4;
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(c, 7).ok());
  SyntheticRowSource rows(problem, 10, false);
  BatchLoader rank0(rows, c, 7, 0, 2), rank1(rows, c, 7, 1, 2);
  BatchLoader single(rows, wide, 7);
  // 10 rows, 4 per step: two steps per epoch, so this crosses epochs.
  for (int step = 0; step < 5; ++step) {
    HostBatch a, b, all;
    ASSERT_TRUE(rank0.next(a).ok());
    ASSERT_TRUE(rank1.next(b).ok());
    ASSERT_TRUE(single.next(all).ok());
    // Rank r reads rows [r*B, (r+1)*B) of the one-GPU batch of 2B rows.
    EXPECT_EQ(joined(a.rows, b.rows), all.rows) << "step " << step;
    EXPECT_EQ(joined(a.inputIds, b.inputIds), all.inputIds);
    EXPECT_EQ(joined(a.hiddenStates, b.hiddenStates), all.hiddenStates);
    EXPECT_EQ(rank0.position().epoch, single.position().epoch);
    EXPECT_EQ(rank0.position().row, single.position().row);
    EXPECT_EQ(rank1.position().row, single.position().row);
  }
  // Each rank draws anchors from its own stream.
  EXPECT_NE(rank0.anchorRngState(), rank1.anchorRngState());

  // A checkpoint of the two ranks, then two loaders resumed from it.
  TrainMainTempDir dir;
  std::vector<std::vector<uint16_t>> params = initialParameters(c, 1);
  std::vector<const uint16_t *> pointers;
  TrainingState state;
  for (const auto &p : params) {
    pointers.push_back(p.data());
    state.master.emplace_back(p.size(), 0.0f);
    state.adamM.emplace_back(p.size(), 0.0f);
    state.adamV.emplace_back(p.size(), 0.0f);
  }
  state.step = 5;
  state.data = rank0.position();
  state.rngState = rank0.anchorRngState();
  state.otherRankRngStates = {rank1.anchorRngState()};
  ASSERT_TRUE(
      saveTrainingCheckpoint(dir.path + "/ckpt", c, pointers, state.ref())
          .ok());
  TrainingState loaded;
  ASSERT_TRUE(loadTrainingState(dir.path + "/ckpt", c, loaded).ok());
  BatchLoader resumed0(rows, c, 7, 0, 2), resumed1(rows, c, 7, 1, 2);
  ASSERT_TRUE(resumed0.seek(loaded.data, loaded.anchorRngState(0)).ok());
  ASSERT_TRUE(resumed1.seek(loaded.data, loaded.anchorRngState(1)).ok());
  for (int step = 0; step < 4; ++step) {
    HostBatch x, y;
    ASSERT_TRUE(rank0.next(x).ok());
    ASSERT_TRUE(resumed0.next(y).ok());
    EXPECT_EQ(x.rows, y.rows);
    EXPECT_EQ(x.anchors, y.anchors);
    EXPECT_EQ(x.keep, y.keep);
    ASSERT_TRUE(rank1.next(x).ok());
    ASSERT_TRUE(resumed1.next(y).ok());
    EXPECT_EQ(x.rows, y.rows);
    EXPECT_EQ(x.anchors, y.anchors);
    EXPECT_EQ(x.keep, y.keep);
  }
}
