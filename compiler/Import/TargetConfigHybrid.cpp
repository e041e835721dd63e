//===- TargetConfigHybrid.cpp - Qwen3.5/3.6/Next fields of config.json ----===//
//
// The hybrid family's own fields, with transformers' defaults where
// config.json leaves them out: which layers are Gated DeltaNet
// (`layer_types`, else every `full_attention_interval`-th layer is full
// attention), the DeltaNet's heads and conv width, the partial rotary of
// the full-attention layers, and the routed and shared experts of the MoE
// forms (Qwen3.5-MoE: every layer sparse, the top k always renormalised).
//
//===----------------------------------------------------------------------===//

#include "compiler/Import/ConfigReader.h"

using namespace ::dflash;
using namespace ::dflash::import;

namespace {

/// `layer_types` ('linear_attention' or 'full_attention' for each layer),
/// else layer i is full attention where (i + 1) % full_attention_interval
/// is 0 (default 4), as transformers derives it.
bool readLayerKinds(ConfigReader &r, TargetModelConfig &config) {
  const size_t L = size_t(config.numLayers);
  config.linearLayers.assign(L, false);
  const json::Value *kinds = r.object.get("layer_types");
  if (!kinds || kinds->kind() == json::Value::Null) {
    int64_t interval = 0;
    if (!r.positive("full_attention_interval", interval, 4))
      return false;
    for (size_t i = 0; i < L; ++i)
      config.linearLayers[i] = (int64_t(i) + 1) % interval != 0;
    return true;
  }
  const json::Array *list = kinds->getAsArray();
  if (!list || list->size() != L)
    return r.fail("layer_types", "must list 'linear_attention' or "
                                 "'full_attention' for each of the " +
                                     std::to_string(L) + " layers");
  for (size_t i = 0; i < L; ++i) {
    std::optional<llvm::StringRef> kind = (*list)[i].getAsString();
    if (!kind || (*kind != "linear_attention" && *kind != "full_attention"))
      return r.fail("layer_types",
                    "entry " + std::to_string(i) + " is '" +
                        (kind ? kind->str() : std::string("not a string")) +
                        "': a " + config.modelType +
                        " layer is 'linear_attention' (Gated DeltaNet) or "
                        "'full_attention'");
    config.linearLayers[i] = *kind == "linear_attention";
  }
  return true;
}

/// The share of each full-attention head that RoPE rotates:
/// `rope_parameters.partial_rotary_factor` (transformers 5), else the
/// top-level field, else 0.25.
bool readPartialRotary(ConfigReader &r, TargetModelConfig &config) {
  double factor = 0.25;
  std::string where;
  if (!r.number(r.object, "", "partial_rotary_factor", factor))
    return false;
  if (const json::Object *params = r.object.getObject("rope_parameters");
      params && params->get("partial_rotary_factor")) {
    where = "rope_parameters.";
    if (!r.number(*params, where, "partial_rotary_factor", factor))
      return false;
  }
  const double dims = double(config.headDim) * factor;
  config.rotaryDim = int64_t(dims);
  if (factor > 1 || config.rotaryDim < 2 || config.rotaryDim % 2 != 0)
    return r.fail(where + "partial_rotary_factor",
                  "(" + std::to_string(factor) + ") must rotate an even " +
                      "number of the " + std::to_string(config.headDim) +
                      " dimensions of a head (at least 2, at most all)");
  return true;
}

} // namespace

bool dflash::import::readHybrid(ConfigReader &r, TargetModelConfig &config) {
  config.fusedLinearProjections = config.modelType == "qwen3_next";
  if (!r.positive("linear_num_key_heads", config.linearKeyHeads, 16) ||
      !r.positive("linear_num_value_heads", config.linearValueHeads, 32) ||
      !r.positive("linear_key_head_dim", config.linearKeyHeadDim, 128) ||
      !r.positive("linear_value_head_dim", config.linearValueHeadDim, 128) ||
      !r.positive("linear_conv_kernel_dim", config.linearConvKernel, 4) ||
      !readLayerKinds(r, config) || !readPartialRotary(r, config))
    return false;
  if (config.ropeScaling || config.yarn)
    return r.fail(std::string(r.object.get("rope_parameters")
                                  ? "rope_parameters"
                                  : "rope_scaling") +
                      ".rope_type",
                  "scales RoPE: a " + config.modelType +
                      " target's partial rotary is compiled with default "
                      "rope only");
  if (config.linearValueHeads % config.linearKeyHeads != 0)
    return r.fail("linear_num_value_heads",
                  "(" + std::to_string(config.linearValueHeads) +
                      ") must be a multiple of 'linear_num_key_heads' (" +
                      std::to_string(config.linearKeyHeads) + ")");
  if (config.modelType == "qwen3_5" || config.modelType == "qwen3_5_text")
    return true; // dense: every layer's MLP is SwiGLU
  // Qwen3.5-MoE always renormalises the top k; Qwen3-Next by norm_topk_prob,
  // true unless config.json says otherwise.
  config.normTopkProb = true;
  if (!readExperts(r, config, /*sharedExpert=*/true))
    return false;
  if (llvm::StringRef(config.modelType).starts_with("qwen3_5_moe"))
    config.normTopkProb = true;
  return true;
}
