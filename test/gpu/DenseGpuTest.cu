//===- DenseGpuTest.cu - Norm, RoPE, SwiGLU, draft kernels ----------------===//
//
// rms_norm (with and without the fused residual add), q/k norm + RoPE,
// SwiGLU (strided, vector and scalar paths), the gate/up GEMM with SwiGLU
// applied and the draft bookkeeping kernels against kernels/reference in
// double on the same bf16-rounded inputs.
//
//===----------------------------------------------------------------------===//

#include "kernels/DraftBlocks.cuh"
#include "kernels/Embedding.cuh"
#include "kernels/QkNormRope.cuh"
#include "kernels/RmsNorm.cuh"
#include "kernels/SwiGlu.cuh"
#include "kernels/SwiGluGemm.cuh"
#include "kernels/reference/Reference.h"
#include "test/gpu/GpuTestUtil.h"

using namespace dflash;
using namespace dflash::gputest;
using bf16 = __nv_bfloat16;

namespace {

template <int H> void rmsNormCase(int64_t rows, bool residual, uint64_t seed) {
  SCOPED_TRACE(testing::Message()
               << "H=" << H << " rows=" << rows << " residual=" << residual);
  std::mt19937_64 rng(seed);
  const float eps = 1e-6f;
  Bf16Tensor x = randomBf16(rows * H, rng, 2.0);
  Bf16Tensor delta = randomBf16(rows * H, rng, 1.0);
  Bf16Tensor w = randomBf16(H, rng, 0.3, 1.0);
  // The normalised input: the bf16 sum the kernel stores, or x.
  std::vector<double> in = x.values;
  if (residual)
    for (size_t i = 0; i < in.size(); ++i)
      in[i] = roundBf16(static_cast<float>(x.values[i]) +
                        static_cast<float>(delta.values[i]));
  std::vector<double> ref(rows * H);
  ref::rmsNorm(in.data(), w.values.data(), ref.data(), rows, H, eps);

  DeviceBuffer<bf16> y(rows * H), sum(rows * H);
  poisonAll(y, sum);
  kernels::rms_norm_fwd_bf16<H>(x.ptr(), residual ? delta.ptr() : nullptr,
                                w.ptr(), residual ? sum.get() : nullptr,
                                y.get(), rows, eps, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_CLOSE(downloadBf16(y), ref, 1e-2, "y");
  if (residual)
    EXPECT_CLOSE(downloadBf16(sum), in, 0.0, "x + delta");

  // Backward, with the residual stream's gradient added when fused.
  Bf16Tensor dy = randomBf16(rows * H, rng);
  Bf16Tensor dres = randomBf16(rows * H, rng);
  std::vector<double> refDx(rows * H), refDw(H);
  ref::rmsNormGrad(dy.values.data(), in.data(), w.values.data(), refDx.data(),
                   refDw.data(), rows, H, eps);
  if (residual)
    for (size_t i = 0; i < refDx.size(); ++i)
      refDx[i] += dres.values[i];
  Bf16Tensor xin(rows * H);
  for (size_t i = 0; i < in.size(); ++i)
    xin.set(i, static_cast<float>(in[i]));
  xin.upload();
  DeviceBuffer<bf16> dx(rows * H), dwBf16(H);
  DeviceBuffer<float> dwF32(H), ws(kernels::rmsNormBwdWorkspaceBytes(H) / 4);
  poisonAll(dx, dwBf16, dwF32, ws);
  kernels::rms_norm_bwd_bf16<H>(dy.ptr(), xin.ptr(), w.ptr(),
                                residual ? dres.ptr() : nullptr, dx.get(),
                                dwF32.get(), rows, eps, ws.get(), 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_CLOSE(downloadBf16(dx), refDx, 1e-2, "dx");
  EXPECT_CLOSE(downloadF32(dwF32), refDw, 1e-4, "dw fp32");
  dx.poison();
  kernels::rms_norm_bwd_bf16<H>(dy.ptr(), xin.ptr(), w.ptr(),
                                residual ? dres.ptr() : nullptr, dx.get(),
                                dwBf16.get(), rows, eps, ws.get(), 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_CLOSE(downloadBf16(dwBf16), refDw, 1e-2, "dw bf16");
}

/// q/k norm + RoPE forward and backward against the reference; with YaRN's
/// frequencies (the drafter's [drafter.rope_scaling]) where `yarn` is given.
template <int D, int HEADS>
void qkNormRopeCase(int64_t rows, double theta, uint64_t seed,
                    const ref::YarnScaling *yarn = nullptr) {
  SCOPED_TRACE(testing::Message() << "D=" << D << " HEADS=" << HEADS
                                  << " rows=" << rows << " yarn=" << !!yarn);
  kernels::RopeFrequencies f{static_cast<float>(theta)};
  if (yarn) {
    f.yarnFactor = float(yarn->factor);
    kernels::yarnRampRange(D, theta, yarn->betaFast, yarn->betaSlow,
                           double(yarn->originalMaxPositions), yarn->truncate,
                           f.yarnLow, f.yarnHigh);
    f.attentionFactor = float(yarn->attentionFactor);
  }
  std::mt19937_64 rng(seed);
  const float eps = 1e-6f;
  const int64_t n = rows * HEADS * D;
  Bf16Tensor x = randomBf16(n, rng, 3.0);
  Bf16Tensor w = randomBf16(D, rng, 0.2, 1.0);
  std::vector<int32_t> pos(rows);
  std::uniform_int_distribution<int> pd(0, 4200);
  for (auto &p : pos)
    p = pd(rng);
  DeviceBuffer<int32_t> dPos(rows);
  dPos.upload(pos);

  std::vector<double> normed(n), ref(n);
  ref::rmsNorm(x.values.data(), w.values.data(), normed.data(), rows * HEADS, D,
               eps);
  for (auto &v : normed)
    v = roundBf16(v); // the kernel rounds between norm and rotation
  if (yarn)
    ref::yarnRope(normed.data(), pos.data(), ref.data(), rows, HEADS, D, *yarn);
  else
    ref::rope(normed.data(), pos.data(), ref.data(), rows, HEADS, D, theta);
  DeviceBuffer<bf16> y(n);
  y.poison();
  kernels::qk_norm_rope_fwd_bf16<D, HEADS>(x.ptr(), w.ptr(), dPos.get(),
                                           y.get(), rows, eps, f, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_CLOSE(downloadBf16(y), ref, 1e-2, "y");

  Bf16Tensor dy = randomBf16(n, rng);
  std::vector<double> dn(n), refDx(n), refDw(D);
  if (yarn)
    ref::yarnRopeGrad(dy.values.data(), pos.data(), dn.data(), rows, HEADS, D,
                      *yarn);
  else
    ref::ropeGrad(dy.values.data(), pos.data(), dn.data(), rows, HEADS, D,
                  theta);
  ref::rmsNormGrad(dn.data(), x.values.data(), w.values.data(), refDx.data(),
                   refDw.data(), rows * HEADS, D, eps);
  DeviceBuffer<bf16> dx(n);
  DeviceBuffer<float> dw(D), ws(kernels::qkNormRopeBwdWorkspaceBytes(D) / 4);
  poisonAll(dx, dw, ws);
  kernels::qk_norm_rope_bwd_bf16<D, HEADS>(dy.ptr(), x.ptr(), w.ptr(),
                                           dPos.get(), dx.get(), dw.get(), rows,
                                           eps, f, ws.get(), 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_CLOSE(downloadBf16(dx), refDx, 1e-2, "dx");
  EXPECT_CLOSE(downloadF32(dw), refDw, 1e-4, "dw");
}

/// A target decoder's RoPE without a norm (rope_fwd_bf16), Llama-3-scaled
/// where factor > 0, YaRN-scaled (as `yarn` says) where yarnFactor > 0,
/// against ref::rope / ref::scaledRope / ref::yarnRope.
template <int D, int HEADS>
void ropeAloneCase(int64_t rows, kernels::RopeFrequencies f, uint64_t seed,
                   const ref::YarnScaling &yarn = {}) {
  SCOPED_TRACE(testing::Message() << "D=" << D << " HEADS=" << HEADS << " rows="
                                  << rows << " factor=" << f.factor);
  std::mt19937_64 rng(seed);
  const int64_t n = rows * HEADS * D;
  Bf16Tensor x = randomBf16(n, rng, 2.0);
  std::vector<int32_t> pos(rows);
  std::uniform_int_distribution<int> pd(0, 4200);
  for (auto &p : pos)
    p = pd(rng);
  DeviceBuffer<int32_t> dPos(rows);
  dPos.upload(pos);
  std::vector<double> ref(n);
  if (f.yarnFactor > 0)
    ref::yarnRope(x.values.data(), pos.data(), ref.data(), rows, HEADS, D,
                  yarn);
  else if (f.factor > 0)
    ref::scaledRope(x.values.data(), pos.data(), ref.data(), rows, HEADS, D,
                    double(f.theta), double(f.factor), double(f.lowFreqFactor),
                    double(f.highFreqFactor), int64_t(f.originalMaxPositions));
  else
    ref::rope(x.values.data(), pos.data(), ref.data(), rows, HEADS, D,
              double(f.theta));
  DeviceBuffer<bf16> y(n);
  y.poison();
  kernels::rope_fwd_bf16<D, HEADS>(x.ptr(), dPos.get(), y.get(), rows, f, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_CLOSE(downloadBf16(y), ref, 1e-2, "y");
}

/// gate and up are the halves of one [rows, 2I] projection (row stride 2I).
void swigluCase(int64_t rows, int64_t I, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "rows=" << rows << " I=" << I);
  std::mt19937_64 rng(seed);
  Bf16Tensor gu = randomBf16(rows * 2 * I, rng, 2.0);
  std::vector<double> g(rows * I), u(rows * I);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < I; ++c) {
      g[r * I + c] = gu.values[r * 2 * I + c];
      u[r * I + c] = gu.values[r * 2 * I + I + c];
    }
  std::vector<double> ref(rows * I);
  ref::swiglu(g.data(), u.data(), ref.data(), rows * I);
  DeviceBuffer<bf16> y(rows * I);
  y.poison();
  kernels::StridedBf16 gate{gu.ptr(), 2 * I}, up{gu.ptr() + I, 2 * I};
  kernels::swiglu_fwd_bf16(gate, up, {y.get(), I}, rows, I, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_CLOSE(downloadBf16(y), ref, 1e-2, "y");

  Bf16Tensor dy = randomBf16(rows * I, rng);
  std::vector<double> refDg(rows * I), refDu(rows * I);
  ref::swigluGrad(dy.values.data(), g.data(), u.data(), refDg.data(),
                  refDu.data(), rows * I);
  DeviceBuffer<bf16> dgu(rows * 2 * I);
  dgu.poison();
  kernels::swiglu_bwd_bf16({dy.ptr(), I}, gate, up, {dgu.get(), 2 * I},
                           {dgu.get() + I, 2 * I}, rows, I, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> got = downloadBf16(dgu), gotDg(rows * I), gotDu(rows * I);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < I; ++c) {
      gotDg[r * I + c] = got[r * 2 * I + c];
      gotDu[r * I + c] = got[r * 2 * I + I + c];
    }
  EXPECT_CLOSE(gotDg, refDg, 1e-2, "dgate");
  EXPECT_CLOSE(gotDu, refDu, 1e-2, "dup");
}

/// swiglu_gemm_bf16's two forms (one CTA, and clusters of two sharing the
/// weight boxes) against silu(x Wg^T) * (x Wu^T) in double (the products
/// unrounded, as the kernel's fp32 accumulators are): shapes that fill the
/// 128 x 128 tiles and 64-deep stages, and ones that end mid-tile in every
/// dimension (an odd count of row tiles leaves a cluster's second CTA
/// wholly past M).
template <int Cluster>
void swigluGemmCase(int64_t M, int64_t F, int64_t K, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "cluster " << Cluster << " M=" << M
                                  << " F=" << F << " K=" << K);
  std::mt19937_64 rng(seed);
  Bf16Tensor x = randomBf16(M * K, rng, 1.0);
  Bf16Tensor wg = randomBf16(F * K, rng, 2.0 / std::sqrt(double(K)));
  Bf16Tensor wu = randomBf16(F * K, rng, 1.0 / std::sqrt(double(K)));
  std::vector<double> g(M * F), u(M * F), ref(M * F);
  ref::linear(x.values.data(), wg.values.data(), g.data(), M, F, K);
  ref::linear(x.values.data(), wu.values.data(), u.data(), M, F, K);
  ref::swiglu(g.data(), u.data(), ref.data(), M * F);
  DeviceBuffer<bf16> y(M * F);
  y.poison();
  ASSERT_TRUE(kernels::swigluGemmSupports(x.ptr(), wg.ptr(), wu.ptr(), y.get(),
                                          M, F, K));
  kernels::detail::launchSwiGluGemm<Cluster>(x.ptr(), wg.ptr(), wu.ptr(),
                                             {y.get(), M, F, K}, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  // One bf16 rounding of y (2^-9 relative) over fp32 sums of K terms.
  EXPECT_CLOSE(downloadBf16(y), ref, 5e-3, "y");
}

// The acceptance sums (docs/semantics.md sections 10 and 14) against
// ref::draftAcceptance on random hits, weights with holes (unsupervised and
// past-the-end slots), dropped blocks and anchors in packed rows (positions
// restart per conversation) spread over NB anchor-position buckets: counts,
// so exactly equal, and the per-bucket sums add up to the totals.
template <int NB>
void acceptanceCase(const std::vector<int64_t> &edges, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "NB=" << NB << " seed=" << seed);
  ASSERT_EQ(edges.size() + 1, size_t(NB));
  std::mt19937_64 rng(seed);
  const int B = 3, S = 90, N = 211;
  constexpr int bs = 16;
  kernels::DraftBlocksShape shape{B, S, N, bs};
  const int64_t slots = int64_t(B) * N * bs;
  std::vector<uint8_t> hits(slots), keep(size_t(B) * N);
  std::vector<float> weights(slots);
  std::vector<int32_t> anchors(size_t(B) * N), positionIds(size_t(B) * S);
  std::bernoulli_distribution right(0.8), weighted(0.9), kept(0.85),
      restart(0.05);
  for (int64_t i = 0; i < slots; ++i) {
    hits[size_t(i)] = right(rng);
    weights[size_t(i)] = i % bs == 0 || !weighted(rng) ? 0.f : 0.5f;
  }
  for (auto &k : keep)
    k = kept(rng);
  // Row 0 unpacked (arange), rows 1.. packed: a conversation restarts at 0.
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < S; ++t)
      positionIds[size_t(b * S + t)] =
          t == 0 || (b > 0 && restart(rng))
              ? 0
              : positionIds[size_t(b * S + t - 1)] + 1;
  std::uniform_int_distribution<int32_t> anchorAt(0, S - 2);
  for (auto &a : anchors)
    a = anchorAt(rng);
  ref::AnchorPositions where{anchors.data(), positionIds.data(), S,
                             edges.data(), int64_t(edges.size())};
  ref::AcceptanceSums expected = ref::draftAcceptance(
      hits.data(), weights.data(), keep.data(), B, N, bs, where);
  kernels::PositionBuckets<NB> buckets{};
  for (size_t j = 0; j < edges.size(); ++j)
    buckets.edges[j] = int32_t(edges[j]);
  DeviceBuffer<uint8_t> dHits(hits.size()), dKeep(keep.size());
  DeviceBuffer<float> dWeights(weights.size()), sums(2 + 2 * bs + 4 * NB);
  DeviceBuffer<int32_t> dAnchors(anchors.size()),
      dPositions(positionIds.size());
  dHits.upload(hits);
  dKeep.upload(keep);
  dWeights.upload(weights);
  dAnchors.upload(anchors);
  dPositions.upload(positionIds);
  poisonAll(sums);
  float *bucketSums = sums.get() + 2 + 2 * bs;
  kernels::draft_acceptance_f32<bs, NB>(
      dHits.get(), dWeights.get(), dKeep.get(), dAnchors.get(),
      dPositions.get(), buckets, sums.get(), sums.get() + 1, sums.get() + 2,
      sums.get() + 2 + bs, bucketSums, bucketSums + NB, bucketSums + 2 * NB,
      bucketSums + 3 * NB, shape, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got = sums.download();
  EXPECT_EQ(double(got[0]), expected.runSum);
  EXPECT_EQ(double(got[1]), expected.keptBlocks);
  double hitsTotal = 0, countsTotal = 0;
  for (int k = 0; k < bs; ++k) {
    EXPECT_EQ(double(got[size_t(2 + k)]), expected.positionHits[k]) << k;
    EXPECT_EQ(double(got[size_t(2 + bs + k)]), expected.positionCounts[k]) << k;
    hitsTotal += expected.positionHits[k];
    countsTotal += expected.positionCounts[k];
  }
  const size_t at = size_t(2 + 2 * bs);
  double runs = 0, blocks = 0, bucketHits = 0, bucketCounts = 0;
  for (int j = 0; j < NB; ++j) {
    EXPECT_EQ(double(got[at + j]), expected.bucketRuns[j]) << "bucket " << j;
    EXPECT_EQ(double(got[at + NB + j]), expected.bucketBlocks[j])
        << "bucket " << j;
    EXPECT_EQ(double(got[at + 2 * NB + j]), expected.bucketHits[j])
        << "bucket " << j;
    EXPECT_EQ(double(got[at + 3 * NB + j]), expected.bucketCounts[j])
        << "bucket " << j;
    EXPECT_GT(expected.bucketBlocks[j], 0.0) << "bucket " << j << " is empty";
    runs += got[at + j];
    blocks += got[at + NB + j];
    bucketHits += got[at + 2 * NB + j];
    bucketCounts += got[at + 3 * NB + j];
  }
  EXPECT_EQ(runs, double(got[0]));
  EXPECT_EQ(blocks, double(got[1]));
  EXPECT_EQ(bucketHits, hitsTotal);
  EXPECT_EQ(bucketCounts, countsTotal);
  EXPECT_EQ(expected.positionCounts[0], 0.0);
  EXPECT_GT(expected.positionCounts[bs - 1], 0.0);
  EXPECT_GT(expected.runSum, 1.5 * expected.keptBlocks) << "runs longer than 0";
  std::printf("acceptance (%d buckets): %g blocks kept, tau %.4f\n", NB, got[1],
              got[0] / got[1]);
}

TEST(DraftBlocks, AcceptanceSums) {
  acceptanceCase<1>({}, 14);
  acceptanceCase<4>({8, 20, 45}, 15);
  // The most buckets the kernel takes (kMaxPositionBuckets).
  acceptanceCase<8>({2, 5, 9, 14, 20, 30, 50}, 16);
}

} // namespace

TEST(RmsNorm, Hidden4096) {
  rmsNormCase<4096>(97, false, 1);
  rmsNormCase<4096>(97, true, 2);
}
TEST(RmsNorm, Hidden2880PartialVectors) {
  rmsNormCase<2880>(50, true, 3);
  rmsNormCase<2880>(1100, false, 4); // more rows than CTAs of the backward
}
TEST(RmsNorm, Hidden64) { rmsNormCase<64>(33, true, 5); }

TEST(QkNormRope, Head128) {
  qkNormRopeCase<128, 32>(70, 1e6, 6);
  qkNormRopeCase<128, 8>(1500, 1e6, 7);
}
TEST(QkNormRope, Head64) {
  qkNormRopeCase<64, 64>(40, 1.5e5, 8);
  qkNormRopeCase<64, 3>(50, 1e4, 9); // partial warp of head slots
}

TEST(RopeAlone, PlainAndLlama3Scaled) {
  ropeAloneCase<128, 32>(60, {5e5f}, 13);
  // An original context of 2048 puts the wavelengths of D 128 in all three
  // bands of the scaling.
  ropeAloneCase<128, 8>(300, {5e5f, 8.f, 1.f, 4.f, 2048.f}, 14);
  ropeAloneCase<64, 4>(77, {1e4f, 32.f, 1.f, 4.f, 64.f}, 15);
}

/// gpt-oss's YaRN: head dim 64, theta 150000, factor 32 over an original
/// 4096 positions (its ramp covers i in about [8, 18) of 32, so positions
/// up to 4200 exercise all three parts); truncated and not.
template <int D, int HEADS>
void yarnCase(int64_t rows, double theta, double factor, bool truncate,
              uint64_t seed) {
  ref::YarnScaling yarn{
      theta, factor, 32.0, 1.0, 4096, truncate, 0.1 * std::log(factor) + 1.0};
  kernels::RopeFrequencies f{float(theta)};
  f.yarnFactor = float(factor);
  kernels::yarnRampRange(D, theta, yarn.betaFast, yarn.betaSlow,
                         double(yarn.originalMaxPositions), truncate, f.yarnLow,
                         f.yarnHigh);
  f.attentionFactor = float(yarn.attentionFactor);
  ropeAloneCase<D, HEADS>(rows, f, seed, yarn);
  // The scaling must matter: plain RoPE at the same theta differs.
  std::vector<float> inv(D / 2);
  ref::yarnInverseFrequencies(D, yarn, inv.data());
  EXPECT_LT(inv[D / 2 - 1], 0.5f / std::pow(float(theta), float(D - 2) / D));
}

TEST(RopeAlone, YarnScaled) {
  yarnCase<64, 64>(50, 1.5e5, 32.0, false, 17);
  yarnCase<64, 8>(200, 1.5e5, 32.0, true, 18);
  yarnCase<128, 4>(90, 1e6, 4.0, false, 19);
}

/// The drafter's YaRN through the fused q/k norm + RoPE kernels (what
/// dflash-select-kernels refuses until this passes): Qwen3's block (head
/// dim 128, theta 1e6, factor 4 over 32768, 32 query and 8 key heads), a
/// short original context whose ramp the positions up to 4200 cross, and
/// head dim 64 untruncated with a given attention factor.
TEST(QkNormRope, YarnForwardAndBackward) {
  const ref::YarnScaling qwen3{
      1e6, 4.0, 32.0, 1.0, 32768, true, 0.1 * std::log(4.0) + 1.0};
  qkNormRopeCase<128, 32>(70, 1e6, 31, &qwen3);
  qkNormRopeCase<128, 8>(130, 1e6, 32, &qwen3);
  const ref::YarnScaling shortContext{
      1e6, 8.0, 32.0, 1.0, 1024, true, 0.1 * std::log(8.0) + 1.0};
  qkNormRopeCase<128, 8>(90, 1e6, 33, &shortContext);
  const ref::YarnScaling untruncated{1e4, 4.0, 16.0, 2.0, 512, false, 1.25};
  qkNormRopeCase<64, 4>(110, 1e4, 34, &untruncated);
}

TEST(Embedding, RowsById) {
  std::mt19937_64 rng(16);
  const int64_t V = 1000, H = 264, rows = 333;
  Bf16Tensor table = randomBf16(size_t(V * H), rng);
  std::vector<int32_t> ids(rows);
  std::uniform_int_distribution<int> tok(0, int(V) - 1);
  for (auto &t : ids)
    t = tok(rng);
  ids[0] = 0;
  ids[1] = int32_t(V - 1); // the table's first and last rows
  DeviceBuffer<int32_t> dIds(rows);
  dIds.upload(ids);
  DeviceBuffer<bf16> out(size_t(rows * H));
  out.poison();
  kernels::embed_rows_bf16(table.ptr(), dIds.get(), out.get(), rows, H, 1.f, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> ref(size_t(rows * H));
  ref::embed(table.values.data(), ids.data(), ref.data(), rows, H);
  // A copy: exact.
  EXPECT_CLOSE(downloadBf16(out), ref, 0.0, "out");
}

TEST(SwiGlu, VectorAndScalar) {
  swigluCase(37, 96, 10);
  swigluCase(21, 13, 11); // odd width: scalar path
}

template <int Cluster> void swigluGemmCases() {
  swigluGemmCase<Cluster>(256, 256, 512,
                          31); // whole tiles, 8 stages round the ring
  swigluGemmCase<Cluster>(300, 688, 264, 32);   // every dimension ends mid-tile
  swigluGemmCase<Cluster>(1, 130, 8, 33);       // one row, one stage of 8 deep
  swigluGemmCase<Cluster>(2176, 1280, 128, 34); // 170 tiles: CTAs go round
  swigluGemmCase<Cluster>(640, 384, 2048, 35);  // deep K, 5 row tiles
}

TEST(SwiGluGemm, WholeAndPartialTiles) { swigluGemmCases<1>(); }
TEST(SwiGluGemm, ClustersOfTwo) { swigluGemmCases<2>(); }

// The same inputs twice give the same bits (no race between the stages or
// the two CTAs of a cluster).
TEST(SwiGluGemm, Deterministic) {
  const int64_t M = 1000, F = 2048, K = 1024;
  std::mt19937_64 rng(36);
  Bf16Tensor x = randomBf16(M * K, rng, 1.0);
  Bf16Tensor wg = randomBf16(F * K, rng, 2.0 / 32);
  Bf16Tensor wu = randomBf16(F * K, rng, 1.0 / 32);
  DeviceBuffer<bf16> a(M * F), b(M * F);
  a.poison();
  b.poison();
  kernels::swiglu_gemm_bf16(x.ptr(), wg.ptr(), wu.ptr(), {a.get(), M, F, K}, 0);
  kernels::swiglu_gemm_bf16(x.ptr(), wg.ptr(), wu.ptr(), {b.get(), M, F, K}, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(downloadBf16(a), downloadBf16(b));
}

TEST(SwiGluGemm, RefusesWhatTmaCannotRead) {
  DeviceBuffer<bf16> b(1024);
  EXPECT_FALSE(kernels::swigluGemmSupports(b.get(), b.get(), b.get(), b.get(),
                                           4, 8, 12)); // K % 8
  EXPECT_FALSE(kernels::swigluGemmSupports(b.get(), b.get(), b.get(), b.get(),
                                           4, 7, 16)); // odd F
  EXPECT_FALSE(kernels::swigluGemmSupports(b.get() + 1, b.get(), b.get(),
                                           b.get(), 4, 8, 16)); // unaligned x
}

TEST(DraftBlocks, EmbedPositionsTargets) {
  std::mt19937_64 rng(12);
  const int B = 3, S = 90, N = 7, bs = 16, V = 500, mask = 499;
  constexpr int H = 264;
  kernels::DraftBlocksShape shape{B, S, N, bs};
  const int64_t Q = int64_t(N) * bs;
  std::vector<int32_t> ids(B * S), anchors(B * N), positions(B * S);
  std::vector<uint8_t> keep(B * N), lossMask(B * S);
  std::uniform_int_distribution<int> tok(0, V - 2), pos(0, S - 2);
  std::bernoulli_distribution coin(0.7);
  for (auto &t : ids)
    t = tok(rng);
  for (auto &m : lossMask)
    m = coin(rng);
  for (int i = 0; i < B * N; ++i) {
    anchors[i] = i % N == N - 1 ? S - 2 : pos(rng); // one block runs past S
    keep[i] = coin(rng);
  }
  // Row 0 unpacked; rows 1 and 2 packed, conversations restarting every 25
  // and every 11 tokens (docs/semantics.md section 9).
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < S; ++j)
      positions[b * S + j] = b == 0 ? j : j % (b == 1 ? 25 : 11);
  DeviceBuffer<int32_t> dIds(ids.size()), dAnchors(anchors.size()),
      dPositions(positions.size());
  DeviceBuffer<uint8_t> dKeep(keep.size()), dMask(lossMask.size());
  dIds.upload(ids);
  dAnchors.upload(anchors);
  dKeep.upload(keep);
  dMask.upload(lossMask);
  dPositions.upload(positions);
  Bf16Tensor table = randomBf16(size_t(V) * H, rng);

  std::vector<int32_t> refTokens(B * Q), refPos(B * Q), refLabels(B * Q);
  std::vector<double> refW(B * Q);
  ref::draftTokens(ids.data(), anchors.data(), keep.data(), refTokens.data(), B,
                   S, N, bs, mask);
  ref::draftPositions(anchors.data(), positions.data(), refPos.data(), B, S, N,
                      bs);
  ref::draftTargets(ids.data(), lossMask.data(), anchors.data(), keep.data(),
                    positions.data(), refLabels.data(), refW.data(), B, S, N,
                    bs, 7.0);
  std::vector<double> refX(B * Q * H);
  ref::embed(table.values.data(), refTokens.data(), refX.data(), B * Q, H);

  DeviceBuffer<bf16> x(B * Q * H);
  DeviceBuffer<int32_t> tokens(B * Q), dPos(B * Q), labels(B * Q);
  DeviceBuffer<float> weights(B * Q);
  poisonAll(tokens, dPos, labels, x, weights);
  kernels::draft_embed_bf16<H>(table.ptr(), dIds.get(), dAnchors.get(),
                               dKeep.get(), x.get(), tokens.get(), shape, mask,
                               1.f, 0);
  kernels::draft_positions(dAnchors.get(), dPositions.get(), dPos.get(), shape,
                           0);
  kernels::draft_targets(dIds.get(), dMask.get(), dAnchors.get(), dKeep.get(),
                         dPositions.get(), labels.get(), weights.get(), shape,
                         7.0, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(tokens.download(), refTokens);
  EXPECT_EQ(dPos.download(), refPos);
  EXPECT_EQ(labels.download(), refLabels);
  EXPECT_CLOSE(downloadF32(weights), refW, 1e-7, "weights");
  EXPECT_CLOSE(downloadBf16(x), refX, 0.0, "embedding rows");
}
