//===- Selector.h - DFlash2 selector: limits and alpha schedule -*- C++ -*-===//
//
// Plain C++ (no CUDA) around kernels/DFlash2Selector.cuh: the shapes its
// kernels take, which dflash-select-kernels checks against, and
// docs/semantics.md section 13's alpha_t of the selector term at an optimizer
// step with the factor its sum enters the loss numerator with. The schedule
// is written once, for the CPU reference (kernels/reference/DFlash2.h) and
// for device code, which calls these constexpr functions under
// --expt-relaxed-constexpr.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_SELECTOR_H
#define DFLASH_KERNELS_SELECTOR_H

#include <cstdint>

namespace dflash::kernels {

/// The most candidates the selector kernels keep per row: a warp's sorted
/// top-K list holds two slots a lane.
constexpr int64_t kSelectorKernelMaxTopK = 64;
/// The largest rank r: a row's z = P[p] * t lives in shared memory (16 KiB).
constexpr int64_t kSelectorKernelMaxRank = 4096;

/// alpha_t at 0-based optimizer step `step` of `total`: 0 for the first
/// int(warmupRatio * total) steps, then linear up to `alpha` over the next
/// int(rampRatio * total) (at once when that is 0), then `alpha`.
constexpr double selectorAlphaAt(int64_t step, int64_t total, double alpha,
                                 double warmupRatio, double rampRatio) {
  const int64_t warm = int64_t(warmupRatio * double(total));
  const int64_t ramp = int64_t(rampRatio * double(total));
  if (step < warm)
    return 0.0;
  if (step - warm < ramp)
    return alpha * double(step - warm + 1) / double(ramp);
  return alpha;
}

/// d(loss numerator)/d(selector_sum): alpha, times weightSum / coveredWeight
/// (0 when that is 0) for selector_denominator = "covered".
constexpr double selectorTermScale(double alpha, double weightSum,
                                   double coveredWeight, bool covered) {
  if (!covered)
    return alpha;
  return coveredWeight > 0 ? alpha * weightSum / coveredWeight : 0.0;
}

/// The loss numerator of a "covered" objective over several batches of an
/// evaluation, from the totals of its linear loss_sum (unary + alpha *
/// selector), unary sum, weight_sum and covered weight
/// (schema ObjectivePart): what the step's objective is for one batch.
constexpr double coveredObjectiveNumerator(double linearLossSum,
                                           double unarySum, double weightSum,
                                           double coveredWeight) {
  return unarySum + (linearLossSum - unarySum) *
                        selectorTermScale(1.0, weightSum, coveredWeight, true);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_SELECTOR_H
