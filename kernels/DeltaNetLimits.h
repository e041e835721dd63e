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

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_DELTANETLIMITS_H
