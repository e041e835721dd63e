//===- TargetProgram.h - The online target on the CPU -----------*- C++ -*-===//
//
// The spec's @target (compiler/Import/ImportTarget) for rows of a given
// shape, with its weights loaded by Hugging Face name from the target's
// checkpoint, run in the reference interpreter: what dflash-target-features
// writes into feature shards and what `dflash-reference --online-target`
// feeds each step.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_TOOLS_DFLASHREFERENCE_TARGETPROGRAM_H
#define DFLASH_TOOLS_DFLASHREFERENCE_TARGETPROGRAM_H

#include "compiler/Import/TargetConfig.h"
#include "compiler/Interpreter/Interpreter.h"
#include "schema/Status.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dflash {

class TargetProgram {
public:
  /// Reads `dir`'s config.json (checked against `spec`), builds @target for
  /// `rows` rows of `seqLen` tokens and loads its weights from `dir`.
  Status load(mlir::MLIRContext &context, const DrafterSpec &spec,
              const std::string &dir, int64_t rows, int64_t seqLen);

  /// load() in two halves: the program (what a run's estimate counts), then
  /// its weights from `dir`.
  Status build(mlir::MLIRContext &context, const DrafterSpec &spec,
               const std::string &dir, int64_t rows, int64_t seqLen);
  Status loadWeights(const std::string &dir);

  /// @target, once built.
  mlir::func::FuncOp func() const;

  /// The features [rows, seqLen, L*H] of ids and positions ([rows, seqLen]
  /// each; ids inside the vocabulary), as bf16 bits.
  Status run(const std::vector<int32_t> &ids,
             const std::vector<int32_t> &positions, Precision precision,
             std::vector<uint16_t> &features) const;

  const TargetModelConfig &config() const { return target; }
  /// [rows, seqLen, L*H].
  const std::vector<int64_t> &featureShape() const { return shape; }

private:
  TargetModelConfig target;
  mlir::OwningOpRef<mlir::ModuleOp> module;
  std::vector<HostTensor> weights;
  std::vector<int64_t> shape;
};

} // namespace dflash

#endif // DFLASH_TOOLS_DFLASHREFERENCE_TARGETPROGRAM_H
