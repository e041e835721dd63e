//===- TrainMainTest.cpp - The trainer's host side, without a GPU ---------===//
//
// Command line parsing and validation, host-side preparation (data, target,
// resume), metrics formatting, the progress line, checkpoint layout and
// schedule, the step buffer map and the prefetch thread. A fake StepProgram
// provides config() and buffers(); nothing here needs a GPU, and the one
// test that would reach the GPU checks the "no device" error and is skipped
// where a device exists.
//
//===----------------------------------------------------------------------===//

#include "runtime/cli/TrainMain.h"
#include "runtime/cli/PrepareRun.h"
#include "runtime/cli/TargetFeaturesMain.h"
#include "runtime/cli/TrainOptions.h"
#include "runtime/data/InitialParameters.h"
#include "runtime/data/Prefetch.h"
#include "runtime/device/Collectives.h"
#include "runtime/device/DeviceContext.h"
#include "runtime/device/StepBuffers.h"
#include "runtime/io/Safetensors.h"
#include "runtime/train/Progress.h"
#include "runtime/train/RunLayout.h"
#include "runtime/train/Trainer.h"
#include "runtime/train/TrainerGroup.h"
#include "schema/Parameters.h"
#include "test/unit/runtime/RuntimeTestSupport.h"
#include "test/unit/runtime/StepProgramTestSupport.h"
#include "tools/dflash-synth/SyntheticFiles.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <sys/wait.h>

#include <csignal>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
namespace fs = std::filesystem;

namespace {

ModelConfig smallConfig() {
  ModelConfig c = oneLayerDrafterConfig();
  c.name = "trainmain";
  c.seed = 7;
  c.lr = 3e-3;
  c.warmupRatio = 0.04;
  c.totalSteps = 50;
  return c;
}

/// A program with a config and buffers but no kernels.
class FakeProgram : public StepProgram {
public:
  FakeProgram(ModelConfig c, std::vector<BufferSpec> specs)
      : cfg(std::move(c)), specs(std::move(specs)) {}
  const ModelConfig &config() const override { return cfg; }
  const std::vector<BufferSpec> &buffers() const override { return specs; }
  size_t arenaBytes() const override { return 1024; }
  size_t gemmWorkspaceBytes() const override { return 0; }
  double flopsPerStep() const override { return 1e9; }
  Status bind(const std::vector<void *> &, void *, const DeviceResources &,
              const StepHyper &) override {
    return Status::success();
  }
  Status enqueue(cudaStream_t) override { return Status::success(); }

private:
  ModelConfig cfg;
  std::vector<BufferSpec> specs;
};

/// A step program's buffers; its optimizer state sharded as `shards` when
/// given.
class FakeStepProgram : public FakeProgram {
public:
  explicit FakeStepProgram(
      ModelConfig c, std::optional<OptimizerShardLayout> shards = std::nullopt)
      : FakeProgram(c,
                    shards ? shardedStepBuffers(c, *shards) : stepBuffers(c)),
        shards(std::move(shards)) {}
  const OptimizerShardLayout *optimizerShards() const override {
    return shards ? &*shards : nullptr;
  }

private:
  std::optional<OptimizerShardLayout> shards;
};

std::unique_ptr<StepProgram> fakeFactory() {
  return std::make_unique<FakeStepProgram>(smallConfig());
}

/// An online target program's buffers (createTargetProgram's kind): tokens
/// in, the checkpoint's embedding (and `extraTensor`, when given) frozen,
/// target_hidden out.
std::unique_ptr<StepProgram> fakeTarget(const std::string &extraTensor) {
  const ModelConfig c = smallConfig();
  const int64_t B = c.rowsPerGpu, S = c.seqLen;
  std::vector<BufferSpec> specs = {
      {"input_ids", BufferRole::Input, DType::I32, {B, S}, 0},
      {"position_ids", BufferRole::Input, DType::I32, {B, S}, 5},
      {"model.embed_tokens.weight",
       BufferRole::Frozen,
       DType::BF16,
       {c.vocabSize, c.hiddenSize},
       -1}};
  if (!extraTensor.empty())
    specs.push_back(
        {extraTensor, BufferRole::Frozen, DType::BF16, {c.hiddenSize}, -1});
  specs.push_back({"target_hidden",
                   BufferRole::Input,
                   DType::BF16,
                   {B, S, c.contextWidth()},
                   2});
  return std::make_unique<FakeProgram>(c, std::move(specs));
}

std::unique_ptr<StepProgram> fakeTargetFactory() { return fakeTarget(""); }
std::unique_ptr<StepProgram> fakeTargetNeedingMore() {
  return fakeTarget("model.norm.weight");
}
std::unique_ptr<StepProgram> noTarget() { return nullptr; }

/// Named after this binary, like the run directories it holds.
struct TrainMainTempDir : TempDir {
  TrainMainTempDir() : TempDir("dflash-trainmain") {}
};

/// argv for the parser; the strings live in the vector.
class Args {
public:
  Args(std::initializer_list<std::string> items) : strings(items) {
    strings.insert(strings.begin(), "train");
    for (std::string &s : strings)
      pointers.push_back(s.data());
    pointers.push_back(nullptr);
  }
  int argc() const { return int(strings.size()); }
  char **argv() { return pointers.data(); }

private:
  std::vector<std::string> strings;
  std::vector<char *> pointers;
};

CommandLineAction parse(Args args, TrainOptions &options, std::string &text,
                        const ModelConfig &config = smallConfig()) {
  return parseTrainCommandLine(args.argc(), args.argv(), config, options, text);
}

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

/// Runs trainMain, capturing stdout and stderr.
int runTrainMain(Args args, std::string &out, std::string &err) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  int code = trainMain(args.argc(), args.argv(), &fakeFactory);
  out = testing::internal::GetCapturedStdout();
  err = testing::internal::GetCapturedStderr();
  return code;
}

/// Runs targetFeaturesMain, capturing stderr.
int runTargetFeatures(Args args, std::unique_ptr<StepProgram> (*factory)(),
                      std::string &err) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  int code = targetFeaturesMain(args.argc(), args.argv(), factory);
  (void)testing::internal::GetCapturedStdout();
  err = testing::internal::GetCapturedStderr();
  return code;
}

/// Saves a small training checkpoint of `config` at `step` the way the
/// trainer does (model, state, run settings), for resume tests; the state
/// holds the anchor Rng of `ranks` ranks.
void writeTrainingCheckpoint(const std::string &dir, const ModelConfig &config,
                             int64_t step, const RunSettings *run,
                             int64_t ranks = 1) {
  std::vector<std::vector<uint16_t>> params = initialParameters(config, 1);
  TrainingState state;
  std::vector<const uint16_t *> pointers;
  for (const auto &p : params) {
    pointers.push_back(p.data());
    state.master.emplace_back(p.size(), 0.5f);
    state.adamM.emplace_back(p.size(), 0.0f);
    state.adamV.emplace_back(p.size(), 0.0f);
  }
  state.step = step;
  state.rngState = Rng(3).state();
  for (int64_t r = 1; r < ranks; ++r)
    state.otherRankRngStates.push_back(Rng(uint64_t(3 + r)).state());
  state.data = {0, 4};
  ASSERT_TRUE(saveTrainingCheckpoint(dir, config, pointers, state.ref()).ok());
  if (run) {
    ASSERT_TRUE(writeRunSettings(dir + "/" + kRunSettingsFile, *run).ok());
  }
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
               o.givenWarmupRatio || o.givenRows);
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
  for (const char *expected :
       {"--target",      "--data",         "--steps",
        "--total-steps", "--lr",           "--warmup-ratio",
        "--save-every",  "--out",          "--resume",
        "--init",        "--seed",         "--log",
        "--rows",        "--gpus",         "--no-graph",
        "--nccl",        "--max-bad-rows", "N=8",
        "0.003",         "0.04",           "./dflash-out",
        "256",           "'trainmain'",    "SIGINT"})
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
      {{"--data", dir.path, "--target", dir.path, "--eval-data", dir.path,
        "--eval-rows", "4"},
       "--eval-rows applies only to --eval-data synthetic"},
      {{"--data", "synthetic", "--eval-data", dir.path + "/missing"},
       "--eval-data " + dir.path + "/missing: no such file or directory"},
      {{"--data", "synthetic", "--eval-data", dir.path},
       "holds feature shards but --data is synthetic"},
      {{"--data", dir.path, "--target", dir.path, "--eval-data", "synthetic"},
       "--eval-data synthetic evaluates the synthetic problem"},
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
// Host-side preparation
//===----------------------------------------------------------------------===//

namespace {
Status prepare(Args args, PreparedRun &run,
               const ModelConfig &config = smallConfig(),
               const std::vector<BufferSpec> *onlineTarget = nullptr) {
  TrainOptions options;
  std::string text;
  if (parse(std::move(args), options, text, config) != CommandLineAction::Train)
    return Status::error("parse: " + text);
  if (Status s = validateTrainOptions(options, config); !s.ok())
    return s;
  // As trainMain does, on a machine with one GPU.
  if (Status s = resolveGpus(options, 1); !s.ok())
    return s;
  return prepareRun(options, config, run, 0, 1, onlineTarget);
}

/// Rewrites the feature shard `path` as a token shard (its tensors and
/// metadata without hidden_states).
Status dropFeatures(const std::string &path) {
  std::vector<TensorData> kept;
  std::vector<std::vector<uint8_t>> bytes;
  std::map<std::string, std::string> metadata;
  {
    SafetensorsFile in; // unmapped before the file is replaced
    if (Status s = in.open(path); !s.ok())
      return s;
    for (const TensorView &v : in.tensors())
      if (v.name != "hidden_states") {
        bytes.emplace_back(v.data, v.data + v.byteSize);
        kept.push_back({v.name, v.dtype, v.shape, nullptr});
      }
    metadata = in.metadata();
  }
  for (size_t k = 0; k < kept.size(); ++k)
    kept[k].data = bytes[k].data();
  return writeSafetensors(path, kept, metadata);
}
} // namespace

TEST(TrainPrepare, SyntheticFreshRun) {
  TrainMainTempDir dir;
  PreparedRun run;
  Status s =
      prepare({"--data", "synthetic", "--steps", "20", "--rows", "9", "--out",
               dir.path, "--save-every", "5", "--no-graph", "--no-gemm-timing"},
              run);
  ASSERT_TRUE(s.ok()) << s.message();
  ModelConfig c = smallConfig();
  ASSERT_TRUE(run.synthetic);
  EXPECT_EQ(run.inputs.target, &run.synthetic->target());
  EXPECT_EQ(run.inputs.rows->numRows(), 9);
  EXPECT_EQ(run.inputs.params, run.synthetic->initialParameters());
  EXPECT_FALSE(run.inputs.resume);
  EXPECT_EQ(run.trainer.finalStep, 20);
  EXPECT_EQ(run.trainer.run.totalSteps, 20);
  EXPECT_EQ(run.trainer.run.seed, 7u);
  EXPECT_EQ(run.trainer.run.data, "synthetic");
  EXPECT_EQ(run.trainer.run.syntheticRows, 9);
  EXPECT_EQ(run.trainer.saveEvery, 5);
  EXPECT_FALSE(run.trainer.useGraph);
  EXPECT_FALSE(run.trainer.timeGemms);
  EXPECT_EQ(run.trainer.outDir, dir.path);
  EXPECT_EQ(run.logPath, dir.path + "/metrics.jsonl");
}

// Held-out synthetic rows are rows training never reads: those past the
// training set's.
TEST(TrainPrepare, SyntheticHeldOutRows) {
  TrainMainTempDir dir;
  PreparedRun run;
  Status s = prepare({"--data", "synthetic", "--steps", "20", "--rows", "9",
                      "--out", dir.path, "--eval-data", "synthetic",
                      "--eval-rows", "5", "--eval-every", "4"},
                     run);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_TRUE(run.inputs.evalRows);
  EXPECT_EQ(run.inputs.evalRows->numRows(), 5);
  EXPECT_EQ(run.trainer.evalEvery, 4);
  EXPECT_TRUE(run.trainer.useGraph);
  EXPECT_TRUE(run.trainer.timeGemms); // by default
  ModelConfig c = smallConfig();
  const size_t S = size_t(c.seqLen), W = size_t(c.contextWidth());
  std::vector<int32_t> ids(S), expectedIds(S), positions(S);
  std::vector<uint8_t> mask(S), expectedMask(S);
  std::vector<uint16_t> hidden(S * W), expectedHidden(S * W);
  RowBuffers out;
  out.inputIds = ids.data();
  out.lossMask = mask.data();
  out.hiddenStates = hidden.data();
  out.positionIds = positions.data();
  ASSERT_TRUE(run.inputs.evalRows->readRow(2, out).ok());
  run.synthetic->generateRow(9 + 2, expectedIds.data(), expectedMask.data(),
                             expectedHidden.data());
  EXPECT_EQ(ids, expectedIds);
  EXPECT_EQ(hidden, expectedHidden);
  // Without --eval-data nothing is held out.
  PreparedRun plain;
  ASSERT_TRUE(
      prepare({"--data", "synthetic", "--out", dir.path + "/b"}, plain).ok());
  EXPECT_EQ(plain.inputs.evalRows, nullptr);
}

TEST(TrainPrepare, TooFewRowsForOneStep) {
  TrainMainTempDir dir;
  PreparedRun run;
  Status s =
      prepare({"--data", "synthetic", "--rows", "1", "--out", dir.path}, run);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("one step needs 2"), std::string::npos)
      << s.message();
}

TEST(TrainPrepare, ShardsAndTargetFromDisk) {
  TrainMainTempDir dir;
  ModelConfig c = smallConfig();
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(c, 7).ok());
  ASSERT_TRUE(writeSyntheticTarget(dir.path + "/target", problem).ok());
  ASSERT_TRUE(
      writeSyntheticShards(dir.path + "/data", problem, 6, 4, false).ok());
  ASSERT_TRUE(writeSyntheticInit(dir.path + "/init", problem).ok());
  PreparedRun run;
  Status s = prepare({"--data", dir.path + "/data", "--target",
                      dir.path + "/target", "--init", dir.path + "/init",
                      "--out", dir.path + "/out", "--steps", "4"},
                     run);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_FALSE(run.synthetic);
  EXPECT_EQ(run.inputs.target, &run.loadedTarget);
  EXPECT_EQ(run.loadedTarget.embed, problem.target().embed);
  EXPECT_EQ(run.inputs.params, problem.initialParameters());
  EXPECT_EQ(run.trainer.run.syntheticRows, 0);
}

// A trainer compiled with an online target: token shards are read without
// features and the target's tensors loaded by name; feature shards are read
// as they are; a mix, token shards in a trainer without an online target,
// and shards without --target are refused.
TEST(TrainPrepare, OnlineTargetReadsTokenShards) {
  TrainMainTempDir dir;
  ModelConfig c = smallConfig();
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(c, 7).ok());
  ASSERT_TRUE(writeSyntheticTarget(dir.path + "/target", problem).ok());
  std::vector<std::string> files;
  ASSERT_TRUE(
      writeSyntheticShards(dir.path + "/data", problem, 8, 4, false, &files)
          .ok());
  ASSERT_EQ(files.size(), 2u);
  const std::vector<BufferSpec> target = {
      {"input_ids", BufferRole::Input, DType::I32, {c.rowsPerGpu, c.seqLen}, 0},
      {"model.embed_tokens.weight",
       BufferRole::Frozen,
       DType::BF16,
       {c.vocabSize, c.hiddenSize},
       -1}};
  const Args args = {
      "--data", dir.path + "/data", "--target", dir.path + "/target",
      "--out",  dir.path + "/out",  "--steps",  "2"};
  // The same with the target on GPUs of its own.
  const Args apart = {"--data",        dir.path + "/data",
                      "--target",      dir.path + "/target",
                      "--out",         dir.path + "/out",
                      "--steps",       "2",
                      "--target-gpus", "0",
                      "--gpus",        "0"};
  {
    PreparedRun run; // feature shards: the target is not needed
    Status s = prepare(args, run, c, &target);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(run.inputs.targetProgramWeights, nullptr);
  }
  {
    PreparedRun run; // feature shards: no target to run
    Status s = prepare(apart, run, c, &target);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("carry their features, so there is no target "
                               "to run"),
              std::string::npos)
        << s.message();
  }
  ASSERT_TRUE(dropFeatures(files[0]).ok());
  {
    PreparedRun run;
    Status s = prepare(args, run, c, &target);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("1 of 2 shards hold hidden_states"),
              std::string::npos)
        << s.message();
  }
  ASSERT_TRUE(dropFeatures(files[1]).ok());
  {
    PreparedRun run;
    Status s = prepare(args, run, c, &target);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(run.inputs.targetProgramWeights, &run.targetProgramWeights);
    ASSERT_EQ(run.targetProgramWeights.size(), 1u);
    EXPECT_EQ(run.targetProgramWeights[0], problem.target().embed);
    EXPECT_EQ(run.rows->numRows(), 8);
  }
  {
    // Held-out rows go through the same path: feature shards beside token
    // shards are refused.
    ASSERT_TRUE(
        writeSyntheticShards(dir.path + "/eval", problem, 4, 4, false).ok());
    PreparedRun run;
    Status s = prepare({"--data", dir.path + "/data", "--target",
                        dir.path + "/target", "--out", dir.path + "/out",
                        "--steps", "2", "--eval-data", dir.path + "/eval"},
                       run, c, &target);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("the held-out rows must be token shards too"),
              std::string::npos)
        << s.message();
  }
  {
    // The target on GPUs of its own: token shards only, in a trainer with
    // an online target.
    PreparedRun run;
    Status s = prepare(apart, run, c, &target);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(run.layout.targetGpus, std::vector<int>{0});
    PreparedRun without;
    s = prepare(apart, without, c);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("--target-gpus: this trainer was compiled "
                               "without an online target"),
              std::string::npos)
        << s.message();
  }
  {
    PreparedRun run; // no online target in the trainer: features needed
    Status s = prepare(args, run, c);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("hidden_states"), std::string::npos)
        << s.message();
  }
  {
    PreparedRun run;
    Status s = prepare({"--data", dir.path + "/data", "--out",
                        dir.path + "/out2", "--steps", "2"},
                       run, c, &target);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("needs --target DIR"), std::string::npos)
        << s.message();
  }
}

TEST(TrainPrepare, ShardOfAnotherSpecIsRefused) {
  TrainMainTempDir dir;
  ModelConfig other = smallConfig();
  other.seqLen = 24;
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(other, 7).ok());
  ASSERT_TRUE(
      writeSyntheticShards(dir.path + "/data", problem, 4, 4, false).ok());
  ASSERT_TRUE(writeSyntheticTarget(dir.path + "/target", problem).ok());
  PreparedRun run;
  Status s = prepare({"--data", dir.path + "/data", "--target",
                      dir.path + "/target", "--out", dir.path + "/out"},
                     run);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("shard-00000.safetensors"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("seq_len"), std::string::npos) << s.message();
}

TEST(TrainPrepare, ResumeTakesTheCheckpointsSettings) {
  TrainMainTempDir dir;
  ModelConfig c = smallConfig();
  RunSettings stored;
  stored.totalSteps = 40;
  stored.seed = 99;
  stored.lr = 1e-3;
  stored.warmupRatio = 0.1;
  stored.data = "synthetic";
  stored.syntheticRows = 12;
  writeTrainingCheckpoint(dir.path + "/checkpoint-10", c, 10, &stored);
  std::ofstream(dir.path + "/latest") << "checkpoint-10\n";

  PreparedRun run;
  Status s = prepare({"--data", "synthetic", "--steps", "30", "--resume",
                      dir.path, "--out", dir.path, "--lr", "2e-3"},
                     run);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(run.resumedFrom, dir.path + "/checkpoint-10");
  ASSERT_TRUE(run.inputs.resume);
  EXPECT_EQ(run.inputs.resume->step, 10);
  EXPECT_EQ(run.inputs.resume->data.row, 4);
  EXPECT_EQ(run.inputs.params, initialParameters(c, 1));
  EXPECT_EQ(run.trainer.run.totalSteps, 40);
  EXPECT_EQ(run.trainer.run.seed, 99u);
  EXPECT_EQ(run.trainer.run.syntheticRows, 12);
  EXPECT_DOUBLE_EQ(run.trainer.run.lr, 2e-3); // given: overrides
  EXPECT_DOUBLE_EQ(run.trainer.run.warmupRatio, 0.1);
  EXPECT_EQ(run.inputs.rows->numRows(), 12);
}

TEST(TrainPrepare, ResumeMismatchesAreErrors) {
  TrainMainTempDir dir;
  ModelConfig c = smallConfig();
  RunSettings stored;
  stored.totalSteps = 40;
  stored.seed = 99;
  stored.lr = 1e-3;
  stored.warmupRatio = 0.1;
  stored.data = "synthetic";
  stored.syntheticRows = 12;
  std::string ckpt = dir.path + "/checkpoint-10";
  writeTrainingCheckpoint(ckpt, c, 10, &stored);
  std::string bare = dir.path + "/bare/checkpoint-10";
  writeTrainingCheckpoint(bare, c, 10, nullptr);
  struct Case {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"--resume", ckpt, "--total-steps", "50", "--steps", "30"},
       "--total-steps 50 does not match the schedule of 40 steps in " + ckpt +
           "/training/trainer_run.json"},
      {{"--resume", ckpt, "--seed", "5", "--steps", "30"},
       "--seed 5 does not match the seed 99"},
      {{"--resume", ckpt, "--rows", "13", "--steps", "30"},
       "--rows 13 does not match the 12 rows"},
      {{"--resume", ckpt, "--steps", "10"},
       ckpt + " is at step 10; --steps 10 leaves nothing to train"},
      {{"--resume", ckpt, "--steps", "41"},
       "--steps 41 exceeds the schedule length of 40 steps"},
      {{"--resume", bare, "--steps", "30"},
       bare +
           ": has no training/trainer_run.json; give the schedule length with "
           "--total-steps"},
      {{"--resume", dir.path, "--steps", "30"},
       "neither a training checkpoint"},
  };
  for (const Case &k : cases) {
    std::vector<std::string> args = k.args;
    for (const char *a : {"--data", "synthetic", "--out"})
      args.push_back(a);
    args.push_back(dir.path + "/out");
    std::vector<const char *> argv = {"train"};
    for (const std::string &a : args)
      argv.push_back(a.c_str());
    TrainOptions o;
    std::string text;
    ASSERT_EQ(parseTrainCommandLine(int(argv.size()), argv.data(), c, o, text),
              CommandLineAction::Train)
        << text;
    Status s = validateTrainOptions(o, c);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_TRUE(resolveGpus(o, 1).ok());
    PreparedRun run;
    s = prepareRun(o, c, run);
    ASSERT_FALSE(s.ok()) << k.message;
    EXPECT_NE(s.message().find(k.message), std::string::npos)
        << s.message() << "\nexpected: " << k.message;
  }
}

TEST(TrainPrepare, DataParallelRunsTakeTheirWorldFromTheGpus) {
  if (!collectivesAvailable())
    GTEST_SKIP() << "built without NCCL: one GPU only";
  TrainMainTempDir dir;
  PreparedRun run;
  Status s = prepare({"--data", "synthetic", "--rows", "9", "--gpus", "1,3",
                      "--out", dir.path},
                     run);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(run.trainer.run.worldSize, 2);
  EXPECT_EQ(run.layout.gpus, (std::vector<int>{1, 3}));
  EXPECT_EQ(run.layout.worldSize(), 2);
  EXPECT_EQ(run.layout.firstRank(), 0);
  EXPECT_TRUE(run.layout.usesCollectives());

  // The second of three nodes with two GPUs each: ranks 2 and 3 of 6.
  TrainOptions o;
  std::string text;
  ASSERT_EQ(parse({"--data", "synthetic", "--rows", "12", "--gpus", "0,1",
                   "--out", dir.path + "/nodes"},
                  o, text),
            CommandLineAction::Train)
      << text;
  ASSERT_TRUE(validateTrainOptions(o, smallConfig()).ok());
  PreparedRun second;
  s = prepareRun(o, smallConfig(), second, /*node=*/1, /*nodes=*/3);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(second.trainer.run.worldSize, 6);
  EXPECT_EQ(second.layout.firstRank(), 2);

  // One global batch is 2 rows x 2 GPUs.
  PreparedRun small;
  s = prepare({"--data", "synthetic", "--rows", "3", "--gpus", "0,1", "--out",
               dir.path + "/small"},
              small);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("the data has 3 rows but one step needs 4 (2 "
                             "rows per GPU x 2 GPUs)"),
            std::string::npos)
      << s.message();

  PreparedRun forced;
  s = prepare({"--data", "synthetic", "--nccl", "--out", dir.path + "/nccl"},
              forced);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(forced.layout.worldSize(), 1);
  EXPECT_TRUE(forced.layout.forceCollectives);
  EXPECT_TRUE(forced.layout.usesCollectives());
}

TEST(TrainPrepare, ResumeNeedsTheSameNumberOfGpus) {
  if (!collectivesAvailable())
    GTEST_SKIP() << "built without NCCL: one GPU only";
  TrainMainTempDir dir;
  ModelConfig c = smallConfig();
  RunSettings stored;
  stored.totalSteps = 40;
  stored.seed = 99;
  stored.data = "synthetic";
  stored.syntheticRows = 12;
  stored.worldSize = 2;
  std::string ckpt = dir.path + "/checkpoint-10";
  writeTrainingCheckpoint(ckpt, c, 10, &stored, /*ranks=*/2);
  std::string bare = dir.path + "/bare/checkpoint-10";
  writeTrainingCheckpoint(bare, c, 10, nullptr, /*ranks=*/2);

  PreparedRun run;
  Status s = prepare({"--data", "synthetic", "--steps", "30", "--resume", ckpt,
                      "--gpus", "0", "--out", dir.path + "/one"},
                     run);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "--gpus: " + ckpt +
                "/training/trainer_run.json is a run on 2 GPUs but this "
                "one has 1; resume on the same number of GPUs");
  PreparedRun fromBare;
  s = prepare({"--data", "synthetic", "--steps", "30", "--total-steps", "40",
               "--resume", bare, "--gpus", "0", "--out", dir.path + "/bare1"},
              fromBare);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "--gpus: " + bare +
                             "/training/state.safetensors holds the state of "
                             "2 GPUs but this run has 1; resume on the same "
                             "number of GPUs");

  PreparedRun two;
  s = prepare({"--data", "synthetic", "--steps", "30", "--resume", ckpt,
               "--gpus", "0,1", "--out", dir.path + "/two"},
              two);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_TRUE(two.inputs.resume);
  EXPECT_EQ(two.inputs.resume->worldSize(), 2);
  EXPECT_EQ(two.inputs.resume->anchorRngState(0), Rng(3).state());
  EXPECT_EQ(two.inputs.resume->anchorRngState(1), Rng(4).state());
  EXPECT_EQ(two.trainer.run.worldSize, 2);
}

TEST(TrainPrepare, CorruptCheckpointIsAClearError) {
  TrainMainTempDir dir;
  ModelConfig c = smallConfig();
  RunSettings stored;
  stored.totalSteps = 40;
  stored.data = "synthetic";
  stored.syntheticRows = 12;
  std::string ckpt = dir.path + "/checkpoint-10";
  writeTrainingCheckpoint(ckpt, c, 10, &stored);
  std::string state = ckpt + "/" + kTrainingStateFile;
  fs::resize_file(state, fs::file_size(state) / 2);
  std::string before = readFile(state);

  std::string out, err;
  int code = runTrainMain({"--data", "synthetic", "--steps", "20", "--resume",
                           ckpt, "--out", dir.path},
                          out, err);
  EXPECT_EQ(code, 1);
  EXPECT_EQ(err.rfind("train: error: " + state, 0), 0u) << err;
  // Nothing was written over the broken checkpoint.
  EXPECT_EQ(readFile(state), before);
  EXPECT_FALSE(fs::exists(dir.path + "/metrics.jsonl"));
}

//===----------------------------------------------------------------------===//
// trainMain
//===----------------------------------------------------------------------===//

TEST(TrainMain, UnknownOptionFails) {
  std::string out, err;
  EXPECT_EQ(runTrainMain({"--data", "synthetic", "--bogus"}, out, err), 1);
  EXPECT_EQ(err.rfind("train: error: ", 0), 0u) << err;
  EXPECT_NE(err.find("--bogus"), std::string::npos) << err;
}

TEST(TrainMain, HelpGoesToStdout) {
  std::string out, err;
  EXPECT_EQ(runTrainMain({"--help"}, out, err), 0);
  EXPECT_NE(out.find("--total-steps"), std::string::npos) << out;
  EXPECT_EQ(err, "");
}

// target-features refuses bad inputs on the host, naming the file, tensor,
// row and token, before it looks for a GPU.
TEST(TargetFeaturesMain, BadInputsAreRefusedBeforeTheGpu) {
  TrainMainTempDir dir;
  ModelConfig c = smallConfig();
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(c, 7).ok());
  ASSERT_TRUE(writeSyntheticTarget(dir.path + "/target", problem).ok());
  auto writeRows = [&](const std::string &path, int64_t S, int32_t badId) {
    std::vector<int32_t> ids(size_t(3 * S), 1);
    ids[size_t(S + 4)] = badId; // row 1, token 4
    return writeSafetensors(path,
                            {{"input_ids", DType::I32, {3, S}, ids.data()}});
  };
  ASSERT_TRUE(writeRows(dir.path + "/bad-id.safetensors", c.seqLen,
                        int32_t(c.vocabSize))
                  .ok());
  ASSERT_TRUE(writeRows(dir.path + "/short.safetensors", c.seqLen - 1, 1).ok());
  const Args good = {"--target", dir.path + "/target",
                     "--rows",   dir.path + "/bad-id.safetensors",
                     "-o",       dir.path + "/out.safetensors"};
  std::string err;

  EXPECT_EQ(runTargetFeatures(good, &noTarget, err), 1);
  EXPECT_NE(err.find("compiled without an online target"), std::string::npos)
      << err;
  EXPECT_NE(runTargetFeatures({"--target", dir.path + "/target"},
                              &fakeTargetFactory, err),
            0);
  EXPECT_NE(err.find("--target, --rows and -o are needed"), std::string::npos)
      << err;
  EXPECT_EQ(runTargetFeatures(good, &fakeTargetFactory, err), 1);
  EXPECT_NE(err.find(dir.path + "/bad-id.safetensors: input_ids holds " +
                     std::to_string(c.vocabSize) +
                     " at row 1, token 4, outside the vocabulary"),
            std::string::npos)
      << err;
  EXPECT_EQ(runTargetFeatures({"--target", dir.path + "/target", "--rows",
                               dir.path + "/short.safetensors", "-o",
                               dir.path + "/out.safetensors"},
                              &fakeTargetFactory, err),
            1);
  EXPECT_NE(err.find("tensor 'input_ids' must be I32 [rows, " +
                     std::to_string(c.seqLen) + "]"),
            std::string::npos)
      << err;
  EXPECT_EQ(runTargetFeatures(good, &fakeTargetNeedingMore, err), 1);
  EXPECT_NE(err.find("model.norm.weight"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/out.safetensors"));
}

TEST(TrainMain, MissingTargetDirectory) {
  TrainMainTempDir dir;
  std::string out, err;
  EXPECT_EQ(runTrainMain({"--data", "synthetic", "--target", dir.path + "/nope",
                          "--out", dir.path},
                         out, err),
            1);
  EXPECT_EQ(err, "train: error: --target " + dir.path +
                     "/nope: no such directory\n");
}

TEST(TrainMain, NoDeviceIsReportedAfterTheHostChecksOfSeveralGpus) {
  std::string reason;
  if (visibleCudaDevices(reason) > 0)
    GTEST_SKIP() << "a CUDA device is visible";
  if (!collectivesAvailable())
    GTEST_SKIP() << "built without NCCL: one GPU only";
  TrainMainTempDir dir;
  std::string out, err;
  EXPECT_EQ(runTrainMain({"--data", "synthetic", "--steps", "3", "--gpus",
                          "0,1", "--out", dir.path},
                         out, err),
            1);
  EXPECT_EQ(err.rfind("train: error: no CUDA device is visible", 0), 0u) << err;
  // The host checks of a data-parallel run come first.
  EXPECT_EQ(runTrainMain({"--data", "synthetic", "--steps", "3", "--rows", "3",
                          "--gpus", "0,1", "--out", dir.path + "/few"},
                         out, err),
            1);
  EXPECT_NE(err.find("one step needs 4 (2 rows per GPU x 2 GPUs)"),
            std::string::npos)
      << err;
}

// Two trainers on one output directory: the second is refused before it
// writes anything, naming the first, whose files stay as they are; once the
// first is gone (killed: no clean-up runs), the directory is free again.
TEST(TrainMain, ASecondRunIntoALiveRunsDirectoryIsRefused) {
  TrainMainTempDir dir;
  const std::string metrics = dir.path + "/metrics.jsonl";
  {
    std::ofstream(metrics) << "{\"step\": 0}\n{\"step\": 1}\n";
  }
  pid_t first = holdDirectoryLockInChild(dir.path);
  ASSERT_GT(first, 0);
  std::string out, err;
  int code = runTrainMain(
      {"--data", "synthetic", "--steps", "3", "--out", dir.path}, out, err);
  EXPECT_EQ(code, 1);
  EXPECT_EQ(err.rfind("train: error: output directory '" + dir.path +
                          "' is in use by another train run (process " +
                          std::to_string(first) + " on ",
                      0),
            0u)
      << err;
  EXPECT_EQ(readFile(metrics), "{\"step\": 0}\n{\"step\": 1}\n");
  killAndReap(first);
  code = runTrainMain(
      {"--data", "synthetic", "--steps", "3", "--out", dir.path}, out, err);
  // Past the lock now: without a GPU it stops at the device check.
  std::string reason;
  if (visibleCudaDevices(reason) == 0) {
    EXPECT_EQ(code, 1);
    EXPECT_EQ(err.find("is in use by another train run"), std::string::npos)
        << err;
  }
}

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

TEST(TrainMain, MultiNodeLaunchWithoutMpiIsRefused) {
  if (multiNodeAvailable())
    GTEST_SKIP() << "built with MPI (the error applies to builds without)";
  const char *previous = std::getenv("OMPI_COMM_WORLD_SIZE");
  std::string saved = previous ? previous : "";
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  TrainMainTempDir dir;
  std::string out, err;
  int code = runTrainMain({"--data", "synthetic", "--out", dir.path + "/out"},
                          out, err);
  if (previous)
    ::setenv("OMPI_COMM_WORLD_SIZE", saved.c_str(), 1);
  else
    ::unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(code, 1);
  EXPECT_EQ(err, "train: error: this trainer was built without MPI; "
                 "multi-node runs need it (install libopenmpi-dev and "
                 "rebuild)\n");
  // Refused before anything was written.
  EXPECT_FALSE(fs::exists(dir.path + "/out"));
}

TEST(TrainMain, NoDeviceIsReportedAfterTheHostChecks) {
  std::string reason;
  if (visibleCudaDevices(reason) > 0)
    GTEST_SKIP() << "a CUDA device is visible";
  TrainMainTempDir dir;
  std::string out, err;
  EXPECT_EQ(
      runTrainMain({"--data", "synthetic", "--steps", "3", "--out", dir.path},
                   out, err),
      1);
  EXPECT_EQ(err.rfind("train: error: no CUDA device is visible", 0), 0u) << err;
}

//===----------------------------------------------------------------------===//
// Metrics and progress
//===----------------------------------------------------------------------===//

namespace {
StepMetrics sampleMetrics() {
  StepMetrics m;
  m.step = 12;
  m.loss = 2.5;
  m.acc = 0.25;
  m.tau = 2.75;
  m.gradNorm = 1.125;
  m.lr = 0.0006;
  m.stepMs = 80;
  m.computeMs = 70;
  setThroughput(m, smallConfig(), 1, 4e12);
  return m;
}
} // namespace

TEST(TrainMetrics, Throughput) {
  StepMetrics m = sampleMetrics();
  // B 2 x S 32 tokens and B 2 x Q 12 draft slots in 0.08 s; 4e12 FLOP.
  EXPECT_DOUBLE_EQ(m.contextTokensPerS, 64 / 0.08);
  EXPECT_DOUBLE_EQ(m.draftTokensPerS, 24 / 0.08);
  EXPECT_DOUBLE_EQ(m.tflops, 50.0);
  setThroughput(m, smallConfig(), 4, 4e12);
  EXPECT_DOUBLE_EQ(m.contextTokensPerS, 4 * 64 / 0.08);
  EXPECT_DOUBLE_EQ(m.tflops, 50.0); // one GPU's rate
  m.stepMs = 0;
  setThroughput(m, smallConfig(), 1, 4e12);
  EXPECT_EQ(m.contextTokensPerS, 0);
}

TEST(TrainMetrics, JsonLine) {
  EXPECT_EQ(metricsJsonLine(sampleMetrics()),
            "{\"step\": 12, \"loss\": 2.5, \"acc\": 0.25, \"tau\": 2.75, "
            "\"grad_norm\": "
            "1.125, \"lr\": 0.0006, \"step_ms\": 80.0000, \"compute_ms\": "
            "70.0000, \"tokens_per_s\": "
            "800.0, \"draft_tokens_per_s\": 300.0, \"tflops\": 50.000, "
            "\"skipped_rows\": 0}");
  StepMetrics bad = sampleMetrics();
  bad.loss = std::numeric_limits<double>::quiet_NaN();
  bad.gradNorm = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(bad.finite());
  std::string line = metricsJsonLine(bad);
  EXPECT_NE(line.find("\"loss\": null"), std::string::npos) << line;
  EXPECT_NE(line.find("\"grad_norm\": null"), std::string::npos) << line;
  // float metrics keep every bit through the log
  float lr = 0.000123456789f;
  StepMetrics exact;
  exact.lr = lr;
  std::string text = metricsJsonLine(exact);
  size_t at = text.find("\"lr\": ") + 6;
  EXPECT_EQ(float(std::strtod(text.c_str() + at, nullptr)), lr);
}

TEST(TrainMetrics, EveryRanksStepTime) {
  StepMetrics m = sampleMetrics();
  m.rankStepMs = {80, 75.5};
  setThroughput(m, smallConfig(), 2, 4e12);
  // The whole run's tokens over the slowest rank's time.
  EXPECT_DOUBLE_EQ(m.contextTokensPerS, 2 * 64 / 0.08);
  EXPECT_EQ(metricsJsonLine(m),
            "{\"step\": 12, \"loss\": 2.5, \"acc\": 0.25, \"tau\": 2.75, "
            "\"grad_norm\": "
            "1.125, \"lr\": 0.0006, \"step_ms\": 80.0000, \"compute_ms\": "
            "70.0000, \"tokens_per_s\": 1600.0, \"draft_tokens_per_s\": "
            "600.0, \"tflops\": 50.000, \"skipped_rows\": 0, "
            "\"rank_step_ms\": [80.0000, "
            "75.5000]}");
  EXPECT_EQ(
      progressLine(m, 13, 200, 185),
      "step 13/200  loss 2.5000  acc 0.2500  tau 2.75  1.60k tok/s  draft 600 "
      "tok/s  80.0 ms/step (2 GPUs, fastest 75.5)  ETA 3m05s");
  // A rank whose time is not known (another node's, after a failed step).
  m.rankStepMs = {80, std::nan("")};
  std::string line = metricsJsonLine(m);
  EXPECT_NE(line.find("\"rank_step_ms\": [80.0000, null]"), std::string::npos)
      << line;
  // One rank: the plain line.
  m.rankStepMs = {80};
  EXPECT_EQ(progressLine(m, 13, 200, 185).find("GPUs"), std::string::npos);
  // Skipped rows, once there are any, in the line and the JSON.
  EXPECT_EQ(progressLine(m, 13, 200, 185).find("skipped"), std::string::npos);
  m.skippedRows = 3;
  EXPECT_EQ(
      progressLine(m, 13, 200, 185),
      "step 13/200  loss 2.5000  acc 0.2500  tau 2.75  1.60k tok/s  draft 600 "
      "tok/s  80.0 ms/step  skipped rows 3  ETA 3m05s");
  EXPECT_EQ(nlohmann::json::parse(metricsJsonLine(m))["skipped_rows"], 3);
  nlohmann::json parsed = nlohmann::json::parse(metricsJsonLine(m));
  EXPECT_EQ(parsed["rank_step_ms"], nlohmann::json::array({80.0}));
}

// Both sides' busy time, so that a user can balance the split: on the
// drafter's GPU the target is a share of the step; on its own GPUs it is
// beside it, and the drafter's wait for its features shows.
TEST(TrainMetrics, OnlineTargetTimes) {
  StepMetrics m = sampleMetrics();
  m.targetMs = 30;
  EXPECT_NE(progressLine(m, 13, 200, 185)
                .find("80.0 ms/step (target 30.0, drafter 40.0)"),
            std::string::npos)
      << progressLine(m, 13, 200, 185);
  nlohmann::json parsed = nlohmann::json::parse(metricsJsonLine(m));
  EXPECT_EQ(parsed["target_ms"], 30.0);
  EXPECT_FALSE(parsed.contains("feature_wait_ms"));
  m.targetApart = true;
  m.featureWaitMs = 10;
  EXPECT_NE(progressLine(m, 13, 200, 185)
                .find("80.0 ms/step (target 30.0, drafter 70.0, waited 10.0)"),
            std::string::npos)
      << progressLine(m, 13, 200, 185);
  parsed = nlohmann::json::parse(metricsJsonLine(m));
  EXPECT_EQ(parsed["feature_wait_ms"], 10.0);
}

TEST(TrainMetrics, LogKeepsEarlierStepsOnResume) {
  TrainMainTempDir dir;
  std::string path = dir.path + "/metrics.jsonl";
  {
    MetricsLog log;
    ASSERT_TRUE(log.open(path, 0).ok());
    for (int i = 0; i < 6; ++i) {
      StepMetrics m = sampleMetrics();
      m.step = i;
      ASSERT_TRUE(log.append(m).ok());
    }
  }
  // A crash mid-line leaves a torn last line.
  std::ofstream(path, std::ios::app) << "{\"step\": 6, \"lo";
  {
    MetricsLog log;
    ASSERT_TRUE(log.open(path, 4).ok());
    StepMetrics m = sampleMetrics();
    m.step = 4;
    ASSERT_TRUE(log.append(m).ok());
  }
  std::string text = readFile(path);
  std::vector<int64_t> steps;
  size_t at = 0;
  while ((at = text.find("{\"step\": ", at)) != std::string::npos) {
    steps.push_back(std::strtoll(text.c_str() + at + 9, nullptr, 10));
    ++at;
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  // A fresh run starts over.
  MetricsLog fresh;
  ASSERT_TRUE(fresh.open(path, 0).ok());
  EXPECT_EQ(readFile(path), "");
  MetricsLog bad;
  Status s = bad.open(dir.path + "/no/dir/m.jsonl", 0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir.path + "/no/dir/m.jsonl: cannot open"),
            std::string::npos)
      << s.message();
}

TEST(TrainMetrics, AccuracyByPosition) {
  // bs 4: position 0 never counts; position 3 had no supervised slot.
  const double hits[] = {0, 9, 3, 0}, counts[] = {0, 10, 6, 0};
  std::vector<double> acc = accuracyByPosition(hits, counts, 4);
  ASSERT_EQ(acc.size(), 3u);
  EXPECT_DOUBLE_EQ(acc[0], 0.9);
  EXPECT_DOUBLE_EQ(acc[1], 0.5);
  EXPECT_TRUE(std::isnan(acc[2]));
  StepMetrics m = sampleMetrics();
  m.accByPosition = acc;
  nlohmann::json parsed = nlohmann::json::parse(metricsJsonLine(m));
  EXPECT_EQ(parsed["acc_by_position"],
            nlohmann::json::parse("[0.9, 0.5, null]"));
  EXPECT_EQ(
      progressLine(m, 13, 200, 185),
      "step 13/200  loss 2.5000  acc 0.2500  tau 2.75  acc@k 90 50 -  800 "
      "tok/s  draft 300 tok/s  80.0 ms/step  ETA 3m05s");
}

TEST(TrainMetrics, EvalLines) {
  EvalMetrics e;
  e.step = 299;
  e.loss = 2.125;
  e.acc = 0.5;
  e.tau = 3.25;
  e.accByPosition = {0.75, 0.5};
  e.rows = 80;
  e.batches = 40;
  e.seconds = 1.5;
  EXPECT_EQ(evalJsonLine(e),
            "{\"step\": 299, \"eval_loss\": 2.125, \"eval_acc\": 0.5, "
            "\"eval_tau\": 3.25, \"eval_acc_by_position\": [0.75, 0.5], "
            "\"eval_rows\": 80, \"eval_batches\": 40, \"eval_s\": 1.500}");
  EXPECT_EQ(evalLine(e), "eval after step 300: loss 2.1250  acc 0.5000  tau "
                         "3.25  acc@k 75 50  (80 rows, 2s)");
  // The log keeps an evaluation with the step it followed on resume.
  TrainMainTempDir dir;
  std::string path = dir.path + "/metrics.jsonl";
  {
    MetricsLog log;
    ASSERT_TRUE(log.open(path, 0).ok());
    StepMetrics m = sampleMetrics();
    m.step = 299;
    ASSERT_TRUE(log.append(m).ok());
    ASSERT_TRUE(log.append(e).ok());
    m.step = 300;
    ASSERT_TRUE(log.append(m).ok());
  }
  MetricsLog log;
  ASSERT_TRUE(log.open(path, 300).ok());
  std::string text = readFile(path);
  EXPECT_NE(text.find("\"eval_tau\": 3.25"), std::string::npos) << text;
  EXPECT_EQ(text.find("\"step\": 300"), std::string::npos) << text;
}

TEST(TrainProgress, Formatting) {
  EXPECT_EQ(formatDuration(45), "45s");
  EXPECT_EQ(formatDuration(185), "3m05s");
  EXPECT_EQ(formatDuration(7620), "2h07m");
  EXPECT_EQ(formatDuration(3 * 86400 + 4 * 3600), "3d04h");
  EXPECT_EQ(formatDuration(std::nan("")), "?");
  EXPECT_EQ(formatRate(950), "950");
  EXPECT_EQ(formatRate(12345), "12.3k");
  EXPECT_EQ(formatRate(4.56e6), "4.56M");
  EXPECT_EQ(formatRate(1.2e9), "1.20G");
  EXPECT_EQ(
      progressLine(sampleMetrics(), 13, 200, 185),
      "step 13/200  loss 2.5000  acc 0.2500  tau 2.75  800 tok/s  draft 300 "
      "tok/s  80.0 ms/step  ETA 3m05s");
}

namespace {
std::string readBack(std::FILE *file) {
  std::fflush(file);
  std::rewind(file);
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0)
    text.append(buffer, n);
  return text;
}
} // namespace

TEST(TrainProgress, PlainLinesEveryNSteps) {
  std::FILE *file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    ProgressDisplay display(file, /*rewrite=*/false, /*plainEvery=*/4);
    for (int i = 0; i < 10; ++i) {
      StepMetrics m = sampleMetrics();
      m.step = i;
      display.update(m, 10, 100.0 + i);
      if (i == 5)
        display.note("train: saved checkpoint x");
    }
  }
  std::string text = readBack(file);
  std::fclose(file);
  // Steps done 1 (first), 4, 8 and 10 (last), plus the note.
  EXPECT_NE(text.find("step 1/10 "), std::string::npos) << text;
  EXPECT_NE(text.find("step 4/10 "), std::string::npos) << text;
  EXPECT_NE(text.find("step 8/10 "), std::string::npos) << text;
  EXPECT_NE(text.find("step 10/10 "), std::string::npos) << text;
  EXPECT_EQ(text.find("step 2/10 "), std::string::npos) << text;
  EXPECT_NE(text.find("\ntrain: saved checkpoint x\n"), std::string::npos);
  EXPECT_EQ(text.find('\r'), std::string::npos);
  // After the first step, ETA is the wall time per step: 1 s.
  EXPECT_NE(text.find("step 4/10 "), std::string::npos);
  EXPECT_NE(text.find("ETA 6s"), std::string::npos) << text;
}

TEST(TrainProgress, TerminalLineIsRewritten) {
  std::FILE *file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    ProgressDisplay display(file, /*rewrite=*/true, 1);
    StepMetrics m = sampleMetrics();
    for (int i = 0; i < 5; ++i) {
      m.step = i;
      // Steps 1..3 come within 0.1 s of each other: only the first and the
      // last are drawn.
      display.update(m, 5, i == 4 ? 10.0 : 1.0 + 0.01 * i);
    }
    display.note("train: done");
  }
  std::string text = readBack(file);
  std::fclose(file);
  EXPECT_EQ(text.rfind("\rstep 1/5 ", 0), 0u) << text;
  EXPECT_EQ(text.find("step 2/5 "), std::string::npos) << text;
  EXPECT_NE(text.find("\rstep 5/5 "), std::string::npos) << text;
  EXPECT_NE(text.find("\033[K\ntrain: done\n"), std::string::npos) << text;
}

//===----------------------------------------------------------------------===//
// Checkpoint layout and schedule
//===----------------------------------------------------------------------===//

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

TEST(TrainCheckpoints, EveryRanksAnchorRngRoundTrips) {
  TrainMainTempDir dir;
  ModelConfig c = smallConfig();
  std::string two = dir.path + "/two", one = dir.path + "/one";
  writeTrainingCheckpoint(two, c, 7, nullptr, /*ranks=*/2);
  writeTrainingCheckpoint(one, c, 7, nullptr);
  TrainingState loaded;
  Status s = loadTrainingState(two, c, loaded);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(loaded.worldSize(), 2);
  EXPECT_EQ(loaded.anchorRngState(0), Rng(3).state());
  EXPECT_EQ(loaded.anchorRngState(1), Rng(4).state());
  EXPECT_EQ(loaded.data.row, 4);
  // Rank r's state is row r of an I64 [ranks, 4] tensor; one rank keeps
  // the [4] of the checkpoints written before data parallelism.
  SafetensorsFile file;
  ASSERT_TRUE(file.open(two + "/" + kTrainingStateFile).ok());
  ASSERT_NE(file.find("rng_state"), nullptr);
  EXPECT_EQ(file.find("rng_state")->shape, (std::vector<int64_t>{2, 4}));
  SafetensorsFile single;
  ASSERT_TRUE(single.open(one + "/" + kTrainingStateFile).ok());
  EXPECT_EQ(single.find("rng_state")->shape, std::vector<int64_t>{4});
  ASSERT_TRUE(loadTrainingState(one, c, loaded).ok());
  EXPECT_EQ(loaded.worldSize(), 1);
  EXPECT_TRUE(loaded.otherRankRngStates.empty());

  // A rank whose state cannot be restored names its row.
  std::vector<std::vector<uint16_t>> params = initialParameters(c, 1);
  std::vector<const uint16_t *> pointers;
  TrainingState broken;
  for (const auto &p : params) {
    pointers.push_back(p.data());
    broken.master.emplace_back(p.size(), 0.0f);
    broken.adamM.emplace_back(p.size(), 0.0f);
    broken.adamV.emplace_back(p.size(), 0.0f);
  }
  broken.rngState = Rng(1).state();
  broken.otherRankRngStates = {Rng(2).state(), Rng::State{}};
  std::string bad = dir.path + "/bad";
  ASSERT_TRUE(saveTrainingCheckpoint(bad, c, pointers, broken.ref()).ok());
  s = loadTrainingState(bad, c, loaded);
  EXPECT_EQ(s.message(), bad + "/" + kTrainingStateFile +
                             ": tensor 'rng_state' row 2: random generator "
                             "state is all zero");
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

//===----------------------------------------------------------------------===//
// Step buffer map
//===----------------------------------------------------------------------===//

TEST(TrainBuffers, MapsEveryBuffer) {
  ModelConfig c = smallConfig();
  std::vector<BufferSpec> buffers = stepBuffers(c);
  StepBufferMap map;
  Status s = mapStepBuffers(buffers, c, nullptr, map);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(buffers[size_t(map.input(StepInput::InputIds))].name, "input_ids");
  EXPECT_EQ(buffers[size_t(map.frozenWeight(FrozenWeight::LmHead))].name,
            "lm_head");
  std::vector<ParamInfo> table = parameterTable(c);
  ASSERT_EQ(map.master.size(), table.size());
  for (size_t t = 0; t < table.size(); ++t) {
    EXPECT_EQ(buffers[size_t(map.master[t])].name, table[t].name);
    EXPECT_EQ(buffers[size_t(map.master[t])].role, BufferRole::Master);
    EXPECT_EQ(buffers[size_t(map.moment2[t])].role, BufferRole::Moment2);
  }
  EXPECT_EQ(map.metrics.size(), size_t(kNumStepMetrics));
  EXPECT_EQ(buffers[size_t(map.metric(StepMetric::GradNorm))].name,
            "grad_norm");
  EXPECT_EQ(buffers[size_t(map.metric(StepMetric::PositionCounts))].shape,
            (std::vector<int64_t>{c.blockSize}));

  c.tieWordEmbeddings = true;
  ASSERT_TRUE(mapStepBuffers(stepBuffers(c), c, nullptr, map).ok());
  EXPECT_EQ(map.frozenWeight(FrozenWeight::LmHead), -1);
}

// An evaluation program: the step's inputs, frozen weights and parameters
// and one metric per forward sum, nothing else.
TEST(TrainBuffers, MapsAnEvaluationProgram) {
  ModelConfig c = smallConfig();
  std::vector<BufferSpec> buffers;
  for (const BufferSpec &b : stepBuffers(c))
    if (b.role == BufferRole::Input || b.role == BufferRole::Frozen ||
        b.role == BufferRole::Parameter)
      buffers.push_back(b);
  for (int k = 0; k < kNumForwardSums; ++k)
    buffers.push_back({nameOf(ForwardSum(k)), BufferRole::Metric, DType::F32,
                       isPerPosition(ForwardSum(k))
                           ? std::vector<int64_t>{c.blockSize}
                           : std::vector<int64_t>{},
                       k});
  EvalBufferMap map;
  Status s = mapEvalBuffers(buffers, c, map);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(buffers[size_t(map.sums[size_t(ForwardSum::RunSum)])].name,
            "run_sum");
  EXPECT_EQ(buffers[size_t(map.param.back())].role, BufferRole::Parameter);
  auto expectError = [&](std::vector<BufferSpec> list,
                         const std::string &message) {
    EvalBufferMap m;
    Status status = mapEvalBuffers(list, c, m);
    ASSERT_FALSE(status.ok()) << message;
    EXPECT_NE(status.message().find(message), std::string::npos)
        << status.message() << "\nexpected: " << message;
  };
  // A step's buffers are not an evaluation program's.
  expectError(stepBuffers(c), "evaluation program: master buffer");
  auto noSum = buffers;
  noSum.pop_back();
  expectError(noSum, "evaluation program: has no metric buffer "
                     "'position_counts'");
  auto noParam = buffers;
  noParam.erase(
      std::find_if(noParam.begin(), noParam.end(), [](const BufferSpec &b) {
        return b.role == BufferRole::Parameter;
      }));
  expectError(noParam, "evaluation program: has no parameter buffer for");
  auto scalarHits = buffers;
  scalarHits[size_t(map.sums[size_t(ForwardSum::PositionHits)])].shape = {};
  expectError(scalarHits, "metric buffer 'position_hits' has shape []");
}

TEST(TrainBuffers, MismatchesNameTheBuffer) {
  ModelConfig c = smallConfig();
  auto expectError = [&](std::vector<BufferSpec> buffers,
                         const std::string &message) {
    StepBufferMap map;
    Status s = mapStepBuffers(buffers, c, nullptr, map);
    ASSERT_FALSE(s.ok()) << message;
    EXPECT_NE(s.message().find(message), std::string::npos)
        << s.message() << "\nexpected: " << message;
  };
  std::vector<BufferSpec> buffers = stepBuffers(c);
  auto find = [&](std::vector<BufferSpec> &list, const std::string &name,
                  BufferRole role) -> BufferSpec & {
    for (BufferSpec &b : list)
      if (b.name == name && b.role == role)
        return b;
    return list.front();
  };

  auto noMaster = buffers;
  noMaster.erase(
      std::find_if(noMaster.begin(), noMaster.end(), [](const BufferSpec &b) {
        return b.name == "fc.weight" && b.role == BufferRole::Master;
      }));
  expectError(noMaster, "step program: has no master buffer for 'fc.weight'");
  auto badShape = buffers;
  find(badShape, "target_hidden", BufferRole::Input).shape = {2, 32, 16};
  expectError(badShape, "step program: input buffer 'target_hidden' has "
                        "shape [2, 32, 16] but the config needs [2, 32, 32]");
  auto badDtype = buffers;
  find(badDtype, "norm.weight", BufferRole::Parameter).dtype = DType::F32;
  expectError(badDtype, "parameter buffer 'norm.weight' has dtype F32 but "
                        "the runtime needs BF16");
  auto unknown = buffers;
  unknown.push_back({"extra", BufferRole::Input, DType::I32, {2}, 9});
  expectError(unknown,
              "input buffer 'extra' has index 9, which is not a step input");
  auto noLmHead = buffers;
  noLmHead.erase(
      std::find_if(noLmHead.begin(), noLmHead.end(), [](const BufferSpec &b) {
        return b.role == BufferRole::Frozen && b.name == "lm_head";
      }));
  expectError(noLmHead, "has no frozen buffer 'lm_head'");
  auto noLoss = buffers;
  // A metric the runtime only reports (index -1) is not the loss.
  find(noLoss, "loss", BufferRole::Metric).index = -1;
  expectError(noLoss, "has no metric buffer 'loss'");
  auto twice = buffers;
  twice.push_back(twice.front());
  expectError(twice, "input buffer 'input_ids' appears twice");
  auto vectorCounter = buffers;
  find(vectorCounter, "step", BufferRole::Counter).shape = {2};
  expectError(vectorCounter, "counter buffer 'step' has shape [2] but must "
                             "be a scalar");
  auto scalarPositions = buffers;
  find(scalarPositions, "position_hits", BufferRole::Metric).shape = {};
  expectError(scalarPositions, "metric buffer 'position_hits' has shape []");
}

namespace {
/// A fresh seed per run (DFLASH_TEST_SEED=<n> repeats one), printed with
/// any failure.
uint64_t testSeed() {
  if (const char *given = std::getenv("DFLASH_TEST_SEED"))
    return std::strtoull(given, nullptr, 10);
  return std::random_device{}();
}
} // namespace

TEST(TrainBuffers, MapsShardedBuffers) {
  const uint64_t seed = testSeed();
  SCOPED_TRACE("DFLASH_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  ModelConfig c = smallConfig();
  std::vector<ParamInfo> table = parameterTable(c);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t aligns[] = {1, 8, 64, 256};
    OptimizerShardLayout layout =
        shardLayout(c, uniform(1, 8), size_t(uniform(1, int64_t(table.size()))),
                    aligns[uniform(0, 3)], uniform(0, 1) * uniform(1, 500));
    SCOPED_TRACE("world " + std::to_string(layout.worldSize) + ", " +
                 std::to_string(layout.buckets.size()) + " buckets");
    std::vector<BufferSpec> buffers = shardedStepBuffers(c, layout);
    // The buffers in any order.
    std::shuffle(buffers.begin(), buffers.end(), rng);
    StepBufferMap map;
    Status s = mapStepBuffers(buffers, c, &layout, map);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_TRUE(map.sharded);
    EXPECT_TRUE(map.master.empty());
    EXPECT_TRUE(map.moment1.empty());
    EXPECT_TRUE(map.moment2.empty());
    ASSERT_EQ(map.param.size(), table.size());
    for (size_t t = 0; t < table.size(); ++t) {
      EXPECT_EQ(buffers[size_t(map.param[t])].name, table[t].name);
      EXPECT_EQ(buffers[size_t(map.param[t])].role, BufferRole::Parameter);
    }
    const size_t K = layout.buckets.size();
    ASSERT_EQ(map.shardMaster.size(), K);
    ASSERT_EQ(map.shardMoment1.size(), K);
    ASSERT_EQ(map.shardMoment2.size(), K);
    ASSERT_EQ(map.shardTensors.size(), K);
    for (size_t k = 0; k < K; ++k) {
      const std::pair<int, BufferRole> slots[] = {
          {map.shardMaster[k], BufferRole::Master},
          {map.shardMoment1[k], BufferRole::Moment1},
          {map.shardMoment2[k], BufferRole::Moment2}};
      for (const auto &[index, role] : slots) {
        const BufferSpec &b = buffers[size_t(index)];
        EXPECT_EQ(b.name, "bucket." + std::to_string(k));
        EXPECT_EQ(b.role, role);
        EXPECT_EQ(b.shape,
                  std::vector<int64_t>{layout.buckets[k].shardElements});
      }
      ASSERT_EQ(map.shardTensors[k].size(), layout.buckets[k].tensors.size());
      for (size_t j = 0; j < map.shardTensors[k].size(); ++j)
        EXPECT_EQ(table[map.shardTensors[k][j]].name,
                  layout.buckets[k].tensors[j].name);
    }
  }
  // Unsharded, nothing of the above.
  StepBufferMap plain;
  ASSERT_TRUE(mapStepBuffers(stepBuffers(c), c, nullptr, plain).ok());
  EXPECT_FALSE(plain.sharded);
  EXPECT_TRUE(plain.shardMaster.empty());
  EXPECT_EQ(plain.master.size(), table.size());
}

TEST(TrainBuffers, ShardedMismatchesNameTheBucketOrTensor) {
  ModelConfig c = smallConfig();
  OptimizerShardLayout layout = shardLayout(c, 4, 3, 64);
  std::vector<BufferSpec> buffers = shardedStepBuffers(c, layout);
  auto expectError = [&](const std::vector<BufferSpec> &list,
                         const OptimizerShardLayout *shards,
                         const std::string &message) {
    StepBufferMap map;
    Status s = mapStepBuffers(list, c, shards, map);
    ASSERT_FALSE(s.ok()) << message;
    EXPECT_NE(s.message().find(message), std::string::npos)
        << s.message() << "\nexpected: " << message;
  };
  auto find = [](std::vector<BufferSpec> &list, const std::string &name,
                 BufferRole role) -> BufferSpec & {
    for (BufferSpec &b : list)
      if (b.name == name && b.role == role)
        return b;
    return list.front();
  };
  const std::string first = layout.buckets[0].tensors[0].name;
  const std::string last = layout.buckets[2].tensors.back().name;

  // Per-tensor state in a sharded step.
  auto perTensor = buffers;
  perTensor.push_back({first, BufferRole::Master, DType::F32,
                       parameterTable(c)[0].shape, int64_t(3 + 5)});
  expectError(perTensor, &layout,
              "step program: master buffer '" + first +
                  "' has index 8, which is not a bucket of the optimizer "
                  "shard layout");
  // A bucket the layout does not have.
  auto extra = buffers;
  extra.push_back({"bucket.3", BufferRole::Moment1, DType::F32, {64}, 3});
  expectError(extra, &layout,
              "moment1 buffer 'bucket.3' has index 3, which is not a bucket");
  // A missing shard.
  auto missing = buffers;
  missing.erase(
      std::find_if(missing.begin(), missing.end(), [](const BufferSpec &b) {
        return b.name == "bucket.1" && b.role == BufferRole::Moment2;
      }));
  expectError(missing, &layout,
              "step program: has no moment2 buffer 'bucket.1' for bucket 1");
  // A shard of the wrong size or type.
  const int64_t S = layout.buckets[2].shardElements;
  auto wrongSize = buffers;
  find(wrongSize, "bucket.2", BufferRole::Master).shape = {S + 1};
  expectError(wrongSize, &layout,
              "master buffer 'bucket.2' has shape [" + std::to_string(S + 1) +
                  "] but the config needs [" + std::to_string(S) + "]");
  auto wrongType = buffers;
  find(wrongType, "bucket.0", BufferRole::Moment1).dtype = DType::BF16;
  expectError(wrongType, &layout,
              "moment1 buffer 'bucket.0' has dtype BF16 but the runtime "
              "needs F32");
  // Shards without a layout: bucket 0's state is read as fc.weight's.
  expectError(buffers, nullptr,
              "master buffer 'bucket.0' has shape [" +
                  std::to_string(layout.buckets[0].shardElements) +
                  "] but the config needs [" +
                  std::to_string(parameterTable(c)[0].shape[0]) + ", " +
                  std::to_string(parameterTable(c)[0].shape[1]) + "]");

  // Layouts that do not fit the config.
  OptimizerShardLayout unknown = layout;
  unknown.buckets[1].tensors[0].name = "layers.7.mlp.up_proj.weight";
  unknown.buckets[1].tensors[0].param = 99;
  expectError(buffers, &unknown,
              "step program: optimizer shard layout, bucket 1: "
              "'layers.7.mlp.up_proj.weight' (index 99) is not a trainable "
              "tensor of the config");
  OptimizerShardLayout twice = layout;
  twice.buckets[2].tensors.back().name = first;
  twice.buckets[2].tensors.back().param = 0;
  expectError(buffers, &twice,
              "optimizer shard layout, bucket 2: tensor '" + first +
                  "' is already in bucket 0");
  OptimizerShardLayout resized = layout;
  resized.buckets[2].tensors.back().numel -= 1;
  expectError(buffers, &resized,
              "optimizer shard layout, bucket 2: tensor '" + last + "' has " +
                  std::to_string(layout.buckets[2].tensors.back().numel - 1) +
                  " elements but the config gives it " +
                  std::to_string(layout.buckets[2].tensors.back().numel));
  OptimizerShardLayout dropped = layout;
  dropped.buckets[2].tensors.pop_back();
  expectError(buffers, &dropped,
              "step program: the optimizer shard layout has no bucket for '" +
                  last + "'");
  OptimizerShardLayout broken = layout;
  broken.buckets[1].shardElements = 0;
  expectError(buffers, &broken,
              "step program: optimizer shard layout, bucket 1: shards of 0 "
              "elements");
}

namespace {
/// Two processes that never talk: enough for what TrainerGroup::init
/// refuses before its first collective.
class SilentProcessGroup : public ProcessGroup {
public:
  int64_t rank() const override { return 0; }
  int64_t size() const override { return 2; }
  Status broadcast(void *, size_t, int64_t) override {
    return Status::error("unexpected broadcast");
  }
  Status allGather(const void *, size_t, void *) override {
    return Status::error("unexpected all-gather");
  }
  [[noreturn]] void abortAll(int exitCode) override { std::_Exit(exitCode); }
};
} // namespace

TEST(TrainDataParallel, AShardedStepRunsOnItsOwnWorldAndOneNode) {
  // Refused on the host, before any GPU or communicator is touched: these
  // run without a GPU.
  ModelConfig c = smallConfig();
  auto group = [&](int64_t compiledWorld, GroupLayout layout,
                   ProcessGroup *processes) {
    layout.processes = processes;
    TrainerOptions options;
    options.run.worldSize = layout.worldSize();
    options.run.totalSteps = options.finalStep = 4;
    OptimizerShardLayout shards = shardLayout(c, compiledWorld, 2);
    return std::make_unique<TrainerGroup>(
        [c, shards] { return std::make_unique<FakeStepProgram>(c, shards); },
        options, layout);
  };
  GroupLayout one;
  one.gpus = {0};
  TrainerInputs inputs;
  Status s = group(4, one, nullptr)->init(inputs);
  EXPECT_EQ(s.message(),
            "this trainer was compiled to shard the optimizer state over 4 "
            "GPUs ([parallel] gpus_per_node x nodes in its spec) but runs on "
            "1; recompile the spec for 1 GPU or drop shard_optimizer_state");
  GroupLayout three;
  three.gpus = {0, 1, 2};
  s = group(1, three, nullptr)->init(inputs);
  EXPECT_NE(s.message().find("over 1 GPU ([parallel]"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("recompile the spec for 3 GPUs"),
            std::string::npos)
      << s.message();

  SilentProcessGroup processes;
  GroupLayout twoNodes;
  twoNodes.gpus = {0};
  twoNodes.nodes = 2;
  s = group(2, twoNodes, &processes)->init(inputs);
  EXPECT_NE(s.message().find("this trainer shards the optimizer state "
                             "(shard_optimizer_state), which runs on one node "
                             "only"),
            std::string::npos)
      << s.message();
}

//===----------------------------------------------------------------------===//
// Data-parallel layout and data
//===----------------------------------------------------------------------===//

TEST(TrainDataParallel, RanksAreNumberedNodeByNode) {
  GroupLayout layout;
  layout.gpus = {4, 5, 6, 7};
  layout.node = 2;
  layout.nodes = 3;
  EXPECT_EQ(layout.worldSize(), 12);
  EXPECT_EQ(layout.firstRank(), 8);
  EXPECT_TRUE(layout.usesCollectives());
  GroupLayout one;
  EXPECT_EQ(one.worldSize(), 1);
  EXPECT_EQ(one.firstRank(), 0);
  EXPECT_FALSE(one.usesCollectives());
  one.forceCollectives = true;
  EXPECT_TRUE(one.usesCollectives());
}

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

//===----------------------------------------------------------------------===//
// Prefetch thread
//===----------------------------------------------------------------------===//

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
