//===- TrainMain.h - The command line of the `train` binary -----*- C++ -*-===//
//
// The generated trainer's main() is one call:
//
//   int main(int argc, char **argv) {
//     return dflash::rt::trainMain(argc, argv,
//                                  {&dflash::rt::createStepProgram,
//                                   &dflash::rt::createEvalProgram,
//                                   &dflash::rt::createTargetProgram});
//   }
//
// trainMain parses and checks the whole command line, loads the target
// weights, data, initial or resumed state on the host, and only then looks
// for a GPU, so that every mistake in the command line is reported (as
// "train: error: <what>", exit code 1) on any machine. The pieces are public
// for tests (runtime/cli/TrainOptions.h, runtime/cli/PrepareRun.h).
//
// One process trains on every GPU of its node (--gpus, default all visible
// devices), one thread per GPU (TrainerGroup). Under `mpirun -np NODES`
// each node's process joins the others through MPI; node 0 writes the log,
// the progress display and the checkpoints, and an error on any node ends
// every process of the run (docs/runtime.md).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_CLI_TRAINMAIN_H
#define DFLASH_RUNTIME_CLI_TRAINMAIN_H

#include "runtime/device/StepProgram.h"

#include <memory>

namespace dflash::rt {

/// What a generated trainer is built with: its compiled step, its
/// evaluation program and its online target (StepProgram.h). None may touch
/// the GPU (bind() does); `eval` may be null, or return null, for a trainer
/// without one, which then refuses --eval-data; `target` likewise, and the
/// trainer then reads the features from its shards.
struct GeneratedPrograms {
  std::unique_ptr<StepProgram> (*step)() = nullptr;
  std::unique_ptr<StepProgram> (*eval)() = nullptr;
  std::unique_ptr<StepProgram> (*target)() = nullptr;
};

/// The whole `train` command; returns the process exit code: 0 when done,
/// 1 on an error, 128 + the signal after SIGINT or SIGTERM (with a
/// checkpoint saved).
int trainMain(int argc, char **argv, GeneratedPrograms programs);
/// The same for a trainer without an evaluation program.
int trainMain(int argc, char **argv, std::unique_ptr<StepProgram> (*step)());

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_CLI_TRAINMAIN_H
