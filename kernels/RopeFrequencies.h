//===- RopeFrequencies.h - RoPE's theta and Llama-3 scaling -----*- C++ -*-===//
//
// Plain C++, so that the generated kernels.h can pass it to the RoPE
// kernels (kernels/QkNormRope.cuh) without CUDA headers.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_ROPEFREQUENCIES_H
#define DFLASH_KERNELS_ROPEFREQUENCIES_H

namespace dflash::kernels {

/// RoPE's frequencies: theta, and Llama-3's rope scaling where factor > 0
/// (a target decoder's; the drafter's RoPE is unscaled). The fields mirror
/// dflash.scaled_rope's attributes.
struct RopeFrequencies {
  float theta;
  float factor = 0.f;
  float lowFreqFactor = 1.f, highFreqFactor = 4.f;
  float originalMaxPositions = 8192.f;
};

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_ROPEFREQUENCIES_H
