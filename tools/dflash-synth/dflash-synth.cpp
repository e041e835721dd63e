//===- dflash-synth.cpp - Write a learnable synthetic problem -------------===//
//
// dflash-synth SPEC OUT writes, for the drafter of SPEC, a synthetic target
// (OUT/target), feature shards (OUT/data) and the drafter's initial weights
// (OUT/init) as the same files a real run uses, so that every implementation
// (ours on CPU and GPU, PyTorch's) can be run on identical inputs.
//
//===----------------------------------------------------------------------===//

#include "compiler/Spec/Spec.h"
#include "schema/ModelConfig.h"
#include "schema/Parameters.h"
#include "tools/dflash-synth/SyntheticFiles.h"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <iostream>
#include <optional>
#include <string>

using namespace dflash;

static int fail(const std::string &message) {
  std::cerr << "dflash-synth: error: " << message << "\n";
  return 1;
}

int main(int argc, char **argv) {
  CLI::App app{"Writes a learnable synthetic problem for the drafter of a "
               "spec: a target directory, feature shards and an initial "
               "checkpoint, deterministic from a seed.",
               "dflash-synth"};
  std::string specPath, outDir;
  int64_t rows = 64, rowsPerShard = 16;
  std::optional<uint64_t> seed;
  bool pinAnchors = false;
  app.add_option("spec", specPath, "Drafter spec (specs/*.toml)")->required();
  app.add_option("out", outDir,
                 "Output directory; OUT/target, OUT/data and OUT/init are "
                 "replaced whole if they exist")
      ->required();
  app.add_option("--rows", rows,
                 "Number of rows to write, positive (default 64)");
  app.add_option("--rows-per-shard", rowsPerShard,
                 "Rows per shard file, positive (default 16)");
  app.add_option("--seed", seed,
                 "Seed of the problem and of the initial weights (default: "
                 "the spec's training.seed)");
  app.add_flag("--pin-anchors", pinAnchors,
               "Store sampled anchors in the shards ('anchors' and 'keep'), "
               "so that every implementation trains on the same anchors");
  app.footer(
      "Writes:\n"
      "  OUT/target  config.json (hidden_size, vocab_size, num_hidden_layers,\n"
      "              tie_word_embeddings) and model.safetensors with\n"
      "              model.embed_tokens.weight and, unless tied,\n"
      "              lm_head.weight, bf16 [V, H]\n"
      "  OUT/data    shard-NNNNN.safetensors: input_ids [R, S] int32,\n"
      "              loss_mask [R, S] uint8, hidden_states [R, S, L*H] bf16,\n"
      "              with --pin-anchors also anchors [R, N] int32 and keep\n"
      "              [R, N] uint8; metadata target, target_layer_ids,\n"
      "              hidden_size, seq_len\n"
      "  OUT/init    the drafter's initial weights as an exported checkpoint\n"
      "              (config.json, model.safetensors)\n"
      "Tokens follow a seeded Markov chain (each token has a likely "
      "successor);\n"
      "features are fixed random projections of the embeddings of the current\n"
      "and next two tokens plus small noise. Exit status 1 on any error.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e) == 0 ? 0 : 1;
  }
  if (rows <= 0)
    return fail("--rows must be positive, not " + std::to_string(rows));
  if (rowsPerShard <= 0)
    return fail("--rows-per-shard must be positive, not " +
                std::to_string(rowsPerShard));

  SpecError specError;
  std::optional<DrafterSpec> spec = loadSpec(specPath, specError);
  if (!spec) {
    std::cerr << specError.str() << "\n";
    return 1;
  }
  const ModelConfig &config = *spec;
  uint64_t problemSeed = seed ? *seed : uint64_t(config.seed);

  rt::SyntheticProblem problem;
  Status status = problem.init(config, problemSeed);
  if (!status.ok())
    return fail(status.message());

  std::string targetDir = outDir + "/target", dataDir = outDir + "/data",
              initDir = outDir + "/init";
  status = rt::writeSyntheticTarget(targetDir, problem);
  if (!status.ok())
    return fail(status.message());
  std::cout << "wrote " << targetDir << ": synthetic target '"
            << config.targetModel << "', vocab " << config.vocabSize
            << ", hidden " << config.targetHiddenSize << ", "
            << (config.tieWordEmbeddings ? "tied embedding/lm_head"
                                         : "separate embedding and lm_head")
            << "\n";

  std::vector<std::string> shards;
  status = rt::writeSyntheticShards(dataDir, problem, rows, rowsPerShard,
                                    pinAnchors, &shards);
  if (!status.ok())
    return fail(status.message());
  std::cout << "wrote " << dataDir << ": " << shards.size() << " shard"
            << (shards.size() == 1 ? "" : "s") << ", " << rows
            << " rows of seq_len " << config.seqLen << ", features "
            << config.contextWidth() << " wide (layers";
  for (int64_t id : config.targetLayerIds)
    std::cout << " " << id;
  std::cout << ")" << (pinAnchors ? ", pinned anchors" : "") << "\n";

  status = rt::writeSyntheticInit(initDir, problem);
  if (!status.ok())
    return fail(status.message());
  std::cout << "wrote " << initDir << ": initial checkpoint of '" << config.name
            << "', " << parameterTable(config).size() << " tensors, "
            << numParameters(config) << " parameters, seed " << problemSeed
            << "\n";
  return 0;
}
