//===- StepSignature.h - Arguments and results of @step by role -*- C++ -*-===//
//
// Passes, the interpreter and the emitter find the step's values by what they
// are (`#dflash.arg<parameter, "fc.weight">`), never by position.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_ANALYSIS_STEPSIGNATURE_H
#define DFLASH_COMPILER_ANALYSIS_STEPSIGNATURE_H

#include "dialect/DFlashOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace dflash {

/// The program of a module: the training step, or (in modules of their own)
/// the evaluation program of dflash-make-eval-program and the online
/// target's forward (compiler/Import/ImportTarget).
constexpr const char *kStepFunctionName = "step";
constexpr const char *kEvalFunctionName = "eval";
constexpr const char *kTargetFunctionName = "target";

/// The attribute dictionary of a @step argument or result that holds
/// `#dflash.arg<role, name>`.
mlir::DictionaryAttr argAttrDict(mlir::MLIRContext *ctx,
                                 mlir::dflash::ArgRole role,
                                 llvm::StringRef name);

class StepSignature {
public:
  /// The program of `module` (`@step`, else `@eval`, else `@target`), or an
  /// error on the module when there is none or an argument or result lacks
  /// its #dflash.arg.
  static mlir::FailureOr<StepSignature> get(mlir::ModuleOp module);

  /// Whether this is an evaluation program (@eval): no gradients, no
  /// optimizer, its metrics are ForwardSums.
  bool isEval() const;
  /// Whether this is the online target's forward (@target): frozen weights
  /// in, the tapped features (`target_hidden`) out, no metrics.
  bool isTarget() const;

  mlir::func::FuncOp func() const { return step; }
  mlir::func::ReturnOp returnOp() const;

  mlir::dflash::ArgAttr argInfo(unsigned i) const;
  mlir::dflash::ArgAttr resultInfo(unsigned i) const;

  /// Index of the argument or result with this role and name, if any.
  std::optional<unsigned> findArg(mlir::dflash::ArgRole role,
                                  llvm::StringRef name) const;
  std::optional<unsigned> findResult(mlir::dflash::ArgRole role,
                                     llvm::StringRef name) const;

  /// Indices of every argument with this role, in order.
  llvm::SmallVector<unsigned> argsWithRole(mlir::dflash::ArgRole role) const;
  llvm::SmallVector<unsigned> resultsWithRole(mlir::dflash::ArgRole role) const;

private:
  explicit StepSignature(mlir::func::FuncOp step) : step(step) {}
  mutable mlir::func::FuncOp step; // FuncOp accessors are not const
};

} // namespace dflash

#endif // DFLASH_COMPILER_ANALYSIS_STEPSIGNATURE_H
