//===- ModelConfig.cpp - Validation of a drafter's config ----------------===//

#include "schema/ModelConfig.h"

using namespace dflash;

static Status fieldError(const ModelConfig &config, const std::string &what) {
  std::string name = config.name.empty() ? "model config" : config.name;
  return Status::error(name + ": " + what);
}

Status dflash::validateModelConfig(const ModelConfig &c) {
  struct Positive {
    const char *field;
    int64_t value;
  } positives[] = {
      {"target_num_layers", c.targetNumLayers},
      {"target_hidden_size", c.targetHiddenSize},
      {"vocab_size", c.vocabSize},
      {"num_layers", c.numLayers},
      {"hidden_size", c.hiddenSize},
      {"intermediate_size", c.intermediateSize},
      {"num_heads", c.numHeads},
      {"num_kv_heads", c.numKvHeads},
      {"head_dim", c.headDim},
      {"block_size", c.blockSize},
      {"max_position_embeddings", c.maxPositionEmbeddings},
      {"seq_len", c.seqLen},
      {"anchors_per_row", c.anchorsPerRow},
      {"rows_per_gpu", c.rowsPerGpu},
      {"gradient_accumulation", c.gradientAccumulation},
  };
  for (const Positive &p : positives)
    if (p.value <= 0)
      return fieldError(c, "'" + std::string(p.field) + "' is " +
                               std::to_string(p.value) +
                               " but must be positive");
  if (c.hiddenSize != c.targetHiddenSize)
    return fieldError(c, "'hidden_size' (" + std::to_string(c.hiddenSize) +
                             ") differs from 'target_hidden_size' (" +
                             std::to_string(c.targetHiddenSize) + ")");
  if (c.numHeads % c.numKvHeads != 0)
    return fieldError(c, "'num_heads' (" + std::to_string(c.numHeads) +
                             ") is not a multiple of 'num_kv_heads' (" +
                             std::to_string(c.numKvHeads) + ")");
  if (c.headDim % 2 != 0)
    return fieldError(c, "'head_dim' (" + std::to_string(c.headDim) +
                             ") must be even for rotary embeddings");
  if (c.maskTokenId < 0 || c.maskTokenId >= c.vocabSize)
    return fieldError(c, "'mask_token_id' (" + std::to_string(c.maskTokenId) +
                             ") is outside the vocabulary of " +
                             std::to_string(c.vocabSize) + " tokens");
  if (c.targetLayerIds.empty())
    return fieldError(c, "'target_layer_ids' is empty");
  for (size_t i = 0; i < c.targetLayerIds.size(); ++i) {
    int64_t id = c.targetLayerIds[i];
    if (id < 0 || id >= c.targetNumLayers)
      return fieldError(c, "'target_layer_ids' entry " + std::to_string(id) +
                               " is outside the target's " +
                               std::to_string(c.targetNumLayers) + " layers");
    if (i > 0 && id <= c.targetLayerIds[i - 1])
      return fieldError(c, "'target_layer_ids' is not strictly ascending");
  }
  if (int64_t(c.layerWindows.size()) != c.numLayers)
    return fieldError(c, "'layer_windows' has " +
                             std::to_string(c.layerWindows.size()) +
                             " entries but the drafter has " +
                             std::to_string(c.numLayers) + " layers");
  for (int64_t window : c.layerWindows)
    if (window < 0)
      return fieldError(c, "'layer_windows' has a negative window " +
                               std::to_string(window));
  if (c.seqLen < 2)
    return fieldError(c, "'seq_len' (" + std::to_string(c.seqLen) +
                             ") leaves no room for an anchor");
  if (c.numPositionBuckets() > kMaxPositionBuckets)
    return fieldError(c, "'position_buckets' has " +
                             std::to_string(c.positionBuckets.size()) +
                             " edges but at most " +
                             std::to_string(kMaxPositionBuckets - 1) +
                             " are supported");
  for (size_t i = 0; i < c.positionBuckets.size(); ++i) {
    int64_t edge = c.positionBuckets[i];
    if (edge <= 0 || edge >= c.seqLen)
      return fieldError(
          c, "'position_buckets' edge " + std::to_string(edge) +
                 " is outside (0, seq_len = " + std::to_string(c.seqLen) + ")");
    if (i > 0 && edge <= c.positionBuckets[i - 1])
      return fieldError(c, "'position_buckets' is not strictly increasing");
  }
  if (c.dflash2) {
    if (c.convKernelSize < 1 || c.convKernelSize > kMaxConvKernelSize ||
        c.convKernelSize > c.blockSize)
      return fieldError(
          c, "'conv_kernel_size' (" + std::to_string(c.convKernelSize) +
                 ") is outside 1.." + std::to_string(kMaxConvKernelSize) +
                 " or past 'block_size'");
    if (c.convGroupSize < 1 || c.hiddenSize % c.convGroupSize != 0)
      return fieldError(c, "'conv_group_size' (" +
                               std::to_string(c.convGroupSize) +
                               ") does not divide 'hidden_size' (" +
                               std::to_string(c.hiddenSize) + ")");
    if (c.selectorRank < 1)
      return fieldError(c, "'selector_rank' (" +
                               std::to_string(c.selectorRank) +
                               ") must be positive");
    if (c.selectorTopK < 1 || c.selectorTopK > kMaxSelectorTopK ||
        c.selectorTopK > c.vocabSize)
      return fieldError(
          c, "'selector_top_k' (" + std::to_string(c.selectorTopK) +
                 ") is outside 1.." + std::to_string(kMaxSelectorTopK) +
                 " or past 'vocab_size'");
    if (!(c.outputMultiplier > 0) || !(c.finalLogitSoftcapping >= 0) ||
        !(c.inputEmbeddingScale > 0))
      return fieldError(c, "'output_multiplier' and 'input_embedding_scale' "
                           "must be positive, 'final_logit_softcapping' "
                           "positive or 0 (none)");
    if (!(c.selectorAlpha >= 0) || !(c.selectorWarmupRatio >= 0) ||
        !(c.selectorRampRatio >= 0) ||
        !(c.selectorWarmupRatio + c.selectorRampRatio <= 1))
      return fieldError(c, "'selector_alpha' must be at least 0, and "
                           "'selector_warmup_ratio' and 'selector_ramp_ratio' "
                           "at least 0 with a sum of at most 1");
  }
  return Status::success();
}

std::vector<int64_t> dflash::defaultPositionBuckets(int64_t seqLen) {
  std::vector<int64_t> edges;
  for (int64_t edge = 4096; edge < seqLen; edge *= 4)
    edges.push_back(edge);
  return edges;
}
