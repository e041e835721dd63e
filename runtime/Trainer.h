//===- Trainer.h - Runs the compiled step on one GPU ------------*- C++ -*-===//
//
// Everything around a StepProgram on one GPU: its buffers filled from the
// target's frozen weights, the initial (or resumed) parameters and optimizer
// state; batches from a prefetch thread copied in before every step; the step
// captured once as a CUDA graph (thread-local capture mode, so that several
// trainers of one process can capture at once, one per thread) and replayed;
// metrics read back after every step; checkpoints saved, resumed and
// exported.
//
// A Trainer belongs to one thread: init(), step(), run() and the checkpoint
// calls are made from the thread that owns its DeviceContext.
//
// Output directory layout (--out):
//   checkpoint-<steps>/  a resumable training checkpoint (Checkpoint.h) plus
//                        trainer_run.json (RunSettings), swapped in whole
//   latest               "checkpoint-<steps>": the newest complete one
//   final/               the exported drafter after the last step
//   metrics.jsonl        one line per step (Progress.h)
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_TRAINER_H
#define DFLASH_RUNTIME_TRAINER_H

#include "runtime/BatchLoader.h"
#include "runtime/Checkpoint.h"
#include "runtime/DeviceContext.h"
#include "runtime/Prefetch.h"
#include "runtime/Progress.h"
#include "runtime/RowSource.h"
#include "runtime/StepProgram.h"
#include "runtime/TargetWeights.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dflash::rt {

//===----------------------------------------------------------------------===//
// Buffers of a step program
//===----------------------------------------------------------------------===//

/// Which entry of StepProgram::buffers() holds what; -1 when absent.
struct StepBufferMap {
  int inputIds = -1, lossMask = -1, targetHidden = -1, anchors = -1, keep = -1;
  int embed = -1, lmHead = -1; ///< lmHead is -1 when the target ties them
  /// One entry per parameterTable(config) tensor.
  std::vector<int> param, master, moment1, moment2;
  int stepCounter = -1, totalStepsCounter = -1;
  int loss = -1, acc = -1, gradNorm = -1, lr = -1;
  /// Every Metric buffer, in buffers() order.
  std::vector<int> metrics;
};

/// Maps every buffer of a step program and checks it against `config`:
/// the five inputs, embed (and lm_head unless tied), four buffers per
/// trainable tensor, the step and total_steps counters and the loss, acc,
/// grad_norm and lr metrics, each with the dtype and shape SEMANTICS.md
/// gives. Messages name the buffer.
Status mapStepBuffers(const std::vector<BufferSpec> &buffers,
                      const ModelConfig &config, StepBufferMap &map);

/// The step's hyperparameters: the config's, with lr and warmup ratio as
/// given.
StepHyper stepHyperFor(const ModelConfig &config, double lr,
                       double warmupRatio);

//===----------------------------------------------------------------------===//
// Checkpoint layout
//===----------------------------------------------------------------------===//

/// What a resumed run must reuse to continue exactly as the run it resumes;
/// saved in every training checkpoint as trainer_run.json.
struct RunSettings {
  int64_t totalSteps = 0; ///< schedule length
  uint64_t seed = 0;      ///< data order and anchors
  double lr = 0, warmupRatio = 0;
  std::string data;          ///< "synthetic" or the feature shard path
  int64_t syntheticRows = 0; ///< rows of the synthetic data; 0 for shards
  int64_t worldSize = 1;
};

constexpr const char *kRunSettingsFile = "trainer_run.json";
constexpr const char *kLatestFile = "latest";
constexpr const char *kFinalDir = "final";

Status writeRunSettings(const std::string &path, const RunSettings &run);
/// Reads `<checkpointDir>/trainer_run.json`; `found` is false (with success)
/// when the checkpoint has none.
Status readRunSettings(const std::string &checkpointDir, RunSettings &run,
                       bool &found);

/// `<outDir>/checkpoint-<steps>`.
std::string checkpointDirectory(const std::string &outDir, int64_t steps);
/// Whether a checkpoint is saved once `stepsDone` steps are done: every
/// `saveEvery` steps (0: never in between) and after the last step.
bool checkpointDue(int64_t stepsDone, int64_t finalStep, int64_t saveEvery);
/// `path` is a training checkpoint, or an output directory whose `latest`
/// names one; sets `checkpointDir` to the checkpoint.
Status resolveCheckpoint(const std::string &path, std::string &checkpointDir);

//===----------------------------------------------------------------------===//
// Trainer
//===----------------------------------------------------------------------===//

struct TrainerOptions {
  RunSettings run;
  /// Stop once this many optimizer steps are done (counting resumed ones).
  int64_t finalStep = 0;
  /// Capture the step as a CUDA graph and replay it; false runs enqueue()
  /// eagerly every step (debugging).
  bool useGraph = true;
  /// Where checkpoints go; empty: no checkpoints and no export.
  std::string outDir;
  int64_t saveEvery = 0;
  /// Export `<outDir>/final` after the last step.
  bool exportFinal = true;
  /// Host slots of the prefetch thread.
  int prefetchSlots = 2;
};

/// The host-side state a run starts from, loaded and checked before the GPU
/// is touched.
struct TrainerInputs {
  const TargetWeights *target = nullptr; ///< read by init() only
  const RowSource *rows = nullptr;       ///< must outlive the Trainer
  /// bf16 parameters in parameterTable order: initial, or the resumed
  /// checkpoint's.
  std::vector<std::vector<uint16_t>> params;
  /// Masters, moments, step, data position and anchor Rng of a resumed run;
  /// absent for a fresh one (masters = widened params, moments 0, step 0).
  std::optional<TrainingState> resume;
};

/// How run() reports to its caller.
struct TrainerHooks {
  /// After every step, also the one whose loss is not finite.
  std::function<Status(const StepMetrics &)> onStep;
  /// Checkpoint saved, final export written.
  std::function<void(const std::string &)> onNote;
  /// A signal number (SIGINT, SIGTERM) once the run should stop: it
  /// finishes the current step, saves a checkpoint and returns.
  const std::atomic<int> *stopSignal = nullptr;
};

struct TrainerOutcome {
  int64_t stepsDone = 0; ///< optimizer steps done in total
  int64_t stepsThisRun = 0;
  int stoppedBySignal = 0; ///< the signal that ended the run, or 0
  std::string lastCheckpoint, finalExport;
};

class Trainer {
public:
  Trainer(StepProgram &program, DeviceContext &device, TrainerOptions options);
  Trainer(const Trainer &) = delete;
  Trainer &operator=(const Trainer &) = delete;
  ~Trainer();

  /// Maps and allocates the step's buffers, uploads weights and state, binds
  /// the step and starts the prefetch thread.
  Status init(TrainerInputs inputs);

  /// Runs one step (the first one captures the graph) and reads its
  /// metrics. A non-finite loss or grad_norm fills `metrics`, then fails;
  /// the device state is then unusable and nothing can be saved.
  Status step(StepMetrics &metrics);

  /// Steps until finalStep, saving checkpoints on schedule, then exports
  /// the final drafter. Returns early with success when stopSignal is set.
  Status run(const TrainerHooks &hooks, TrainerOutcome &outcome);

  /// Saves `<outDir>/checkpoint-<steps>` and updates `<outDir>/latest`.
  Status saveCheckpoint(std::string &dir);
  /// Exports `<outDir>/final`.
  Status exportFinal(std::string &dir);

  /// Copies parameters and optimizer state back to the host; `state.step`,
  /// data position and Rng are those of the last completed step.
  Status readState(std::vector<std::vector<uint16_t>> &params,
                   TrainingState &state);

  int64_t stepsDone() const { return completedSteps; }
  /// Device memory right after allocation and after the first step (graph
  /// instantiated, GEMMs planned): what a user needs to size a run.
  const DeviceMemory &memoryAfterAllocation() const { return afterAllocation; }
  const DeviceMemory &memoryAfterFirstStep() const { return afterFirstStep; }

private:
  Status upload(int index, const void *data, size_t bytes);
  Status download(int index, void *data, size_t bytes);
  Status captureGraph();
  /// Takes the next batch from the prefetcher and copies it to the device
  /// staging buffers on the copy stream, once the previous step has moved
  /// the last staged batch into its inputs: the host-to-device copy of step
  /// k+1 overlaps step k.
  Status stageNextBatch();
  void releaseDeviceObjects();

  StepProgram &program;
  DeviceContext &device;
  TrainerOptions options;
  const ModelConfig &config;
  StepBufferMap map;
  TrainerInputs inputs;

  std::unique_ptr<BatchLoader> loader;
  std::unique_ptr<BatchPrefetcher> prefetcher;

  int64_t completedSteps = 0;
  DataPosition dataPosition;
  Rng::State anchorRngState{};
  bool initialised = false;
  bool poisoned = false; ///< a step produced a non-finite loss or norm
  std::string lastCheckpoint;

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t graphExec = nullptr;
  cudaEvent_t stepStart = nullptr, stepEnd = nullptr, copiesDone = nullptr,
              metricsDone = nullptr;
  /// Inputs staged on the device ahead of their step, and the copy stream
  /// and event of that transfer.
  std::vector<void *> staging;
  cudaStream_t copyStream = nullptr;
  cudaEvent_t stagedReady = nullptr;
  PrefetchedBatch *staged = nullptr;
  Status stagingError; ///< a failed read of the next batch, for its step
  int32_t *hostCounters = nullptr;   ///< pinned: step, total_steps
  float *hostMetrics = nullptr;      ///< pinned: every Metric buffer
  std::vector<size_t> metricOffsets; ///< in floats, per map.metrics entry
  DeviceMemory afterAllocation, afterFirstStep;
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_TRAINER_H
