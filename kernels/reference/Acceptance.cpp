//===- Acceptance.cpp - Acceptance length of the reference ----------------===//
//
// docs/semantics.md section 10: how many tokens greedy verification accepts per
// drafted block, from the per-slot hits of the lm_head cross-entropy.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"

namespace dflash::ref {

template <typename T>
AcceptanceSums draftAcceptance(const uint8_t *hits, const T *weights,
                               const uint8_t *keep, int64_t B, int64_t N,
                               int64_t bs) {
  AcceptanceSums sums;
  for (int64_t block = 0; block < B * N; ++block) {
    if (!keep[block])
      continue;
    const uint8_t *hit = hits + block * bs;
    const T *w = weights + block * bs;
    // Slot 0 holds the anchor's own token: it is given, never drafted.
    int64_t run = 0;
    while (run + 1 < bs && w[run + 1] > 0 && hit[run + 1])
      ++run;
    sums.runSum += 1 + run;
    sums.keptBlocks += 1;
    for (int64_t k = 1; k < bs; ++k) {
      if (!(w[k] > 0))
        continue;
      sums.positionCounts[k] += 1;
      sums.positionHits[k] += hit[k] ? 1 : 0;
    }
  }
  return sums;
}

template AcceptanceSums draftAcceptance<float>(const uint8_t *, const float *,
                                               const uint8_t *, int64_t,
                                               int64_t, int64_t);
template AcceptanceSums draftAcceptance<double>(const uint8_t *, const double *,
                                                const uint8_t *, int64_t,
                                                int64_t, int64_t);

} // namespace dflash::ref
