//===- TranslateToCuda.h - Planned step to a CUDA trainer -------*- C++ -*-===//
//
// The last stage of dflashc: a module after dflash-verify-lowering becomes a
// directory that nvcc builds into `train` without MLIR:
//   step.cu        the StepProgram: buffers, arena offsets, the static
//                  schedule of kernel launches (runtime/device/StepProgram.h)
//   eval.cu        the evaluation program (`train --eval-data`): the
//                  forward alone, as a StepProgram of its own
//   target.cu      the online target's forward (`train --target` on token
//                  shards), a StepProgram writing the step's target_hidden
//   kernels.cu/.h  one wrapper per kernel template instantiation, so the
//                  heavy templates compile once, beside the schedule
//   main.cpp       the train command (runtime/cli/TrainMain.h)
//   target_features_main.cpp
//                  the target-features command: the online target alone
//                  (runtime/cli/TargetFeaturesMain.h)
//   manifest.json  buffers, parameters, kernels with FLOPs, memory
//   CMakeLists.txt builds `train` from these and a copy of schema/,
//                  runtime/ and kernels/ under dflash/
//                  (runtime/TrainerProject.cmake)
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_TARGET_CUDA_TRANSLATETOCUDA_H
#define DFLASH_COMPILER_TARGET_CUDA_TRANSLATETOCUDA_H

#include "mlir/IR/BuiltinOps.h"

#include <string>

namespace dflash {

struct CudaTrainerOptions {
  /// Directory to write; created if missing.
  std::string outputDir;
  /// The dflashc source tree holding runtime/ and kernels/ to copy.
  std::string sourceDir;
};

/// The generated sources of one trainer, in memory.
struct CudaTrainerSources {
  std::string stepCu, evalCu, targetCu, kernelsCu, kernelsH, mainCpp,
      targetMainCpp, manifestJson;
};

/// Translates the planned step of `stepModule`, the planned evaluation
/// program of `evalModule` (dflash-make-eval-program, then the same
/// lowering; null: none, and the trainer refuses --eval-data) and the
/// planned online target of `targetModule` (compiler/Import/ImportTarget,
/// then the same lowering; null: none, and the trainer reads features from
/// its shards), from the IR alone (the drafter's config is their
/// `dflash.model_config`). Emits an error on the op that cannot be
/// translated and fails.
mlir::FailureOr<CudaTrainerSources>
translateToCuda(mlir::ModuleOp stepModule, mlir::ModuleOp evalModule,
                mlir::ModuleOp targetModule = nullptr);

/// Writes the sources and the copies of runtime/ and kernels/ into
/// options.outputDir. Errors name the file.
mlir::LogicalResult writeCudaTrainer(const CudaTrainerSources &sources,
                                     const CudaTrainerOptions &options,
                                     std::string &error);

/// Configures and builds `train` in options.outputDir with cmake and nvcc,
/// then places the binary at outputDir/train. Streams the build's output to
/// `log`; on failure sets `error`.
mlir::LogicalResult buildCudaTrainer(const CudaTrainerOptions &options,
                                     llvm::raw_ostream &log,
                                     std::string &error);

} // namespace dflash

#endif // DFLASH_COMPILER_TARGET_CUDA_TRANSLATETOCUDA_H
