//===- SyntheticFiles.h - The synthetic problem as files --------*- C++ -*-===//
//
// dflash-synth writes runtime/data/Synthetic.h's problem as the files every
// implementation reads: the target directory, feature shards and the
// drafter's initial checkpoint. Host code; the trainer never writes them.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_TOOLS_SYNTHETICFILES_H
#define DFLASH_TOOLS_SYNTHETICFILES_H

#include "runtime/data/Synthetic.h"
#include "schema/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::rt {

/// Writes the target directory in Hugging Face layout: config.json
/// (architectures, hidden_size, vocab_size, num_hidden_layers,
/// tie_word_embeddings) and model.safetensors (model.embed_tokens.weight, and
/// lm_head.weight unless tied).
Status writeSyntheticTarget(const std::string &dir,
                            const SyntheticProblem &problem);

/// Writes rows [0, rows) as feature shards `shard-00000.safetensors`, ...
/// of `rowsPerShard` rows each, with pinned anchors when asked. Appends the
/// written paths to `files` when given.
Status writeSyntheticShards(const std::string &dir,
                            const SyntheticProblem &problem, int64_t rows,
                            int64_t rowsPerShard, bool pinAnchors,
                            std::vector<std::string> *files = nullptr);

/// Exports the drafter's initial weights as a checkpoint.
Status writeSyntheticInit(const std::string &dir,
                          const SyntheticProblem &problem);

} // namespace dflash::rt

#endif // DFLASH_TOOLS_SYNTHETICFILES_H
