//===- TrainOptionsTest.cpp - train's command line, checked ---------------===//
//
// parseTrainCommandLine with the config's defaults and every option,
// resolveGpus (the drafter and online-target devices), validateTrainOptions
// naming each bad option, and the output directory's lock: a directory that
// a live run holds is refused, to run into or to resume from.
//
//===----------------------------------------------------------------------===//

#include "runtime/cli/TrainOptions.h"
#include "runtime/io/DirectoryLock.h"
#include "runtime/train/RunLayout.h"
#include "runtime/train/TrainerSetup.h"
#include "test/unit/runtime/RuntimeTestSupport.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::trainhost;
namespace fs = std::filesystem;

namespace {

/// Parses and validates; the error message, or "" when both succeed.
std::string validationError(Args args,
                            const ModelConfig &config = smallConfig()) {
  TrainOptions options;
  std::string text;
  if (parse(std::move(args), options, text, config) != CommandLineAction::Train)
    return "parse: " + text;
  Status s = validateTrainOptions(options, config);
  return s.ok() ? std::string() : s.message();
}

} // namespace

//===----------------------------------------------------------------------===//
// Command line
//===----------------------------------------------------------------------===//

TEST(TrainCommandLine, DefaultsComeFromTheConfig) {
  TrainOptions o;
  std::string text;
  ASSERT_EQ(parse({"--data", "synthetic"}, o, text), CommandLineAction::Train)
      << text;
  EXPECT_EQ(o.steps, 50);
  EXPECT_DOUBLE_EQ(o.lr, 3e-3);
  EXPECT_DOUBLE_EQ(o.warmupRatio, 0.04);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(o.rows, 256);
  EXPECT_EQ(o.out, "./dflash-out");
  EXPECT_TRUE(o.gpus.empty()); // every visible device
  EXPECT_FALSE(o.noGraph);
  EXPECT_FALSE(o.nccl);
  EXPECT_FALSE(o.givenLr || o.givenSeed || o.givenTotalSteps ||
               o.givenWarmupRatio || o.givenRows || o.givenEvalServingRows);
  EXPECT_EQ(o.evalServingRows, -1); // defaultServingRows of the seq_len
  ASSERT_EQ(parse({"--data", "synthetic", "--eval-data", "synthetic",
                   "--eval-serving-rows", "0"},
                  o, text),
            CommandLineAction::Train)
      << text;
  EXPECT_EQ(o.evalServingRows, 0);
  EXPECT_TRUE(o.givenEvalServingRows);
}

TEST(TrainCommandLine, EveryOptionIsRead) {
  TrainOptions o;
  std::string text;
  ASSERT_EQ(parse({"--target",
                   "t",
                   "--data",
                   "d",
                   "--steps",
                   "9",
                   "--total-steps",
                   "12",
                   "--lr",
                   "1e-4",
                   "--warmup-ratio",
                   "0.1",
                   "--save-every",
                   "3",
                   "--out",
                   "o",
                   "--resume",
                   "r",
                   "--init",
                   "i",
                   "--seed",
                   "11",
                   "--log",
                   "l.jsonl",
                   "--rows",
                   "5",
                   "--gpus",
                   "2",
                   "--no-graph",
                   "--nccl",
                   "--progress-every",
                   "4",
                   "--max-bad-rows",
                   "2"},
                  o, text),
            CommandLineAction::Train)
      << text;
  EXPECT_EQ(o.target, "t");
  EXPECT_EQ(o.data, "d");
  EXPECT_EQ(o.steps, 9);
  EXPECT_EQ(o.totalSteps, 12);
  EXPECT_DOUBLE_EQ(o.lr, 1e-4);
  EXPECT_DOUBLE_EQ(o.warmupRatio, 0.1);
  EXPECT_EQ(o.saveEvery, 3);
  EXPECT_EQ(o.out, "o");
  EXPECT_EQ(o.resume, "r");
  EXPECT_EQ(o.init, "i");
  EXPECT_EQ(o.seed, 11u);
  EXPECT_EQ(o.log, "l.jsonl");
  EXPECT_EQ(o.rows, 5);
  EXPECT_EQ(o.gpus, std::vector<int>{2});
  EXPECT_TRUE(o.noGraph);
  EXPECT_TRUE(o.nccl);
  EXPECT_EQ(o.progressEvery, 4);
  EXPECT_EQ(o.maxBadRows, 2);
  EXPECT_TRUE(o.givenLr && o.givenSeed && o.givenTotalSteps &&
              o.givenWarmupRatio && o.givenRows);
}

TEST(TrainCommandLine, HelpListsOptionsWithDefaults) {
  TrainOptions o;
  std::string text;
  ASSERT_EQ(parse({"--help"}, o, text), CommandLineAction::ShowHelp);
  for (const char *expected : {"--target",
                               "--data",
                               "--steps",
                               "--total-steps",
                               "--lr",
                               "--warmup-ratio",
                               "--save-every",
                               "--out",
                               "--resume",
                               "--init",
                               "--seed",
                               "--log",
                               "--rows",
                               "--gpus",
                               "--no-graph",
                               "--nccl",
                               "--max-bad-rows",
                               "N=8",
                               "0.003",
                               "0.04",
                               "./dflash-out",
                               "256",
                               "'trainmain'",
                               "SIGINT",
                               "--accumulate",
                               "--random-target-weights",
                               "--eval-serving-rows",
                               "131072 tokens"})
    EXPECT_NE(text.find(expected), std::string::npos) << expected << "\n"
                                                      << text;
}

TEST(TrainCommandLine, StepsAreRequiredWithoutASpecDefault) {
  ModelConfig c = smallConfig();
  c.totalSteps = 0;
  TrainOptions o;
  std::string text;
  EXPECT_EQ(parse({"--data", "synthetic"}, o, text, c),
            CommandLineAction::Fail);
  EXPECT_NE(text.find("--steps is required"), std::string::npos) << text;
}

TEST(TrainCommandLine, BadArgumentsFail) {
  struct Case {
    std::vector<std::string> args;
    const char *message;
  } cases[] = {
      {{"--data", "synthetic", "--bogus"}, "--bogus"},
      {{"--steps", "3"}, "--data is required"},
      {{"--data", "synthetic", "--steps", "three"}, "three"},
      {{"--data", "synthetic", "--gpus", "0,x"}, "'x' is not a device index"},
      {{"--data", "synthetic", "--gpus", ""}, "is not a device index"},
      {{"--data", "synthetic", "extra"}, "extra"},
  };
  for (const Case &c : cases) {
    TrainOptions o;
    std::string text;
    std::vector<const char *> argv = {"train"};
    for (const std::string &a : c.args)
      argv.push_back(a.c_str());
    EXPECT_EQ(parseTrainCommandLine(int(argv.size()), argv.data(),
                                    smallConfig(), o, text),
              CommandLineAction::Fail)
        << c.message;
    EXPECT_NE(text.find(c.message), std::string::npos) << text;
    ASSERT_FALSE(text.empty());
    EXPECT_FALSE(std::isupper((unsigned char)text[0])) << text;
  }
}

TEST(TrainCommandLine, GpuListIsParsed) {
  TrainOptions o;
  std::string text;
  ASSERT_EQ(parse({"--data", "synthetic", "--gpus", "0,3"}, o, text),
            CommandLineAction::Train)
      << text;
  EXPECT_EQ(o.gpus, (std::vector<int>{0, 3}));
}

TEST(TrainCommandLine, GpusDefaultToEveryVisibleDevice) {
  TrainOptions given;
  given.gpus = {2};
  ASSERT_TRUE(resolveGpus(given, 8).ok());
  EXPECT_EQ(given.gpus, std::vector<int>{2});
  // Without a device the host checks still run; the missing device is
  // reported later.
  TrainOptions none;
  ASSERT_TRUE(resolveGpus(none, 0).ok());
  EXPECT_EQ(none.gpus, std::vector<int>{0});
  TrainOptions all;
  Status s = resolveGpus(all, 4);
  if (collectivesAvailable()) {
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(all.gpus, (std::vector<int>{0, 1, 2, 3}));
  } else {
    EXPECT_EQ(s.message(), "4 GPUs are visible but this trainer was built "
                           "without NCCL; train on one with --gpus 0");
  }
}

// The online target's own GPUs: --drafter-gpus is --gpus; without --gpus the
// drafters are the visible devices the target does not take; every target
// device needs a drafter.
TEST(TrainCommandLine, TargetGpusAreParsedAndLeftOutOfTheDrafters) {
  TrainOptions o;
  std::string text;
  ASSERT_EQ(
      parse({"--data", "d", "--target-gpus", "2", "--drafter-gpus", "0,1"}, o,
            text),
      CommandLineAction::Train)
      << text;
  EXPECT_EQ(o.targetGpus, std::vector<int>{2});
  EXPECT_EQ(o.gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(parse({"--data", "d", "--target-gpus", "0,x"}, o, text),
            CommandLineAction::Fail);
  EXPECT_EQ(text, "--target-gpus '0,x': 'x' is not a device index");

  TrainOptions rest;
  rest.targetGpus = {0};
  Status s = resolveGpus(rest, 4);
  if (collectivesAvailable()) {
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(rest.gpus, (std::vector<int>{1, 2, 3}));
  }
  TrainOptions pair;
  pair.targetGpus = {0};
  ASSERT_TRUE(resolveGpus(pair, 2).ok());
  EXPECT_EQ(pair.gpus, std::vector<int>{1});
  TrainOptions alone;
  alone.targetGpus = {0};
  s = resolveGpus(alone, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("none is left for the drafter: give --gpus"),
            std::string::npos)
      << s.message();
  TrainOptions shared; // one GPU in both lists: its own thread and stream
  shared.targetGpus = {0};
  shared.gpus = {0};
  EXPECT_TRUE(resolveGpus(shared, 1).ok());
  EXPECT_EQ(shared.gpus, std::vector<int>{0});
  TrainOptions many;
  many.targetGpus = {0, 1, 2};
  s = resolveGpus(many, 4);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("lists 3 devices but only 1 are left"),
            std::string::npos)
      << s.message();
}

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

TEST(TrainValidation, AcceptsAGoodCommandLine) {
  TrainMainTempDir dir;
  EXPECT_EQ(validationError({"--data", "synthetic", "--out", dir.path + "/o"}),
            "");
  EXPECT_TRUE(fs::is_directory(dir.path + "/o"));
}

TEST(TrainValidation, AccumulateMustBeTheCompiledOne) {
  // The trainer's shapes are static: only the spec's K runs.
  TrainMainTempDir dir;
  ModelConfig c = smallConfig();
  c.gradientAccumulation = 4;
  EXPECT_EQ(validationError({"--data", "synthetic", "--accumulate", "4",
                             "--out", dir.path + "/a"},
                            c),
            "");
  std::string error = validationError(
      {"--data", "synthetic", "--accumulate", "2", "--out", dir.path + "/b"},
      c);
  EXPECT_NE(error.find("--accumulate 2: this trainer was compiled for 4 "
                       "micro-batches of " +
                       std::to_string(c.rowsPerGpu) + " rows"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("gradient_accumulation = 2"), std::string::npos)
      << error;
  EXPECT_NE(validationError({"--data", "synthetic", "--accumulate", "4",
                             "--out", dir.path + "/c"}),
            "");
}

TEST(TrainValidation, NamesTheBadOption) {
  TrainMainTempDir dir;
  std::string out = dir.path + "/out";
  std::string file = dir.path + "/file";
  std::ofstream(file) << "x";
  struct Case {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"--data", "synthetic", "--steps", "0"}, "--steps must be at least 1"},
      {{"--data", "synthetic", "--target-gpus", "0"},
       "--target-gpus runs the online target, which needs token shards"},
      {{"--data", file, "--target-gpus", "1,1"},
       "--target-gpus: device 1 is listed twice"},
      {{"--data", file, "--target-gpus", "1"},
       "--target-gpus needs --target DIR"},
      {{"--data", file, "--target", dir.path, "--target-gpus", "2,3", "--gpus",
        "0"},
       "--target-gpus lists 2 devices for 1 drafter GPUs"},
      {{"--data", "synthetic", "--random-target-weights"},
       "--random-target-weights stands in for an online target's weights, "
       "which need token shards"},
      {{"--data", dir.path, "--target", dir.path, "--random-target-weights"},
       "--random-target-weights reads no weights: leave out --target"},
      {{"--data", "synthetic", "--max-bad-rows", "-1"},
       "--max-bad-rows must be at least 0"},
      {{"--data", "synthetic", "--total-steps", "10", "--steps", "20"},
       "--total-steps (10) is smaller than --steps (20)"},
      {{"--data", "synthetic", "--save-every", "-1"},
       "--save-every must not be negative"},
      {{"--data", "synthetic", "--rows", "0"}, "--rows must be at least 1"},
      {{"--data", "synthetic", "--lr", "0"}, "--lr must be a positive number"},
      {{"--data", "synthetic", "--warmup-ratio", "1"},
       "--warmup-ratio must be in [0, 1)"},
      {{"--data", "synthetic", "--gpus", "0,2,0"},
       "--gpus: device 0 is listed twice"},
      {{"--data", dir.path + "/missing", "--target", dir.path},
       "--data " + dir.path + "/missing: no such file or directory"},
      {{"--data", dir.path}, "needs --target DIR"},
      {{"--data", dir.path, "--target", dir.path, "--rows", "4"},
       "--rows applies only to --data synthetic"},
      {{"--data", "synthetic", "--target", dir.path + "/nothing"},
       "--target " + dir.path + "/nothing: no such directory"},
      {{"--data", "synthetic", "--target", file},
       "--target " + file + ": not a directory"},
      {{"--data", "synthetic", "--init", dir.path, "--resume", dir.path},
       "--init and --resume exclude each other"},
      {{"--data", "synthetic", "--resume", dir.path + "/none"},
       "--resume " + dir.path + "/none: no such directory"},
      {{"--data", "synthetic", "--out", ""}, "--out is empty"},
      {{"--data", "synthetic", "--out", file},
       "--out " + file + ": exists and is not a directory"},
      {{"--data", "synthetic", "--out", file + "/sub"},
       "--out " + file + "/sub: cannot create the directory"},
      {{"--data", "synthetic", "--out", out, "--log",
        dir.path + "/no/such/metrics.jsonl"},
       "does not exist"},
      {{"--data", "synthetic", "--eval-every", "10"},
       "--eval-every needs --eval-data"},
      {{"--data", "synthetic", "--eval-data", "synthetic", "--eval-every",
        "-1"},
       "--eval-every must not be negative"},
      {{"--data", "synthetic", "--eval-data", "synthetic", "--eval-rows", "0"},
       "--eval-rows must be at least 1"},
      {{"--data", "synthetic", "--eval-serving-rows", "4"},
       "--eval-serving-rows needs --eval-data"},
      {{"--data", "synthetic", "--eval-data", "synthetic",
        "--eval-serving-rows", "-2"},
       "--eval-serving-rows must not be negative"},
      {{"--data", dir.path, "--target", dir.path, "--eval-data", dir.path,
        "--eval-rows", "4"},
       "--eval-rows applies only to --eval-data synthetic"},
      {{"--data", "synthetic", "--eval-data", dir.path + "/missing"},
       "--eval-data " + dir.path + "/missing: no such file or directory"},
      {{"--data", "synthetic", "--eval-data", dir.path},
       "holds feature shards but --data is synthetic"},
      {{"--data", dir.path, "--target", dir.path, "--eval-data", "synthetic"},
       "--eval-data synthetic evaluates the synthetic problem"},
      {{"--data", "synthetic", "--eval-only"}, "--eval-only needs --eval-data"},
      {{"--data", "synthetic", "--eval-data", "synthetic", "--eval-only",
        "--steps", "5"},
       "--eval-only trains nothing: leave --steps out"},
      {{"--data", "synthetic", "--eval-data", "synthetic", "--eval-only",
        "--save-every", "5"},
       "--eval-only evaluates once and saves nothing"},
      {{"--data", "synthetic", "--steps", "5", "--no-save", "--save-every",
        "5"},
       "--no-save writes no checkpoint: leave --save-every out"},
      {{"--data", "synthetic", "--steps", "5", "--no-save", "--eval-data",
        "synthetic"},
       "--no-save exports no best drafter: leave --eval-data out"},
      {{"--data", "synthetic", "--eval-data", "synthetic", "--eval-only",
        "--no-save"},
       "--eval-only saves nothing anyway: leave --no-save out"},
  };
  for (const Case &c : cases) {
    std::vector<std::string> args = c.args;
    bool hasOut = false;
    for (const std::string &a : args)
      hasOut |= a == "--out";
    if (!hasOut) {
      args.push_back("--out");
      args.push_back(out);
    }
    TrainOptions o;
    std::string text;
    std::vector<const char *> argv = {"train"};
    for (const std::string &a : args)
      argv.push_back(a.c_str());
    ASSERT_EQ(parseTrainCommandLine(int(argv.size()), argv.data(),
                                    smallConfig(), o, text),
              CommandLineAction::Train)
        << text;
    Status s = validateTrainOptions(o, smallConfig());
    ASSERT_FALSE(s.ok()) << c.message;
    EXPECT_NE(s.message().find(c.message), std::string::npos)
        << s.message() << "\nexpected: " << c.message;
  }
}

// --eval-only reads a finished run's weights without training: the run's
// directory may hold checkpoints, and no --steps is needed even where the
// spec sets no total_steps.
TEST(TrainValidation, EvalOnlyNeedsNoStepsAndMayLookAtAFinishedRun) {
  TrainMainTempDir dir;
  std::ofstream(dir.path + "/latest") << "checkpoint-5\n";
  EXPECT_EQ(validationError({"--data", "synthetic", "--eval-data", "synthetic",
                             "--eval-only", "--out", dir.path}),
            "");
  ModelConfig c = smallConfig();
  c.totalSteps = 0;
  TrainOptions o;
  std::string text;
  EXPECT_EQ(
      parse({"--data", "synthetic", "--eval-data", "synthetic", "--eval-only"},
            o, text, c),
      CommandLineAction::Train)
      << text;
  EXPECT_TRUE(o.evalOnly);
  EXPECT_FALSE(o.givenSteps);
}

TEST(TrainValidation, RefusesToOverwriteAnotherRun) {
  TrainMainTempDir dir;
  std::ofstream(dir.path + "/latest") << "checkpoint-5\n";
  std::string error =
      validationError({"--data", "synthetic", "--out", dir.path});
  EXPECT_NE(error.find("already holds a run"), std::string::npos) << error;
  EXPECT_NE(error.find("--resume " + dir.path), std::string::npos) << error;
}

// A live run that has written a checkpoint is named, not taken for a
// finished one to resume (seen on the H200: the second run was told to
// --resume a directory that the first still held).
TEST(TrainValidation, NamesTheLiveRunOfADirectoryWithCheckpoints) {
  TrainMainTempDir dir;
  std::ofstream(dir.path + "/latest") << "checkpoint-5\n";
  pid_t holder = holdDirectoryLockInChild(dir.path);
  ASSERT_GT(holder, 0);
  std::string error =
      validationError({"--data", "synthetic", "--out", dir.path});
  killAndReap(holder);
  EXPECT_NE(error.find("is in use by another train run"), std::string::npos)
      << error;
  EXPECT_NE(error.find("process " + std::to_string(holder)), std::string::npos)
      << error;
  // Once it has ended, the directory is a finished run again.
  error = validationError({"--data", "synthetic", "--out", dir.path});
  EXPECT_NE(error.find("already holds a run"), std::string::npos) << error;
}

//===----------------------------------------------------------------------===//
// The output directory's lock
//===----------------------------------------------------------------------===//

// A --resume of a directory that a live run holds is refused, whether into
// that directory or elsewhere.
TEST(TrainMain, ResumeOfALiveRunsDirectoryIsRefused) {
  TrainMainTempDir dir;
  const ModelConfig c = smallConfig();
  RunSettings run;
  run.totalSteps = 10;
  writeTrainingCheckpoint(dir.path + "/live/checkpoint-4", c, 4, &run);
  std::ofstream(dir.path + "/live/" + kLatestFile) << "checkpoint-4\n";
  pid_t live = holdDirectoryLockInChild(dir.path + "/live");
  ASSERT_GT(live, 0);
  for (const std::string &source :
       {dir.path + "/live", dir.path + "/live/checkpoint-4"}) {
    for (const std::string &into : {dir.path + "/live", dir.path + "/other"}) {
      TrainOptions o;
      o.resume = source;
      o.out = into;
      std::filesystem::create_directories(into);
      DirectoryLock lock;
      Status s = lockOutputDirectory(o, lock);
      ASSERT_FALSE(s.ok()) << source << " -> " << into;
      EXPECT_NE(s.message().find("' is in use by another train run (process " +
                                 std::to_string(live) + " on "),
                std::string::npos)
          << s.message();
    }
  }
  killAndReap(live);
  TrainOptions o;
  o.resume = dir.path + "/live";
  o.out = dir.path + "/live";
  DirectoryLock lock;
  Status s = lockOutputDirectory(o, lock);
  EXPECT_TRUE(s.ok()) << s.message();
}
