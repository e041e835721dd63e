//===- TrainerSetup.h - What a trainer is given and reports -----*- C++ -*-===//
//
// Host code (no CUDA): the options, host-side inputs, hooks and outcome of
// a run, and where the GPUs of this process sit in it; what the command
// line prepares before any GPU is touched.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_TRAIN_TRAINERSETUP_H
#define DFLASH_RUNTIME_TRAIN_TRAINERSETUP_H

#include "runtime/data/RowSource.h"
#include "runtime/io/Checkpoint.h"
#include "runtime/io/TargetWeights.h"
#include "runtime/train/Progress.h"
#include "runtime/train/RunLayout.h"
#include "schema/Status.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dflash::rt {

class ProcessGroup;
class StepProgram; // runtime/device/StepProgram.h (CUDA-side)

/// Whether this build can create NCCL communicators (several GPUs, --nccl).
bool collectivesAvailable();
/// Whether this build can join the processes of a multi-node run (MPI).
bool multiNodeAvailable();

struct TrainerOptions {
  RunSettings run;
  /// This trainer's rank among run.worldSize (set by TrainerGroup).
  int64_t rank = 0;
  /// Stop once this many optimizer steps are done (counting resumed ones).
  int64_t finalStep = 0;
  /// Capture the step as a CUDA graph and replay it; false runs enqueue()
  /// eagerly every step (debugging).
  bool useGraph = true;
  /// Time cuBLASLt's candidate algorithms for each large GEMM shape at the
  /// first launch and keep the fastest; false keeps the heuristic's first
  /// (bit-for-bit comparisons with runs that did not time).
  bool timeGemms = true;
  /// Where checkpoints go; empty: no checkpoints and no export.
  std::string outDir;
  int64_t saveEvery = 0;
  /// Export `<outDir>/final` after the last step.
  bool exportFinal = true;
  /// Evaluate the held-out rows once instead of training (train
  /// --eval-only): no step, checkpoint or export.
  bool evalOnly = false;
  /// Host slots of the prefetch thread.
  int prefetchSlots = 2;
  /// Rows with non-finite features each rank may skip before the run stops
  /// (BatchLoader::setMaxBadRows).
  int64_t maxBadRows = 0;
  /// With held-out rows (TrainerInputs::evalRows): evaluate every this many
  /// steps (0: only after the last step) and after the last step; the
  /// drafter with the highest eval tau so far is exported to
  /// `<outDir>/best` (RunLayout.h).
  int64_t evalEvery = 0;
  /// Of the held-out rows, the first this many are also walked in serving
  /// order at every evaluation (ServingWalk.h; 0: none).
  int64_t evalServingRows = 0;
};

/// The host-side state a run starts from, loaded and checked before the GPU
/// is touched. Trainer::init only reads it (the trainers of a group read
/// the same one at once); the caller may drop it afterwards.
struct TrainerInputs {
  const TargetWeights *target = nullptr; ///< read by init() only
  const RowSource *rows = nullptr;       ///< must outlive the Trainer
  /// Held-out rows to evaluate on (train --eval-data), or nullptr; must
  /// outlive the Trainer.
  const RowSource *evalRows = nullptr;
  /// bf16 parameters in parameterTable order: initial, or the resumed
  /// checkpoint's.
  std::vector<std::vector<uint16_t>> params;
  /// The online target (train --target on token shards): makes each GPU's
  /// target program (the generated createTargetProgram), which computes
  /// target_hidden on the device before every step; its frozen tensors come
  /// in `targetProgramWeights`, in the order of its Frozen buffers
  /// (loadFrozenTensors). Unset: the rows carry their features.
  std::function<std::unique_ptr<StepProgram>()> targetProgram;
  const std::vector<std::vector<uint16_t>> *targetProgramWeights = nullptr;
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
  /// After every evaluation, with the run's figures (every rank has them).
  std::function<Status(const EvalMetrics &)> onEval;
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

struct GroupLayout {
  /// CUDA devices of this process, one rank each, in local rank order.
  std::vector<int> gpus = {0};
  /// With an online target: the devices of this process that run it
  /// (train --target-gpus), each for the ranks r with r % size() equal to
  /// its position; empty: every rank runs it on its own GPU before its
  /// step. A device may be in both lists (its own thread and stream).
  std::vector<int> targetGpus;
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

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_TRAIN_TRAINERSETUP_H
