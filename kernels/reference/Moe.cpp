//===- Moe.cpp - Mixture-of-experts reference -----------------------------===//
//
// A Qwen3-MoE or gpt-oss sparse MLP as four steps: routing, grouping the routed
// rows by expert, the experts' GEMMs, and the weighted sum back to the tokens.
// Double throughout; callers that emulate bf16 round what they store.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace dflash::ref {

void moeRoute(const double *logits, double *weights, int32_t *experts,
              int64_t T, int64_t E, int64_t k, bool normalize,
              MoeScoring scoring) {
  std::vector<double> p(E);
  std::vector<int32_t> order(E);
  for (int64_t t = 0; t < T; ++t) {
    const double *row = logits + t * E;
    if (scoring == MoeScoring::SoftmaxTopK) {
      double top = *std::max_element(row, row + E), sum = 0;
      for (int64_t e = 0; e < E; ++e)
        sum += p[e] = std::exp(row[e] - top);
      for (int64_t e = 0; e < E; ++e)
        p[e] /= sum;
    } else {
      std::copy(row, row + E, p.begin());
    }
    std::iota(order.begin(), order.end(), 0);
    // Descending score; equal ones keep the lower expert first.
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    if (scoring == MoeScoring::TopKSoftmax) {
      // Softmax over the chosen logits (the first is the largest).
      const double top = p[order[0]];
      double sum = 0;
      for (int64_t j = 0; j < k; ++j)
        sum += std::exp(p[order[j]] - top);
      for (int64_t j = 0; j < k; ++j) {
        experts[t * k + j] = order[j];
        weights[t * k + j] = std::exp(p[order[j]] - top) / sum;
      }
      continue;
    }
    double kept = 0;
    for (int64_t j = 0; j < k; ++j)
      kept += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      experts[t * k + j] = order[j];
      weights[t * k + j] = normalize ? p[order[j]] / kept : p[order[j]];
    }
  }
}

void moePermute(const double *x, const int32_t *experts, double *permuted,
                int32_t *offsets, int32_t *source, int64_t T, int64_t H,
                int64_t k, int64_t E) {
  std::vector<int64_t> count(E + 1, 0);
  for (int64_t s = 0; s < T * k; ++s)
    ++count[experts[s] + 1];
  for (int64_t e = 0; e < E; ++e)
    count[e + 1] += count[e];
  for (int64_t e = 0; e <= E; ++e)
    offsets[e] = int32_t(count[e]);
  std::vector<int64_t> next(count.begin(), count.end() - 1);
  for (int64_t s = 0; s < T * k; ++s) {
    int64_t r = next[experts[s]]++;
    source[r] = int32_t(s);
    std::copy(x + (s / k) * H, x + (s / k + 1) * H, permuted + r * H);
  }
}

void groupedLinear(const double *x, const double *w, const int32_t *offsets,
                   double *y, int64_t E, int64_t N, int64_t K,
                   const double *bias) {
  for (int64_t e = 0; e < E; ++e) {
    int64_t rows = offsets[e + 1] - offsets[e];
    if (rows <= 0)
      continue;
    double *ye = y + int64_t(offsets[e]) * N;
    linear<double>(x + int64_t(offsets[e]) * K, w + e * N * K, ye, rows, N, K);
    if (bias)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < N; ++c)
          ye[r * N + c] += bias[e * N + c];
  }
}

void moeUnpermute(const double *permuted, const int32_t *source,
                  const double *weights, double *y, int64_t T, int64_t H,
                  int64_t k) {
  std::fill(y, y + T * H, 0.0);
  for (int64_t r = 0; r < T * k; ++r) {
    int64_t s = source[r], t = s / k;
    for (int64_t h = 0; h < H; ++h)
      y[t * H + h] += weights[s] * permuted[r * H + h];
  }
}

} // namespace dflash::ref
