//===- Pipelines.h - The dflashc pass pipelines -----------------*- C++ -*-===//
//
// Library functions shared by dflashc and dflash-opt, so that both run the
// same passes in the same order.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_PIPELINES_PIPELINES_H
#define DFLASH_COMPILER_PIPELINES_PIPELINES_H

#include "mlir/Pass/PassManager.h"
#include "schema/KernelEntryPoints.h"

namespace dflash {

/// Forward graph -> the whole training step at graph level (--emit=train):
/// generate-backward, append-optimizer.
void buildTrainStepPipeline(mlir::OpPassManager &pm);

/// The whole step -> kernels with a static memory plan, ready for
/// translation to CUDA (--emit=planned): fuse-kernels, bucket-gradients,
/// plan-memory, verify-lowering. `budgetGiB` > 0 overrides the spec's memory
/// budget; `allowed` lets select-kernels pick kernels whose GPU tests have
/// not passed yet (dflashc --allow-unvalidated-kernels, or those named by
/// --allow-unvalidated-kernel).
void buildLowerToKernelsPipeline(
    mlir::OpPassManager &pm, double budgetGiB = 0,
    const UnvalidatedKernelAllowance &allowed = {});

/// The evaluation program (dflash-make-eval-program on the forward graph) ->
/// kernels with a memory plan of its own (--emit=planned --program=eval):
/// fuse-kernels, select-kernels, plan-memory, verify-lowering.
void buildLowerEvalToKernelsPipeline(
    mlir::OpPassManager &pm, const UnvalidatedKernelAllowance &allowed = {});

/// Registers every dflash pass and pipeline with the global registry (for
/// dflash-opt).
void registerDFlashPassesAndPipelines();

} // namespace dflash

#endif // DFLASH_COMPILER_PIPELINES_PIPELINES_H
