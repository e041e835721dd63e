//===- StepTime.h - A step's time on an H100 and an H200 --------*- C++ -*-===//
//
// `dflashc --summary` estimates a step's time from its FLOPs at the rates the
// project measured (bench/RESULTS.md), at two rates: the block attention at
// the rate its kernels reach inside a long step, the rest at the rate that
// then gives the qwen3-8b-b16 step's measured time on an H200. One rate for
// all fits 3072-token rows, where attention is 5% of the FLOPs, but not long
// rows, where it is half and runs slower than the GEMMs (one rate put the
// qwen3-8b-b16 step at 128K 19% short of the H100's 601.6 ms; these two put
// it at 584 ms against the 576.5-579.7 measured with the warp-specialised
// forward, 64K at 346 against 342.6, qwen3.6-27b-b16 at 128K at 447 against
// 443.5, and 32K 1-4% short). Each rate is scaled to a GPU by
// its bf16 GEMM ceiling over the H200's: the step is bound by its
// tensor-core work, which the ceilings' ratio moves between the two, one
// chip. The memory-bound rest (5.5% at 3072: AdamW, SwiGLU, the norms) runs
// about 1.4x longer on the H100's slower memory (copy 3040 against 4270
// GB/s), which leaves the H100 estimate about 2% short. Shapes far from
// qwen3-8b-b16's (small hidden sizes, few rows) reach less of the ceiling:
// the estimate is a floor for them. The attention rate counts the FLOPs of
// anchors spread evenly over a row (dialect/DFlashFlops.cpp), as the step's
// own count does.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_COMPILER_ANALYSIS_STEPTIME_H
#define DFLASH_COMPILER_ANALYSIS_STEPTIME_H

#include <cstdint>

namespace dflash {

/// cuBLASLt's bf16 GEMM of 8192^3 on a rested H200: bench/RESULTS.md,
/// "Kernels (bench/kernels)", "Ceilings in the same run".
inline constexpr double kH200GemmCeilingTflops = 805;
/// The same product through PyTorch (cuBLAS) on a rested H100, the best of
/// three runs: bench/RESULTS.md, "GPU ceilings for the step-time estimate".
inline constexpr double kH100GemmCeilingTflops = 785.2;

/// The block attention inside the qwen3-8b-b16 step at one row of 131072
/// tokens on an H100, with the warp-specialised forward (bench/RESULTS.md,
/// "The 128K step's forward A/B, the backward's dQ adds, and the last torch
/// pairs", DFLASH_PROFILE): block_attention and block_attention_grad, 43.99 +
/// 109.98 TFLOP in 89.740 + 262.935 ms; as an H200's rate.
inline constexpr double kH200AttentionTflops =
    (43.99 + 109.98) / (0.089740 + 0.262935) * kH200GemmCeilingTflops /
    kH100GemmCeilingTflops;
/// The rest of a step: the qwen3-8b-b16 step (4 rows x 3072, one H200;
/// bench/RESULTS.md, the Current table's row "qwen3-8b-b16 step, 4 rows x
/// 3072, one GPU") took 466.0 ms for the 293.1 TFLOP that dflashc counts,
/// 14.57 of them block attention.
inline constexpr double kH200StepRestTflops =
    (293.1 - 14.57) / (0.4660 - 14.57 / kH200AttentionTflops);
/// The online target's forward, at three rates: its causal attention, its
/// Gated DeltaNet recurrence (hybrid targets) and the rest (the projections
/// and MLPs). One rate (628 TFLOP/s, the Qwen3-8B-shaped target at 4 x 3072
/// on an H200) put the target at one row of 131072 tokens 8% short on an
/// H100 and the Qwen3.6-27B-shaped hybrid 13% short: at long rows the causal
/// attention is most of the FLOPs and the recurrence, few FLOPs, about a
/// tenth of the time. The rates come from four forwards on one H100
/// (bench/RESULTS.md: "Long context: the online target at 64K ...", "The
/// online target at 128K, and ..." and "The hybrid target at one row of 64K
/// and 128K"), one conversation a row, with dflashc's counts (in PFLOP):
/// - Qwen3-8B-shaped with YaRN, 65536 tokens: rest 0.860126, causal
///   attention 1.196287, 3.5831 s; 131072 tokens: rest 1.720252, attention
///   4.785111, 11.5806 s. The two give the rest's rate (625 TFLOP/s) and the
///   attention's (542).
/// - Qwen3.6-27B-shaped hybrid, 65536 tokens: rest 3.093635, attention
///   0.791660, recurrence 0.016957, 7.3737 s: the recurrence's (17.6).
/// The fit puts the hybrid at 131072 tokens 0.3% over its 17.616 s, the
/// 8B-shaped target at 4 x 3072 on an H200 1% under its 273.5 ms, the
/// hybrid at 4 x 3072 on an H100 4% over its 1074 ms. Measured on an H100,
/// held as an H200's rates.
namespace target_fit {
inline constexpr double kRest64 = 0.860126, kAttention64 = 1.196287,
                        kSeconds64 = 3.5831;
inline constexpr double kRest128 = 1.720252, kAttention128 = 4.785111,
                        kSeconds128 = 11.5806;
inline constexpr double kDet =
    kRest64 * kAttention128 - kRest128 * kAttention64;
/// Seconds per PFLOP on an H100.
inline constexpr double kRestSpp =
    (kSeconds64 * kAttention128 - kSeconds128 * kAttention64) / kDet;
inline constexpr double kAttentionSpp =
    (kRest64 * kSeconds128 - kRest128 * kSeconds64) / kDet;
inline constexpr double kHybridRest64 = 3.093635, kHybridAttention64 = 0.791660,
                        kHybridDeltaRule64 = 0.016957,
                        kHybridSeconds64 = 7.3737;
inline constexpr double kDeltaRuleSpp =
    (kHybridSeconds64 - kHybridRest64 * kRestSpp -
     kHybridAttention64 * kAttentionSpp) /
    kHybridDeltaRule64;
inline constexpr double kToH200 =
    kH200GemmCeilingTflops / kH100GemmCeilingTflops;
} // namespace target_fit
inline constexpr double kH200TargetRestTflops =
    1e3 / target_fit::kRestSpp * target_fit::kToH200;
inline constexpr double kH200TargetAttentionTflops =
    1e3 / target_fit::kAttentionSpp * target_fit::kToH200;
inline constexpr double kH200TargetDeltaRuleTflops =
    1e3 / target_fit::kDeltaRuleSpp * target_fit::kToH200;
/// A mixture-of-experts target's grouped expert GEMMs run at a rate that
/// depends on their depth K: each 128-row tile's main loop runs K deep, and
/// its prologue and epilogue (the stores of its outputs) cost about as much
/// as expert_fit::kOverheadK more of depth. Fitted to the
/// Qwen3-30B-A3B-shaped target's profile on an H200 (bench/RESULTS.md, "Where
/// the time goes" in the section "Gradient accumulation on the H200
/// (2026-12-03)": DFLASH_PROFILE over 46 layers of 4 x 3072 tokens), the
/// gate / up SwiGLU GEMM (K 2048) 27.4 TFLOP in 44.3 ms and the down GEMM (K
/// 768) 13.7 TFLOP in 32.1 ms: rate(K) = peak K / (K + overhead). One rate
/// for the whole target had put it 22% short of its 162.6 ms, and the
/// Qwen3.5-35B-A3B-shaped hybrid (experts of K 2048 and 512) 24% short of
/// its 225.5 ms on an H100; these rates, with the routed rows' copies below,
/// put them 7% and 13% short (what is left: shorter expert groups' padding,
/// the hybrids' memory-bound ops, causal attention at 3K below the rate
/// fitted at long rows).
namespace expert_fit {
inline constexpr double kSwigluK = 2048, kSwigluTflops = 27.4 / 0.0443;
inline constexpr double kDownK = 768, kDownTflops = 13.7 / 0.0321;
/// From rate(K1) / rate(K2) = K1 (K2 + o) / (K2 (K1 + o)).
inline constexpr double kRatio = kSwigluTflops / kDownTflops;
inline constexpr double kOverheadK =
    kSwigluK * kDownK * (kRatio - 1) / (kSwigluK - kRatio * kDownK);
inline constexpr double kPeakTflops =
    kSwigluTflops * (kSwigluK + kOverheadK) / kSwigluK;
} // namespace expert_fit
/// The H200 rate of a grouped expert GEMM `depth` deep.
inline constexpr double expertGemmH200Tflops(double depth) {
  return expert_fit::kPeakTflops * depth / (depth + expert_fit::kOverheadK);
}
/// The routed rows' copies (moe_permute and moe_unpermute: a token's row
/// out to each of its k experts and their rows back), bytes read and
/// written: 41.68 GB in 7.5 + 5.4 ms in the same profile (46 layers of
/// 12288 tokens x 8 experts x 2048 bf16 and the 12288 x 2048 rows they come
/// from and go to), on an H200.
inline constexpr double kH200RoutedBytesPerSecond =
    46 * (2.0 * 98304 * 2048 * 2 + 2.0 * 12288 * 2048 * 2) / 0.0129;
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
  double copyRatio;    ///< its memory copy rate over the H200's
};
/// Copy rates (GB/s): bench/RESULTS.md's memory-bound kernels, H100 3040,
/// H200 4270.
inline constexpr GpuEstimate kH100 = {
    "H100", kH100GemmCeilingTflops / kH200GemmCeilingTflops, 3040.0 / 4270.0};
inline constexpr GpuEstimate kH200 = {"H200", 1.0, 1.0};
inline constexpr GpuEstimate kEstimatedGpus[] = {kH100, kH200};

/// Seconds for `flops` at `h200Tflops` (one of the rates above), on `gpu`.
inline double estimatedSeconds(int64_t flops, double h200Tflops,
                               const GpuEstimate &gpu) {
  return double(flops) / (h200Tflops * 1e12 * gpu.ceilingRatio);
}

/// Seconds for a drafter step of `flops`, `attentionFlops` of them block
/// attention (forward and gradient), on `gpu`.
inline double estimatedStepSeconds(int64_t flops, int64_t attentionFlops,
                                   const GpuEstimate &gpu) {
  return estimatedSeconds(flops - attentionFlops, kH200StepRestTflops, gpu) +
         estimatedSeconds(attentionFlops, kH200AttentionTflops, gpu);
}

/// What an online target's forward does, by the rates that time it.
struct TargetWork {
  int64_t flops = 0;            ///< all of it
  int64_t attentionFlops = 0;   ///< its causal attention
  int64_t deltaRuleFlops = 0;   ///< its Gated DeltaNet recurrence
  int64_t expertFlops = 0;      ///< its grouped expert GEMMs
  double expertH200Seconds = 0; ///< those at expertGemmH200Tflops(K) each
  double routedBytes = 0;       ///< moe_permute's and moe_unpermute's
};

/// Seconds for an online target's forward, on `gpu`.
inline double estimatedTargetSeconds(const TargetWork &w,
                                     const GpuEstimate &gpu) {
  return estimatedSeconds(w.flops - w.attentionFlops - w.deltaRuleFlops -
                              w.expertFlops,
                          kH200TargetRestTflops, gpu) +
         estimatedSeconds(w.attentionFlops, kH200TargetAttentionTflops, gpu) +
         estimatedSeconds(w.deltaRuleFlops, kH200TargetDeltaRuleTflops, gpu) +
         w.expertH200Seconds / gpu.ceilingRatio +
         w.routedBytes / (kH200RoutedBytesPerSecond * gpu.copyRatio);
}

} // namespace dflash

#endif // DFLASH_COMPILER_ANALYSIS_STEPTIME_H
