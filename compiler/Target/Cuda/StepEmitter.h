//===- StepEmitter.h - Prints one program -----------------------*- C++ -*-===//
//
// The printer of one program (step.cu, eval.cu or target.cu) from its
// planned module: ProgramTables.cpp names its buffers and arena slots and
// prints its tables and class, LaunchPrinter.cpp prints one launch an op.
// Internal to compiler/Target/Cuda.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_TARGET_CUDA_STEPEMITTER_H
#define DFLASH_COMPILER_TARGET_CUDA_STEPEMITTER_H

#include "compiler/Analysis/StepSignature.h"
#include "dialect/DFlashOps.h"
#include "schema/ModelConfig.h"
#include "schema/StepBuffers.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/raw_ostream.h"

#include <optional>
#include <string>
#include <vector>

namespace dflash::cuda_printer {

using llvm::ArrayRef;
using llvm::StringRef;
using mlir::BlockArgument;
using mlir::FailureOr;
using mlir::LogicalResult;
using mlir::ModuleOp;
using mlir::Operation;
using mlir::Value;
using mlir::dflash::AdamWMultiOp;
using mlir::dflash::AdamWShardedOp;
using mlir::dflash::KernelAttr;

/// The wrappers of kernel template instantiations that kernels.cu holds,
/// shared by the programs of a trainer (the step and the evaluation), so
/// that each instantiation is compiled once.
struct KernelWrappers {
  std::string decls, defs;
  llvm::StringSet<> names;
};

/// Prints one program: the step (step.cu) or the evaluation (eval.cu).
class StepEmitter {
public:
  StepEmitter(ModuleOp module, const ModelConfig &config,
              const StepSignature &sig, KernelWrappers &wrappers)
      : module(module), config(config), sig(sig), wrappers(wrappers) {}

  /// The program's source file.
  FailureOr<std::string> emit();

private:
  ModuleOp module;
  const ModelConfig &config;
  const StepSignature &sig;
  KernelWrappers &wrappers;
  std::string body;
  llvm::raw_string_ostream os{body};
  /// The named constants of step.cu: buffers, then arena slots.
  std::string bufferNames, slotNames;
  llvm::DenseMap<unsigned, std::string> bufferName; ///< by argument number
  llvm::DenseMap<Value, std::string> slotName;      ///< by storage root
  /// A target program's results: written straight into their buffers.
  llvm::DenseMap<Value, std::string> outputBuffer;
  /// The slots of each op's workspace and tables.
  llvm::DenseMap<Operation *, std::string> workspaceSlot, tablesSlot;
  llvm::StringSet<> usedNames;
  std::optional<AdamWMultiOp> optimizer;
  /// ZeRO-1: the optimizer updates this GPU's shards (instead of optimizer).
  std::optional<AdamWShardedOp> shardedOptimizer;
  KernelAttr optimizerKernel;
  int64_t optimizerTablesOffset = 0;
  /// What each profiled op is, in schedule order.
  std::vector<std::string> opNames;
  size_t numBuckets = 0;

  /// A fresh C++ name for `base` in the namespace `ns`.
  std::string uniqueName(StringRef ns, const std::string &base) {
    std::string name = base;
    for (int i = 2; !usedNames.insert((ns + "::" + name).str()).second; ++i)
      name = base + "_" + std::to_string(i);
    return name;
  }

  LogicalResult nameBuffers();
  LogicalResult nameSlots();
  /// The schema's index of argument `i` within its role (BufferSpec::index).
  FailureOr<int64_t> bufferIndex(unsigned i);
  /// A metric's index: its StepMetric, or in an evaluation its ForwardSum.
  std::optional<int64_t> metricSchemaIndex(const std::string &name) const {
    if (sig.isEval()) {
      if (auto sum = parseForwardSum(name))
        return int64_t(*sum);
    } else if (auto metric = parseStepMetric(name)) {
      return int64_t(*metric);
    }
    return std::nullopt;
  }

  /// A typed device pointer to `v`'s storage.
  std::string ptr(Value v);
  /// The named slot of `op`'s workspace.
  std::string workspace(Operation *op, StringRef type);
  std::string bufferRef(Value arg) {
    return "buffer::" +
           bufferName.lookup(mlir::cast<BlockArgument>(arg).getArgNumber());
  }

  /// The wrapper of `kernel`'s template instantiation (its form:
  /// schema/KernelEntryPoints.h), declared once.
  std::string wrapper(KernelAttr kernel);

  /// The draft-block shape of an op whose `perBlock` operand is [B, N]:
  /// kBlocks for a micro-batch's rows, else one of the same blocks.
  std::string blocks(Value perBlock);

  LogicalResult emitOp(Operation *op);
  LogicalResult emitKernel(Operation *op, KernelAttr kernel);
  /// The DFlash2 selector's ops (kernels/DFlash2Selector.cuh).
  LogicalResult emitSelector(Operation *op, KernelAttr kernel);
  void emitNorm(KernelAttr kernel, Value input, Value delta, Value weight,
                Value sum, Value result, double eps);
  void emitNormGrad(Operation *op, KernelAttr kernel, Value residualGrad);
  void emitAttention(Operation *op, KernelAttr kernel, bool backward);
  std::string optimizerTables();
  std::string shardTables();
};

} // namespace dflash::cuda_printer

#endif // DFLASH_COMPILER_TARGET_CUDA_STEPEMITTER_H
