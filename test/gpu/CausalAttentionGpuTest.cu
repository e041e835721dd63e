//===- CausalAttentionGpuTest.cu - Causal attention vs reference ----------===//
//
// sm90a_causal_attention_fwd_wgmma_bf16 (what causal_attention_fwd_bf16
// runs) and mma_sync_causal_attention_fwd_bf16 against ref::causalAttention
// in double on the same bf16-rounded inputs: unpacked rows, packed rows of
// conversations of varied lengths (some of one token), S not a multiple of
// the 128-row query tile or the 64-key tile, a conversation spanning many
// tiles, rows that start inside a conversation (positions not from 0) and
// arbitrary non-negative positions (the predicate is exact, so the kernels
// must match the reference there too), and gpt-oss's two features: sliding
// windows (128 as gpt-oss, and 5 and 64; conversations shorter and longer
// than the window) and attention sinks (random logits in [-2, 4], one head's
// at 20, far above its scores), alone and together, at gpt-oss's head dim
// 64 and 64 / 8 heads too. A case with a feature first checks that the
// reference differs from the one without it (where it must), so ignoring
// the feature fails. Outputs are poisoned (NaN) first;
// each case checks ||out - ref|| / ||ref|| and every (row, position, head)
// on its own, so one wrong row fails, and that a second launch writes the
// same bits.
//
// No claim that a conversation's outputs are bit-identical alone or packed:
// key tiles start at the lowest key the query tile sees, so the kernels sum
// a conversation's keys in different tile orders in the two rows.
//
//===----------------------------------------------------------------------===//

#include "kernels/CausalAttention.cuh"
#include "kernels/reference/Reference.h"
#include "test/gpu/GpuTestUtil.h"

#include <algorithm>

using namespace dflash;
using namespace dflash::gputest;
using bf16 = __nv_bfloat16;

namespace {

/// How the positions of a row are made.
enum class Rows {
  Unpacked,     ///< arange
  Packed,       ///< conversations of 1 to maxLen tokens (a fifth of length 1)
  LongThenTail, ///< one conversation of S - 100, then lengths 1, 1, 98
  Continued,    ///< a conversation cut at the row's start (positions from 7)
  Arbitrary,    ///< uniform in [0, 40): well-formed or not, the rule holds
};

std::vector<int32_t> makePositions(int B, int S, Rows rows, int maxLen,
                                   std::mt19937_64 &rng) {
  std::vector<int32_t> pos(size_t(B) * S);
  std::uniform_int_distribution<int> length(2, std::max(2, maxLen));
  std::bernoulli_distribution single(0.2);
  std::uniform_int_distribution<int> arbitrary(0, 39);
  for (int b = 0; b < B; ++b) {
    int32_t *p = pos.data() + size_t(b) * S;
    switch (rows) {
    case Rows::Unpacked:
      for (int j = 0; j < S; ++j)
        p[j] = j;
      break;
    case Rows::Packed: {
      int left = 0, next = 0;
      for (int j = 0; j < S; ++j, --left) {
        if (left == 0) {
          left = single(rng) ? 1 : length(rng);
          next = 0;
        }
        p[j] = next++;
      }
      break;
    }
    case Rows::LongThenTail: {
      const int longLen = std::max(1, S - 100);
      const int tail[3] = {1, 1, 98};
      int j = 0;
      for (; j < std::min(S, longLen); ++j)
        p[j] = j;
      for (int t = 0; t < 3 && j < S; ++t)
        for (int k = 0; k < tail[t] && j < S; ++k)
          p[j++] = k;
      for (int k = 0; j < S; ++k)
        p[j++] = k;
      break;
    }
    case Rows::Continued: {
      // The first conversation began before the row; a fresh one at S / 2.
      for (int j = 0; j < S; ++j)
        p[j] = j < S / 2 ? j + 7 : j - S / 2;
      break;
    }
    case Rows::Arbitrary:
      for (int j = 0; j < S; ++j)
        p[j] = arbitrary(rng);
      break;
    }
  }
  return pos;
}

/// gpt-oss's features of a case: a sliding window (0: none) and sinks.
struct Features {
  int window = 0;
  bool sinks = false;
};

/// Sinks uniform in [-2, 4], the last head's 20: far above its scaled
/// scores (a few units), so that head's outputs are tiny and the sink term
/// dominates the denominator.
Bf16Tensor randomSinks(int nh, std::mt19937_64 &rng) {
  Bf16Tensor t(static_cast<size_t>(nh));
  std::uniform_real_distribution<double> dist(-2.0, 4.0);
  for (int h = 0; h < nh; ++h)
    t.set(size_t(h), h == nh - 1 ? 20.f : static_cast<float>(dist(rng)));
  t.upload();
  return t;
}

struct Problem {
  int B, S, nh, nkv, d;
  Features features;
  size_t qElems, kvElems;
  Bf16Tensor q, k, v, sinks;
  std::vector<int32_t> positions;
  DeviceBuffer<int32_t> dPositions;
  std::vector<double> refOut;

  Problem(int B, int S, int nh, int nkv, int d, Rows rows, int maxLen,
          Features features, std::mt19937_64 &rng)
      : B(B), S(S), nh(nh), nkv(nkv), d(d), features(features),
        qElems(size_t(B) * S * nh * d), kvElems(size_t(B) * S * nkv * d),
        q(randomBf16(qElems, rng, 1.5)), k(randomBf16(kvElems, rng)),
        v(randomBf16(kvElems, rng)), sinks(randomSinks(nh, rng)),
        positions(makePositions(B, S, rows, maxLen, rng)),
        dPositions(positions.size()), refOut(qElems) {
    dPositions.upload(positions);
    reference(refOut, features);
  }

  /// ref::causalAttention with `f`'s window and sinks.
  void reference(std::vector<double> &out, const Features &f) const {
    ref::causalAttention(q.values.data(), k.values.data(), v.values.data(),
                         positions.data(), out.data(), B, S, nh, nkv, d,
                         f.sinks ? sinks.values.data() : nullptr,
                         int64_t(f.window));
  }
};

enum class Kernel { Wgmma, MmaSync };

template <int D, int NH, int NKV>
void launch(Kernel kernel, const kernels::CausalAttentionFwdArgs &a) {
  if (kernel == Kernel::Wgmma)
    kernels::causal_attention_fwd_bf16<D, NH, NKV>(a, 0);
  else
    kernels::mma_sync_causal_attention_fwd_bf16<D, NH, NKV>(a, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
}

/// Whole-tensor relative error within 1e-2, every row of d within 3e-2
/// (bf16 output and P: a few 1e-3 typically; a wrong row is O(1)), and a
/// second launch bit-identical.
template <int D, int NH, int NKV> void check(const Problem &p, Kernel kernel) {
  SCOPED_TRACE(kernel == Kernel::Wgmma ? "wgmma" : "mma.sync");
  DeviceBuffer<bf16> out(p.qElems);
  out.poison();
  kernels::CausalAttentionFwdArgs a{
      p.q.ptr(), p.k.ptr(), p.v.ptr(), p.dPositions.get(), out.get(), p.B, p.S};
  a.sinks = p.features.sinks ? p.sinks.ptr() : nullptr;
  a.window = p.features.window;
  launch<D, NH, NKV>(kernel, a);
  std::vector<uint16_t> bits = out.download<uint16_t>();
  std::vector<double> got = bf16ToDoubles(bits);
  double err = relativeError(got, p.refOut);
  EXPECT_LE(err, 1e-2) << "out: relative error " << err;
  int badRows = 0;
  double worst = 0;
  for (int b = 0; b < p.B; ++b)
    for (int i = 0; i < p.S; ++i)
      for (int h = 0; h < NH; ++h) {
        size_t off = ((size_t(b) * p.S + i) * NH + h) * D;
        std::vector<double> g(got.begin() + off, got.begin() + off + D),
            r(p.refOut.begin() + off, p.refOut.begin() + off + D);
        double e = relativeError(g, r);
        worst = std::max(worst, e);
        if (!(e <= 3e-2) && badRows++ < 5)
          ADD_FAILURE() << "row b=" << b << " i=" << i << " h=" << h
                        << " (position " << p.positions[size_t(b) * p.S + i]
                        << "): relative error " << e;
      }
  EXPECT_EQ(badRows, 0) << "rows above 3e-2";
  out.poison();
  launch<D, NH, NKV>(kernel, a);
  std::vector<uint16_t> again = out.download<uint16_t>();
  EXPECT_TRUE(again == bits) << "a second launch wrote different bits";
  std::printf("%s causal fwd D=%d NH=%d NKV=%d B=%d S=%d window=%d%s: out rel "
              "%.3g, worst row %.3g\n",
              kernel == Kernel::Wgmma ? "wgmma" : "mma.sync", D, NH, NKV, p.B,
              p.S, p.features.window, p.features.sinks ? " sinks" : "", err,
              worst);
}

/// With `mustDiffer`, the case's features change the reference by more
/// than check's whole-tensor bound (twice it), so a kernel ignoring them
/// fails; off where they cannot (conversations all shorter than the window).
template <int D, int NH, int NKV>
void runCase(int B, int S, Rows rows, uint64_t seed, int maxLen = 0,
             Features features = {}, bool mustDiffer = true) {
  SCOPED_TRACE(testing::Message()
               << "D=" << D << " NH=" << NH << " NKV=" << NKV << " B=" << B
               << " S=" << S << " rows=" << int(rows) << " maxLen=" << maxLen
               << " window=" << features.window << " sinks=" << features.sinks);
  std::mt19937_64 rng(seed);
  Problem p(B, S, NH, NKV, D, rows, maxLen, features, rng);
  if (features.window > 0 || features.sinks) {
    std::vector<double> plain(p.qElems);
    p.reference(plain, Features{});
    const double diff = relativeError(p.refOut, plain);
    if (mustDiffer)
      EXPECT_GT(diff, 2e-2) << "the features barely change the reference";
    else
      EXPECT_LE(diff, 0.0) << "window longer than every conversation changes "
                              "the reference";
  }
  check<D, NH, NKV>(p, Kernel::Wgmma);
  check<D, NH, NKV>(p, Kernel::MmaSync);
}

TEST(CausalAttention, Qwen3Unpacked) {
  runCase<128, 32, 8>(2, 512, Rows::Unpacked, 1);
}

TEST(CausalAttention, Qwen3PackedTail) {
  runCase<128, 32, 8>(1, 333, Rows::Packed, 2, 150);
}

TEST(CausalAttention, SmallPacked) {
  runCase<64, 4, 2>(3, 333, Rows::Packed, 3, 90);
  runCase<64, 4, 2>(2, 700, Rows::Packed, 4, 20);
}

TEST(CausalAttention, LongConversation) {
  runCase<64, 4, 2>(2, 1500, Rows::LongThenTail, 5);
  runCase<64, 4, 2>(1, 1029, Rows::Unpacked, 6);
}

TEST(CausalAttention, PositionsNotFromZero) {
  runCase<64, 4, 2>(2, 400, Rows::Continued, 7);
  runCase<64, 4, 2>(2, 300, Rows::Arbitrary, 8);
}

TEST(CausalAttention, TinyAndOddShapes) {
  runCase<64, 3, 3>(1, 1, Rows::Unpacked, 9);
  runCase<64, 3, 3>(2, 65, Rows::Packed, 10, 9);
  runCase<64, 3, 3>(3, 129, Rows::Unpacked, 11);
  runCase<128, 32, 8>(1, 64, Rows::Packed, 12, 5);
}

// gpt-oss's sliding layers: window 128, and small windows (5, 64) whose
// range starts inside the query tile and cuts key tiles of the group.
TEST(CausalAttention, SlidingWindowUnpacked) {
  runCase<64, 8, 2>(2, 1000, Rows::Unpacked, 21, 0, {128, false});
  runCase<64, 8, 2>(1, 300, Rows::Unpacked, 22, 0, {5, false});
  runCase<64, 8, 2>(2, 517, Rows::Unpacked, 23, 0, {64, false});
  runCase<128, 32, 8>(1, 450, Rows::Unpacked, 24, 0, {128, false});
}

TEST(CausalAttention, SlidingWindowPacked) {
  // Conversations of 1 to 400 tokens: shorter and longer than 128.
  runCase<64, 8, 2>(2, 700, Rows::Packed, 25, 400, {128, false});
  // 1 to 20 tokens against a window of 5.
  runCase<64, 4, 2>(2, 333, Rows::Packed, 26, 20, {5, false});
  // All shorter than the window: the same as without it.
  runCase<64, 8, 2>(2, 450, Rows::Packed, 27, 40, {64, false}, false);
  runCase<64, 4, 2>(1, 1000, Rows::LongThenTail, 28, 0, {128, false});
  runCase<64, 4, 2>(2, 400, Rows::Continued, 29, 0, {64, false});
  // Arbitrary positions: keys far back can match (pos[i] - pos[j] == i - j
  // by chance), and the window cuts them.
  runCase<64, 4, 2>(2, 300, Rows::Arbitrary, 30, 0, {5, false});
}

TEST(CausalAttention, Sinks) {
  runCase<64, 8, 2>(2, 512, Rows::Unpacked, 31, 0, {0, true});
  runCase<128, 32, 8>(1, 333, Rows::Packed, 32, 150, {0, true});
  runCase<64, 4, 2>(2, 700, Rows::Packed, 33, 20, {0, true});
  runCase<64, 3, 3>(2, 65, Rows::Packed, 34, 9, {0, true});
}

TEST(CausalAttention, SlidingWindowAndSinks) {
  runCase<64, 8, 2>(2, 1000, Rows::Unpacked, 41, 0, {128, true});
  runCase<64, 8, 2>(2, 600, Rows::Packed, 42, 300, {128, true});
  runCase<64, 4, 2>(1, 300, Rows::Packed, 43, 30, {5, true});
  runCase<128, 32, 8>(1, 333, Rows::Unpacked, 44, 0, {64, true});
}

// gpt-oss's attention: head dim 64, 64 query heads over 8 kv heads, sinks
// on every layer, windows on every other.
// Qwen3.5/3.6's gated full attention: head dim 256 (24 heads over 4 kv
// heads at 27B; the gate and partial rope are separate ops).
TEST(CausalAttention, HeadDim256) {
  runCase<256, 24, 4>(2, 400, Rows::Unpacked, 61);
  runCase<256, 24, 4>(2, 700, Rows::Packed, 62, 150);
  runCase<256, 4, 2>(1, 129, Rows::LongThenTail, 63);
  runCase<256, 3, 3>(1, 1, Rows::Unpacked, 64);
}

TEST(CausalAttention, GptOssShape) {
  runCase<64, 64, 8>(1, 300, Rows::Unpacked, 51, 0, {128, true});
  runCase<64, 64, 8>(2, 200, Rows::Packed, 52, 150, {128, true});
  runCase<64, 64, 8>(1, 257, Rows::Unpacked, 53, 0, {0, true});
}

} // namespace
