//===- Trainer.h - Runs the compiled step on one GPU ------------*- C++ -*-===//
//
// Trainer: everything around a StepProgram on one GPU: its buffers filled
// from the target's frozen weights, the initial (or resumed) parameters and
// optimizer state; batches from a prefetch thread copied in before every
// step; the step captured once as a CUDA graph (thread-local capture mode,
// so that the trainers of one process can capture at once, one per thread)
// and replayed; metrics read back after every step; checkpoints saved,
// resumed and exported.
//
// With held-out rows and an evaluation program (createEvalProgram), it
// also evaluates: the forward alone over every held-out row, its buffers
// bound to the step's inputs, frozen weights and parameters, its own arena
// allocated only then.
//
// A Trainer belongs to one thread: init(), step() and the checkpoint calls
// are made from the thread that owns its DeviceContext.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_TRAIN_TRAINER_H
#define DFLASH_RUNTIME_TRAIN_TRAINER_H

#include "runtime/data/BatchLoader.h"
#include "runtime/data/Prefetch.h"
#include "runtime/device/DeviceContext.h"
#include "runtime/device/StepBuffers.h"
#include "runtime/device/StepProgram.h"
#include "runtime/train/ServingWalk.h"
#include "runtime/train/TrainerSetup.h"
#include "schema/Parameters.h"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dflash::rt {

class TargetServer;

class Trainer {
public:
  /// `evalProgram` (optional) is the evaluation program of the same
  /// drafter; init() binds it when TrainerInputs::evalRows is given.
  Trainer(StepProgram &program, DeviceContext &device, TrainerOptions options,
          StepProgram *evalProgram = nullptr);
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

  /// Before init(): this trainer's target_hidden comes from `server`, the
  /// online target on a GPU of its own (train --target-gpus), as its drafter
  /// `client`; TrainerInputs::targetProgram is then not used. The server
  /// must outlive the trainer's last step and be freed before it.
  void serveFeaturesFrom(TargetServer *server, int client) {
    featureServer = server;
    featureClient = client;
  }

  /// Makes sure the next step's batch is on its way to the device: the part
  /// of a step that can fail on one rank alone (its rows cannot be read).
  /// TrainerGroup runs it on every rank before any of them starts the step,
  /// so that no rank waits in a collective for one that will not come.
  Status prepareStep();

  /// Runs one step (the first one captures the graph) and reads its
  /// metrics. A non-finite loss or grad_norm fills `metrics`, then fails;
  /// the device state is then unusable and nothing can be saved.
  Status step(StepMetrics &metrics);

  /// Runs the evaluation program over every held-out row (the last batch
  /// padded with empty rows) and fills `metrics` with the run's figures:
  /// the sums of every batch and GPU, then divided. Changes nothing the
  /// step keeps (its inputs are rewritten by the next step's copy). Fails
  /// without held-out rows, naming a row it cannot read.
  /// With TrainerOptions::evalServingRows, the batches holding the first
  /// of those rows also run the serving walk (ServingWalk.h): this rank's
  /// sums are servingSums(), and `metrics` carries this rank's figures
  /// until TrainerGroup adds up every rank's.
  Status evaluate(EvalMetrics &metrics);
  bool evaluates() const { return evalRows != nullptr; }
  /// The last evaluation's serving walk over this rank's rows.
  const ServingSums &servingSums() const { return serving; }
  /// Bytes of the evaluation's own arena, sums and draft slots (0 without
  /// held-out rows).
  size_t evalBytes() const {
    return evalArenaBytes + evalSumBytes + evalSlotBytes;
  }

  /// Saves `<outDir>/checkpoint-<steps>` and updates `<outDir>/latest`.
  /// With several ranks, `rankRngStates` holds every rank's anchor Rng
  /// state in rank order (a rank knows only its own). `assembled`, when
  /// given, supplies the masters and moments to save instead of this rank's
  /// (full tensors, e.g. TrainerGroup's assembly of every rank's shards);
  /// a rank that holds only its shards of the state needs it. `badRows`,
  /// when given, are the run's known bad rows (every rank's) instead of
  /// this trainer's (knownBadRows()).
  Status saveCheckpoint(std::string &dir,
                        const std::vector<Rng::State> &rankRngStates = {},
                        const TrainingState *assembled = nullptr,
                        const std::vector<int64_t> *badRows = nullptr);
  /// Exports `<outDir>/final`.
  Status exportFinal(std::string &dir);
  /// Exports `<outDir>/best`: the drafter now, with `metrics` (its
  /// evaluation) in best/eval.json, replaced as one.
  Status exportBest(const EvalMetrics &metrics, std::string &dir);

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
  /// The rows skipped for non-finite features by the steps done so far
  /// (each named once; not those a resumed state knew).
  const std::vector<SkippedRow> &skippedRows() const { return skipped; }
  /// The rows the resumed state knew as bad (TrainingState::badRows).
  const std::vector<int64_t> &restoredBadRows() const { return restored; }
  /// Those and the ones skipped since, ascending: what a checkpoint stores.
  std::vector<int64_t> knownBadRows() const;
  /// Whether the last step's loss or grad_norm was not finite.
  bool nonFinite() const { return poisoned; }
  /// Whether the last step failed only because another rank failed.
  bool stoppedByPeer() const { return abortedByPeer; }
  /// Device memory right after allocation and after the first step (graph
  /// instantiated, GEMMs planned): what a user needs to size a run.
  const DeviceMemory &memoryAfterAllocation() const { return afterAllocation; }
  const DeviceMemory &memoryAfterFirstStep() const { return afterFirstStep; }

private:
  // init(), in order.
  Status checkInputs(const TrainerInputs &inputs);
  Status uploadWeightsAndState(const TrainerInputs &inputs);
  Status createStepScalars(const TrainerInputs &inputs);
  Status bindPrograms(const TrainerInputs &inputs);
  Status startData(const TrainerInputs &inputs);

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
  /// Exports the parameters to `<outDir>/<name>` with `extraFiles` beside
  /// them (exportFinal, exportBest).
  Status exportDrafter(
      const char *name,
      const std::vector<std::pair<std::string, std::string>> &extraFiles,
      std::string &dir);
  /// Maps, allocates and binds the evaluation program (init()).
  Status bindEvalProgram(const RowSource &rows);
  Status bindTargetProgram(const TrainerInputs &inputs);
  /// Asks featureServer for the features of the batch whose host inputs are
  /// `sources`, copied into `destination` once `destinationFree` is done
  /// (timed; null: at once, untimed); `waiter` waits for their arrival.
  Status
  requestFeatures(const std::array<const void *, kNumStepInputs> &sources,
                  void *destination, cudaEvent_t destinationFree,
                  cudaStream_t waiter, int64_t &ticket);
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
  std::vector<SkippedRow> skipped;
  std::vector<int64_t> restored;

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

  // Evaluation (with held-out rows only).
  StepProgram *evalProgram = nullptr;
  const RowSource *evalRows = nullptr;
  EvalBufferMap evalMap;
  void *evalArena = nullptr;
  float *evalSums = nullptr;          ///< device: every ForwardSum buffer
  std::vector<size_t> evalSumOffsets; ///< in floats, by ForwardSum
  /// In floats, after the sums: a "covered" objective's parts, if any.
  std::array<size_t, kNumObjectiveParts> evalPartOffsets{};
  size_t evalArenaBytes = 0, evalSumBytes = 0;
  cudaEvent_t evalDone = nullptr;
  /// device: every micro-batch's DraftSlots, the hits of all rows
  /// ([rowsPerStep, N*bs] U8) then their weights (F32), as the serving walk
  /// reads them.
  uint8_t *evalSlots = nullptr;
  size_t evalSlotBytes = 0, evalWeightsOffset = 0;
  ServingSums serving;
  /// Runs the serving walk's passes over the batch now in the step's input
  /// buffers (its lossMask and positionIds on the host), adding to
  /// `serving`; every rank runs the same number of passes.
  Status walkServingOrder(const uint8_t *lossMask, const int32_t *positionIds,
                          const std::vector<int64_t> &rows,
                          const std::string &where);

  // The online target (TrainerInputs::targetProgram): its program, its own
  // frozen buffers, and its arena where the step's is too small to share
  // (the two run one after the other on one stream).
  std::unique_ptr<StepProgram> targetProgram;
  std::vector<void *> targetWeights;
  void *targetArena = nullptr;
  cudaGraph_t targetGraph = nullptr;
  cudaGraphExec_t targetGraphExec = nullptr;
  cudaEvent_t targetDone = nullptr;

  // The online target on a GPU of its own (serveFeaturesFrom): the staged
  // batch's request number, for its time.
  TargetServer *featureServer = nullptr;
  int featureClient = 0;
  int64_t stagedTicket = -1;
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_TRAIN_TRAINER_H
