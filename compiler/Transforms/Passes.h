//===- Passes.h - dflash compiler passes ------------------------*- C++ -*-===//

#ifndef DFLASH_COMPILER_TRANSFORMS_PASSES_H
#define DFLASH_COMPILER_TRANSFORMS_PASSES_H

#include "dialect/DFlashOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace dflash {

#define GEN_PASS_DECL
#include "compiler/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "compiler/Transforms/Passes.h.inc"

} // namespace dflash

#endif // DFLASH_COMPILER_TRANSFORMS_PASSES_H
