//===- Attention.cpp - Block-prefix attention reference -------------------===//
//
// The attention of docs/semantics.md section 3, item 4, computed query by query
// over exactly the keys the query may see, and its gradient.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace dflash::ref {

namespace {

/// The keys query (n, k) of one row sees: context rows [contextBegin,
/// contextEnd) and draft rows [draftBegin, draftEnd), the draft rows counted
/// in Q = N*bs.
struct VisibleKeys {
  int64_t contextBegin = 0, contextEnd = 0, draftBegin = 0, draftEnd = 0;
};

/// Block n of a row (its anchors, keep and position_ids at that row), row k
/// of the block.
VisibleKeys visibleKeys(const AttentionShape &shape, const int32_t *anchors,
                        const uint8_t *keep, const int32_t *positionIds,
                        int64_t n, int64_t k) {
  VisibleKeys keys;
  if (!keep[n])
    return keys;
  const int64_t anchor = anchors[n];
  // Strictly before the anchor: the target feature at the anchor itself is
  // not available at inference time.
  keys.contextEnd = std::clamp<int64_t>(anchor, 0, shape.S);
  // From the start of the anchor's conversation (0 in an unpacked row).
  const int64_t start =
      anchor - positionIds[std::clamp<int64_t>(anchor, 0, shape.S - 1)];
  keys.contextBegin = std::clamp<int64_t>(start, 0, keys.contextEnd);
  if (shape.window > 0)
    keys.contextBegin = std::clamp<int64_t>(anchor + k - (shape.window - 1),
                                            keys.contextBegin, keys.contextEnd);
  keys.draftBegin = n * shape.bs;
  keys.draftEnd = shape.causal ? n * shape.bs + k + 1 : (n + 1) * shape.bs;
  return keys;
}

/// Row `key` of one row's [context (S rows) | draft (Q rows)] key or value
/// rows, kv head `group`.
template <typename T> struct KeyValueRows {
  const T *context;
  const T *draft;
  int64_t S, nkv, d;

  const T *row(int64_t key, int64_t group) const {
    return key < S ? context + (key * nkv + group) * d
                   : draft + ((key - S) * nkv + group) * d;
  }
};

template <typename T> double dot(const T *a, const T *b, int64_t d) {
  double sum = 0;
  for (int64_t c = 0; c < d; ++c)
    sum += static_cast<double>(a[c]) * static_cast<double>(b[c]);
  return sum;
}

/// Calls f(key) for every visible key, context first, keys indexed in
/// [0, S + Q).
template <typename F> void forEachKey(const VisibleKeys &keys, int64_t S, F f) {
  for (int64_t j = keys.contextBegin; j < keys.contextEnd; ++j)
    f(j);
  for (int64_t j = keys.draftBegin; j < keys.draftEnd; ++j)
    f(S + j);
}

} // namespace

template <typename T>
void blockAttention(const T *q, const T *contextKeys, const T *contextValues,
                    const T *draftKeys, const T *draftValues,
                    const int32_t *anchors, const uint8_t *keep,
                    const int32_t *positionIds, T *out, T *lse,
                    const AttentionShape &shape) {
  const int64_t S = shape.S, N = shape.N, bs = shape.bs, Q = shape.Q();
  const int64_t nh = shape.nh, nkv = shape.nkv, d = shape.d;
  const int64_t headsPerGroup = nh / nkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> scores, acc(d);
  for (int64_t b = 0; b < shape.B; ++b) {
    const KeyValueRows<T> keyRows{contextKeys + b * S * nkv * d,
                                  draftKeys + b * Q * nkv * d, S, nkv, d};
    const KeyValueRows<T> valueRows{contextValues + b * S * nkv * d,
                                    draftValues + b * Q * nkv * d, S, nkv, d};
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < bs; ++k) {
        const VisibleKeys keys = visibleKeys(
            shape, anchors + b * N, keep + b * N, positionIds + b * S, n, k);
        const int64_t query = b * Q + n * bs + k;
        for (int64_t h = 0; h < nh; ++h) {
          const int64_t group = h / headsPerGroup;
          const T *qRow = q + (query * nh + h) * d;
          T *outRow = out + (query * nh + h) * d;
          scores.clear();
          forEachKey(keys, S, [&](int64_t key) {
            scores.push_back(scale * dot(qRow, keyRows.row(key, group), d));
          });
          if (scores.empty()) {
            std::fill(outRow, outRow + d, T(0));
            lse[query * nh + h] = -std::numeric_limits<T>::infinity();
            continue;
          }
          const double maxScore =
              *std::max_element(scores.begin(), scores.end());
          double sum = 0;
          for (double &score : scores) {
            score = std::exp(score - maxScore);
            sum += score;
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          size_t index = 0;
          forEachKey(keys, S, [&](int64_t key) {
            const double p = scores[index++] / sum;
            const T *vRow = valueRows.row(key, group);
            for (int64_t c = 0; c < d; ++c)
              acc[c] += p * static_cast<double>(vRow[c]);
          });
          for (int64_t c = 0; c < d; ++c)
            outRow[c] = static_cast<T>(acc[c]);
          lse[query * nh + h] = static_cast<T>(maxScore + std::log(sum));
        }
      }
    }
  }
}

// With s_j = scale q.k_j, p_j = exp(s_j - lse) and D = dOut.out:
//   dv_j += p_j dOut, ds_j = p_j (dOut.v_j - D),
//   dq = scale sum_j ds_j k_j, dk_j += scale ds_j q.
template <typename T>
void blockAttentionGrad(const T *dOut, const T *q, const T *contextKeys,
                        const T *contextValues, const T *draftKeys,
                        const T *draftValues, const int32_t *anchors,
                        const uint8_t *keep, const int32_t *positionIds,
                        const T *out, const T *lse, T *dq, T *dContextKeys,
                        T *dContextValues, T *dDraftKeys, T *dDraftValues,
                        const AttentionShape &shape) {
  const int64_t S = shape.S, N = shape.N, bs = shape.bs, Q = shape.Q();
  const int64_t nh = shape.nh, nkv = shape.nkv, d = shape.d;
  const int64_t headsPerGroup = nh / nkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  // Key and value gradients of one row, [S + Q, nkv, d]: many blocks and
  // heads add into the same context rows, so they sum in double.
  const int64_t rowKeys = S + Q;
  std::vector<double> dKeys(rowKeys * nkv * d), dValues(rowKeys * nkv * d);
  std::vector<double> dqAcc(d);
  for (int64_t b = 0; b < shape.B; ++b) {
    const KeyValueRows<T> keyRows{contextKeys + b * S * nkv * d,
                                  draftKeys + b * Q * nkv * d, S, nkv, d};
    const KeyValueRows<T> valueRows{contextValues + b * S * nkv * d,
                                    draftValues + b * Q * nkv * d, S, nkv, d};
    std::fill(dKeys.begin(), dKeys.end(), 0.0);
    std::fill(dValues.begin(), dValues.end(), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < bs; ++k) {
        const VisibleKeys keys = visibleKeys(
            shape, anchors + b * N, keep + b * N, positionIds + b * S, n, k);
        const int64_t query = b * Q + n * bs + k;
        for (int64_t h = 0; h < nh; ++h) {
          const int64_t group = h / headsPerGroup;
          const T *qRow = q + (query * nh + h) * d;
          const T *dOutRow = dOut + (query * nh + h) * d;
          const double rowLse = lse[query * nh + h];
          const double delta = dot(dOutRow, out + (query * nh + h) * d, d);
          std::fill(dqAcc.begin(), dqAcc.end(), 0.0);
          forEachKey(keys, S, [&](int64_t key) {
            const T *kRow = keyRows.row(key, group);
            const T *vRow = valueRows.row(key, group);
            const double p = std::exp(scale * dot(qRow, kRow, d) - rowLse);
            const double dScore = p * (dot(dOutRow, vRow, d) - delta) * scale;
            double *dkRow = dKeys.data() + (key * nkv + group) * d;
            double *dvRow = dValues.data() + (key * nkv + group) * d;
            for (int64_t c = 0; c < d; ++c) {
              dvRow[c] += p * static_cast<double>(dOutRow[c]);
              dkRow[c] += dScore * static_cast<double>(qRow[c]);
              dqAcc[c] += dScore * static_cast<double>(kRow[c]);
            }
          });
          T *dqRow = dq + (query * nh + h) * d;
          for (int64_t c = 0; c < d; ++c)
            dqRow[c] = static_cast<T>(dqAcc[c]);
        }
      }
    }
    const int64_t contextSize = S * nkv * d, draftSize = Q * nkv * d;
    for (int64_t i = 0; i < contextSize; ++i) {
      dContextKeys[b * contextSize + i] = static_cast<T>(dKeys[i]);
      dContextValues[b * contextSize + i] = static_cast<T>(dValues[i]);
    }
    for (int64_t i = 0; i < draftSize; ++i) {
      dDraftKeys[b * draftSize + i] = static_cast<T>(dKeys[contextSize + i]);
      dDraftValues[b * draftSize + i] =
          static_cast<T>(dValues[contextSize + i]);
    }
  }
}

template <typename T>
void causalAttention(const T *q, const T *k, const T *v, const int32_t *pos,
                     T *out, int64_t B, int64_t S, int64_t nh, int64_t nkv,
                     int64_t d, const T *sinks, int64_t window) {
  const int64_t group = nh / nkv;
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> scores(static_cast<size_t>(S)),
      acc(static_cast<size_t>(d));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i)
      for (int64_t h = 0; h < nh; ++h) {
        const T *qi = q + ((b * S + i) * nh + h) * d;
        const int64_t kvHead = h / group;
        auto keyRow = [&](const T *base, int64_t j) {
          return base + ((b * S + j) * nkv + kvHead) * d;
        };
        auto sees = [&](int64_t j) {
          return pos[b * S + i] - pos[b * S + j] == i - j &&
                 (window <= 0 || i - j < window);
        };
        // The sink is a logit in the denominator with no value.
        const double sink = sinks ? double(sinks[h]) : -INFINITY;
        double best = sink;
        for (int64_t j = 0; j <= i; ++j) {
          if (!sees(j))
            continue;
          const T *kj = keyRow(k, j);
          double dot = 0;
          for (int64_t e = 0; e < d; ++e)
            dot += double(qi[e]) * double(kj[e]);
          scores[size_t(j)] = dot * scale;
          best = std::max(best, scores[size_t(j)]);
        }
        double sum = sinks ? std::exp(sink - best) : 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          if (!sees(j))
            continue;
          const double p = std::exp(scores[size_t(j)] - best);
          sum += p;
          const T *vj = keyRow(v, j);
          for (int64_t e = 0; e < d; ++e)
            acc[size_t(e)] += p * double(vj[e]);
        }
        T *o = out + ((b * S + i) * nh + h) * d;
        for (int64_t e = 0; e < d; ++e)
          o[e] = static_cast<T>(acc[size_t(e)] / sum);
      }
}

#define DFLASH_INSTANTIATE_ATTENTION(T)                                        \
  template void causalAttention<T>(                                            \
      const T *, const T *, const T *, const int32_t *, T *, int64_t, int64_t, \
      int64_t, int64_t, int64_t, const T *, int64_t);                          \
  template void blockAttention<T>(                                             \
      const T *, const T *, const T *, const T *, const T *, const int32_t *,  \
      const uint8_t *, const int32_t *, T *, T *, const AttentionShape &);     \
  template void blockAttentionGrad<T>(                                         \
      const T *, const T *, const T *, const T *, const T *, const T *,        \
      const int32_t *, const uint8_t *, const int32_t *, const T *, const T *, \
      T *, T *, T *, T *, T *, const AttentionShape &);

DFLASH_INSTANTIATE_ATTENTION(float)
DFLASH_INSTANTIATE_ATTENTION(double)
#undef DFLASH_INSTANTIATE_ATTENTION

} // namespace dflash::ref
