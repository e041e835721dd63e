//===- AnchorSampler.cpp - Per-step anchor sampling -----------------------===//

#include "runtime/data/AnchorSampler.h"

#include <algorithm>

using namespace dflash;
using namespace dflash::rt;

/// Whether a (0 <= a < S - 1) is a candidate.
static bool isCandidate(const uint8_t *lossMask, const int32_t *positionIds,
                        int64_t a) {
  return lossMask[a] && lossMask[a + 1] &&
         (!positionIds || positionIds[a + 1] == positionIds[a] + 1);
}

void dflash::rt::anchorCandidates(const uint8_t *lossMask,
                                  const int32_t *positionIds, int64_t S,
                                  std::vector<int32_t> &out) {
  for (int64_t a = 0; a + 1 < S; ++a)
    if (isCandidate(lossMask, positionIds, a))
      out.push_back(int32_t(a));
}

int64_t dflash::rt::countAnchorCandidates(const uint8_t *lossMask,
                                          const int32_t *positionIds,
                                          int64_t S) {
  int64_t count = 0;
  for (int64_t a = 0; a + 1 < S; ++a)
    count += isCandidate(lossMask, positionIds, a) ? 1 : 0;
  return count;
}

int64_t AnchorSampler::sample(const uint8_t *lossMask,
                              const int32_t *positionIds, Rng &rng,
                              int32_t *anchors, uint8_t *keep) {
  candidates.resize(size_t(B));
  int64_t maxCount = 0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> &rowCandidates = candidates[size_t(b)];
    rowCandidates.clear();
    anchorCandidates(lossMask + b * S,
                     positionIds ? positionIds + b * S : nullptr, S,
                     rowCandidates);
    maxCount = std::max(maxCount, int64_t(rowCandidates.size()));
  }
  int64_t nEff = std::min(N, maxCount);

  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> &c = candidates[size_t(b)];
    int64_t count = int64_t(c.size());
    int64_t draws = std::min(nEff, count);
    for (int64_t i = 0; i < draws; ++i) {
      int64_t j = i + int64_t(rng.uniform(uint64_t(count - i)));
      std::swap(c[size_t(i)], c[size_t(j)]);
    }
    std::sort(c.begin(), c.begin() + draws);
    int32_t *rowAnchors = anchors + b * N;
    uint8_t *rowKeep = keep + b * N;
    for (int64_t n = 0; n < N; ++n) {
      bool used = n < draws;
      rowAnchors[n] = used ? c[size_t(n)] : 0;
      rowKeep[n] = used ? 1 : 0;
    }
  }
  return nEff;
}
