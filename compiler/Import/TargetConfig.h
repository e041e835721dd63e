//===- TargetConfig.h - The online target's config.json ---------*- C++ -*-===//
//
// `dflashc SPEC --target DIR` (or the spec's `[target] path`) names the
// target model's Hugging Face directory. Its config.json fixes the target's
// forward, which the compiler builds in the dflash dialect: a dense Qwen3 or
// Llama-3 decoder (causal GQA attention, RMSNorm, q/k norms where the model
// has them, RoPE with Llama-3 rope scaling, SwiGLU), Qwen3-MoE's and
// gpt-oss's routed experts, or a Qwen3.5/3.6/Next hybrid of Gated DeltaNet
// and gated full attention. This header is what the
// compiler reads from that file, checked on its own and against the drafter
// spec; every error names the file(s) and the field. Both the transformers
// 4 form (`rope_theta`, `rope_scaling`) and the 5 form (`rope_parameters`)
// are read, and multimodal configs through `text_config`.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_IMPORT_TARGETCONFIG_H
#define DFLASH_COMPILER_IMPORT_TARGETCONFIG_H

#include "compiler/Spec/Spec.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dflash {

/// Llama-3's rope scaling (`rope_type = "llama3"`): inverse frequencies with
/// wavelengths above original / lowFreqFactor are divided by factor, those
/// below original / highFreqFactor kept, and the band between interpolated.
struct Llama3RopeScaling {
  double factor = 8.0;
  double lowFreqFactor = 1.0;
  double highFreqFactor = 4.0;
  int64_t originalMaxPositions = 8192;
};

/// YaRN's rope scaling (`rope_type = "yarn"`, gpt-oss's): dflash.yarn_rope's
/// attributes, the attention factor worked out as transformers does when
/// config.json leaves it out.
struct YarnRopeScaling {
  double factor = 1.0;
  double betaFast = 32.0;
  double betaSlow = 1.0;
  int64_t originalMaxPositions = 0;
  bool truncate = true;
  double attentionFactor = 1.0;
};

/// The target decoder the compiler builds, as read from config.json.
struct TargetModelConfig {
  std::string configPath; ///< DIR/config.json as given
  std::string modelType;  ///< "qwen3", "qwen3_moe", "gpt_oss", "llama" or
                          ///< one of the hybrid family's (below)
  int64_t hiddenSize = 0;
  int64_t intermediateSize = 0;
  int64_t numLayers = 0;
  int64_t numHeads = 0;
  int64_t numKvHeads = 0;
  int64_t headDim = 0;
  int64_t vocabSize = 0;
  double rmsNormEps = 1e-6;
  double ropeTheta = 10000.0;
  /// The positions the target was trained for (with its rope_scaling, as
  /// served); 0 where the config does not say.
  int64_t maxPositionEmbeddings = 0;
  std::optional<Llama3RopeScaling> ropeScaling;
  std::optional<YarnRopeScaling> yarn;
  bool tieWordEmbeddings = false;
  /// Qwen3 normalises each query and key head (RMSNorm over head_dim)
  /// before RoPE; Llama does not.
  bool qkNorm = false;

  /// A Qwen3-MoE target ('qwen3_moe'): the MLP of layer i is sparse, E
  /// experts of moeIntermediateSize with numExpertsPerToken routed per
  /// token, unless sparseLayer(i) says it is dense (intermediateSize).
  int64_t numExperts = 0; ///< 0: a dense decoder
  int64_t numExpertsPerToken = 0;
  int64_t moeIntermediateSize = 0;
  /// The chosen experts' weights are divided by their sum.
  bool normTopkProb = false;
  int64_t decoderSparseStep = 1;
  std::vector<int64_t> mlpOnlyLayers;

  /// gpt-oss ('gpt_oss'): biases on q/k/v/o, the router and the experts; a
  /// learned sink logit per head; sliding layers of slidingWindow keys
  /// where `slidingLayers` says; routing by the top-k logits then softmax;
  /// the experts' clamped SwiGLU (swigluAlpha, swigluLimit).
  bool gptOss = false;
  int64_t slidingWindow = 0;
  std::vector<bool> slidingLayers;
  double swigluAlpha = 1.702; ///< transformers' constant, not in config.json
  double swigluLimit = 7.0;

  /// The hybrid Qwen3.5 / Qwen3.6 / Qwen3-Next family ('qwen3_5',
  /// 'qwen3_5_moe', their '_text' forms, 'qwen3_next'): Gated DeltaNet
  /// layers where `linearLayers` says, full attention with an output gate
  /// (q_proj twice as wide: each head's query, then its gate) and partial
  /// rotary (the first `rotaryDim` of each head) elsewhere, and every
  /// RMSNorm but the DeltaNet's gated one zero-centred (x * (1 + w)).
  bool hybrid = false;
  std::vector<bool> linearLayers;
  int64_t linearKeyHeads = 0, linearValueHeads = 0;
  int64_t linearKeyHeadDim = 0, linearValueHeadDim = 0;
  int64_t linearConvKernel = 0; ///< the causal depthwise conv's width
  int64_t rotaryDim = 0;        ///< 0: the whole head
  /// The MoE forms' shared expert (a SwiGLU MLP of this width, gated per
  /// token by sigmoid(shared_expert_gate)); 0: none.
  int64_t sharedExpertIntermediateSize = 0;
  /// Qwen3-Next stores the DeltaNet's projections fused and interleaved by
  /// key-head group (in_proj_qkvz, in_proj_ba); the graph regroups their
  /// outputs as Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b and in_proj_a.
  bool fusedLinearProjections = false;

  bool linearLayer(int64_t i) const {
    return hybrid && linearLayers[size_t(i)];
  }
  int64_t linearKeyDim() const { return linearKeyHeads * linearKeyHeadDim; }
  int64_t linearValueDim() const {
    return linearValueHeads * linearValueHeadDim;
  }
  bool sparseLayer(int64_t i) const {
    return numExperts > 0 &&
           std::find(mlpOnlyLayers.begin(), mlpOnlyLayers.end(), i) ==
               mlpOnlyLayers.end() &&
           (i + 1) % decoderSparseStep == 0;
  }
  int64_t qDim() const { return numHeads * headDim; }
  int64_t kvDim() const { return numKvHeads * headDim; }
};

/// Reads DIR/config.json. On failure returns nothing and sets `error` to
/// "DIR/config.json: ..." naming the field.
std::optional<TargetModelConfig> readTargetConfig(const std::string &dir,
                                                  std::string &error);

/// Checks the target against the drafter spec (hidden size, vocabulary,
/// layer count and the taps, tying). On failure sets `error` to a message
/// naming both files and the field of each, and returns false.
bool checkTargetAgainstSpec(const TargetModelConfig &target,
                            const DrafterSpec &spec, std::string &error);

/// The target directory a compile uses: `--target` when given, else the
/// spec's `[target] path` (relative to the spec's folder), else empty.
std::string targetDirectory(const DrafterSpec &spec,
                            const std::string &commandLine);

} // namespace dflash

#endif // DFLASH_COMPILER_IMPORT_TARGETCONFIG_H
