//===- TargetConfig.cpp - The online target's config.json -----------------===//

#include "compiler/Import/TargetConfig.h"

#include "compiler/Import/ConfigReader.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <cmath>

using namespace ::dflash;
using namespace ::dflash::import;

namespace {

/// What a row longer than the target's positions needs.
constexpr const char *kTargetPositionsAdvice =
    ": its features past that position would not be the served target's; "
    "give its config.json the rope_scaling it is served with (Qwen3 reaches "
    "131072 positions with YaRN, factor 4 over 32768, and "
    "max_position_embeddings 131072), or train shorter rows";

/// YaRN's fields of rope_scaling / rope_parameters (`where`), with
/// transformers' defaults: factor max_position_embeddings / original,
/// beta_fast 32, beta_slow 1, truncate true, and the attention factor from
/// mscale / mscale_all_dim when both are given, else 0.1 ln(factor) + 1.
/// max_position_embeddings is read before (readMaxPositions).
bool readYarn(ConfigReader &r, const json::Object &s, const std::string &where,
              TargetModelConfig &config) {
  YarnRopeScaling y;
  const double maxPositions = double(config.maxPositionEmbeddings);
  double original = 0, factor = 0;
  if (!r.number(s, where, "original_max_position_embeddings", original) ||
      !r.number(s, where, "factor", factor) ||
      !r.number(s, where, "beta_fast", y.betaFast) ||
      !r.number(s, where, "beta_slow", y.betaSlow))
    return false;
  if (original == 0)
    original = maxPositions;
  if (original == 0)
    return r.fail(where + "original_max_position_embeddings",
                  "is missing (and so is 'max_position_embeddings')");
  if (original != std::floor(original))
    return r.fail(where + "original_max_position_embeddings",
                  "must be an integer");
  y.originalMaxPositions = int64_t(original);
  y.factor = factor > 0 ? factor : maxPositions / original;
  if (!(y.factor > 0))
    return r.fail(where + "factor", "is missing (and so is "
                                    "'max_position_embeddings')");
  if (y.betaFast < y.betaSlow)
    return r.fail(where + "beta_fast", "must be at least beta_slow");
  if (const json::Value *t = s.get("truncate");
      t && t->kind() != json::Value::Null) {
    std::optional<bool> b = t->getAsBoolean();
    if (!b)
      return r.fail(where + "truncate", "must be true or false");
    y.truncate = *b;
  }
  auto mscaleOf = [](double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
  };
  double given = 0, mscale = 0, mscaleAllDim = 0;
  if (!r.number(s, where, "attention_factor", given) ||
      !r.number(s, where, "mscale", mscale) ||
      !r.number(s, where, "mscale_all_dim", mscaleAllDim))
    return false;
  y.attentionFactor =
      given > 0 ? given
      : mscale > 0 && mscaleAllDim > 0
          ? mscaleOf(y.factor, mscale) / mscaleOf(y.factor, mscaleAllDim)
          : mscaleOf(y.factor, 1.0);
  config.yarn = y;
  return true;
}

/// max_position_embeddings, where given (a positive integer).
bool readMaxPositions(ConfigReader &r, TargetModelConfig &config) {
  const json::Value *v = r.object.get("max_position_embeddings");
  if (!v || v->kind() == json::Value::Null)
    return true;
  return r.positive("max_position_embeddings", config.maxPositionEmbeddings);
}

/// The rope fields: rope_theta and rope_scaling (transformers 4), or
/// rope_parameters holding both (transformers 5).
bool readRope(ConfigReader &r, TargetModelConfig &config) {
  const json::Object &o = r.object;
  if (!r.number(o, "", "rope_theta", config.ropeTheta))
    return false;
  const char *scalingKey = "rope_scaling";
  const json::Value *scaling = o.get(scalingKey);
  if (const json::Value *params = o.get("rope_parameters");
      params && params->kind() != json::Value::Null) {
    if (!params->getAsObject())
      return r.fail("rope_parameters", "must be an object");
    if (!r.number(*params->getAsObject(), "rope_parameters.", "rope_theta",
                  config.ropeTheta))
      return false;
    scaling = params;
    scalingKey = "rope_parameters";
  }
  if (!scaling || scaling->kind() == json::Value::Null)
    return true;
  const json::Object *s = scaling->getAsObject();
  if (!s)
    return r.fail(scalingKey, "must be an object or null");
  std::string where = std::string(scalingKey) + ".";
  std::optional<llvm::StringRef> type = s->getString("rope_type");
  if (!type)
    type = s->getString("type");
  if (!type || *type == "default")
    return true;
  if (*type == "yarn")
    return readYarn(r, *s, where, config);
  if (*type != "llama3")
    return r.fail(where + "rope_type",
                  "is '" + type->str() +
                      "': only default rope, Llama-3 scaling ('llama3') and "
                      "YaRN ('yarn') are supported");
  Llama3RopeScaling l3;
  double original = double(l3.originalMaxPositions);
  if (!r.number(*s, where, "factor", l3.factor) ||
      !r.number(*s, where, "low_freq_factor", l3.lowFreqFactor) ||
      !r.number(*s, where, "high_freq_factor", l3.highFreqFactor) ||
      !r.number(*s, where, "original_max_position_embeddings", original))
    return false;
  if (original != std::floor(original))
    return r.fail(where + "original_max_position_embeddings",
                  "must be an integer");
  if (l3.highFreqFactor < l3.lowFreqFactor)
    return r.fail(where + "high_freq_factor",
                  "must be at least low_freq_factor");
  l3.originalMaxPositions = int64_t(original);
  config.ropeScaling = l3;
  return true;
}

} // namespace

bool dflash::import::readExperts(ConfigReader &r, TargetModelConfig &config,
                                 bool sharedExpert) {
  const json::Object &o = r.object;
  // transformers 5.8 writes the count as num_local_experts.
  const char *countField = !o.get("num_experts") && o.get("num_local_experts")
                               ? "num_local_experts"
                               : "num_experts";
  if (!r.positive(countField, config.numExperts) ||
      !r.positive("num_experts_per_tok", config.numExpertsPerToken) ||
      !r.positive("moe_intermediate_size", config.moeIntermediateSize) ||
      !r.positive("decoder_sparse_step", config.decoderSparseStep, 1) ||
      !r.boolean("norm_topk_prob", config.normTopkProb))
    return false;
  // The MoE kernels route among at most this many experts.
  constexpr int64_t kMaxExperts = 512;
  if (config.numExperts > kMaxExperts)
    return r.fail(countField, "is " + std::to_string(config.numExperts) +
                                  ": at most " + std::to_string(kMaxExperts) +
                                  " experts are supported");
  if (config.numExpertsPerToken > config.numExperts)
    return r.fail("num_experts_per_tok",
                  "(" + std::to_string(config.numExpertsPerToken) +
                      ") must be at most '" + countField + "' (" +
                      std::to_string(config.numExperts) + ")");
  if (sharedExpert) {
    if (!r.positive("shared_expert_intermediate_size",
                    config.sharedExpertIntermediateSize))
      return false;
  } else if (const json::Value *shared =
                 o.get("shared_expert_intermediate_size");
             shared && shared->getAsInteger().value_or(0) != 0) {
    return r.fail("shared_expert_intermediate_size",
                  "is set: a shared expert is not compiled for Qwen3-MoE "
                  "(the model has none)");
  }
  if (std::optional<llvm::StringRef> scoring = o.getString("scoring_func");
      scoring && *scoring != "softmax")
    return r.fail("scoring_func", "is '" + scoring->str() +
                                      "': the router of a Qwen3-MoE target "
                                      "scores with softmax");
  if (const json::Value *dense = o.get("mlp_only_layers");
      dense && dense->kind() != json::Value::Null) {
    const json::Array *list = dense->getAsArray();
    if (!list)
      return r.fail("mlp_only_layers", "must be a list of layer indices");
    for (size_t i = 0; i < list->size(); ++i) {
      std::optional<int64_t> layer = (*list)[i].getAsInteger();
      if (!layer || *layer < 0 || *layer >= config.numLayers)
        return r.fail("mlp_only_layers", "entry " + std::to_string(i) +
                                             " must be a layer index in [0, " +
                                             std::to_string(config.numLayers) +
                                             ")");
      config.mlpOnlyLayers.push_back(*layer);
    }
  }
  return true;
}

namespace {

/// gpt-oss's experts (every layer's MLP is sparse, `intermediate_size`
/// wide), its clamp, and which layers slide (`layer_types`, else every
/// even one as transformers defaults) over `sliding_window` keys.
bool readGptOss(ConfigReader &r, TargetModelConfig &config) {
  const json::Object &o = r.object;
  config.gptOss = true;
  config.moeIntermediateSize = config.intermediateSize;
  if (!r.positive("num_local_experts", config.numExperts) ||
      !r.positive("num_experts_per_tok", config.numExpertsPerToken) ||
      !r.number(o, "", "swiglu_limit", config.swigluLimit))
    return false;
  constexpr int64_t kMaxExperts = 512;
  if (config.numExperts > kMaxExperts)
    return r.fail("num_local_experts",
                  "is " + std::to_string(config.numExperts) + ": at most " +
                      std::to_string(kMaxExperts) + " experts are supported");
  if (config.numExpertsPerToken > config.numExperts)
    return r.fail("num_experts_per_tok",
                  "(" + std::to_string(config.numExpertsPerToken) +
                      ") must be at most 'num_local_experts' (" +
                      std::to_string(config.numExperts) + ")");
  if (const json::Value *bias = o.get("attention_bias");
      bias && !bias->getAsBoolean().value_or(true))
    return r.fail("attention_bias", "is false: a gpt-oss target's q/k/v/o "
                                    "projections have biases");
  config.slidingLayers.assign(size_t(config.numLayers), false);
  if (const json::Value *kinds = o.get("layer_types");
      kinds && kinds->kind() != json::Value::Null) {
    const json::Array *list = kinds->getAsArray();
    if (!list || list->size() != size_t(config.numLayers))
      return r.fail("layer_types", "must list one of 'full_attention' or "
                                   "'sliding_attention' for each of the " +
                                       std::to_string(config.numLayers) +
                                       " layers");
    for (size_t i = 0; i < list->size(); ++i) {
      std::optional<llvm::StringRef> kind = (*list)[i].getAsString();
      if (!kind || (*kind != "full_attention" && *kind != "sliding_attention"))
        return r.fail("layer_types",
                      "entry " + std::to_string(i) + " is '" +
                          (kind ? kind->str() : std::string("not a string")) +
                          "': a gpt-oss layer is 'full_attention' or "
                          "'sliding_attention'");
      config.slidingLayers[i] = *kind == "sliding_attention";
    }
  } else {
    for (int64_t i = 0; i < config.numLayers; ++i)
      config.slidingLayers[size_t(i)] = i % 2 == 0;
  }
  if (std::find(config.slidingLayers.begin(), config.slidingLayers.end(),
                true) != config.slidingLayers.end() &&
      !r.positive("sliding_window", config.slidingWindow))
    return false;
  return true;
}

} // namespace

std::optional<TargetModelConfig>
dflash::readTargetConfig(const std::string &dir, std::string &error) {
  TargetModelConfig config;
  llvm::SmallString<256> path(dir);
  llvm::sys::path::append(path, "config.json");
  config.configPath = path.str().str();
  auto buffer = llvm::MemoryBuffer::getFile(path);
  if (!buffer) {
    error = config.configPath + ": cannot read (" +
            buffer.getError().message() + "); --target names the target's " +
            "Hugging Face directory";
    return std::nullopt;
  }
  llvm::Expected<json::Value> parsed = json::parse((*buffer)->getBuffer());
  if (!parsed) {
    error = config.configPath +
            ": not valid JSON: " + llvm::toString(parsed.takeError());
    return std::nullopt;
  }
  const json::Object *root = parsed->getAsObject();
  if (!root) {
    error = config.configPath + ": not a JSON object";
    return std::nullopt;
  }
  // Multimodal checkpoints keep the language model under text_config.
  std::string prefix;
  if (const json::Object *text = root->getObject("text_config")) {
    root = text;
    prefix = "text_config.";
  }
  ConfigReader r(*root, config.configPath, prefix, error);

  std::optional<llvm::StringRef> type = root->getString("model_type");
  if (!type) {
    r.fail("model_type", "is missing");
    return std::nullopt;
  }
  config.modelType = type->str();
  const bool gptOss = config.modelType == "gpt_oss";
  const llvm::StringRef kind(config.modelType);
  config.hybrid = kind == "qwen3_5" || kind == "qwen3_5_text" ||
                  kind == "qwen3_5_moe" || kind == "qwen3_5_moe_text" ||
                  kind == "qwen3_next";
  // Qwen3.5-MoE has no dense layers, so no intermediate_size.
  const bool allSparse = kind.starts_with("qwen3_5_moe");
  if (kind != "qwen3" && kind != "llama" && kind != "qwen3_moe" && !gptOss &&
      !config.hybrid) {
    std::string why = "the target must be a Qwen3 ('qwen3'), Qwen3-MoE "
                      "('qwen3_moe'), gpt-oss ('gpt_oss'), Llama-3 "
                      "('llama') or Qwen3.5/3.6/Next hybrid ('qwen3_5', "
                      "'qwen3_5_moe', their '_text' forms, 'qwen3_next') "
                      "decoder";
    if (root->get("num_experts") || root->get("num_local_experts") ||
        llvm::StringRef(config.modelType).contains("moe"))
      why = "this mixture-of-experts target cannot be compiled yet: " + why;
    r.fail("model_type", "is '" + config.modelType + "': " + why);
    return std::nullopt;
  }
  if (std::optional<llvm::StringRef> act = root->getString("hidden_act");
      act && *act != "silu") {
    r.fail("hidden_act",
           "is '" + act->str() + "': the decoder's MLP must be SwiGLU (silu)");
    return std::nullopt;
  }
  if (!r.positive("hidden_size", config.hiddenSize) ||
      (!allSparse &&
       !r.positive("intermediate_size", config.intermediateSize)) ||
      !r.positive("num_hidden_layers", config.numLayers) ||
      !r.positive("num_attention_heads", config.numHeads) ||
      !r.positive("num_key_value_heads", config.numKvHeads, config.numHeads) ||
      !r.positive("vocab_size", config.vocabSize) ||
      !r.number(*root, "", "rms_norm_eps", config.rmsNormEps) ||
      !readMaxPositions(r, config) ||
      !r.boolean("tie_word_embeddings", config.tieWordEmbeddings) ||
      (!gptOss && !r.notTrue("attention_bias", "the q/k/v/o projections of a " +
                                                   config.modelType +
                                                   " target have no bias")) ||
      !r.notTrue("mlp_bias", "the MLP projections have no bias here") ||
      !r.notTrue("use_sliding_window",
                 "only full causal attention is compiled for the target") ||
      !readRope(r, config))
    return std::nullopt;
  // transformers 5 names each layer's attention; every one must be full
  // (gpt-oss's sliding and the hybrids' linear layers are read with the
  // rest of them).
  if (const json::Array *kinds = root->getArray("layer_types");
      kinds && !gptOss && !config.hybrid)
    for (size_t i = 0; i < kinds->size(); ++i)
      if (std::optional<llvm::StringRef> kind = (*kinds)[i].getAsString();
          !kind || *kind != "full_attention") {
        r.fail("layer_types",
               "entry " + std::to_string(i) + " is '" +
                   (kind ? kind->str() : std::string("not a string")) +
                   "': only full causal attention is compiled for the "
                   "target");
        return std::nullopt;
      }
  if (config.numHeads % config.numKvHeads != 0) {
    r.fail("num_attention_heads",
           "(" + std::to_string(config.numHeads) +
               ") must be a multiple of 'num_key_value_heads' (" +
               std::to_string(config.numKvHeads) + ")");
    return std::nullopt;
  }
  if (config.hiddenSize % config.numHeads != 0 && !root->get("head_dim")) {
    r.fail("head_dim", "is missing and 'hidden_size' is not a "
                       "multiple of 'num_attention_heads'");
    return std::nullopt;
  }
  if (!r.positive("head_dim", config.headDim,
                  config.hiddenSize / config.numHeads))
    return std::nullopt;
  config.qkNorm = kind == "qwen3" || kind == "qwen3_moe" || config.hybrid;
  if (config.modelType == "qwen3_moe" &&
      !readExperts(r, config, /*sharedExpert=*/false))
    return std::nullopt;
  if (gptOss && !readGptOss(r, config))
    return std::nullopt;
  if (config.hybrid && !readHybrid(r, config))
    return std::nullopt;
  return config;
}

bool dflash::checkTargetAgainstSpec(const TargetModelConfig &target,
                                    const DrafterSpec &spec,
                                    std::string &error) {
  auto mismatch =
      [&](const std::string &configField, const std::string &configValue,
          const std::string &specKey, const std::string &specValue) {
        SourceLoc loc = spec.locationOf(specKey);
        std::string at = loc.line ? ":" + std::to_string(loc.line) : "";
        bool written = spec.locations.count(specKey) != 0;
        error = target.configPath + ": '" + configField + "' is " +
                configValue + " but " + spec.file + at + ": '" + specKey +
                "' is " + specValue + (written ? "" : " (the default)");
        return false;
      };
  auto str = [](int64_t v) { return std::to_string(v); };
  auto yes = [](bool v) { return std::string(v ? "true" : "false"); };
  if (target.hiddenSize != spec.targetHiddenSize)
    return mismatch("hidden_size", str(target.hiddenSize), "target.hidden_size",
                    str(spec.targetHiddenSize));
  if (target.vocabSize != spec.vocabSize)
    return mismatch("vocab_size", str(target.vocabSize), "target.vocab_size",
                    str(spec.vocabSize));
  if (target.numLayers != spec.targetNumLayers)
    return mismatch("num_hidden_layers", str(target.numLayers),
                    "target.num_layers", str(spec.targetNumLayers));
  if (target.tieWordEmbeddings != spec.tieWordEmbeddings)
    return mismatch("tie_word_embeddings", yes(target.tieWordEmbeddings),
                    "target.tie_word_embeddings", yes(spec.tieWordEmbeddings));
  // The online target computes the features of every position of a row:
  // past its trained range they are not what it serves.
  if (target.maxPositionEmbeddings > 0 &&
      spec.seqLen > target.maxPositionEmbeddings) {
    mismatch("max_position_embeddings", str(target.maxPositionEmbeddings),
             "training.seq_len", str(spec.seqLen));
    error += kTargetPositionsAdvice;
    return false;
  }
  return true;
}

std::string dflash::targetDirectory(const DrafterSpec &spec,
                                    const std::string &commandLine) {
  if (!commandLine.empty() || spec.targetPath.empty())
    return commandLine;
  if (llvm::sys::path::is_absolute(spec.targetPath))
    return spec.targetPath;
  llvm::SmallString<256> dir(llvm::sys::path::parent_path(spec.file));
  llvm::sys::path::append(dir, spec.targetPath);
  return dir.str().str();
}
