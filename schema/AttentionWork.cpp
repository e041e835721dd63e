//===- AttentionWork.cpp - Block attention at the drawn anchors -----------===//

#include "schema/AttentionWork.h"

#include <algorithm>

using namespace dflash;

double dflash::visiblePairs(const DrawnAnchors &drawn, int64_t window,
                            bool causal) {
  const int64_t bs = drawn.blockSize;
  double pairs = 0;
  for (int64_t r = 0; r < drawn.rows; ++r)
    for (int64_t n = 0; n < drawn.N; ++n) {
      const int64_t i = r * drawn.N + n;
      const int64_t anchor = drawn.anchors[i];
      if (!drawn.keep[i] || anchor < 0 || anchor >= drawn.S)
        continue; // a slot with no block (the loader checks anchors)
      // Keys of the anchor's conversation before it.
      const int64_t before = drawn.positionIds[r * drawn.S + anchor];
      for (int64_t k = 0; k < bs; ++k) {
        const int64_t context =
            window > 0 ? std::max<int64_t>(0, std::min(before, window - 1 - k))
                       : before;
        pairs += double(context + (causal ? k + 1 : bs));
      }
    }
  return pairs;
}

double dflash::drawnStepFlops(double flopsPerStep,
                              const std::vector<AttentionKindFlops> &kinds,
                              const DrawnAnchors &drawn) {
  double flops = flopsPerStep;
  for (const AttentionKindFlops &kind : kinds)
    flops += kind.perPair * visiblePairs(drawn, kind.window, kind.causal) -
             kind.counted;
  return flops;
}
