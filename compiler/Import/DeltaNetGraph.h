//===- DeltaNetGraph.h - A Gated DeltaNet layer in the dialect --*- C++ -*-===//
//
// The linear-attention layer of the Qwen3.5 / Qwen3.6 / Qwen3-Next hybrid
// targets, built for ImportTarget's @target: q, k and v from one
// projection (Qwen3-Next's fused, group-interleaved projections regrouped
// first) through the causal conv, the gated delta rule with a, b, A_log and
// dt_bias, the gated RMSNorm with z, out_proj.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_IMPORT_DELTANETGRAPH_H
#define DFLASH_COMPILER_IMPORT_DELTANETGRAPH_H

#include "compiler/Import/TargetConfig.h"

#include "mlir/IR/Builders.h"

namespace dflash::import {

/// A DeltaNet layer's weights (frozen arguments). Qwen3.5's projections;
/// for Qwen3-Next inProjQkv holds in_proj_qkvz and inProjB in_proj_ba
/// (interleaved by key-head group), inProjZ and inProjA none.
struct DeltaNetWeights {
  mlir::Value inProjQkv, inProjZ, inProjB, inProjA, conv, dtBias, aLog, norm,
      outProj;
};

/// The layer's output [B, S, H] for the normed residual `h` [B, S, H] at
/// `positions` [B, S] (each conversation restarts the conv and the state).
mlir::Value gatedDeltaNet(mlir::OpBuilder &b, mlir::Location l,
                          const TargetModelConfig &target, mlir::Value h,
                          const DeltaNetWeights &w, mlir::Value positions);

} // namespace dflash::import

#endif // DFLASH_COMPILER_IMPORT_DELTANETGRAPH_H
