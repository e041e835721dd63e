//===- GemmTiming.h - What timing the GEMM candidates decided ---*- C++ -*-===//
//
// Plain data of kernels/Gemm.cuh's algorithm timing, for host code that does
// not include CUDA kernels (the runtime's reports).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_GEMMTIMING_H
#define DFLASH_KERNELS_GEMMTIMING_H

#include <string>
#include <vector>

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
  int untimed = 0;    ///< of the timed: no free memory for the scratch
                      ///< operands, so the first algorithm was kept
  double seconds = 0; ///< spent timing
};

/// What timing found for one planned shape (CublasLtGemm::timings()).
struct GemmCandidateTimes {
  std::string shape;     ///< "linear M 12288 N 4096 K 4096" style
  double flops = 0;      ///< 2 m n k
  std::vector<float> ms; ///< median per candidate, heuristic order;
                         ///< negative: the candidate failed to run
  int chosen = 0;        ///< index into ms
};

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_GEMMTIMING_H
