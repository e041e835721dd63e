//===- SyntheticFiles.cpp - The synthetic problem as files ----------------===//

#include "tools/dflash-synth/SyntheticFiles.h"

#include "runtime/data/FeatureShard.h"
#include "runtime/io/AtomicWrite.h"
#include "runtime/io/Checkpoint.h"
#include "runtime/io/Safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>

using namespace dflash;
using namespace dflash::rt;

Status dflash::rt::writeSyntheticTarget(const std::string &dir,
                                        const SyntheticProblem &problem) {
  const ModelConfig &config = problem.config();
  const TargetWeights &target = problem.target();
  nlohmann::ordered_json targetConfig;
  targetConfig["architectures"] = {"DFlashSyntheticTarget"};
  targetConfig["model_type"] = "dflash_synthetic";
  targetConfig["name"] = config.targetModel;
  targetConfig["hidden_size"] = config.targetHiddenSize;
  targetConfig["vocab_size"] = config.vocabSize;
  targetConfig["num_hidden_layers"] = config.targetNumLayers;
  targetConfig["tie_word_embeddings"] = target.tied;
  targetConfig["torch_dtype"] = "bfloat16";
  targetConfig["synthetic_seed"] = problem.seed();
  std::string text =
      targetConfig.dump(2, ' ', false,
                        nlohmann::ordered_json::error_handler_t::replace) +
      "\n";

  std::vector<int64_t> shape{target.vocabSize, target.hiddenSize};
  std::vector<TensorData> tensors{
      {"model.embed_tokens.weight", DType::BF16, shape, target.embed.data()}};
  if (!target.tied)
    tensors.push_back(
        {"lm_head.weight", DType::BF16, shape, target.lmHead.data()});

  StagedDirectory staged;
  Status status = staged.begin(dir);
  if (status.ok())
    status = writeFileAtomically(staged.path() + "/config.json", text);
  if (status.ok())
    status = writeSafetensors(staged.path() + "/model.safetensors", tensors,
                              {{"format", "pt"}});
  if (status.ok())
    status = staged.commit();
  return status;
}

Status dflash::rt::writeSyntheticShards(const std::string &dir,
                                        const SyntheticProblem &problem,
                                        int64_t rows, int64_t rowsPerShard,
                                        bool pinAnchors,
                                        std::vector<std::string> *files) {
  if (rows <= 0)
    return Status::error(dir + ": the number of rows must be positive, not " +
                         std::to_string(rows));
  if (rowsPerShard <= 0)
    return Status::error(dir + ": the rows per shard must be positive, not " +
                         std::to_string(rowsPerShard));
  const ModelConfig &config = problem.config();
  int64_t S = config.seqLen, N = config.anchorsPerRow,
          LH = config.contextWidth();

  StagedDirectory staged;
  Status status = staged.begin(dir);
  if (!status.ok())
    return status;
  std::vector<std::string> written;
  for (int64_t first = 0, shard = 0; first < rows;
       first += rowsPerShard, ++shard) {
    int64_t R = std::min(rowsPerShard, rows - first);
    std::vector<int32_t> ids(size_t(R * S));
    std::vector<uint8_t> mask(size_t(R * S));
    std::vector<uint16_t> hidden(size_t(R * S * LH));
    std::vector<int32_t> anchors(pinAnchors ? size_t(R * N) : 0);
    std::vector<uint8_t> keep(pinAnchors ? size_t(R * N) : 0);
    for (int64_t r = 0; r < R; ++r) {
      problem.generateRow(first + r, ids.data() + r * S, mask.data() + r * S,
                          hidden.data() + r * S * LH);
      if (pinAnchors)
        problem.pinnedAnchors(first + r, mask.data() + r * S,
                              anchors.data() + r * N, keep.data() + r * N);
    }
    std::vector<TensorData> tensors{
        {"input_ids", DType::I32, {R, S}, ids.data()},
        {"loss_mask", DType::U8, {R, S}, mask.data()},
        {"hidden_states", DType::BF16, {R, S, LH}, hidden.data()}};
    if (pinAnchors) {
      tensors.push_back({"anchors", DType::I32, {R, N}, anchors.data()});
      tensors.push_back({"keep", DType::U8, {R, N}, keep.data()});
    }
    std::map<std::string, std::string> metadata = featureShardMetadata(config);
    metadata["generator"] = "dflash-synth";
    metadata["seed"] = std::to_string(problem.seed());
    metadata["first_row"] = std::to_string(first);

    char name[64];
    std::snprintf(name, sizeof(name), "shard-%05lld.safetensors",
                  (long long)shard);
    status = writeSafetensors(staged.path() + "/" + name, tensors, metadata);
    if (!status.ok())
      return status;
    written.push_back(dir + "/" + name);
  }
  status = staged.commit();
  if (status.ok() && files)
    files->insert(files->end(), written.begin(), written.end());
  return status;
}

Status dflash::rt::writeSyntheticInit(const std::string &dir,
                                      const SyntheticProblem &problem) {
  std::vector<std::vector<uint16_t>> params = problem.initialParameters();
  std::vector<const uint16_t *> pointers;
  for (const std::vector<uint16_t> &values : params)
    pointers.push_back(values.data());
  return exportCheckpoint(dir, problem.config(), pointers);
}
