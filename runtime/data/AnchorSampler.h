//===- AnchorSampler.h - Per-step anchor sampling ---------------*- C++ -*-===//
//
// docs/semantics.md section 2. Candidates of row b are the positions a in
// [0, S-2] with loss_mask[b, a] and loss_mask[b, a+1] set and, in a packed
// row, a + 1 in a's conversation (position_ids[b, a+1] = position_ids[b, a]
// + 1; section 9). With
// N_eff = min(N, max over the batch of candidate counts), each row draws
// min(N_eff, its count) distinct candidates uniformly without replacement,
// sorts them ascending and marks the remaining slots anchor = 0, keep = 0.
//
// Draw order, for implementations that want the same anchors from the same
// Rng state: rows in order; in row b with candidates c[0..C) ascending and
// k = min(N_eff, C) draws, for i in [0, k): j = i + rng.uniform(C - i),
// swap(c[i], c[j]) (a partial Fisher-Yates shuffle); then c[0..k) is sorted.
// Rows without candidates draw nothing.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_ANCHORSAMPLER_H
#define DFLASH_RUNTIME_ANCHORSAMPLER_H

#include "runtime/data/Rng.h"

#include <cstdint>
#include <vector>

namespace dflash::rt {

/// Appends the anchor candidates of one row (lossMask [S], positionIds [S]
/// or null for an unpacked row) to `out`, ascending.
void anchorCandidates(const uint8_t *lossMask, const int32_t *positionIds,
                      int64_t S, std::vector<int32_t> &out);

/// Number of anchor candidates of one row (as anchorCandidates).
int64_t countAnchorCandidates(const uint8_t *lossMask,
                              const int32_t *positionIds, int64_t S);

/// Samples anchors for batches of a fixed shape; keeps its scratch buffers
/// between calls so a training loop allocates nothing per step.
class AnchorSampler {
public:
  AnchorSampler(int64_t rows, int64_t seqLen, int64_t anchorsPerRow)
      : B(rows), S(seqLen), N(anchorsPerRow) {}

  /// lossMask [B, S] and positionIds [B, S] (null: unpacked rows) in;
  /// anchors int32 [B, N] and keep uint8 [B, N] out. Returns N_eff.
  int64_t sample(const uint8_t *lossMask, const int32_t *positionIds, Rng &rng,
                 int32_t *anchors, uint8_t *keep);

  int64_t rows() const { return B; }
  int64_t seqLen() const { return S; }
  int64_t anchorsPerRow() const { return N; }

private:
  int64_t B, S, N;
  std::vector<std::vector<int32_t>> candidates; ///< per row
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_ANCHORSAMPLER_H
