//===- MoeGpuTest.cu - Routing, grouping, grouped GEMMs, the weighted sum -===//
//
// kernels/Moe.cuh against kernels/reference/Moe.cpp in double on the same
// bf16-rounded inputs: routing in Qwen3-MoE's and gpt-oss's forms (ties
// included), the grouping by expert (exact: a permutation and a copy), the
// grouped GEMMs plain and with SwiGLU on groups that are empty, one row,
// whole and partial tiles, with and without gpt-oss's biases and clamped
// activation (at gpt-oss-20b's shapes too), and the weighted sum back to
// the tokens.
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

void routeCase(int64_t T, int64_t E, int64_t k, bool normalize, uint64_t seed,
               ref::MoeScoring scoring = ref::MoeScoring::SoftmaxTopK) {
  const bool topKThenSoftmax = scoring == ref::MoeScoring::TopKSoftmax;
  SCOPED_TRACE(testing::Message() << "T=" << T << " E=" << E << " k=" << k
                                  << " normalize=" << normalize
                                  << " topKThenSoftmax=" << topKThenSoftmax);
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
  // Ties across the k-th on every fourth token from the third: k + 1
  // experts (E - 1, E - 4, ...) share the largest logit, so all but the
  // highest of them are chosen, in ascending order.
  const bool boundaryTies = 3 * k + 1 <= E;
  if (boundaryTies)
    for (int64_t t = 2; t < T; t += 4) {
      float top = -1e30f;
      for (int64_t e = 0; e < E; ++e)
        top = std::max(top, float(logits.values[t * E + e]));
      for (int64_t i = 0; i <= k; ++i)
        logits.set(t * E + E - 1 - 3 * i, top + 1.f);
    }
  logits.upload();
  std::vector<double> refWeights(T * k);
  std::vector<int32_t> refExperts(T * k);
  ref::moeRoute(logits.values.data(), refWeights.data(), refExperts.data(), T,
                E, k, normalize, scoring);
  DeviceBuffer<bf16> weights(T * k);
  DeviceBuffer<int32_t> experts(T * k);
  poisonAll(weights, experts);
  kernels::moe_route_bf16(logits.ptr(), weights.get(), experts.get(), T, E, k,
                          normalize, 0, topKThenSoftmax);
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
  if (boundaryTies)
    for (int64_t t = 2; t < T; t += 4)
      for (int64_t j = 0; j < k; ++j)
        EXPECT_EQ(got[t * k + j], E - 1 - 3 * (k - j)) << "token " << t;
  EXPECT_CLOSE(downloadBf16(weights), refWeights, 5e-3, "weights");
  if (topKThenSoftmax && !normalize && k < E) {
    // Unnormalised, Qwen3-MoE's weights are not gpt-oss's (unless every
    // expert is chosen): a kernel that ignored the form would fail above.
    std::vector<double> otherWeights(T * k);
    std::vector<int32_t> otherExperts(T * k);
    ref::moeRoute(logits.values.data(), otherWeights.data(),
                  otherExperts.data(), T, E, k, false);
    EXPECT_GT(relativeError(otherWeights, refWeights), 0.05);
  }
}

TEST(MoeRoute, MatchesTheReference) {
  routeCase(1000, 8, 2, true, 1);
  routeCase(777, 128, 8, true, 2);
  routeCase(300, 128, 8, false, 3);
  routeCase(64, 512, 32, true, 4);
  routeCase(50, 32, 32, false, 5); // every expert chosen
}

TEST(MoeRoute, TopKThenSoftmaxMatchesTheReference) {
  constexpr auto gptOss = ref::MoeScoring::TopKSoftmax;
  routeCase(1000, 32, 4, false, 6, gptOss); // gpt-oss-20b
  routeCase(333, 32, 4, true, 7, gptOss);   // normalize is moot
  routeCase(777, 128, 4, false, 8, gptOss); // gpt-oss-120b
  routeCase(64, 512, 32, false, 9, gptOss);
  routeCase(50, 32, 32, false, 10, gptOss); // every expert chosen
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

/// Offsets of T tokens' k rows each, routed at random over E experts but
/// one (gpt-oss's few rows an expert: partial tiles and an empty group).
std::vector<int32_t> routedOffsets(int64_t T, int64_t E, int64_t k,
                                   std::mt19937_64 &rng, int64_t *M) {
  std::vector<int32_t> offsets(E + 1, 0);
  for (int32_t e : randomRouting(T, E, k, int32_t(E / 3), rng))
    ++offsets[e + 1];
  std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());
  *M = offsets.back();
  return offsets;
}

/// gpt-oss's extras of a grouped GEMM: biases, the clamped activation, and
/// how its rows are grouped.
struct GptOssForm {
  bool biased = false, clamped = false;
  /// The weights' scale: large enough, |g| and |u| often pass the limit.
  double weightScale = 1.0;
  /// Tokens (top-k each) routed over the experts; 0: skewedOffsets.
  int64_t tokens = 0, topK = 0;
};

constexpr double kGptOssAlpha = 1.702, kGptOssLimit = 7.0;

void groupedCase(int64_t E, int64_t N, int64_t K, bool swiglu, uint64_t seed,
                 const GptOssForm &form = {}) {
  SCOPED_TRACE(testing::Message()
               << "E=" << E << " N=" << N << " K=" << K << " swiglu=" << swiglu
               << " biased=" << form.biased << " clamped=" << form.clamped);
  std::mt19937_64 rng(seed);
  int64_t M = 0;
  std::vector<int32_t> hostOffsets =
      form.tokens > 0 ? routedOffsets(form.tokens, E, form.topK, rng, &M)
                      : skewedOffsets(E, rng, &M);
  Bf16Tensor x = randomBf16(M * K, rng);
  const double scale = form.weightScale / std::sqrt(double(K));
  Bf16Tensor wg = randomBf16(E * N * K, rng, 2.0 * scale);
  Bf16Tensor wu = randomBf16(E * N * K, rng, scale);
  // Biases of about the products' size, so that leaving one out shows.
  Bf16Tensor bg = randomBf16(E * N, rng, form.weightScale);
  Bf16Tensor bu = randomBf16(E * N, rng, form.weightScale);
  const double *gateBias = form.biased ? bg.values.data() : nullptr;
  const double *upBias = form.biased ? bu.values.data() : nullptr;
  std::vector<double> g(M * N), u(M * N), ref(M * N);
  ref::groupedLinear(x.values.data(), wg.values.data(), hostOffsets.data(),
                     g.data(), E, N, K, gateBias);
  if (swiglu) {
    ref::groupedLinear(x.values.data(), wu.values.data(), hostOffsets.data(),
                       u.data(), E, N, K, upBias);
    if (form.clamped) {
      ref::clampedSwiglu(g.data(), u.data(), ref.data(), M * N, kGptOssAlpha,
                         kGptOssLimit);
      // The clamping must matter: a good share of the products pass the
      // limit, and without it the reference differs.
      int64_t past = 0;
      for (int64_t i = 0; i < M * N; ++i)
        past += g[i] > kGptOssLimit || std::abs(u[i]) > kGptOssLimit;
      EXPECT_GT(double(past), 0.2 * double(M * N)) << "products past the limit";
      std::vector<double> unclamped(M * N);
      ref::clampedSwiglu(g.data(), u.data(), unclamped.data(), M * N,
                         kGptOssAlpha, double(INFINITY));
      EXPECT_GT(relativeError(unclamped, ref), 0.05);
    } else {
      ref::swiglu(g.data(), u.data(), ref.data(), M * N);
    }
  } else {
    ref = g;
  }
  DeviceBuffer<int32_t> offsets(E + 1);
  offsets.upload(hostOffsets);
  DeviceBuffer<bf16> y(M * N);
  y.poison();
  const bf16 *gateBiasDev = form.biased ? bg.ptr() : nullptr;
  const bf16 *upBiasDev = form.biased ? bu.ptr() : nullptr;
  if (swiglu)
    kernels::grouped_linear_swiglu_bf16(
        x.ptr(), wg.ptr(), wu.ptr(), offsets.get(), y.get(), M, E, N, K, 0,
        gateBiasDev, upBiasDev, form.clamped, float(kGptOssAlpha),
        float(kGptOssLimit));
  else
    kernels::grouped_linear_bf16(x.ptr(), wg.ptr(), offsets.get(), y.get(), M,
                                 E, N, K, 0, gateBiasDev);
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

TEST(GroupedLinear, BiasedOnEveryGroupShape) {
  const GptOssForm biased{true, false};
  groupedCase(16, 256, 128, false, 31, biased);
  groupedCase(12, 200, 72, false, 32, biased);
  groupedCase(9, 768, 512, false, 33, biased);
}

TEST(GroupedLinear, GptOssSwigluOnEveryGroupShape) {
  // Weights 4x the plain cases': |g| and |u| often past the limit of 7.
  const GptOssForm clamped{true, true, 4.0};
  groupedCase(16, 128, 256, true, 41, clamped);
  groupedCase(12, 200, 72, true, 42, clamped);
  groupedCase(10, 768, 512, true, 43, clamped);
  groupedCase(8, 256, 128, true, 44, GptOssForm{false, true, 5.0});
  groupedCase(10, 768, 512, true, 45, GptOssForm{true, false}); // biases only
}

TEST(GroupedLinear, GptOss20bShapes) {
  // H = I = 2880, E 32, top-4 of 64 tokens (few rows an expert, N a partial
  // column tile): the fused gate and up projections, then the down one.
  groupedCase(32, 2880, 2880, true, 51, GptOssForm{true, true, 4.0, 64, 4});
  groupedCase(32, 2880, 2880, false, 52, GptOssForm{true, false, 1.0, 64, 4});
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
