//===- Parameters.h - The drafter's trainable tensors -----------*- C++ -*-===//
//
// Names, shapes and order of every trainable tensor. The importer declares
// the step's parameter arguments from this table, the runtime allocates,
// initialises, checkpoints and exports them in its order, so both sides
// agree by construction. Names are the checkpoint's (docs/semantics.md
// section 6).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_SCHEMA_PARAMETERS_H
#define DFLASH_SCHEMA_PARAMETERS_H

#include "schema/ModelConfig.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dflash {

/// What a trainable tensor is, which decides its initialisation.
enum class ParamKind : uint8_t {
  Linear,   ///< [out, in] weight (or a DFlash2 codebook): N(0, init_std)
  Norm,     ///< RMSNorm weight: 1
  ConvBase, ///< DFlash2 base_kernel [2, kc, H]: tap 0 is 1, the others 0
  Zero,     ///< 0: a DFlash2 kernel_projection and successor_codebook
};

/// One trainable tensor.
struct ParamInfo {
  std::string name; ///< checkpoint name ("layers.0.mlp.up_proj.weight")
  std::vector<int64_t> shape; ///< torch layout ([out, in] for linears)
  ParamKind kind = ParamKind::Linear;
  /// The draft layer it belongs to; -1 for fc, hidden_norm, norm and the
  /// DFlash2 selector.
  int64_t layer = -1;
  bool isNorm() const { return kind == ParamKind::Norm; }
  int64_t numel() const;
};

/// The tensors of one draft layer, in table order.
enum class LayerParam : uint8_t {
  InputNorm,
  QProj,
  KProj,
  VProj,
  OProj,
  QNorm,
  KNorm,
  PostNorm,
  GateProj,
  UpProj,
  DownProj,
  // DFlash2 drafters only (docs/semantics.md section 13):
  AttentionConvBase, ///< attention_conv.base_kernel [2, kc, H]
  AttentionConvProj, ///< attention_conv.kernel_projection.weight [2 kc G, H]
  MlpConvBase,       ///< mlp_conv.base_kernel
  MlpConvProj,       ///< mlp_conv.kernel_projection.weight
};
/// A DFlash drafter's tensors a layer, and a DFlash2 drafter's.
constexpr int64_t kParamsPerLayer = 11;
constexpr int64_t kDFlash2ParamsPerLayer = 15;
inline int64_t paramsPerLayer(const ModelConfig &config) {
  return config.dflash2 ? kDFlash2ParamsPerLayer : kParamsPerLayer;
}
/// Tensors before the first layer's: fc, hidden_norm.
constexpr int64_t kParamsBeforeLayers = 2;

/// A DFlash2 drafter's selector tensors, after norm, in table order.
enum class SelectorParam : uint8_t {
  HiddenProjection,    ///< candidate_selector.hidden_projection.weight [r, H]
  PredecessorCodebook, ///< candidate_selector.predecessor_codebook [V, r]
  SuccessorCodebook,   ///< candidate_selector.successor_codebook [V, r]
};

/// Every trainable tensor in the canonical order: fc, hidden_norm, per layer
/// i (input_layernorm, q/k/v/o_proj, q_norm, k_norm,
/// post_attention_layernorm, gate/up/down_proj; a DFlash2 drafter's then
/// attention_conv's and mlp_conv's base_kernel and kernel_projection), norm,
/// and for a DFlash2 drafter the selector's (SelectorParam). Parameter
/// buffers, checkpoints and optimizer state all use this order.
std::vector<ParamInfo> parameterTable(const ModelConfig &config);

/// Table indices of the tensors outside the layers, and of a layer's.
constexpr int64_t kFcParam = 0;
constexpr int64_t kHiddenNormParam = 1;
inline int64_t layerParamIndex(const ModelConfig &config, int64_t layer,
                               LayerParam p) {
  return kParamsBeforeLayers + layer * paramsPerLayer(config) + int64_t(p);
}
inline int64_t finalNormParamIndex(const ModelConfig &config) {
  return kParamsBeforeLayers + config.numLayers * paramsPerLayer(config);
}
/// A DFlash2 drafter's selector tensor.
inline int64_t selectorParamIndex(const ModelConfig &config, SelectorParam p) {
  return finalNormParamIndex(config) + 1 + int64_t(p);
}

/// The index of `name` in parameterTable(config), if it is one.
std::optional<int64_t> findParameter(const ModelConfig &config,
                                     const std::string &name);

/// Total number of trainable elements.
int64_t numParameters(const ModelConfig &config);

/// Whether tensor name `name` ends with `suffix` ("...conv1d.weight") and
/// has something before it.
inline bool tensorNameEndsWith(const std::string &name,
                               const std::string &suffix) {
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

} // namespace dflash

#endif // DFLASH_SCHEMA_PARAMETERS_H
