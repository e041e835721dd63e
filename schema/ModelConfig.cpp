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
  return Status::success();
}

std::vector<int64_t> dflash::defaultPositionBuckets(int64_t seqLen) {
  std::vector<int64_t> edges;
  for (int64_t edge = 4096; edge < seqLen; edge *= 4)
    edges.push_back(edge);
  return edges;
}
