//===- DeltaNetGpuTest.cu - The gated delta rule on the GPU ---------------===//
//
// kernels/GatedDeltaRule.cuh against kernels/reference/DeltaNet.cpp (token
// by token, double) on the same bf16-rounded inputs, at the head dims it
// has kernels for: rows longer than a chunk, value heads sharing key heads,
// and a packed row whose conversations (one of a single token, one that
// starts inside a chunk) restart the state. Outputs are poisoned first.
//
//===----------------------------------------------------------------------===//

#include "kernels/GatedDeltaRule.cuh"
#include "kernels/reference/Reference.h"
#include "test/gpu/GpuTestUtil.h"

using namespace dflash;
using namespace dflash::gputest;
using bf16 = __nv_bfloat16;

namespace {

void deltaCase(int64_t B, int64_t S, int64_t Hk, int64_t Hv, int64_t d,
               const std::vector<int64_t> &starts, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "B=" << B << " S=" << S << " Hk=" << Hk
                                  << " Hv=" << Hv << " d=" << d);
  std::mt19937_64 rng(seed);
  Bf16Tensor q = randomBf16(B * S * Hk * d, rng),
             k = randomBf16(B * S * Hk * d, rng);
  Bf16Tensor v = randomBf16(B * S * Hv * d, rng);
  Bf16Tensor a = randomBf16(B * S * Hv, rng),
             beta = randomBf16(B * S * Hv, rng);
  Bf16Tensor aLog = randomBf16(Hv, rng, 0.3, -1.0),
             dtBias = randomBf16(Hv, rng, 0.1);
  // Row 0 packs conversations starting at `starts`; the others are one.
  std::vector<int32_t> pos(size_t(B * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0, start = 0; t < S; ++t) {
      if (b == 0 && std::find(starts.begin(), starts.end(), t) != starts.end())
        start = t;
      pos[size_t(b * S + t)] = int32_t(t - start);
    }
  DeviceBuffer<int32_t> devPos(pos.size());
  devPos.upload(pos);
  DeviceBuffer<bf16> out(B * S * Hv * d);
  out.poison();
  kernels::gated_delta_rule_bf16(q.ptr(), k.ptr(), v.ptr(), a.ptr(), beta.ptr(),
                                 aLog.ptr(), dtBias.ptr(), devPos.get(),
                                 out.get(), B, S, Hk, Hv, d, d, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> want(size_t(B * S * Hv * d));
  ref::gatedDeltaRule(q.values.data(), k.values.data(), v.values.data(),
                      a.values.data(), beta.values.data(), aLog.values.data(),
                      dtBias.values.data(), pos.data(), want.data(), B, S, Hk,
                      Hv, d, d);
  std::vector<double> got = downloadBf16(out);
  EXPECT_CLOSE(got, want, 1e-2, "whole output");
  // Every token: a restart missed shows up at the token after it.
  double worst = 0;
  for (int64_t t = 0; t < B * S; ++t) {
    std::vector<double> g(got.begin() + t * Hv * d,
                          got.begin() + (t + 1) * Hv * d);
    std::vector<double> w(want.begin() + t * Hv * d,
                          want.begin() + (t + 1) * Hv * d);
    worst = std::max(worst, relativeError(g, w));
  }
  EXPECT_LE(worst, 3e-2) << "worst token";
  std::printf("  d=%lld: whole %.2e, worst token %.2e\n", (long long)d,
              relativeError(got, want), worst);
  if (starts.size() > 1) {
    // The control: without the restarts row 0 is far from what it got.
    std::vector<int32_t> plain(pos.size());
    for (int64_t i = 0; i < B * S; ++i)
      plain[size_t(i)] = int32_t(i % S);
    std::vector<double> joined(want.size());
    ref::gatedDeltaRule(q.values.data(), k.values.data(), v.values.data(),
                        a.values.data(), beta.values.data(), aLog.values.data(),
                        dtBias.values.data(), plain.data(), joined.data(), B, S,
                        Hk, Hv, d, d);
    EXPECT_GT(relativeError(got, joined), 0.05) << "the restarts matter";
  }
}

TEST(GatedDeltaRule, HeadDim128PackedRow) {
  // A single-token conversation at 150, starts inside chunks at 77 and 290.
  deltaCase(2, 300, 2, 6, 128, {0, 77, 150, 151, 290}, 1);
}

TEST(GatedDeltaRule, HeadDim64) { deltaCase(1, 100, 1, 2, 64, {0}, 2); }

TEST(GatedDeltaRule, HeadDim32PackedRow) {
  deltaCase(3, 70, 2, 4, 32, {0, 31, 33, 64}, 3);
}

} // namespace
