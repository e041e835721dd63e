//===- TargetFeaturesMain.h - The `target-features` binary ------*- C++ -*-===//
//
// A trainer compiled with `dflashc --target DIR` also gets `target-features`,
// whose main() is one call:
//
//   int main(int argc, char **argv) {
//     return dflash::rt::targetFeaturesMain(argc, argv,
//                                           &dflash::rt::createTargetProgram);
//   }
//
// It runs the compiled target program (target.cu) on one GPU, either over
// the rows of a token shard, writing a feature shard as
// `dflash-target-features` (the CPU reference) and `dflash-prepare features`
// do, or, with --bench, on random weights and tokens to time it. The first
// checks the compiled target against transformers and the CPU oracle; the
// second is its throughput figure (bench/RESULTS.md).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_CLI_TARGETFEATURESMAIN_H
#define DFLASH_RUNTIME_CLI_TARGETFEATURESMAIN_H

#include "runtime/device/StepProgram.h"

#include <memory>

namespace dflash::rt {

/// The whole `target-features` command; returns the exit code (0 done, 1 on
/// an error, with "target-features: error: <what>").
int targetFeaturesMain(int argc, char **argv,
                       std::unique_ptr<StepProgram> (*target)());

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_CLI_TARGETFEATURESMAIN_H
