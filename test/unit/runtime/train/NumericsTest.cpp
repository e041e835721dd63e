//===- NumericsTest.cpp - bf16, random numbers, LR schedule ---------------===//

#include "kernels/Bf16.h"
#include "runtime/data/Rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

using namespace dflash;
using namespace dflash::rt;

namespace {

uint32_t bitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float floatOf(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

//===----------------------------------------------------------------------===//
// bf16
//===----------------------------------------------------------------------===//

TEST(RuntimeBf16, ExactValues) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(floatToBf16(0.0f), 0x0000);
  EXPECT_EQ(floatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(bf16ToFloat(0xc000), -2.0f);
}

TEST(RuntimeBf16, RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between 1 (even) and 1 + 2^-7 (odd): down.
  EXPECT_EQ(floatToBf16(1.0f + 0x1.0p-8f), 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
  EXPECT_EQ(floatToBf16(1.0f + 3 * 0x1.0p-8f), 0x3f82);
  // Just above the halfway point rounds up, just below rounds down.
  EXPECT_EQ(floatToBf16(floatOf(0x3f808001)), 0x3f81);
  EXPECT_EQ(floatToBf16(floatOf(0x3f807fff)), 0x3f80);
  // Rounding carries into the exponent.
  EXPECT_EQ(floatToBf16(floatOf(0x3fffffff)), 0x4000);
}

TEST(RuntimeBf16, SpecialValues) {
  float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(floatToBf16(inf), 0x7f80);
  EXPECT_EQ(floatToBf16(-inf), 0xff80);
  // The largest float overflows to infinity, as IEEE rounding does.
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7f80);
  // A NaN whose payload sits only in the dropped bits stays a NaN.
  uint16_t nan = floatToBf16(floatOf(0x7f800001));
  EXPECT_TRUE(std::isnan(bf16ToFloat(nan)));
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(floatOf(0xffc00000)))));
  EXPECT_EQ(floatToBf16(floatOf(0xffc00000)) & 0x8000, 0x8000);
  // Subnormals round like everything else.
  EXPECT_EQ(floatToBf16(floatOf(0x00010000)), 0x0001);
}

TEST(RuntimeBf16, EveryBf16RoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    float value = bf16ToFloat(uint16_t(bits));
    EXPECT_EQ(bitsOf(value), bits << 16);
    if (std::isnan(value))
      EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(value))));
    else
      ASSERT_EQ(floatToBf16(value), bits) << "bits " << bits;
  }
}

TEST(RuntimeBf16, BulkConversion) {
  float in[3] = {1.0f, -0.5f, 3.0f};
  uint16_t mid[3];
  float out[3];
  floatsToBf16(in, mid, 3);
  bf16ToFloats(mid, out, 3);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(in[i], out[i]);
}

//===----------------------------------------------------------------------===//
// Rng
//===----------------------------------------------------------------------===//

TEST(RuntimeRng, SplitMixReferenceValue) {
  // The first splitmix64 output from state 0, as in Vigna's reference code.
  uint64_t state = 0;
  EXPECT_EQ(splitMix64(state), 0xe220a8397b1dcdafull);
}

TEST(RuntimeRng, Deterministic) {
  Rng a(42), b(42), c(43);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    uint64_t x = a.next();
    EXPECT_EQ(x, b.next());
    differs |= x != c.next();
  }
  EXPECT_TRUE(differs);
}

TEST(RuntimeRng, SaveAndRestore) {
  Rng rng(7);
  for (int i = 0; i < 10; ++i)
    rng.next();
  Rng::State saved = rng.state();
  std::vector<double> first;
  for (int i = 0; i < 20; ++i)
    first.push_back(rng.normal() + rng.uniform01() + double(rng.uniform(13)));
  Rng resumed(999);
  ASSERT_TRUE(resumed.restore(saved).ok());
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(first[size_t(i)], resumed.normal() + resumed.uniform01() +
                                    double(resumed.uniform(13)));
}

TEST(RuntimeRng, RestoreRejectsZeroState) {
  Rng rng(1);
  Status status = rng.restore({0, 0, 0, 0});
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.message(), "random generator state is all zero");
}

TEST(RuntimeRng, StreamsDiffer) {
  std::set<uint64_t> firsts;
  for (uint64_t seed = 0; seed < 4; ++seed)
    for (uint64_t stream = 0; stream < 64; ++stream)
      firsts.insert(Rng::forStream(seed, stream).next());
  EXPECT_EQ(firsts.size(), 4u * 64u);
  EXPECT_EQ(Rng::forStream(5, 9).next(), Rng::forStream(5, 9).next());
}

TEST(RuntimeRng, UniformIsInRangeAndFlat) {
  Rng rng(3);
  const uint64_t n = 7;
  const int draws = 70000;
  int counts[n] = {};
  for (int i = 0; i < draws; ++i) {
    uint64_t x = rng.uniform(n);
    ASSERT_LT(x, n);
    ++counts[x];
  }
  for (uint64_t k = 0; k < n; ++k)
    EXPECT_NEAR(counts[k], draws / double(n), 5 * std::sqrt(draws / 7.0));
  EXPECT_EQ(rng.uniform(0), 0u);
  EXPECT_EQ(rng.uniform(1), 0u);
  // A bound near 2^64 exercises the rejection path.
  uint64_t big = (uint64_t(1) << 63) + 12345;
  for (int i = 0; i < 1000; ++i)
    ASSERT_LT(rng.uniform(big), big);
}

TEST(RuntimeRng, UniformAndNormalMoments) {
  Rng rng(11);
  const int draws = 200000;
  double sum = 0, sumSq = 0, uniformSum = 0;
  for (int i = 0; i < draws; ++i) {
    double u = rng.uniform01();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    uniformSum += u;
    double z = rng.normal();
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sumSq += z * z;
  }
  EXPECT_NEAR(uniformSum / draws, 0.5, 0.005);
  EXPECT_NEAR(sum / draws, 0.0, 0.01);
  EXPECT_NEAR(sumSq / draws, 1.0, 0.02);
}

} // namespace
