//===- RunLayout.h - Run settings and the output directory ------*- C++ -*-===//
//
// Host code: what a resumed run must reuse (trainer_run.json) and where the
// checkpoints of an output directory go:
//   checkpoint-<steps>/  a servable drafter (config.json, model.safetensors)
//                        with training/ beside them: the state a resume needs
//                        (Checkpoint.h) and trainer_run.json (RunSettings);
//                        swapped in whole
//   latest               "checkpoint-<steps>": the newest complete one
//   final/               the exported drafter after the last step
//   best/                with --eval-data: the drafter of the highest eval
//                        tau so far, and its evaluation in best/eval.json
//   metrics.jsonl        one line per step and evaluation (Progress.h)
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_TRAIN_RUNLAYOUT_H
#define DFLASH_RUNTIME_TRAIN_RUNLAYOUT_H

#include "schema/Status.h"

#include <cstdint>
#include <string>

namespace dflash::rt {

/// What a resumed run must reuse to continue exactly as the run it resumes;
/// saved in every training checkpoint as training/trainer_run.json.
struct RunSettings {
  int64_t totalSteps = 0; ///< schedule length
  uint64_t seed = 0;      ///< data order and anchors
  double lr = 0, warmupRatio = 0;
  std::string data;          ///< "synthetic" or the feature shard path
  int64_t syntheticRows = 0; ///< rows of the synthetic data; 0 for shards
  /// GPUs of the whole run: the global batch, and one anchor stream each.
  int64_t worldSize = 1;
};

/// Relative to a checkpoint directory, beside the training state.
constexpr const char *kRunSettingsFile = "training/trainer_run.json";
constexpr const char *kLatestFile = "latest";
constexpr const char *kFinalDir = "final";
constexpr const char *kBestDir = "best";
/// Relative to best/: the evaluation that made it the best (evalJsonLine).
constexpr const char *kBestEvalFile = "eval.json";

/// The eval tau of `<outDir>/best`, for a resumed run to beat: `found` is
/// false (with success) when there is no best/ yet.
Status readBestEvalTau(const std::string &outDir, double &tau, bool &found);

Status writeRunSettings(const std::string &path, const RunSettings &run);
/// Reads `<checkpointDir>/training/trainer_run.json`; `found` is false (with
/// success) when the checkpoint has none.
Status readRunSettings(const std::string &checkpointDir, RunSettings &run,
                       bool &found);

/// `<outDir>/checkpoint-<steps>`.
std::string checkpointDirectory(const std::string &outDir, int64_t steps);
/// Whether a checkpoint is saved (or, with `saveEvery` = --eval-every, an
/// evaluation runs) once `stepsDone` steps are done: every `saveEvery`
/// steps (0: never in between) and after the last step.
bool checkpointDue(int64_t stepsDone, int64_t finalStep, int64_t saveEvery);
/// `path` is a training checkpoint, or an output directory whose `latest`
/// names one; sets `checkpointDir` to the checkpoint.
Status resolveCheckpoint(const std::string &path, std::string &checkpointDir);

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_TRAIN_RUNLAYOUT_H
