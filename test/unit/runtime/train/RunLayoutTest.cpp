//===- RunLayoutTest.cpp - The output directory's checkpoints -------------===//
//
// The checkpoint schedule and directories, the best evaluation tau a
// resumed run starts from, `latest` followed to a checkpoint, and the run
// settings a resume reuses (training/trainer_run.json) written and read.
//
//===----------------------------------------------------------------------===//

#include "runtime/train/RunLayout.h"
#include "runtime/train/Progress.h"
#include "test/unit/runtime/RuntimeTestSupport.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::trainhost;
namespace fs = std::filesystem;

TEST(TrainCheckpoints, Schedule) {
  // every 5 steps of a 12-step run: 5, 10 and the last
  std::vector<int64_t> due;
  for (int64_t s = 0; s <= 12; ++s)
    if (checkpointDue(s, 12, 5))
      due.push_back(s);
  EXPECT_EQ(due, (std::vector<int64_t>{5, 10, 12}));
  due.clear();
  for (int64_t s = 0; s <= 12; ++s)
    if (checkpointDue(s, 12, 0))
      due.push_back(s);
  EXPECT_EQ(due, std::vector<int64_t>{12});
  EXPECT_FALSE(checkpointDue(0, 0, 5));
  EXPECT_EQ(checkpointDirectory("out", 250), "out/checkpoint-250");
}

TEST(TrainCheckpoints, BestEvalTauOfAResumedRun) {
  TrainMainTempDir dir;
  double tau = 0;
  bool found = true;
  ASSERT_TRUE(readBestEvalTau(dir.path, tau, found).ok());
  EXPECT_FALSE(found);
  fs::create_directories(dir.path + "/best");
  EvalMetrics e;
  e.tau = 3.5;
  std::ofstream(dir.path + "/best/eval.json") << evalJsonLine(e);
  ASSERT_TRUE(readBestEvalTau(dir.path, tau, found).ok());
  EXPECT_TRUE(found);
  EXPECT_DOUBLE_EQ(tau, 3.5);
  std::ofstream(dir.path + "/best/eval.json") << "{\"eval_loss\": 1}";
  Status s = readBestEvalTau(dir.path, tau, found);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("best/eval.json: has no number 'eval_tau'"),
            std::string::npos)
      << s.message();
}

TEST(TrainCheckpoints, ResolveFollowsLatest) {
  TrainMainTempDir dir;
  writeTrainingCheckpoint(dir.path + "/checkpoint-3", smallConfig(), 3,
                          nullptr);
  std::string ckpt;
  ASSERT_TRUE(resolveCheckpoint(dir.path + "/checkpoint-3", ckpt).ok());
  EXPECT_EQ(ckpt, dir.path + "/checkpoint-3");
  Status s = resolveCheckpoint(dir.path, ckpt);
  EXPECT_NE(s.message().find("neither a training checkpoint"),
            std::string::npos)
      << s.message();
  std::ofstream(dir.path + "/latest") << "checkpoint-3\n";
  ASSERT_TRUE(resolveCheckpoint(dir.path, ckpt).ok());
  EXPECT_EQ(ckpt, dir.path + "/checkpoint-3");
  std::ofstream(dir.path + "/latest") << "checkpoint-4\n";
  s = resolveCheckpoint(dir.path, ckpt);
  EXPECT_NE(s.message().find("names 'checkpoint-4' but"), std::string::npos)
      << s.message();
  std::ofstream(dir.path + "/latest") << "../elsewhere\n";
  s = resolveCheckpoint(dir.path, ckpt);
  EXPECT_NE(s.message().find("does not name a checkpoint"), std::string::npos)
      << s.message();
}

TEST(TrainCheckpoints, RunSettingsRoundTrip) {
  TrainMainTempDir dir;
  RunSettings run;
  run.totalSteps = 1000;
  run.seed = 0xfedcba9876543210ull;
  run.lr = 6e-4;
  run.warmupRatio = 0.04;
  run.data = "/data/shards";
  run.worldSize = 1;
  ASSERT_TRUE(writeRunSettings(dir.path + "/" + kRunSettingsFile, run).ok());
  RunSettings back;
  bool found = false;
  ASSERT_TRUE(readRunSettings(dir.path, back, found).ok());
  ASSERT_TRUE(found);
  EXPECT_EQ(back.totalSteps, 1000);
  EXPECT_EQ(back.seed, run.seed);
  EXPECT_EQ(back.lr, run.lr);
  EXPECT_EQ(back.warmupRatio, run.warmupRatio);
  EXPECT_EQ(back.data, run.data);
  EXPECT_EQ(back.syntheticRows, 0);

  ASSERT_TRUE(readRunSettings(dir.path + "/none", back, found).ok());
  EXPECT_FALSE(found);
  std::ofstream(dir.path + "/" + kRunSettingsFile)
      << "{\"format\": \"dflash-trainer-run\", \"total_steps\": 5}";
  Status s = readRunSettings(dir.path, back, found);
  EXPECT_NE(s.message().find("training/trainer_run.json: 'seed' is missing"),
            std::string::npos)
      << s.message();
  std::ofstream(dir.path + "/" + kRunSettingsFile) << "{not json";
  s = readRunSettings(dir.path, back, found);
  EXPECT_NE(s.message().find("not a json object"), std::string::npos)
      << s.message();
}
