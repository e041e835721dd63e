//===- StepTime.h - A step's time on an H100 and an H200 --------*- C++ -*-===//
//
// `dflashc --summary` estimates a step's time from its FLOPs at the rates the
// project measured (bench/RESULTS.md): the qwen3-8b-b16 step's achieved rate
// on an H200, scaled to each GPU by its bf16 GEMM ceiling over the H200's.
// The step is bound by its tensor-core work (the GEMMs, the lm_head and the
// attention took 95% of the qwen3-8b-b16 step on the H200, "Where the
// qwen3-8b-b16 step goes"), so the ceilings' ratio is what moves it between
// the two, which are one chip. The memory-bound rest (5.5%: AdamW, SwiGLU,
// the norms) runs about 1.4x longer on the H100's slower memory (copy 3040
// against 4270 GB/s), which leaves the H100 estimate about 2% short.
// Shapes far from qwen3-8b-b16's (small hidden sizes, few rows) reach less
// of the ceiling: the estimate is a floor for them.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_ANALYSIS_STEPTIME_H
#define DFLASH_COMPILER_ANALYSIS_STEPTIME_H

#include <cstdint>

namespace dflash {

/// The qwen3-8b-b16 step (4 rows x 3072, one H200): bench/RESULTS.md, the
/// Current table's row "qwen3-8b-b16 step, 4 rows x 3072, one GPU", 466.0 ms
/// for the 293.1 TFLOP that dflashc counts in that step.
inline constexpr double kH200StepTflops = 293.1 / 0.4660;
/// The online target's forward on one H200 (the Qwen3-8B-shaped target, 4 x
/// 3072 tokens, one CUDA graph): bench/RESULTS.md, the Current table's row
/// "online target: Qwen3-8B-shaped (layers 0..33 of 36, random weights)".
inline constexpr double kH200TargetTflops = 628;
/// cuBLASLt's bf16 GEMM of 8192^3 on a rested H200: bench/RESULTS.md,
/// "Kernels (bench/kernels)", "Ceilings in the same run".
inline constexpr double kH200GemmCeilingTflops = 805;
/// The same product through PyTorch (cuBLAS) on a rested H100, the best of
/// three runs: bench/RESULTS.md, "GPU ceilings for the step-time estimate".
inline constexpr double kH100GemmCeilingTflops = 785.2;

/// The shortest step the rates estimate: below it a step is bound by its
/// kernel launches and memory latency (tiny's 2 GFLOP step, 3 us at the
/// step's rate, took 0.67 ms with its online target on the H200:
/// bench/RESULTS.md's row "online training, tiny against a random Qwen3"),
/// while qwen3-8b-b16's step of one row, 73 TFLOP, reaches 95% of the
/// 4-row step's rate (122.6 against 466.0 ms).
inline constexpr double kSmallestEstimatedStepSeconds = 0.010;

/// The GPUs the summary estimates for, with the ratio of their ceilings.
struct GpuEstimate {
  const char *name;
  double ceilingRatio; ///< this GPU's GEMM ceiling over the H200's
};
inline constexpr GpuEstimate kH100 = {"H100", kH100GemmCeilingTflops /
                                                  kH200GemmCeilingTflops};
inline constexpr GpuEstimate kH200 = {"H200", 1.0};
inline constexpr GpuEstimate kEstimatedGpus[] = {kH100, kH200};

/// Seconds for `flops` at `h200Tflops` (one of the rates above), on `gpu`.
inline double estimatedSeconds(int64_t flops, double h200Tflops,
                               const GpuEstimate &gpu) {
  return double(flops) / (h200Tflops * 1e12 * gpu.ceilingRatio);
}

} // namespace dflash

#endif // DFLASH_COMPILER_ANALYSIS_STEPTIME_H
