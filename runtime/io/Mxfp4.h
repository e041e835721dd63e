//===- Mxfp4.h - MXFP4 expert weights to bf16 -------------------*- C++ -*-===//
//
// gpt-oss's checkpoints store their experts' weights as MXFP4 (the OCP
// microscaling format): "<proj>_blocks" [..., G, 16] uint8, two FP4 (E2M1)
// values a byte, the low nibble first, and "<proj>_scales" [..., G] uint8,
// each an E8M0 power of two 2^(s - 127) for a group of 32 values. Every
// such value is exact in bf16, so dequantising loses nothing.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_MXFP4_H
#define DFLASH_RUNTIME_MXFP4_H

#include "schema/Status.h"

#include <cstdint>
#include <string>

namespace dflash::rt {

/// Values of one MXFP4 group, and bytes of its block.
constexpr int64_t kMxfp4GroupValues = 32;
constexpr int64_t kMxfp4GroupBytes = kMxfp4GroupValues / 2;

/// out [groups * 32] bf16 = the `groups` groups of blocks [groups, 16] and
/// scales [groups]. A scale of 255 (E8M0's NaN), or a value too large for
/// bf16 (scales above 252), is an error naming `tensor` and the group.
Status dequantizeMxfp4(const uint8_t *blocks, const uint8_t *scales,
                       int64_t groups, const std::string &tensor,
                       uint16_t *out);

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_MXFP4_H
