//===- CrossEntropy.cpp - lm_head + weighted cross-entropy reference ------===//
//
// The loss of docs/semantics.md section 4 and its gradient with respect to the
// final hidden states, on the logits as they are or (a DFlash2 drafter's
// CE_u, section 13) through its unary transform. Logits are formed a few rows
// at a time so the scratch stays small at full vocabularies.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/LogSumExp.h"
#include "kernels/reference/Reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dflash::ref {

namespace {

constexpr int64_t kRowsPerChunk = 64;

/// Rows with a nonzero weight, the only ones that reach the loss, gathered
/// in chunks of at most kRowsPerChunk.
template <typename T>
std::vector<int64_t> weightedRows(const T *weights, int64_t rows) {
  std::vector<int64_t> selected;
  for (int64_t r = 0; r < rows; ++r)
    if (weights[r] != T(0))
      selected.push_back(r);
  return selected;
}

/// Gathers y rows [first, first + count) of `selected` into `chunk`.
template <typename T>
void gatherRows(const T *y, const std::vector<int64_t> &selected, int64_t first,
                int64_t count, int64_t H, std::vector<T> &chunk) {
  chunk.resize(count * H);
  for (int64_t i = 0; i < count; ++i)
    std::copy(y + selected[first + i] * H, y + selected[first + i] * H + H,
              chunk.begin() + i * H);
}

} // namespace

template <typename T>
CrossEntropySums
lmHeadCrossEntropy(const T *y, const T *w, const int32_t *labels,
                   const T *weights, int64_t rows, int64_t V, int64_t H,
                   uint8_t *hits, const UnaryTransform &transform) {
  CrossEntropySums sums;
  if (hits)
    std::fill(hits, hits + rows, uint8_t(0));
  const std::vector<int64_t> selected = weightedRows(weights, rows);
  const auto total = static_cast<int64_t>(selected.size());
  std::vector<T> chunk, logits;
  for (int64_t first = 0; first < total; first += kRowsPerChunk) {
    const int64_t count = std::min(kRowsPerChunk, total - first);
    gatherRows(y, selected, first, count, H, chunk);
    logits.resize(count * V);
    linear(chunk.data(), w, logits.data(), count, V, H);
    if (!transform.identity())
      unaryTransform(logits.data(), logits.data(), count * V, transform);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = selected[first + i];
      const T *rowLogits = logits.data() + i * V;
      const double weight = weights[r];
      const double ce =
          logSumExp(rowLogits, V) - static_cast<double>(rowLogits[labels[r]]);
      sums.lossSum += weight * ce;
      sums.weightSum += weight;
      if (weight > 0) {
        // max_element returns the first of equal maxima.
        const int64_t argmax =
            std::max_element(rowLogits, rowLogits + V) - rowLogits;
        sums.count += 1;
        sums.correct += argmax == labels[r] ? 1 : 0;
        if (hits)
          hits[r] = argmax == labels[r] ? 1 : 0;
      }
    }
  }
  return sums;
}

// d(w_r CE_r)/du_r = w_r (softmax(u_r) - onehot(label_r)), u = T(z);
// dz = T'(z) du; dy = dz W.
template <typename T>
void lmHeadCrossEntropyGrad(const T *y, const T *w, const int32_t *labels,
                            const T *weights, double dLossSum, T *dy,
                            int64_t rows, int64_t V, int64_t H,
                            const UnaryTransform &transform) {
  std::fill(dy, dy + rows * H, T(0));
  const std::vector<int64_t> selected = weightedRows(weights, rows);
  const auto total = static_cast<int64_t>(selected.size());
  const bool identity = transform.identity();
  std::vector<T> chunk, logits, z, dChunk;
  for (int64_t first = 0; first < total; first += kRowsPerChunk) {
    const int64_t count = std::min(kRowsPerChunk, total - first);
    gatherRows(y, selected, first, count, H, chunk);
    logits.resize(count * V);
    linear(chunk.data(), w, logits.data(), count, V, H);
    if (!identity) {
      z = logits; // T'(z) needs the logits before the transform
      unaryTransform(logits.data(), logits.data(), count * V, transform);
    }
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = selected[first + i];
      T *rowLogits = logits.data() + i * V;
      const double lse = logSumExp(rowLogits, V);
      const double rowScale = dLossSum * static_cast<double>(weights[r]);
      // The logits buffer becomes dlogits in place.
      for (int64_t v = 0; v < V; ++v) {
        const double p = std::exp(static_cast<double>(rowLogits[v]) - lse);
        rowLogits[v] = static_cast<T>(rowScale * (v == labels[r] ? p - 1 : p));
      }
    }
    if (!identity)
      unaryTransformGrad(logits.data(), z.data(), logits.data(), count * V,
                         transform);
    dChunk.resize(count * H);
    linearGradInput(logits.data(), w, dChunk.data(), count, V, H);
    for (int64_t i = 0; i < count; ++i)
      std::copy(dChunk.begin() + i * H, dChunk.begin() + (i + 1) * H,
                dy + selected[first + i] * H);
  }
}

#define DFLASH_INSTANTIATE_CROSS_ENTROPY(T)                                    \
  template CrossEntropySums lmHeadCrossEntropy<T>(                             \
      const T *, const T *, const int32_t *, const T *, int64_t, int64_t,      \
      int64_t, uint8_t *, const UnaryTransform &);                             \
  template void lmHeadCrossEntropyGrad<T>(                                     \
      const T *, const T *, const int32_t *, const T *, double, T *, int64_t,  \
      int64_t, int64_t, const UnaryTransform &);

DFLASH_INSTANTIATE_CROSS_ENTROPY(float)
DFLASH_INSTANTIATE_CROSS_ENTROPY(double)
#undef DFLASH_INSTANTIATE_CROSS_ENTROPY

} // namespace dflash::ref
