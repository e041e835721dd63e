//===- Rng.cpp - xoshiro256** with splitmix64 seeding ---------------------===//

#include "runtime/data/Rng.h"

#include <cmath>

using namespace dflash;
using namespace dflash::rt;

/// pi, spelled out: M_PI is POSIX, not standard C++.
static constexpr double kPi = 3.14159265358979323846;

uint64_t dflash::rt::splitMix64(uint64_t &state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Rng::Rng(uint64_t seed) {
  uint64_t state = seed;
  for (uint64_t &word : words)
    word = splitMix64(state);
}

Rng Rng::forStream(uint64_t seed, uint64_t streamId) {
  // Mixing both through splitmix64 keeps (seed, id) and (seed + 1, id - 1)
  // apart, which a plain sum would not.
  uint64_t seedState = seed;
  uint64_t idState = streamId ^ 0xd1b54a32d192ed03ull;
  uint64_t mixed = splitMix64(seedState) ^ (splitMix64(idState) << 1);
  return Rng(mixed);
}

static inline uint64_t rotateLeft(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

uint64_t Rng::next() {
  uint64_t result = rotateLeft(words[1] * 5, 7) * 9;
  uint64_t t = words[1] << 17;
  words[2] ^= words[0];
  words[3] ^= words[1];
  words[1] ^= words[2];
  words[0] ^= words[3];
  words[2] ^= t;
  words[3] = rotateLeft(words[3], 45);
  return result;
}

uint64_t Rng::uniform(uint64_t n) {
  if (n == 0)
    return 0;
  // Lemire, "Fast Random Integer Generation in an Interval" (2019): the high
  // word of x * n is uniform once the low word's biased range is rejected.
  unsigned __int128 product = (unsigned __int128)next() * n;
  uint64_t low = uint64_t(product);
  if (low < n) {
    uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      product = (unsigned __int128)next() * n;
      low = uint64_t(product);
    }
  }
  return uint64_t(product >> 64);
}

double Rng::uniform01() { return double(next() >> 11) * 0x1.0p-53; }

double Rng::normal() {
  double u1 = 1.0 - uniform01(); // (0, 1]: log stays finite
  double u2 = uniform01();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
}

Status Rng::restore(const State &saved) {
  if ((saved[0] | saved[1] | saved[2] | saved[3]) == 0)
    return Status::error("random generator state is all zero");
  words = saved;
  return Status::success();
}
