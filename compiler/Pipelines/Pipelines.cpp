//===- Pipelines.cpp - The dflashc pass pipelines -------------------------===//

#include "compiler/Pipelines/Pipelines.h"

#include "compiler/Transforms/Passes.h"
#include "mlir/Pass/PassRegistry.h"

namespace {
dflash::SelectKernelsOptions
selectKernelsOptions(const dflash::UnvalidatedKernelAllowance &allowed) {
  dflash::SelectKernelsOptions options;
  options.allowUnvalidatedKernels = allowed.all;
  options.allowUnvalidatedKernelNames.assign(allowed.names.begin(),
                                             allowed.names.end());
  return options;
}
} // namespace

void dflash::buildTrainStepPipeline(mlir::OpPassManager &pm) {
  pm.addPass(createGenerateBackward());
  pm.addPass(createAppendOptimizer());
}

void dflash::buildLowerToKernelsPipeline(
    mlir::OpPassManager &pm, double budgetGiB,
    const UnvalidatedKernelAllowance &allowed) {
  pm.addPass(createFuseKernels());
  pm.addPass(createInterleaveMicroBatches());
  pm.addPass(createRecomputeActivations());
  pm.addPass(createBucketGradients());
  pm.addPass(createShardOptimizerState());
  pm.addPass(createSelectKernels(selectKernelsOptions(allowed)));
  PlanMemoryOptions options;
  options.budgetGiB = budgetGiB;
  pm.addPass(createPlanMemory(options));
  pm.addPass(createVerifyLowering());
}

void dflash::buildLowerEvalToKernelsPipeline(
    mlir::OpPassManager &pm, const UnvalidatedKernelAllowance &allowed) {
  // No gradients to bucket, no optimizer state to shard.
  pm.addPass(createFuseKernels());
  pm.addPass(createSelectKernels(selectKernelsOptions(allowed)));
  pm.addPass(createPlanMemory());
  pm.addPass(createVerifyLowering());
}

void dflash::registerDFlashPassesAndPipelines() {
  registerDFlashPasses();
  mlir::PassPipelineRegistration<>(
      "dflash-train-step",
      "Forward graph to the whole training step (what --emit=train prints)",
      [](mlir::OpPassManager &pm) { buildTrainStepPipeline(pm); });
  mlir::PassPipelineRegistration<>(
      "dflash-lower-to-kernels",
      "Whole step to fused kernels with a memory plan (--emit=planned)",
      [](mlir::OpPassManager &pm) { buildLowerToKernelsPipeline(pm); });
  mlir::PassPipelineRegistration<>(
      "dflash-lower-eval-to-kernels",
      "Evaluation program to fused kernels with a memory plan "
      "(--emit=planned --program=eval)",
      [](mlir::OpPassManager &pm) { buildLowerEvalToKernelsPipeline(pm); });
}
