//===- TrainerState.cpp - Checkpoints, resume state, exports --------------===//

#include "runtime/train/Trainer.h"

#include "runtime/io/AtomicWrite.h"

#include <algorithm>
#include <filesystem>

using namespace dflash;
using namespace dflash::rt;

Status Trainer::readParams(std::vector<std::vector<uint16_t>> &params) {
  std::vector<ParamInfo> table = parameterTable(config);
  params.assign(table.size(), {});
  for (size_t t = 0; t < table.size(); ++t) {
    params[t].resize(size_t(table[t].numel()));
    DFLASH_RETURN_IF_ERROR(
        download(map.param[t], params[t].data(), params[t].size() * 2));
  }
  return device.synchronize("copying the parameters to the host");
}

/// Empty when `state` holds every trainable tensor of `table` in full, else
/// what is wrong with it.
static std::string fullStateProblem(const TrainingState &state,
                                    const std::vector<ParamInfo> &table) {
  const char *names[] = {"master", "adam_m", "adam_v"};
  const std::vector<std::vector<float>> *groups[] = {
      &state.master, &state.adamM, &state.adamV};
  for (int g = 0; g < 3; ++g) {
    if (groups[g]->size() != table.size())
      return std::string(names[g]) + " has " +
             std::to_string(groups[g]->size()) + " tensors but the model has " +
             std::to_string(table.size());
    for (size_t t = 0; t < table.size(); ++t)
      if (int64_t((*groups[g])[t].size()) != table[t].numel())
        return std::string(names[g]) + " of '" + table[t].name + "' has " +
               std::to_string((*groups[g])[t].size()) + " elements but needs " +
               std::to_string(table[t].numel());
  }
  return "";
}

Status Trainer::readOptimizerState(TrainingState &state) {
  if (!initialised)
    return Status::error("the trainer is not initialised");
  std::vector<ParamInfo> table = parameterTable(config);
  if (std::string problem = fullStateProblem(state, table); !problem.empty())
    return Status::error("reading the optimizer state of rank " +
                         std::to_string(options.rank) + ": " + problem);
  if (!map.sharded) {
    for (size_t t = 0; t < table.size(); ++t) {
      size_t n = size_t(table[t].numel());
      Status status = download(map.master[t], state.master[t].data(), n * 4);
      if (status.ok())
        status = download(map.moment1[t], state.adamM[t].data(), n * 4);
      if (status.ok())
        status = download(map.moment2[t], state.adamV[t].data(), n * 4);
      if (!status.ok())
        return status;
    }
    return device.synchronize("copying the optimizer state to the host");
  }
  // This rank's shards, scattered into the tensors they cut: only its own
  // pieces are written, so the other ranks may fill the same state at once.
  std::vector<float> values[3];
  const int *slots[] = {map.shardMaster.data(), map.shardMoment1.data(),
                        map.shardMoment2.data()};
  std::vector<std::vector<float>> *targets[] = {&state.master, &state.adamM,
                                                &state.adamV};
  for (size_t k = 0; k < shards->buckets.size(); ++k) {
    const ShardedBucket &bucket = shards->buckets[k];
    const size_t count = size_t(bucket.shardElements);
    for (int r = 0; r < 3; ++r) {
      values[r].resize(count);
      DFLASH_RETURN_IF_ERROR(
          download(slots[r][k], values[r].data(), count * 4));
    }
    DFLASH_RETURN_IF_ERROR(device.synchronize(
        "copying optimizer shard '" + shardBufferName(k) + "' to the host"));
    for (const ShardPiece &piece : shardPieces(bucket, options.rank)) {
      const size_t t = map.shardTensors[k][piece.tensor];
      for (int r = 0; r < 3; ++r)
        std::copy_n(values[r].data() + piece.shardOffset, size_t(piece.length),
                    (*targets[r])[t].data() + piece.tensorOffset);
    }
  }
  return Status::success();
}

std::vector<int64_t> Trainer::knownBadRows() const {
  std::vector<int64_t> rows = restored;
  for (const SkippedRow &row : skipped)
    rows.push_back(row.row);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

Status Trainer::readState(std::vector<std::vector<uint16_t>> &params,
                          TrainingState &state) {
  if (!initialised)
    return Status::error("the trainer is not initialised");
  std::vector<ParamInfo> table = parameterTable(config);
  DFLASH_RETURN_IF_ERROR(readParams(params));
  state = TrainingState();
  for (auto *group : {&state.master, &state.adamM, &state.adamV}) {
    group->assign(table.size(), {});
    for (size_t t = 0; t < table.size(); ++t)
      (*group)[t].assign(size_t(table[t].numel()), 0.0f);
  }
  DFLASH_RETURN_IF_ERROR(readOptimizerState(state));
  state.step = completedSteps;
  state.data = dataPosition;
  state.rngState = anchorRng;
  state.badRows = knownBadRows();
  return Status::success();
}

Status Trainer::saveCheckpoint(std::string &dir,
                               const std::vector<Rng::State> &rankRngStates,
                               const TrainingState *assembled,
                               const std::vector<int64_t> *badRows) {
  if (poisoned)
    return Status::error("the device state is not finite and is not saved");
  if (aborted)
    return Status::error("a step was aborted; the device state is not saved");
  if (options.outDir.empty())
    return Status::error("no output directory to save a checkpoint in");
  const int64_t world = options.run.worldSize;
  if (world > 1 && (int64_t(rankRngStates.size()) != world ||
                    rankRngStates[size_t(options.rank)] != anchorRng))
    return Status::error("a checkpoint of " + std::to_string(world) +
                         " ranks needs each rank's anchor Rng state");
  if (!assembled && holdsPartialState())
    return Status::error(
        "rank " + std::to_string(options.rank) +
        " holds only its shards of the optimizer state; a checkpoint needs "
        "the state of every rank, assembled");
  std::vector<std::vector<uint16_t>> params;
  TrainingState own;
  if (assembled) {
    if (std::string problem =
            fullStateProblem(*assembled, parameterTable(config));
        !problem.empty())
      return Status::error("the assembled optimizer state to save: " + problem);
    DFLASH_RETURN_IF_ERROR(readParams(params));
  } else if (Status s = readState(params, own); !s.ok()) {
    return s;
  }
  // Masters and moments from `assembled` when given; step, data position
  // and Rng states are this trainer's.
  TrainingStateRef state = (assembled ? *assembled : own).ref();
  state.step = completedSteps;
  state.data = dataPosition;
  state.rngState = anchorRng;
  state.otherRankRngStates.clear();
  state.badRows = badRows ? *badRows : knownBadRows();
  if (world > 1) {
    state.rngState = rankRngStates.front();
    state.otherRankRngStates.assign(rankRngStates.begin() + 1,
                                    rankRngStates.end());
  }
  std::vector<const uint16_t *> paramPointers;
  for (const std::vector<uint16_t> &p : params)
    paramPointers.push_back(p.data());

  // The checkpoint and its run settings appear together: both are written
  // into one staged directory, swapped in as one.
  std::string target = checkpointDirectory(options.outDir, completedSteps);
  StagedDirectory staged;
  Status status = staged.begin(target);
  if (status.ok())
    status = writeTrainingCheckpointFiles(staged.path(), target, config,
                                          paramPointers, state);
  if (status.ok())
    status =
        writeRunSettings(staged.path() + "/" + kRunSettingsFile, options.run);
  if (status.ok())
    status = staged.commit();
  if (status.ok())
    status = writeFileAtomically(options.outDir + "/" + kLatestFile,
                                 "checkpoint-" +
                                     std::to_string(completedSteps) + "\n");
  if (!status.ok())
    return status;
  lastCheckpoint = target;
  dir = target;
  return Status::success();
}

Status Trainer::exportDrafter(
    const char *name,
    const std::vector<std::pair<std::string, std::string>> &extraFiles,
    std::string &dir) {
  if (poisoned)
    return Status::error("the device state is not finite and is not exported");
  if (aborted)
    return Status::error("a step was aborted; the drafter is not exported");
  if (options.outDir.empty())
    return Status::error("no output directory to export the drafter to");
  // Only the parameters: every rank holds all of them, sharded or not.
  std::vector<std::vector<uint16_t>> params;
  DFLASH_RETURN_IF_ERROR(readParams(params));
  std::vector<const uint16_t *> paramPointers;
  for (const std::vector<uint16_t> &p : params)
    paramPointers.push_back(p.data());
  std::string target = options.outDir + "/" + name;
  DFLASH_RETURN_IF_ERROR(
      exportCheckpoint(target, config, paramPointers, extraFiles));
  dir = target;
  return Status::success();
}

Status Trainer::exportBest(const EvalMetrics &metrics, std::string &dir) {
  return exportDrafter(kBestDir, {{kBestEvalFile, evalJsonLine(metrics)}}, dir);
}

Status Trainer::exportFinal(std::string &dir) {
  return exportDrafter(kFinalDir, {}, dir);
}
