//===- DeltaNetLimits.h - Shapes the hybrid kernels take --------*- C++ -*-===//
//
// Plain C++, so that dflash-select-kernels can ask without CUDA headers.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_DELTANETLIMITS_H
#define DFLASH_KERNELS_DELTANETLIMITS_H

#include <cstdint>

namespace dflash::kernels {

/// Whether gated_delta_rule_bf16 has a kernel for these head dimensions.
constexpr bool gatedDeltaRuleSupports(int64_t dk, int64_t dv) {
  return dk == dv && (dk == 32 || dk == 64 || dk == 128);
}

/// Whether causal_conv_bf16 has a kernel for C channels and K taps: a
/// thread takes 8 channels as one 16-byte vector, and K is a template
/// constant (Qwen3.5/3.6 and Qwen3-Next use 4).
constexpr int64_t kCausalConvMaxTaps = 4;
constexpr bool causalConvSupports(int64_t C, int64_t K) {
  return C > 0 && C % 8 == 0 && K >= 1 && K <= kCausalConvMaxTaps;
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_DELTANETLIMITS_H
