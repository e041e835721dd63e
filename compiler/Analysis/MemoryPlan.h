//===- MemoryPlan.h - Sizes, aliases, lifetimes of values -------*- C++ -*-===//
//
// Shared by dflash-plan-memory (which decides offsets), its print pass and
// the CUDA emitter (which reads them): how many bytes a value needs, which
// values share another's bytes, and where the plan is stored.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_ANALYSIS_MEMORYPLAN_H
#define DFLASH_COMPILER_ANALYSIS_MEMORYPLAN_H

#include "dialect/DFlashOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <optional>

namespace dflash {

/// The attribute names the plan is stored under. dflash.offsets: one per
/// result, its byte offset in the arena, or -(b + 1) when it lives in buffer
/// b: an argument's (updated in place, or a view of it), or a target
/// program's output buffer, numbered after the arguments.
inline constexpr llvm::StringLiteral kOffsetsAttrName = "dflash.offsets";
inline constexpr llvm::StringLiteral kArenaBytesAttrName = "dflash.arena_bytes";
inline constexpr llvm::StringLiteral kBudgetAttrName =
    "dflash.memory_budget_gib";
/// dflash-select-kernels: the #dflash.kernel of each kernel op.
inline constexpr llvm::StringLiteral kKernelAttrName = "dflash.kernel";
/// dflash-plan-memory: the arena offsets of an op's workspace and tables.
inline constexpr llvm::StringLiteral kWorkspaceOffsetAttrName =
    "dflash.workspace_offset";
inline constexpr llvm::StringLiteral kTablesOffsetAttrName =
    "dflash.tables_offset";

/// Alignment of every arena slot (cuBLASLt and 16-byte vector access).
constexpr int64_t kArenaAlignment = 256;

/// Bytes of a statically shaped tensor.
int64_t tensorBytes(mlir::Type type);

/// The value whose bytes `v` uses: itself, or for views and in-place
/// results the value they are written over (possibly an argument).
mlir::Value storageRoot(mlir::Value v);

/// Where `v` starts in its storage root's bytes: 0, or for a row slice
/// (a micro-batch's rows) the bytes of the rows before it.
int64_t viewByteOffset(mlir::Value v);

/// Byte offsets of a gradient bucket's results inside its one slot, in
/// result order: each starts 256-byte aligned, so a kernel may read any of
/// them with vector loads.
llvm::SmallVector<int64_t>
bucketResultOffsets(mlir::dflash::GradientBucketOp bucket);

/// fp32 elements from the start of the bucket's slot to the end of its last
/// result: the flat range its collective covers.
int64_t bucketFlatElements(mlir::dflash::GradientBucketOp bucket);

/// Bytes of the bucket's slot: its flat range, padded to world_size x
/// shard_elements fp32 when it is sharded (the reduce-scatter's buffer).
int64_t bucketSlotBytes(mlir::dflash::GradientBucketOp bucket);

/// The #dflash.kernel of `op`, or null before dflash-select-kernels.
mlir::dflash::KernelAttr kernelOf(mlir::Operation *op);

/// What one planned program needs on its GPU: its arguments (parameters,
/// optimizer state, frozen weights, and its inputs; the frozen weights, the
/// fp32 optimizer state and the inputs also counted apart), a target
/// program's output buffers (its features, `target_hidden`, and any other
/// results, such as the experts it chose), the arena (kernel scratch
/// included) and cuBLASLt's workspace. A step and the online target beside
/// it share only the features (the target writes them into the step's
/// input): together they need both totals less `features`.
struct ProgramMemory {
  int64_t arguments = 0, inputs = 0, frozen = 0, optimizerState = 0,
          features = 0, outputs = 0, arena = 0, workspace = 0;
  int64_t total() const {
    return arguments + features + outputs + arena + workspace;
  }
  /// The arguments that do not grow with the rows.
  int64_t fixed() const { return arguments - inputs; }
  /// The plan of `module`'s program, or nothing before dflash-plan-memory.
  static std::optional<ProgramMemory> of(mlir::ModuleOp module);

  /// As a dictionary of byte counts (`dflash.online_target_memory`), and
  /// back: nothing where a field is missing or not an integer.
  mlir::DictionaryAttr toAttr(mlir::MLIRContext *context) const;
  static std::optional<ProgramMemory> fromAttr(mlir::Attribute attr);
};

/// The online target's ProgramMemory, which the driver gives the step's
/// module once the target is planned, so that dflash-plan-memory holds the
/// two together to the memory budget; with `kOnlineTargetApartAttrName`
/// (dflashc --target-gpus: the trainer runs the target on GPUs of its own,
/// train --target-gpus) each of them alone.
inline constexpr llvm::StringLiteral kOnlineTargetMemoryAttrName =
    "dflash.online_target_memory";
inline constexpr llvm::StringLiteral kOnlineTargetApartAttrName =
    "dflash.online_target_apart";

/// Replays a planned step in order, tracking which value every arena byte
/// holds, and fails (with an error at the op) where an op reads a value
/// whose bytes a later-planned value has overwritten, writes a result over
/// an operand that is not its in-place source, or uses a workspace that
/// overlaps its operands or results; kernel tables must hold their bytes
/// for the whole step. A check of dflash-plan-memory's liveness and in-place
/// rules, independent of how they decided.
mlir::LogicalResult checkPlannedArena(mlir::func::FuncOp step);

} // namespace dflash

#endif // DFLASH_COMPILER_ANALYSIS_MEMORYPLAN_H
