//===- GemmTiming.h - What timing the GEMM candidates decided ---*- C++ -*-===//
//
// Plain data of kernels/Gemm.cuh's algorithm timing, for host code that does
// not include CUDA kernels (the runtime's reports).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_GEMMTIMING_H
#define DFLASH_KERNELS_GEMMTIMING_H

namespace dflash::kernels {

/// How many of cuBLASLt's heuristic results a plan keeps as candidates.
inline constexpr int kGemmCandidates = 8;
/// Shapes of fewer FLOPs (under about 15 us) keep the heuristic's first
/// algorithm: too short to time reliably, too short to matter.
inline constexpr double kGemmTimingMinFlops = 1e10;

/// What CublasLtGemm::timeCandidates has done so far.
struct GemmTimingSummary {
  int timed = 0;      ///< shapes whose candidates were timed by this planner
  int agreed = 0;     ///< shapes another planner of the process had timed
  int faster = 0;     ///< of both: an algorithm other than the first chosen
  double seconds = 0; ///< spent timing
};

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_GEMMTIMING_H
