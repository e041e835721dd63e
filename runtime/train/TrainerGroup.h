//===- TrainerGroup.h - Data-parallel training on a node's GPUs -*- C++ -*-===//
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
// checkpoint is the same whether or not the run was sharded. With the
// online target on GPUs of its own (GroupLayout::targetGpus), the group
// holds one TargetServer per target GPU and connects each rank to one.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_TRAIN_TRAINERGROUP_H
#define DFLASH_RUNTIME_TRAIN_TRAINERGROUP_H

#include "runtime/device/Collectives.h"
#include "runtime/train/TargetServer.h"
#include "runtime/train/Trainer.h"

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace dflash::rt {

/// Builds one GPU's step program; called once per GPU, on its worker
/// thread. It must not touch the GPU (bind() does).
using StepProgramFactory = std::function<std::unique_ptr<StepProgram>()>;

class TrainerGroup {
public:
  /// `options.run.worldSize` must equal layout.worldSize(). `evalFactory`
  /// (optional) builds each GPU's evaluation program, used when the inputs
  /// have held-out rows.
  TrainerGroup(StepProgramFactory factory, TrainerOptions options,
               GroupLayout layout, StepProgramFactory evalFactory = nullptr);
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
  /// With held-out rows, every rank evaluates on schedule
  /// (TrainerOptions::evalEvery), hooks.onEval gets the figures, and rank 0
  /// exports best/ when the eval tau beats every earlier one (a resumed
  /// run's best/ included). Returns early with success when a stop signal
  /// arrives.
  Status run(const TrainerHooks &hooks, TrainerOutcome &outcome);

  int localRanks() const { return int(workers.size()); }
  /// The online target's own GPUs (GroupLayout::targetGpus), after init.
  int targetServers() const { return int(servers.size()); }
  const TargetServer &targetServer(int k) const { return *servers[size_t(k)]; }
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
  /// Every rank's known bad rows, ascending: those the resumed state knew
  /// and those any rank skipped since. What a checkpoint stores.
  std::vector<int64_t> knownBadRows() const {
    return {badRows.begin(), badRows.end()};
  }

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
  /// Evaluates on every rank, reports, and exports best/ when it is.
  Status evaluate(const TrainerHooks &hooks, bool writesFiles, double &bestTau);
  /// The masters and moments of every local rank in one full-size state
  /// (with a sharded optimizer state, each rank fills its own elements).
  Status assembleOptimizerState(TrainingState &state);

  StepProgramFactory factory, evalFactory;
  TrainerOptions options;
  GroupLayout layout;
  std::vector<std::unique_ptr<Worker>> workers;
  /// The online target on its own GPUs; freed before the workers' trainers,
  /// into whose buffers they copy.
  std::vector<std::unique_ptr<TargetServer>> servers;
  std::mutex mutex;
  std::condition_variable changed;
  std::atomic<bool> abortRequested{false};
  bool initialised = false;
  /// Whether the ranks hold only their shards of the optimizer state.
  bool partialState = false;
  int64_t completedSteps = 0;
  /// Every rank's anchor Rng state after the last step, in rank order.
  std::vector<Rng::State> rankRngStates;
  /// TrainerGroup::knownBadRows; gatherStep adds every rank's.
  std::set<int64_t> badRows;
  std::string lastCheckpoint;
  double flopsPerStep = 0;
  const RowSource *evalRows = nullptr; ///< held-out rows, if any
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_TRAIN_TRAINERGROUP_H
