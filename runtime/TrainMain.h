//===- TrainMain.h - The command line of the `train` binary -----*- C++ -*-===//
//
// The generated trainer's main() is one call:
//
//   int main(int argc, char **argv) {
//     return dflash::rt::trainMain(argc, argv, &dflash::rt::createStepProgram);
//   }
//
// trainMain parses and checks the whole command line, loads the target
// weights, data, initial or resumed state on the host, and only then looks
// for a GPU, so that every mistake in the command line is reported (as
// "train: error: <what>", exit code 1) on any machine. The pieces are public
// for tests.
//
// One process trains on every GPU of its node (--gpus, default all visible
// devices), one thread per GPU (TrainerGroup). Under `mpirun -np NODES`
// each node's process joins the others through MPI; node 0 writes the log,
// the progress display and the checkpoints, and an error on any node ends
// every process of the run (docs/runtime.md).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_TRAINMAIN_H
#define DFLASH_RUNTIME_TRAINMAIN_H

#include "schema/ModelConfig.h"
#include "schema/Status.h"
#include "runtime/StepProgram.h"
#include "runtime/Synthetic.h"
#include "runtime/TargetWeights.h"
#include "runtime/Trainer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dflash::rt {

/// The options of `train`, as given or defaulted.
struct TrainOptions {
  std::string target; ///< --target: the target's HF directory
  std::string data;   ///< --data: "synthetic" or shards
  std::string out = "./dflash-out";
  std::string resume;          ///< --resume: checkpoint or output directory
  std::string init;            ///< --init: exported drafter checkpoint
  std::string log;             ///< --log; empty: <out>/metrics.jsonl
  int64_t steps = 0;           ///< --steps: stop after this many in total
  int64_t totalSteps = 0;      ///< --total-steps; 0: not given
  int64_t saveEvery = 0;       ///< --save-every; 0: only at the end
  int64_t rows = 256;          ///< --rows of synthetic data
  int64_t progressEvery = 10;  ///< --progress-every (plain output)
  double lr = 0;               ///< --lr; default the config's
  double warmupRatio = 0;      ///< --warmup-ratio; default the config's
  uint64_t seed = 0;           ///< --seed; default the config's
  std::vector<int> gpus;       ///< --gpus; empty: every visible device
  bool noGraph = false;        ///< --no-graph
  bool nccl = false;           ///< --nccl: collectives even on one GPU

  /// Options whose value on resume comes from the checkpoint unless given.
  bool givenTotalSteps = false, givenLr = false, givenWarmupRatio = false,
       givenSeed = false, givenRows = false;
};

enum class CommandLineAction { Train, ShowHelp, Fail };

/// Parses `train`'s arguments with defaults from `config`. ShowHelp puts the
/// help text into `text`; Fail puts the error (without "train: error: ").
CommandLineAction parseTrainCommandLine(int argc, const char *const *argv,
                                        const ModelConfig &config,
                                        TrainOptions &options,
                                        std::string &text);

/// Checks what needs no data loaded: numbers in range, paths that exist,
/// an output directory that can be written (created when missing) and does
/// not hold another run unless it is resumed, a GPU list without repeats
/// and the collectives it needs in this build.
Status validateTrainOptions(const TrainOptions &options,
                            const ModelConfig &config);

/// Fills an empty --gpus with every device of `visibleDevices` (or device
/// 0 when there is none, so that the host checks run and the missing
/// device is reported after them); checks that several GPUs can be used.
Status resolveGpus(TrainOptions &options, int visibleDevices);

/// Everything a run needs from the host, loaded and checked. Holds the
/// target weights and the row source that TrainerInputs points to, so it
/// stays where it was built.
struct PreparedRun {
  PreparedRun() = default;
  PreparedRun(const PreparedRun &) = delete;
  PreparedRun &operator=(const PreparedRun &) = delete;

  std::unique_ptr<SyntheticProblem> synthetic;
  std::unique_ptr<RowSource> rows;
  TargetWeights loadedTarget;
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
Status prepareRun(const TrainOptions &options, const ModelConfig &config,
                  PreparedRun &run, int64_t node = 0, int64_t nodes = 1);

/// The whole `train` command; returns the process exit code: 0 when done,
/// 1 on an error, 128 + the signal after SIGINT or SIGTERM (with a
/// checkpoint saved). `factory` builds the compiled step; it must not touch
/// the GPU (bind() does).
int trainMain(int argc, char **argv, std::unique_ptr<StepProgram> (*factory)());

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_TRAINMAIN_H
