//===- PrepareRunTest.cpp - A run loaded and checked on the host ----------===//
//
// prepareRun as trainMain calls it after the command line: the synthetic
// problem and its held-out rows, feature or token shards and the target
// from disk (the online target's tensors by name), shards of another spec,
// a resume taking the checkpoint's settings and refusing mismatches, and
// the world of a data-parallel run and of a resume.
//
//===----------------------------------------------------------------------===//

#include "runtime/cli/PrepareRun.h"
#include "runtime/cli/TrainOptions.h"
#include "runtime/data/InitialParameters.h"
#include "runtime/data/Rng.h"
#include "runtime/data/Synthetic.h"
#include "runtime/io/Safetensors.h"
#include "runtime/train/RunLayout.h"
#include "runtime/train/TrainerSetup.h"
#include "schema/StepBuffers.h"
#include "test/unit/runtime/RuntimeTestSupport.h"
#include "tools/dflash-synth/SyntheticFiles.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::trainhost;

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

// --no-save: the trainer gets no output directory (no checkpoint, no
// export), while the log still goes to <out>/metrics.jsonl.
TEST(TrainPrepare, NoSaveWritesOnlyTheLog) {
  TrainMainTempDir dir;
  PreparedRun run;
  Status s = prepare({"--data", "synthetic", "--steps", "3", "--rows", "9",
                      "--out", dir.path, "--no-save", "--no-graph"},
                     run);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(run.trainer.outDir.empty());
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
  ModelConfig config = smallConfig();
  // The rows of 131072 tokens unless told (ServingWalk.h).
  EXPECT_EQ(run.trainer.evalServingRows,
            (131072 + config.seqLen - 1) / config.seqLen);
  PreparedRun none;
  ASSERT_TRUE(prepare({"--data", "synthetic", "--steps", "20", "--out",
                       dir.path + "/none", "--eval-data", "synthetic",
                       "--eval-serving-rows", "0"},
                      none)
                  .ok());
  EXPECT_EQ(none.trainer.evalServingRows, 0);
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
