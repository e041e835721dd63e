//===- DeltaNet.cpp - CPU reference of the hybrid targets' ops ------------===//
//
// The Gated DeltaNet layer's convolution, recurrence and gated norm, and the
// zero-centred norm and partial rotary of the Qwen3.5 family's other layers,
// in double, token by token: the oracle of the chunk-wise kernels. Packed
// rows restart at each conversation by causal_attention's rule (token j is
// in token i's conversation iff pos[i] - pos[j] == i - j).
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"

#include <cmath>
#include <vector>

namespace dflash::ref {

namespace {
/// Whether token j (<= i) of a row is in token i's conversation.
bool sameConversation(const int32_t *pos, int64_t i, int64_t j) {
  return int64_t(pos[i]) - int64_t(pos[j]) == i - j;
}
double silu(double x) { return x / (1.0 + std::exp(-x)); }
/// torch's softplus (beta 1, threshold 20).
double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }
/// x * rsqrt(sum x^2 + 1e-6): the delta rule's q/k normalisation.
void l2Normalise(const double *x, double *y, int64_t d) {
  double sumSquares = 0;
  for (int64_t i = 0; i < d; ++i)
    sumSquares += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(sumSquares + 1e-6);
  for (int64_t i = 0; i < d; ++i)
    y[i] = x[i] * inv;
}
double inverseRms(const double *x, int64_t D, double eps) {
  double sumSquares = 0;
  for (int64_t i = 0; i < D; ++i)
    sumSquares += x[i] * x[i];
  return 1.0 / std::sqrt(sumSquares / double(D) + eps);
}
} // namespace

void causalConv(const double *x, const double *w, const int32_t *pos, double *y,
                int64_t B, int64_t S, int64_t C, int64_t K) {
  for (int64_t b = 0; b < B; ++b) {
    const int32_t *p = pos + b * S;
    for (int64_t t = 0; t < S; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t src = t - (K - 1) + j;
          if (src >= 0 && sameConversation(p, t, src))
            acc += w[c * K + j] * x[(b * S + src) * C + c];
        }
        y[(b * S + t) * C + c] = silu(acc);
      }
  }
}

void gatedDeltaRule(const double *q, const double *k, const double *v,
                    const double *a, const double *beta, const double *aLog,
                    const double *dtBias, const int32_t *pos, double *out,
                    int64_t B, int64_t S, int64_t Hk, int64_t Hv, int64_t dk,
                    int64_t dv) {
  const int64_t group = Hv / Hk;
  const double scale = 1.0 / std::sqrt(double(dk));
  std::vector<double> state(static_cast<size_t>(dk * dv));
  std::vector<double> qn(static_cast<size_t>(dk)), kn(qn.size());
  std::vector<double> delta(static_cast<size_t>(dv));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t hk = h / group;
      const double decayRate = -std::exp(aLog[h]);
      for (int64_t t = 0; t < S; ++t) {
        const int64_t token = b * S + t;
        if (t == 0 || !sameConversation(pos + b * S, t, t - 1))
          std::fill(state.begin(), state.end(), 0.0);
        l2Normalise(q + (token * Hk + hk) * dk, qn.data(), dk);
        l2Normalise(k + (token * Hk + hk) * dk, kn.data(), dk);
        const double *vt = v + (token * Hv + h) * dv;
        const double g = decayRate * softplus(a[token * Hv + h] + dtBias[h]);
        const double bt = 1.0 / (1.0 + std::exp(-beta[token * Hv + h]));
        const double decay = std::exp(g);
        for (double &m : state)
          m *= decay;
        // delta = beta (v - M^T k); M += k delta^T.
        for (int64_t j = 0; j < dv; ++j) {
          double recalled = 0;
          for (int64_t i = 0; i < dk; ++i)
            recalled += state[size_t(i * dv + j)] * kn[size_t(i)];
          delta[size_t(j)] = bt * (vt[j] - recalled);
        }
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j)
            state[size_t(i * dv + j)] += kn[size_t(i)] * delta[size_t(j)];
        double *o = out + (token * Hv + h) * dv;
        for (int64_t j = 0; j < dv; ++j) {
          double acc = 0;
          for (int64_t i = 0; i < dk; ++i)
            acc += state[size_t(i * dv + j)] * qn[size_t(i)];
          o[j] = acc * scale;
        }
      }
    }
}

void gatedRmsNorm(const double *x, const double *z, const double *w, double *y,
                  int64_t rows, int64_t D, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const double inv = inverseRms(x + r * D, D, eps);
    for (int64_t i = 0; i < D; ++i)
      y[r * D + i] = x[r * D + i] * inv * w[i] * silu(z[r * D + i]);
  }
}

void zeroCentredRmsNorm(const double *x, const double *w, double *y,
                        int64_t rows, int64_t D, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const double inv = inverseRms(x + r * D, D, eps);
    for (int64_t i = 0; i < D; ++i)
      y[r * D + i] = x[r * D + i] * inv * (1.0 + w[i]);
  }
}

void partialRope(const double *x, const int32_t *pos, double *y, int64_t rows,
                 int64_t heads, int64_t d, int64_t rotaryDim, double theta) {
  // rope over [rows * heads, 1, rotaryDim], each head vector at its row's
  // position; the dimensions past rotaryDim are copied.
  const int64_t n = rows * heads;
  std::vector<double> rotated(size_t(n * rotaryDim)), result(rotated.size());
  std::vector<int32_t> positions(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    positions[size_t(r)] = pos[r / heads];
    for (int64_t i = 0; i < rotaryDim; ++i)
      rotated[size_t(r * rotaryDim + i)] = x[r * d + i];
  }
  rope<double>(rotated.data(), positions.data(), result.data(), n, 1, rotaryDim,
               theta);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < d; ++i)
      y[r * d + i] =
          i < rotaryDim ? result[size_t(r * rotaryDim + i)] : x[r * d + i];
}

} // namespace dflash::ref
