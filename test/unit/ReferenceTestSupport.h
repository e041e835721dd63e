//===- ReferenceTestSupport.h - Inputs, errors, gradients -------*- C++ -*-===//
//
// What the tests of the CPU reference (test/unit/Reference*) share: seeded
// random inputs, the ||actual - expected|| / ||expected|| error their
// tolerances are written against, and central finite differences for the
// gradient checks. All in double, as the reference is checked in double.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_TEST_UNIT_REFERENCETESTSUPPORT_H
#define DFLASH_TEST_UNIT_REFERENCETESTSUPPORT_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace dflash::reftest {

using Vector = std::vector<double>;

/// `n` values uniform in [lo, hi), drawn from `rng` in order.
inline Vector randomVector(std::mt19937_64 &rng, int64_t n, double lo = -1.0,
                           double hi = 1.0) {
  std::uniform_real_distribution<double> uniform(lo, hi);
  Vector values(n);
  for (double &value : values)
    value = uniform(rng);
  return values;
}

inline double norm(const Vector &x) {
  double sum = 0;
  for (double value : x)
    sum += value * value;
  return std::sqrt(sum);
}

/// ||actual - expected|| / ||expected||.
inline double relativeError(const Vector &actual, const Vector &expected) {
  Vector difference(actual.size());
  for (size_t i = 0; i < actual.size(); ++i)
    difference[i] = actual[i] - expected[i];
  return norm(difference) / norm(expected);
}

inline double dotProduct(const Vector &a, const Vector &b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i)
    sum += a[i] * b[i];
  return sum;
}

/// Central differences of the scalar `f` with respect to every element of
/// `x` (which f reads), restored afterwards. The step is fixed because the
/// tests' gradient tolerances assume it.
inline Vector finiteDifferences(Vector &x, const std::function<double()> &f) {
  constexpr double step = 1e-6;
  Vector gradient(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + step;
    const double plus = f();
    x[i] = saved - step;
    const double minus = f();
    x[i] = saved;
    gradient[i] = (plus - minus) / (2 * step);
  }
  return gradient;
}

} // namespace dflash::reftest

#endif // DFLASH_TEST_UNIT_REFERENCETESTSUPPORT_H
