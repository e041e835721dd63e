//===- ReferenceDeltaNetTest.cpp - The hybrid targets' CPU reference ------===//
//
// kernels/reference/DeltaNet.cpp against independent forms:
// - the gated delta rule, token by token, against the chunk-wise form a
//   kernel computes (per chunk: the cumulative decay, the UT transform
//   (I + A)^-1 of the keys' strictly lower interactions, the chunk's
//   outputs from the state it starts with, the state it leaves), written
//   here from the algebra, with a chunk that does not divide the sequence
//   and value heads sharing key heads;
// - a packed row restarts the recurrence and the convolution: each
//   conversation's outputs equal those it gets alone;
// - the convolution's taps (one-hot kernels pick the token they reach, zero
//   before the conversation), the zero-centred norm as rms_norm with 1 + w,
//   partial rotary as rope of the rotated part with the rest copied.
//
//===----------------------------------------------------------------------===//

#include "kernels/reference/Reference.h"
#include "test/unit/ReferenceTestSupport.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

using namespace dflash;
using namespace dflash::reftest;

namespace {

struct DeltaInputs {
  int64_t B = 2, S = 37, Hk = 2, Hv = 4, dk = 8, dv = 6;
  Vector q, k, v, a, beta, aLog, dtBias;
  explicit DeltaInputs(uint64_t seed) {
    std::mt19937_64 rng(seed);
    q = randomVector(rng, B * S * Hk * dk);
    k = randomVector(rng, B * S * Hk * dk);
    v = randomVector(rng, B * S * Hv * dv);
    a = randomVector(rng, B * S * Hv, -3, 3);
    beta = randomVector(rng, B * S * Hv, -3, 3);
    aLog = randomVector(rng, Hv, -2, 1);
    dtBias = randomVector(rng, Hv, -1, 1);
  }
  Vector run(const std::vector<int32_t> &pos) const {
    Vector out(size_t(B * S * Hv * dv), std::nan(""));
    ref::gatedDeltaRule(q.data(), k.data(), v.data(), a.data(), beta.data(),
                        aLog.data(), dtBias.data(), pos.data(), out.data(), B,
                        S, Hk, Hv, dk, dv);
    return out;
  }
};

/// x / sqrt(sum x^2 + 1e-6), a copy.
Vector unit(const double *x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i)
    s += x[i] * x[i];
  Vector y(x, x + n);
  for (double &e : y)
    e /= std::sqrt(s + 1e-6);
  return y;
}

/// The chunk-wise gated delta rule of one row (unpacked), chunks of C.
Vector chunked(const DeltaInputs &in, int64_t C) {
  const int64_t S = in.S, dk = in.dk, dv = in.dv, group = in.Hv / in.Hk;
  Vector out(size_t(in.B * S * in.Hv * dv));
  for (int64_t b = 0; b < in.B; ++b)
    for (int64_t h = 0; h < in.Hv; ++h) {
      Vector M(size_t(dk * dv), 0.0); // the state a chunk starts with
      for (int64_t c0 = 0; c0 < S; c0 += C) {
        const int64_t L = std::min(C, S - c0);
        std::vector<Vector> K, Q, V;
        Vector gamma(static_cast<size_t>(L)), bt(gamma.size());
        double cumulative = 0;
        for (int64_t t = 0; t < L; ++t) {
          const int64_t tok = b * S + c0 + t, hk = h / group;
          K.push_back(unit(&in.k[size_t((tok * in.Hk + hk) * dk)], dk));
          Vector qn = unit(&in.q[size_t((tok * in.Hk + hk) * dk)], dk);
          for (double &e : qn)
            e /= std::sqrt(double(dk));
          Q.push_back(qn);
          V.emplace_back(&in.v[size_t((tok * in.Hv + h) * dv)],
                         &in.v[size_t((tok * in.Hv + h) * dv + dv)]);
          const double x = in.a[size_t(tok * in.Hv + h)] + in.dtBias[size_t(h)];
          cumulative += -std::exp(in.aLog[size_t(h)]) * std::log1p(std::exp(x));
          gamma[size_t(t)] = cumulative;
          bt[size_t(t)] = 1 / (1 + std::exp(-in.beta[size_t(tok * in.Hv + h)]));
        }
        // (I + A) D = beta (V - e^gamma K M), A[t][s] = beta_t e^(gamma_t -
        // gamma_s) k_t.k_s for s < t: forward substitution (the UT form).
        std::vector<Vector> D(static_cast<size_t>(L),
                              Vector(static_cast<size_t>(dv)));
        for (int64_t t = 0; t < L; ++t)
          for (int64_t j = 0; j < dv; ++j) {
            double r = 0;
            for (int64_t i = 0; i < dk; ++i)
              r += K[size_t(t)][size_t(i)] * M[size_t(i * dv + j)];
            double rhs = bt[size_t(t)] * (V[size_t(t)][size_t(j)] -
                                          std::exp(gamma[size_t(t)]) * r);
            for (int64_t s = 0; s < t; ++s)
              rhs -= bt[size_t(t)] *
                     std::exp(gamma[size_t(t)] - gamma[size_t(s)]) *
                     dotProduct(K[size_t(t)], K[size_t(s)]) *
                     D[size_t(s)][size_t(j)];
            D[size_t(t)][size_t(j)] = rhs;
          }
        // o_t = e^gamma_t M^T q_t + sum_{s<=t} e^(gamma_t - gamma_s)
        // (q_t.k_s) d_s.
        for (int64_t t = 0; t < L; ++t)
          for (int64_t j = 0; j < dv; ++j) {
            double o = 0;
            for (int64_t i = 0; i < dk; ++i)
              o += Q[size_t(t)][size_t(i)] * M[size_t(i * dv + j)];
            o *= std::exp(gamma[size_t(t)]);
            for (int64_t s = 0; s <= t; ++s)
              o += std::exp(gamma[size_t(t)] - gamma[size_t(s)]) *
                   dotProduct(Q[size_t(t)], K[size_t(s)]) *
                   D[size_t(s)][size_t(j)];
            out[size_t(((b * S + c0 + t) * in.Hv + h) * dv + j)] = o;
          }
        // The state the next chunk starts with.
        const double last = gamma[size_t(L - 1)];
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) {
            double m = std::exp(last) * M[size_t(i * dv + j)];
            for (int64_t s = 0; s < L; ++s)
              m += std::exp(last - gamma[size_t(s)]) * K[size_t(s)][size_t(i)] *
                   D[size_t(s)][size_t(j)];
            M[size_t(i * dv + j)] = m;
          }
      }
    }
  return out;
}

std::vector<int32_t> unpacked(int64_t B, int64_t S) {
  std::vector<int32_t> pos(size_t(B * S));
  for (int64_t i = 0; i < B * S; ++i)
    pos[size_t(i)] = int32_t(i % S);
  return pos;
}

} // namespace

TEST(ReferenceDeltaNet, RecurrenceEqualsTheChunkedForm) {
  DeltaInputs in(21);
  Vector want = in.run(unpacked(in.B, in.S));
  for (int64_t chunk : {1, 8, 16, 64}) {
    Vector got = chunked(in, chunk);
    EXPECT_LT(relativeError(got, want), 1e-12) << "chunks of " << chunk;
  }
  // The control: a wrong head mapping (value head h on key head h % Hk)
  // is far from it.
  DeltaInputs swapped = in;
  for (int64_t t = 0; t < in.B * in.S; ++t)
    for (int64_t i = 0; i < in.dk; ++i)
      std::swap(swapped.k[size_t((t * in.Hk + 0) * in.dk + i)],
                swapped.k[size_t((t * in.Hk + 1) * in.dk + i)]);
  EXPECT_GT(relativeError(swapped.run(unpacked(in.B, in.S)), want), 1e-2);
}

TEST(ReferenceDeltaNet, APackedRowRestartsAtEachConversation) {
  DeltaInputs in(22);
  const int64_t S = in.S, split = 15;
  // Row 0 packs [0, split) and [split, S); row 1 is one conversation.
  std::vector<int32_t> pos = unpacked(in.B, S);
  for (int64_t t = split; t < S; ++t)
    pos[size_t(t)] = int32_t(t - split);
  Vector packed = in.run(pos);
  // The second conversation alone: its tokens moved to the start of row 1.
  DeltaInputs alone = in;
  auto move = [&](Vector &x, int64_t width) {
    for (int64_t t = 0; t < S - split; ++t)
      for (int64_t e = 0; e < width; ++e)
        x[size_t((S + t) * width + e)] = x[size_t((split + t) * width + e)];
  };
  move(alone.q, in.Hk * in.dk);
  move(alone.k, in.Hk * in.dk);
  move(alone.v, in.Hv * in.dv);
  move(alone.a, in.Hv);
  move(alone.beta, in.Hv);
  Vector single = alone.run(unpacked(in.B, S));
  const int64_t w = in.Hv * in.dv;
  for (int64_t t = 0; t < S - split; ++t)
    for (int64_t e = 0; e < w; ++e)
      ASSERT_EQ(packed[size_t((split + t) * w + e)],
                single[size_t((S + t) * w + e)])
          << "token " << t;
  // The control: without the restart the second conversation differs.
  Vector joined = in.run(unpacked(in.B, S));
  EXPECT_NE(joined[size_t(split * w)], packed[size_t(split * w)]);
}

TEST(ReferenceDeltaNet, ConvolutionTapsStayInTheConversation) {
  const int64_t B = 1, S = 10, C = 3, K = 4;
  std::mt19937_64 rng(23);
  Vector x = randomVector(rng, B * S * C);
  std::vector<int32_t> pos = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4}; // two of 5
  auto silu = [](double z) { return z / (1 + std::exp(-z)); };
  for (int64_t tap = 0; tap < K; ++tap) {
    Vector w(size_t(C * K), 0.0);
    for (int64_t c = 0; c < C; ++c)
      w[size_t(c * K + tap)] = 1.0;
    Vector y(size_t(B * S * C), std::nan(""));
    ref::causalConv(x.data(), w.data(), pos.data(), y.data(), B, S, C, K);
    const int64_t back = K - 1 - tap; // how many tokens back the tap reads
    for (int64_t t = 0; t < S; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const double want =
            pos[size_t(t)] >= back ? silu(x[size_t((t - back) * C + c)]) : 0.0;
        EXPECT_EQ(y[size_t(t * C + c)], want)
            << "tap " << tap << " token " << t;
      }
  }
}

TEST(ReferenceDeltaNet, NormsAndPartialRotary) {
  std::mt19937_64 rng(24);
  const int64_t rows = 6, D = 16, heads = 3, d = 16, rotary = 4;
  Vector x = randomVector(rng, rows * D), w = randomVector(rng, D);
  Vector onePlus = w;
  for (double &e : onePlus)
    e += 1;
  Vector got(size_t(rows * D)), want(got.size());
  ref::zeroCentredRmsNorm(x.data(), w.data(), got.data(), rows, D, 1e-6);
  ref::rmsNorm<double>(x.data(), onePlus.data(), want.data(), rows, D, 1e-6);
  EXPECT_LT(relativeError(got, want), 1e-15);

  Vector h = randomVector(rng, rows * heads * d);
  std::vector<int32_t> pos = {0, 3, 7, 11, 100, 2048};
  Vector y(h.size(), std::nan(""));
  ref::partialRope(h.data(), pos.data(), y.data(), rows, heads, d, rotary, 1e7);
  // The rotated part: rope over `rotary` dimensions of each head vector.
  Vector part(size_t(rows * heads * rotary)), rotated(part.size());
  for (int64_t r = 0; r < rows * heads; ++r)
    for (int64_t i = 0; i < rotary; ++i)
      part[size_t(r * rotary + i)] = h[size_t(r * d + i)];
  ref::rope<double>(part.data(), pos.data(), rotated.data(), rows, heads,
                    rotary, 1e7);
  for (int64_t r = 0; r < rows * heads; ++r)
    for (int64_t i = 0; i < d; ++i)
      ASSERT_EQ(y[size_t(r * d + i)], i < rotary
                                          ? rotated[size_t(r * rotary + i)]
                                          : h[size_t(r * d + i)])
          << "head vector " << r << " dimension " << i;
  // Position 0 is the identity; later ones rotate.
  EXPECT_EQ(y[0], h[0]);
  EXPECT_NE(y[size_t(heads * d)], h[size_t(heads * d)]);
}
