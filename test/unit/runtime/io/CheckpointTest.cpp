//===- CheckpointTest.cpp - Parameters, checkpoints, target weights -------===//

#include "runtime/io/Checkpoint.h"
#include "compiler/Spec/Spec.h"
#include "kernels/Bf16.h"
#include "runtime/data/InitialParameters.h"
#include "runtime/data/Rng.h"
#include "runtime/io/AtomicWrite.h"
#include "runtime/io/Mxfp4.h"
#include "runtime/io/Safetensors.h"
#include "runtime/io/TargetWeights.h"
#include "schema/ModelConfig.h"
#include "schema/Parameters.h"
#include "test/unit/runtime/RuntimeTestSupport.h"
#include "tools/dflash-synth/SyntheticFiles.h"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::trainhost;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

ModelConfig testConfig() {
  ModelConfig c = twoLayerDrafterConfig();
  c.ropeTheta = 10000;
  c.gamma = 4;
  c.seed = 3;
  c.totalSteps = 100;
  return c;
}

std::vector<std::string> entriesOf(const std::string &dir) {
  std::vector<std::string> names;
  for (const auto &entry : fs::directory_iterator(dir))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<const uint16_t *>
pointers(const std::vector<std::vector<uint16_t>> &params) {
  std::vector<const uint16_t *> out;
  for (const auto &values : params)
    out.push_back(values.data());
  return out;
}

json readJson(const std::string &path) {
  std::ifstream in(path);
  return json::parse(in, nullptr, false);
}

//===----------------------------------------------------------------------===//
// Atomic files and directories
//===----------------------------------------------------------------------===//

TEST(RuntimeAtomicWrite, StagedDirectory) {
  TempDir dir;
  std::string out = dir / "nested/out";
  {
    StagedDirectory staged;
    ASSERT_TRUE(staged.begin(out).ok());
    ASSERT_TRUE(writeFileAtomically(staged.path() + "/a.txt", "first").ok());
    // Dropped without commit: nothing appears, nothing is left over.
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(entriesOf(dir / "nested").empty());

  for (const char *text : {"first", "second"}) {
    StagedDirectory staged;
    ASSERT_TRUE(staged.begin(out).ok());
    ASSERT_TRUE(writeFileAtomically(staged.path() + "/a.txt", text).ok());
    ASSERT_TRUE(staged.commit().ok());
    std::string contents;
    ASSERT_TRUE(readTextFile(out + "/a.txt", contents).ok());
    EXPECT_EQ(contents, text);
  }
  EXPECT_EQ(entriesOf(dir / "nested"), (std::vector<std::string>{"out"}));

  // A file in the way is not replaced by a directory.
  ASSERT_TRUE(writeFileAtomically(dir / "file", "x").ok());
  StagedDirectory staged;
  EXPECT_EQ(staged.begin(dir / "file").message(),
            dir / "file" + ": exists and is not a directory");
}

TEST(RuntimeAtomicWrite, FileWriterWithoutCommitLeavesNothing) {
  TempDir dir;
  ASSERT_TRUE(writeFileAtomically(dir / "kept", "old").ok());
  {
    AtomicFileWriter writer;
    ASSERT_TRUE(writer.begin(dir / "kept").ok());
    ASSERT_TRUE(writer.write("new", 3).ok());
  }
  std::string contents;
  ASSERT_TRUE(readTextFile(dir / "kept", contents).ok());
  EXPECT_EQ(contents, "old");
  EXPECT_EQ(entriesOf(dir.path), (std::vector<std::string>{"kept"}));
}

//===----------------------------------------------------------------------===//
// Parameter table
//===----------------------------------------------------------------------===//

TEST(RuntimeModelConfig, ParameterTableOrderAndShapes) {
  ModelConfig c = testConfig();
  std::vector<ParamInfo> table = parameterTable(c);
  ASSERT_EQ(table.size(), 2u + 11u * 2u + 1u);
  EXPECT_EQ(table[0].name, "fc.weight");
  EXPECT_EQ(table[0].shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(table[1].name, "hidden_norm.weight");
  std::vector<std::string> layerNames;
  for (size_t i = 2; i < 13; ++i)
    layerNames.push_back(table[i].name);
  EXPECT_EQ(
      layerNames,
      (std::vector<std::string>{
          "layers.0.input_layernorm.weight", "layers.0.self_attn.q_proj.weight",
          "layers.0.self_attn.k_proj.weight",
          "layers.0.self_attn.v_proj.weight",
          "layers.0.self_attn.o_proj.weight",
          "layers.0.self_attn.q_norm.weight",
          "layers.0.self_attn.k_norm.weight",
          "layers.0.post_attention_layernorm.weight",
          "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight",
          "layers.0.mlp.down_proj.weight"}));
  EXPECT_EQ(table[3].shape, (std::vector<int64_t>{32, 32}));  // q: nh*d, H
  EXPECT_EQ(table[4].shape, (std::vector<int64_t>{16, 32}));  // k: nkv*d, H
  EXPECT_EQ(table[6].shape, (std::vector<int64_t>{32, 32}));  // o: H, nh*d
  EXPECT_EQ(table[7].shape, (std::vector<int64_t>{8}));       // q_norm: d
  EXPECT_EQ(table[10].shape, (std::vector<int64_t>{48, 32})); // gate: I, H
  EXPECT_EQ(table[12].shape, (std::vector<int64_t>{32, 48})); // down: H, I
  EXPECT_EQ(table[13].name, "layers.1.input_layernorm.weight");
  EXPECT_EQ(table.back().name, "norm.weight");
  for (const ParamInfo &param : table)
    EXPECT_EQ(param.isNorm(), param.name.find("norm") != std::string::npos)
        << param.name;
}

TEST(RuntimeModelConfig, MatchesTheSpecLibrary) {
  dflash::SpecError error;
  auto spec = dflash::loadSpec(DFLASH_SPECS_DIR "/tiny.toml", error);
  ASSERT_TRUE(spec) << error.str();
  ModelConfig c = *spec;
  EXPECT_TRUE(validateModelConfig(c).ok());
  EXPECT_EQ(c.layerWindows, (std::vector<int64_t>{32, 0}));
  EXPECT_EQ(c.targetLayerIds, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(c.contextWidth(), 512);
}

TEST(RuntimeModelConfig, Validation) {
  ModelConfig c = testConfig();
  EXPECT_TRUE(validateModelConfig(c).ok());
  c.numKvHeads = 3;
  EXPECT_EQ(validateModelConfig(c).message(),
            "unit: 'num_heads' (4) is not a multiple of 'num_kv_heads' (3)");
  c = testConfig();
  c.maskTokenId = 64;
  EXPECT_EQ(validateModelConfig(c).message(),
            "unit: 'mask_token_id' (64) is outside the vocabulary of 64 "
            "tokens");
  c = testConfig();
  c.layerWindows = {0};
  EXPECT_EQ(validateModelConfig(c).message(),
            "unit: 'layer_windows' has 1 entries but the drafter has 2 "
            "layers");
  c = testConfig();
  c.targetLayerIds = {1, 6};
  EXPECT_EQ(validateModelConfig(c).message(),
            "unit: 'target_layer_ids' entry 6 is outside the target's 6 "
            "layers");
  c = testConfig();
  c.seqLen = 0;
  EXPECT_EQ(validateModelConfig(c).message(),
            "unit: 'seq_len' is 0 but must be positive");
  // A DFlash2 drafter's shapes (docs/semantics.md section 13); a v1
  // drafter's DFlash2 fields are not read.
  c = testConfig();
  c.convGroupSize = 5;
  EXPECT_TRUE(validateModelConfig(c).ok());
  c.dflash2 = true;
  EXPECT_EQ(validateModelConfig(c).message(),
            "unit: 'conv_group_size' (5) does not divide 'hidden_size' (32)");
  c = testConfig();
  c.dflash2 = true;
  c.convGroupSize = 8;
  EXPECT_TRUE(validateModelConfig(c).ok());
  EXPECT_EQ(c.convGroups(), 4);
  c.convKernelSize = 5; // past the block of 4
  EXPECT_NE(validateModelConfig(c).message().find("'conv_kernel_size' (5)"),
            std::string::npos);
  c.convKernelSize = 2;
  c.selectorTopK = 65; // past the vocabulary of 64
  EXPECT_NE(validateModelConfig(c).message().find("'selector_top_k' (65)"),
            std::string::npos);
  c.selectorTopK = 16;
  c.selectorWarmupRatio = 0.6;
  c.selectorRampRatio = 0.6;
  EXPECT_NE(validateModelConfig(c).message().find("'selector_warmup_ratio'"),
            std::string::npos);
}

// Sliding layers of a DFlash drafter are causal inside their block; every
// layer of a DFlash2 drafter is bidirectional there (docs/semantics.md
// sections 3 and 13).
TEST(RuntimeModelConfig, BlockCausality) {
  ModelConfig c = testConfig(); // layer 0 slides, layer 1 is full
  EXPECT_TRUE(c.blockCausal(0));
  EXPECT_FALSE(c.blockCausal(1));
  c.dflash2 = true;
  EXPECT_FALSE(c.blockCausal(0));
  EXPECT_FALSE(c.blockCausal(1));
  EXPECT_TRUE(c.layerSlides(0)); // the window still applies
}

TEST(RuntimeModelConfig, InitialParameters) {
  ModelConfig c = testConfig();
  c.initStd = 0.5;
  auto params = initialParameters(c, 1);
  auto again = initialParameters(c, 1);
  auto other = initialParameters(c, 2);
  EXPECT_EQ(params, again);
  EXPECT_NE(params, other);
  std::vector<ParamInfo> table = parameterTable(c);
  ASSERT_EQ(params.size(), table.size());
  for (size_t t = 0; t < table.size(); ++t) {
    ASSERT_EQ(int64_t(params[t].size()), table[t].numel());
    if (table[t].isNorm()) {
      for (uint16_t value : params[t])
        ASSERT_EQ(value, floatToBf16(1.0f));
      continue;
    }
    double sum = 0, sumSq = 0;
    for (uint16_t value : params[t]) {
      double x = bf16ToFloat(value);
      sum += x;
      sumSq += x * x;
    }
    double n = double(params[t].size());
    EXPECT_NEAR(sum / n, 0.0, 0.1) << table[t].name;
    EXPECT_NEAR(std::sqrt(sumSq / n), 0.5, 0.1) << table[t].name;
  }
  // A tensor does not depend on the sizes of the ones before it.
  ModelConfig wider = c;
  wider.targetLayerIds = {1, 2, 3}; // only fc changes
  auto widerParams = initialParameters(wider, 1);
  EXPECT_EQ(widerParams[2], params[2]);
  EXPECT_EQ(widerParams[3], params[3]);
}

// docs/semantics.md section 13: a DFlash2 drafter's tensors, named as its
// checkpoint, and their start (each convolution the identity, the selector
// changing nothing); the others are a DFlash drafter's.
TEST(RuntimeModelConfig, DFlash2Parameters) {
  ModelConfig c = testConfig();
  c.initStd = 0.5;
  ModelConfig d2 = c;
  d2.dflash2 = true;
  d2.convKernelSize = 2;
  d2.convGroupSize = 8;
  d2.selectorRank = 4;
  d2.selectorTopK = 2;
  const int64_t H = c.hiddenSize, V = c.vocabSize, kc = 2, G = H / 8;
  std::vector<ParamInfo> v1 = parameterTable(c), table = parameterTable(d2);
  ASSERT_EQ(table.size(), v1.size() + 4 * size_t(c.numLayers) + 3);
  auto at = [&](const std::string &name) -> const ParamInfo * {
    for (const ParamInfo &p : table)
      if (p.name == name)
        return &p;
    ADD_FAILURE() << "no tensor " << name;
    return nullptr;
  };
  for (const char *conv : {"attention_conv", "mlp_conv"})
    for (int64_t i = 0; i < c.numLayers; ++i) {
      std::string layer = "layers." + std::to_string(i) + "." + conv;
      const ParamInfo *base = at(layer + ".base_kernel");
      const ParamInfo *proj = at(layer + ".kernel_projection.weight");
      ASSERT_TRUE(base && proj);
      EXPECT_EQ(base->shape, (std::vector<int64_t>{2, kc, H}));
      EXPECT_EQ(proj->shape, (std::vector<int64_t>{2 * kc * G, H}));
      EXPECT_EQ(base->layer, i);
    }
  const ParamInfo *wh = at("candidate_selector.hidden_projection.weight");
  const ParamInfo *pc = at("candidate_selector.predecessor_codebook");
  const ParamInfo *sc = at("candidate_selector.successor_codebook");
  ASSERT_TRUE(wh && pc && sc);
  EXPECT_EQ(wh->shape, (std::vector<int64_t>{4, H}));
  EXPECT_EQ(pc->shape, (std::vector<int64_t>{V, 4}));
  EXPECT_EQ(sc->shape, (std::vector<int64_t>{V, 4}));
  EXPECT_EQ(table[size_t(finalNormParamIndex(d2))].name, "norm.weight");
  EXPECT_EQ(table[size_t(layerParamIndex(d2, 1, LayerParam::MlpConvProj))].name,
            "layers.1.mlp_conv.kernel_projection.weight");

  auto params = initialParameters(d2, 1);
  for (size_t t = 0; t < table.size(); ++t) {
    const std::string &name = table[t].name;
    std::vector<float> x;
    for (uint16_t value : params[t])
      x.push_back(bf16ToFloat(value));
    if (tensorNameEndsWith(name, "base_kernel")) {
      for (size_t i = 0; i < x.size(); ++i) // [2, kc, H]: tap 0 of each half
        ASSERT_EQ(x[i], (i / size_t(H)) % size_t(kc) == 0 ? 1.0f : 0.0f)
            << name << " " << i;
    } else if (tensorNameEndsWith(name, "kernel_projection.weight") ||
               name == sc->name) {
      for (float value : x)
        ASSERT_EQ(value, 0.0f) << name;
    } else if (table[t].isNorm()) {
      for (float value : x)
        ASSERT_EQ(value, 1.0f) << name;
    } else { // N(0, init_std): the other linears, Wh and the predecessors'
      double sumSq = 0;
      for (float value : x)
        sumSq += double(value) * value;
      EXPECT_NEAR(std::sqrt(sumSq / double(x.size())), 0.5, 0.1) << name;
    }
  }
}

//===----------------------------------------------------------------------===//
// Exported checkpoints
//===----------------------------------------------------------------------===//

TEST(RuntimeCheckpoint, ConfigJsonFields) {
  ModelConfig c = testConfig();
  std::string text;
  ASSERT_TRUE(checkpointConfigJson(c, text).ok());
  json config = json::parse(text, nullptr, false);
  ASSERT_FALSE(config.is_discarded());
  EXPECT_EQ(config["architectures"], json({"DFlashDraftModel"}));
  EXPECT_EQ(config["model_type"], "qwen3");
  EXPECT_EQ(config["block_size"], 4);
  EXPECT_EQ(config["dflash_config"]["block_size"], nullptr);
  EXPECT_EQ(config["dflash_config"]["mask_token_id"], 63);
  EXPECT_EQ(config["dflash_config"]["target_layer_ids"], json({1, 3}));
  EXPECT_EQ(config["num_target_layers"], 6);
  EXPECT_EQ(config["hidden_size"], 32);
  EXPECT_EQ(config["intermediate_size"], 48);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["head_dim"], 8);
  EXPECT_EQ(config["rms_norm_eps"], 1e-6);
  EXPECT_EQ(config["rope_theta"], 10000.0);
  EXPECT_EQ(config["vocab_size"], 64);
  EXPECT_EQ(config["max_position_embeddings"], 256);
  EXPECT_EQ(config["hidden_act"], "silu");
  EXPECT_EQ(config["attention_bias"], false);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  EXPECT_EQ(config["dtype"], "bfloat16");
  EXPECT_EQ(config["layer_types"],
            json({"sliding_attention", "full_attention"}));
  EXPECT_EQ(config["sliding_window"], 8);
  EXPECT_EQ(config["use_sliding_window"], true);

  c.layerWindows = {0, 0};
  ASSERT_TRUE(checkpointConfigJson(c, text).ok());
  config = json::parse(text, nullptr, false);
  EXPECT_EQ(config["layer_types"], json({"full_attention", "full_attention"}));
  EXPECT_FALSE(config.contains("sliding_window"));
  EXPECT_EQ(config["use_sliding_window"], false);

  c.layerWindows = {8, 16};
  EXPECT_EQ(checkpointConfigJson(c, text).message(),
            "unit: sliding layers have different windows (8 and 16) but "
            "config.json holds a single sliding_window");
}

// [drafter.rope_scaling] as transformers' rope_scaling: rope_type, factor and
// the original context always, the rest only where they differ from
// transformers' defaults; nothing without it.
TEST(RuntimeCheckpoint, ConfigJsonRopeScaling) {
  ModelConfig c = testConfig();
  std::string text;
  ASSERT_TRUE(checkpointConfigJson(c, text).ok());
  EXPECT_FALSE(json::parse(text).contains("rope_scaling"));

  c.ropeScalingFactor = 4;
  c.ropeScalingOriginalMaxPositions = 64;
  c.ropeScalingAttentionFactor = 0.1 * std::log(4.0) + 1;
  ASSERT_TRUE(checkpointConfigJson(c, text).ok());
  json config = json::parse(text);
  EXPECT_EQ(config["rope_scaling"],
            json({{"rope_type", "yarn"},
                  {"factor", 4.0},
                  {"original_max_position_embeddings", 64}}));

  c.ropeScalingBetaFast = 16;
  c.ropeScalingBetaSlow = 2;
  c.ropeScalingTruncate = false;
  c.ropeScalingAttentionFactor = 1.25;
  ASSERT_TRUE(checkpointConfigJson(c, text).ok());
  config = json::parse(text);
  EXPECT_EQ(config["rope_scaling"]["beta_fast"], 16.0);
  EXPECT_EQ(config["rope_scaling"]["beta_slow"], 2.0);
  EXPECT_EQ(config["rope_scaling"]["truncate"], false);
  EXPECT_EQ(config["rope_scaling"]["attention_factor"], 1.25);
}

TEST(RuntimeCheckpoint, ExportNamesShapesAndRoundTrip) {
  TempDir dir;
  ModelConfig c = testConfig();
  auto params = initialParameters(c, 5);
  std::string out = dir / "ckpt";
  Status status = exportCheckpoint(out, c, pointers(params));
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(entriesOf(out),
            (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(entriesOf(dir.path), (std::vector<std::string>{"ckpt"}));

  SafetensorsFile file;
  ASSERT_TRUE(file.open(out + "/model.safetensors").ok());
  std::vector<ParamInfo> table = parameterTable(c);
  ASSERT_EQ(file.tensors().size(), table.size());
  for (const ParamInfo &param : table) {
    const TensorView *view = file.find(param.name);
    ASSERT_TRUE(view) << param.name;
    EXPECT_EQ(view->dtype, DType::BF16);
    EXPECT_EQ(view->shape, param.shape);
  }
  for (const TensorView &view : file.tensors()) {
    EXPECT_NE(view.name.rfind("model.", 0), 0u) << view.name;
    EXPECT_EQ(view.name.find("embed"), std::string::npos);
    EXPECT_EQ(view.name.find("lm_head"), std::string::npos);
  }
  EXPECT_EQ(readJson(out + "/config.json")["model_type"], "qwen3");

  std::vector<std::vector<uint16_t>> loaded;
  status = loadCheckpoint(out, c, loaded);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(loaded, params);
}

// docs/semantics.md section 13: a DFlash2 drafter exports section 13's
// tensor names, its class, is_causal false and its shapes in dflash_config
// (the unary transform's keys only where set), and loads back; a
// config.json of other selector shapes is refused by key.
TEST(RuntimeCheckpoint, ExportsADFlash2Drafter) {
  TempDir dir;
  ModelConfig c = testConfig();
  c.dflash2 = true;
  c.convKernelSize = 2;
  c.convGroupSize = 8;
  c.selectorRank = 4;
  c.selectorTopK = 3;
  c.finalLogitSoftcapping = 30;
  std::string out = dir / "d2";
  auto params = initialParameters(c, 1);
  Status status = exportCheckpoint(out, c, pointers(params));
  ASSERT_TRUE(status.ok()) << status.message();
  SafetensorsFile file;
  ASSERT_TRUE(file.open(out + "/model.safetensors").ok());
  EXPECT_TRUE(file.find("layers.0.mlp_conv.kernel_projection.weight"));
  EXPECT_TRUE(file.find("candidate_selector.successor_codebook"));
  EXPECT_EQ(file.tensors().size(), parameterTable(c).size());
  auto config = readJson(out + "/config.json");
  EXPECT_EQ(config["architectures"][0], "DFlash2DraftModel");
  EXPECT_EQ(config["is_causal"], false);
  EXPECT_EQ(config["dflash_config"]["block_size"], c.blockSize);
  EXPECT_EQ(config["dflash_config"]["conv_kernel_size"], 2);
  EXPECT_EQ(config["dflash_config"]["conv_group_size"], 8);
  EXPECT_EQ(config["dflash_config"]["selector_rank"], 4);
  EXPECT_EQ(config["dflash_config"]["selector_top_k"], 3);
  EXPECT_EQ(config["dflash_config"]["final_logit_softcapping"], 30.0);
  EXPECT_FALSE(config["dflash_config"].contains("output_multiplier"));
  EXPECT_FALSE(config["dflash_config"].contains("input_embedding_scale"));
  std::vector<std::vector<uint16_t>> loaded;
  status = loadCheckpoint(out, c, loaded);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(loaded, params);
  ModelConfig other = c;
  other.selectorTopK = 4;
  status = loadCheckpoint(out, other, loaded);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("selector_top_k"), std::string::npos)
      << status.message();
  // A v1 drafter's config.json says nothing of DFlash2.
  ModelConfig v1 = testConfig();
  std::string plain = dir / "v1";
  auto v1Params = initialParameters(v1, 1);
  ASSERT_TRUE(exportCheckpoint(plain, v1, pointers(v1Params)).ok());
  auto v1Config = readJson(plain + "/config.json");
  EXPECT_EQ(v1Config["architectures"][0], "DFlashDraftModel");
  EXPECT_FALSE(v1Config.contains("is_causal"));
  EXPECT_FALSE(v1Config["dflash_config"].contains("selector_top_k"));
}

TEST(RuntimeCheckpoint, ReplacesAnExistingCheckpointWhole) {
  TempDir dir;
  ModelConfig c = testConfig();
  std::string out = dir / "ckpt";
  auto first = initialParameters(c, 1), second = initialParameters(c, 2);
  ASSERT_TRUE(exportCheckpoint(out, c, pointers(first)).ok());
  // A stray file in the old checkpoint disappears with it.
  std::ofstream(out + "/stale.txt") << "old";
  ASSERT_TRUE(exportCheckpoint(out + "/", c, pointers(second)).ok());
  EXPECT_EQ(entriesOf(out),
            (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(entriesOf(dir.path), (std::vector<std::string>{"ckpt"}));
  std::vector<std::vector<uint16_t>> loaded;
  ASSERT_TRUE(loadCheckpoint(out, c, loaded).ok());
  EXPECT_EQ(loaded, second);

  // A failing export leaves the good checkpoint and no temporary behind.
  auto broken = pointers(first);
  broken[3] = nullptr;
  Status status = exportCheckpoint(out, c, broken);
  EXPECT_EQ(status.message(),
            out + ": no buffer for tensor 'layers.0.self_attn.q_proj.weight'");
  EXPECT_EQ(entriesOf(dir.path), (std::vector<std::string>{"ckpt"}));
  ASSERT_TRUE(loadCheckpoint(out, c, loaded).ok());
  EXPECT_EQ(loaded, second);

  EXPECT_EQ(exportCheckpoint(out, c, {}).message(),
            out + ": got 0 parameter buffers but the model has 25 tensors");
}

/// Rewrites dir/model.safetensors with `edit` applied to its tensor list.
void rewriteModel(const std::string &dir, const ModelConfig &c,
                  const std::vector<std::vector<uint16_t>> &params,
                  void (*edit)(std::vector<TensorData> &)) {
  std::vector<TensorData> tensors;
  std::vector<ParamInfo> table = parameterTable(c);
  for (size_t i = 0; i < table.size(); ++i)
    tensors.push_back(
        {table[i].name, DType::BF16, table[i].shape, params[i].data()});
  edit(tensors);
  ASSERT_TRUE(writeSafetensors(dir + "/model.safetensors", tensors).ok());
}

TEST(RuntimeCheckpoint, LoadRejectsMismatches) {
  TempDir dir;
  ModelConfig c = testConfig();
  auto params = initialParameters(c, 1);
  std::string out = dir / "ckpt";
  std::string model = out + "/model.safetensors";
  ASSERT_TRUE(exportCheckpoint(out, c, pointers(params)).ok());
  std::vector<std::vector<uint16_t>> loaded;

  ModelConfig otherBlock = c;
  otherBlock.blockSize = 16;
  EXPECT_EQ(loadCheckpoint(out, otherBlock, loaded).message(),
            out + "/config.json: 'block_size' is 4 but the spec needs 16");
  ModelConfig otherTaps = c;
  otherTaps.targetLayerIds = {1, 4};
  EXPECT_EQ(loadCheckpoint(out, otherTaps, loaded).message(),
            out + "/config.json: 'dflash_config.target_layer_ids' is [1,3] "
                  "but the spec needs [1,4]");

  rewriteModel(out, c, params,
               [](std::vector<TensorData> &t) { t.erase(t.begin() + 4); });
  EXPECT_EQ(loadCheckpoint(out, c, loaded).message(),
            model + ": has no tensor 'layers.0.self_attn.k_proj.weight'");

  rewriteModel(out, c, params,
               [](std::vector<TensorData> &t) { t[4].shape = {8, 32}; });
  EXPECT_EQ(loadCheckpoint(out, c, loaded).message(),
            model + ": tensor 'layers.0.self_attn.k_proj.weight' has shape "
                    "[8, 32] but the spec needs [16, 32]");

  rewriteModel(out, c, params, [](std::vector<TensorData> &t) {
    t[1].dtype = DType::I32; // 32 bf16 values = 16 int32 values
    t[1].shape = {16};
  });
  EXPECT_EQ(loadCheckpoint(out, c, loaded).message(),
            model + ": tensor 'hidden_norm.weight' has shape [16] but the "
                    "spec needs [32]");

  static std::vector<int32_t> ints(32, 0);
  rewriteModel(out, c, params, [](std::vector<TensorData> &t) {
    t[1].dtype = DType::I32;
    t[1].data = ints.data();
  });
  EXPECT_EQ(loadCheckpoint(out, c, loaded).message(),
            model + ": tensor 'hidden_norm.weight' has dtype I32 but the "
                    "spec needs BF16");

  static uint16_t extra[2] = {0, 0};
  rewriteModel(out, c, params, [](std::vector<TensorData> &t) {
    t.push_back({"model.embed_tokens.weight", DType::BF16, {2}, extra});
  });
  EXPECT_EQ(loadCheckpoint(out, c, loaded).message(),
            model + ": has unexpected tensor 'model.embed_tokens.weight'");

  // Truncated: the last bytes of the data are gone.
  rewriteModel(out, c, params, [](std::vector<TensorData> &) {});
  fs::resize_file(model, fs::file_size(model) - 10);
  Status status = loadCheckpoint(out, c, loaded);
  EXPECT_NE(status.message().find("the file is truncated"), std::string::npos)
      << status.message();

  // F32 weights are accepted and rounded.
  std::vector<std::vector<float>> wide(params.size());
  std::vector<TensorData> tensors;
  std::vector<ParamInfo> table = parameterTable(c);
  for (size_t i = 0; i < params.size(); ++i) {
    for (uint16_t value : params[i])
      wide[i].push_back(bf16ToFloat(value));
    tensors.push_back(
        {table[i].name, DType::F32, table[i].shape, wide[i].data()});
  }
  ASSERT_TRUE(writeSafetensors(model, tensors).ok());
  ASSERT_TRUE(loadCheckpoint(out, c, loaded).ok());
  EXPECT_EQ(loaded, params);

  fs::remove(out + "/config.json");
  EXPECT_EQ(loadCheckpoint(out, c, loaded).message(),
            out + "/config.json: cannot open: no such file or directory");
  EXPECT_EQ(loaded, params); // untouched by failed loads
}

//===----------------------------------------------------------------------===//
// Training state
//===----------------------------------------------------------------------===//

TrainingState sampleState(const ModelConfig &c) {
  TrainingState state;
  state.step = 42;
  Rng rng(9);
  rng.next();
  state.rngState = rng.state();
  state.data = {3, 17};
  for (const ParamInfo &param : parameterTable(c)) {
    std::vector<float> master, m, v;
    for (int64_t i = 0; i < param.numel(); ++i) {
      master.push_back(float(rng.normal()));
      m.push_back(float(rng.normal() * 1e-3));
      v.push_back(float(rng.uniform01() * 1e-6));
    }
    state.master.push_back(master);
    state.adamM.push_back(m);
    state.adamV.push_back(v);
  }
  return state;
}

// The trainer writes a checkpoint's files into the directory it stages
// itself (with its run settings): no second staging inside it, so the one
// temporary directory has one suffix (checkpoint-20.tmp-<pid>, not
// checkpoint-20.tmp-<pid>.tmp-<pid>), and messages name the checkpoint.
TEST(RuntimeCheckpoint, CheckpointFilesGoIntoTheGivenDirectory) {
  TempDir dir;
  ModelConfig c = testConfig();
  auto params = initialParameters(c, 1);
  TrainingState state = sampleState(c);
  const std::string staged = dir / "checkpoint-20.tmp-1";
  std::filesystem::create_directories(staged);
  Status status = writeTrainingCheckpointFiles(staged, dir / "checkpoint-20", c,
                                               pointers(params), state.ref());
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(entriesOf(dir.path),
            (std::vector<std::string>{"checkpoint-20.tmp-1"}));
  EXPECT_EQ(entriesOf(staged),
            (std::vector<std::string>{"config.json", "model.safetensors",
                                      "training"}));
  TrainingStateRef missing = state.ref();
  missing.adamM.pop_back();
  EXPECT_EQ(writeTrainingCheckpointFiles(staged, dir / "checkpoint-20", c,
                                         pointers(params), missing)
                .message(),
            dir / "checkpoint-20" +
                ": got 24 'adam_m' buffers but the model has 25 tensors");
}

TEST(RuntimeCheckpoint, TrainingStateRoundTrip) {
  TempDir dir;
  ModelConfig c = testConfig();
  auto params = initialParameters(c, 1);
  TrainingState state = sampleState(c);
  std::string out = dir / "step-42";
  Status status = saveTrainingCheckpoint(out, c, pointers(params), state.ref());
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(entriesOf(out),
            (std::vector<std::string>{"config.json", "model.safetensors",
                                      "training"}));
  // Only the servable files beside config.json: the state is in training/.
  EXPECT_EQ(entriesOf(out + "/training"),
            (std::vector<std::string>{"state.safetensors"}));
  // The exported part loads as a plain checkpoint.
  std::vector<std::vector<uint16_t>> loadedParams;
  ASSERT_TRUE(loadCheckpoint(out, c, loadedParams).ok());
  EXPECT_EQ(loadedParams, params);

  TrainingState loaded;
  status = loadTrainingState(out, c, loaded);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(loaded.step, 42);
  EXPECT_EQ(loaded.rngState, state.rngState);
  EXPECT_EQ(loaded.data.epoch, 3);
  EXPECT_EQ(loaded.data.row, 17);
  EXPECT_EQ(loaded.master, state.master);
  EXPECT_EQ(loaded.adamM, state.adamM);
  EXPECT_EQ(loaded.adamV, state.adamV);
  EXPECT_EQ(loaded.badRows, state.badRows);
}

// The known bad rows: none, some, and a file from before they were saved
// (no tensor: none); out of order or negative is refused, naming the entry.
TEST(RuntimeCheckpoint, TrainingStateBadRows) {
  TempDir dir;
  ModelConfig c = testConfig();
  auto params = initialParameters(c, 1);
  TrainingState state = sampleState(c);
  std::string out = dir / "ckpt";
  std::string file = out + "/training/state.safetensors";
  TrainingState loaded;
  for (std::vector<int64_t> rows :
       {std::vector<int64_t>{}, std::vector<int64_t>{0, 7, 1000000007}}) {
    state.badRows = rows;
    ASSERT_TRUE(
        saveTrainingCheckpoint(out, c, pointers(params), state.ref()).ok());
    Status s = loadTrainingState(out, c, loaded);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(loaded.badRows, rows);
  }

  // Without the tensor, as written before it existed.
  {
    SafetensorsFile saved;
    ASSERT_TRUE(saved.open(file).ok());
    std::vector<TensorData> tensors;
    for (const TensorView &view : saved.tensors())
      if (view.name != "bad_rows")
        tensors.push_back({view.name, view.dtype, view.shape, view.data});
    std::string old = dir / "old.safetensors";
    ASSERT_TRUE(writeSafetensors(old, tensors, saved.metadata()).ok());
    saved = SafetensorsFile();
    fs::rename(old, file);
  }
  loaded.badRows = {3};
  ASSERT_TRUE(loadTrainingState(out, c, loaded).ok());
  EXPECT_TRUE(loaded.badRows.empty());

  for (std::vector<int64_t> rows :
       {std::vector<int64_t>{4, 4}, std::vector<int64_t>{-1}}) {
    state.badRows = rows;
    ASSERT_TRUE(
        saveTrainingCheckpoint(out, c, pointers(params), state.ref()).ok());
    EXPECT_EQ(loadTrainingState(out, c, loaded).message(),
              file + ": tensor 'bad_rows' entry " +
                  std::to_string(rows.size() - 1) + " (" +
                  std::to_string(rows.back()) +
                  ") is negative or not above the one before; the rows must "
                  "be distinct and ascending");
  }
}

TEST(RuntimeCheckpoint, TrainingStateRejectsCorruptFiles) {
  TempDir dir;
  ModelConfig c = testConfig();
  auto params = initialParameters(c, 1);
  TrainingState state = sampleState(c);
  std::string out = dir / "ckpt";
  std::string file = out + "/training/state.safetensors";
  ASSERT_TRUE(
      saveTrainingCheckpoint(out, c, pointers(params), state.ref()).ok());
  TrainingState loaded;

  ModelConfig wider = c;
  wider.intermediateSize = 64;
  EXPECT_EQ(loadTrainingState(out, wider, loaded).message(),
            file + ": tensor 'master.layers.0.mlp.gate_proj.weight' has "
                   "shape [48, 32] but the spec needs [64, 32]");

  TrainingStateRef missing = state.ref();
  missing.adamV.pop_back();
  EXPECT_EQ(saveTrainingCheckpoint(out, c, pointers(params), missing).message(),
            out + ": got 24 'adam_v' buffers but the model has 25 tensors");

  TrainingStateRef zeroRng = state.ref();
  zeroRng.rngState = {0, 0, 0, 0};
  ASSERT_TRUE(saveTrainingCheckpoint(out, c, pointers(params), zeroRng).ok());
  EXPECT_EQ(loadTrainingState(out, c, loaded).message(),
            file + ": tensor 'rng_state': random generator state is all zero");

  ASSERT_TRUE(
      saveTrainingCheckpoint(out, c, pointers(params), state.ref()).ok());
  fs::resize_file(file, fs::file_size(file) / 2);
  Status status = loadTrainingState(out, c, loaded);
  EXPECT_NE(status.message().find("the file is truncated"), std::string::npos)
      << status.message();

  // Not a training state at all.
  fs::copy_file(out + "/model.safetensors", file,
                fs::copy_options::overwrite_existing);
  EXPECT_EQ(loadTrainingState(out, c, loaded).message(),
            file + ": metadata 'format' is not 'dflash-training-state'");
  EXPECT_EQ(loaded.step, 0); // untouched
}

// A data-parallel run's state: every rank's anchor Rng (the checkpoints of
// train's host-side tests, trainhost::writeTrainingCheckpoint).
TEST(TrainCheckpoints, EveryRanksAnchorRngRoundTrips) {
  TrainMainTempDir dir;
  ModelConfig c = smallConfig();
  std::string two = dir.path + "/two", one = dir.path + "/one";
  writeTrainingCheckpoint(two, c, 7, nullptr, /*ranks=*/2);
  writeTrainingCheckpoint(one, c, 7, nullptr);
  TrainingState loaded;
  Status s = loadTrainingState(two, c, loaded);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(loaded.worldSize(), 2);
  EXPECT_EQ(loaded.anchorRngState(0), Rng(3).state());
  EXPECT_EQ(loaded.anchorRngState(1), Rng(4).state());
  EXPECT_EQ(loaded.data.row, 4);
  // Rank r's state is row r of an I64 [ranks, 4] tensor; one rank keeps
  // the [4] of the checkpoints written before data parallelism.
  SafetensorsFile file;
  ASSERT_TRUE(file.open(two + "/" + kTrainingStateFile).ok());
  ASSERT_NE(file.find("rng_state"), nullptr);
  EXPECT_EQ(file.find("rng_state")->shape, (std::vector<int64_t>{2, 4}));
  SafetensorsFile single;
  ASSERT_TRUE(single.open(one + "/" + kTrainingStateFile).ok());
  EXPECT_EQ(single.find("rng_state")->shape, std::vector<int64_t>{4});
  ASSERT_TRUE(loadTrainingState(one, c, loaded).ok());
  EXPECT_EQ(loaded.worldSize(), 1);
  EXPECT_TRUE(loaded.otherRankRngStates.empty());

  // A rank whose state cannot be restored names its row.
  std::vector<std::vector<uint16_t>> params = initialParameters(c, 1);
  std::vector<const uint16_t *> pointers;
  TrainingState broken;
  for (const auto &p : params) {
    pointers.push_back(p.data());
    broken.master.emplace_back(p.size(), 0.0f);
    broken.adamM.emplace_back(p.size(), 0.0f);
    broken.adamV.emplace_back(p.size(), 0.0f);
  }
  broken.rngState = Rng(1).state();
  broken.otherRankRngStates = {Rng(2).state(), Rng::State{}};
  std::string bad = dir.path + "/bad";
  ASSERT_TRUE(saveTrainingCheckpoint(bad, c, pointers, broken.ref()).ok());
  s = loadTrainingState(bad, c, loaded);
  EXPECT_EQ(s.message(), bad + "/" + kTrainingStateFile +
                             ": tensor 'rng_state' row 2: random generator "
                             "state is all zero");
}

//===----------------------------------------------------------------------===//
// Target weights
//===----------------------------------------------------------------------===//

TEST(RuntimeTargetWeights, LoadsTheSyntheticTarget) {
  TempDir dir;
  for (bool tied : {false, true}) {
    ModelConfig c = testConfig();
    c.tieWordEmbeddings = tied;
    SyntheticProblem problem;
    ASSERT_TRUE(problem.init(c, 4).ok());
    std::string target = dir / (tied ? "tied" : "separate");
    ASSERT_TRUE(writeSyntheticTarget(target, problem).ok());
    SafetensorsFile file;
    ASSERT_TRUE(file.open(target + "/model.safetensors").ok());
    EXPECT_EQ(file.find("lm_head.weight") != nullptr, !tied);

    TargetWeights weights;
    Status status = loadTargetWeights(target, c, weights);
    ASSERT_TRUE(status.ok()) << status.message();
    EXPECT_EQ(weights.tied, tied);
    EXPECT_EQ(weights.embed, problem.target().embed);
    EXPECT_EQ(weights.lmHead, problem.target().lmHead);
    EXPECT_EQ(weights.lmHead.empty(), tied);
    EXPECT_EQ(weights.lmHeadData()[5], problem.target().lmHeadData()[5]);
  }
}

void writeText(const std::string &path, const std::string &text) {
  std::ofstream(path) << text;
}

TEST(RuntimeTargetWeights, ShardedF32AndTied) {
  TempDir dir;
  ModelConfig c = testConfig();
  c.tieWordEmbeddings = true;
  std::vector<float> embed(size_t(64 * 32));
  for (size_t i = 0; i < embed.size(); ++i)
    embed[i] = float(i) * 0.001f;
  std::vector<float> layer(4, 0.0f);
  ASSERT_TRUE(
      writeSafetensors(dir / "model-00001-of-00002.safetensors",
                       {{"model.layers.0.w", DType::F32, {4}, layer.data()}})
          .ok());
  ASSERT_TRUE(
      writeSafetensors(
          dir / "model-00002-of-00002.safetensors",
          {{"model.embed_tokens.weight", DType::F32, {64, 32}, embed.data()}})
          .ok());
  const char *index = R"({"weight_map": {
      "model.layers.0.w": "model-00001-of-00002.safetensors",
      "model.embed_tokens.weight": "model-00002-of-00002.safetensors"}})";
  writeText(dir / "model.safetensors.index.json", index);
  writeText(dir / "config.json",
            R"({"hidden_size": 32, "vocab_size": 64, "num_hidden_layers": 6,
               "tie_word_embeddings": true})");
  TargetWeights weights;
  Status status = loadTargetWeights(dir.path, c, weights);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_TRUE(weights.tied);
  ASSERT_EQ(weights.embed.size(), embed.size());
  for (size_t i = 0; i < embed.size(); ++i)
    ASSERT_EQ(weights.embed[i], floatToBf16(embed[i]));
  EXPECT_EQ(weights.lmHeadData(), weights.embed.data());

  // The target's config.json and the spec disagree on tying.
  ModelConfig untied = c;
  untied.tieWordEmbeddings = false;
  EXPECT_EQ(loadTargetWeights(dir.path, untied, weights).message(),
            dir / "config.json" +
                ": 'tie_word_embeddings' is true but the spec needs false");
  // Untied but no lm_head.
  writeText(dir / "config.json",
            R"({"hidden_size": 32, "vocab_size": 64, "num_hidden_layers": 6})");
  EXPECT_EQ(loadTargetWeights(dir.path, untied, weights).message(),
            dir.path + ": has no tensor 'lm_head.weight' but the spec sets "
                       "tie_word_embeddings false");

  // Multimodal configs keep the sizes under text_config.
  writeText(dir / "config.json",
            R"({"text_config": {"hidden_size": 32, "vocab_size": 64,
               "num_hidden_layers": 6}})");
  EXPECT_TRUE(loadTargetWeights(dir.path, c, weights).ok());
}

// A compiled program's frozen tensors by Hugging Face name, through a
// sharded index: bf16 and F32 (rounded) shards, and each refusal naming the
// directory or shard and the tensor.
TEST(RuntimeTargetWeights, FrozenTensorsByName) {
  TempDir dir;
  std::vector<float> up(6);
  for (size_t i = 0; i < up.size(); ++i)
    up[i] = 0.25f * float(i) - 0.3f;
  std::vector<uint16_t> norm{floatToBf16(1.5f), floatToBf16(-2.0f)};
  std::vector<int32_t> ints(2, 7);
  const std::string first = "model-00001-of-00002.safetensors",
                    second = "model-00002-of-00002.safetensors";
  ASSERT_TRUE(
      writeSafetensors(
          dir / first,
          {{"model.layers.0.mlp.up_proj.weight", DType::F32, {3, 2}, up.data()},
           {"model.layers.0.count", DType::I32, {2}, ints.data()}})
          .ok());
  ASSERT_TRUE(
      writeSafetensors(dir / second, {{"model.layers.0.input_layernorm.weight",
                                       DType::BF16,
                                       {2},
                                       norm.data()}})
          .ok());
  auto index = [&](const std::string &secondFile) {
    writeText(dir / "model.safetensors.index.json",
              R"({"weight_map": {"model.layers.0.mlp.up_proj.weight": ")" +
                  first + R"(", "model.layers.0.count": ")" + first +
                  R"(", "model.layers.0.input_layernorm.weight": ")" +
                  secondFile + R"("}})");
  };
  index(second);
  const std::string needer = "the target program";
  std::vector<std::vector<uint16_t>> out;
  Status status =
      loadFrozenTensors(dir.path,
                        {{"model.layers.0.input_layernorm.weight", {2}},
                         {"model.layers.0.mlp.up_proj.weight", {3, 2}}},
                        needer, out);
  ASSERT_TRUE(status.ok()) << status.message();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], norm);
  ASSERT_EQ(out[1].size(), up.size());
  for (size_t i = 0; i < up.size(); ++i)
    EXPECT_EQ(out[1][i], floatToBf16(up[i])) << i;

  EXPECT_EQ(loadFrozenTensors(dir.path,
                              {{"model.layers.0.mlp.down_proj.weight", {2, 3}}},
                              needer, out)
                .message(),
            dir.path + ": has no tensor 'model.layers.0.mlp.down_proj.weight', "
                       "which the target program needs");
  EXPECT_EQ(loadFrozenTensors(dir.path,
                              {{"model.layers.0.mlp.up_proj.weight", {2, 3}}},
                              needer, out)
                .message(),
            dir / first +
                ": tensor 'model.layers.0.mlp.up_proj.weight' has shape "
                "[3, 2] but the target program needs [2, 3]");
  status =
      loadFrozenTensors(dir.path, {{"model.layers.0.count", {2}}}, needer, out);
  EXPECT_EQ(status.message(), dir / first +
                                  ": tensor 'model.layers.0.count' has dtype "
                                  "I32 but BF16 or F32 is needed");
  // The index names a shard that is not there.
  index("model-00003-of-00002.safetensors");
  status = loadFrozenTensors(
      dir.path, {{"model.layers.0.input_layernorm.weight", {2}}}, needer, out);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("model-00003-of-00002.safetensors"),
            std::string::npos)
      << status.message();
}

// gpt-oss's experts into the stacked [E, N, K] weights and [E, N] biases the
// program reads: the bf16 layout (gate and up interleaved, inputs first)
// and the official MXFP4 one (outputs first), each element checked.
TEST(RuntimeTargetWeights, GptOssExpertLayouts) {
  const int64_t E = 2, I = 32, H = 32;
  auto value = [](int64_t i) { return floatToBf16(float(i % 251) * 0.25f); };
  std::vector<uint16_t> gateUp(E * H * 2 * I), down(E * I * H),
      gateUpBias(E * 2 * I), downBias(E * H);
  for (size_t i = 0; i < gateUp.size(); ++i)
    gateUp[i] = value(int64_t(i));
  for (size_t i = 0; i < down.size(); ++i)
    down[i] = value(int64_t(i) * 7 + 3);
  for (size_t i = 0; i < gateUpBias.size(); ++i)
    gateUpBias[i] = value(int64_t(i) * 3 + 1);
  for (size_t i = 0; i < downBias.size(); ++i)
    downBias[i] = value(int64_t(i) * 5 + 2);
  const std::string p = "model.layers.0.mlp.experts.";
  const std::vector<FrozenTensor> wanted{
      {p + "gate_proj.weight", {E, I, H}}, {p + "up_proj.weight", {E, I, H}},
      {p + "down_proj.weight", {E, H, I}}, {p + "gate_proj.bias", {E, I}},
      {p + "up_proj.bias", {E, I}},        {p + "down_proj.bias", {E, H}}};
  const std::string needer = "the target program";
  std::vector<std::vector<uint16_t>> out;
  {
    TempDir dir;
    ASSERT_TRUE(
        writeSafetensors(
            dir / "model.safetensors",
            {{p + "gate_up_proj", DType::BF16, {E, H, 2 * I}, gateUp.data()},
             {p + "gate_up_proj_bias",
              DType::BF16,
              {E, 2 * I},
              gateUpBias.data()},
             {p + "down_proj", DType::BF16, {E, I, H}, down.data()},
             {p + "down_proj_bias", DType::BF16, {E, H}, downBias.data()}})
            .ok());
    Status status = loadFrozenTensors(dir.path, wanted, needer, out);
    ASSERT_TRUE(status.ok()) << status.message();
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t n = 0; n < I; ++n) {
        for (int64_t k = 0; k < H; ++k) {
          const int64_t from = (e * H + k) * 2 * I + 2 * n;
          ASSERT_EQ(out[0][(e * I + n) * H + k], gateUp[from]) << e << n << k;
          ASSERT_EQ(out[1][(e * I + n) * H + k], gateUp[from + 1]);
        }
        ASSERT_EQ(out[3][e * I + n], gateUpBias[e * 2 * I + 2 * n]);
        ASSERT_EQ(out[4][e * I + n], gateUpBias[e * 2 * I + 2 * n + 1]);
      }
      for (int64_t n = 0; n < H; ++n) {
        for (int64_t k = 0; k < I; ++k)
          ASSERT_EQ(out[2][(e * H + n) * I + k], down[(e * I + k) * H + n]);
        ASSERT_EQ(out[5][e * H + n], downBias[e * H + n]);
      }
    }
  }
  {
    // MXFP4: blocks [E, rows, K/32, 16] and scales [E, rows, K/32].
    TempDir dir;
    std::mt19937 rng(5);
    std::vector<uint8_t> guBlocks(E * 2 * I * (H / 32) * 16),
        guScales(E * 2 * I * (H / 32)), dBlocks(E * H * (I / 32) * 16),
        dScales(E * H * (I / 32));
    for (auto *v : {&guBlocks, &dBlocks})
      for (auto &b : *v)
        b = uint8_t(rng() & 0xFF);
    for (auto *v : {&guScales, &dScales})
      for (auto &b : *v)
        b = uint8_t(118 + rng() % 16);
    ASSERT_TRUE(
        writeSafetensors(
            dir / "model.safetensors",
            {{p + "gate_up_proj_blocks",
              DType::U8,
              {E, 2 * I, H / 32, 16},
              guBlocks.data()},
             {p + "gate_up_proj_scales",
              DType::U8,
              {E, 2 * I, H / 32},
              guScales.data()},
             {p + "gate_up_proj_bias",
              DType::BF16,
              {E, 2 * I},
              gateUpBias.data()},
             {p + "down_proj_blocks",
              DType::U8,
              {E, H, I / 32, 16},
              dBlocks.data()},
             {p + "down_proj_scales",
              DType::U8,
              {E, H, I / 32},
              dScales.data()},
             {p + "down_proj_bias", DType::BF16, {E, H}, downBias.data()}})
            .ok());
    Status status = loadFrozenTensors(dir.path, wanted, needer, out);
    ASSERT_TRUE(status.ok()) << status.message();
    std::vector<uint16_t> gu(E * 2 * I * H), d(E * H * I);
    ASSERT_TRUE(dequantizeMxfp4(guBlocks.data(), guScales.data(),
                                int64_t(guScales.size()), "gu", gu.data())
                    .ok());
    ASSERT_TRUE(dequantizeMxfp4(dBlocks.data(), dScales.data(),
                                int64_t(dScales.size()), "d", d.data())
                    .ok());
    for (int64_t e = 0; e < E; ++e)
      for (int64_t n = 0; n < I; ++n)
        for (int64_t k = 0; k < H; ++k) {
          ASSERT_EQ(out[0][(e * I + n) * H + k],
                    gu[(e * 2 * I + 2 * n) * H + k]);
          ASSERT_EQ(out[1][(e * I + n) * H + k],
                    gu[(e * 2 * I + 2 * n + 1) * H + k]);
        }
    EXPECT_EQ(out[2], d);
    // A scale tensor of the wrong shape is refused, naming it.
    ASSERT_TRUE(
        writeSafetensors(dir / "model.safetensors", {{p + "down_proj_blocks",
                                                      DType::U8,
                                                      {E, H, I / 32, 16},
                                                      dBlocks.data()},
                                                     {p + "down_proj_scales",
                                                      DType::U8,
                                                      {E, H / 2, I / 32},
                                                      dScales.data()}})
            .ok());
    status = loadFrozenTensors(dir.path, {wanted[2]}, needer, out);
    EXPECT_NE(status.message().find("tensor '" + p +
                                    "down_proj_scales' is U8 [2, 16, 1] but "
                                    "the target program needs U8 [2, 32, 1]"),
              std::string::npos)
        << status.message();
  }
}

TEST(RuntimeTargetWeights, RejectsMismatches) {
  TempDir dir;
  ModelConfig c = testConfig();
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(c, 4).ok());
  ASSERT_TRUE(writeSyntheticTarget(dir.path, problem).ok());
  TargetWeights weights;
  ModelConfig wider = c;
  wider.targetHiddenSize = wider.hiddenSize = 48;
  EXPECT_EQ(loadTargetWeights(dir.path, wider, weights).message(),
            dir / "config.json" +
                ": 'hidden_size' is 32 but the spec needs 48");
  ModelConfig bigger = c;
  bigger.vocabSize = 128;
  EXPECT_EQ(loadTargetWeights(dir.path, bigger, weights).message(),
            dir / "config.json" +
                ": 'vocab_size' is 64 but the spec needs 128");

  // config.json agrees but the tensor does not.
  writeText(dir / "config.json",
            R"({"hidden_size": 48, "vocab_size": 64, "num_hidden_layers": 6})");
  EXPECT_EQ(loadTargetWeights(dir.path, wider, weights).message(),
            dir / "model.safetensors" +
                ": tensor 'model.embed_tokens.weight' has shape [64, 32] but "
                "the spec needs [64, 48]");
  std::vector<int32_t> ints(64 * 32, 0);
  ASSERT_TRUE(
      writeSafetensors(
          dir / "model.safetensors",
          {{"model.embed_tokens.weight", DType::I32, {64, 32}, ints.data()}})
          .ok());
  writeText(dir / "config.json",
            R"({"hidden_size": 32, "vocab_size": 64, "num_hidden_layers": 6})");
  ModelConfig tied = c;
  tied.tieWordEmbeddings = true;
  EXPECT_EQ(loadTargetWeights(dir.path, tied, weights).message(),
            dir / "model.safetensors" +
                ": tensor 'model.embed_tokens.weight' has dtype I32 but BF16 "
                "or F32 is needed");
  fs::remove(dir / "config.json");
  EXPECT_EQ(loadTargetWeights(dir.path, c, weights).message(),
            dir / "config.json" + ": cannot open: no such file or directory");
}

} // namespace
