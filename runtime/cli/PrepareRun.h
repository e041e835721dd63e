//===- PrepareRun.h - Everything a run needs from the host ------*- C++ -*-===//
//
// Host code (no CUDA): the data, target weights, initial or resumed state
// of a run, loaded and checked before any GPU is touched.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_CLI_PREPARERUN_H
#define DFLASH_RUNTIME_CLI_PREPARERUN_H

#include "runtime/cli/TrainOptions.h"
#include "runtime/data/RowSource.h"
#include "runtime/data/Synthetic.h"
#include "runtime/io/TargetWeights.h"
#include "runtime/train/TrainerSetup.h"

#include <cstdint>
#include <memory>
#include <string>

namespace dflash::rt {

/// Everything a run needs from the host, loaded and checked. Holds the
/// target weights and the row source that TrainerInputs points to, so it
/// stays where it was built.
struct PreparedRun {
  PreparedRun() = default;
  PreparedRun(const PreparedRun &) = delete;
  PreparedRun &operator=(const PreparedRun &) = delete;

  std::unique_ptr<SyntheticProblem> synthetic;
  std::unique_ptr<RowSource> rows;
  std::unique_ptr<RowSource> evalRows; ///< --eval-data, if given
  TargetWeights loadedTarget;
  /// The online target's frozen tensors (TrainerInputs::targetProgramWeights).
  std::vector<std::vector<uint16_t>> targetProgramWeights;
  TrainerInputs inputs;
  TrainerOptions trainer;
  std::string resumedFrom; ///< the checkpoint directory, when resuming
  std::string logPath;
  /// This process's GPUs and place among the run's processes.
  GroupLayout layout;
};

/// Loads the data, target weights, initial parameters or resumed state and
/// settles the run's settings (a resumed run keeps its checkpoint's schedule
/// length, seed and synthetic rows; giving different ones is an error). The
/// run has `nodes` processes of options.gpus each; this one is `node`; a
/// resumed run must have the world size (nodes x GPUs) of its checkpoint.
/// Everything of a run the host can check and load before a GPU is touched.
/// `onlineTarget`: the buffers of the trainer's compiled online target
/// (createTargetProgram), or null when it has none. With one, shard data
/// may be token shards: the target's tensors are loaded from --target by
/// name and the features computed on the GPU (features stored in the
/// shards are then not read).
Status prepareRun(const TrainOptions &options, const ModelConfig &config,
                  PreparedRun &run, int64_t node = 0, int64_t nodes = 1,
                  const std::vector<BufferSpec> *onlineTarget = nullptr);

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_CLI_PREPARERUN_H
