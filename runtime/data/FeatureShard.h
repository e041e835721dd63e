//===- FeatureShard.h - Reading feature shards ------------------*- C++ -*-===//
//
// A feature shard is a safetensors file with `input_ids` [R, S] int32,
// `loss_mask` [R, S] uint8, `hidden_states` [R, S, L*H] bf16, optionally
// `anchors` [R, N] int32 and `keep` [R, N] uint8 (pinned anchors), and
// `__metadata__` naming `target`, `target_layer_ids` (a JSON list),
// `hidden_size` and `seq_len`. The reader validates every shard of a
// directory against the compiled ModelConfig before training starts and
// drops rows without an anchor candidate (fewer than 2 consecutive
// supervised tokens, docs/semantics.md section 2).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_FEATURESHARD_H
#define DFLASH_RUNTIME_FEATURESHARD_H

#include "runtime/data/RowSource.h"
#include "runtime/io/Safetensors.h"
#include "schema/ModelConfig.h"

#include <map>
#include <string>
#include <vector>

namespace dflash::rt {

/// The `__metadata__` of a shard written for `config`.
std::map<std::string, std::string>
featureShardMetadata(const ModelConfig &config);

/// What a reader needs of each shard: the target's features, or only the
/// token rows (an online target computes the features).
enum class ShardContents { Features, Tokens };

/// Checks one opened shard against `config`: metadata fields, tensor dtypes
/// and shapes, token ids inside the vocabulary, flags 0 or 1, pinned anchors
/// inside [0, S-2]. With ShardContents::Tokens, hidden_states may be absent
/// (it is checked where present). Sets `rows` to R.
Status validateFeatureShard(const SafetensorsFile &shard,
                            const ModelConfig &config, int64_t &rows,
                            ShardContents needs = ShardContents::Features);

class FeatureShardReader : public RowSource {
public:
  /// Opens `path`: a directory (every `*.safetensors` in it, sorted by name)
  /// or a single shard file. Every shard must validate, and either all or
  /// none have pinned anchors.
  /// With ShardContents::Tokens, token shards (no hidden_states) are read
  /// too, and readRow leaves hiddenStates as it is for them.
  Status open(const std::string &path, const ModelConfig &config,
              ShardContents needs = ShardContents::Features);

  int64_t numRows() const override { return int64_t(rowIndex.size()); }
  bool hasPinnedAnchors() const override { return pinned; }
  bool hasFeatures() const override {
    return shardsWithFeatures() == numShards();
  }
  Status readRow(int64_t index, const RowBuffers &out) const override;

  /// How many of the shards carry hidden_states (all of them unless opened
  /// with ShardContents::Tokens); counted once by open(), since the loader
  /// asks for every row it reads.
  int64_t shardsWithFeatures() const { return withFeatures; }
  int64_t numShards() const { return int64_t(shards.size()); }
  /// Rows dropped for having no anchor candidate.
  int64_t numDroppedRows() const { return dropped; }
  /// The shard files, in reading order.
  std::vector<std::string> files() const;
  /// "<file> row <r>" of kept row `index`, for messages.
  std::string describeRow(int64_t index) const override;

private:
  struct RowLocation {
    uint32_t shard;
    int64_t row;
  };
  ModelConfig config;
  std::vector<SafetensorsFile> shards;
  std::vector<RowLocation> rowIndex;
  int64_t dropped = 0;
  int64_t withFeatures = 0;
  bool pinned = false;
};

/// The token rows of one shard, as a target program reads them.
struct TokenRows {
  int64_t rows = 0, seqLen = 0;
  std::vector<int32_t> ids, positions; ///< [rows, seqLen]
};

/// Reads input_ids [R, S] I32 of `shard` and position_ids (arange(S) per row
/// where the shard has none, i.e. is not packed); S must be `seqLen` unless
/// that is 0. Errors name the file and tensor, and the row and token of an id
/// outside [0, vocab) or a negative position.
Status readTokenRows(const SafetensorsFile &shard, int64_t seqLen,
                     int64_t vocab, TokenRows &out);

/// Writes `tokens`' tensors and metadata as the feature shard `path`, with
/// hidden_states [R, S, width] (bf16 bits) added: `format` becomes
/// dflash-feature-shard and `target_dir` names the target the features
/// come from.
Status writeFeatureShard(const std::string &path, const SafetensorsFile &tokens,
                         const std::vector<uint16_t> &features, int64_t width,
                         const std::string &targetDir);

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_FEATURESHARD_H
