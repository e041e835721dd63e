//===- GroupedConvLimits.h - Shapes the DFlash2 conv takes -----*- C++ -*-===//
//
// Plain C++, so that dflash-select-kernels can ask without CUDA headers
// (kernels/DFlash2Conv.cuh runs them).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_GROUPEDCONVLIMITS_H
#define DFLASH_KERNELS_GROUPEDCONVLIMITS_H

#include <cstdint>

namespace dflash::kernels {

/// The most taps grouped_conv_bf16 and grouped_conv_grad_bf16 take: the
/// taps are a template constant, a thread's kc weights and inputs held in
/// registers. schema/ModelConfig.h's kMaxConvKernelSize, which the spec
/// reader enforces (dflash-select-kernels checks that the two agree).
constexpr int64_t kGroupedConvMaxTaps = 4;

/// The most channels of one group: a thread takes 8 channels (one 16-byte
/// vector), and the gradient sums a group's gs / 8 threads with warp
/// shuffles, so gs / 8 must be a power of two of at most 32 lanes.
constexpr int64_t kGroupedConvMaxGroupSize = 256;

/// Whether a group of gs channels is one the kernels take: 8, 16, ..., 256.
constexpr bool groupedConvSupportsGroupSize(int64_t gs) {
  return gs >= 8 && gs <= kGroupedConvMaxGroupSize && gs % 8 == 0 &&
         ((gs / 8) & (gs / 8 - 1)) == 0;
}

/// Whether the kernels take H channels, kc taps and groups of gs (H a
/// multiple of gs, so of 8 too).
constexpr bool groupedConvSupports(int64_t H, int64_t kc, int64_t gs) {
  return H > 0 && H % 8 == 0 && kc >= 1 && kc <= kGroupedConvMaxTaps &&
         groupedConvSupportsGroupSize(gs) && H % gs == 0;
}

/// One grouped convolution (docs/semantics.md section 13, "Convolution"):
/// input [B, Q, H], Q = N * bs; the projection D [B, Q, 2 * kc * (H / gs)]
/// of which `half` is read; base [kc, H], or [2, kc, H] (wholeBase) of which
/// row `half` is read.
struct GroupedConvShape {
  int64_t B, Q, H, bs, kc, gs, half;
  bool wholeBase;
  constexpr int64_t blocks() const { return B * (Q / bs); }
  constexpr int64_t groups() const { return H / gs; }
};

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_GROUPEDCONVLIMITS_H
