//===- Dense.cpp - Embedding, linear, RMSNorm, RoPE, SwiGLU reference -----===//
//
// Row-wise ops of the drafter and their gradients. Every reduction
// accumulates in double whatever T is; the result is rounded to T once.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dflash::ref {

template <typename T>
void embed(const T *table, const int32_t *ids, T *out, int64_t rows,
           int64_t H) {
  for (int64_t r = 0; r < rows; ++r)
    std::copy(table + static_cast<int64_t>(ids[r]) * H,
              table + static_cast<int64_t>(ids[r]) * H + H, out + r * H);
}

// Every matrix product below runs its inner loop over independent output
// elements (acc[j] += a * row[j]) rather than as one dot product: each output
// is still summed in the order k = 0, 1, ..., but the loop vectorises, which
// keeps a whole step of the tiny spec well under a second.

// Columns of w transposed at a time by `linear`, so the scratch stays small
// for the lm_head-sized products.
constexpr int64_t kLinearTile = 64;

template <typename T>
void linear(const T *x, const T *w, T *y, int64_t M, int64_t N, int64_t K) {
  std::vector<double> wTile(K * kLinearTile);
  std::vector<double> acc(kLinearTile);
  for (int64_t n0 = 0; n0 < N; n0 += kLinearTile) {
    const int64_t width = std::min(kLinearTile, N - n0);
    for (int64_t j = 0; j < width; ++j)
      for (int64_t k = 0; k < K; ++k)
        wTile[k * width + j] = w[(n0 + j) * K + k];
    for (int64_t m = 0; m < M; ++m) {
      std::fill(acc.begin(), acc.begin() + width, 0.0);
      for (int64_t k = 0; k < K; ++k) {
        const double xv = x[m * K + k];
        const double *wRow = wTile.data() + k * width;
        for (int64_t j = 0; j < width; ++j)
          acc[j] += xv * wRow[j];
      }
      for (int64_t j = 0; j < width; ++j)
        y[m * N + n0 + j] = static_cast<T>(acc[j]);
    }
  }
}

template <typename T>
void linearGradInput(const T *dy, const T *w, T *dx, int64_t M, int64_t N,
                     int64_t K) {
  std::vector<double> acc(K);
  for (int64_t m = 0; m < M; ++m) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      const double g = dy[m * N + n];
      const T *wRow = w + n * K;
      for (int64_t k = 0; k < K; ++k)
        acc[k] += g * static_cast<double>(wRow[k]);
    }
    for (int64_t k = 0; k < K; ++k)
      dx[m * K + k] = static_cast<T>(acc[k]);
  }
}

template <typename T>
void linearGradWeight(const T *dy, const T *x, T *dw, int64_t M, int64_t N,
                      int64_t K) {
  std::vector<double> acc(K);
  for (int64_t n = 0; n < N; ++n) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t m = 0; m < M; ++m) {
      const double g = dy[m * N + n];
      const T *xRow = x + m * K;
      for (int64_t k = 0; k < K; ++k)
        acc[k] += g * static_cast<double>(xRow[k]);
    }
    for (int64_t k = 0; k < K; ++k)
      dw[n * K + k] = static_cast<T>(acc[k]);
  }
}

/// 1 / sqrt(mean(x^2) + eps) of one row of D values.
template <typename T>
static double inverseRms(const T *x, int64_t D, double eps) {
  double sumSquares = 0;
  for (int64_t i = 0; i < D; ++i)
    sumSquares += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return 1.0 / std::sqrt(sumSquares / static_cast<double>(D) + eps);
}

template <typename T>
void rmsNorm(const T *x, const T *w, T *y, int64_t rows, int64_t D,
             double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T *xRow = x + r * D;
    const double inv = inverseRms(xRow, D, eps);
    for (int64_t i = 0; i < D; ++i)
      y[r * D + i] = static_cast<T>(static_cast<double>(xRow[i]) * inv *
                                    static_cast<double>(w[i]));
  }
}

// With r = (mean(x^2) + eps)^-1/2 and y_i = x_i r w_i:
//   dx_j = r dy_j w_j - r^3 x_j / D * sum_i dy_i w_i x_i,
//   dw_i = sum over rows of dy_i x_i r.
template <typename T>
void rmsNormGrad(const T *dy, const T *x, const T *w, T *dx, T *dw,
                 int64_t rows, int64_t D, double eps) {
  std::vector<double> dwAcc(D, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T *xRow = x + r * D;
    const T *dyRow = dy + r * D;
    const double inv = inverseRms(xRow, D, eps);
    double projection = 0;
    for (int64_t i = 0; i < D; ++i) {
      const double xi = xRow[i], gi = dyRow[i];
      projection += gi * static_cast<double>(w[i]) * xi;
      dwAcc[i] += gi * xi * inv;
    }
    const double radial = inv * inv * inv * projection / static_cast<double>(D);
    for (int64_t i = 0; i < D; ++i)
      dx[r * D + i] = static_cast<T>(inv * static_cast<double>(dyRow[i]) *
                                         static_cast<double>(w[i]) -
                                     radial * static_cast<double>(xRow[i]));
  }
  for (int64_t i = 0; i < D; ++i)
    dw[i] = static_cast<T>(dwAcc[i]);
}

/// Rotates the pairs (x[i], x[i + d/2]) of every head by +angle (direction
/// 1, the forward) or -angle (direction -1, the gradient, since the rotation
/// is orthogonal). The frequencies and angles are fp32 as in the Hugging Face
/// rotary embedding; only cos and sin run in the precision of T.
/// inv_i = 1 / theta^(2i/d) in fp32, i < d/2.
static std::vector<float> ropeInverseFrequencies(int64_t d, double theta) {
  std::vector<float> invFreq(size_t(d / 2));
  for (int64_t i = 0; i < d / 2; ++i)
    invFreq[size_t(i)] =
        1.0f / ::powf(static_cast<float>(theta),
                      static_cast<float>(2 * i) / static_cast<float>(d));
  return invFreq;
}

template <typename T>
static void rotateHalf(const T *x, const int32_t *pos, T *y, int64_t rows,
                       int64_t heads, int64_t d,
                       const std::vector<float> &invFreq, int direction,
                       double scale = 1.0) {
  const int64_t half = d / 2;
  std::vector<double> cosines(half), sines(half);
  for (int64_t r = 0; r < rows; ++r) {
    const float position = static_cast<float>(pos[r]);
    for (int64_t i = 0; i < half; ++i) {
      const T angle = static_cast<T>(position * invFreq[i]);
      cosines[i] = scale * static_cast<double>(std::cos(angle));
      sines[i] = direction * scale * static_cast<double>(std::sin(angle));
    }
    for (int64_t h = 0; h < heads; ++h) {
      const T *xHead = x + (r * heads + h) * d;
      T *yHead = y + (r * heads + h) * d;
      for (int64_t i = 0; i < half; ++i) {
        const double lo = xHead[i], hi = xHead[i + half];
        yHead[i] = static_cast<T>(lo * cosines[i] - hi * sines[i]);
        yHead[i + half] = static_cast<T>(hi * cosines[i] + lo * sines[i]);
      }
    }
  }
}

template <typename T>
void rope(const T *x, const int32_t *pos, T *y, int64_t rows, int64_t heads,
          int64_t d, double theta) {
  rotateHalf(x, pos, y, rows, heads, d, ropeInverseFrequencies(d, theta), 1);
}

template <typename T>
void scaledRope(const T *x, const int32_t *pos, T *y, int64_t rows,
                int64_t heads, int64_t d, double theta, double factor,
                double lowFreqFactor, double highFreqFactor,
                int64_t originalMaxPositions) {
  std::vector<float> invFreq = ropeInverseFrequencies(d, theta);
  const double original = double(originalMaxPositions);
  const double lowWavelength = original / lowFreqFactor;
  const double highWavelength = original / highFreqFactor;
  for (float &f : invFreq) {
    const double wavelength = 2.0 * 3.14159265358979323846 / f;
    if (wavelength > lowWavelength) {
      f = static_cast<float>(f / factor);
    } else if (wavelength >= highWavelength &&
               highFreqFactor != lowFreqFactor) {
      const double smooth = (original / wavelength - lowFreqFactor) /
                            (highFreqFactor - lowFreqFactor);
      f = static_cast<float>((1.0 - smooth) * f / factor + smooth * f);
    }
  }
  rotateHalf(x, pos, y, rows, heads, d, invFreq, 1);
}

void yarnInverseFrequencies(int64_t d, const YarnScaling &yarn, float *inv) {
  // transformers' _compute_yarn_parameters: the correction range in double,
  // the frequencies and the ramp in fp32.
  const double pi = 3.14159265358979323846;
  auto correctionDim = [&](double rotations) {
    return double(d) *
           std::log(double(yarn.originalMaxPositions) / (rotations * 2 * pi)) /
           (2 * std::log(yarn.theta));
  };
  double low = correctionDim(yarn.betaFast),
         high = correctionDim(yarn.betaSlow);
  if (yarn.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(d - 1));
  if (low == high)
    high += 0.001;
  for (int64_t i = 0; i < d / 2; ++i) {
    const float posFreq =
        ::powf(static_cast<float>(yarn.theta),
               static_cast<float>(2 * i) / static_cast<float>(d));
    const float extrapolation = 1.0f / posFreq;
    const float interpolation =
        1.0f / (static_cast<float>(yarn.factor) * posFreq);
    const float ramp =
        std::clamp((static_cast<float>(i) - static_cast<float>(low)) /
                       static_cast<float>(high - low),
                   0.0f, 1.0f);
    const float keep = 1.0f - ramp; // the extrapolation's share
    inv[i] = interpolation * (1.0f - keep) + extrapolation * keep;
  }
}

template <typename T>
void yarnRope(const T *x, const int32_t *pos, T *y, int64_t rows, int64_t heads,
              int64_t d, const YarnScaling &yarn) {
  std::vector<float> invFreq(size_t(d / 2));
  yarnInverseFrequencies(d, yarn, invFreq.data());
  rotateHalf(x, pos, y, rows, heads, d, invFreq, 1, yarn.attentionFactor);
}

template <typename T>
void ropeGrad(const T *dy, const int32_t *pos, T *dx, int64_t rows,
              int64_t heads, int64_t d, double theta) {
  rotateHalf(dy, pos, dx, rows, heads, d, ropeInverseFrequencies(d, theta), -1);
}

template <typename T>
void yarnRopeGrad(const T *dy, const int32_t *pos, T *dx, int64_t rows,
                  int64_t heads, int64_t d, const YarnScaling &yarn) {
  std::vector<float> invFreq(size_t(d / 2));
  yarnInverseFrequencies(d, yarn, invFreq.data());
  rotateHalf(dy, pos, dx, rows, heads, d, invFreq, -1, yarn.attentionFactor);
}

/// 1 / (1 + e^-z); e^-z overflowing to infinity gives the right limit 0.
static double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

template <typename T> void swiglu(const T *g, const T *u, T *y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double gi = g[i];
    y[i] = static_cast<T>(gi * sigmoid(gi) * static_cast<double>(u[i]));
  }
}

template <typename T>
void clampedSwiglu(const T *g, const T *u, T *y, int64_t n, double alpha,
                   double limit) {
  for (int64_t i = 0; i < n; ++i) {
    const double gi = std::min(double(g[i]), limit);
    const double ui = std::clamp(double(u[i]), -limit, limit);
    y[i] = static_cast<T>((ui + 1.0) * gi * sigmoid(alpha * gi));
  }
}

template <typename T>
void biasedLinear(const T *x, const T *w, const T *b, T *y, int64_t M,
                  int64_t N, int64_t K) {
  linear(x, w, y, M, N, K);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < N; ++c)
      y[r * N + c] = static_cast<T>(double(y[r * N + c]) + double(b[c]));
}

// silu'(g) = s + g s (1 - s) with s = sigmoid(g).
template <typename T>
void swigluGrad(const T *dy, const T *g, const T *u, T *dg, T *du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double gi = g[i], s = sigmoid(gi), dyi = dy[i];
    du[i] = static_cast<T>(dyi * gi * s);
    dg[i] = static_cast<T>(dyi * static_cast<double>(u[i]) *
                           (s + gi * s * (1.0 - s)));
  }
}

#define DFLASH_INSTANTIATE_DENSE(T)                                            \
  template void embed<T>(const T *, const int32_t *, T *, int64_t, int64_t);   \
  template void linear<T>(const T *, const T *, T *, int64_t, int64_t,         \
                          int64_t);                                            \
  template void linearGradInput<T>(const T *, const T *, T *, int64_t,         \
                                   int64_t, int64_t);                          \
  template void linearGradWeight<T>(const T *, const T *, T *, int64_t,        \
                                    int64_t, int64_t);                         \
  template void rmsNorm<T>(const T *, const T *, T *, int64_t, int64_t,        \
                           double);                                            \
  template void rmsNormGrad<T>(const T *, const T *, const T *, T *, T *,      \
                               int64_t, int64_t, double);                      \
  template void rope<T>(const T *, const int32_t *, T *, int64_t, int64_t,     \
                        int64_t, double);                                      \
  template void ropeGrad<T>(const T *, const int32_t *, T *, int64_t, int64_t, \
                            int64_t, double);                                  \
  template void scaledRope<T>(const T *, const int32_t *, T *, int64_t,        \
                              int64_t, int64_t, double, double, double,        \
                              double, int64_t);                                \
  template void yarnRope<T>(const T *, const int32_t *, T *, int64_t, int64_t, \
                            int64_t, const YarnScaling &);                     \
  template void yarnRopeGrad<T>(const T *, const int32_t *, T *, int64_t,      \
                                int64_t, int64_t, const YarnScaling &);        \
  template void swiglu<T>(const T *, const T *, T *, int64_t);                 \
  template void clampedSwiglu<T>(const T *, const T *, T *, int64_t, double,   \
                                 double);                                      \
  template void biasedLinear<T>(const T *, const T *, const T *, T *, int64_t, \
                                int64_t, int64_t);                             \
  template void swigluGrad<T>(const T *, const T *, const T *, T *, T *,       \
                              int64_t);

DFLASH_INSTANTIATE_DENSE(float)
DFLASH_INSTANTIATE_DENSE(double)
#undef DFLASH_INSTANTIATE_DENSE

} // namespace dflash::ref
