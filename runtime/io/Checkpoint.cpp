//===- Checkpoint.cpp - Drafter checkpoints and resumable state -----------===//

#include "runtime/io/Checkpoint.h"
#include "schema/Parameters.h"

#include "kernels/Bf16.h"
#include "runtime/io/AtomicWrite.h"
#include "runtime/io/Safetensors.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

using namespace dflash;
using namespace dflash::rt;
namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

static const char *kStateFormat = "dflash-training-state";
static const char *kStateVersion = "1";

Status dflash::rt::checkpointConfigJson(const ModelConfig &c,
                                        std::string &text) {
  int64_t slidingWindow = 0;
  ordered_json layerTypes = ordered_json::array();
  for (int64_t window : c.layerWindows) {
    layerTypes.push_back(window > 0 ? "sliding_attention" : "full_attention");
    if (window <= 0)
      continue;
    if (slidingWindow != 0 && slidingWindow != window)
      return Status::error(
          c.name + ": sliding layers have different windows (" +
          std::to_string(slidingWindow) + " and " + std::to_string(window) +
          ") but config.json holds a single sliding_window");
    slidingWindow = window;
  }

  ordered_json config;
  config["architectures"] = {c.dflash2 ? "DFlash2DraftModel"
                                       : "DFlashDraftModel"};
  config["model_type"] = "qwen3";
  config["block_size"] = c.blockSize;
  config["dflash_config"] = {{"mask_token_id", c.maskTokenId},
                             {"target_layer_ids", c.targetLayerIds}};
  if (c.dflash2) {
    // docs/semantics.md section 13: the DFlash2 class reads its shapes from
    // dflash_config, and the unary transform's keys only where they are set.
    ordered_json &d = config["dflash_config"];
    d["block_size"] = c.blockSize;
    d["conv_kernel_size"] = c.convKernelSize;
    d["conv_group_size"] = c.convGroupSize;
    d["selector_rank"] = c.selectorRank;
    d["selector_top_k"] = c.selectorTopK;
    if (c.outputMultiplier != 1.0)
      d["output_multiplier"] = c.outputMultiplier;
    if (c.finalLogitSoftcapping > 0)
      d["final_logit_softcapping"] = c.finalLogitSoftcapping;
    if (c.inputEmbeddingScale != 1.0)
      d["input_embedding_scale"] = c.inputEmbeddingScale;
    config["is_causal"] = false;
  }
  config["num_target_layers"] = c.targetNumLayers;
  config["hidden_size"] = c.hiddenSize;
  config["intermediate_size"] = c.intermediateSize;
  config["num_hidden_layers"] = c.numLayers;
  config["num_attention_heads"] = c.numHeads;
  config["num_key_value_heads"] = c.numKvHeads;
  config["head_dim"] = c.headDim;
  config["rms_norm_eps"] = c.rmsNormEps;
  config["rope_theta"] = c.ropeTheta;
  if (c.ropeScaled()) {
    // transformers' rope_scaling (5 reads it into rope_parameters), the
    // optional keys only where they differ from its defaults.
    ordered_json yarn;
    yarn["rope_type"] = "yarn";
    yarn["factor"] = c.ropeScalingFactor;
    yarn["original_max_position_embeddings"] =
        c.ropeScalingOriginalMaxPositions;
    if (c.ropeScalingBetaFast != 32.0)
      yarn["beta_fast"] = c.ropeScalingBetaFast;
    if (c.ropeScalingBetaSlow != 1.0)
      yarn["beta_slow"] = c.ropeScalingBetaSlow;
    if (!c.ropeScalingTruncate)
      yarn["truncate"] = false;
    if (c.ropeScalingAttentionFactor !=
        0.1 * std::log(c.ropeScalingFactor) + 1.0)
      yarn["attention_factor"] = c.ropeScalingAttentionFactor;
    config["rope_scaling"] = yarn;
  }
  config["vocab_size"] = c.vocabSize;
  config["max_position_embeddings"] = c.maxPositionEmbeddings;
  config["hidden_act"] = "silu";
  config["attention_bias"] = false;
  config["attention_dropout"] = 0.0;
  config["initializer_range"] = c.initStd;
  config["tie_word_embeddings"] = false;
  config["torch_dtype"] = "bfloat16";
  config["dtype"] = "bfloat16";
  config["layer_types"] = layerTypes;
  // transformers' Qwen3Config drops sliding_window unless use_sliding_window.
  config["use_sliding_window"] = slidingWindow > 0;
  if (slidingWindow > 0)
    config["sliding_window"] = slidingWindow;
  text =
      config.dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
  return Status::success();
}

/// The files of an exported checkpoint, prepared before anything is written
/// so that bad input fails with the final directory's name.
struct ExportFiles {
  std::string configText;
  std::vector<TensorData> tensors;
};

static Status prepareExport(const std::string &dir, const ModelConfig &config,
                            const std::vector<const uint16_t *> &params,
                            ExportFiles &files) {
  std::vector<ParamInfo> table = parameterTable(config);
  if (params.size() != table.size())
    return Status::error(dir + ": got " + std::to_string(params.size()) +
                         " parameter buffers but the model has " +
                         std::to_string(table.size()) + " tensors");
  Status status = checkpointConfigJson(config, files.configText);
  if (!status.ok())
    return status;
  for (size_t i = 0; i < table.size(); ++i) {
    if (!params[i])
      return Status::error(dir + ": no buffer for tensor '" + table[i].name +
                           "'");
    files.tensors.push_back(
        {table[i].name, DType::BF16, table[i].shape, params[i]});
  }
  return Status::success();
}

/// Writes config.json and model.safetensors into an existing directory.
static Status writeExportFiles(const std::string &dir,
                               const ExportFiles &files) {
  Status status = writeFileAtomically(dir + "/config.json", files.configText);
  if (!status.ok())
    return status;
  return writeSafetensors(dir + "/model.safetensors", files.tensors,
                          {{"format", "pt"}});
}

Status dflash::rt::exportCheckpoint(
    const std::string &dir, const ModelConfig &config,
    const std::vector<const uint16_t *> &params,
    const std::vector<std::pair<std::string, std::string>> &extraFiles) {
  ExportFiles files;
  Status status = prepareExport(dir, config, params, files);
  if (!status.ok())
    return status;
  StagedDirectory staged;
  status = staged.begin(dir);
  if (status.ok())
    status = writeExportFiles(staged.path(), files);
  for (const auto &[name, text] : extraFiles)
    if (status.ok())
      status = writeFileAtomically(staged.path() + "/" + name, text);
  if (status.ok())
    status = staged.commit();
  return status;
}

//===----------------------------------------------------------------------===//
// Loading an exported checkpoint
//===----------------------------------------------------------------------===//

/// The entry at dotted `key` ("dflash_config.mask_token_id"), or null.
static const json *lookup(const json &root, const std::string &key) {
  const json *node = &root;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    std::string part = key.substr(start, dot - start);
    if (!node->is_object())
      return nullptr;
    auto it = node->find(part);
    if (it == node->end())
      return nullptr;
    node = &*it;
    if (dot == std::string::npos)
      return node;
    start = dot + 1;
  }
}

static Status checkConfigValue(const json &root, const std::string &path,
                               const std::string &key, const json &expected) {
  const json *entry = lookup(root, key);
  if (!entry)
    return Status::error(path + ": has no '" + key + "'");
  if (*entry != expected)
    return Status::error(
        path + ": '" + key + "' is " +
        entry->dump(-1, ' ', false, json::error_handler_t::replace) +
        " but the spec needs " +
        expected.dump(-1, ' ', false, json::error_handler_t::replace));
  return Status::success();
}

static Status checkCheckpointConfig(const std::string &dir,
                                    const ModelConfig &c) {
  std::string path = dir + "/config.json";
  std::string text;
  Status status = readTextFile(path, text);
  if (!status.ok())
    return status;
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object())
    return Status::error(path + ": not a json object");
  std::pair<const char *, json> expected[] = {
      {"hidden_size", c.hiddenSize},
      {"intermediate_size", c.intermediateSize},
      {"num_hidden_layers", c.numLayers},
      {"num_attention_heads", c.numHeads},
      {"num_key_value_heads", c.numKvHeads},
      {"head_dim", c.headDim},
      {"vocab_size", c.vocabSize},
      {"block_size", c.blockSize},
      {"dflash_config.mask_token_id", c.maskTokenId},
      {"dflash_config.target_layer_ids", c.targetLayerIds},
  };
  for (const auto &[key, value] : expected) {
    status = checkConfigValue(root, path, key, value);
    if (!status.ok())
      return status;
  }
  if (!c.dflash2)
    return Status::success();
  // A DFlash2 drafter's extra shapes: its tensors' shapes follow from them.
  std::pair<const char *, json> dflash2[] = {
      {"dflash_config.conv_kernel_size", c.convKernelSize},
      {"dflash_config.conv_group_size", c.convGroupSize},
      {"dflash_config.selector_rank", c.selectorRank},
      {"dflash_config.selector_top_k", c.selectorTopK},
  };
  for (const auto &[key, value] : dflash2) {
    status = checkConfigValue(root, path, key, value);
    if (!status.ok())
      return status;
  }
  return Status::success();
}

/// Checks that `file` holds exactly the tensors of `names` plus nothing else.
static Status checkNoExtraTensors(const SafetensorsFile &file,
                                  const std::set<std::string> &names) {
  for (const TensorView &view : file.tensors())
    if (!names.count(view.name))
      return Status::error(file.path() + ": has unexpected tensor '" +
                           view.name + "'");
  return Status::success();
}

Status dflash::rt::loadCheckpoint(const std::string &dir,
                                  const ModelConfig &config,
                                  std::vector<std::vector<uint16_t>> &params) {
  Status status = checkCheckpointConfig(dir, config);
  if (!status.ok())
    return status;
  SafetensorsFile file;
  status = file.open(dir + "/model.safetensors");
  if (!status.ok())
    return status;
  std::vector<ParamInfo> table = parameterTable(config);
  std::set<std::string> names;
  std::vector<std::vector<uint16_t>> loaded(table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    const ParamInfo &param = table[i];
    names.insert(param.name);
    const TensorView *view = file.find(param.name);
    if (!view)
      return Status::error(file.path() + ": has no tensor '" + param.name +
                           "'");
    if (view->shape != param.shape)
      return Status::error(file.path() + ": tensor '" + param.name +
                           "' has shape " + shapeString(view->shape) +
                           " but the spec needs " + shapeString(param.shape));
    std::vector<uint16_t> &values = loaded[i];
    values.resize(size_t(param.numel()));
    if (view->dtype == DType::BF16) {
      std::memcpy(values.data(), view->data, view->byteSize);
    } else if (view->dtype == DType::F32) {
      for (size_t k = 0; k < values.size(); ++k) {
        float value;
        std::memcpy(&value, view->data + k * sizeof(float), sizeof(float));
        values[k] = floatToBf16(value);
      }
    } else {
      return Status::error(file.path() + ": tensor '" + param.name +
                           "' has dtype " + dtypeName(view->dtype) +
                           " but the spec needs BF16");
    }
  }
  status = checkNoExtraTensors(file, names);
  if (!status.ok())
    return status;
  params = std::move(loaded);
  return Status::success();
}

//===----------------------------------------------------------------------===//
// Training state
//===----------------------------------------------------------------------===//

TrainingStateRef TrainingState::ref() const {
  TrainingStateRef state;
  state.step = step;
  state.rngState = rngState;
  state.otherRankRngStates = otherRankRngStates;
  state.data = data;
  state.badRows = badRows;
  for (const std::vector<float> &values : master)
    state.master.push_back(values.data());
  for (const std::vector<float> &values : adamM)
    state.adamM.push_back(values.data());
  for (const std::vector<float> &values : adamV)
    state.adamV.push_back(values.data());
  return state;
}

namespace {
/// The three fp32 buffers of each parameter, by tensor name prefix.
struct StateGroup {
  const char *prefix;
  std::vector<const float *> TrainingStateRef::*source;
  std::vector<std::vector<float>> TrainingState::*target;
};
const StateGroup kStateGroups[] = {
    {"master.", &TrainingStateRef::master, &TrainingState::master},
    {"adam_m.", &TrainingStateRef::adamM, &TrainingState::adamM},
    {"adam_v.", &TrainingStateRef::adamV, &TrainingState::adamV},
};
} // namespace

Status dflash::rt::writeTrainingCheckpointFiles(
    const std::string &dir, const std::string &checkpoint,
    const ModelConfig &config, const std::vector<const uint16_t *> &params,
    const TrainingStateRef &state) {
  std::vector<ParamInfo> table = parameterTable(config);
  std::vector<TensorData> tensors;
  for (const StateGroup &group : kStateGroups) {
    const std::vector<const float *> &buffers = state.*group.source;
    if (buffers.size() != table.size())
      return Status::error(
          checkpoint + ": got " + std::to_string(buffers.size()) + " '" +
          std::string(group.prefix, 6) + "' buffers but the model has " +
          std::to_string(table.size()) + " tensors");
    for (size_t i = 0; i < table.size(); ++i) {
      if (!buffers[i])
        return Status::error(checkpoint + ": no buffer for '" + group.prefix +
                             table[i].name + "'");
      tensors.push_back({group.prefix + table[i].name, DType::F32,
                         table[i].shape, buffers[i]});
    }
  }
  int64_t step = state.step;
  // Rank r's four words in row r; a one-GPU state keeps the [4] shape that
  // checkpoints had before data parallelism.
  std::vector<int64_t> rngWords;
  for (size_t r = 0; r <= state.otherRankRngStates.size(); ++r) {
    const RngState &words =
        r == 0 ? state.rngState : state.otherRankRngStates[r - 1];
    for (uint64_t word : words)
      rngWords.push_back(int64_t(word));
  }
  int64_t ranks = int64_t(state.otherRankRngStates.size()) + 1;
  std::vector<int64_t> rngShape =
      ranks == 1 ? std::vector<int64_t>{4} : std::vector<int64_t>{ranks, 4};
  int64_t position[2] = {state.data.epoch, state.data.row};
  tensors.push_back({"step", DType::I64, {1}, &step});
  tensors.push_back({"rng_state", DType::I64, rngShape, rngWords.data()});
  tensors.push_back({"data_position", DType::I64, {2}, position});
  tensors.push_back({"bad_rows",
                     DType::I64,
                     {int64_t(state.badRows.size())},
                     state.badRows.data()});
  std::map<std::string, std::string> metadata = {
      {"format", kStateFormat},
      {"version", kStateVersion},
      {"model", config.name},
      {"num_parameters", std::to_string(numParameters(config))},
  };

  ExportFiles files;
  Status status = prepareExport(checkpoint, config, params, files);
  if (!status.ok())
    return status;
  status = writeExportFiles(dir, files);
  if (!status.ok())
    return status;
  std::error_code ec;
  fs::create_directories(dir + "/" + kTrainingDir, ec);
  if (ec)
    return Status::error(dir + "/" + kTrainingDir +
                         ": cannot create directory: " + ec.message());
  return writeSafetensors(dir + "/" + kTrainingStateFile, tensors, metadata);
}

Status
dflash::rt::saveTrainingCheckpoint(const std::string &dir,
                                   const ModelConfig &config,
                                   const std::vector<const uint16_t *> &params,
                                   const TrainingStateRef &state) {
  StagedDirectory staged;
  Status status = staged.begin(dir);
  if (status.ok())
    status =
        writeTrainingCheckpointFiles(staged.path(), dir, config, params, state);
  if (status.ok())
    status = staged.commit();
  return status;
}

/// Copies a small I64 tensor of `count` elements.
static Status readInt64s(const SafetensorsFile &file, const std::string &name,
                         int64_t count, int64_t *out) {
  const TensorView *view = nullptr;
  Status status = file.require(name, DType::I64, {count}, view);
  if (status.ok())
    std::memcpy(out, view->data, size_t(count) * sizeof(int64_t));
  return status;
}

/// Tensor 'bad_rows': I64 [n], distinct non-negative source rows. A state
/// written before it existed has none.
static Status readBadRows(const SafetensorsFile &file,
                          std::vector<int64_t> &rows) {
  rows.clear();
  const TensorView *view = file.find("bad_rows");
  if (!view)
    return Status::success();
  if (view->dtype != DType::I64 || view->shape.size() != 1)
    return Status::error(file.path() + ": tensor 'bad_rows' has dtype " +
                         dtypeName(view->dtype) + " and shape " +
                         shapeString(view->shape) + " but must be I64 [n]");
  rows.resize(size_t(view->shape[0]));
  if (!rows.empty())
    std::memcpy(rows.data(), view->data, rows.size() * sizeof(int64_t));
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] < 0 || (i > 0 && rows[i] <= rows[i - 1]))
      return Status::error(file.path() + ": tensor 'bad_rows' entry " +
                           std::to_string(i) + " (" + std::to_string(rows[i]) +
                           ") is negative or not above the one before; the "
                           "rows must be distinct and ascending");
  return Status::success();
}

/// The anchor Rng states of tensor 'rng_state': [4] for one rank, [R, 4]
/// for R ranks; each one must be a state the generator can reach.
static Status readRngStates(const SafetensorsFile &file,
                            std::vector<RngState> &states) {
  const TensorView *view = file.find("rng_state");
  if (!view)
    return Status::error(file.path() + ": has no tensor 'rng_state'");
  const std::vector<int64_t> &shape = view->shape;
  bool oneRank = shape == std::vector<int64_t>{4};
  if (view->dtype != DType::I64 ||
      !(oneRank || (shape.size() == 2 && shape[0] >= 1 && shape[1] == 4)))
    return Status::error(file.path() + ": tensor 'rng_state' has dtype " +
                         dtypeName(view->dtype) + " and shape " +
                         shapeString(shape) +
                         " but must be I64 [4] or [ranks, 4]");
  size_t ranks = oneRank ? 1 : size_t(shape[0]);
  states.assign(ranks, RngState{});
  for (size_t r = 0; r < ranks; ++r) {
    std::memcpy(states[r].data(), view->data + r * 4 * sizeof(int64_t),
                4 * sizeof(int64_t));
    // The one state the anchor Rng (xoshiro256**) cannot leave, so no run
    // wrote it.
    const RngState &w = states[r];
    if ((w[0] | w[1] | w[2] | w[3]) == 0)
      return Status::error(file.path() + ": tensor 'rng_state'" +
                           (oneRank ? "" : " row " + std::to_string(r)) +
                           ": random generator state is all zero");
  }
  return Status::success();
}

Status dflash::rt::loadTrainingState(const std::string &dir,
                                     const ModelConfig &config,
                                     TrainingState &state) {
  SafetensorsFile file;
  Status status = file.open(dir + "/" + kTrainingStateFile);
  if (!status.ok())
    return status;
  auto format = file.metadata().find("format");
  if (format == file.metadata().end() || format->second != kStateFormat)
    return Status::error(file.path() + ": metadata 'format' is not '" +
                         kStateFormat + "'");
  auto version = file.metadata().find("version");
  if (version == file.metadata().end() || version->second != kStateVersion)
    return Status::error(file.path() + ": metadata 'version' is not '" +
                         kStateVersion + "'");

  TrainingState loaded;
  std::vector<ParamInfo> table = parameterTable(config);
  std::set<std::string> names = {"step", "rng_state", "data_position",
                                 "bad_rows"};
  for (const StateGroup &group : kStateGroups) {
    std::vector<std::vector<float>> &buffers = loaded.*group.target;
    buffers.resize(table.size());
    for (size_t i = 0; i < table.size(); ++i) {
      std::string name = group.prefix + table[i].name;
      names.insert(name);
      const TensorView *view = nullptr;
      status = file.require(name, DType::F32, table[i].shape, view);
      if (!status.ok())
        return status;
      buffers[i].resize(size_t(table[i].numel()));
      std::memcpy(buffers[i].data(), view->data, view->byteSize);
    }
  }
  status = checkNoExtraTensors(file, names);
  if (!status.ok())
    return status;

  int64_t step = 0, position[2];
  status = readInt64s(file, "step", 1, &step);
  if (status.ok())
    status = readInt64s(file, "data_position", 2, position);
  if (!status.ok())
    return status;
  std::vector<RngState> rngStates;
  DFLASH_RETURN_IF_ERROR(readRngStates(file, rngStates));
  if (step < 0)
    return Status::error(file.path() + ": tensor 'step' is negative (" +
                         std::to_string(step) + ")");
  if (position[0] < 0 || position[1] < 0)
    return Status::error(file.path() +
                         ": tensor 'data_position' has a negative entry");
  loaded.step = step;
  loaded.rngState = rngStates.front();
  loaded.otherRankRngStates.assign(rngStates.begin() + 1, rngStates.end());
  loaded.data = {position[0], position[1]};
  DFLASH_RETURN_IF_ERROR(readBadRows(file, loaded.badRows));
  state = std::move(loaded);
  return Status::success();
}
