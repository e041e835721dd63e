//===- DraftBlocks.cpp - Draft-block bookkeeping of the reference ---------===//
//
// Positions, draft tokens, labels and loss weights of the draft blocks
// (docs/semantics.md sections 3, 4 and 9).
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"

#include <cmath>

namespace dflash::ref {

void draftPositions(const int32_t *anchors, const int32_t *positionIds,
                    int32_t *out, int64_t B, int64_t S, int64_t N, int64_t bs) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < bs; ++k)
        out[(b * N + n) * bs + k] =
            static_cast<int32_t>(positionIds[b * S + anchors[b * N + n]] + k);
}

void draftTokens(const int32_t *inputIds, const int32_t *anchors,
                 const uint8_t *keep, int32_t *out, int64_t B, int64_t S,
                 int64_t N, int64_t bs, int64_t maskTokenId) {
  const auto mask = static_cast<int32_t>(maskTokenId);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t n = 0; n < N; ++n) {
      int32_t *block = out + (b * N + n) * bs;
      // Only the anchor token is read, and only for a used slot: the anchor
      // of an unused slot carries no meaning.
      block[0] = keep[b * N + n] ? inputIds[b * S + anchors[b * N + n]] : mask;
      for (int64_t k = 1; k < bs; ++k)
        block[k] = mask;
    }
  }
}

template <typename T>
void draftTargets(const int32_t *inputIds, const uint8_t *lossMask,
                  const int32_t *anchors, const uint8_t *keep,
                  const int32_t *positionIds, int32_t *labels, T *weights,
                  int64_t B, int64_t S, int64_t N, int64_t bs, double gamma) {
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t anchor = anchors[b * N + n];
      const bool used = keep[b * N + n] != 0;
      for (int64_t k = 0; k < bs; ++k) {
        const int64_t slot = (b * N + n) * bs + k;
        // Same position, no shift: output (n, k) predicts token anchor + k.
        const int64_t target = anchor + k;
        const bool inside = target >= 0 && target < S;
        labels[slot] = inside ? inputIds[b * S + target] : 0;
        // k = 0 is the anchor token itself, given as input: never a target;
        // nor is a token of the next conversation in a packed row.
        if (!used || !inside || k == 0 || !lossMask[b * S + target] ||
            positionIds[b * S + target] != positionIds[b * S + anchor] + k) {
          weights[slot] = T(0);
          continue;
        }
        const double decay =
            gamma > 0 ? std::exp(-static_cast<double>(k - 1) / gamma) : 1.0;
        weights[slot] = static_cast<T>(decay);
      }
    }
  }
}

template void draftTargets<float>(const int32_t *, const uint8_t *,
                                  const int32_t *, const uint8_t *,
                                  const int32_t *, int32_t *, float *, int64_t,
                                  int64_t, int64_t, int64_t, double);
template void draftTargets<double>(const int32_t *, const uint8_t *,
                                   const int32_t *, const uint8_t *,
                                   const int32_t *, int32_t *, double *,
                                   int64_t, int64_t, int64_t, int64_t, double);

} // namespace dflash::ref
