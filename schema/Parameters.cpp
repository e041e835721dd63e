//===- Parameters.cpp - The drafter's trainable tensors ------------------===//

#include "schema/Parameters.h"

using namespace dflash;

int64_t ParamInfo::numel() const {
  int64_t count = 1;
  for (int64_t extent : shape)
    count *= extent;
  return count;
}

std::vector<ParamInfo> dflash::parameterTable(const ModelConfig &c) {
  const int64_t H = c.hiddenSize, I = c.intermediateSize, d = c.headDim;
  const ParamKind linear = ParamKind::Linear, norm = ParamKind::Norm;
  std::vector<ParamInfo> table;
  table.push_back({"fc.weight", {H, c.contextWidth()}, linear, -1});
  table.push_back({"hidden_norm.weight", {H}, norm, -1});
  for (int64_t i = 0; i < c.numLayers; ++i) {
    const std::string layer = "layers." + std::to_string(i) + ".";
    auto add = [&](const std::string &name, std::vector<int64_t> shape,
                   ParamKind kind) {
      table.push_back({layer + name, std::move(shape), kind, i});
    };
    // The order of LayerParam.
    add("input_layernorm.weight", {H}, norm);
    add("self_attn.q_proj.weight", {c.qDim(), H}, linear);
    add("self_attn.k_proj.weight", {c.kvDim(), H}, linear);
    add("self_attn.v_proj.weight", {c.kvDim(), H}, linear);
    add("self_attn.o_proj.weight", {H, c.qDim()}, linear);
    add("self_attn.q_norm.weight", {d}, norm);
    add("self_attn.k_norm.weight", {d}, norm);
    add("post_attention_layernorm.weight", {H}, norm);
    add("mlp.gate_proj.weight", {I, H}, linear);
    add("mlp.up_proj.weight", {I, H}, linear);
    add("mlp.down_proj.weight", {H, I}, linear);
    if (c.dflash2) {
      // docs/semantics.md section 13, "Checkpoint" and "Initialisation".
      const int64_t kc = c.convKernelSize, G = H / c.convGroupSize;
      for (const char *conv : {"attention_conv.", "mlp_conv."}) {
        add(std::string(conv) + "base_kernel", {2, kc, H}, ParamKind::ConvBase);
        add(std::string(conv) + "kernel_projection.weight", {2 * kc * G, H},
            ParamKind::Zero);
      }
    }
  }
  table.push_back({"norm.weight", {H}, norm, -1});
  if (c.dflash2) {
    // The order of SelectorParam; the codebooks carry no ".weight".
    const int64_t r = c.selectorRank, V = c.vocabSize;
    table.push_back(
        {"candidate_selector.hidden_projection.weight", {r, H}, linear, -1});
    table.push_back(
        {"candidate_selector.predecessor_codebook", {V, r}, linear, -1});
    table.push_back(
        {"candidate_selector.successor_codebook", {V, r}, ParamKind::Zero, -1});
  }
  return table;
}

std::optional<int64_t> dflash::findParameter(const ModelConfig &config,
                                             const std::string &name) {
  std::vector<ParamInfo> table = parameterTable(config);
  for (size_t i = 0; i < table.size(); ++i)
    if (table[i].name == name)
      return int64_t(i);
  return std::nullopt;
}

int64_t dflash::numParameters(const ModelConfig &config) {
  int64_t total = 0;
  for (const ParamInfo &param : parameterTable(config))
    total += param.numel();
  return total;
}
