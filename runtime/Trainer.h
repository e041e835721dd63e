//===- Trainer.h - Runs the compiled step on the GPUs of a node -*- C++ -*-===//
//
// Trainer: everything around a StepProgram on one GPU: its buffers filled
// from the target's frozen weights, the initial (or resumed) parameters and
// optimizer state; batches from a prefetch thread copied in before every
// step; the step captured once as a CUDA graph (thread-local capture mode,
// so that the trainers of one process can capture at once, one per thread)
// and replayed; metrics read back after every step; checkpoints saved,
// resumed and exported.
//
// TrainerGroup: data-parallel training on every GPU of this process, one
// worker thread per GPU owning its DeviceContext, StepProgram and Trainer.
// Each GPU is one rank, reads its own rows of every global batch and sums
// its gradients with the others' inside the step, through NCCL (the step
// synchronises the ranks by itself). Between steps the main thread gathers
// the ranks' metrics and anchor Rng states on the host, decides together
// with the other processes of a multi-node run whether to stop, and has
// rank 0 save checkpoints: after the all-reduce every rank holds the same
// parameters and optimizer state. With a sharded optimizer state (ZeRO-1,
// OptimizerShards.h) each rank holds only its shards: the group assembles
// the whole state from every local rank before rank 0 saves it, so that a
// checkpoint is the same whether or not the run was sharded.
//
// A Trainer belongs to one thread: init(), step() and the checkpoint calls
// are made from the thread that owns its DeviceContext.
//
// Output directory layout (--out), written by rank 0:
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
#include "schema/Parameters.h"
#include "runtime/Checkpoint.h"
#include "runtime/Collectives.h"
#include "runtime/DeviceContext.h"
#include "runtime/Prefetch.h"
#include "runtime/Progress.h"
#include "runtime/RowSource.h"
#include "runtime/StepProgram.h"
#include "runtime/TargetWeights.h"

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace dflash::rt {

//===----------------------------------------------------------------------===//
// Buffers of a step program
//===----------------------------------------------------------------------===//

/// Which entry of StepProgram::buffers() holds what; -1 when absent.
struct StepBufferMap {
  /// By StepInput, FrozenWeight (lm_head is -1 when the target ties them),
  /// StepCounter and StepMetric.
  std::array<int, kNumStepInputs> inputs{};
  std::array<int, kNumFrozenWeights> frozen{};
  std::array<int, kNumStepCounters> counters{};
  std::array<int, kNumStepMetrics> namedMetrics{};
  int input(StepInput k) const { return inputs[size_t(k)]; }
  int frozenWeight(FrozenWeight k) const { return frozen[size_t(k)]; }
  int counter(StepCounter k) const { return counters[size_t(k)]; }
  int metric(StepMetric k) const { return namedMetrics[size_t(k)]; }
  /// One entry per parameterTable(config) tensor. master, moment1 and
  /// moment2 are empty when the optimizer state is sharded.
  std::vector<int> param, master, moment1, moment2;
  /// ZeRO-1 (StepProgram::optimizerShards): whether the optimizer state is
  /// held as one shard per bucket instead of per tensor.
  bool sharded = false;
  /// With `sharded`, one entry per bucket of the layout: its "bucket.<k>"
  /// buffers.
  std::vector<int> shardMaster, shardMoment1, shardMoment2;
  /// With `sharded`, per bucket and per tensor of the bucket (in layout
  /// order): its index in parameterTable(config).
  std::vector<std::vector<size_t>> shardTensors;
  /// Every Metric buffer, in buffers() order.
  std::vector<int> metrics;
};

/// Maps every buffer of a step program and checks it against `config`:
/// the five inputs, embed (and lm_head unless tied), four buffers per
/// trainable tensor, the step and total_steps counters and the loss, acc,
/// grad_norm and lr metrics, each with the dtype and shape SEMANTICS.md
/// gives. With `shards` (StepProgram::optimizerShards; null: unsharded),
/// the layout must be valid and hold every trainable tensor exactly once,
/// and the optimizer state is instead one F32 [S_k] master, moment1 and
/// moment2 buffer per bucket k, named shardBufferName(k). Messages name the
/// buffer, bucket or tensor.
Status mapStepBuffers(const std::vector<BufferSpec> &buffers,
                      const ModelConfig &config,
                      const OptimizerShardLayout *shards, StepBufferMap &map);

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
  /// GPUs of the whole run: the global batch, and one anchor stream each.
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
  /// This trainer's rank among run.worldSize (set by TrainerGroup).
  int64_t rank = 0;
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
/// is touched. Trainer::init only reads it (the trainers of a group read
/// the same one at once); the caller may drop it afterwards.
struct TrainerInputs {
  const TargetWeights *target = nullptr; ///< read by init() only
  const RowSource *rows = nullptr;       ///< must outlive the Trainer
  /// bf16 parameters in parameterTable order: initial, or the resumed
  /// checkpoint's.
  std::vector<std::vector<uint16_t>> params;
  /// Masters, moments, step, data position and the anchor Rng of every rank
  /// of a resumed run; absent for a fresh one (masters = widened params,
  /// moments 0, step 0).
  std::optional<TrainingState> resume;
};

/// How TrainerGroup::run reports to its caller (on every process of a
/// multi-node run).
struct TrainerHooks {
  /// After every step, also the one whose loss is not finite, with the
  /// run's metrics (Progress.h).
  std::function<Status(const StepMetrics &)> onStep;
  /// Checkpoint saved, final export written.
  std::function<void(const std::string &)> onNote;
  /// A signal number (SIGINT, SIGTERM) once the run should stop: it
  /// finishes the current step, saves a checkpoint and returns. Over
  /// several processes, they stop together after the first step that
  /// follows a signal on any of them.
  const std::atomic<int> *stopSignal = nullptr;
};

struct TrainerOutcome {
  int64_t stepsDone = 0; ///< optimizer steps done in total
  int64_t stepsThisRun = 0;
  int stoppedBySignal = 0; ///< the signal that ended the run, or 0
  /// Written by this process (rank 0's): empty on the others.
  std::string lastCheckpoint, finalExport;
};

class Trainer {
public:
  Trainer(StepProgram &program, DeviceContext &device, TrainerOptions options);
  Trainer(const Trainer &) = delete;
  Trainer &operator=(const Trainer &) = delete;
  ~Trainer();

  /// Maps and allocates the step's buffers, uploads weights and state, binds
  /// the step and starts the prefetch thread; reads `inputs` only here.
  /// A run over several GPUs needs the device's communicator
  /// (DeviceContext::attachCollectives) of rank options.rank.
  Status init(const TrainerInputs &inputs);

  /// Once `flag` is set (another rank of the run failed), a step waiting
  /// for its collectives aborts them and fails instead of waiting forever.
  void watchForAbort(const std::atomic<bool> *flag) { abortFlag = flag; }

  /// Makes sure the next step's batch is on its way to the device: the part
  /// of a step that can fail on one rank alone (its rows cannot be read).
  /// TrainerGroup runs it on every rank before any of them starts the step,
  /// so that no rank waits in a collective for one that will not come.
  Status prepareStep();

  /// Runs one step (the first one captures the graph) and reads its
  /// metrics. A non-finite loss or grad_norm fills `metrics`, then fails;
  /// the device state is then unusable and nothing can be saved.
  Status step(StepMetrics &metrics);

  /// Saves `<outDir>/checkpoint-<steps>` and updates `<outDir>/latest`.
  /// With several ranks, `rankRngStates` holds every rank's anchor Rng
  /// state in rank order (a rank knows only its own). `assembled`, when
  /// given, supplies the masters and moments to save instead of this rank's
  /// (full tensors, e.g. TrainerGroup's assembly of every rank's shards);
  /// a rank that holds only its shards of the state needs it.
  Status saveCheckpoint(std::string &dir,
                        const std::vector<Rng::State> &rankRngStates = {},
                        const TrainingState *assembled = nullptr);
  /// Exports `<outDir>/final`.
  Status exportFinal(std::string &dir);

  /// Copies parameters and optimizer state back to the host; `state.step`,
  /// data position and Rng (this rank's, as `rngState`) are those of the
  /// last completed step. The masters and moments are full tensors; with a
  /// sharded optimizer state only the elements this rank owns are filled,
  /// the others are 0 (readOptimizerState of every other rank completes
  /// them).
  Status readState(std::vector<std::vector<uint16_t>> &params,
                   TrainingState &state);
  /// Copies the optimizer state this rank holds into `state`, whose master,
  /// adamM and adamV must already hold every trainable tensor in full: all
  /// of it without sharding, else only the elements of this rank's shards
  /// (the other elements are left as they are, so that the ranks of a
  /// process can fill one state at once).
  Status readOptimizerState(TrainingState &state);
  /// Whether this rank holds only its shards of the optimizer state (a
  /// sharded step on more than one rank).
  bool holdsPartialState() const {
    return map.sharded && options.run.worldSize > 1;
  }

  int64_t stepsDone() const { return completedSteps; }
  /// The loader's position and this rank's anchor Rng state after the last
  /// completed step: what a checkpoint taken now stores.
  const DataPosition &position() const { return dataPosition; }
  const Rng::State &anchorRngState() const { return anchorRng; }
  /// Whether the last step's loss or grad_norm was not finite.
  bool nonFinite() const { return poisoned; }
  /// Whether the last step failed only because another rank failed.
  bool stoppedByPeer() const { return abortedByPeer; }
  /// Device memory right after allocation and after the first step (graph
  /// instantiated, GEMMs planned): what a user needs to size a run.
  const DeviceMemory &memoryAfterAllocation() const { return afterAllocation; }
  const DeviceMemory &memoryAfterFirstStep() const { return afterFirstStep; }

private:
  Status upload(int index, const void *data, size_t bytes);
  Status download(int index, void *data, size_t bytes);
  /// Every parameter tensor, downloaded (every rank holds all of them).
  Status readParams(std::vector<std::vector<uint16_t>> &params);
  /// Fills this rank's shards of the optimizer state from full tensors:
  /// masters from `resume` or the widened `params`, moments from `resume`
  /// or zero; padding zero.
  Status uploadShards(const std::vector<std::vector<uint16_t>> &params,
                      const TrainingState *resume);
  Status captureGraph();
  /// Waits for `event` of the step. With collectives, polls instead of
  /// blocking, so that a lost peer or a failed rank ends the wait.
  Status waitForStep(cudaEvent_t event, const std::string &what);
  /// The communicator's first error, if this rank has one.
  Status collectivesStatus();
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
  /// The program's shard layout (null: unsharded), set by init().
  const OptimizerShardLayout *shards = nullptr;
  StepBufferMap map;
  const RowSource *rows = nullptr;
  const std::atomic<bool> *abortFlag = nullptr;

  std::unique_ptr<BatchLoader> loader;
  std::unique_ptr<BatchPrefetcher> prefetcher;

  int64_t completedSteps = 0;
  DataPosition dataPosition;
  Rng::State anchorRng{};
  bool initialised = false;
  bool poisoned = false; ///< a step produced a non-finite loss or norm
  /// A step with collectives has run eagerly (see Trainer::step).
  bool collectivesWarm = false;
  /// A step gave up: another rank failed, or the collectives did; the
  /// device state is unusable.
  bool aborted = false, abortedByPeer = false;
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

//===----------------------------------------------------------------------===//
// Data-parallel group
//===----------------------------------------------------------------------===//

/// Where the GPUs of this process sit in a data-parallel run.
struct GroupLayout {
  /// CUDA devices of this process, one rank each, in local rank order.
  std::vector<int> gpus = {0};
  int64_t node = 0, nodes = 1; ///< this process among the run's processes
  /// NCCL communicators even for a world of one GPU (`train --nccl`): the
  /// data-parallel path, which must give the one-GPU results.
  bool forceCollectives = false;
  /// The run's processes when there are several; not owned.
  ProcessGroup *processes = nullptr;

  int64_t worldSize() const { return nodes * int64_t(gpus.size()); }
  /// Global rank of gpus[0]: ranks are numbered node by node.
  int64_t firstRank() const { return node * int64_t(gpus.size()); }
  bool usesCollectives() const { return forceCollectives || worldSize() > 1; }
};

/// Builds one GPU's step program; called once per GPU, on its worker
/// thread. It must not touch the GPU (bind() does).
using StepProgramFactory = std::function<std::unique_ptr<StepProgram>()>;

class TrainerGroup {
public:
  /// `options.run.worldSize` must equal layout.worldSize().
  TrainerGroup(StepProgramFactory factory, TrainerOptions options,
               GroupLayout layout);
  TrainerGroup(const TrainerGroup &) = delete;
  TrainerGroup &operator=(const TrainerGroup &) = delete;
  /// Ends the worker threads; each frees its GPU's objects.
  ~TrainerGroup();

  /// Builds each GPU's step program on its worker thread, creates the
  /// communicators (with the other processes, if any), then on each worker
  /// its device context and Trainer, initialised from `inputs` (read only
  /// during init). A step with a sharded optimizer state is refused before
  /// any communicator on another world size than its own, and on more than
  /// one node: its checkpoints would need the shards of the other
  /// processes.
  Status init(const TrainerInputs &inputs);

  /// Steps every rank until finalStep. After each step hooks.onStep gets
  /// rank 0's metrics with the slowest rank's time and every rank's time;
  /// rank 0 saves checkpoints on schedule and exports the final drafter.
  /// Returns early with success when a stop signal arrives.
  Status run(const TrainerHooks &hooks, TrainerOutcome &outcome);

  int localRanks() const { return int(workers.size()); }
  /// Local rank `local`'s device and trainer after init, for host-side
  /// facts (name, sizes, memory); no CUDA call may be made through them.
  const DeviceContext &device(int local) const;
  const Trainer &trainer(int local) const;
  /// Local rank `local`'s Trainer::readState, run on its thread.
  Status readState(int local, std::vector<std::vector<uint16_t>> &params,
                   TrainingState &state);
  /// Local rank 0's Trainer::readState with the optimizer state completed
  /// from every local rank's shards (each on its own thread): the run's
  /// whole state, as a checkpoint holds it. Without sharding, the same as
  /// readState(0, ...).
  Status readFullState(std::vector<std::vector<uint16_t>> &params,
                       TrainingState &state);
  int64_t stepsDone() const { return completedSteps; }

private:
  struct Worker;
  using Job = std::function<Status(Worker &)>;

  void serve(Worker &worker);
  /// Runs `job` on every worker (or only on local rank `only`) and waits
  /// for all of them. The first failure makes the others' steps give up
  /// (Trainer::watchForAbort); the error returned is that of the first
  /// rank that failed on its own.
  Status runOnWorkers(const Job &job, int only = -1);
  /// After a step: every rank's time and anchor Rng state, from this
  /// process's workers and, over several processes, from the others; also
  /// agrees on a stop signal. Fills `metrics` with the run's.
  Status gatherStep(const TrainerHooks &hooks, bool stepOk,
                    StepMetrics &metrics, int &agreedStop);
  Status saveCheckpoint(std::string &dir);
  /// The masters and moments of every local rank in one full-size state
  /// (with a sharded optimizer state, each rank fills its own elements).
  Status assembleOptimizerState(TrainingState &state);

  StepProgramFactory factory;
  TrainerOptions options;
  GroupLayout layout;
  std::vector<std::unique_ptr<Worker>> workers;
  std::mutex mutex;
  std::condition_variable changed;
  std::atomic<bool> abortRequested{false};
  bool initialised = false;
  /// Whether the ranks hold only their shards of the optimizer state.
  bool partialState = false;
  int64_t completedSteps = 0;
  /// Every rank's anchor Rng state after the last step, in rank order.
  std::vector<Rng::State> rankRngStates;
  std::string lastCheckpoint;
  double flopsPerStep = 0;
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_TRAINER_H
