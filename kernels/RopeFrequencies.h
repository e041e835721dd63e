//===- RopeFrequencies.h - RoPE's theta, Llama-3 and YaRN scaling *- C++
//-*-===//
//
// Plain C++, so that the generated kernels.h can pass it to the RoPE
// kernels (kernels/QkNormRope.cuh) without CUDA headers.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_ROPEFREQUENCIES_H
#define DFLASH_KERNELS_ROPEFREQUENCIES_H

#include <algorithm>
#include <cmath>

namespace dflash::kernels {

/// RoPE's frequencies: theta, and Llama-3's rope scaling where factor > 0
/// or YaRN's where yarnFactor > 0 (a target decoder's; the drafter's RoPE
/// is unscaled). The Llama-3 fields mirror dflash.scaled_rope's attributes;
/// the YaRN ones are dflash.yarn_rope's, its ramp [yarnLow, yarnHigh] over
/// the frequency index already worked out (yarnRampRange).
struct RopeFrequencies {
  float theta;
  float factor = 0.f;
  float lowFreqFactor = 1.f, highFreqFactor = 4.f;
  float originalMaxPositions = 8192.f;
  float yarnFactor = 0.f;
  float yarnLow = 0.f, yarnHigh = 1.f;
  /// cos and sin are multiplied by it (YaRN's attention factor).
  float attentionFactor = 1.f;
};

/// YaRN's ramp over the frequency index i < d/2, as transformers'
/// _compute_yarn_parameters finds it: the dimensions where betaFast and
/// betaSlow rotations fit originalMaxPositions, floored and ceiled when
/// `truncate`, clipped to [0, d - 1], and apart by at least 0.001.
inline void yarnRampRange(int d, double theta, double betaFast, double betaSlow,
                          double originalMaxPositions, bool truncate,
                          float &low, float &high) {
  auto correctionDim = [&](double rotations) {
    return double(d) *
           std::log(originalMaxPositions /
                    (rotations * 2 * 3.14159265358979323846)) /
           (2 * std::log(theta));
  };
  double lo = correctionDim(betaFast), hi = correctionDim(betaSlow);
  if (truncate) {
    lo = std::floor(lo);
    hi = std::ceil(hi);
  }
  lo = std::max(lo, 0.0);
  hi = std::min(hi, double(d - 1));
  if (lo == hi)
    hi += 0.001;
  low = float(lo);
  high = float(hi);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_ROPEFREQUENCIES_H
