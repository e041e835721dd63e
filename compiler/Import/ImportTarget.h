//===- ImportTarget.h - The online target's forward graph -------*- C++ -*-===//

#ifndef DFLASH_COMPILER_IMPORT_IMPORTTARGET_H
#define DFLASH_COMPILER_IMPORT_IMPORTTARGET_H

#include "compiler/Import/TargetConfig.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace dflash {

/// Builds the forward of `target` for one step of `spec` (B = rows per GPU,
/// S = seq_len) as `func.func @target` in a new module: decoder layers 0 to
/// the last of spec's target layer ids, returning the residual stream after
/// each tapped layer concatenated in their order, [B, S, L*H] bf16. Weights
/// are frozen arguments with their Hugging Face names. Ops are located at
/// config.json, named by the checkpoint's tensor group. The module verifies
/// (null if not).
mlir::OwningOpRef<mlir::ModuleOp> importTarget(mlir::MLIRContext &context,
                                               const DrafterSpec &spec,
                                               const TargetModelConfig &target);

} // namespace dflash

#endif // DFLASH_COMPILER_IMPORT_IMPORTTARGET_H
