//===- Optimizer.cpp - Gradient clipping and AdamW reference --------------===//
//
// docs/semantics.md section 5: the global-norm clip coefficient and one
// torch.optim.AdamW step.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"

#include <algorithm>
#include <cmath>

namespace dflash::ref {

template <typename T> double sumOfSquares(const T *x, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return sum;
}

double clipCoefficient(double norm, double maxNorm) {
  return std::min(1.0, maxNorm / (norm + 1e-6));
}

// The operation order of torch.optim.AdamW (single-tensor path): decoupled
// decay first, the moments stored, then the bias-corrected update with eps
// added after sqrt(v) is divided by sqrt(1 - beta2^t).
template <typename T>
void adamw(T *master, const T *grad, T *m, T *v, int64_t n, int64_t t,
           double scale, const AdamWConfig &config) {
  const double b1 = config.beta1, b2 = config.beta2;
  const double biasCorrection1 = 1.0 - std::pow(b1, static_cast<double>(t));
  const double biasCorrection2 = 1.0 - std::pow(b2, static_cast<double>(t));
  const double stepSize = config.lr / biasCorrection1;
  const double biasCorrection2Sqrt = std::sqrt(biasCorrection2);
  const double decay = 1.0 - config.lr * config.weightDecay;
  for (int64_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(grad[i]) * scale;
    // The moments are rounded to T before the update reads them, as torch
    // reads back the tensors it just wrote.
    m[i] = static_cast<T>(b1 * static_cast<double>(m[i]) + (1.0 - b1) * g);
    v[i] = static_cast<T>(b2 * static_cast<double>(v[i]) + (1.0 - b2) * g * g);
    const double denominator =
        std::sqrt(static_cast<double>(v[i])) / biasCorrection2Sqrt + config.eps;
    master[i] =
        static_cast<T>(static_cast<double>(master[i]) * decay -
                       stepSize * static_cast<double>(m[i]) / denominator);
  }
}

double learningRate(int64_t step, int64_t total, double lr,
                    double warmupRatio) {
  int64_t warm = int64_t(warmupRatio * double(total));
  if (step < warm)
    return lr * double(step + 1) / double(warm);
  // Past the schedule (or a schedule that is all warmup) the rate is 0.
  if (total <= warm || step >= total)
    return 0.0;
  double progress = double(step - warm) / double(total - warm);
  return lr * 0.5 * (1.0 + std::cos(M_PI * progress));
}

#define DFLASH_INSTANTIATE_OPTIMIZER(T)                                        \
  template double sumOfSquares<T>(const T *, int64_t);                         \
  template void adamw<T>(T *, const T *, T *, T *, int64_t, int64_t, double,   \
                         const AdamWConfig &);

DFLASH_INSTANTIATE_OPTIMIZER(float)
DFLASH_INSTANTIATE_OPTIMIZER(double)
#undef DFLASH_INSTANTIATE_OPTIMIZER

} // namespace dflash::ref
