//===- Bf16.h - bf16 <-> float conversion on the host -----------*- C++ -*-===//
//
// Round-to-nearest-even conversion between float and the bits of a bf16, as
// the GPU's cvt.rn.bf16.f32 does. Shared by the runtime (checkpoints, data),
// the reference interpreter and the kernel tests; also usable in CUDA code.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BF16_H
#define DFLASH_KERNELS_BF16_H

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DFLASH_HOST_DEVICE __host__ __device__
#else
#define DFLASH_HOST_DEVICE
#endif

namespace dflash {

DFLASH_HOST_DEVICE inline float bf16ToFloat(uint16_t bits) {
  uint32_t word = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

DFLASH_HOST_DEVICE inline uint16_t floatToBf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if ((word & 0x7fffffffu) > 0x7f800000u) // NaN: rounding could give inf
    return uint16_t((word >> 16) | 0x0040u);
  uint32_t roundingBias = 0x7fffu + ((word >> 16) & 1u);
  return uint16_t((word + roundingBias) >> 16);
}

inline void floatsToBf16(const float *in, uint16_t *out, size_t count) {
  for (size_t i = 0; i < count; ++i)
    out[i] = floatToBf16(in[i]);
}

inline void bf16ToFloats(const uint16_t *in, float *out, size_t count) {
  for (size_t i = 0; i < count; ++i)
    out[i] = bf16ToFloat(in[i]);
}

} // namespace dflash

#endif // DFLASH_KERNELS_BF16_H
