//===- Synthetic.h - A learnable synthetic problem --------------*- C++ -*-===//
//
// A stand-in for a real target and its data, deterministic from a seed, for
// smoke runs, benchmarks and parity tests between implementations:
// - tokens follow a Markov chain: each token t has a fixed successor
//   succ[t]; the next token is succ[t] with probability 0.8, else uniform
//   (the mask token never occurs);
// - a row is a prompt (loss_mask 0) of S/8..S/4 tokens, then the answer
//   (loss_mask 1); a quarter of the rows end early and are right-padded
//   (token 0, loss_mask 0, zero features);
// - the feature of tapped layer l at position t is
//   sum_j c_j * sign[l,j,h] * embed[tok[t+o_j], perm[l,j,h]] / 0.05 + noise
//   over the offsets o = 0, bs, bs+1 (c = 1, 0.75, 0.5; terms past the row's
//   end left out): a fixed random signed permutation per (layer, offset).
//   The context thus carries the current token and the tokens one block
//   ahead, so every slot k of a block finds its label at the same relative
//   position a+k-bs: a problem a small drafter learns in a few hundred steps
//   (loss falls by half on specs/tiny.toml within 200 steps). It costs
//   O(S * L * H) per row, so it also serves benchmark-sized specs;
// - embed is N(0, 0.05) in bf16 and lm_head holds the same values (one
//   tensor when tied), so decoding a token needs no learned vocabulary map;
// - the drafter's initial weights are initialParameters(config, seed).
// Row i depends only on (seed, i).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_SYNTHETIC_H
#define DFLASH_RUNTIME_SYNTHETIC_H

#include "runtime/data/RowSource.h"
#include "runtime/io/TargetWeights.h"
#include "schema/ModelConfig.h"
#include "schema/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::rt {

class SyntheticProblem {
public:
  /// Builds the chain, the projections and the target tensors. Fails on an
  /// invalid config or a vocabulary without two ordinary tokens.
  Status init(const ModelConfig &config, uint64_t seed);

  const ModelConfig &config() const { return cfg; }
  uint64_t seed() const { return problemSeed; }
  /// The synthetic target's embedding and lm_head.
  const TargetWeights &target() const { return weights; }
  /// The likely successor of `token` in the chain.
  int32_t successor(int32_t token) const { return successors[size_t(token)]; }

  /// Writes row `index` (any index >= 0): inputIds [S], lossMask [S],
  /// hiddenStates bf16 [S, L*H].
  void generateRow(int64_t index, int32_t *inputIds, uint8_t *lossMask,
                   uint16_t *hiddenStates) const;
  /// Pinned anchors of row `index` given its loss mask: the AnchorSampler
  /// on that row alone with Rng::forStream(seed, anchor stream + index).
  /// Per-row sampling draws what the batch rule would, since
  /// min(min(N, max count), count) = min(N, count).
  void pinnedAnchors(int64_t index, const uint8_t *lossMask, int32_t *anchors,
                     uint8_t *keep) const;
  /// The drafter's initial bf16 parameters (parameterTable order).
  std::vector<std::vector<uint16_t>> initialParameters() const;

private:
  static constexpr int kOffsets = 3;
  ModelConfig cfg;
  uint64_t problemSeed = 0;
  TargetWeights weights;
  std::vector<int32_t> successors;  ///< [V]
  std::vector<int32_t> permutation; ///< [L, kOffsets, H]
  std::vector<float> coefficient;   ///< [L, kOffsets, H]: c_j * sign / 0.02
};

/// The synthetic problem's rows as a RowSource of `rows` rows; `problem`
/// must outlive it.
class SyntheticRowSource : public RowSource {
public:
  /// Rows firstRow .. firstRow + rows - 1 of the problem: a held-out set
  /// is rows past the training set's.
  SyntheticRowSource(const SyntheticProblem &problem, int64_t rows,
                     bool pinAnchors, int64_t firstRow = 0)
      : problem(problem), rows(rows), firstRow(firstRow),
        pinAnchors(pinAnchors) {}
  int64_t numRows() const override { return rows; }
  bool hasPinnedAnchors() const override { return pinAnchors; }
  Status readRow(int64_t index, const RowBuffers &out) const override;

  /// Generates every row once, on all cores, and serves later reads from
  /// memory: at the size of a real drafter a row takes about half a second
  /// to make, far longer than a GPU step.
  void materialize();
  /// Host bytes materialize() needs.
  size_t materializedBytes() const {
    const ModelConfig &c = problem.config();
    return size_t(rows) * size_t(c.seqLen) *
           (4 + 1 + 2 * size_t(c.contextWidth()));
  }

private:
  const SyntheticProblem &problem;
  int64_t rows, firstRow;
  bool pinAnchors;
  bool materialized = false;
  std::vector<int32_t> cachedIds;
  std::vector<uint8_t> cachedMask;
  std::vector<uint16_t> cachedHidden;
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_SYNTHETIC_H
