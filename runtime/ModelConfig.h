//===- ModelConfig.h - Shapes and hyperparameters of a drafter --*- C++ -*-===//
//
// Everything the runtime needs to know about a compiled drafter, as a plain
// struct: the generated trainer fills it from constants, the host tools from
// the spec (tools/common/SpecToModelConfig.h). Field meanings follow
// SEMANTICS.md and mirror dflash::DrafterSpec.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_MODELCONFIG_H
#define DFLASH_RUNTIME_MODELCONFIG_H

#include "runtime/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::rt {

struct ModelConfig {
  std::string name;

  // Target model.
  std::string targetModel;
  int64_t targetNumLayers = 0;
  int64_t targetHiddenSize = 0;
  int64_t vocabSize = 0;
  std::vector<int64_t> targetLayerIds; ///< tapped layers, ascending
  bool tieWordEmbeddings = false;

  // Drafter.
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
  int64_t maxPositionEmbeddings = 0;
  /// Sliding window of each layer; 0 for a full-attention layer.
  std::vector<int64_t> layerWindows;

  // Training.
  int64_t seqLen = 0;
  int64_t anchorsPerRow = 0;
  int64_t rowsPerGpu = 0;
  double gamma = 0; ///< loss decay; 0 disables
  int64_t seed = 0;
  double initStd = 0.02;

  // Optimizer.
  double lr = 6e-4;
  double warmupRatio = 0.04;
  double maxGradNorm = 1.0;
  double weightDecay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double adamEps = 1e-8;
  int64_t totalSteps = 0;

  int64_t numTaps() const { return int64_t(targetLayerIds.size()); }
  /// L*H: the width of one row of target_hidden and of fc's input.
  int64_t contextWidth() const { return numTaps() * hiddenSize; }
  int64_t qDim() const { return numHeads * headDim; }
  int64_t kvDim() const { return numKvHeads * headDim; }
  int64_t draftLength() const { return anchorsPerRow * blockSize; } ///< Q
};

/// Checks that the config describes a drafter the runtime can handle
/// (positive sizes, heads divisible, one window per layer, mask token inside
/// the vocabulary, taps inside the target). Messages name the field.
Status validateModelConfig(const ModelConfig &config);

/// One trainable tensor.
struct ParamInfo {
  std::string name;           ///< checkpoint name (SEMANTICS.md section 6)
  std::vector<int64_t> shape; ///< torch layout ([out, in] for linears)
  bool isNorm = false;        ///< RMSNorm weight: initialised to 1
  int64_t numel() const;
};

/// Every trainable tensor in the canonical order: fc, hidden_norm, per layer
/// i (input_layernorm, q/k/v/o_proj, q_norm, k_norm,
/// post_attention_layernorm, gate/up/down_proj), norm. Parameter buffers,
/// checkpoints and optimizer state all use this order.
std::vector<ParamInfo> parameterTable(const ModelConfig &config);

/// Total number of trainable elements.
int64_t numParameters(const ModelConfig &config);

/// The initial bf16 parameters, in parameterTable order: linear weights
/// N(0, initStd) from Rng::forStream(seed, 0x1000 + tensor index), rounded
/// to bf16; norm weights 1. fp32 masters start as the bf16 values widened,
/// so every implementation that loads the same init checkpoint starts from
/// the same numbers.
std::vector<std::vector<uint16_t>> initialParameters(const ModelConfig &config,
                                                     uint64_t seed);

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_MODELCONFIG_H
