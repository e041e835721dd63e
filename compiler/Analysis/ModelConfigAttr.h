//===- ModelConfigAttr.h - The drafter's config on the module ---*- C++ -*-===//
//
// The importer records the schema's ModelConfig on the module
// (`dflash.model_config`, one entry per field, keyed by the field's
// snake_case name), so that every later stage, the emitter included, reads
// the drafter from the IR alone, never from the spec beside it.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_ANALYSIS_MODELCONFIGATTR_H
#define DFLASH_COMPILER_ANALYSIS_MODELCONFIGATTR_H

#include "schema/ModelConfig.h"

#include "mlir/IR/BuiltinOps.h"

namespace dflash {

/// The module attribute that holds the config.
constexpr llvm::StringLiteral kModelConfigAttrName = "dflash.model_config";

mlir::DictionaryAttr modelConfigToAttr(mlir::MLIRContext *context,
                                       const ModelConfig &config);

/// The config recorded on `module`, or an error on the module naming the
/// missing or mistyped field.
mlir::FailureOr<ModelConfig> modelConfigOf(mlir::ModuleOp module);

/// The spec file the module was imported from (its location), or "".
std::string specFileOf(mlir::ModuleOp module);

} // namespace dflash

#endif // DFLASH_COMPILER_ANALYSIS_MODELCONFIGATTR_H
