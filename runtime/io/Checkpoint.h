//===- Checkpoint.h - Drafter checkpoints and resumable state ---*- C++ -*-===//
//
// docs/semantics.md section 6. An exported checkpoint is a directory with
// config.json and model.safetensors (bf16, parameterTable names, no `model.`
// prefix, no embedding or lm_head) that serving engines load as a
// DFlashDraftModel. A training checkpoint is the same directory plus
// training/state.safetensors: fp32 masters, both Adam moments (tensors
// "master.<name>", "adam_m.<name>", "adam_v.<name>"), the step, the anchor
// RNG state of every rank ("rng_state": I64 [4] for one rank, [ranks, 4] for
// a data-parallel run; each rank samples its anchors from its own stream)
// and the data position, which every rank shares. Directories are written under
// a temporary name and swapped in whole (StagedDirectory), so a crash leaves
// either the previous checkpoint or the new one.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_CHECKPOINT_H
#define DFLASH_RUNTIME_CHECKPOINT_H

#include "schema/ModelConfig.h"
#include "schema/Parameters.h"
#include "schema/Status.h"

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dflash::rt {

/// The config.json of an exported checkpoint. Fails when sliding layers have
/// different windows (the Qwen3 config holds one sliding_window).
Status checkpointConfigJson(const ModelConfig &config, std::string &text);

/// Writes config.json and model.safetensors to `dir`, and `extraFiles`
/// ({name, text}) beside them, all swapped in as one. `params` holds one
/// bf16 buffer per parameterTable(config) entry, in that order.
Status exportCheckpoint(
    const std::string &dir, const ModelConfig &config,
    const std::vector<const uint16_t *> &params,
    const std::vector<std::pair<std::string, std::string>> &extraFiles = {});

/// Reads an exported checkpoint back into bf16 buffers in parameterTable
/// order, checking config.json (sizes, block size, mask token, taps) and
/// every tensor's name, dtype and shape against `config`. F32 tensors are
/// accepted and rounded to bf16.
Status loadCheckpoint(const std::string &dir, const ModelConfig &config,
                      std::vector<std::vector<uint16_t>> &params);

/// An anchor Rng's state as a checkpoint stores it: Rng::State
/// (runtime/data/Rng.h; BatchLoader.cpp checks that the two are one type),
/// spelled here so that io/ needs nothing from data/.
using RngState = std::array<uint64_t, 4>;

/// Where the data loader stands, so a resumed run reads the rows it would
/// have read.
struct DataPosition {
  int64_t epoch = 0;
  int64_t row = 0; ///< next row within the epoch's order
};

/// The optimizer and loader state to save; fp32 buffers in parameterTable
/// order, read in place.
struct TrainingStateRef {
  int64_t step = 0;    ///< optimizer steps completed
  RngState rngState{}; ///< rank 0's anchor Rng (the only one on one GPU)
  /// The anchor Rngs of ranks 1, 2, ... of a data-parallel run; empty for
  /// one GPU.
  std::vector<RngState> otherRankRngStates;
  DataPosition data; ///< the same on every rank
  /// The source rows skipped so far for non-finite features, ascending: a
  /// resumed run skips them without counting or naming them again.
  std::vector<int64_t> badRows;
  std::vector<const float *> master, adamM, adamV;
};

/// The same state, owning its buffers, as loaded.
struct TrainingState {
  int64_t step = 0;
  RngState rngState{};
  std::vector<RngState> otherRankRngStates;
  DataPosition data;
  std::vector<int64_t> badRows; ///< TrainingStateRef::badRows
  std::vector<std::vector<float>> master, adamM, adamV;
  TrainingStateRef ref() const;

  /// The number of ranks whose anchor Rng the state holds.
  int64_t worldSize() const { return 1 + int64_t(otherRankRngStates.size()); }
  /// Rank `rank`'s anchor Rng state (0 <= rank < worldSize()).
  const RngState &anchorRngState(int64_t rank) const {
    return rank == 0 ? rngState : otherRankRngStates[size_t(rank - 1)];
  }
};

/// A training checkpoint is an exported drafter (config.json and
/// model.safetensors, which serving engines load as they are: vLLM reads
/// every *.safetensors beside config.json) with the state a resume needs in
/// this subfolder, where no engine looks.
constexpr const char *kTrainingDir = "training";
/// The state file, relative to the checkpoint directory.
constexpr const char *kTrainingStateFile = "training/state.safetensors";

/// Writes the files of a training checkpoint into `dir`, an existing
/// directory that the caller stages (StagedDirectory) and commits as
/// `checkpoint`, the name messages give.
Status writeTrainingCheckpointFiles(const std::string &dir,
                                    const std::string &checkpoint,
                                    const ModelConfig &config,
                                    const std::vector<const uint16_t *> &params,
                                    const TrainingStateRef &state);

/// Writes a training checkpoint: writeTrainingCheckpointFiles into a staged
/// directory, swapped in as one.
Status saveTrainingCheckpoint(const std::string &dir, const ModelConfig &config,
                              const std::vector<const uint16_t *> &params,
                              const TrainingStateRef &state);

/// Reads the training state of a training checkpoint, checking every tensor
/// against `config`.
Status loadTrainingState(const std::string &dir, const ModelConfig &config,
                         TrainingState &state);

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_CHECKPOINT_H
