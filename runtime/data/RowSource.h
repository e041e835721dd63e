//===- RowSource.h - Where training rows come from --------------*- C++ -*-===//
//
// The trainer reads rows (docs/semantics.md section 1, one row of each input)
// through this interface, from feature shards on disk (FeatureShardReader)
// or from the synthetic problem in memory (SyntheticRowSource). readRow is
// const and safe to call from a prefetch thread while others read too.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_ROWSOURCE_H
#define DFLASH_RUNTIME_ROWSOURCE_H

#include "schema/Status.h"

#include <cstdint>
#include <string>

namespace dflash::rt {

/// Destination of one row; sizes from the ModelConfig (S = seqLen,
/// N = anchorsPerRow, L*H = contextWidth()).
struct RowBuffers {
  int32_t *inputIds = nullptr;      ///< [S]
  uint8_t *lossMask = nullptr;      ///< [S]
  uint16_t *hiddenStates = nullptr; ///< bf16 [S, L*H]
  /// Pinned anchors, filled only when the source has them and these are
  /// non-null.
  int32_t *anchors = nullptr; ///< [N]
  uint8_t *keep = nullptr;    ///< [N]
  /// [S]: each token's position in its conversation (docs/semantics.md section
  /// 9); sources without packed rows write arange(S).
  int32_t *positionIds = nullptr;
};

class RowSource {
public:
  virtual ~RowSource() = default;
  /// Number of rows in one pass over the data.
  virtual int64_t numRows() const = 0;
  /// Whether rows carry pinned anchors (then the trainer uses them instead of
  /// sampling).
  virtual bool hasPinnedAnchors() const = 0;
  /// Whether readRow writes hidden_states (token shards do not: the online
  /// target computes the features on the GPU).
  virtual bool hasFeatures() const { return true; }
  /// Copies row `index` (0 <= index < numRows()).
  virtual Status readRow(int64_t index, const RowBuffers &out) const = 0;
  /// Where row `index` comes from, for messages ("data/shard-1.safetensors
  /// row 3").
  virtual std::string describeRow(int64_t index) const {
    return "row " + std::to_string(index);
  }
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_ROWSOURCE_H
