//===- BatchLoader.h - Rows and anchors of each training step ---*- C++ -*-===//
//
// One definition of the data order, shared by the reference executor and the
// generated trainer so that both see the same batches:
// - epoch e visits the rows in a permutation drawn from
//   Rng::forStream(seed, kEpochStream + e);
// - a step consumes worldSize * B consecutive rows of that order (a global
//   batch); rank r takes rows [r*B, (r+1)*B) of it, so ranks read distinct
//   rows; an epoch's remainder smaller than a global batch is skipped;
// - anchors are the rows' pinned ones when the source has them, otherwise
//   sampled per batch (docs/semantics.md section 2) with the rank's own
//   Rng::forStream(seed, kAnchorStream + rank).
// The position (epoch, next row) and the anchor Rng state are what a
// resumable checkpoint stores.
// An evaluation (setEvaluationOrder) reads every row once instead, in source
// order: global batch g holds rows [g*W*B, (g+1)*W*B), and the slots past
// the last row are empty rows, so that every held-out row counts once.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_BATCHLOADER_H
#define DFLASH_RUNTIME_BATCHLOADER_H

#include "runtime/data/AnchorSampler.h"
#include "runtime/data/Rng.h"
#include "runtime/data/RowSource.h"
#include "runtime/io/Checkpoint.h"
#include "schema/ModelConfig.h"

#include <string>
#include <unordered_set>
#include <vector>

namespace dflash::rt {

/// A row skipped for non-finite features: its source row and its name
/// (RowSource::describeRow, with the first bad value's position).
struct SkippedRow {
  int64_t row = -1;
  std::string what;
};

/// The six input arrays of one step on one rank (docs/semantics.md section
/// 1), row-major, owned elsewhere.
struct BatchArrays {
  int32_t *inputIds = nullptr;      ///< [B, S]
  uint8_t *lossMask = nullptr;      ///< [B, S]
  uint16_t *hiddenStates = nullptr; ///< bf16 [B, S, L*H]
  int32_t *anchors = nullptr;       ///< [B, N]
  uint8_t *keep = nullptr;          ///< [B, N]
  int32_t *positionIds = nullptr;   ///< [B, S]
};

/// Where BatchLoader::next writes one step's inputs on one rank: the arrays
/// of a caller (a prefetch slot in pinned memory, so that a long row's
/// features are written once, where the copy to the GPU reads them), and the
/// batch's source rows and skipped rows.
struct BatchBuffers : BatchArrays {
  std::vector<int64_t> *rows = nullptr;
  std::vector<SkippedRow> *skippedRows = nullptr;
};

/// The inputs of one step on one rank, row-major.
struct HostBatch {
  std::vector<int32_t> inputIds;      ///< [B, S]
  std::vector<uint8_t> lossMask;      ///< [B, S]
  std::vector<uint16_t> hiddenStates; ///< bf16 [B, S, L*H]
  std::vector<int32_t> anchors;       ///< [B, N]
  std::vector<uint8_t> keep;          ///< [B, N]
  std::vector<int32_t> positionIds;   ///< [B, S]
  /// Source row of each batch row; -1 for an empty row that pads the
  /// last batch of an evaluation.
  std::vector<int64_t> rows;
  /// The rows of this batch skipped for non-finite features (their slots
  /// hold empty rows), as BatchLoader names them.
  std::vector<SkippedRow> skippedRows;

  void resize(const ModelConfig &config);
  BatchBuffers buffers();
};

class BatchLoader {
public:
  static constexpr uint64_t kEpochStream = 0x45504f4300000000ull;
  static constexpr uint64_t kAnchorStream = 0x414e434800000000ull;

  BatchLoader(const RowSource &source, const ModelConfig &config, uint64_t seed,
              int64_t rank = 0, int64_t worldSize = 1);

  /// Checks that one global batch fits the data.
  Status validate() const;

  /// Fills `batch` with this rank's part of the next global batch. Fails,
  /// naming the row, on a read error, or on a row with a non-finite target
  /// feature once more than maxBadRows() of them were met.
  Status next(HostBatch &batch);
  /// The same into the caller's arrays; every element is written, except
  /// hidden_states where the source has no features (RowSource::hasFeatures).
  Status next(const BatchBuffers &out);

  /// How many rows with non-finite features a run may meet: each is skipped
  /// (its slot becomes an empty row: no supervised token, no kept anchor,
  /// zero features, so the step keeps its shape and the row adds nothing)
  /// and named in HostBatch::skippedRows; the next one past the limit fails.
  /// 0 (the default) fails at the first. A row is counted and named once:
  /// met again in a later epoch it is skipped without being read.
  void setMaxBadRows(int64_t limit) { maxBadRows = limit; }
  /// The distinct rows skipped so far.
  int64_t badRowsSeen() const { return badRows; }
  /// Rows known to be bad before this loader started (a resumed run's,
  /// TrainingState::badRows): skipped without being read, counted or named.
  /// Call before next().
  void addKnownBadRows(const std::vector<int64_t> &sourceRows) {
    knownBadRows.insert(sourceRows.begin(), sourceRows.end());
  }

  /// Reads the rows once in source order, the last global batch padded
  /// with empty rows (see the top of this file); call before next().
  void setEvaluationOrder() { evaluation = true; }
  /// With the evaluation order: the batches that read every row once.
  int64_t batchesPerPass() const;

  DataPosition position() const { return pos; }
  Rng::State anchorRngState() const { return anchorRng.state(); }
  /// Continues from a saved position and anchor Rng state.
  Status seek(const DataPosition &position, const Rng::State &anchorState);

private:
  const RowSource &source;
  const ModelConfig &config;
  uint64_t seed;
  int64_t rank, worldSize;
  DataPosition pos;
  std::vector<int64_t> order; ///< the current epoch's permutation
  int64_t orderEpoch = -1;
  Rng anchorRng;
  AnchorSampler sampler;
  int64_t maxBadRows = 0, badRows = 0;
  bool evaluation = false;
  std::unordered_set<int64_t> knownBadRows; ///< source rows

  void shuffleFor(int64_t epoch);
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_BATCHLOADER_H
