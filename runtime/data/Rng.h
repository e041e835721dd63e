//===- Rng.h - Deterministic random numbers for the runtime -----*- C++ -*-===//
//
// xoshiro256** seeded through splitmix64. Every draw is defined here, not by
// the standard library's distributions (whose results differ between
// implementations), so anchors, synthetic data and initial weights are the
// same bits on every machine and can be reproduced by other implementations.
// The whole state is four words, saved in resumable checkpoints.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_RNG_H
#define DFLASH_RUNTIME_RNG_H

#include "schema/Status.h"

#include <array>
#include <cstdint>

namespace dflash::rt {

/// The splitmix64 step: advances `state` and returns the next output.
uint64_t splitMix64(uint64_t &state);

class Rng {
public:
  using State = std::array<uint64_t, 4>;

  /// Seeds the four state words with consecutive splitmix64 outputs of `seed`.
  explicit Rng(uint64_t seed = 0);

  /// An independent stream for one purpose or rank: the generator seeded
  /// with a splitmix64 mix of (seed, streamId). Streams of different ids do
  /// not share their sequences in any practical sense.
  static Rng forStream(uint64_t seed, uint64_t streamId);

  /// The next 64 random bits.
  uint64_t next();
  /// Uniform in [0, n), unbiased (Lemire's multiply-and-reject); 0 when n is 0.
  uint64_t uniform(uint64_t n);
  /// Uniform in [0, 1) with 53 random bits.
  double uniform01();
  /// Standard normal by Box-Muller: two uniforms per draw, the cosine branch
  /// only, so that the state alone determines the sequence.
  double normal();

  State state() const { return words; }
  /// Restores a saved state; the all-zero state (never reached by the
  /// generator) is rejected.
  Status restore(const State &saved);

private:
  State words{};
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_RNG_H
