//===- MoeGpuTest.cu - Routing, grouping, grouped GEMMs, the weighted sum -===//
//
// kernels/Moe.cuh against kernels/reference/Moe.cpp in double on the same
// bf16-rounded inputs: routing (ties included), the grouping by expert
// (exact: a permutation and a copy), the grouped GEMMs plain and with SwiGLU
// on groups that are empty, one row, whole and partial tiles, and the
// weighted sum back to the tokens.
//
//===----------------------------------------------------------------------===//

#include "kernels/Moe.cuh"
#include "kernels/reference/Reference.h"
#include "test/gpu/GpuTestUtil.h"

#include <algorithm>
#include <numeric>

using namespace dflash;
using namespace dflash::gputest;
using bf16 = __nv_bfloat16;

namespace {

/// Each token's k distinct experts, drawn from [0, E) without `skipped`
/// (so that one expert gets no rows).
std::vector<int32_t> randomRouting(int64_t T, int64_t E, int64_t k,
                                   int32_t skipped, std::mt19937_64 &rng) {
  std::vector<int32_t> all, experts;
  for (int32_t e = 0; e < E; ++e)
    if (e != skipped)
      all.push_back(e);
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    experts.insert(experts.end(), all.begin(), all.begin() + k);
  }
  return experts;
}

void routeCase(int64_t T, int64_t E, int64_t k, bool normalize, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "T=" << T << " E=" << E << " k=" << k
                                  << " normalize=" << normalize);
  std::mt19937_64 rng(seed);
  Bf16Tensor logits = randomBf16(T * E, rng, 2.0);
  // Exact ties on every fourth token: experts 1 and E - 1 share the token's
  // largest logit, so both are chosen, the lower one first.
  for (int64_t t = 0; t < T; t += 4) {
    float top = -1e30f;
    for (int64_t e = 0; e < E; ++e)
      top = std::max(top, float(logits.values[t * E + e]));
    logits.set(t * E + 1, top + 1.f);
    logits.set(t * E + E - 1, top + 1.f);
  }
  logits.upload();
  std::vector<double> refWeights(T * k);
  std::vector<int32_t> refExperts(T * k);
  ref::moeRoute(logits.values.data(), refWeights.data(), refExperts.data(), T,
                E, k, normalize);
  DeviceBuffer<bf16> weights(T * k);
  DeviceBuffer<int32_t> experts(T * k);
  poisonAll(weights, experts);
  kernels::moe_route_bf16(logits.ptr(), weights.get(), experts.get(), T, E, k,
                          normalize, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> got = experts.download();
  // The chosen experts must agree wherever the k-th and (k+1)-th
  // probabilities are not within fp32 rounding of each other.
  int64_t differ = 0, near = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> p(logits.values.begin() + t * E,
                          logits.values.begin() + (t + 1) * E);
    std::sort(p.begin(), p.end(), std::greater<double>());
    const bool close = k < E && p[k - 1] - p[k] < 1e-6 * std::abs(p[k - 1]);
    near += close;
    bool same = std::equal(got.begin() + t * k, got.begin() + (t + 1) * k,
                           refExperts.begin() + t * k);
    differ += !same && !close;
  }
  EXPECT_EQ(differ, 0) << near << " tokens had a near tie at the k-th";
  for (int64_t t = 0; t < T; t += 4) {
    EXPECT_EQ(got[t * k], 1) << "token " << t;
    EXPECT_EQ(got[t * k + 1], E - 1) << "token " << t;
  }
  EXPECT_CLOSE(downloadBf16(weights), refWeights, 5e-3, "weights");
}

TEST(MoeRoute, MatchesTheReference) {
  routeCase(1000, 8, 2, true, 1);
  routeCase(777, 128, 8, true, 2);
  routeCase(300, 128, 8, false, 3);
  routeCase(64, 512, 32, true, 4);
  routeCase(50, 32, 32, false, 5); // every expert chosen
}

struct Grouping {
  std::vector<double> permuted;
  std::vector<int32_t> offsets, source;
};

Grouping referenceGrouping(const Bf16Tensor &x, const std::vector<int32_t> &e,
                           int64_t T, int64_t H, int64_t k, int64_t E) {
  Grouping g{std::vector<double>(T * k * H), std::vector<int32_t>(E + 1),
             std::vector<int32_t>(T * k)};
  ref::moePermute(x.values.data(), e.data(), g.permuted.data(),
                  g.offsets.data(), g.source.data(), T, H, k, E);
  return g;
}

TEST(MoePermute, GroupsByExpertInOrder) {
  for (auto [T, k, E, H] : {std::array<int64_t, 4>{700, 8, 128, 256},
                            {5, 2, 8, 64},
                            {2000, 1, 3, 8},
                            {1500, 4, 512, 128}}) {
    SCOPED_TRACE(testing::Message()
                 << "T=" << T << " k=" << k << " E=" << E << " H=" << H);
    std::mt19937_64 rng(uint64_t(T * 31 + E));
    Bf16Tensor x = randomBf16(T * H, rng);
    std::vector<int32_t> routing = randomRouting(T, E, k, int32_t(E / 2), rng);
    Grouping want = referenceGrouping(x, routing, T, H, k, E);
    DeviceBuffer<int32_t> experts(T * k), offsets(E + 1), source(T * k);
    DeviceBuffer<int32_t> workspace(
        kernels::moePermuteWorkspaceBytes(T * k, E) / sizeof(int32_t));
    DeviceBuffer<bf16> permuted(T * k * H);
    experts.upload(routing);
    for (int run = 0; run < 2; ++run) { // the second reuses a dirty workspace
      poisonAll(offsets, source, permuted);
      kernels::moe_permute_bf16(x.ptr(), experts.get(), permuted.get(),
                                offsets.get(), source.get(), T, H, k, E,
                                workspace.get(), 0);
      DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(offsets.download(), want.offsets);
      EXPECT_EQ(source.download(), want.source);
      EXPECT_EQ(downloadBf16(permuted), want.permuted);
    }
  }
}

/// Offsets of M rows over E experts: empty groups, a single row, whole
/// tiles and partial ones.
std::vector<int32_t> skewedOffsets(int64_t E, std::mt19937_64 &rng,
                                   int64_t *M) {
  std::vector<int32_t> sizes(E);
  std::uniform_int_distribution<int> rows(0, 400);
  for (int64_t e = 0; e < E; ++e)
    sizes[e] = e % 5 == 1 ? 0 : e % 7 == 2 ? 1 : e % 3 == 0 ? 256 : rows(rng);
  std::vector<int32_t> offsets(E + 1, 0);
  std::partial_sum(sizes.begin(), sizes.end(), offsets.begin() + 1);
  *M = offsets.back();
  return offsets;
}

void groupedCase(int64_t E, int64_t N, int64_t K, bool swiglu, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "E=" << E << " N=" << N << " K=" << K
                                  << " swiglu=" << swiglu);
  std::mt19937_64 rng(seed);
  int64_t M = 0;
  std::vector<int32_t> hostOffsets = skewedOffsets(E, rng, &M);
  Bf16Tensor x = randomBf16(M * K, rng);
  Bf16Tensor wg = randomBf16(E * N * K, rng, 2.0 / std::sqrt(double(K)));
  Bf16Tensor wu = randomBf16(E * N * K, rng, 1.0 / std::sqrt(double(K)));
  std::vector<double> g(M * N), u(M * N), ref(M * N);
  ref::groupedLinear(x.values.data(), wg.values.data(), hostOffsets.data(),
                     g.data(), E, N, K);
  if (swiglu) {
    ref::groupedLinear(x.values.data(), wu.values.data(), hostOffsets.data(),
                       u.data(), E, N, K);
    ref::swiglu(g.data(), u.data(), ref.data(), M * N);
  } else {
    ref = g;
  }
  DeviceBuffer<int32_t> offsets(E + 1);
  offsets.upload(hostOffsets);
  DeviceBuffer<bf16> y(M * N);
  y.poison();
  if (swiglu)
    kernels::grouped_linear_swiglu_bf16(x.ptr(), wg.ptr(), wu.ptr(),
                                        offsets.get(), y.get(), M, E, N, K, 0);
  else
    kernels::grouped_linear_bf16(x.ptr(), wg.ptr(), offsets.get(), y.get(), M,
                                 E, N, K, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  // One bf16 rounding of y (2^-9 relative) over fp32 sums of K terms.
  EXPECT_CLOSE(downloadBf16(y), ref, 5e-3, "y");
}

TEST(GroupedLinear, PlainOnEveryGroupShape) {
  groupedCase(16, 256, 128, false, 11);
  groupedCase(12, 200, 72, false, 12); // partial column tile, K mid-stage
  groupedCase(9, 768, 512, false, 13);
  groupedCase(3, 2048, 256, false, 14);
}

TEST(GroupedLinear, SwigluOnEveryGroupShape) {
  groupedCase(16, 128, 256, true, 21);
  groupedCase(12, 200, 72, true, 22);
  groupedCase(10, 768, 512, true, 23);
}

TEST(MoeUnpermute, WeightedSumOfEachTokensRows) {
  for (auto [T, k, E, H] : {std::array<int64_t, 4>{700, 8, 128, 256},
                            {33, 2, 8, 64},
                            {100, 1, 4, 8}}) {
    SCOPED_TRACE(testing::Message() << "T=" << T << " k=" << k << " H=" << H);
    std::mt19937_64 rng(uint64_t(T + k));
    Bf16Tensor x = randomBf16(T * H, rng);
    std::vector<int32_t> routing = randomRouting(T, E, k, -1, rng);
    Grouping g = referenceGrouping(x, routing, T, H, k, E);
    Bf16Tensor rows = randomBf16(T * k * H, rng);
    Bf16Tensor weights = randomBf16(T * k, rng, 0.3, 0.5);
    std::vector<double> ref(T * H);
    ref::moeUnpermute(rows.values.data(), g.source.data(),
                      weights.values.data(), ref.data(), T, H, k);
    DeviceBuffer<int32_t> source(T * k), workspace(T * k);
    source.upload(g.source);
    DeviceBuffer<bf16> y(T * H);
    poisonAll(y, workspace);
    kernels::moe_unpermute_bf16(rows.ptr(), source.get(), weights.ptr(),
                                y.get(), T, H, k, workspace.get(), 0);
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_CLOSE(downloadBf16(y), ref, 5e-3, "y");
  }
}

} // namespace
