//===- Acceptance.cpp - Acceptance length of the reference ----------------===//
//
// docs/semantics.md section 10: how many tokens greedy verification accepts per
// drafted block, from the per-slot hits of the lm_head cross-entropy; also
// per bucket of anchor position (section 14).
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"

#include "kernels/BlockRun.h"

namespace dflash::ref {

template <typename T>
AcceptanceSums draftAcceptance(const uint8_t *hits, const T *weights,
                               const uint8_t *keep, int64_t B, int64_t N,
                               int64_t bs, const AnchorPositions &where) {
  AcceptanceSums sums;
  for (int64_t block = 0; block < B * N; ++block) {
    if (!keep[block])
      continue;
    const uint8_t *hit = hits + block * bs;
    const T *w = weights + block * bs;
    // Slot 0 holds the anchor's own token: it is given, never drafted.
    const int64_t run = kernels::blockRun(hit, w, bs);
    sums.runSum += 1 + run;
    sums.keptBlocks += 1;
    double blockHits = 0, blockCounts = 0;
    for (int64_t k = 1; k < bs; ++k) {
      if (!(w[k] > 0))
        continue;
      sums.positionCounts[k] += 1;
      sums.positionHits[k] += hit[k] ? 1 : 0;
      blockCounts += 1;
      blockHits += hit[k] ? 1 : 0;
    }
    // The bucket of the anchor's position in its conversation (section 14).
    int64_t j = 0;
    if (where.anchors) {
      int64_t b = block / N;
      int64_t position = where.positionIds[b * where.S + where.anchors[block]];
      while (j < where.numEdges && where.edges[j] <= position)
        ++j;
    }
    sums.bucketRuns[j] += 1 + run;
    sums.bucketBlocks[j] += 1;
    sums.bucketHits[j] += blockHits;
    sums.bucketCounts[j] += blockCounts;
  }
  return sums;
}

template AcceptanceSums draftAcceptance<float>(const uint8_t *, const float *,
                                               const uint8_t *, int64_t,
                                               int64_t, int64_t,
                                               const AnchorPositions &);
template AcceptanceSums draftAcceptance<double>(const uint8_t *, const double *,
                                                const uint8_t *, int64_t,
                                                int64_t, int64_t,
                                                const AnchorPositions &);

} // namespace dflash::ref
