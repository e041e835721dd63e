//===- PrepareRun.cpp - Everything a run needs from the host --------------===//

#include "runtime/cli/PrepareRun.h"

#include "runtime/data/BatchLoader.h"
#include "runtime/data/FeatureShard.h"
#include "runtime/data/InitialParameters.h"
#include "runtime/train/ServingWalk.h"
#include "schema/Parameters.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <mutex>
#include <unistd.h>

using namespace dflash;
using namespace dflash::rt;
namespace fs = std::filesystem;

//===----------------------------------------------------------------------===//
// Host-side loading
//===----------------------------------------------------------------------===//

/// Settles the run settings of a resumed run against its checkpoint.
static Status settleResumedRun(const TrainOptions &o, const std::string &ckpt,
                               RunSettings &run) {
  RunSettings stored;
  bool found = false;
  DFLASH_RETURN_IF_ERROR(readRunSettings(ckpt, stored, found));
  std::string file = ckpt + "/" + kRunSettingsFile;
  if (!found) {
    if (!o.givenTotalSteps)
      return Status::error(ckpt + ": has no " + kRunSettingsFile +
                           "; give the schedule length with --total-steps");
    run.totalSteps = o.totalSteps;
    return Status::success();
  }
  if (o.givenTotalSteps && o.totalSteps != stored.totalSteps)
    return Status::error("--total-steps " + std::to_string(o.totalSteps) +
                         " does not match the schedule of " +
                         std::to_string(stored.totalSteps) + " steps in " +
                         file);
  if (o.givenSeed && o.seed != stored.seed)
    return Status::error("--seed " + std::to_string(o.seed) +
                         " does not match the seed " +
                         std::to_string(stored.seed) + " in " + file);
  bool synthetic = o.data == "synthetic";
  if (synthetic != (stored.data == "synthetic"))
    return Status::error("--data " + o.data + " differs from the data '" +
                         stored.data + "' in " + file);
  if (synthetic && o.givenRows && o.rows != stored.syntheticRows)
    return Status::error(
        "--rows " + std::to_string(o.rows) + " does not match the " +
        std::to_string(stored.syntheticRows) + " rows in " + file);
  // Each rank has its own rows and anchor stream: another world size
  // would read other batches than the run being continued.
  if (stored.worldSize != run.worldSize)
    return Status::error(
        "--gpus: " + file + " is a run on " + std::to_string(stored.worldSize) +
        " GPUs but this one has " + std::to_string(run.worldSize) +
        "; resume on the same number of GPUs");
  run.totalSteps = stored.totalSteps;
  run.seed = stored.seed;
  if (synthetic)
    run.syntheticRows = stored.syntheticRows;
  if (!o.givenLr)
    run.lr = stored.lr;
  if (!o.givenWarmupRatio)
    run.warmupRatio = stored.warmupRatio;
  return Status::success();
}

Status dflash::rt::prepareRun(const TrainOptions &o, const ModelConfig &config,
                              PreparedRun &run, int64_t node, int64_t nodes,
                              const std::vector<BufferSpec> *onlineTarget) {
  if (o.gpus.empty())
    return Status::error("--gpus: no device to train on");
  bool synthetic = o.data == "synthetic";
  RunSettings settings;
  settings.totalSteps = o.givenTotalSteps ? o.totalSteps : o.steps;
  settings.seed = o.seed;
  settings.lr = o.lr;
  settings.warmupRatio = o.warmupRatio;
  settings.data = o.data;
  settings.syntheticRows = synthetic ? o.rows : 0;
  settings.worldSize = nodes * int64_t(o.gpus.size());

  // Resumed state first: it settles the seed the data depends on.
  std::vector<std::vector<uint16_t>> params;
  if (!o.resume.empty()) {
    std::string ckpt;
    DFLASH_RETURN_IF_ERROR(resolveCheckpoint(o.resume, ckpt));
    DFLASH_RETURN_IF_ERROR(settleResumedRun(o, ckpt, settings));
    TrainingState state;
    DFLASH_RETURN_IF_ERROR(loadTrainingState(ckpt, config, state));
    if (state.worldSize() != settings.worldSize)
      return Status::error(
          "--gpus: " + ckpt + "/" + kTrainingStateFile +
          " holds the state of " + std::to_string(state.worldSize()) +
          " GPUs but this run has " + std::to_string(settings.worldSize) +
          "; resume on the same number of GPUs");
    DFLASH_RETURN_IF_ERROR(loadCheckpoint(ckpt, config, params));
    if (state.step >= o.steps)
      return Status::error(ckpt + " is at step " + std::to_string(state.step) +
                           "; --steps " + std::to_string(o.steps) +
                           " leaves nothing to train");
    if (state.step > settings.totalSteps)
      return Status::error(ckpt + " is at step " + std::to_string(state.step) +
                           ", past its schedule of " +
                           std::to_string(settings.totalSteps) + " steps");
    run.resumedFrom = ckpt;
    run.inputs.resume = std::move(state);
  }
  if (o.steps > settings.totalSteps)
    return Status::error("--steps " + std::to_string(o.steps) +
                         " exceeds the schedule length of " +
                         std::to_string(settings.totalSteps) + " steps");

  // Data. With an online target, shards may hold tokens only: then the
  // target computes their features (feature shards are read as they are).
  bool online = false;
  if (!o.targetGpus.empty() && !onlineTarget)
    return Status::error("--target-gpus: this trainer was compiled without "
                         "an online target (dflashc SPEC --target DIR builds "
                         "one in)");
  const ShardContents contents =
      onlineTarget ? ShardContents::Tokens : ShardContents::Features;
  if (synthetic) {
    run.synthetic = std::make_unique<SyntheticProblem>();
    DFLASH_RETURN_IF_ERROR(run.synthetic->init(config, settings.seed));
    auto rows = std::make_unique<SyntheticRowSource>(
        *run.synthetic, settings.syntheticRows, /*pinAnchors=*/false);
    // Rows made on the fly cannot keep up with a GPU step at full size;
    // keep them in memory when that costs at most 16 GiB.
    if (rows->materializedBytes() <= (size_t(16) << 30))
      rows->materialize();
    run.rows = std::move(rows);
  } else {
    auto reader = std::make_unique<FeatureShardReader>();
    DFLASH_RETURN_IF_ERROR(reader->open(o.data, config, contents));
    if (reader->numRows() == 0)
      return Status::error(
          o.data + ": no usable rows (" +
          std::to_string(reader->numDroppedRows()) +
          " dropped for having fewer than 2 consecutive supervised tokens)");
    const int64_t withFeatures = reader->shardsWithFeatures();
    if (withFeatures != 0 && withFeatures != reader->numShards())
      return Status::error(
          "--data " + o.data + ": " + std::to_string(withFeatures) + " of " +
          std::to_string(reader->numShards()) +
          " shards hold hidden_states and the others only tokens; give "
          "token shards (the online target computes their features) or "
          "feature shards");
    // (validateTrainOptions made sure --target is given.)
    online = withFeatures == 0;
    if (!online && !o.targetGpus.empty())
      return Status::error("--target-gpus: the shards in --data " + o.data +
                           " carry their features, so there is no target to "
                           "run; give token shards, or leave --target-gpus "
                           "out");
    run.rows = std::move(reader);
  }
  {
    // The loader's own checks, before the GPU is touched.
    BatchLoader probe(*run.rows, config, settings.seed, 0, settings.worldSize);
    if (Status s = probe.validate(); !s.ok())
      return Status::error("--data " + o.data + ": " + s.message());
    if (run.inputs.resume)
      if (Status s =
              probe.seek(run.inputs.resume->data, run.inputs.resume->rngState);
          !s.ok())
        return Status::error(run.resumedFrom + ": " + s.message());
  }

  // Held-out rows: shards of the same drafter and target, or synthetic rows
  // past the training set's.
  if (o.evalData == "synthetic") {
    auto rows = std::make_unique<SyntheticRowSource>(
        *run.synthetic, o.evalRows, /*pinAnchors=*/false,
        /*firstRow=*/settings.syntheticRows);
    if (rows->materializedBytes() <= (size_t(4) << 30))
      rows->materialize();
    run.evalRows = std::move(rows);
  } else if (!o.evalData.empty()) {
    auto reader = std::make_unique<FeatureShardReader>();
    if (Status s = reader->open(o.evalData, config, contents); !s.ok())
      return Status::error("--eval-data: " + s.message());
    // The held-out rows go through the same path as the training rows.
    if (reader->shardsWithFeatures() != (online ? 0 : reader->numShards()))
      return Status::error(
          "--eval-data " + o.evalData + ": " +
          (online ? "the training data are token shards, so the held-out "
                    "rows must be token shards too"
                  : "the training data are feature shards, so the held-out "
                    "rows must be feature shards too"));
    if (reader->numRows() == 0)
      return Status::error(
          "--eval-data " + o.evalData + ": no usable rows (" +
          std::to_string(reader->numDroppedRows()) +
          " dropped for having fewer than 2 consecutive supervised tokens)");
    run.evalRows = std::move(reader);
  }

  // Frozen weights.
  if (o.randomTargetWeights) {
    if (!online)
      return Status::error("--random-target-weights stands in for an online "
                           "target's weights: this trainer has no online "
                           "target, or --data holds features");
    std::fprintf(stderr, "train: --random-target-weights: the target's "
                         "weights are random; time and memory only\n");
    randomTargetWeights(config, run.loadedTarget);
    run.inputs.target = &run.loadedTarget;
  } else if (!o.target.empty()) {
    DFLASH_RETURN_IF_ERROR(
        loadTargetWeights(o.target, config, run.loadedTarget));
    run.inputs.target = &run.loadedTarget;
  } else if (synthetic) {
    run.inputs.target = &run.synthetic->target();
  } else {
    return Status::error("--data " + o.data +
                         " needs --target DIR for the frozen embedding and "
                         "lm_head");
  }

  // The online target's own tensors, by their checkpoint names.
  if (online) {
    std::vector<FrozenTensor> wanted;
    for (const BufferSpec &b : *onlineTarget)
      if (b.role == BufferRole::Frozen)
        wanted.push_back({b.name, b.shape});
    if (o.randomTargetWeights)
      randomFrozenTensors(wanted, run.targetProgramWeights);
    else
      DFLASH_RETURN_IF_ERROR(loadFrozenTensors(
          o.target, wanted, "the online target", run.targetProgramWeights));
    run.inputs.targetProgramWeights = &run.targetProgramWeights;
  }

  // Initial parameters of a fresh run.
  if (o.resume.empty()) {
    if (!o.init.empty()) {
      DFLASH_RETURN_IF_ERROR(loadCheckpoint(o.init, config, params));
    } else if (synthetic) {
      params = run.synthetic->initialParameters();
    } else {
      params = initialParameters(config, settings.seed);
    }
  }
  run.inputs.params = std::move(params);
  run.inputs.rows = run.rows.get();
  run.inputs.evalRows = run.evalRows.get();

  run.trainer.run = settings;
  run.trainer.finalStep = o.steps;
  run.trainer.useGraph = !o.noGraph;
  run.trainer.timeGemms = !o.noGemmTiming;
  // Empty: no checkpoint and no export (TrainerSetup).
  run.trainer.outDir = o.noSave ? std::string() : o.out;
  run.trainer.saveEvery = o.saveEvery;
  run.trainer.maxBadRows = o.maxBadRows;
  run.trainer.evalEvery = o.evalEvery;
  run.trainer.evalServingRows = o.evalServingRows < 0
                                    ? defaultServingRows(config.seqLen)
                                    : o.evalServingRows;
  run.trainer.exportFinal = !o.evalOnly;
  run.trainer.evalOnly = o.evalOnly;
  run.logPath = o.log.empty() ? o.out + "/metrics.jsonl" : o.log;
  run.layout.gpus = o.gpus;
  run.layout.targetGpus = online ? o.targetGpus : std::vector<int>();
  run.layout.node = node;
  run.layout.nodes = nodes;
  run.layout.forceCollectives = o.nccl;
  return Status::success();
}
