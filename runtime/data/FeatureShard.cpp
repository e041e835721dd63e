//===- FeatureShard.cpp - Reading feature shards --------------------------===//

#include "runtime/data/FeatureShard.h"

#include "runtime/data/AnchorSampler.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using json = nlohmann::json;
namespace fs = std::filesystem;

std::map<std::string, std::string>
dflash::rt::featureShardMetadata(const ModelConfig &config) {
  return {
      {"target", config.targetModel},
      {"target_layer_ids", shapeString(config.targetLayerIds)},
      {"hidden_size", std::to_string(config.targetHiddenSize)},
      {"seq_len", std::to_string(config.seqLen)},
  };
}

static Status metadataError(const SafetensorsFile &shard,
                            const std::string &what) {
  return Status::error(shard.path() + ": " + what);
}

static bool parseInteger(const std::string &text, int64_t &value) {
  const char *end = text.data() + text.size();
  auto result = std::from_chars(text.data(), end, value);
  return result.ec == std::errc() && result.ptr == end && !text.empty();
}

static Status checkMetadata(const SafetensorsFile &shard,
                            const ModelConfig &config) {
  const std::map<std::string, std::string> &meta = shard.metadata();
  auto field = [&](const char *key, const std::string *&value) {
    auto it = meta.find(key);
    value = it == meta.end() ? nullptr : &it->second;
    if (!value)
      return metadataError(shard, std::string("metadata has no '") + key + "'");
    return Status::success();
  };
  const std::string *value = nullptr;
  Status status = field("target", value);
  if (!status.ok())
    return status;
  if (*value != config.targetModel)
    return metadataError(shard, "metadata 'target' is '" + *value +
                                    "' but the spec needs '" +
                                    config.targetModel + "'");

  status = field("target_layer_ids", value);
  if (!status.ok())
    return status;
  json ids = json::parse(*value, nullptr, /*allow_exceptions=*/false);
  std::vector<int64_t> parsed;
  bool valid = !ids.is_discarded() && ids.is_array();
  if (valid)
    for (const json &id : ids) {
      if (!id.is_number_integer()) {
        valid = false;
        break;
      }
      parsed.push_back(id.get<int64_t>());
    }
  if (!valid)
    return metadataError(shard, "metadata 'target_layer_ids' ('" + *value +
                                    "') is not a json list of integers");
  if (parsed != config.targetLayerIds)
    return metadataError(
        shard, "metadata 'target_layer_ids' is " + shapeString(parsed) +
                   " but the spec needs " + shapeString(config.targetLayerIds));

  struct IntegerField {
    const char *key;
    int64_t expected;
  } integers[] = {{"hidden_size", config.targetHiddenSize},
                  {"seq_len", config.seqLen}};
  for (const IntegerField &integer : integers) {
    status = field(integer.key, value);
    if (!status.ok())
      return status;
    int64_t number = 0;
    if (!parseInteger(*value, number))
      return metadataError(shard, std::string("metadata '") + integer.key +
                                      "' ('" + *value + "') is not an integer");
    if (number != integer.expected)
      return metadataError(
          shard, std::string("metadata '") + integer.key + "' is " + *value +
                     " but the spec needs " + std::to_string(integer.expected));
  }
  return Status::success();
}

/// Checks that every byte of a flag tensor is 0 or 1.
static Status checkFlags(const SafetensorsFile &shard, const TensorView &view,
                         int64_t rowLength) {
  for (size_t i = 0; i < view.byteSize; ++i)
    if (view.data[i] > 1)
      return Status::error(
          shard.path() + ": tensor '" + view.name + "' has value " +
          std::to_string(view.data[i]) + " at row " +
          std::to_string(int64_t(i) / rowLength) + ", column " +
          std::to_string(int64_t(i) % rowLength) + " (flags are 0 or 1)");
  return Status::success();
}

Status dflash::rt::validateFeatureShard(const SafetensorsFile &shard,
                                        const ModelConfig &config,
                                        int64_t &rows, ShardContents needs) {
  Status status = checkMetadata(shard, config);
  if (!status.ok())
    return status;

  int64_t S = config.seqLen, N = config.anchorsPerRow;
  const TensorView *ids = shard.find("input_ids");
  if (!ids)
    return Status::error(shard.path() + ": has no tensor 'input_ids'");
  if (ids->shape.size() != 2)
    return Status::error(shard.path() + ": tensor 'input_ids' has shape " +
                         shapeString(ids->shape) +
                         " but the spec needs [rows, " + std::to_string(S) +
                         "]");
  int64_t R = ids->shape[0];
  const TensorView *mask = nullptr, *hidden = nullptr;
  status = shard.require("input_ids", DType::I32, {R, S}, ids);
  if (status.ok())
    status = shard.require("loss_mask", DType::U8, {R, S}, mask);
  if (status.ok() &&
      (needs == ShardContents::Features || shard.find("hidden_states")))
    status = shard.require("hidden_states", DType::BF16,
                           {R, S, config.contextWidth()}, hidden);
  if (!status.ok())
    return status;

  // Packed rows (docs/semantics.md section 9): 0 at each conversation's first
  // token and +1 after, so a restart to 0 is the only boundary.
  if (shard.find("position_ids")) {
    const TensorView *positions = nullptr;
    status = shard.require("position_ids", DType::I32, {R, S}, positions);
    if (!status.ok())
      return status;
    for (int64_t r = 0; r < R; ++r) {
      int32_t previous = -1;
      for (int64_t c = 0; c < S; ++c) {
        int32_t p;
        std::memcpy(&p, positions->data + (r * S + c) * 4, sizeof(p));
        if (p != 0 && p != previous + 1)
          return Status::error(
              shard.path() + ": tensor 'position_ids' " +
              (c == 0 ? "starts at " + std::to_string(p)
                      : "goes from " + std::to_string(previous) + " to " +
                            std::to_string(p)) +
              " at row " + std::to_string(r) + ", column " + std::to_string(c) +
              " (positions start at 0 and go up by 1 or restart at 0)");
        previous = p;
      }
    }
  }

  const TensorView *anchors = shard.find("anchors");
  const TensorView *keep = shard.find("keep");
  if (bool(anchors) != bool(keep))
    return Status::error(shard.path() + ": has tensor '" +
                         std::string(anchors ? "anchors" : "keep") +
                         "' without '" + (anchors ? "keep" : "anchors") + "'");
  if (anchors) {
    status = shard.require("anchors", DType::I32, {R, N}, anchors);
    if (status.ok())
      status = shard.require("keep", DType::U8, {R, N}, keep);
    if (!status.ok())
      return status;
  }

  for (int64_t i = 0; i < R * S; ++i) {
    int32_t id;
    std::memcpy(&id, ids->data + i * 4, sizeof(id));
    if (id < 0 || id >= config.vocabSize)
      return Status::error(shard.path() + ": tensor 'input_ids' has token " +
                           std::to_string(id) + " at row " +
                           std::to_string(i / S) + ", column " +
                           std::to_string(i % S) +
                           ", outside the vocabulary "
                           "of " +
                           std::to_string(config.vocabSize) + " tokens");
  }
  status = checkFlags(shard, *mask, S);
  if (status.ok() && keep)
    status = checkFlags(shard, *keep, N);
  if (!status.ok())
    return status;
  if (anchors) {
    for (int64_t r = 0; r < R; ++r) {
      int64_t previous = -1;
      for (int64_t n = 0; n < N; ++n) {
        if (!keep->data[r * N + n])
          continue;
        int32_t anchor;
        std::memcpy(&anchor, anchors->data + (r * N + n) * 4, sizeof(anchor));
        if (anchor < 0 || anchor > S - 2)
          return Status::error(shard.path() + ": tensor 'anchors' has " +
                               std::to_string(anchor) + " at row " +
                               std::to_string(r) + ", slot " +
                               std::to_string(n) + ", outside [0, " +
                               std::to_string(S - 2) + "]");
        if (anchor <= previous)
          return Status::error(shard.path() +
                               ": tensor 'anchors' is not "
                               "strictly ascending in row " +
                               std::to_string(r));
        previous = anchor;
      }
    }
  }
  rows = R;
  return Status::success();
}

Status FeatureShardReader::open(const std::string &path,
                                const ModelConfig &modelConfig,
                                ShardContents needs) {
  config = modelConfig;
  shards.clear();
  rowIndex.clear();
  dropped = 0;
  withFeatures = 0;
  pinned = false;
  Status status = validateModelConfig(config);
  if (!status.ok())
    return status;

  std::vector<std::string> paths;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (fs::directory_iterator it(path, ec), end; !ec && it != end;
         it.increment(ec))
      if (it->path().extension() == ".safetensors" && it->is_regular_file(ec))
        paths.push_back(it->path().string());
    if (ec)
      return Status::error(path + ": cannot list directory: " + ec.message());
    std::sort(paths.begin(), paths.end());
    if (paths.empty())
      return Status::error(path + ": has no *.safetensors shards");
  } else {
    paths.push_back(path);
  }

  int64_t S = config.seqLen;
  for (const std::string &shardPath : paths) {
    SafetensorsFile shard;
    status = shard.open(shardPath);
    int64_t rows = 0;
    if (status.ok())
      status = validateFeatureShard(shard, config, rows, needs);
    if (!status.ok())
      return status;
    bool hasAnchors = shard.find("anchors") != nullptr;
    if (shards.empty())
      pinned = hasAnchors;
    else if (hasAnchors != pinned)
      return Status::error(shardPath + ": " +
                           (hasAnchors
                                ? "has pinned anchors but '" +
                                      shards.front().path() + "' has none"
                                : "has no pinned anchors but '" +
                                      shards.front().path() + "' has"));
    const uint8_t *mask = shard.find("loss_mask")->data;
    const TensorView *positions = shard.find("position_ids");
    uint32_t shardIndex = uint32_t(shards.size());
    // A copy: a shard's tensors need not be 4-byte aligned.
    std::vector<int32_t> rowPositions(positions ? size_t(S) : 0);
    for (int64_t r = 0; r < rows; ++r) {
      if (positions)
        std::memcpy(rowPositions.data(), positions->data + r * S * 4,
                    size_t(S) * 4);
      if (countAnchorCandidates(
              mask + r * S, positions ? rowPositions.data() : nullptr, S) > 0)
        rowIndex.push_back({shardIndex, r});
      else
        ++dropped;
    }
    withFeatures += shard.find("hidden_states") ? 1 : 0;
    shards.push_back(std::move(shard));
  }
  if (rowIndex.empty())
    return Status::error(path + ": no usable row (every row has fewer than 2 "
                                "consecutive supervised tokens)");
  return Status::success();
}

Status FeatureShardReader::readRow(int64_t index, const RowBuffers &out) const {
  if (index < 0 || index >= numRows())
    return Status::error("feature shards: row " + std::to_string(index) +
                         " is outside [0, " + std::to_string(numRows()) + ")");
  const RowLocation &location = rowIndex[size_t(index)];
  const SafetensorsFile &shard = shards[location.shard];
  int64_t S = config.seqLen, N = config.anchorsPerRow,
          LH = config.contextWidth(), r = location.row;
  if (out.inputIds)
    std::memcpy(out.inputIds, shard.find("input_ids")->data + r * S * 4,
                size_t(S) * 4);
  if (out.lossMask)
    std::memcpy(out.lossMask, shard.find("loss_mask")->data + r * S, size_t(S));
  if (out.hiddenStates && shard.find("hidden_states"))
    std::memcpy(out.hiddenStates,
                shard.find("hidden_states")->data + r * S * LH * 2,
                size_t(S * LH) * 2);
  if (out.positionIds) {
    if (const TensorView *positions = shard.find("position_ids"))
      std::memcpy(out.positionIds, positions->data + r * S * 4, size_t(S) * 4);
    else
      std::iota(out.positionIds, out.positionIds + S, 0);
  }
  if (pinned && out.anchors)
    std::memcpy(out.anchors, shard.find("anchors")->data + r * N * 4,
                size_t(N) * 4);
  if (pinned && out.keep)
    std::memcpy(out.keep, shard.find("keep")->data + r * N, size_t(N));
  return Status::success();
}

std::vector<std::string> FeatureShardReader::files() const {
  std::vector<std::string> paths;
  for (const SafetensorsFile &shard : shards)
    paths.push_back(shard.path());
  return paths;
}

std::string FeatureShardReader::describeRow(int64_t index) const {
  if (index < 0 || index >= numRows())
    return "row " + std::to_string(index) + " (out of range)";
  const RowLocation &location = rowIndex[size_t(index)];
  return shards[location.shard].path() + " row " + std::to_string(location.row);
}

/// The I32 [R, S] tensor `name` of `shard` into `out`.
static Status readI32Rows(const SafetensorsFile &shard, const std::string &name,
                          int64_t seqLen, std::vector<int32_t> &out,
                          std::vector<int64_t> &shape) {
  const TensorView *view = shard.find(name);
  if (!view)
    return Status::error(shard.path() + ": has no tensor '" + name + "'");
  if (view->dtype != DType::I32 || view->shape.size() != 2 ||
      (seqLen > 0 && view->shape[1] != seqLen))
    return Status::error(
        shard.path() + ": tensor '" + name + "' must be I32 [rows, " +
        (seqLen > 0 ? std::to_string(seqLen) + "] (the compiled seq_len)"
                    : std::string("seq_len]")) +
        ", but is " + dtypeName(view->dtype) + " " + shapeString(view->shape));
  out.resize(size_t(view->numel()));
  std::memcpy(out.data(), view->data, out.size() * sizeof(int32_t));
  shape = view->shape;
  return Status::success();
}

Status dflash::rt::readTokenRows(const SafetensorsFile &shard, int64_t seqLen,
                                 int64_t vocab, TokenRows &out) {
  std::vector<int64_t> shape, positionShape;
  DFLASH_RETURN_IF_ERROR(
      readI32Rows(shard, "input_ids", seqLen, out.ids, shape));
  out.rows = shape[0];
  out.seqLen = shape[1];
  const int64_t S = out.seqLen;
  if (shard.find("position_ids")) {
    DFLASH_RETURN_IF_ERROR(
        readI32Rows(shard, "position_ids", S, out.positions, positionShape));
    if (positionShape != shape)
      return Status::error(shard.path() + ": position_ids " +
                           shapeString(positionShape) + " and input_ids " +
                           shapeString(shape) + " differ in shape");
  } else {
    out.positions.resize(out.ids.size());
    for (size_t i = 0; i < out.ids.size(); ++i)
      out.positions[i] = int32_t(int64_t(i) % S);
  }
  for (size_t i = 0; i < out.ids.size(); ++i) {
    const std::string where = " at row " + std::to_string(int64_t(i) / S) +
                              ", token " + std::to_string(int64_t(i) % S);
    if (out.ids[i] < 0 || out.ids[i] >= vocab)
      return Status::error(
          shard.path() + ": input_ids holds " + std::to_string(out.ids[i]) +
          where + ", outside the vocabulary of " + std::to_string(vocab));
    if (out.positions[i] < 0)
      return Status::error(shard.path() + ": position_ids holds " +
                           std::to_string(out.positions[i]) + where);
  }
  return Status::success();
}

Status dflash::rt::writeFeatureShard(const std::string &path,
                                     const SafetensorsFile &tokens,
                                     const std::vector<uint16_t> &features,
                                     int64_t width,
                                     const std::string &targetDir) {
  const TensorView *ids = tokens.find("input_ids");
  if (!ids || ids->shape.size() != 2 ||
      int64_t(features.size()) != ids->numel() * width)
    return Status::error(path + ": " + std::to_string(features.size()) +
                         " feature values do not fit the rows of " +
                         tokens.path());
  std::vector<TensorData> tensors;
  for (const TensorView &view : tokens.tensors())
    if (view.name != "hidden_states")
      tensors.push_back({view.name, view.dtype, view.shape, view.data});
  tensors.push_back({"hidden_states",
                     DType::BF16,
                     {ids->shape[0], ids->shape[1], width},
                     features.data()});
  std::map<std::string, std::string> metadata = tokens.metadata();
  if (!metadata.empty()) {
    metadata["format"] = "dflash-feature-shard";
    metadata["target_dir"] = targetDir;
  }
  return writeSafetensors(path, tensors, metadata);
}
