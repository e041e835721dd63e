//===- FeatureShardTest.cpp - Feature shard validation and rows -----------===//

#include "runtime/data/FeatureShard.h"
#include "test/unit/runtime/RuntimeTestSupport.h"
#include "tools/dflash-synth/SyntheticFiles.h"

#include <gtest/gtest.h>

#include <filesystem>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
namespace fs = std::filesystem;

namespace {

ModelConfig testConfig() {
  ModelConfig c = oneLayerDrafterConfig();
  c.targetNumLayers = 6;
  c.targetLayerIds = {1, 3};
  c.maxPositionEmbeddings = 256;
  c.seqLen = 16;
  return c;
}

/// A hand-made shard of R rows; tests edit its parts before writing.
struct Shard {
  ModelConfig config;
  int64_t R;
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  std::vector<uint16_t> hidden;
  std::vector<int32_t> anchors;
  std::vector<uint8_t> keep;
  /// position_ids [R, S]; empty: an unpacked shard (no such tensor).
  std::vector<int32_t> positions;
  std::map<std::string, std::string> metadata;
  std::vector<int64_t> hiddenShape;
  bool pinned = false;

  Shard(const ModelConfig &c, int64_t rows) : config(c), R(rows) {
    int64_t S = c.seqLen;
    ids.assign(size_t(R * S), 5);
    mask.assign(size_t(R * S), 0);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t t = 4; t < S; ++t)
        mask[size_t(r * S + t)] = 1;
    hidden.assign(size_t(R * S * c.contextWidth()), 0x3f80);
    anchors.assign(size_t(R * c.anchorsPerRow), 0);
    keep.assign(size_t(R * c.anchorsPerRow), 0);
    metadata = featureShardMetadata(c);
    hiddenShape = {R, S, c.contextWidth()};
  }

  Status write(const std::string &path) const {
    int64_t S = config.seqLen, N = config.anchorsPerRow;
    std::vector<TensorData> tensors = {
        {"input_ids", DType::I32, {R, S}, ids.data()},
        {"loss_mask", DType::U8, {R, S}, mask.data()},
        {"hidden_states", DType::BF16, hiddenShape, hidden.data()}};
    if (!positions.empty())
      tensors.push_back({"position_ids", DType::I32, {R, S}, positions.data()});
    if (pinned) {
      tensors.push_back({"anchors", DType::I32, {R, N}, anchors.data()});
      tensors.push_back({"keep", DType::U8, {R, N}, keep.data()});
    }
    return writeSafetensors(path, tensors, metadata);
  }
};

std::string openError(const std::string &path, const ModelConfig &config) {
  FeatureShardReader reader;
  Status status = reader.open(path, config);
  EXPECT_FALSE(status.ok());
  return status.message();
}

TEST(RuntimeFeatureShard, Metadata) {
  ModelConfig c = testConfig();
  auto metadata = featureShardMetadata(c);
  EXPECT_EQ(metadata.at("target"), "test/target");
  EXPECT_EQ(metadata.at("target_layer_ids"), "[1, 3]");
  EXPECT_EQ(metadata.at("hidden_size"), "16");
  EXPECT_EQ(metadata.at("seq_len"), "16");
}

TEST(RuntimeFeatureShard, ReadsRowsInFileOrder) {
  TempDir dir;
  ModelConfig c = testConfig();
  Shard a(c, 2), b(c, 3);
  a.ids[0] = 11;
  b.ids[size_t(2 * c.seqLen)] = 22;
  ASSERT_TRUE(b.write(dir / "shard-00001.safetensors").ok());
  ASSERT_TRUE(a.write(dir / "shard-00000.safetensors").ok());
  FeatureShardReader reader;
  Status status = reader.open(dir.path, c);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(reader.numRows(), 5);
  EXPECT_EQ(reader.numDroppedRows(), 0);
  EXPECT_FALSE(reader.hasPinnedAnchors());
  EXPECT_EQ(reader.files(),
            (std::vector<std::string>{dir / "shard-00000.safetensors",
                                      dir / "shard-00001.safetensors"}));
  std::vector<int32_t> ids(size_t(c.seqLen));
  std::vector<uint8_t> mask(size_t(c.seqLen));
  std::vector<uint16_t> hidden(size_t(c.seqLen * c.contextWidth()));
  RowBuffers out{ids.data(), mask.data(), hidden.data()};
  ASSERT_TRUE(reader.readRow(0, out).ok());
  EXPECT_EQ(ids[0], 11);
  EXPECT_EQ(mask[3], 0);
  EXPECT_EQ(mask[4], 1);
  EXPECT_EQ(hidden.back(), 0x3f80);
  ASSERT_TRUE(reader.readRow(4, out).ok());
  EXPECT_EQ(ids[0], 22);
  EXPECT_EQ(reader.describeRow(4), dir / "shard-00001.safetensors row 2");
  EXPECT_EQ(reader.readRow(5, out).message(),
            "feature shards: row 5 is outside [0, 5)");

  // A single file works too.
  ASSERT_TRUE(reader.open(dir / "shard-00001.safetensors", c).ok());
  EXPECT_EQ(reader.numRows(), 3);
}

TEST(RuntimeFeatureShard, DropsRowsWithoutCandidates) {
  TempDir dir;
  ModelConfig c = testConfig();
  Shard shard(c, 3);
  int64_t S = c.seqLen;
  // Row 1: alternating supervised tokens, never two in a row.
  for (int64_t t = 0; t < S; ++t)
    shard.mask[size_t(S + t)] = t % 2;
  shard.ids[size_t(2 * S)] = 33;
  ASSERT_TRUE(shard.write(dir / "a.safetensors").ok());
  FeatureShardReader reader;
  ASSERT_TRUE(reader.open(dir.path, c).ok());
  EXPECT_EQ(reader.numRows(), 2);
  EXPECT_EQ(reader.numDroppedRows(), 1);
  std::vector<int32_t> ids(static_cast<size_t>(S));
  ASSERT_TRUE(reader.readRow(1, {ids.data(), nullptr, nullptr}).ok());
  EXPECT_EQ(ids[0], 33);

  // Nothing usable at all.
  std::fill(shard.mask.begin(), shard.mask.end(), 0);
  ASSERT_TRUE(shard.write(dir / "a.safetensors").ok());
  EXPECT_EQ(openError(dir.path, c),
            dir.path + ": no usable row (every row has fewer than 2 "
                       "consecutive supervised tokens)");
}

// docs/semantics.md section 9: position_ids are read as they are, an unpacked
// shard reads as arange(S), positions that neither go up by one nor restart
// at 0 are refused naming row and column, and a row whose only two
// consecutive supervised tokens straddle a conversation start has no anchor
// candidate.
TEST(RuntimeFeatureShard, PackedRows) {
  TempDir dir;
  ModelConfig c = testConfig();
  const int64_t S = c.seqLen;
  std::string path = dir / "shard.safetensors";
  std::vector<int32_t> positions(size_t(S), -1);
  RowBuffers out{};
  out.positionIds = positions.data();
  {
    ASSERT_TRUE(Shard(c, 2).write(path).ok());
    FeatureShardReader reader;
    ASSERT_TRUE(reader.open(dir.path, c).ok());
    ASSERT_TRUE(reader.readRow(1, out).ok());
    for (int64_t t = 0; t < S; ++t)
      EXPECT_EQ(positions[size_t(t)], t);
  }
  Shard packed(c, 3);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t t = 0; t < S; ++t) // conversations of 10 and 6 tokens
      packed.positions.push_back(int32_t(t < 10 ? t : t - 10));
  // Row 2: only tokens 9 and 10 supervised, across the restart.
  std::fill_n(packed.mask.begin() + 2 * S, S, uint8_t(0));
  packed.mask[size_t(2 * S + 9)] = packed.mask[size_t(2 * S + 10)] = 1;
  {
    ASSERT_TRUE(packed.write(path).ok());
    FeatureShardReader reader;
    Status status = reader.open(dir.path, c);
    ASSERT_TRUE(status.ok()) << status.message();
    EXPECT_EQ(reader.numRows(), 2);
    EXPECT_EQ(reader.numDroppedRows(), 1);
    ASSERT_TRUE(reader.readRow(1, out).ok());
    EXPECT_EQ(positions[9], 9);
    EXPECT_EQ(positions[10], 0);
    EXPECT_EQ(positions[size_t(S - 1)], S - 11);
  }
  packed.positions[size_t(S + 12)] = 5;
  ASSERT_TRUE(packed.write(path).ok());
  EXPECT_EQ(openError(dir.path, c),
            path + ": tensor 'position_ids' goes from 1 to 5 at row 1, column "
                   "12 (positions start at 0 and go up by 1 or restart at 0)");
  packed.positions[size_t(S + 12)] = 2;
  packed.positions[0] = 1;
  ASSERT_TRUE(packed.write(path).ok());
  EXPECT_EQ(openError(dir.path, c),
            path + ": tensor 'position_ids' starts at 1 at row 0, column 0 "
                   "(positions start at 0 and go up by 1 or restart at 0)");
}

TEST(RuntimeFeatureShard, MetadataMismatches) {
  TempDir dir;
  ModelConfig c = testConfig();
  std::string path = dir / "shard.safetensors";
  struct Case {
    const char *key, *value, *message;
  } cases[] = {
      {"target", "other/model",
       "metadata 'target' is 'other/model' but the spec needs 'test/target'"},
      {"target_layer_ids", "[1, 4]",
       "metadata 'target_layer_ids' is [1, 4] but the spec needs [1, 3]"},
      {"target_layer_ids", "1,3",
       "metadata 'target_layer_ids' ('1,3') is not a json list of integers"},
      {"hidden_size", "32",
       "metadata 'hidden_size' is 32 but the spec needs 16"},
      {"hidden_size", "16x",
       "metadata 'hidden_size' ('16x') is not an integer"},
      {"seq_len", "8", "metadata 'seq_len' is 8 but the spec needs 16"},
  };
  for (const Case &test : cases) {
    Shard shard(c, 1);
    shard.metadata[test.key] = test.value;
    ASSERT_TRUE(shard.write(path).ok());
    EXPECT_EQ(openError(dir.path, c), path + ": " + test.message);
  }
  Shard shard(c, 1);
  shard.metadata.erase("seq_len");
  ASSERT_TRUE(shard.write(path).ok());
  EXPECT_EQ(openError(dir.path, c), path + ": metadata has no 'seq_len'");
}

TEST(RuntimeFeatureShard, TensorMismatches) {
  TempDir dir;
  ModelConfig c = testConfig();
  std::string path = dir / "shard.safetensors";
  {
    Shard shard(c, 2);
    shard.hiddenShape = {2, 16, 16};
    shard.hidden.resize(2 * 16 * 16);
    ASSERT_TRUE(shard.write(path).ok());
    EXPECT_EQ(openError(dir.path, c),
              path + ": tensor 'hidden_states' has shape [2, 16, 16] but the "
                     "spec needs [2, 16, 32]");
  }
  {
    Shard shard(c, 2);
    shard.ids[7] = 64;
    ASSERT_TRUE(shard.write(path).ok());
    EXPECT_EQ(openError(dir.path, c),
              path + ": tensor 'input_ids' has token 64 at row 0, column 7, "
                     "outside the vocabulary of 64 tokens");
  }
  {
    Shard shard(c, 2);
    shard.mask[20] = 2;
    ASSERT_TRUE(shard.write(path).ok());
    EXPECT_EQ(openError(dir.path, c),
              path + ": tensor 'loss_mask' has value 2 at row 1, column 4 "
                     "(flags are 0 or 1)");
  }
  {
    ModelConfig longer = c;
    longer.seqLen = 32;
    Shard shard(c, 2);
    shard.metadata = featureShardMetadata(longer);
    ASSERT_TRUE(shard.write(path).ok());
    EXPECT_EQ(openError(dir.path, longer),
              path + ": tensor 'input_ids' has shape [2, 16] but the spec "
                     "needs [2, 32]");
  }
  EXPECT_EQ(openError(dir / "none", c),
            dir / "none" + ": cannot open: no such file or directory");
  fs::remove(path);
  EXPECT_EQ(openError(dir.path, c), dir.path + ": has no *.safetensors shards");
}

TEST(RuntimeFeatureShard, PinnedAnchors) {
  TempDir dir;
  ModelConfig c = testConfig();
  Shard shard(c, 2);
  shard.pinned = true;
  shard.anchors = {4, 9, 0, 5, 6, 7};
  shard.keep = {1, 1, 0, 1, 1, 1};
  ASSERT_TRUE(shard.write(dir / "a.safetensors").ok());
  FeatureShardReader reader;
  ASSERT_TRUE(reader.open(dir.path, c).ok());
  EXPECT_TRUE(reader.hasPinnedAnchors());
  std::vector<int32_t> ids(16), anchors(3);
  std::vector<uint8_t> keep(3);
  RowBuffers out{ids.data(), nullptr, nullptr, anchors.data(), keep.data()};
  ASSERT_TRUE(reader.readRow(1, out).ok());
  EXPECT_EQ(anchors, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(keep, (std::vector<uint8_t>{1, 1, 1}));

  // Every shard of a directory must agree.
  Shard plain(c, 1);
  ASSERT_TRUE(plain.write(dir / "b.safetensors").ok());
  EXPECT_EQ(openError(dir.path, c), dir / "b.safetensors" +
                                        ": has no pinned anchors but '" +
                                        dir / "a.safetensors" + "' has");
  fs::remove(dir / "b.safetensors");

  shard.anchors = {4, 15, 0, 5, 6, 7};
  ASSERT_TRUE(shard.write(dir / "a.safetensors").ok());
  EXPECT_EQ(openError(dir.path, c), dir / "a.safetensors" +
                                        ": tensor 'anchors' has 15 at row 0, "
                                        "slot 1, outside [0, 14]");
  shard.anchors = {9, 4, 0, 5, 6, 7};
  ASSERT_TRUE(shard.write(dir / "a.safetensors").ok());
  EXPECT_EQ(openError(dir.path, c), dir / "a.safetensors" +
                                        ": tensor 'anchors' is not strictly "
                                        "ascending in row 0");
  // anchors without keep.
  std::vector<int32_t> ids2(32, 1);
  std::vector<uint8_t> mask2(32, 1);
  std::vector<uint16_t> hidden2(size_t(32 * c.contextWidth()), 0);
  std::vector<int32_t> anchors2(6, 0);
  ASSERT_TRUE(
      writeSafetensors(dir / "a.safetensors",
                       {{"input_ids", DType::I32, {2, 16}, ids2.data()},
                        {"loss_mask", DType::U8, {2, 16}, mask2.data()},
                        {"hidden_states",
                         DType::BF16,
                         {2, 16, c.contextWidth()},
                         hidden2.data()},
                        {"anchors", DType::I32, {2, 3}, anchors2.data()}},
                       featureShardMetadata(c))
          .ok());
  EXPECT_EQ(openError(dir.path, c),
            dir / "a.safetensors" + ": has tensor 'anchors' without 'keep'");
}

TEST(RuntimeFeatureShard, SyntheticShardsMatchTheRowSource) {
  TempDir dir;
  ModelConfig c = testConfig();
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(c, 8).ok());
  std::vector<std::string> files;
  Status status =
      writeSyntheticShards(dir / "data", problem, 10, 4, true, &files);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(files.size(), 3u);
  FeatureShardReader reader;
  status = reader.open(dir / "data", c);
  ASSERT_TRUE(status.ok()) << status.message();
  ASSERT_EQ(reader.numRows(), 10);
  EXPECT_TRUE(reader.hasPinnedAnchors());

  SyntheticRowSource memory(problem, 10, true);
  expectSameRows(reader, memory, 10, c);
}

} // namespace
