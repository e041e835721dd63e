//===- DeltaNetGpuTest.cu - The hybrid targets' kernels on the GPU --------===//
//
// kernels/GatedDeltaRule.cuh and kernels/HybridOps.cuh against
// kernels/reference/DeltaNet.cpp (double) on the same bf16-rounded inputs.
// The gated delta rule (its tensor-core kernel) at the head dims it takes: rows
// longer than a chunk, value heads sharing key heads, a packed row whose
// conversations (one of a single token, one that starts inside a chunk) restart
// the state, and a slow decay under which the state carried from chunk to chunk
// decides the outputs (with a control that drops it). The conv on a packed row,
// both norms, partial rotary and the sigmoid gate in both of its forms. Outputs
// are poisoned first.
//
//===----------------------------------------------------------------------===//

#include "kernels/GatedDeltaRule.cuh"
#include "kernels/HybridOps.cuh"
#include "kernels/reference/Reference.h"
#include "test/gpu/GpuTestUtil.h"

using namespace dflash;
using namespace dflash::gputest;
using bf16 = __nv_bfloat16;

namespace {

/// The decay rate's scale: exp(A_log) about e^-1 (fast: a chunk forgets
/// the state it was given) or e^-6 (slow: the state carries for hundreds
/// of tokens, so the chunk-to-chunk carry is what the test checks).
enum class Decay { Fast, Slow };

void deltaCases(int64_t B, int64_t S, int64_t Hk, int64_t Hv, int64_t d,
                const std::vector<int64_t> &starts, uint64_t seed,
                Decay decay = Decay::Fast) {
  SCOPED_TRACE(testing::Message()
               << "B=" << B << " S=" << S << " Hk=" << Hk << " Hv=" << Hv
               << " d=" << d << (decay == Decay::Slow ? " slow decay" : ""));
  std::mt19937_64 rng(seed);
  Bf16Tensor q = randomBf16(B * S * Hk * d, rng),
             k = randomBf16(B * S * Hk * d, rng);
  Bf16Tensor v = randomBf16(B * S * Hv * d, rng);
  Bf16Tensor a = randomBf16(B * S * Hv, rng),
             beta = randomBf16(B * S * Hv, rng);
  Bf16Tensor aLog =
                 randomBf16(Hv, rng, 0.3, decay == Decay::Slow ? -6.0 : -1.0),
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
  auto reference = [&](const std::vector<int32_t> &positions) {
    std::vector<double> y(size_t(B * S * Hv * d));
    ref::gatedDeltaRule(q.values.data(), k.values.data(), v.values.data(),
                        a.values.data(), beta.values.data(), aLog.values.data(),
                        dtBias.values.data(), positions.data(), y.data(), B, S,
                        Hk, Hv, d, d);
    return y;
  };
  const std::vector<double> want = reference(pos);
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
  std::printf("  d=%lld%s: whole %.2e, worst token %.2e\n", (long long)d,
              decay == Decay::Slow ? " slow decay" : "",
              relativeError(got, want), worst);
  if (starts.size() > 1) {
    // The control: without the restarts row 0 is far from what it got.
    std::vector<int32_t> plain(pos.size());
    for (int64_t i = 0; i < B * S; ++i)
      plain[size_t(i)] = int32_t(i % S);
    EXPECT_GT(relativeError(got, reference(plain)), 0.05)
        << "the restarts matter";
  }
  if (decay == Decay::Slow) {
    // The control: a state dropped every 64 tokens is far from it too.
    std::vector<int32_t> cut(pos.size());
    for (int64_t i = 0; i < B * S; ++i)
      cut[size_t(i)] = int32_t(pos[size_t(i)] % 64);
    EXPECT_GT(relativeError(got, reference(cut)), 0.05)
        << "the state carried between chunks matters";
  }
}

TEST(GatedDeltaRule, HeadDim128PackedRow) {
  // A single-token conversation at 150, starts inside chunks at 77 and 290.
  deltaCases(2, 300, 2, 6, 128, {0, 77, 150, 151, 290}, 1);
}

TEST(GatedDeltaRule, HeadDim64) { deltaCases(1, 100, 1, 2, 64, {0}, 2); }

TEST(GatedDeltaRule, HeadDim32PackedRow) {
  deltaCases(3, 70, 2, 4, 32, {0, 31, 33, 64}, 3);
}

// Slow decay: rows of many chunks whose state matters at the end; a
// conversation starting exactly on a 64-token boundary and one at 65.
TEST(GatedDeltaRule, SlowDecayCarriesTheState) {
  deltaCases(2, 700, 2, 4, 128, {0, 128, 193}, 4, Decay::Slow);
  deltaCases(1, 257, 1, 3, 64, {0}, 5, Decay::Slow);
  deltaCases(2, 130, 2, 2, 32, {0, 64, 65}, 6, Decay::Slow);
}

/// causal_conv_bf16 against the reference: row 0 packs conversations
/// starting at `starts`, the other rows are one conversation each.
void convCase(int64_t B, int64_t S, int64_t C, int64_t K,
              const std::vector<int64_t> &starts, uint64_t seed) {
  SCOPED_TRACE(testing::Message()
               << "conv B=" << B << " S=" << S << " C=" << C << " K=" << K);
  std::mt19937_64 rng(seed);
  Bf16Tensor x = randomBf16(B * S * C, rng), w = randomBf16(C * K, rng, 0.5);
  std::vector<int32_t> pos(size_t(B * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0, start = 0; t < S; ++t) {
      if (b == 0 && std::find(starts.begin(), starts.end(), t) != starts.end())
        start = t;
      pos[size_t(b * S + t)] = int32_t(t - start);
    }
  DeviceBuffer<int32_t> devPos(pos.size());
  devPos.upload(pos);
  DeviceBuffer<bf16> y(B * S * C);
  y.poison();
  kernels::causal_conv_bf16(x.ptr(), w.ptr(), devPos.get(), y.get(), B, S, C, K,
                            0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> want(size_t(B * S * C));
  ref::causalConv(x.values.data(), w.values.data(), pos.data(), want.data(), B,
                  S, C, K);
  std::vector<double> got = downloadBf16(y);
  EXPECT_CLOSE(got, want, 1e-2, "causal_conv");
  // Every token on its own: a tap taken across a conversation start (or
  // a run of tokens started without its K - 1 predecessors) shows there.
  double worst = 0;
  for (int64_t t = 0; t < B * S; ++t)
    worst = std::max(
        worst, relativeError(std::vector<double>(got.begin() + t * C,
                                                 got.begin() + (t + 1) * C),
                             std::vector<double>(want.begin() + t * C,
                                                 want.begin() + (t + 1) * C)));
  EXPECT_LE(worst, 2e-2) << "worst token";
}

// Conversations starting inside a thread's run of 16 tokens, on its first
// token (16, 48) and one token after it (17); S not a multiple of 16; every
// tap count the kernel takes; Qwen3.6-27B's 10240 channels.
TEST(HybridOps, CausalConvOnAPackedRow) {
  convCase(2, 40, 96, 4, {0, 2, 17}, 4);
  convCase(2, 100, 1024, 4, {0, 16, 48, 49, 90}, 8);
  convCase(1, 37, 64, 3, {0, 5, 16}, 9);
  convCase(1, 37, 64, 2, {0, 16, 31}, 10);
  convCase(1, 37, 64, 1, {0, 3}, 11);
  convCase(1, 70, 10240, 4, {0, 33}, 12);
}

TEST(HybridOps, Norms) {
  const int64_t rows = 37, D = 320;
  std::mt19937_64 rng(5);
  Bf16Tensor x = randomBf16(rows * D, rng, 2.0), z = randomBf16(rows * D, rng);
  Bf16Tensor w = randomBf16(D, rng, 0.3);
  DeviceBuffer<bf16> y(rows * D), g(rows * D);
  poisonAll(y, g);
  kernels::zero_centred_rms_norm_bf16(x.ptr(), w.ptr(), y.get(), rows, D, 1e-6f,
                                      0);
  kernels::gated_rms_norm_bf16(x.ptr(), z.ptr(), w.ptr(), g.get(), rows, D,
                               1e-6f, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> want(size_t(rows * D)), gated(want.size());
  ref::zeroCentredRmsNorm(x.values.data(), w.values.data(), want.data(), rows,
                          D, 1e-6);
  ref::gatedRmsNorm(x.values.data(), z.values.data(), w.values.data(),
                    gated.data(), rows, D, 1e-6);
  EXPECT_CLOSE(downloadBf16(y), want, 1e-2, "zero_centred_rms_norm");
  EXPECT_CLOSE(downloadBf16(g), gated, 1e-2, "gated_rms_norm");
}

TEST(HybridOps, PartialRope) {
  const int64_t rows = 50, heads = 3, d = 256, rotary = 64;
  std::mt19937_64 rng(6);
  Bf16Tensor x = randomBf16(rows * heads * d, rng);
  std::vector<int32_t> pos(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    pos[size_t(r)] = int32_t(r * 97 % 4096);
  DeviceBuffer<int32_t> devPos(pos.size());
  devPos.upload(pos);
  DeviceBuffer<bf16> y(rows * heads * d);
  y.poison();
  kernels::partial_rope_bf16(x.ptr(), devPos.get(), y.get(), rows, heads, d,
                             rotary, 1e7f, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> want(size_t(rows * heads * d));
  ref::partialRope(x.values.data(), pos.data(), want.data(), rows, heads, d,
                   rotary, 1e7);
  EXPECT_CLOSE(downloadBf16(y), want, 1e-2, "partial_rope");
}

TEST(HybridOps, SigmoidGate) {
  const int64_t rows = 33, n = 200;
  std::mt19937_64 rng(7);
  Bf16Tensor x = randomBf16(rows * n, rng),
             each = randomBf16(rows * n, rng, 2.0);
  Bf16Tensor perRow = randomBf16(rows, rng, 2.0);
  DeviceBuffer<bf16> y(rows * n), yRow(rows * n);
  poisonAll(y, yRow);
  kernels::sigmoid_gate_bf16(x.ptr(), each.ptr(), y.get(), rows * n, 1, 0);
  kernels::sigmoid_gate_bf16(x.ptr(), perRow.ptr(), yRow.get(), rows * n, n, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> want(size_t(rows * n)), wantRow(want.size());
  for (int64_t i = 0; i < rows * n; ++i) {
    want[size_t(i)] =
        x.values[size_t(i)] / (1 + std::exp(-each.values[size_t(i)]));
    wantRow[size_t(i)] =
        x.values[size_t(i)] / (1 + std::exp(-perRow.values[size_t(i / n)]));
  }
  EXPECT_CLOSE(downloadBf16(y), want, 1e-2, "sigmoid_gate");
  EXPECT_CLOSE(downloadBf16(yRow), wantRow, 1e-2, "sigmoid_gate, one a row");
}

} // namespace
