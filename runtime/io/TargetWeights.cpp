//===- TargetWeights.cpp - Frozen embedding and lm_head of the target -----===//

#include "runtime/io/TargetWeights.h"

#include "kernels/Bf16.h"
#include "runtime/io/AtomicWrite.h"
#include "runtime/io/Mxfp4.h"
#include "runtime/io/Safetensors.h"
#include "schema/Parameters.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <random>

using namespace dflash;
using namespace dflash::rt;
using json = nlohmann::json;

/// The config entry `key`, at the top level or under text_config (where
/// multimodal targets keep their language model's fields); null if neither.
static const json *configEntry(const json &config, const std::string &key) {
  auto it = config.find(key);
  if (it != config.end())
    return &*it;
  auto text = config.find("text_config");
  if (text != config.end() && text->is_object()) {
    auto nested = text->find(key);
    if (nested != text->end())
      return &*nested;
  }
  return nullptr;
}

static Status checkConfigInteger(const json &config, const std::string &path,
                                 const std::string &key, int64_t expected) {
  const json *entry = configEntry(config, key);
  if (!entry)
    return Status::error(path + ": has no '" + key + "'");
  if (!entry->is_number_integer())
    return Status::error(path + ": '" + key + "' is not an integer");
  int64_t value = entry->get<int64_t>();
  if (value != expected)
    return Status::error(path + ": '" + key + "' is " + std::to_string(value) +
                         " but the spec needs " + std::to_string(expected));
  return Status::success();
}

/// The first of `names` that the model has; null (with success) if none.
static Status findFirst(ShardedSafetensors &tensors,
                        const std::vector<std::string> &names,
                        const TensorView *&view) {
  view = nullptr;
  for (const std::string &name : names) {
    Status status = tensors.find(name, view);
    if (!status.ok() || view)
      return status;
  }
  return Status::success();
}

/// Copies `view` as bf16 (F32 rounded) after checking it has `expected`'s
/// shape; `needer` says who needs it ("the spec").
static Status copyAsBf16(ShardedSafetensors &tensors, const TensorView &view,
                         const std::vector<int64_t> &expected,
                         const std::string &needer,
                         std::vector<uint16_t> &out) {
  std::string where = tensors.directory() + "/" + tensors.fileOf(view.name) +
                      ": tensor '" + view.name + "'";
  // A depthwise conv1d's weight [C, 1, K] is read as the [C, K] it holds.
  const bool squeezedConv =
      view.shape.size() == 3 && view.shape[1] == 1 && expected.size() == 2 &&
      view.shape[0] == expected[0] && view.shape[2] == expected[1] &&
      tensorNameEndsWith(view.name, ".conv1d.weight");
  if (view.shape != expected && !squeezedConv)
    return Status::error(where + " has shape " + shapeString(view.shape) +
                         " but " + needer + " needs " + shapeString(expected));
  size_t count = size_t(shapeNumel(expected));
  out.resize(count);
  if (view.dtype == DType::BF16) {
    std::memcpy(out.data(), view.data, count * sizeof(uint16_t));
    return Status::success();
  }
  if (view.dtype == DType::F32) {
    for (size_t i = 0; i < count; ++i) {
      float value;
      std::memcpy(&value, view.data + i * sizeof(float), sizeof(float));
      out[i] = floatToBf16(value);
    }
    return Status::success();
  }
  return Status::error(where + " has dtype " + dtypeName(view.dtype) +
                       " but BF16 or F32 is needed");
}

Status dflash::rt::loadTargetWeights(const std::string &dir,
                                     const ModelConfig &config,
                                     TargetWeights &weights) {
  std::string configPath = dir + "/config.json";
  std::string text;
  Status status = readTextFile(configPath, text);
  if (!status.ok())
    return status;
  json targetConfig = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (targetConfig.is_discarded() || !targetConfig.is_object())
    return Status::error(configPath + ": not a json object");
  status = checkConfigInteger(targetConfig, configPath, "hidden_size",
                              config.targetHiddenSize);
  if (status.ok())
    status = checkConfigInteger(targetConfig, configPath, "vocab_size",
                                config.vocabSize);
  if (status.ok())
    status = checkConfigInteger(targetConfig, configPath, "num_hidden_layers",
                                config.targetNumLayers);
  if (!status.ok())
    return status;
  const json *tie = configEntry(targetConfig, "tie_word_embeddings");
  if (tie && !tie->is_boolean())
    return Status::error(configPath + ": 'tie_word_embeddings' is not a "
                                      "boolean");

  ShardedSafetensors tensors;
  status = tensors.open(dir);
  if (!status.ok())
    return status;
  const TensorView *embed = nullptr, *lmHead = nullptr;
  status = findFirst(tensors,
                     {"model.embed_tokens.weight",
                      "model.language_model.embed_tokens.weight",
                      "language_model.model.embed_tokens.weight"},
                     embed);
  if (!status.ok())
    return status;
  if (!embed)
    return Status::error(dir + ": has no tensor 'model.embed_tokens.weight'");
  status = findFirst(
      tensors, {"lm_head.weight", "language_model.lm_head.weight"}, lmHead);
  if (!status.ok())
    return status;

  // The compiled trainer fixes tying; the target must agree where it says.
  bool tied = config.tieWordEmbeddings;
  if (tie && tie->get<bool>() != tied)
    return Status::error(configPath + ": 'tie_word_embeddings' is " +
                         (tie->get<bool>() ? "true" : "false") +
                         " but the spec needs " + (tied ? "true" : "false"));
  if (!tied && !lmHead)
    return Status::error(dir + ": has no tensor 'lm_head.weight' but the "
                               "spec sets tie_word_embeddings false");

  weights = TargetWeights();
  weights.vocabSize = config.vocabSize;
  weights.hiddenSize = config.targetHiddenSize;
  weights.tied = tied;
  const std::vector<int64_t> table{config.vocabSize, config.targetHiddenSize};
  status = copyAsBf16(tensors, *embed, table, "the spec", weights.embed);
  if (status.ok() && !tied)
    status = copyAsBf16(tensors, *lmHead, table, "the spec", weights.lmHead);
  return status;
}

/// A mixture-of-experts layer's stacked expert weight [E, N, K], named
/// "<layer>.mlp.experts.<proj>.weight", from the checkpoint's one tensor per
/// expert, "<layer>.mlp.experts.<j>.<proj>.weight" [N, K] (the Hugging Face
/// layout), expert j at row block j, or from transformers 5's fused tensors
/// (save_original_format=False, and Qwen3.5's checkpoints): gate and up as
/// one "<layer>.mlp.experts.gate_up_proj" [E, 2N, K] (the gate's rows
/// first), down as "<layer>.mlp.experts.down_proj" [E, N, K]. False when
/// `name` is not of that form.
static bool stackedExpertName(const std::string &name, std::string &before,
                              std::string &after) {
  const std::string experts = ".mlp.experts.";
  size_t at = name.find(experts);
  if (at == std::string::npos)
    return false;
  before = name.substr(0, at + experts.size());
  after = name.substr(at + experts.size());
  return !after.empty() && !std::isdigit((unsigned char)after[0]);
}

/// The fused tensor read last, by name: a layer's gate and up weights are
/// both halves of one gate_up_proj, read once for the two.
struct FusedExperts {
  std::string name;
  std::vector<uint16_t> values;
};

static Status
loadStackedExperts(ShardedSafetensors &tensors, const FrozenTensor &wanted,
                   const std::string &before, const std::string &after,
                   const std::string &needer, FusedExperts &lastFused,
                   std::vector<uint16_t> &out) {
  const std::vector<int64_t> one(wanted.shape.begin() + 1, wanted.shape.end());
  const size_t perExpert = size_t(shapeNumel(one));
  out.assign(size_t(shapeNumel(wanted.shape)), 0);
  std::vector<uint16_t> expert;
  // transformers 5's fused layout, when the checkpoint has it.
  const std::string proj = after.substr(0, after.find('.'));
  const bool halves = proj == "gate_proj" || proj == "up_proj";
  const std::string fusedName = before + (halves ? "gate_up_proj" : proj);
  if (lastFused.name != fusedName) {
    const TensorView *fused = nullptr;
    DFLASH_RETURN_IF_ERROR(tensors.find(fusedName, fused));
    if (fused) {
      std::vector<int64_t> shape = wanted.shape;
      if (halves)
        shape[1] *= 2;
      lastFused.name.clear(); // until the read succeeds
      DFLASH_RETURN_IF_ERROR(
          copyAsBf16(tensors, *fused, shape, needer, lastFused.values));
      lastFused.name = fusedName;
    }
  }
  if (lastFused.name == fusedName) {
    const size_t half = halves && proj == "up_proj" ? perExpert : 0;
    for (int64_t j = 0; j < wanted.shape[0]; ++j) {
      auto from =
          lastFused.values.begin() + j * (halves ? 2 : 1) * perExpert + half;
      std::copy(from, from + perExpert, out.begin() + j * perExpert);
    }
    return Status::success();
  }
  for (int64_t j = 0; j < wanted.shape[0]; ++j) {
    std::string name = before + std::to_string(j) + "." + after;
    const TensorView *view = nullptr;
    DFLASH_RETURN_IF_ERROR(tensors.find(name, view));
    if (!view)
      return Status::error(tensors.directory() + ": has neither '" +
                           wanted.name + "', '" + fusedName + "' nor '" + name +
                           "' (expert " + std::to_string(j) + " of " +
                           std::to_string(wanted.shape[0]) + "), which " +
                           needer + " needs");
    DFLASH_RETURN_IF_ERROR(copyAsBf16(tensors, *view, one, needer, expert));
    std::copy(expert.begin(), expert.end(), out.begin() + j * perExpert);
  }
  return Status::success();
}

/// One MXFP4 tensor pair, "<name>_blocks" [E, R, C/32, 16] and
/// "<name>_scales" [E, R, C/32] (uint8), dequantised to bf16 [E, R, C].
static Status readMxfp4(ShardedSafetensors &tensors, const std::string &name,
                        int64_t E, int64_t R, int64_t C,
                        const std::string &needer, std::vector<uint16_t> &out) {
  const TensorView *blocks = nullptr, *scales = nullptr;
  DFLASH_RETURN_IF_ERROR(tensors.find(name + "_blocks", blocks));
  DFLASH_RETURN_IF_ERROR(tensors.find(name + "_scales", scales));
  const std::string where = tensors.directory() + ": ";
  if (!blocks || !scales)
    return Status::error(where + "has '" + name +
                         (blocks ? "_blocks" : "_scales") + "' without its '" +
                         name + (blocks ? "_scales" : "_blocks") + "', which " +
                         needer + " needs");
  const int64_t groups = C / kMxfp4GroupValues;
  const std::vector<int64_t> blockShape{E, R, groups, kMxfp4GroupBytes},
      scaleShape{E, R, groups};
  if (C % kMxfp4GroupValues != 0 || blocks->dtype != DType::U8 ||
      blocks->shape != blockShape)
    return Status::error(where + "tensor '" + blocks->name + "' is " +
                         dtypeName(blocks->dtype) + " " +
                         shapeString(blocks->shape) + " but " + needer +
                         " needs U8 " + shapeString(blockShape));
  if (scales->dtype != DType::U8 || scales->shape != scaleShape)
    return Status::error(where + "tensor '" + scales->name + "' is " +
                         dtypeName(scales->dtype) + " " +
                         shapeString(scales->shape) + " but " + needer +
                         " needs U8 " + shapeString(scaleShape));
  out.resize(size_t(E * R * C));
  return dequantizeMxfp4(blocks->data, scales->data, E * R * groups,
                         tensors.directory() + "/" +
                             tensors.fileOf(blocks->name) + ": tensor '" +
                             blocks->name + "'",
                         out.data());
}

/// gpt-oss's experts, read into the stacked "<layer>.mlp.experts.<proj>.
/// weight" [E, N, K] and ".bias" [E, N] when the checkpoint has gpt-oss's
/// layout (`found`; a "gate_up_proj_bias" or "down_proj_bias" beside the
/// weights): gate and up interleaved, the gate's outputs at the even
/// columns, in "gate_up_proj" [E, H, 2I] and "gate_up_proj_bias" [E, 2I],
/// and "down_proj" [E, I, H] (inputs first, x W), or the official MXFP4
/// "<proj>_blocks" / "_scales" with the outputs first ([E, 2I, H] and
/// [E, H, I] once dequantised).
static Status
loadGptOssExperts(ShardedSafetensors &tensors, const FrozenTensor &wanted,
                  const std::string &before, const std::string &after,
                  const std::string &needer, FusedExperts &lastFused,
                  std::vector<uint16_t> &out, bool &found) {
  const size_t dot = after.find('.');
  const std::string proj = after.substr(0, dot), part = after.substr(dot + 1);
  const bool gateUp = proj == "gate_proj" || proj == "up_proj";
  const std::string source = before + (gateUp ? "gate_up_proj" : "down_proj");
  found =
      (gateUp || proj == "down_proj") && (tensors.contains(source + "_bias") ||
                                          tensors.contains(source + "_blocks"));
  if (!found)
    return Status::success();
  const int64_t E = wanted.shape[0], N = wanted.shape[1];
  const int64_t half = proj == "up_proj" ? 1 : 0, parts = gateUp ? 2 : 1;
  out.assign(size_t(shapeNumel(wanted.shape)), 0);
  if (part == "bias") {
    const TensorView *view = nullptr;
    DFLASH_RETURN_IF_ERROR(tensors.find(source + "_bias", view));
    if (!view || wanted.shape.size() != 2)
      return Status::error(tensors.directory() + ": has no tensor '" + source +
                           "_bias' for '" + wanted.name + "', which " + needer +
                           " needs");
    std::vector<uint16_t> bias;
    DFLASH_RETURN_IF_ERROR(
        copyAsBf16(tensors, *view, {E, parts * N}, needer, bias));
    for (int64_t e = 0; e < E; ++e)
      for (int64_t n = 0; n < N; ++n)
        out[size_t(e * N + n)] = bias[size_t((e * N + n) * parts + half)];
    return Status::success();
  }
  if (part != "weight" || wanted.shape.size() != 3)
    return Status::error(tensors.directory() + ": '" + wanted.name +
                         "' is not a gpt-oss expert tensor " + needer +
                         " can read");
  const int64_t K = wanted.shape[2];
  // The whole source tensor once per layer: gate and up share it.
  const bool mxfp4 = tensors.contains(source + "_blocks");
  const std::string key = source + (mxfp4 ? " (MXFP4)" : "");
  if (lastFused.name != key) {
    lastFused.name.clear(); // until the read succeeds
    if (mxfp4) {
      DFLASH_RETURN_IF_ERROR(readMxfp4(tensors, source, E, parts * N, K, needer,
                                       lastFused.values));
    } else {
      const TensorView *view = nullptr;
      DFLASH_RETURN_IF_ERROR(tensors.find(source, view));
      if (!view)
        return Status::error(tensors.directory() + ": has '" + source +
                             "_bias' but not '" + source + "', which " +
                             needer + " needs for '" + wanted.name + "'");
      DFLASH_RETURN_IF_ERROR(copyAsBf16(tensors, *view, {E, K, parts * N},
                                        needer, lastFused.values));
    }
    lastFused.name = key;
  }
  const std::vector<uint16_t> &v = lastFused.values;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t column = n * parts + half; // the source's output index
      uint16_t *row = out.data() + (e * N + n) * K;
      for (int64_t k = 0; k < K; ++k)
        row[k] = mxfp4 ? v[size_t((e * parts * N + column) * K + k)]
                       : v[size_t((e * K + k) * parts * N + column)];
    }
  return Status::success();
}

Status dflash::rt::loadFrozenTensors(const std::string &dir,
                                     const std::vector<FrozenTensor> &wanted,
                                     const std::string &needer,
                                     std::vector<std::vector<uint16_t>> &out) {
  ShardedSafetensors tensors;
  Status status = tensors.open(dir);
  if (!status.ok())
    return status;
  out.assign(wanted.size(), {});
  FusedExperts lastFused;
  // A multimodal checkpoint (Qwen3.5's) keeps the language model's tensors
  // under model.language_model.; the program names them as a causal LM.
  const std::string text = "model.language_model.";
  const bool multimodal = tensors.contains(text + "embed_tokens.weight") &&
                          !tensors.contains("model.embed_tokens.weight");
  for (size_t i = 0; i < wanted.size(); ++i) {
    FrozenTensor named = wanted[i];
    if (multimodal && named.name.rfind("model.", 0) == 0)
      named.name = text + named.name.substr(6);
    const TensorView *view = nullptr;
    status = tensors.find(named.name, view);
    if (!status.ok())
      return status;
    std::string before, after;
    const bool stacked = !view && stackedExpertName(named.name, before, after);
    bool gptOss = false;
    if (stacked) {
      status = loadGptOssExperts(tensors, named, before, after, needer,
                                 lastFused, out[i], gptOss);
      if (!status.ok())
        return status;
    }
    if (gptOss)
      continue;
    if (stacked && named.shape.size() == 3)
      status = loadStackedExperts(tensors, named, before, after, needer,
                                  lastFused, out[i]);
    else if (!view)
      return Status::error(dir + ": has no tensor '" + named.name +
                           "', which " + needer + " needs");
    else
      status = copyAsBf16(tensors, *view, named.shape, needer, out[i]);
    if (!status.ok())
      return status;
  }
  return Status::success();
}

const std::vector<uint16_t> &dflash::rt::randomWeightPattern() {
  static const std::vector<uint16_t> pattern = [] {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 0.02f);
    std::vector<uint16_t> p(size_t(1) << 24);
    for (uint16_t &v : p)
      v = floatToBf16(normal(rng));
    return p;
  }();
  return pattern;
}

/// `count` values of the pattern, repeated.
static void fillFromPattern(std::vector<uint16_t> &out, size_t count) {
  const std::vector<uint16_t> &pattern = randomWeightPattern();
  out.resize(count);
  for (size_t at = 0; at < count; at += pattern.size())
    std::copy_n(pattern.begin(), std::min(pattern.size(), count - at),
                out.begin() + at);
}

void dflash::rt::randomFrozenTensors(const std::vector<FrozenTensor> &wanted,
                                     std::vector<std::vector<uint16_t>> &out) {
  out.assign(wanted.size(), {});
  for (size_t i = 0; i < wanted.size(); ++i) {
    const size_t count = size_t(shapeNumel(wanted[i].shape));
    if (wanted[i].shape.size() == 1)
      out[i].assign(count, kBf16One);
    else
      fillFromPattern(out[i], count);
  }
}

void dflash::rt::randomTargetWeights(const ModelConfig &config,
                                     TargetWeights &weights) {
  weights.vocabSize = config.vocabSize;
  weights.hiddenSize = config.targetHiddenSize;
  weights.tied = config.tieWordEmbeddings;
  const size_t count = size_t(config.vocabSize * config.targetHiddenSize);
  fillFromPattern(weights.embed, count);
  if (!weights.tied)
    fillFromPattern(weights.lmHead, count);
}
