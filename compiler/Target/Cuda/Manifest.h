//===- Manifest.h - manifest.json of a generated trainer --------*- C++ -*-===//

#ifndef DFLASH_COMPILER_TARGET_CUDA_MANIFEST_H
#define DFLASH_COMPILER_TARGET_CUDA_MANIFEST_H

#include "compiler/Analysis/StepSignature.h"
#include "schema/ModelConfig.h"

#include <string>

namespace dflash {

/// What the generated trainer holds, for people and tools: the drafter's
/// shapes, every buffer (name, role, dtype, shape, bytes), the parameters,
/// every kernel launch with its FLOPs and spec location, the arena and the
/// memory estimate, and the FLOPs per step.
std::string writeManifest(mlir::ModuleOp module, const ModelConfig &config,
                          const StepSignature &sig);

} // namespace dflash

#endif // DFLASH_COMPILER_TARGET_CUDA_MANIFEST_H
