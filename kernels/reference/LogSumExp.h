//===- LogSumExp.h - log(sum(exp(x))) in double, max-shifted ----*- C++ -*-===//
//
// Shared by the reference's cross-entropy over the vocabulary and the DFlash2
// selector's softmax over its K candidates. Internal to kernels/reference.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_REFERENCE_LOGSUMEXP_H
#define DFLASH_KERNELS_REFERENCE_LOGSUMEXP_H

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace dflash::ref {

/// log(sum_i exp(x[i])) over n > 0 values, shifted by the largest so that
/// no exp overflows.
template <typename T> double logSumExp(const T *x, int64_t n) {
  const double maxValue = static_cast<double>(*std::max_element(x, x + n));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += std::exp(static_cast<double>(x[i]) - maxValue);
  return maxValue + std::log(sum);
}

} // namespace dflash::ref

#endif // DFLASH_KERNELS_REFERENCE_LOGSUMEXP_H
