//===- ImportSpec.h - Spec to dflash forward graph --------------*- C++ -*-===//

#ifndef DFLASH_COMPILER_IMPORT_IMPORTSPEC_H
#define DFLASH_COMPILER_IMPORT_IMPORTSPEC_H

#include "compiler/Spec/Spec.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace dflash {

/// Builds the forward graph of one training step of `spec` (docs/semantics.md
/// section 3 and 4) as `func.func @step` in a new module. Ops carry the spec
/// location of the entry they come from. The module verifies. A DFlash2
/// spec (section 13) is refused, with an error at its [drafter.dflash2]
/// table, until its lowering is built.
mlir::OwningOpRef<mlir::ModuleOp> importSpec(mlir::MLIRContext &context,
                                             const DrafterSpec &spec);

} // namespace dflash

#endif // DFLASH_COMPILER_IMPORT_IMPORTSPEC_H
