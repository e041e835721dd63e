//===- Summary.h - One-screen summary of a compiled spec --------*- C++ -*-===//

#ifndef DFLASH_COMPILER_DRIVER_SUMMARY_H
#define DFLASH_COMPILER_DRIVER_SUMMARY_H

#include "compiler/Spec/Spec.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

namespace dflash {

/// Prints the shapes, the attention kind and window of every layer, the
/// parameter count, the FLOPs per step of `module`, which holds the step of
/// `spec` at any stage of the pipeline from train on, and its time and
/// context tokens an hour on an H100 and an H200 (compiler/Analysis/
/// StepTime.h); once it is planned, the memory it needs per GPU, and with
/// `target` (the online target's planned module) the target's and the two
/// together. `targetGiven`: the spec has an online target, which `target`
/// lacks where it did not lower (the summary says so).
void printStepSummary(llvm::raw_ostream &os, const DrafterSpec &spec,
                      mlir::ModuleOp module,
                      mlir::ModuleOp target = mlir::ModuleOp(),
                      bool targetGiven = false);

} // namespace dflash

#endif // DFLASH_COMPILER_DRIVER_SUMMARY_H
