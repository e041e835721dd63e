//===- Mxfp4Test.cpp - MXFP4 expert weights to bf16 -----------------------===//
//
// rt::dequantizeMxfp4 against E2M1 decoded from its bit fields (sign,
// two exponent bits of bias 1, one mantissa bit; exponent 0 subnormal)
// rather than the loader's table, on random blocks and scales over the
// whole E8M0 range, and the NaN scale refused.
//
//===----------------------------------------------------------------------===//

#include "runtime/io/Mxfp4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace dflash;

namespace {

double e2m1(unsigned code) {
  const double sign = code & 8 ? -1.0 : 1.0;
  const unsigned exponent = (code >> 1) & 3, mantissa = code & 1;
  if (exponent == 0)
    return sign * 0.5 * mantissa;
  return sign * std::ldexp(1.0 + 0.5 * mantissa, int(exponent) - 1);
}

double bf16Value(uint16_t bits) {
  const uint32_t wide = uint32_t(bits) << 16;
  float v;
  std::memcpy(&v, &wide, sizeof(v));
  return v;
}

} // namespace

TEST(RuntimeMxfp4, MatchesTheBitFieldsOverEveryScale) {
  std::mt19937 rng(7);
  // Every scale that cannot overflow (6 * 2^(s - 127) < 2^128), 3 times.
  const int64_t groups = 253 * 3;
  std::vector<uint8_t> blocks(groups * rt::kMxfp4GroupBytes), scales(groups);
  for (auto &b : blocks)
    b = uint8_t(rng() & 0xFF);
  for (int64_t g = 0; g < groups; ++g)
    scales[g] = uint8_t(g % 253);
  std::vector<uint16_t> out(groups * rt::kMxfp4GroupValues, 0x7FC0); // NaN
  Status s = rt::dequantizeMxfp4(blocks.data(), scales.data(), groups,
                                 "experts.gate_up_proj_blocks", out.data());
  ASSERT_TRUE(s.ok()) << s.message();
  int64_t nonzero = 0;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t v = 0; v < rt::kMxfp4GroupValues; ++v) {
      const uint8_t byte = blocks[g * rt::kMxfp4GroupBytes + v / 2];
      const unsigned code = v % 2 == 0 ? byte & 0xF : byte >> 4;
      const double want = std::ldexp(e2m1(code), int(scales[g]) - 127);
      const double got = bf16Value(out[g * rt::kMxfp4GroupValues + v]);
      ASSERT_EQ(got, want) << "group " << g << " value " << v;
      ASSERT_EQ(std::signbit(got), bool(code & 8)) << "group " << g;
      nonzero += got != 0;
    }
  EXPECT_GT(nonzero, groups * rt::kMxfp4GroupValues / 2);
}

TEST(RuntimeMxfp4, AnOverflowIsAnErrorNotInfinity) {
  // 0x7 is 6.0: 6 * 2^127 overflows; 0x1 (0.5) at the same scale does not.
  std::vector<uint8_t> blocks(rt::kMxfp4GroupBytes, 0x11), scales{254};
  std::vector<uint16_t> out(rt::kMxfp4GroupValues);
  ASSERT_TRUE(
      rt::dequantizeMxfp4(blocks.data(), scales.data(), 1, "w", out.data())
          .ok());
  blocks[3] = 0x71;
  Status s =
      rt::dequantizeMxfp4(blocks.data(), scales.data(), 1, "w", out.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("value 7 of group 0 overflows"), std::string::npos)
      << s.message();
}

TEST(RuntimeMxfp4, ANanScaleIsAnErrorNamingTheTensorAndGroup) {
  std::vector<uint8_t> blocks(2 * rt::kMxfp4GroupBytes, 0x21), scales{127, 255};
  std::vector<uint16_t> out(2 * rt::kMxfp4GroupValues);
  Status s = rt::dequantizeMxfp4(blocks.data(), scales.data(), 2,
                                 "model.layers.3.mlp.experts.down_proj_scales",
                                 out.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.layers.3.mlp.experts.down_proj_scales"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("group 1"), std::string::npos) << s.message();
}
