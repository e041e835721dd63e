//===- TranslateToCuda.h - Planned step to a CUDA trainer -------*- C++ -*-===//
//
// The last stage of dflashc: a module after dflash-verify-lowering becomes a
// directory that nvcc builds into `train` without MLIR:
//   step.cu        the StepProgram: buffers, arena offsets, the static
//                  schedule of kernel launches (runtime/device/StepProgram.h)
//   eval.cu        the evaluation program (`train --eval-data`): the
//                  forward alone, as a StepProgram of its own
//   kernels.cu/.h  one wrapper per kernel template instantiation, so the
//                  heavy templates compile once, beside the schedule
//   main.cpp       the train command (runtime/cli/TrainMain.h)
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
  std::string stepCu, evalCu, kernelsCu, kernelsH, mainCpp, manifestJson;
};

/// Translates the planned step of `stepModule` and the planned evaluation
/// program of `evalModule` (dflash-make-eval-program, then the same
/// lowering; null: none, and the trainer refuses --eval-data), from the IR
/// alone (the drafter's config is their
/// `dflash.model_config`). Emits an error on the op that cannot be
/// translated and fails.
mlir::FailureOr<CudaTrainerSources> translateToCuda(mlir::ModuleOp stepModule,
                                                    mlir::ModuleOp evalModule);

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
