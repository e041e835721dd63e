//===- Bf16.h - bfloat16 <-> float conversion ------------------*- C++ -*-===//
//
// bf16 values are stored as their raw 16-bit patterns (uint16_t) everywhere in
// the runtime, so host code needs no CUDA header. The conversions match the
// CUDA intrinsics __float2bfloat16 (round to nearest even) and
// __bfloat162float, and are usable from CUDA host and device code.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_BF16_H
#define DFLASH_RUNTIME_BF16_H

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DFLASH_HOST_DEVICE __host__ __device__
#else
#define DFLASH_HOST_DEVICE
#endif

namespace dflash::rt {

/// The float whose upper 16 bits are `bits`.
DFLASH_HOST_DEVICE inline float bf16ToFloat(uint16_t bits) {
  uint32_t word = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

/// `value` rounded to the nearest bf16, ties to even. NaNs stay NaNs (quiet,
/// sign kept); infinities and overflow to infinity behave as IEEE rounding.
DFLASH_HOST_DEVICE inline uint16_t floatToBf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if ((word & 0x7fffffffu) > 0x7f800000u) // NaN: truncation could give inf
    return uint16_t((word >> 16) | 0x0040u);
  uint32_t roundingBias = 0x7fffu + ((word >> 16) & 1u);
  return uint16_t((word + roundingBias) >> 16);
}

/// Converts `count` floats to bf16.
inline void floatsToBf16(const float *in, uint16_t *out, size_t count) {
  for (size_t i = 0; i < count; ++i)
    out[i] = floatToBf16(in[i]);
}

/// Converts `count` bf16 values to floats.
inline void bf16ToFloats(const uint16_t *in, float *out, size_t count) {
  for (size_t i = 0; i < count; ++i)
    out[i] = bf16ToFloat(in[i]);
}

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_BF16_H
