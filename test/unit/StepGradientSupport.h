//===- StepGradientSupport.h - Gradients by differences ---------*- C++ -*-===//
//
// What the tests of interpreted steps share (StepGradientTest, the DFlash2
// gradient tests): one parameter's gradient checked along a random
// direction d, <grad, d> against (L(p + h d) - L(p - h d)) / 2h of the
// interpreted forward loss, in double (Precision::Exact).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_TEST_UNIT_STEPGRADIENTSUPPORT_H
#define DFLASH_TEST_UNIT_STEPGRADIENTSUPPORT_H

#include "compiler/Interpreter/Interpreter.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace dflash::steptest {

/// <grad, d> and the central difference of the loss along d.
struct DirectionalDerivative {
  double analytic = 0;
  double numeric = 0;
  double relativeError() const {
    return std::abs(numeric - analytic) / std::max(std::abs(analytic), 1e-12);
  }
};

/// The derivative of `loss(args)` along a fresh random direction of
/// argument `param`, whose gradient is `grad`; `loss` is called twice, with
/// the argument moved by +-h d.
template <class Loss>
DirectionalDerivative directionalDerivative(const std::vector<HostTensor> &args,
                                            unsigned param,
                                            const HostTensor &grad, Loss &&loss,
                                            double h, std::mt19937_64 &rng) {
  std::normal_distribution<double> normal;
  DirectionalDerivative result;
  std::vector<double> dir(grad.data.size());
  for (size_t i = 0; i < dir.size(); ++i) {
    dir[i] = normal(rng);
    result.analytic += dir[i] * grad.data[i];
  }
  std::vector<HostTensor> plus = args, minus = args;
  for (size_t i = 0; i < dir.size(); ++i) {
    plus[param].data[i] += h * dir[i];
    minus[param].data[i] -= h * dir[i];
  }
  result.numeric = (loss(plus) - loss(minus)) / (2 * h);
  return result;
}

} // namespace dflash::steptest

#endif // DFLASH_TEST_UNIT_STEPGRADIENTSUPPORT_H
