//===- DFlash2.cpp - DFlash2 convolution, unary transform, selector -------===//
//
// The reference of docs/semantics.md section 13's ops, as plain loops over
// small shapes (the interpreter's). The selector's work per slot is the
// top-K over V and K dot products of length r; codebook gradients are sparse
// rows, never a dense [V, r] pass.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/DFlash2.h"
#include "kernels/Selector.h"
#include "kernels/reference/LogSumExp.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dflash::ref {

template <typename T>
void groupedConv(const T *in, const T *delta, const T *base, T *out,
                 const GroupedConvShape &shape) {
  const int64_t Q = shape.Q(), H = shape.H, G = shape.G();
  const int64_t stride = shape.stride();
  for (int64_t b = 0; b < shape.B; ++b) {
    for (int64_t q = 0; q < Q; ++q) {
      const int64_t k = q % shape.bs;
      const T *slotDelta = delta + (b * Q + q) * stride;
      for (int64_t c = 0; c < H; ++c) {
        double acc = 0;
        // o <= k keeps the taps inside the block.
        for (int64_t o = 0; o < shape.kc && o <= k; ++o) {
          const double weight =
              static_cast<double>(base[o * H + c]) +
              static_cast<double>(slotDelta[o * G + c / shape.gs]);
          acc += weight * static_cast<double>(in[(b * Q + q - o) * H + c]);
        }
        out[(b * Q + q) * H + c] = static_cast<T>(acc);
      }
    }
  }
}

template <typename T>
void groupedConvGrad(const T *dOut, const T *in, const T *delta, const T *base,
                     T *dIn, T *dDelta, T *dBase,
                     const GroupedConvShape &shape) {
  const int64_t Q = shape.Q(), H = shape.H, G = shape.G(), kc = shape.kc;
  const int64_t stride = shape.stride();
  std::vector<double> baseAcc(kc * H, 0.0);
  for (int64_t b = 0; b < shape.B; ++b) {
    for (int64_t q = 0; q < Q; ++q) {
      const int64_t k = q % shape.bs;
      const T *inRow = in + (b * Q + q) * H;
      // dIn at slot q: the outputs q + o of the same block that read it.
      for (int64_t c = 0; c < H; ++c) {
        double acc = 0;
        for (int64_t o = 0; o < kc && k + o < shape.bs; ++o) {
          const T *outDelta = delta + (b * Q + q + o) * stride;
          const double weight =
              static_cast<double>(base[o * H + c]) +
              static_cast<double>(outDelta[o * G + c / shape.gs]);
          acc += weight * static_cast<double>(dOut[(b * Q + q + o) * H + c]);
        }
        dIn[(b * Q + q) * H + c] = static_cast<T>(acc);
      }
      // dDelta and dBase at output slot q: the taps it reads.
      const T *dOutRow = dOut + (b * Q + q) * H;
      T *slotDDelta = dDelta + (b * Q + q) * stride;
      for (int64_t o = 0; o < kc; ++o) {
        const T *tapRow = o <= k ? inRow - o * H : nullptr;
        for (int64_t g = 0; g < G; ++g) {
          double acc = 0;
          for (int64_t c = g * shape.gs; tapRow && c < (g + 1) * shape.gs;
               ++c) {
            const double product = static_cast<double>(dOutRow[c]) *
                                   static_cast<double>(tapRow[c]);
            acc += product;
            baseAcc[o * H + c] += product;
          }
          slotDDelta[o * G + g] = static_cast<T>(acc);
        }
      }
    }
  }
  for (int64_t i = 0; i < kc * H; ++i)
    dBase[i] = static_cast<T>(baseAcc[i]);
}

template <typename T>
void unaryTransform(const T *z, T *u, int64_t n, const UnaryTransform &t) {
  for (int64_t i = 0; i < n; ++i) {
    const double mz = t.multiplier * static_cast<double>(z[i]);
    u[i] = static_cast<T>(
        t.softcap != 0.0 ? t.softcap * std::tanh(mz / t.softcap) : mz);
  }
}

template <typename T>
void unaryTransformGrad(const T *du, const T *z, T *dz, int64_t n,
                        const UnaryTransform &t) {
  for (int64_t i = 0; i < n; ++i) {
    double derivative = t.multiplier;
    if (t.softcap != 0.0) {
      const double th =
          std::tanh(t.multiplier * static_cast<double>(z[i]) / t.softcap);
      derivative *= 1.0 - th * th;
    }
    dz[i] = static_cast<T>(static_cast<double>(du[i]) * derivative);
  }
}

template <typename T>
void topK(const T *u, int64_t V, int64_t K, int32_t *indices) {
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + K, order.end(),
                    [u](int32_t a, int32_t b) {
                      return u[a] > u[b] || (u[a] == u[b] && a < b);
                    });
  std::copy(order.begin(), order.begin() + K, indices);
}

namespace {

template <typename T>
double rowWeight(const SelectorInputs<T> &in, int64_t row) {
  return in.weights ? static_cast<double>(in.weights[row]) : 1.0;
}

/// z = P[p] * t of one row.
template <typename T>
void predecessorCode(const SelectorInputs<T> &in, int64_t row,
                     std::vector<double> &z) {
  const T *pRow = in.P + static_cast<int64_t>(in.predecessors[row]) * in.r;
  const T *tRow = in.t + row * in.r;
  z.resize(in.r);
  for (int64_t i = 0; i < in.r; ++i)
    z[i] = static_cast<double>(pRow[i]) * static_cast<double>(tRow[i]);
}

/// s = u[c] + z . S[c].
template <typename T>
double candidateScore(const SelectorInputs<T> &in, int64_t row,
                      const std::vector<double> &z, int32_t c) {
  const T *sRow = in.S + static_cast<int64_t>(c) * in.r;
  double acc = 0;
  for (int64_t i = 0; i < in.r; ++i)
    acc += z[i] * static_cast<double>(sRow[i]);
  return static_cast<double>(in.u[row * in.V + c]) + acc;
}

} // namespace

template <typename T>
SelectorForward<T> selectorForward(const SelectorInputs<T> &in) {
  const int64_t rows = in.rows, K = in.K, V = in.V;
  SelectorForward<T> f;
  f.rows = rows;
  f.K = K;
  f.candidates.assign(rows * K, -1);
  f.values.assign(rows * K, T(0));
  f.scores.assign(rows * K, T(0));
  f.cov.assign(rows, 0);
  f.gold.assign(rows, -1);
  f.ce.assign(rows, T(0));
  f.choice.assign(rows, -1);
  f.hits.assign(rows, 0);
  std::vector<double> z;
  for (int64_t row = 0; row < rows; ++row) {
    const double w = rowWeight(in, row);
    if (w == 0)
      continue;
    const T *u = in.u + row * V;
    const int32_t label = in.labels[row];
    int32_t *candidates = f.candidates.data() + row * K;
    T *values = f.values.data() + row * K;
    T *scores = f.scores.data() + row * K;
    topK(u, V, K, candidates);
    predecessorCode(in, row, z);
    int64_t best = 0;
    for (int64_t j = 0; j < K; ++j) {
      values[j] = u[candidates[j]];
      scores[j] = static_cast<T>(candidateScore(in, row, z, candidates[j]));
      if (scores[j] > scores[best]) // strict: ties keep the lower j
        best = j;
    }
    // The choice is taken before any injection: serving never sees the label.
    f.choice[row] = candidates[best];
    f.hits[row] = candidates[best] == label ? 1 : 0;
    int32_t gold = -1;
    for (int64_t j = 0; j < K && gold < 0; ++j)
      if (candidates[j] == label)
        gold = static_cast<int32_t>(j);
    if (gold < 0 && in.gold == SelectorGold::Inject) {
      gold = static_cast<int32_t>(K - 1);
      candidates[gold] = label;
      values[gold] = u[label];
      scores[gold] = static_cast<T>(candidateScore(in, row, z, label));
    }
    f.gold[row] = gold;
    if (gold < 0)
      continue;
    const double ce = logSumExp(scores, K) - static_cast<double>(scores[gold]);
    f.cov[row] = 1;
    f.ce[row] = static_cast<T>(ce);
    f.lossSum += w * ce;
    f.coveredWeight += w;
  }
  return f;
}

template <typename T>
bool scatterAddRows(const RowGradients<T> &gradients, T *dense,
                    int64_t numRows) {
  const int64_t width = gradients.width;
  bool inRange = true;
  for (size_t e = 0; e < gradients.rows.size(); ++e) {
    if (gradients.rows[e] < 0 || gradients.rows[e] >= numRows) {
      inRange = false;
      continue;
    }
    T *row = dense + static_cast<int64_t>(gradients.rows[e]) * width;
    const T *values = gradients.values.data() + e * width;
    for (int64_t i = 0; i < width; ++i)
      row[i] += values[i];
  }
  return inRange;
}

template <typename T>
void selectorBackward(const SelectorInputs<T> &in,
                      const SelectorForward<T> &forward, double scale,
                      bool stopGradient, T *du, T *dt, RowGradients<T> &dP,
                      RowGradients<T> &dS) {
  const int64_t rows = in.rows, K = in.K, V = in.V, r = in.r;
  std::fill(du, du + rows * V, T(0));
  std::fill(dt, dt + rows * r, T(0));
  dP = RowGradients<T>{r, {}, {}};
  dS = RowGradients<T>{r, {}, {}};
  std::vector<double> z, dz(r), e(K);
  for (int64_t row = 0; row < rows; ++row) {
    if (!forward.cov[row])
      continue;
    const int32_t *candidates = forward.candidates.data() + row * K;
    const T *scores = forward.scores.data() + row * K;
    const int64_t gold = forward.gold[row];
    const double g = scale * rowWeight(in, row);
    const double lse = logSumExp(scores, K);
    // d(g CE_s)/ds_j = g (softmax(s)_j - [j == j*]).
    for (int64_t j = 0; j < K; ++j)
      e[j] = g * (std::exp(static_cast<double>(scores[j]) - lse) -
                  (j == gold ? 1.0 : 0.0));
    predecessorCode(in, row, z);
    std::fill(dz.begin(), dz.end(), 0.0);
    for (int64_t j = 0; j < K; ++j) {
      const T *sRow = in.S + static_cast<int64_t>(candidates[j]) * r;
      for (int64_t i = 0; i < r; ++i)
        dz[i] += e[j] * static_cast<double>(sRow[i]);
      // ds_j/dv_j = 1 and v_j = u[c_j]; the candidates are distinct.
      if (!stopGradient)
        du[row * V + candidates[j]] = static_cast<T>(e[j]);
      dS.rows.push_back(candidates[j]);
      for (int64_t i = 0; i < r; ++i)
        dS.values.push_back(static_cast<T>(e[j] * z[i]));
    }
    const int32_t p = in.predecessors[row];
    const T *pRow = in.P + static_cast<int64_t>(p) * r;
    const T *tRow = in.t + row * r;
    dP.rows.push_back(p);
    for (int64_t i = 0; i < r; ++i) {
      dt[row * r + i] = static_cast<T>(dz[i] * static_cast<double>(pRow[i]));
      dP.values.push_back(static_cast<T>(dz[i] * static_cast<double>(tRow[i])));
    }
  }
}

void draftPredecessors(const int32_t *inputIds, const int32_t *anchors,
                       const uint8_t *keep, int32_t *out, int64_t B, int64_t S,
                       int64_t N, int64_t bs) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t a = anchors[b * N + n];
      int32_t *block = out + (b * N + n) * bs;
      for (int64_t k = 0; k < bs; ++k) {
        const int64_t at = a + k - 1;
        block[k] = k >= 1 && keep[b * N + n] && at >= 0 && at < S
                       ? inputIds[b * S + at]
                       : 0;
      }
    }
}

double selectorAlphaAt(int64_t step, int64_t total, double alpha,
                       double warmupRatio, double rampRatio) {
  return kernels::selectorAlphaAt(step, total, alpha, warmupRatio, rampRatio);
}

double selectorTermScale(double alpha, double weightSum, double coveredWeight,
                         bool covered) {
  return kernels::selectorTermScale(alpha, weightSum, coveredWeight, covered);
}

#define DFLASH_INSTANTIATE_DFLASH2(T)                                          \
  template void groupedConv<T>(const T *, const T *, const T *, T *,           \
                               const GroupedConvShape &);                      \
  template void groupedConvGrad<T>(const T *, const T *, const T *, const T *, \
                                   T *, T *, T *, const GroupedConvShape &);   \
  template void unaryTransform<T>(const T *, T *, int64_t,                     \
                                  const UnaryTransform &);                     \
  template void unaryTransformGrad<T>(const T *, const T *, T *, int64_t,      \
                                      const UnaryTransform &);                 \
  template void topK<T>(const T *, int64_t, int64_t, int32_t *);               \
  template SelectorForward<T> selectorForward<T>(const SelectorInputs<T> &);   \
  template bool scatterAddRows<T>(const RowGradients<T> &, T *, int64_t);      \
  template void selectorBackward<T>(                                           \
      const SelectorInputs<T> &, const SelectorForward<T> &, double, bool,     \
      T *, T *, RowGradients<T> &, RowGradients<T> &);

DFLASH_INSTANTIATE_DFLASH2(float)
DFLASH_INSTANTIATE_DFLASH2(double)
#undef DFLASH_INSTANTIATE_DFLASH2

} // namespace dflash::ref
