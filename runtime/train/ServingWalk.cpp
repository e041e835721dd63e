//===- ServingWalk.cpp - Acceptance in the order a server drafts ----------===//

#include "runtime/train/ServingWalk.h"

#include "kernels/BlockRun.h"
#include "runtime/data/AnchorSampler.h"

#include <algorithm>
#include <cmath>

using namespace dflash::rt;

double ServingSums::tau() const {
  return blocks > 0 ? runs / blocks : std::nan("");
}

ServingSums dflash::rt::walkServingOrder(const std::vector<int32_t> &candidates,
                                         const std::vector<int32_t> &runs) {
  ServingSums sums;
  auto next = candidates.begin();
  while (next != candidates.end()) {
    const size_t i = size_t(next - candidates.begin());
    const int64_t run = i < runs.size() ? runs[i] : 0;
    sums.runs += double(1 + run);
    sums.blocks += 1;
    // The server accepted `run` drafted tokens and the target's next one:
    // the next block is anchored there, or at the first candidate after.
    const int64_t following = int64_t(*next) + 1 + run;
    next = std::lower_bound(next + 1, candidates.end(), following);
  }
  return sums;
}

int64_t dflash::rt::defaultServingRows(int64_t seqLen) {
  constexpr int64_t kTokens = 131072;
  return seqLen > 0 ? std::max<int64_t>(1, (kTokens + seqLen - 1) / seqLen) : 1;
}

ServingWalk::ServingWalk(int64_t B, int64_t S, int64_t N, int64_t bs)
    : B(B), S(S), N(N), bs(bs), candidates(size_t(B)), runs(size_t(B)) {}

void ServingWalk::start(const uint8_t *lossMask, const int32_t *positionIds,
                        const std::vector<bool> &walked) {
  passCount = 0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> &c = candidates[size_t(b)];
    c.clear();
    if (size_t(b) < walked.size() && walked[size_t(b)])
      anchorCandidates(lossMask + b * S,
                       positionIds ? positionIds + b * S : nullptr, S, c);
    runs[size_t(b)].assign(c.size(), 0);
    passCount = std::max(passCount, (int64_t(c.size()) + N - 1) / N);
  }
}

void ServingWalk::anchorsOfPass(int64_t p, int32_t *anchors,
                                uint8_t *keep) const {
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t> &c = candidates[size_t(b)];
    for (int64_t n = 0; n < N; ++n) {
      const int64_t i = p * N + n;
      const bool filled = i < int64_t(c.size());
      anchors[b * N + n] = filled ? c[size_t(i)] : 0;
      keep[b * N + n] = filled ? 1 : 0;
    }
  }
}

void ServingWalk::record(int64_t p, const uint8_t *hits, const float *weights) {
  const int64_t Q = N * bs;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t i = p * N + n;
      if (i >= int64_t(runs[size_t(b)].size()))
        break;
      const int64_t slot = b * Q + n * bs;
      runs[size_t(b)][size_t(i)] =
          int32_t(dflash::kernels::blockRun(hits + slot, weights + slot, bs));
    }
}

ServingSums ServingWalk::sums() const {
  ServingSums total;
  for (int64_t b = 0; b < B; ++b)
    total += walkServingOrder(candidates[size_t(b)], runs[size_t(b)]);
  return total;
}
