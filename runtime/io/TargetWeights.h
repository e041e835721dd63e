//===- TargetWeights.h - Frozen embed and lm_head of the target -*- C++ -*-===//
//
// The drafter shares the target's token embedding and lm_head
// (docs/semantics.md section 1). They are read from the target's Hugging Face
// directory: `model.embed_tokens.weight` and `lm_head.weight`, through a
// sharded index or a single model.safetensors; the lm_head is the embedding
// when the target ties them. F32 tensors are rounded to bf16.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_TARGETWEIGHTS_H
#define DFLASH_RUNTIME_TARGETWEIGHTS_H

#include "schema/ModelConfig.h"
#include "schema/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::rt {

struct TargetWeights {
  int64_t vocabSize = 0;
  int64_t hiddenSize = 0;
  bool tied = false;
  std::vector<uint16_t> embed;  ///< bf16 [V, H]
  std::vector<uint16_t> lmHead; ///< bf16 [V, H]; empty when tied
  /// The lm_head values, whichever buffer holds them.
  const uint16_t *lmHeadData() const {
    return tied ? embed.data() : lmHead.data();
  }
};

/// Loads the frozen tensors of the target at `dir` and checks them and the
/// directory's config.json (hidden_size, vocab_size, num_hidden_layers; also
/// under text_config for multimodal targets) against `config`. Tying follows
/// config.tieWordEmbeddings, so `weights.tied` always equals it: a config.json
/// that says otherwise is an error, as is an untied target without
/// lm_head.weight. Also accepts the multimodal names
/// `model.language_model.embed_tokens.weight` and
/// `language_model.lm_head.weight`.
Status loadTargetWeights(const std::string &dir, const ModelConfig &config,
                         TargetWeights &weights);

/// A frozen tensor a compiled program reads from the target's checkpoint:
/// its Hugging Face name and shape.
struct FrozenTensor {
  std::string name;
  std::vector<int64_t> shape;
};

/// Loads `wanted` from the target's Hugging Face directory `dir` (sharded
/// through model.safetensors.index.json, or one model.safetensors) as bf16,
/// F32 rounded, out[i] for wanted[i]. Errors name the directory or the shard
/// and the tensor: a tensor the model lacks, a wrong shape or dtype, an index
/// that points to a missing or broken shard. `needer` completes them ("the
/// target program"). A mixture-of-experts layer's stacked expert weight
/// "<layer>.mlp.experts.<proj>.weight" [E, N, K] that the checkpoint lacks
/// is read from its experts' "<layer>.mlp.experts.<j>.<proj>.weight" [N, K],
/// or from the fused layouts of transformers 5 and of gpt-oss (its bf16
/// "gate_up_proj" / "down_proj" with their "_bias", or its MXFP4 "_blocks"
/// and "_scales", dequantised), and gpt-oss's "<layer>.mlp.experts.<proj>.
/// bias" [E, N] from its "gate_up_proj_bias" / "down_proj_bias". A
/// multimodal checkpoint's "model.language_model." tensors stand for the
/// "model." names asked for, and a depthwise ".conv1d.weight" [C, 1, K] is
/// read as [C, K].
Status loadFrozenTensors(const std::string &dir,
                         const std::vector<FrozenTensor> &wanted,
                         const std::string &needer,
                         std::vector<std::vector<uint16_t>> &out);

/// Random bf16 values of a decoder's scale, for timing runs only (the speed
/// of a step does not depend on the values, only on their being finite):
/// N(0, 0.02), one pattern of 16M values that matrices repeat.
const std::vector<uint16_t> &randomWeightPattern();
/// bf16 1.0, what norm weights (rank 1) get in a timing run.
constexpr uint16_t kBf16One = 0x3F80;

/// Random stand-ins for `wanted` (randomWeightPattern repeated; rank-1
/// tensors 1.0), out[i] for wanted[i]: `train --random-target-weights`.
void randomFrozenTensors(const std::vector<FrozenTensor> &wanted,
                         std::vector<std::vector<uint16_t>> &out);
/// The same for the embedding and lm_head the drafter reads.
void randomTargetWeights(const ModelConfig &config, TargetWeights &weights);

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_TARGETWEIGHTS_H
