//===- TrainerGpuTest.cpp - One trainer on a GPU --------------------------===//
//
// The Trainer around the hand-written step (FakeStepPrograms.h), directly and
// through trainMain: graph replay equals eager execution bit for bit; a
// checkpoint resumed continues exactly like an uninterrupted run; a
// non-finite loss stops the run without touching the last checkpoint; SIGINT
// saves and exits with 130; two trainers on two threads of one GPU capture
// (one of them while the other allocates and synchronises) and replay their
// own graphs with the results of a single thread; the NCCL path on one GPU
// (--nccl) equals the one-GPU path bit for bit; with two GPUs (skipped with
// fewer) a data-parallel run resumes exactly, every rank's anchor stream
// included.
//
//===----------------------------------------------------------------------===//

#include "runtime/device/DeviceContext.h"
#include "runtime/train/Trainer.h"
#include "test/gpu/runtime/FakeStepPrograms.h"
#include "test/gpu/runtime/TrainerRuns.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <condition_variable>
#include <csignal>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::gpu;
namespace fs = std::filesystem;

TEST(RuntimeTrainer, GraphReplayEqualsEager) {
  Problem p;
  RunResult graph, eager;
  Status graphRun = trainDirect(p, 30, /*graph=*/true, graph);
  ASSERT_TRUE(graphRun.ok()) << graphRun.message();
  Status eagerRun = trainDirect(p, 30, /*graph=*/false, eager);
  ASSERT_TRUE(eagerRun.ok()) << eagerRun.message();
  ASSERT_EQ(graph.metrics.size(), 30u);
  expectSameMetrics(graph.metrics, eager.metrics);
  expectSameState(graph, eager);
  // The step did something: the loss moved and the lr followed the counter.
  EXPECT_NE(graph.metrics.front().loss, graph.metrics.back().loss);
  EXPECT_FLOAT_EQ(float(graph.metrics[9].lr), 1e-2f * 10 / 30);
  EXPECT_GT(graph.metrics[3].stepMs, 0);
  EXPECT_GT(graph.metrics[3].contextTokensPerS, 0);
  EXPECT_EQ(graph.state.step, 30);
}

TEST(RuntimeTrainer, ResumeContinuesExactly) {
  TrainerTempDir dir;
  std::string whole = dir.path + "/whole", split = dir.path + "/split";
  std::string err;
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--rows", "10", "--steps",
                          "20", "--out", whole},
                         err),
            0)
      << err;
  EXPECT_EQ(readFile(whole + "/latest"), "checkpoint-20\n");
  ASSERT_TRUE(fs::exists(whole + "/final/model.safetensors"));

  // The same run in two parts: 10 steps of a 20-step schedule, then resumed
  // from the output directory.
  ASSERT_EQ(
      runTrainMain({"--data", "synthetic", "--rows", "10", "--steps", "10",
                    "--total-steps", "20", "--save-every", "5", "--out", split},
                   err),
      0)
      << err;
  EXPECT_TRUE(fs::exists(split + "/checkpoint-5/training/state.safetensors"));
  EXPECT_EQ(readFile(split + "/latest"), "checkpoint-10\n");
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--steps", "20", "--resume",
                          split, "--out", split},
                         err),
            0)
      << err;
  EXPECT_NE(err.find("resuming " + split + "/checkpoint-10 at step 10"),
            std::string::npos)
      << err;

  auto expected = readMetricsLog(whole + "/metrics.jsonl");
  auto resumed = readMetricsLog(split + "/metrics.jsonl");
  ASSERT_EQ(expected.size(), 20u);
  ASSERT_EQ(resumed.size(), 20u);
  for (const auto &[step, values] : expected)
    EXPECT_EQ(resumed[step], values) << "step " << step;
  // Same bits in the exported drafter and in the last training state.
  EXPECT_EQ(readFile(split + "/final/model.safetensors"),
            readFile(whole + "/final/model.safetensors"));
  EXPECT_EQ(readFile(split + "/checkpoint-20/training/state.safetensors"),
            readFile(whole + "/checkpoint-20/training/state.safetensors"));
}

TEST(RuntimeTrainer, NonFiniteLossKeepsTheLastCheckpoint) {
  TrainerTempDir dir;
  std::string out = dir.path + "/out";
  std::string err;
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--rows", "10", "--steps",
                          "10", "--total-steps", "20", "--out", out},
                         err),
            0)
      << err;
  std::string state =
      readFile(out + "/checkpoint-10/training/state.safetensors");
  std::string model = readFile(out + "/final/model.safetensors");
  ASSERT_FALSE(state.empty());

  FakeBehaviour nan;
  nan.nanStep = 12;
  int code = runTrainMain({"--data", "synthetic", "--steps", "20",
                           "--save-every", "1", "--resume", out, "--out", out},
                          err, nan);
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find("train: error: step 12: the loss is nan"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("the last checkpoint is " + out + "/checkpoint-12"),
            std::string::npos)
      << err;
  // Steps 10 and 11 were good and saved; step 12 was not, nor anything after.
  EXPECT_TRUE(fs::exists(out + "/checkpoint-12"));
  EXPECT_FALSE(fs::exists(out + "/checkpoint-13"));
  EXPECT_EQ(readFile(out + "/latest"), "checkpoint-12\n");
  EXPECT_EQ(readFile(out + "/checkpoint-10/training/state.safetensors"), state);
  EXPECT_EQ(readFile(out + "/final/model.safetensors"), model);
  TrainingState saved;
  ASSERT_TRUE(
      loadTrainingState(out + "/checkpoint-12", smallConfig(), saved).ok());
  EXPECT_EQ(saved.step, 12);
  for (const std::vector<float> &master : saved.master)
    for (float v : master)
      ASSERT_TRUE(std::isfinite(v));
  // The bad step is in the log, as null.
  auto log = readMetricsLog(out + "/metrics.jsonl");
  ASSERT_EQ(log.size(), 13u);
  EXPECT_TRUE(std::isnan(log[12][0]));
}

TEST(RuntimeTrainer, InterruptSavesAndExits) {
  TrainerTempDir dir;
  std::string out = dir.path + "/out";
  FakeBehaviour interrupt;
  interrupt.signalAtEnqueue = 3; // during the fourth step, run eagerly
  std::string err;
  int code = runTrainMain({"--data", "synthetic", "--rows", "10", "--steps",
                           "20", "--no-graph", "--out", out},
                          err, interrupt);
  EXPECT_EQ(code, 128 + SIGINT);
  EXPECT_NE(err.find("train: error: stopped by SIGINT after step 4; the last "
                     "checkpoint is " +
                     out + "/checkpoint-4"),
            std::string::npos)
      << err;
  EXPECT_EQ(readFile(out + "/latest"), "checkpoint-4\n");
  EXPECT_FALSE(fs::exists(out + "/final"));
  // It resumes from there.
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--steps", "6", "--resume",
                          out, "--out", out},
                         err),
            0)
      << err;
  EXPECT_EQ(readFile(out + "/latest"), "checkpoint-6\n");
}

TEST(RuntimeTrainer, TwoThreadsCaptureAndReplayTheirOwnGraphs) {
  Problem p;
  const int64_t steps = 100;
  RunResult single;
  Status s = trainDirect(p, steps, true, single);
  ASSERT_TRUE(s.ok()) << s.message();

  // Thread A captures its step while thread B creates its context,
  // allocates and uploads (calls a global-mode capture would refuse); then
  // B captures its own graph and both replay concurrently.
  std::mutex mutex;
  std::condition_variable changed;
  bool aCapturing = false, bReady = false;
  auto waitFor = [&](bool &flag) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, std::chrono::seconds(20),
                            [&] { return flag; });
  };
  auto set = [&](bool &flag) {
    std::lock_guard<std::mutex> lock(mutex);
    flag = true;
    changed.notify_all();
  };
  // Status is [[nodiscard]]: keep the threads' results in a plain struct.
  struct ThreadResult {
    Status status;
  } resultA, resultB;
  RunResult a, b;
  bool overlapped = false;
  FakeBehaviour captureA;
  captureA.whileCapturing = [&] {
    set(aCapturing);
    overlapped = waitFor(bReady);
  };
  std::thread threadA(
      [&] { resultA = {trainDirect(p, steps, true, a, captureA)}; });
  std::thread threadB([&] {
    resultB = {trainDirect(
        p, steps, true, b, {}, [&] { waitFor(aCapturing); },
        [&] { set(bReady); })};
  });
  threadA.join();
  threadB.join();
  ASSERT_TRUE(resultA.status.ok()) << resultA.status.message();
  ASSERT_TRUE(resultB.status.ok()) << resultB.status.message();
  EXPECT_TRUE(overlapped);
  expectSameMetrics(a.metrics, single.metrics);
  expectSameMetrics(b.metrics, single.metrics);
  expectSameState(a, single);
  expectSameState(b, single);
}

TEST(RuntimeTrainer, NcclFlagGivesTheSameRun) {
  TrainerTempDir dir;
  std::string plain = dir.path + "/plain", nccl = dir.path + "/nccl";
  std::string err;
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--rows", "10", "--steps",
                          "12", "--out", plain},
                         err),
            0)
      << err;
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--rows", "10", "--steps",
                          "12", "--nccl", "--out", nccl},
                         err),
            0)
      << err;
  EXPECT_NE(err.find("data parallel over 1 GPU with NCCL"), std::string::npos)
      << err;
  auto expected = readMetricsLog(plain + "/metrics.jsonl");
  auto got = readMetricsLog(nccl + "/metrics.jsonl");
  ASSERT_EQ(expected.size(), 12u);
  for (const auto &[step, values] : expected)
    EXPECT_EQ(got[step], values) << "step " << step;
  EXPECT_EQ(readFile(nccl + "/final/model.safetensors"),
            readFile(plain + "/final/model.safetensors"));
  EXPECT_EQ(readFile(nccl + "/checkpoint-12/training/state.safetensors"),
            readFile(plain + "/checkpoint-12/training/state.safetensors"));
}

TEST(RuntimeTrainer, DataParallelResumeContinuesExactly) {
  if (visibleDevices() < 2)
    GTEST_SKIP() << "skipped: needs 2 GPUs";
  TrainerTempDir dir;
  std::string whole = dir.path + "/whole", split = dir.path + "/split";
  std::string err;
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--rows", "12", "--steps",
                          "16", "--gpus", "0,1", "--out", whole},
                         err),
            0)
      << err;
  EXPECT_NE(err.find("data parallel over 2 GPUs with NCCL: 4 rows per step"),
            std::string::npos)
      << err;
  ASSERT_EQ(
      runTrainMain({"--data", "synthetic", "--rows", "12", "--steps", "8",
                    "--total-steps", "16", "--gpus", "0,1", "--out", split},
                   err),
      0)
      << err;
  // Every rank's anchor stream is in the checkpoint.
  TrainingState saved;
  ASSERT_TRUE(
      loadTrainingState(split + "/checkpoint-8", smallConfig(), saved).ok());
  EXPECT_EQ(saved.worldSize(), 2);
  // Resuming needs the same number of GPUs.
  EXPECT_EQ(runTrainMain({"--data", "synthetic", "--steps", "16", "--resume",
                          split, "--gpus", "0", "--out", split},
                         err),
            1);
  EXPECT_NE(err.find("resume on the same number of GPUs"), std::string::npos)
      << err;
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--steps", "16", "--resume",
                          split, "--gpus", "0,1", "--out", split},
                         err),
            0)
      << err;
  auto expected = readMetricsLog(whole + "/metrics.jsonl");
  auto resumed = readMetricsLog(split + "/metrics.jsonl");
  ASSERT_EQ(expected.size(), 16u);
  ASSERT_EQ(resumed.size(), 16u);
  for (const auto &[step, values] : expected)
    EXPECT_EQ(resumed[step], values) << "step " << step;
  EXPECT_EQ(readFile(split + "/final/model.safetensors"),
            readFile(whole + "/final/model.safetensors"));
  EXPECT_EQ(readFile(split + "/checkpoint-16/training/state.safetensors"),
            readFile(whole + "/checkpoint-16/training/state.safetensors"));
  // Every line lists both ranks' times.
  std::ifstream in(whole + "/metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  nlohmann::json first = nlohmann::json::parse(line);
  ASSERT_TRUE(first["rank_step_ms"].is_array());
  EXPECT_EQ(first["rank_step_ms"].size(), 2u);
}
