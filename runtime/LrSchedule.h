//===- LrSchedule.h - Warmup + cosine learning rate -------------*- C++ -*-===//
//
// SEMANTICS.md section 5: `total` optimizer steps, warm = int(warmupRatio *
// total); 0-based step t < warm uses lr * (t+1) / warm, later steps follow a
// cosine from lr down to 0 over the remaining total - warm steps.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_LRSCHEDULE_H
#define DFLASH_RUNTIME_LRSCHEDULE_H

#include <cmath>
#include <cstdint>

namespace dflash::rt {

/// Number of warmup steps: int(warmupRatio * total), truncated like Python's
/// int().
inline int64_t warmupSteps(int64_t total, double warmupRatio) {
  double warm = warmupRatio * double(total);
  return warm > 0 ? int64_t(warm) : 0;
}

/// The learning rate of 0-based optimizer step `step`. Steps at or past
/// `total` (and the degenerate total == warm after warmup) give 0.
inline double learningRate(int64_t step, int64_t total, double lr,
                           double warmupRatio) {
  int64_t warm = warmupSteps(total, warmupRatio);
  if (step < warm)
    return lr * double(step + 1) / double(warm);
  if (total <= warm || step >= total)
    return 0.0;
  double progress = double(step - warm) / double(total - warm);
  return lr * 0.5 * (1.0 + std::cos(M_PI * progress));
}

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_LRSCHEDULE_H
