//===- Mxfp4.cpp - MXFP4 expert weights to bf16 ---------------------------===//

#include "runtime/io/Mxfp4.h"

#include <cmath>
#include <cstring>

using namespace dflash;

namespace {

/// E2M1's 16 codes: sign, then 0, 0.5, 1, 1.5, 2, 3, 4, 6.
constexpr float kFp4Values[16] = {0.f,  0.5f, 1.f,  1.5f,  2.f,  3.f,
                                  4.f,  6.f,  -0.f, -0.5f, -1.f, -1.5f,
                                  -2.f, -3.f, -4.f, -6.f};

/// The bf16 bits of a float that bf16 holds exactly (its low half is 0).
uint16_t exactBf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return uint16_t(bits >> 16);
}

} // namespace

Status rt::dequantizeMxfp4(const uint8_t *blocks, const uint8_t *scales,
                           int64_t groups, const std::string &tensor,
                           uint16_t *out) {
  for (int64_t g = 0; g < groups; ++g) {
    if (scales[g] == 255)
      return Status::error(tensor + ": MXFP4 scale of group " +
                           std::to_string(g) + " is 255 (NaN in E8M0)");
    // 2^(s - 127) times an E2M1 value (at most two significant bits) is
    // an exact normal or subnormal float, or overflows.
    const int exponent = int(scales[g]) - 127;
    const uint8_t *block = blocks + g * kMxfp4GroupBytes;
    uint16_t *values = out + g * kMxfp4GroupValues;
    for (int64_t v = 0; v < kMxfp4GroupValues; ++v) {
      const uint8_t byte = block[v / 2];
      const float value =
          std::ldexp(kFp4Values[v % 2 == 0 ? byte & 0xF : byte >> 4], exponent);
      // Scales above 252 can overflow (6 * 2^126 does): refused, not inf.
      if (!std::isfinite(value))
        return Status::error(tensor + ": MXFP4 value " + std::to_string(v) +
                             " of group " + std::to_string(g) +
                             " overflows bf16 (scale " +
                             std::to_string(scales[g]) + ")");
      values[v] = exactBf16(value);
    }
  }
  return Status::success();
}
