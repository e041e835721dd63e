//===- TrainerGroupGpuTest.cpp - Trainers on several GPUs -----------------===//
//
// TrainerGroup around the hand-written step: one GPU equals the trainer
// alone, and equals NCCL on one GPU; with two GPUs (skipped with fewer) two
// ranks of B rows train like one GPU of 2B rows, and a rank that fails stops
// the other instead of leaving it in the all-reduce.
//
//===----------------------------------------------------------------------===//

#include "runtime/train/TrainerGroup.h"
#include "test/gpu/runtime/FakeStepPrograms.h"
#include "test/gpu/runtime/TrainerRuns.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::gpu;
namespace fs = std::filesystem;

TEST(RuntimeTrainerGroup, OneGpuEqualsTheTrainerAlone) {
  Problem p;
  RunResult alone, group;
  Status aloneRun = trainDirect(p, 20, true, alone);
  ASSERT_TRUE(aloneRun.ok()) << aloneRun.message();
  Status groupRun = trainGroup(p, 20, {}, group);
  ASSERT_TRUE(groupRun.ok()) << groupRun.message();
  expectSameMetrics(group.metrics, alone.metrics);
  expectSameState(group, alone);
  ASSERT_EQ(group.metrics.size(), 20u);
  EXPECT_EQ(group.metrics[3].rankStepMs.size(), 1u);
  EXPECT_EQ(group.metrics[3].rankStepMs[0], group.metrics[3].stepMs);
}

TEST(RuntimeTrainerGroup, NcclWithOneGpuEqualsOneGpu) {
  Problem p;
  // What bind() was given, by every program of the runs.
  struct Bound {
    std::mutex mutex;
    std::vector<DeviceResources> resources;
  };
  auto bound = std::make_shared<Bound>();
  GroupSetup plain, nccl, ncclEager;
  for (GroupSetup *setup : {&plain, &nccl, &ncclEager})
    setup->behaviour.onBind = [bound](const DeviceResources &r) {
      std::lock_guard<std::mutex> lock(bound->mutex);
      bound->resources.push_back(r);
    };
  nccl.nccl = ncclEager.nccl = true;
  ncclEager.graph = false;
  RunResult a, b, c;
  Status plainRun = trainGroup(p, 30, plain, a);
  ASSERT_TRUE(plainRun.ok()) << plainRun.message();
  Status ncclRun = trainGroup(p, 30, nccl, b);
  ASSERT_TRUE(ncclRun.ok()) << ncclRun.message();
  Status eagerRun = trainGroup(p, 30, ncclEager, c);
  ASSERT_TRUE(eagerRun.ok()) << eagerRun.message();
  ASSERT_EQ(bound->resources.size(), 3u);
  EXPECT_EQ(bound->resources[0].allReduceSum, nullptr);
  EXPECT_EQ(bound->resources[0].reduceScatterSum, nullptr);
  EXPECT_EQ(bound->resources[0].allGather, nullptr);
  for (int i : {1, 2}) {
    EXPECT_NE(bound->resources[size_t(i)].allReduceSum, nullptr);
    EXPECT_NE(bound->resources[size_t(i)].reduceScatterSum, nullptr);
    EXPECT_NE(bound->resources[size_t(i)].allGather, nullptr);
    EXPECT_NE(bound->resources[size_t(i)].collectives, nullptr);
    EXPECT_EQ(bound->resources[size_t(i)].rank, 0);
    EXPECT_EQ(bound->resources[size_t(i)].worldSize, 1);
  }
  // The all-reduces of one rank are sums of one term: the same bits.
  expectSameMetrics(b.metrics, a.metrics);
  expectSameState(b, a);
  expectSameMetrics(c.metrics, a.metrics);
  expectSameState(c, a);
  EXPECT_NE(a.metrics.front().loss, a.metrics.back().loss);
}

TEST(RuntimeTrainerGroup, TwoGpusEqualOneGpuWithTwiceTheRows) {
  if (visibleDevices() < 2)
    GTEST_SKIP() << "skipped: needs 2 GPUs";
  Problem p;
  // Pinned anchors: the one-GPU run and the two ranks see the same ones
  // (sampled anchors come from per-rank streams).
  SyntheticRowSource pinned(p.problem, 16, /*pinAnchors=*/true);
  GroupSetup two, twoEager, one;
  two.gpus = twoEager.gpus = {0, 1};
  twoEager.graph = false;
  one.config.rowsPerGpu = 2 * two.config.rowsPerGpu;
  for (GroupSetup *setup : {&two, &twoEager, &one})
    setup->rows = &pinned;
  const int64_t steps = 20; // 5 epochs of 4 global batches
  RunResult a, eager, single;
  std::vector<RunResult> ranks;
  Status twoRun = trainGroup(p, steps, two, a, &ranks);
  ASSERT_TRUE(twoRun.ok()) << twoRun.message();
  Status eagerRun = trainGroup(p, steps, twoEager, eager);
  ASSERT_TRUE(eagerRun.ok()) << eagerRun.message();
  Status singleRun = trainGroup(p, steps, one, single);
  ASSERT_TRUE(singleRun.ok()) << singleRun.message();

  // After the all-reduce every rank applies the same update.
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[0].params, ranks[1].params);
  EXPECT_EQ(ranks[0].state.master, ranks[1].state.master);
  EXPECT_EQ(ranks[0].state.adamM, ranks[1].state.adamM);
  EXPECT_EQ(ranks[0].state.adamV, ranks[1].state.adamV);
  EXPECT_NE(ranks[0].state.rngState, ranks[1].state.rngState);
  // Graph replay and eager steps agree over two GPUs too.
  expectSameMetrics(eager.metrics, a.metrics);
  expectSameState(eager, a);

  // Two GPUs of B rows train like one GPU of 2B rows, up to the order of
  // the float sums.
  ASSERT_EQ(a.metrics.size(), size_t(steps));
  ASSERT_EQ(single.metrics.size(), size_t(steps));
  for (size_t i = 0; i < a.metrics.size(); ++i) {
    std::string at = "step " + std::to_string(i);
    expectClose(a.metrics[i].loss, single.metrics[i].loss, 1e-5, at + " loss");
    expectClose(a.metrics[i].gradNorm, single.metrics[i].gradNorm, 1e-5,
                at + " grad_norm");
    EXPECT_EQ(a.metrics[i].acc, single.metrics[i].acc) << at;
    EXPECT_EQ(a.metrics[i].lr, single.metrics[i].lr) << at;
    ASSERT_EQ(a.metrics[i].rankStepMs.size(), 2u) << at;
    EXPECT_EQ(a.metrics[i].stepMs,
              std::max(a.metrics[i].rankStepMs[0], a.metrics[i].rankStepMs[1]));
  }
  EXPECT_NE(a.metrics.front().loss, a.metrics.back().loss);
  expectCloseTensors(a.state.master, single.state.master, 1e-4, "master");
  expectCloseTensors(a.state.adamM, single.state.adamM, 1e-4, "adam_m");
  EXPECT_EQ(a.state.data.epoch, single.state.data.epoch);
  EXPECT_EQ(a.state.data.row, single.state.data.row);
  // The whole run's tokens: twice the rows of one rank.
  EXPECT_DOUBLE_EQ(a.metrics[5].contextTokensPerS,
                   4.0 * 32 / (a.metrics[5].stepMs / 1e3));
}

TEST(RuntimeTrainerGroup, AFailedRankStopsTheOthers) {
  if (visibleDevices() < 2)
    GTEST_SKIP() << "skipped: needs 2 GPUs";
  Problem p;
  // Rank 1 cannot read the first row of its step 3: no rank starts that
  // step.
  BatchLoader probe(*p.rows, smallConfig(), 5, 1, 2);
  HostBatch batch;
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(probe.next(batch).ok());
  FailingSource failing(*p.rows, batch.rows[0]);
  for (bool graph : {true, false}) {
    GroupSetup setup;
    setup.gpus = {0, 1};
    setup.graph = graph;
    setup.rows = &failing;
    RunResult result;
    Status s = trainGroup(p, 10, setup, result);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.message(),
              "step 3: row " + std::to_string(batch.rows[0]) + ": read failed");
    EXPECT_EQ(result.metrics.size(), 3u);
  }

  // Rank 1 breaks in the middle of step 3 without its all-reduces: rank 0
  // is left waiting in them on the device, and must give up.
  GroupSetup setup;
  setup.gpus = {0, 1};
  setup.graph = false;
  setup.behaviour.failAtEnqueue = 3;
  setup.behaviour.failRank = 1;
  RunResult result;
  auto started = std::chrono::steady_clock::now();
  Status s = trainGroup(p, 10, setup, result);
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
          .count();
  ASSERT_FALSE(s.ok());
  // Rank 1's own error, not rank 0's "another GPU of the run failed".
  EXPECT_EQ(s.message().rfind("step 3: launching the step: ", 0), 0u)
      << s.message();
  EXPECT_EQ(result.metrics.size(), 3u);
  EXPECT_LT(seconds, 60.0);
}
