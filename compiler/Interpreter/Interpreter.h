//===- Interpreter.h - Runs a dflash step on the CPU ------------*- C++ -*-===//
//
// The reference executor: evaluates `@step` at any stage of the pipeline op by
// op with the plain C++ kernels of kernels/reference. It is the oracle the
// generated trainer answers to, and the engine of `dflash-reference`.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_INTERPRETER_INTERPRETER_H
#define DFLASH_COMPILER_INTERPRETER_INTERPRETER_H

#include "dialect/DFlashOps.h"
#include "kernels/reference/Reference.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <cstdint>
#include <vector>

namespace dflash {

/// A tensor on the host. Every element is a double: float values, and
/// integers (indices and flags) that fit exactly.
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<double> data;

  HostTensor() = default;
  explicit HostTensor(std::vector<int64_t> shape);
  int64_t numel() const;
};

enum class Precision {
  /// No rounding anywhere: fp64 arithmetic on the values given. For gradient
  /// checks and for comparisons with an fp32 oracle.
  Exact,
  /// Every op result is rounded to its element type (bf16, f32), as the GPU
  /// stores it; the arithmetic inside an op stays wide.
  Storage,
};

/// The CPU reference's YaRN scaling for a rope op's `theta` and
/// #dflash.yarn attribute (what the interpreter rotates by).
ref::YarnScaling referenceYarnScaling(double theta,
                                      mlir::dflash::YarnAttr yarn);

class StepInterpreter {
public:
  StepInterpreter(mlir::func::FuncOp step, Precision precision)
      : step(step), precision(precision) {}

  /// Runs the step on `args` (one per argument, in order, with the
  /// argument's shape) and returns one tensor per result. On a shape mismatch
  /// or an op it cannot run, emits an error on the op and fails.
  mlir::FailureOr<std::vector<HostTensor>>
  run(const std::vector<HostTensor> &args);

private:
  mlir::func::FuncOp step;
  Precision precision;
};

} // namespace dflash

#endif // DFLASH_COMPILER_INTERPRETER_INTERPRETER_H
