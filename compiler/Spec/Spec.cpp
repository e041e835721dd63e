//===- Spec.cpp - Reading, validating and printing drafter specs ----------===//
//
// The schema is written once, as the sequence of `read*` calls in
// SpecReader::run; unknown keys, wrong types and broken rules stop at the first
// error with the file, line and column of the offending entry.
//
//===----------------------------------------------------------------------===//

#include "compiler/Spec/Spec.h"

// Header-only and without exceptions: LLVM-built targets use -fno-exceptions
// and Debian's shared TOML++ exports only the exception ABI.
#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 0
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

using namespace ::dflash;

std::string SpecError::str() const {
  std::ostringstream os;
  os << file;
  if (loc.line)
    os << ":" << loc.line << ":" << loc.column;
  os << (warning ? ": warning: " : ": error: ") << message;
  return os.str();
}

SourceLoc DrafterSpec::locationOf(const std::string &key) const {
  std::string k = key;
  while (true) {
    auto it = locations.find(k);
    if (it != locations.end())
      return it->second;
    size_t dot = k.rfind('.');
    if (dot == std::string::npos)
      return SourceLoc{};
    k = k.substr(0, dot);
  }
}

std::vector<int64_t> dflash::defaultTargetLayerIds(int64_t numTarget,
                                                   int64_t numDraft) {
  if (numDraft == 1)
    return {numTarget / 2};
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < numDraft; ++i) {
    // Exact rational 1 + i*(n-4)/(k-1), rounded half to even.
    int64_t num = (numDraft - 1) + i * (numTarget - 4);
    int64_t den = numDraft - 1;
    int64_t q = num / den, r = num % den;
    if (2 * r > den || (2 * r == den && (q % 2) == 1))
      ++q;
    ids.push_back(q);
  }
  return ids;
}

std::optional<double> dflash::defaultGamma(int64_t blockSize) {
  switch (blockSize) {
  case 16:
    return 7.0;
  case 10:
    return 5.0;
  case 8:
    return 4.0;
  default:
    return std::nullopt;
  }
}

namespace {

SourceLoc toLoc(const toml::source_region &r) {
  return SourceLoc{r.begin.line, r.begin.column};
}

const char *typeName(toml::node_type t) {
  switch (t) {
  case toml::node_type::table:
    return "a table";
  case toml::node_type::array:
    return "an array";
  case toml::node_type::string:
    return "a string";
  case toml::node_type::integer:
    return "an integer";
  case toml::node_type::floating_point:
    return "a float";
  case toml::node_type::boolean:
    return "a boolean";
  default:
    return "a date or time";
  }
}

size_t editDistance(const std::string &a, const std::string &b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min(
          {row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

/// Walks the parsed TOML in schema order. Every `read*` returns false after
/// recording the first error; callers stop at the first false.
class SpecReader {
public:
  SpecReader(const toml::table &root, DrafterSpec &spec, SpecError &error)
      : root(root), spec(spec), error(error) {}

  bool run();

private:
  const toml::table &root;
  DrafterSpec &spec;
  SpecError &error;
  /// The table being read and its dotted prefix ("drafter.").
  const toml::table *table = nullptr;
  std::string prefix;
  SourceLoc tableLoc;
  std::set<std::string> known;
  /// The first required key found missing in the current table; reported by
  /// leave() after unknown keys, since a misspelt key shows up as both.
  std::optional<SpecError> missing;

  bool fail(SourceLoc loc, const std::string &msg) {
    error.file = spec.file;
    error.loc = loc;
    error.message = msg;
    return false;
  }
  bool failAt(const std::string &key, const std::string &msg) {
    return fail(spec.locationOf(key), msg);
  }

  /// Enters table `name`, a dotted path for a sub-table (optional tables
  /// may be absent).
  bool enter(const std::string &name, bool required);
  /// Rejects keys of the current table that the schema does not know, then
  /// required keys that are missing. Rules that relate keys run after it.
  bool leave();

  const toml::node *get(const std::string &key, bool required);
  bool readInt(const std::string &key, int64_t &out, bool required,
               int64_t minValue, int64_t maxValue = (int64_t(1) << 40));
  bool readFloat(const std::string &key, double &out, bool required,
                 bool positive, bool allowZero = false);
  bool readBool(const std::string &key, bool &out);
  bool readString(const std::string &key, std::string &out, bool required);
  bool readIntArray(const std::string &key, std::vector<int64_t> &out,
                    bool &present);

  bool readTarget();
  bool readDrafter();
  bool readRopeScaling();
  /// [drafter.dflash2]: a DFlash2 drafter's shapes and unary transform.
  bool readDFlash2();
  bool readAttention();
  bool readTraining();
  /// [training.dflash2]: the selector's loss term, for a DFlash2 drafter.
  bool readTrainingDFlash2();
  /// training.position_buckets: the default edges, or the given ones
  /// checked (docs/spec.md) and cut to those below seq_len.
  bool resolvePositionBuckets(bool given);
  bool readOptimizer();
  bool readParallel();
  bool readMemory();
  bool checkCrossRules();
};

bool SpecReader::enter(const std::string &name, bool required) {
  known.clear();
  missing.reset();
  prefix = name.empty() ? "" : name + ".";
  if (name.empty()) {
    table = &root;
    tableLoc = toLoc(root.source());
    return true;
  }
  // A sub-table ("drafter.rope_scaling") by its path.
  const toml::node *node = root.at_path(name).node();
  if (!node) {
    if (required)
      return fail(SourceLoc{1, 1}, "missing table [" + name + "]");
    table = nullptr;
    return true;
  }
  if (!node->is_table())
    return fail(toLoc(node->source()), "'" + name + "' must be a table, not " +
                                           typeName(node->type()));
  table = node->as_table();
  tableLoc = toLoc(table->source());
  spec.locations[name] = tableLoc;
  return true;
}

bool SpecReader::leave() {
  if (!table)
    return true;
  for (auto &&[key, node] : *table) {
    std::string k(key.str());
    if (!known.count(k)) {
      // At the top level, sub-tables are read separately.
      if (prefix.empty() &&
          (k == "target" || k == "drafter" || k == "attention" ||
           k == "training" || k == "optimizer" || k == "parallel" ||
           k == "memory"))
        continue;
      std::string where =
          prefix.empty() ? "at the top level"
                         : "in [" + prefix.substr(0, prefix.size() - 1) + "]";
      std::string hint = " (see docs/spec.md)";
      for (const std::string &candidate : known)
        if (editDistance(k, candidate) <= 2)
          hint = "; did you mean '" + candidate + "'?";
      return fail(toLoc(key.source()),
                  "unknown key '" + prefix + k + "' " + where + hint);
    }
  }
  if (missing) {
    error = *missing;
    return false;
  }
  return true;
}

const toml::node *SpecReader::get(const std::string &key, bool required) {
  known.insert(key);
  const toml::node *node = table ? table->get(key) : nullptr;
  if (!node) {
    if (required && !missing) {
      std::string msg =
          table ? "missing required key '" + prefix + key + "'"
                : "missing table [" + prefix.substr(0, prefix.size() - 1) +
                      "] with required key '" + prefix + key + "'";
      missing = SpecError{spec.file, table ? tableLoc : SourceLoc{1, 1}, msg};
    }
    return nullptr;
  }
  spec.locations[prefix + key] = toLoc(node->source());
  return node;
}

bool SpecReader::readInt(const std::string &key, int64_t &out, bool required,
                         int64_t minValue, int64_t maxValue) {
  const toml::node *node = get(key, required);
  if (!node)
    return true;
  if (!node->is_integer())
    return fail(toLoc(node->source()), "'" + prefix + key +
                                           "' must be an integer, not " +
                                           typeName(node->type()));
  int64_t v = node->as_integer()->get();
  if (v < minValue)
    return fail(toLoc(node->source()),
                "'" + prefix + key + "' is " + std::to_string(v) +
                    "; it must be at least " + std::to_string(minValue));
  if (v > maxValue)
    return fail(toLoc(node->source()),
                "'" + prefix + key + "' is " + std::to_string(v) +
                    "; it must be at most " + std::to_string(maxValue));
  out = v;
  return true;
}

bool SpecReader::readFloat(const std::string &key, double &out, bool required,
                           bool positive, bool allowZero) {
  const toml::node *node = get(key, required);
  if (!node)
    return true;
  double v;
  if (node->is_floating_point())
    v = node->as_floating_point()->get();
  else if (node->is_integer())
    v = double(node->as_integer()->get());
  else
    return fail(toLoc(node->source()), "'" + prefix + key +
                                           "' must be a number, not " +
                                           typeName(node->type()));
  if (!std::isfinite(v))
    return fail(toLoc(node->source()),
                "'" + prefix + key + "' must be a finite number");
  if (positive && !(v > 0 || (allowZero && v == 0)))
    return fail(toLoc(node->source()),
                "'" + prefix + key + "' must be " +
                    (allowZero ? "zero or positive" : "positive"));
  out = v;
  return true;
}

bool SpecReader::readBool(const std::string &key, bool &out) {
  const toml::node *node = get(key, false);
  if (!node)
    return true;
  if (!node->is_boolean())
    return fail(toLoc(node->source()), "'" + prefix + key +
                                           "' must be a boolean, not " +
                                           typeName(node->type()));
  out = node->as_boolean()->get();
  return true;
}

bool SpecReader::readString(const std::string &key, std::string &out,
                            bool required) {
  const toml::node *node = get(key, required);
  if (!node)
    return true;
  if (!node->is_string())
    return fail(toLoc(node->source()), "'" + prefix + key +
                                           "' must be a string, not " +
                                           typeName(node->type()));
  out = node->as_string()->get();
  return true;
}

bool SpecReader::readIntArray(const std::string &key, std::vector<int64_t> &out,
                              bool &present) {
  const toml::node *node = get(key, false);
  present = node != nullptr;
  if (!node)
    return true;
  if (!node->is_array())
    return fail(toLoc(node->source()),
                "'" + prefix + key + "' must be an array of integers, not " +
                    typeName(node->type()));
  out.clear();
  size_t i = 0;
  for (const toml::node &elem : *node->as_array()) {
    std::string ek = prefix + key + "." + std::to_string(i++);
    spec.locations[ek] = toLoc(elem.source());
    if (!elem.is_integer())
      return fail(toLoc(elem.source()), "'" + ek +
                                            "' must be an integer, not " +
                                            typeName(elem.type()));
    out.push_back(elem.as_integer()->get());
  }
  return true;
}

bool SpecReader::readTarget() {
  if (!enter("target", true))
    return false;
  bool present = false;
  if (!readString("model", spec.targetModel, false) ||
      !readString("path", spec.targetPath, false) ||
      !readInt("num_layers", spec.targetNumLayers, true, 1, 100000) ||
      !readInt("hidden_size", spec.targetHiddenSize, true, 1, 1 << 20) ||
      !readInt("vocab_size", spec.vocabSize, true, 2, 1 << 24) ||
      !readIntArray("layer_ids", spec.targetLayerIds, present) ||
      !readBool("tie_word_embeddings", spec.tieWordEmbeddings))
    return false;
  if (!leave())
    return false;
  spec.targetLayerIdsDefaulted = !present;
  if (present && spec.targetLayerIds.empty())
    return failAt("target.layer_ids",
                  "'target.layer_ids' must name at least one layer");
  for (size_t i = 0; i < spec.targetLayerIds.size(); ++i) {
    std::string ek = "target.layer_ids." + std::to_string(i);
    int64_t id = spec.targetLayerIds[i];
    if (id < 0 || id >= spec.targetNumLayers)
      return failAt(ek, "'" + ek + "' is " + std::to_string(id) +
                            ", outside the target's layers 0.." +
                            std::to_string(spec.targetNumLayers - 1));
    if (i > 0 && id <= spec.targetLayerIds[i - 1])
      return failAt(ek, "'target.layer_ids' must be strictly ascending, but "
                        "entry " +
                            std::to_string(i) + " (" + std::to_string(id) +
                            ") follows " +
                            std::to_string(spec.targetLayerIds[i - 1]));
  }
  return true;
}

bool SpecReader::readDrafter() {
  if (!enter("drafter", true))
    return false;
  spec.hiddenSize = spec.targetHiddenSize;
  if (!readInt("num_layers", spec.numLayers, true, 1, 1024) ||
      !readInt("hidden_size", spec.hiddenSize, false, 1, 1 << 20) ||
      !readInt("intermediate_size", spec.intermediateSize, true, 1, 1 << 22) ||
      !readInt("num_heads", spec.numHeads, true, 1, 1024) ||
      !readInt("num_kv_heads", spec.numKvHeads, true, 1, 1024) ||
      !readInt("head_dim", spec.headDim, true, 2, 1024) ||
      !readFloat("rms_norm_eps", spec.rmsNormEps, false, true) ||
      !readFloat("rope_theta", spec.ropeTheta, false, true) ||
      !readInt("block_size", spec.blockSize, true, 2, 1024) ||
      !readInt("mask_token_id", spec.maskTokenId, true, 0, 1 << 24) ||
      !readInt("max_position_embeddings", spec.maxPositionEmbeddings, false, 1,
               int64_t(1) << 31))
    return false;
  // Tables of their own, read last.
  get("rope_scaling", false);
  get("dflash2", false);
  if (!leave())
    return false;
  if (spec.hiddenSize != spec.targetHiddenSize)
    return failAt("drafter.hidden_size",
                  "'drafter.hidden_size' (" + std::to_string(spec.hiddenSize) +
                      ") must equal 'target.hidden_size' (" +
                      std::to_string(spec.targetHiddenSize) +
                      "): the drafter shares the target's embedding");
  if (spec.hiddenSize % spec.numHeads != 0)
    return failAt("drafter.num_heads",
                  "'drafter.hidden_size' (" + std::to_string(spec.hiddenSize) +
                      ") is not divisible by 'drafter.num_heads' (" +
                      std::to_string(spec.numHeads) + ")");
  if (spec.numHeads % spec.numKvHeads != 0)
    return failAt("drafter.num_kv_heads",
                  "'drafter.num_heads' (" + std::to_string(spec.numHeads) +
                      ") is not divisible by 'drafter.num_kv_heads' (" +
                      std::to_string(spec.numKvHeads) + ")");
  if (spec.headDim % 2 != 0)
    return failAt("drafter.head_dim", "'drafter.head_dim' (" +
                                          std::to_string(spec.headDim) +
                                          ") must be even for rotary "
                                          "embeddings");
  if (spec.maskTokenId >= spec.vocabSize)
    return failAt("drafter.mask_token_id",
                  "'drafter.mask_token_id' (" +
                      std::to_string(spec.maskTokenId) +
                      ") is outside the vocabulary of 'target.vocab_size' (" +
                      std::to_string(spec.vocabSize) + ")");
  return readRopeScaling() && readDFlash2();
}

/// [drafter.rope_scaling]: transformers' rope_scaling keys for YaRN, with
/// its defaults (beta_fast 32, beta_slow 1, truncate true, attention factor
/// 0.1 ln(factor) + 1).
bool SpecReader::readRopeScaling() {
  if (!enter("drafter.rope_scaling", false))
    return false;
  if (!table)
    return true;
  std::string type;
  double attentionFactor = 0;
  if (!readString("rope_type", type, true) ||
      !readFloat("factor", spec.ropeScalingFactor, true, false) ||
      !readInt("original_max_position_embeddings",
               spec.ropeScalingOriginalMaxPositions, true, 1,
               int64_t(1) << 31) ||
      !readFloat("beta_fast", spec.ropeScalingBetaFast, false, true) ||
      !readFloat("beta_slow", spec.ropeScalingBetaSlow, false, true) ||
      !readBool("truncate", spec.ropeScalingTruncate) ||
      !readFloat("attention_factor", attentionFactor, false, true) || !leave())
    return false;
  if (type != "yarn")
    return failAt(prefix + "rope_type",
                  "'" + prefix + "rope_type' is \"" + type +
                      "\"; only YaRN (\"yarn\") is supported");
  if (!(spec.ropeScalingFactor > 1)) {
    std::ostringstream os;
    os << "'" << prefix << "factor' is " << spec.ropeScalingFactor
       << "; YaRN's factor must be above 1";
    return failAt(prefix + "factor", os.str());
  }
  if (spec.ropeScalingOriginalMaxPositions >= spec.maxPositionEmbeddings)
    return failAt(prefix + "original_max_position_embeddings",
                  "'" + prefix + "original_max_position_embeddings' (" +
                      std::to_string(spec.ropeScalingOriginalMaxPositions) +
                      ") must be below 'drafter.max_position_embeddings' (" +
                      std::to_string(spec.maxPositionEmbeddings) +
                      "): the context YaRN extends is the shorter one");
  if (spec.ropeScalingBetaFast < spec.ropeScalingBetaSlow)
    return failAt(prefix + "beta_fast", "'" + prefix +
                                            "beta_fast' must be at least '" +
                                            prefix + "beta_slow'");
  spec.ropeScalingAttentionFactor =
      attentionFactor > 0 ? attentionFactor
                          : 0.1 * std::log(spec.ropeScalingFactor) + 1.0;
  return true;
}

/// [drafter.dflash2] (docs/semantics.md section 13): present, even empty,
/// makes a DFlash2 drafter; the shapes default to the published drafters'.
bool SpecReader::readDFlash2() {
  if (!enter("drafter.dflash2", false))
    return false;
  if (!table)
    return true;
  spec.dflash2 = true;
  if (!readInt("conv_kernel_size", spec.convKernelSize, false, 1, 1 << 10) ||
      !readInt("conv_group_size", spec.convGroupSize, false, 1, 1 << 20) ||
      !readInt("selector_rank", spec.selectorRank, false, 1, 1 << 16) ||
      !readInt("selector_top_k", spec.selectorTopK, false, 1, 1 << 24) ||
      !readFloat("output_multiplier", spec.outputMultiplier, false, true) ||
      !readFloat("final_logit_softcapping", spec.finalLogitSoftcapping, false,
                 true) ||
      !readFloat("input_embedding_scale", spec.inputEmbeddingScale, false,
                 true) ||
      !leave())
    return false;
  const std::string kc = prefix + "conv_kernel_size";
  if (spec.convKernelSize > kMaxConvKernelSize)
    return failAt(kc, "'" + kc + "' is " + std::to_string(spec.convKernelSize) +
                          "; the DFlash2 convolution kernels take at most " +
                          std::to_string(kMaxConvKernelSize) + " taps");
  if (spec.convKernelSize > spec.blockSize)
    return failAt(kc, "'" + kc + "' (" + std::to_string(spec.convKernelSize) +
                          ") is above 'drafter.block_size' (" +
                          std::to_string(spec.blockSize) +
                          "): the convolution stays inside one block, so "
                          "taps past it see nothing");
  const std::string gs = prefix + "conv_group_size";
  if (spec.hiddenSize % spec.convGroupSize != 0)
    return failAt(gs, "'" + gs + "' (" + std::to_string(spec.convGroupSize) +
                          ") does not divide 'drafter.hidden_size' (" +
                          std::to_string(spec.hiddenSize) +
                          "): the channels form hidden_size / " +
                          "conv_group_size groups");
  const std::string k = prefix + "selector_top_k";
  if (spec.selectorTopK > spec.vocabSize)
    return failAt(k, "'" + k + "' (" + std::to_string(spec.selectorTopK) +
                         ") is above 'target.vocab_size' (" +
                         std::to_string(spec.vocabSize) +
                         "): the selector re-ranks the top K tokens");
  if (spec.selectorTopK > kMaxSelectorTopK)
    return failAt(k, "'" + k + "' is " + std::to_string(spec.selectorTopK) +
                         "; the DFlash2 selector kernels take at most " +
                         std::to_string(kMaxSelectorTopK) + " candidates");
  return true;
}

bool SpecReader::readAttention() {
  if (!enter("attention", false))
    return false;
  // Whether each layer slides, then its window once the window is known.
  std::vector<bool> sliding(size_t(spec.numLayers), false);
  spec.layerWindows.assign(size_t(spec.numLayers), 0);
  if (!table)
    return true;
  std::string defaultKind = "full";
  if (!readString("default", defaultKind, false) ||
      !readInt("sliding_window", spec.slidingWindow, false,
               std::numeric_limits<int64_t>::min(), int64_t(1) << 31))
    return false;
  auto parseKind = [&](const std::string &s, const std::string &key,
                       bool &slides) {
    if (s == "full")
      slides = false;
    else if (s == "sliding")
      slides = true;
    else
      return failAt(key, "'" + key + "' is \"" + s +
                             "\"; it must be \"full\" or \"sliding\"");
    return true;
  };
  bool slidesByDefault = false;
  if (!parseKind(defaultKind, "attention.default", slidesByDefault))
    return false;
  sliding.assign(sliding.size(), slidesByDefault);

  const toml::node *layers = get("layers", false);
  if (!leave())
    return false;
  if (layers) {
    if (!layers->is_array())
      return fail(toLoc(layers->source()),
                  "'attention.layers' must be an array of \"full\" or "
                  "\"sliding\", not " +
                      std::string(typeName(layers->type())));
    const toml::array &arr = *layers->as_array();
    if (int64_t(arr.size()) != spec.numLayers)
      return fail(toLoc(layers->source()),
                  "'attention.layers' has " + std::to_string(arr.size()) +
                      " entries but 'drafter.num_layers' is " +
                      std::to_string(spec.numLayers));
    for (size_t i = 0; i < arr.size(); ++i) {
      std::string ek = "attention.layers." + std::to_string(i);
      spec.locations[ek] = toLoc(arr[i].source());
      if (!arr[i].is_string())
        return failAt(ek, "'" + ek + "' must be \"full\" or \"sliding\", not " +
                              typeName(arr[i].type()));
      bool slides = false;
      if (!parseKind(std::string(arr[i].as_string()->get()), ek, slides))
        return false;
      sliding[i] = slides;
    }
  }

  bool anySliding = false;
  for (bool slides : sliding)
    anySliding |= slides;
  bool windowGiven = spec.locations.count("attention.sliding_window");
  if (anySliding && !windowGiven)
    return failAt("attention", "a layer is \"sliding\" but "
                               "'attention.sliding_window' is not given");
  if (windowGiven && spec.slidingWindow <= 0)
    return failAt("attention.sliding_window",
                  "'attention.sliding_window' is " +
                      std::to_string(spec.slidingWindow) +
                      "; a window must be positive");
  if (windowGiven && !anySliding)
    return failAt("attention.sliding_window",
                  "'attention.sliding_window' is given but no layer is "
                  "\"sliding\"");
  for (size_t i = 0; i < sliding.size(); ++i)
    spec.layerWindows[i] = sliding[i] ? spec.slidingWindow : 0;
  return true;
}

bool SpecReader::readTraining() {
  if (!enter("training", false))
    return false;
  bool bucketsGiven = false;
  if (!readInt("seq_len", spec.seqLen, false, 2, 1 << 20) ||
      !readInt("anchors_per_row", spec.anchorsPerRow, false, 1, 1 << 20) ||
      !readInt("rows_per_gpu", spec.rowsPerGpu, false, 1, 1 << 16) ||
      !readInt("gradient_accumulation", spec.gradientAccumulation, false, 1,
               1 << 12) ||
      !readFloat("gamma", spec.gamma, false, true, /*allowZero=*/true) ||
      !readInt("seed", spec.seed, false, 0,
               std::numeric_limits<int64_t>::max()) ||
      !readFloat("init_std", spec.initStd, false, true) ||
      !readIntArray("position_buckets", spec.positionBuckets, bucketsGiven))
    return false;
  get("dflash2", false); // a table of its own, read last
  if (!leave())
    return false;
  spec.gammaDefaulted = !spec.locations.count("training.gamma");
  if (spec.gammaDefaulted) {
    // A silent 0 would train without the decay the paper tuned for the
    // block sizes it has one for.
    std::optional<double> gamma = defaultGamma(spec.blockSize);
    if (!gamma)
      return failAt("drafter.block_size",
                    "'drafter.block_size' is " +
                        std::to_string(spec.blockSize) +
                        ", which has no default loss decay (7 for 16, 5 for "
                        "10, 4 for 8): give 'training.gamma' (0 turns the "
                        "decay off)");
    spec.gamma = *gamma;
  }
  // Anchors are distinct positions in [0, S-2].
  if (spec.anchorsPerRow > spec.seqLen - 1)
    return failAt(
        "training.anchors_per_row",
        "'training.anchors_per_row' (" + std::to_string(spec.anchorsPerRow) +
            ") does not fit the sequence: at most seq_len - 1 = " +
            std::to_string(spec.seqLen - 1) + " distinct anchors exist");
  // A window past the context hides at most the first block_size - 3
  // positions from the last anchors' late slots: valid, but likely meant
  // for longer sequences than these.
  if (spec.slidingWindow > spec.seqLen)
    spec.warnings.push_back(SpecError{
        spec.file, spec.locationOf("attention.sliding_window"),
        "'attention.sliding_window' (" + std::to_string(spec.slidingWindow) +
            ") is longer than 'training.seq_len' (" +
            std::to_string(spec.seqLen) +
            "): at this length the window hides (almost) no context, so the "
            "sliding layers train like full ones" +
            (spec.dflash2 ? "" : " but for their causal blocks"),
        /*warning=*/true});
  if (spec.maxPositionEmbeddings < spec.seqLen + spec.blockSize)
    return failAt("drafter.max_position_embeddings",
                  "'drafter.max_position_embeddings' (" +
                      std::to_string(spec.maxPositionEmbeddings) +
                      ") is below seq_len + block_size (" +
                      std::to_string(spec.seqLen + spec.blockSize) + ")");
  return resolvePositionBuckets(bucketsGiven) && readTrainingDFlash2();
}

/// [training.dflash2] (docs/semantics.md section 13, "Loss"): SpecForge's
/// objective by default; selector_gold and selector_denominator reproduce
/// the other trainers'.
bool SpecReader::readTrainingDFlash2() {
  if (!enter("training.dflash2", false))
    return false;
  if (!table)
    return true;
  if (!spec.dflash2)
    return failAt("training.dflash2",
                  "[training.dflash2] sets the loss of a selector, but the "
                  "drafter has no selector: only a DFlash2 drafter (a "
                  "[drafter.dflash2] table) has one");
  std::string gold = "topk", denominator = "all";
  if (!readFloat("selector_alpha", spec.selectorAlpha, false, true, true) ||
      !readFloat("selector_warmup_ratio", spec.selectorWarmupRatio, false, true,
                 true) ||
      !readFloat("selector_ramp_ratio", spec.selectorRampRatio, false, true,
                 true) ||
      !readBool("selector_stop_gradient", spec.selectorStopGradient) ||
      !readString("selector_gold", gold, false) ||
      !readString("selector_denominator", denominator, false) || !leave())
    return false;
  const std::string warmup = prefix + "selector_warmup_ratio",
                    ramp = prefix + "selector_ramp_ratio";
  if (spec.selectorWarmupRatio >= 1)
    return failAt(warmup, "'" + warmup +
                              "' must be below 1: the selector would never "
                              "be trained");
  if (spec.selectorRampRatio > 1)
    return failAt(ramp, "'" + ramp + "' must be at most 1");
  if (spec.selectorWarmupRatio + spec.selectorRampRatio > 1)
    return failAt(ramp, "'" + warmup + "' + '" + ramp +
                            "' must be at most 1: the ramp would end after "
                            "the last step");
  const std::string goldKey = prefix + "selector_gold",
                    denominatorKey = prefix + "selector_denominator";
  if (gold != "topk" && gold != "inject")
    return failAt(goldKey, "'" + goldKey + "' is \"" + gold +
                               "\"; it must be \"topk\" or \"inject\"");
  if (denominator != "all" && denominator != "covered")
    return failAt(denominatorKey, "'" + denominatorKey + "' is \"" +
                                      denominator +
                                      "\"; it must be \"all\" or \"covered\"");
  spec.selectorGoldInject = gold == "inject";
  spec.selectorDenominatorCovered = denominator == "covered";
  if (spec.selectorGoldInject && spec.selectorDenominatorCovered)
    return failAt(denominatorKey,
                  "'" + denominatorKey + "' = \"covered\" contradicts '" +
                      goldKey +
                      "' = \"inject\": an injected label covers every "
                      "slot (cov = 1), so \"covered\" would divide by the "
                      "same sum as \"all\"; say \"all\"");
  // A selector weight of 0 trains no selector: valid (an ablation), but
  // then the options that shape its term do nothing.
  const std::string alpha = prefix + "selector_alpha";
  if (spec.selectorAlpha == 0 && table->size() > 1)
    spec.warnings.push_back(SpecError{
        spec.file, spec.locationOf(alpha),
        "'" + alpha +
            "' is 0, so the selector is never trained and the other keys of "
            "[training.dflash2] do nothing",
        /*warning=*/true});
  return true;
}

bool SpecReader::resolvePositionBuckets(bool given) {
  std::vector<int64_t> &edges = spec.positionBuckets;
  if (!given) {
    edges = defaultPositionBuckets(spec.seqLen);
    return true;
  }
  const std::string key = "training.position_buckets";
  if (int64_t(edges.size()) > kMaxPositionBuckets - 1)
    return failAt(key, "'" + key + "' has " + std::to_string(edges.size()) +
                           " edges; at most " +
                           std::to_string(kMaxPositionBuckets - 1) + " (" +
                           std::to_string(kMaxPositionBuckets) +
                           " buckets) are supported");
  for (size_t i = 0; i < edges.size(); ++i) {
    std::string ek = key + "." + std::to_string(i);
    if (edges[i] < 1)
      return failAt(ek, "'" + ek + "' is " + std::to_string(edges[i]) +
                            "; an edge must be positive");
    if (i > 0 && edges[i] <= edges[i - 1])
      return failAt(ek,
                    "'" + key + "' must be strictly increasing, but entry " +
                        std::to_string(i) + " (" + std::to_string(edges[i]) +
                        ") follows " + std::to_string(edges[i - 1]));
    if (edges[i] >= spec.maxPositionEmbeddings)
      return failAt(ek, "'" + ek + "' is " + std::to_string(edges[i]) +
                            "; it must be below "
                            "'drafter.max_position_embeddings' (" +
                            std::to_string(spec.maxPositionEmbeddings) + ")");
  }
  // No anchor of a row of seq_len tokens reaches an edge at or past it:
  // its buckets would always be empty.
  while (!edges.empty() && edges.back() >= spec.seqLen)
    edges.pop_back();
  return true;
}

bool SpecReader::readOptimizer() {
  if (!enter("optimizer", false))
    return false;
  if (!readFloat("lr", spec.lr, false, true) ||
      !readFloat("warmup_ratio", spec.warmupRatio, false, true, true) ||
      !readFloat("max_grad_norm", spec.maxGradNorm, false, true) ||
      !readFloat("weight_decay", spec.weightDecay, false, true, true) ||
      !readFloat("beta1", spec.beta1, false, true, true) ||
      !readFloat("beta2", spec.beta2, false, true, true) ||
      !readFloat("eps", spec.adamEps, false, true) ||
      !readInt("total_steps", spec.totalSteps, false, 1,
               std::numeric_limits<int32_t>::max()) ||
      !leave())
    return false;
  if (spec.warmupRatio >= 1)
    return failAt("optimizer.warmup_ratio",
                  "'optimizer.warmup_ratio' must be below 1");
  if (spec.beta1 >= 1)
    return failAt("optimizer.beta1", "'optimizer.beta1' must be below 1");
  if (spec.beta2 >= 1)
    return failAt("optimizer.beta2", "'optimizer.beta2' must be below 1");
  return true;
}

bool SpecReader::readParallel() {
  if (!enter("parallel", false))
    return false;
  if (!readInt("gpus_per_node", spec.gpusPerNode, false, 1, 1024) ||
      !readInt("nodes", spec.nodes, false, 1, 1 << 16) ||
      !readInt("bucket_mib", spec.bucketMiB, false, 1, 1 << 16) ||
      !readBool("shard_optimizer_state", spec.shardOptimizerState))
    return false;
  return leave();
}

bool SpecReader::readMemory() {
  if (!enter("memory", false))
    return false;
  if (!readFloat("gpu_memory_gib", spec.gpuMemoryGiB, false, true) ||
      !readBool("recompute_activations", spec.recomputeActivations) ||
      !readBool("recompute_mlp_products", spec.recomputeMlpProducts) ||
      !readBool("fuse_target_mlp", spec.fuseTargetMlp) || !leave())
    return false;
  if (spec.gpuMemoryGiB > kMaxGpuMemoryGiB) {
    std::ostringstream os;
    os << "'memory.gpu_memory_gib' is " << spec.gpuMemoryGiB
       << "; no GPU has more than " << kMaxGpuMemoryGiB
       << " GiB (the budget is in GiB: 80 for an 80 GB card)";
    return failAt("memory.gpu_memory_gib", os.str());
  }
  return true;
}

bool SpecReader::checkCrossRules() {
  if (spec.targetLayerIdsDefaulted) {
    spec.targetLayerIds =
        defaultTargetLayerIds(spec.targetNumLayers, spec.numLayers);
    for (size_t i = 0; i < spec.targetLayerIds.size(); ++i)
      if (spec.targetLayerIds[i] < 0 ||
          spec.targetLayerIds[i] >= spec.targetNumLayers ||
          (i > 0 && spec.targetLayerIds[i] <= spec.targetLayerIds[i - 1]))
        return failAt("target.num_layers",
                      "the default taps for " + std::to_string(spec.numLayers) +
                          " drafter layers over " +
                          std::to_string(spec.targetNumLayers) +
                          " target layers are not distinct layers of the "
                          "target; give 'target.layer_ids'");
  }
  return true;
}

bool SpecReader::run() {
  if (!enter("", true) || !readString("name", spec.name, true) || !leave())
    return false;
  return readTarget() && readDrafter() && readAttention() && readTraining() &&
         readOptimizer() && readParallel() && readMemory() && checkCrossRules();
}

} // namespace

std::optional<DrafterSpec> dflash::parseSpec(const std::string &text,
                                             const std::string &file,
                                             SpecError &error) {
  error = SpecError{};
  toml::parse_result parsed = toml::parse(text, file);
  if (!parsed) {
    const toml::parse_error &e = parsed.error();
    error.file = file;
    error.loc = toLoc(e.source());
    error.message = "invalid TOML: " + std::string(e.description());
    return std::nullopt;
  }
  DrafterSpec spec;
  spec.file = file;
  SpecReader reader(parsed.table(), spec, error);
  if (!reader.run())
    return std::nullopt;
  return spec;
}

std::optional<DrafterSpec> dflash::loadSpec(const std::string &path,
                                            SpecError &error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = SpecError{path, {}, "cannot open spec file"};
    return std::nullopt;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return parseSpec(ss.str(), path, error);
}

namespace {
/// The shortest decimal form that reads back as exactly `v`.
std::string fmtFloat(double v) {
  std::string s;
  for (int precision = 6; precision <= 17; ++precision) {
    std::ostringstream os;
    os.precision(precision);
    os << v;
    s = os.str();
    if (std::stod(s) == v)
      break;
  }
  // TOML floats need a '.' or an exponent.
  if (s.find_first_of(".eEn") == std::string::npos)
    s += ".0";
  return s;
}
std::string fmtIds(const std::vector<int64_t> &ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i)
    s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}
std::string quote(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}
} // namespace

std::string dflash::printCanonicalSpec(const DrafterSpec &s) {
  std::ostringstream os;
  os << "# canonical form of " << s.file << ", every default resolved\n";
  os << "name = " << quote(s.name) << "\n\n";
  os << "[target]\n";
  if (!s.targetModel.empty())
    os << "model = " << quote(s.targetModel) << "\n";
  if (!s.targetPath.empty())
    os << "path = " << quote(s.targetPath) << "\n";
  os << "num_layers = " << s.targetNumLayers << "\n";
  os << "hidden_size = " << s.targetHiddenSize << "\n";
  os << "vocab_size = " << s.vocabSize << "\n";
  os << "layer_ids = " << fmtIds(s.targetLayerIds)
     << (s.targetLayerIdsDefaulted ? "  # default: spread rule" : "") << "\n";
  os << "tie_word_embeddings = " << (s.tieWordEmbeddings ? "true" : "false")
     << "\n\n";
  os << "[drafter]\n";
  os << "num_layers = " << s.numLayers << "\n";
  os << "hidden_size = " << s.hiddenSize << "\n";
  os << "intermediate_size = " << s.intermediateSize << "\n";
  os << "num_heads = " << s.numHeads << "\n";
  os << "num_kv_heads = " << s.numKvHeads << "\n";
  os << "head_dim = " << s.headDim << "\n";
  os << "rms_norm_eps = " << fmtFloat(s.rmsNormEps) << "\n";
  os << "rope_theta = " << fmtFloat(s.ropeTheta) << "\n";
  os << "block_size = " << s.blockSize << "\n";
  os << "mask_token_id = " << s.maskTokenId << "\n";
  os << "max_position_embeddings = " << s.maxPositionEmbeddings << "\n\n";
  if (s.ropeScaled()) {
    os << "[drafter.rope_scaling]\n";
    os << "rope_type = \"yarn\"\n";
    os << "factor = " << fmtFloat(s.ropeScalingFactor) << "\n";
    os << "original_max_position_embeddings = "
       << s.ropeScalingOriginalMaxPositions << "\n";
    os << "beta_fast = " << fmtFloat(s.ropeScalingBetaFast) << "\n";
    os << "beta_slow = " << fmtFloat(s.ropeScalingBetaSlow) << "\n";
    os << "truncate = " << (s.ropeScalingTruncate ? "true" : "false") << "\n";
    os << "attention_factor = " << fmtFloat(s.ropeScalingAttentionFactor)
       << "\n\n";
  }
  if (s.dflash2) {
    os << "[drafter.dflash2]\n";
    os << "conv_kernel_size = " << s.convKernelSize << "\n";
    os << "conv_group_size = " << s.convGroupSize << "\n";
    os << "selector_rank = " << s.selectorRank << "\n";
    os << "selector_top_k = " << s.selectorTopK << "\n";
    os << "output_multiplier = " << fmtFloat(s.outputMultiplier) << "\n";
    if (s.finalLogitSoftcapping > 0)
      os << "final_logit_softcapping = " << fmtFloat(s.finalLogitSoftcapping)
         << "\n";
    else
      os << "# final_logit_softcapping: none\n";
    os << "input_embedding_scale = " << fmtFloat(s.inputEmbeddingScale)
       << "\n\n";
  }
  os << "[attention]\n";
  bool anySliding = false;
  os << "layers = [";
  for (size_t i = 0; i < s.layerWindows.size(); ++i) {
    bool sl = s.layerWindows[i] > 0;
    anySliding |= sl;
    os << (i ? ", " : "") << (sl ? "\"sliding\"" : "\"full\"");
  }
  os << "]"
     << (s.dflash2 ? "  # DFlash2: each layer bidirectional inside its block"
                   : "")
     << "\n";
  if (anySliding)
    os << "sliding_window = " << s.slidingWindow << "\n";
  os << "\n[training]\n";
  os << "seq_len = " << s.seqLen << "\n";
  os << "anchors_per_row = " << s.anchorsPerRow << "\n";
  os << "rows_per_gpu = " << s.rowsPerGpu << "\n";
  os << "gradient_accumulation = " << s.gradientAccumulation << "\n";
  os << "gamma = " << fmtFloat(s.gamma)
     << (s.gammaDefaulted ? "  # default for this block size" : "") << "\n";
  os << "seed = " << s.seed << "\n";
  os << "init_std = " << fmtFloat(s.initStd) << "\n";
  // Given edges at or past seq_len are left out: the same buckets.
  bool bucketsGiven = s.locations.count("training.position_buckets") != 0;
  if (bucketsGiven || !s.positionBuckets.empty())
    os << "position_buckets = " << fmtIds(s.positionBuckets)
       << (bucketsGiven ? "" : "  # default for this seq_len") << "\n";
  os << "\n";
  if (s.dflash2) {
    os << "[training.dflash2]\n";
    os << "selector_alpha = " << fmtFloat(s.selectorAlpha) << "\n";
    os << "selector_warmup_ratio = " << fmtFloat(s.selectorWarmupRatio) << "\n";
    os << "selector_ramp_ratio = " << fmtFloat(s.selectorRampRatio) << "\n";
    os << "selector_stop_gradient = "
       << (s.selectorStopGradient ? "true" : "false") << "\n";
    os << "selector_gold = "
       << (s.selectorGoldInject ? "\"inject\"" : "\"topk\"") << "\n";
    os << "selector_denominator = "
       << (s.selectorDenominatorCovered ? "\"covered\"" : "\"all\"") << "\n\n";
  }
  os << "[optimizer]\n";
  os << "lr = " << fmtFloat(s.lr) << "\n";
  os << "warmup_ratio = " << fmtFloat(s.warmupRatio) << "\n";
  os << "max_grad_norm = " << fmtFloat(s.maxGradNorm) << "\n";
  os << "weight_decay = " << fmtFloat(s.weightDecay) << "\n";
  os << "beta1 = " << fmtFloat(s.beta1) << "\n";
  os << "beta2 = " << fmtFloat(s.beta2) << "\n";
  os << "eps = " << fmtFloat(s.adamEps) << "\n";
  os << "total_steps = " << s.totalSteps << "\n\n";
  os << "[parallel]\n";
  os << "gpus_per_node = " << s.gpusPerNode << "\n";
  os << "nodes = " << s.nodes << "\n";
  os << "bucket_mib = " << s.bucketMiB << "\n";
  os << "shard_optimizer_state = " << (s.shardOptimizerState ? "true" : "false")
     << "\n";
  if (s.gpuMemoryGiB > 0 || s.recomputeActivations || s.recomputeMlpProducts ||
      s.fuseTargetMlp) {
    os << "\n[memory]\n";
    if (s.gpuMemoryGiB > 0)
      os << "gpu_memory_gib = " << fmtFloat(s.gpuMemoryGiB) << "\n";
    if (s.recomputeActivations)
      os << "recompute_activations = true\n";
    if (s.recomputeMlpProducts)
      os << "recompute_mlp_products = true\n";
    if (s.fuseTargetMlp)
      os << "fuse_target_mlp = true\n";
  }
  return os.str();
}
