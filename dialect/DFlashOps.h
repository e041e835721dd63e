//===- DFlashOps.h - dflash ops, attributes and interfaces ------*- C++ -*-===//

#ifndef DFLASH_DIALECT_DFLASHOPS_H
#define DFLASH_DIALECT_DFLASHOPS_H

#include "dialect/DFlashDialect.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialect/DFlashEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialect/DFlashAttrs.h.inc"

#include "dialect/DFlashInterfaces.h.inc"

#define GET_OP_CLASSES
#include "dialect/DFlashOps.h.inc"

namespace mlir::dflash {
/// The attribute key under which step arguments and results carry their
/// #dflash.arg.
inline constexpr llvm::StringLiteral kArgAttrName = "dflash.arg";
/// The module attribute holding the #dflash.optimizer of the step.
inline constexpr llvm::StringLiteral kOptimizerAttrName = "dflash.optimizer";
/// The FLOPs one visible (query slot, key) pair of one block costs a
/// dflash.block_attention (QK^T and PV over its query heads) or its gradient
/// (2.5 times that); their getFlopCount() is this times the pairs they assume
/// visible (DFlashFlops.cpp). 0 for any other op.
double blockAttentionFlopsPerPair(Operation *op);
/// The gradient buckets of an adamw_sharded in state order: the order its
/// grads first name them.
llvm::SmallVector<GradientBucketOp> shardedBuckets(AdamWShardedOp op);
/// Module attribute: the number of GPUs the optimizer state is sharded over
/// (spec `[parallel] shard_optimizer_state`); absent when it is not.
inline constexpr llvm::StringLiteral kShardOptimizerStateAttrName =
    "dflash.shard_optimizer_state";
/// Module attribute (unit): recompute the cheap activations in the backward
/// pass (spec `[memory] recompute_activations`).
inline constexpr llvm::StringLiteral kRecomputeActivationsAttrName =
    "dflash.recompute_activations";
/// Module attribute (unit): also recompute the MLP's gate and up products
/// (spec `[memory] recompute_mlp_products`).
inline constexpr llvm::StringLiteral kRecomputeMlpProductsAttrName =
    "dflash.recompute_mlp_products";
/// Module attribute (unit) of the online target's program: its MLPs become
/// dflash.linear_swiglu (spec `[memory] fuse_target_mlp`).
inline constexpr llvm::StringLiteral kFuseTargetMlpAttrName =
    "dflash.fuse_target_mlp";
} // namespace mlir::dflash

#endif // DFLASH_DIALECT_DFLASHOPS_H
