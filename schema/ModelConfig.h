//===- ModelConfig.h - Shapes and hyperparameters of a drafter --*- C++ -*-===//
//
// The one description of a drafter that the compiler and the runtime share:
// the spec parser fills it (compiler/Spec's DrafterSpec is a ModelConfig
// plus where each key was written), the importer records it on the module,
// the emitter prints it into the generated step, and the runtime reads it
// from there. Field meanings follow docs/semantics.md; defaults are the
// recipe's (section 7). Plain C++17: no MLIR, no CUDA.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_SCHEMA_MODELCONFIG_H
#define DFLASH_SCHEMA_MODELCONFIG_H

#include "schema/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dflash {

struct ModelConfig {
  std::string name;

  // The target model ([target]).
  std::string targetModel;
  int64_t targetNumLayers = 0;
  int64_t targetHiddenSize = 0;
  int64_t vocabSize = 0;
  std::vector<int64_t> targetLayerIds; ///< tapped layers, ascending
  bool tieWordEmbeddings = false;

  // The drafter ([drafter], [attention]).
  int64_t numLayers = 0;
  int64_t hiddenSize = 0;
  int64_t intermediateSize = 0;
  int64_t numHeads = 0;
  int64_t numKvHeads = 0;
  int64_t headDim = 0;
  double rmsNormEps = 1e-6;
  double ropeTheta = 1e6;
  int64_t blockSize = 0;
  int64_t maskTokenId = 0;
  int64_t maxPositionEmbeddings = 40960;
  /// [drafter.rope_scaling]: YaRN as transformers' Qwen3 computes it, off
  /// while ropeScalingFactor is 0. attention_factor is resolved (0.1
  /// ln(factor) + 1 unless given); the rest are the spec's values.
  double ropeScalingFactor = 0;
  int64_t ropeScalingOriginalMaxPositions = 0;
  double ropeScalingBetaFast = 32;
  double ropeScalingBetaSlow = 1;
  bool ropeScalingTruncate = true;
  double ropeScalingAttentionFactor = 1;
  /// Sliding window of each layer; 0 for a full-attention layer.
  std::vector<int64_t> layerWindows;
  /// [drafter.dflash2]: a DFlash2 drafter (docs/semantics.md section 13),
  /// off while dflash2 is false; the rest keep their defaults then. Every
  /// layer of a DFlash2 drafter is bidirectional inside its block (see
  /// blockCausal).
  bool dflash2 = false;
  int64_t convKernelSize = 2;       ///< kc: taps of each grouped convolution
  int64_t convGroupSize = 16;       ///< gs: channels per group, G = H / gs
  int64_t selectorRank = 256;       ///< r: width of the selector's codebooks
  int64_t selectorTopK = 16;        ///< K: candidates the selector re-ranks
  double outputMultiplier = 1;      ///< m of the unary transform
  double finalLogitSoftcapping = 0; ///< c of the unary transform; 0: none
  double inputEmbeddingScale = 1;   ///< the draft stream's embedding scale

  // Training ([training]).
  int64_t seqLen = 3072;
  int64_t anchorsPerRow = 512;
  /// Rows of one micro-batch on one GPU: what a forward and backward pass
  /// holds at once.
  int64_t rowsPerGpu = 4;
  /// Micro-batches per optimizer step (gradient accumulation): a step reads
  /// rowsPerStep() rows per GPU and runs the forward and backward pass on
  /// rowsPerGpu of them at a time, its gradients summed, then one
  /// all-reduce and one AdamW update.
  int64_t gradientAccumulation = 1;
  double gamma = 0; ///< loss decay; 0 disables
  int64_t seed = 0;
  double initStd = 0.02;
  /// The edges of the anchor-position buckets that tau and the accuracy are
  /// also reported per (docs/semantics.md section 14): an anchor at
  /// position p of its conversation falls in bucket "number of edges <= p".
  /// Strictly increasing, positive and below seqLen (no anchor reaches an
  /// edge past it); empty: one bucket, [0, seqLen).
  std::vector<int64_t> positionBuckets;
  /// [training.dflash2]: the selector's loss term (docs/semantics.md
  /// section 13), read only for a DFlash2 drafter. Its weight is 0 for the
  /// first selectorWarmupRatio of the optimizer steps, then ramps linearly
  /// to selectorAlpha over selectorRampRatio of them.
  double selectorAlpha = 1;
  double selectorWarmupRatio = 0;
  double selectorRampRatio = 0;
  /// The selector's gradient stops at the unary logits and y.
  bool selectorStopGradient = false;
  /// selector_gold = "inject": a label missing from the top K takes the
  /// place of candidate K (so cov = 1); else ("topk") it is not covered.
  bool selectorGoldInject = false;
  /// selector_denominator = "covered": the selector term is divided by
  /// sum(w * cov) instead of sum(w) ("all").
  bool selectorDenominatorCovered = false;

  // Optimizer ([optimizer]).
  double lr = 6e-4;
  double warmupRatio = 0.04;
  double maxGradNorm = 1.0;
  double weightDecay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double adamEps = 1e-8;
  int64_t totalSteps = 10000;

  int64_t numTaps() const { return int64_t(targetLayerIds.size()); }
  /// L*H: the width of one row of target_hidden and of fc's input.
  int64_t contextWidth() const { return numTaps() * hiddenSize; }
  int64_t qDim() const { return numHeads * headDim; }
  int64_t kvDim() const { return numKvHeads * headDim; }
  int64_t draftLength() const { return anchorsPerRow * blockSize; } ///< Q
  /// Rows per GPU that one optimizer step reads: every micro-batch's.
  int64_t rowsPerStep() const { return rowsPerGpu * gradientAccumulation; }
  bool ropeScaled() const { return ropeScalingFactor > 0; }
  bool layerSlides(int64_t layer) const {
    return layerWindows[size_t(layer)] > 0;
  }
  /// Whether a query of `layer` sees only the slots of its block up to its
  /// own (docs/semantics.md section 3): a sliding layer of a DFlash drafter.
  /// Full layers, and every layer of a DFlash2 drafter (section 13), see
  /// their whole block (within the window).
  bool blockCausal(int64_t layer) const {
    return !dflash2 && layerSlides(layer);
  }
  /// G: the groups of a DFlash2 convolution's per-token kernel.
  int64_t convGroups() const { return hiddenSize / convGroupSize; }
  int64_t numPositionBuckets() const {
    return int64_t(positionBuckets.size()) + 1;
  }
};

/// The most anchor-position buckets a step reports: draft_acceptance_f32
/// keeps one shared-memory counter per bucket (kernels/DraftBlocks.cuh).
constexpr int64_t kMaxPositionBuckets = 8;

/// The most taps a DFlash2 convolution may have (kc; 2 in every published
/// drafter) and the most candidates its selector may re-rank (K; 16): the
/// bounds the DFlash2 kernels are to be written for, each slot's taps and
/// candidates in fixed-size arrays (docs/semantics.md section 13).
constexpr int64_t kMaxConvKernelSize = 4;
constexpr int64_t kMaxSelectorTopK = 64;

/// The default bucket edges for a sequence of seqLen tokens: 4K, 16K, 64K,
/// 256K, ... (4096 * 4^i), those below seqLen (none for seqLen <= 4096).
std::vector<int64_t> defaultPositionBuckets(int64_t seqLen);

/// Calls `visit(key, member, field)` for every field of ModelConfig, in
/// declaration order: `key` is the field's snake_case name (the module
/// attribute's and the manifest's key), `member` the C++ member's name (what
/// generated code assigns). The one list of the fields: conversions to and
/// from other forms go through it.
template <class Config, class Visitor>
void forEachModelConfigField(Config &c, Visitor &&visit) {
#define DFLASH_FIELD(key, member) visit(key, #member, c.member)
  DFLASH_FIELD("name", name);
  DFLASH_FIELD("target_model", targetModel);
  DFLASH_FIELD("target_num_layers", targetNumLayers);
  DFLASH_FIELD("target_hidden_size", targetHiddenSize);
  DFLASH_FIELD("vocab_size", vocabSize);
  DFLASH_FIELD("target_layer_ids", targetLayerIds);
  DFLASH_FIELD("tie_word_embeddings", tieWordEmbeddings);
  DFLASH_FIELD("num_layers", numLayers);
  DFLASH_FIELD("hidden_size", hiddenSize);
  DFLASH_FIELD("intermediate_size", intermediateSize);
  DFLASH_FIELD("num_heads", numHeads);
  DFLASH_FIELD("num_kv_heads", numKvHeads);
  DFLASH_FIELD("head_dim", headDim);
  DFLASH_FIELD("rms_norm_eps", rmsNormEps);
  DFLASH_FIELD("rope_theta", ropeTheta);
  DFLASH_FIELD("block_size", blockSize);
  DFLASH_FIELD("mask_token_id", maskTokenId);
  DFLASH_FIELD("max_position_embeddings", maxPositionEmbeddings);
  DFLASH_FIELD("rope_scaling_factor", ropeScalingFactor);
  DFLASH_FIELD("rope_scaling_original_max_position_embeddings",
               ropeScalingOriginalMaxPositions);
  DFLASH_FIELD("rope_scaling_beta_fast", ropeScalingBetaFast);
  DFLASH_FIELD("rope_scaling_beta_slow", ropeScalingBetaSlow);
  DFLASH_FIELD("rope_scaling_truncate", ropeScalingTruncate);
  DFLASH_FIELD("rope_scaling_attention_factor", ropeScalingAttentionFactor);
  DFLASH_FIELD("layer_windows", layerWindows);
  DFLASH_FIELD("dflash2", dflash2);
  DFLASH_FIELD("conv_kernel_size", convKernelSize);
  DFLASH_FIELD("conv_group_size", convGroupSize);
  DFLASH_FIELD("selector_rank", selectorRank);
  DFLASH_FIELD("selector_top_k", selectorTopK);
  DFLASH_FIELD("output_multiplier", outputMultiplier);
  DFLASH_FIELD("final_logit_softcapping", finalLogitSoftcapping);
  DFLASH_FIELD("input_embedding_scale", inputEmbeddingScale);
  DFLASH_FIELD("seq_len", seqLen);
  DFLASH_FIELD("anchors_per_row", anchorsPerRow);
  DFLASH_FIELD("rows_per_gpu", rowsPerGpu);
  DFLASH_FIELD("gradient_accumulation", gradientAccumulation);
  DFLASH_FIELD("gamma", gamma);
  DFLASH_FIELD("seed", seed);
  DFLASH_FIELD("init_std", initStd);
  DFLASH_FIELD("position_buckets", positionBuckets);
  DFLASH_FIELD("selector_alpha", selectorAlpha);
  DFLASH_FIELD("selector_warmup_ratio", selectorWarmupRatio);
  DFLASH_FIELD("selector_ramp_ratio", selectorRampRatio);
  DFLASH_FIELD("selector_stop_gradient", selectorStopGradient);
  DFLASH_FIELD("selector_gold_inject", selectorGoldInject);
  DFLASH_FIELD("selector_denominator_covered", selectorDenominatorCovered);
  DFLASH_FIELD("lr", lr);
  DFLASH_FIELD("warmup_ratio", warmupRatio);
  DFLASH_FIELD("max_grad_norm", maxGradNorm);
  DFLASH_FIELD("weight_decay", weightDecay);
  DFLASH_FIELD("beta1", beta1);
  DFLASH_FIELD("beta2", beta2);
  DFLASH_FIELD("adam_eps", adamEps);
  DFLASH_FIELD("total_steps", totalSteps);
#undef DFLASH_FIELD
}

/// Checks that the config describes a drafter the runtime can handle
/// (positive sizes, heads divisible, one window per layer, mask token inside
/// the vocabulary, taps inside the target). Messages name the field.
Status validateModelConfig(const ModelConfig &config);

} // namespace dflash

#endif // DFLASH_SCHEMA_MODELCONFIG_H
