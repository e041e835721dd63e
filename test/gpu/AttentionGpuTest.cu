//===- AttentionGpuTest.cu - Block attention vs reference -----------------===//
//
// mma_sync_block_attention_{fwd,bwd}_bf16, the wgmma forwards
// (sm90a_block_attention_fwd_wgmma_bf16 and the warp-specialised
// sm90a_block_attention_fwd_wgmma_ws_bf16) and the wgmma backward
// (sm90a_block_attention_bwd_wgmma_bf16, every dQ policy of
// kernels/BlockAttentionWgmmaBwdDq.cuh) against ref::blockAttention(Grad) in
// double on the same bf16-rounded inputs, over the template configurations
// of the shipped drafters (and small ones that stress the tiling), with
// anchors at 0, 1 and S-2, windows wider than the context, keep = 0
// blocks both trailing (as the sampler writes them) and scattered, and
// packed rows (docs/semantics.md section 9: contexts bounded by the anchor's
// conversation).
//
//===----------------------------------------------------------------------===//

#include "kernels/BlockAttentionBwd.cuh"
#include "kernels/BlockAttentionFwd.cuh"
#include "kernels/BlockAttentionWgmmaFwdWs.cuh"
#include "kernels/reference/Reference.h"
#include "test/gpu/GpuTestUtil.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <set>

using namespace dflash;
using namespace dflash::gputest;
using bf16 = __nv_bfloat16;

namespace {

enum class Anchors {
  SortedTrailingKeep0, ///< sampler layout: ascending, unused slots (0, keep 0)
  ScatteredKeep0,      ///< keep = 0 anywhere, anchors still ascending
  NoneKept,            ///< every slot keep = 0
};

/// Unpacked rows (position_ids = arange), or rows packed with conversations
/// of S/10 to S/3 tokens.
enum class Rows { Unpacked, Packed };

std::vector<int32_t> makePositions(int B, int S, Rows rows,
                                   std::mt19937_64 &rng) {
  std::vector<int32_t> positions(size_t(B) * S);
  std::uniform_int_distribution<int> length(std::max(2, S / 10),
                                            std::max(2, S / 3));
  for (int b = 0; b < B; ++b) {
    int left = rows == Rows::Packed ? length(rng) : S, p = 0;
    for (int j = 0; j < S; ++j, --left) {
      if (left == 0) {
        left = length(rng);
        p = 0;
      }
      positions[size_t(b) * S + j] = p++;
    }
  }
  return positions;
}

void makeAnchors(int B, int S, int N, Anchors mode, std::mt19937_64 &rng,
                 std::vector<int32_t> &anchors, std::vector<uint8_t> &keep) {
  anchors.assign(static_cast<size_t>(B) * N, 0);
  keep.assign(static_cast<size_t>(B) * N, 0);
  for (int b = 0; b < B; ++b) {
    if (mode == Anchors::NoneKept)
      continue;
    int used = mode == Anchors::SortedTrailingKeep0 ? std::max(1, N - 3) : N;
    used = std::min(used, S - 1);
    std::set<int> chosen;
    // The edges: the first anchor with no context, and the last possible.
    chosen.insert(0);
    if (used > 1)
      chosen.insert(S - 2);
    if (used > 2)
      chosen.insert(1);
    std::uniform_int_distribution<int> pos(0, S - 2);
    while (static_cast<int>(chosen.size()) < used)
      chosen.insert(pos(rng));
    int n = 0;
    for (int a : chosen) {
      anchors[b * N + n] = a;
      keep[b * N + n] = 1;
      ++n;
    }
    if (mode == Anchors::ScatteredKeep0) {
      std::bernoulli_distribution drop(0.2);
      for (int i = 0; i < N; ++i)
        if (drop(rng))
          keep[b * N + i] = 0; // anchor left as it is
    }
  }
}

/// One random problem, its double-precision reference, and the device
/// buffers every kernel variant is checked with.
struct Problem {
  int B, S, N, Q;
  size_t qElems, ctxElems, draftElems;
  Bf16Tensor q, ck, cv, dk, dv, dOut;
  std::vector<int32_t> anchors;
  std::vector<uint8_t> keep;
  std::vector<int32_t> positions;
  DeviceBuffer<int32_t> dAnchors;
  DeviceBuffer<uint8_t> dKeep;
  DeviceBuffer<int32_t> dPositions;
  std::vector<double> refOut, refLse, refDq, refDck, refDcv, refDdk, refDdv;

  Problem(int B, int S, int N, int bs, int nh, int nkv, int d, int window,
          bool causal, Anchors mode, std::mt19937_64 &rng,
          Rows rows = Rows::Unpacked)
      : B(B), S(S), N(N), Q(N * bs), qElems(size_t(B) * N * bs * nh * d),
        ctxElems(size_t(B) * S * nkv * d),
        draftElems(size_t(B) * N * bs * nkv * d),
        q(randomBf16(qElems, rng, 1.5)), ck(randomBf16(ctxElems, rng)),
        cv(randomBf16(ctxElems, rng)), dk(randomBf16(draftElems, rng)),
        dv(randomBf16(draftElems, rng)), dOut(randomBf16(qElems, rng)),
        dAnchors(size_t(B) * N), dKeep(size_t(B) * N),
        dPositions(size_t(B) * S) {
    makeAnchors(B, S, N, mode, rng, anchors, keep);
    positions = makePositions(B, S, rows, rng);
    dAnchors.upload(anchors);
    dKeep.upload(keep);
    dPositions.upload(positions);
    ref::AttentionShape shape{B, S, N, bs, nh, nkv, d};
    shape.window = window;
    shape.causal = causal;
    refOut.resize(qElems);
    refLse.resize(size_t(B) * Q * nh);
    ref::blockAttention(q.values.data(), ck.values.data(), cv.values.data(),
                        dk.values.data(), dv.values.data(), anchors.data(),
                        keep.data(), positions.data(), refOut.data(),
                        refLse.data(), shape);
    refDq.resize(qElems);
    refDck.resize(ctxElems);
    refDcv.resize(ctxElems);
    refDdk.resize(draftElems);
    refDdv.resize(draftElems);
    ref::blockAttentionGrad(
        dOut.values.data(), q.values.data(), ck.values.data(), cv.values.data(),
        dk.values.data(), dv.values.data(), anchors.data(), keep.data(),
        positions.data(), refOut.data(), refLse.data(), refDq.data(),
        refDck.data(), refDcv.data(), refDdk.data(), refDdv.data(), shape);
  }
};

/// out within 1e-2 relative, lse within 2e-3 absolute (-inf exactly where
/// the reference is -inf); poisoned (NaN) elements never pass.
void expectForwardClose(const Problem &p, const DeviceBuffer<bf16> &out,
                        const DeviceBuffer<float> &lse,
                        double *outErrOut = nullptr,
                        double *lseErrOut = nullptr) {
  std::vector<double> gotOut = downloadBf16(out), gotLse = downloadF32(lse);
  double outErr = gputest::relativeError(gotOut, p.refOut);
  EXPECT_LE(outErr, 1e-2) << "out: relative error " << outErr;
  double lseErr = 0;
  for (size_t i = 0; i < p.refLse.size(); ++i) {
    if (std::isinf(p.refLse[i]) || std::isinf(gotLse[i]) ||
        std::isnan(gotLse[i])) {
      if (gotLse[i] != p.refLse[i])
        lseErr = INFINITY;
      continue;
    }
    lseErr = std::max(lseErr, std::abs(gotLse[i] - p.refLse[i]));
  }
  EXPECT_LE(lseErr, 2e-3) << "lse max abs error";
  if (outErrOut)
    *outErrOut = outErr;
  if (lseErrOut)
    *lseErrOut = lseErr;
}

/// Forward variant MT (m-tiles per warp), KT (keys per tile); leaves out and
/// lse for the backward.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL, int MT,
          int KT>
void checkForward(const Problem &p, DeviceBuffer<bf16> &out,
                  DeviceBuffer<float> &lse) {
  SCOPED_TRACE(testing::Message() << "forward MT=" << MT << " KT=" << KT);
  poisonAll(out, lse);
  kernels::BlockAttentionFwdArgs fa{
      p.q.ptr(),  p.ck.ptr(),       p.cv.ptr(),    p.dk.ptr(),
      p.dv.ptr(), p.dAnchors.get(), p.dKeep.get(), p.dPositions.get(),
      out.get(),  lse.get(),        p.B,           p.S,
      p.N};
  kernels::mma_sync_block_attention_fwd_bf16<D, BS, NH, NKV, WINDOW, CAUSAL, MT,
                                             KT>(fa, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  expectForwardClose(p, out, lse);
}

/// A wgmma forward (Launch: the TMA one, or the warp-specialised one for
/// long contexts); prints its errors.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          typename Launch>
void checkForwardWgmma(const Problem &p, Launch launch, const char *variant) {
  SCOPED_TRACE(variant);
  DeviceBuffer<bf16> out(p.qElems);
  DeviceBuffer<float> lse(p.refLse.size());
  poisonAll(out, lse);
  kernels::BlockAttentionFwdArgs fa{
      p.q.ptr(),  p.ck.ptr(),       p.cv.ptr(),    p.dk.ptr(),
      p.dv.ptr(), p.dAnchors.get(), p.dKeep.get(), p.dPositions.get(),
      out.get(),  lse.get(),        p.B,           p.S,
      p.N};
  launch(fa);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  double outErr = 0, lseErr = 0;
  expectForwardClose(p, out, lse, &outErr, &lseErr);
  std::printf("%s D=%d BS=%d W=%d B=%d S=%d N=%d: out rel %.3g, lse abs "
              "%.3g\n",
              variant, D, BS, WINDOW, p.B, p.S, p.N, outErr, lseErr);
}

/// Which wgmma forward a case runs (the warp-specialised one also in
/// clusters of two block pairs sharing each context tile, and with its
/// consumers issuing in turns).
enum class Forward {
  Tma,
  WarpSpecialised,
  WarpSpecialisedClusters,
  WarpSpecialisedPingpong
};

template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL>
void runWgmmaCase(int B, int S, int N, Anchors mode, uint64_t seed,
                  Rows rows = Rows::Unpacked, Forward fwd = Forward::Tma) {
  SCOPED_TRACE(testing::Message()
               << "D=" << D << " BS=" << BS << " NH=" << NH << " NKV=" << NKV
               << " WINDOW=" << WINDOW << " CAUSAL=" << CAUSAL << " B=" << B
               << " S=" << S << " N=" << N << " mode=" << int(mode)
               << " packed=" << (rows == Rows::Packed));
  std::mt19937_64 rng(seed);
  Problem p(B, S, N, BS, NH, NKV, D, WINDOW, CAUSAL, mode, rng, rows);
  if (fwd == Forward::Tma)
    checkForwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL>(
        p,
        [](const kernels::BlockAttentionFwdArgs &fa) {
          kernels::sm90a_block_attention_fwd_wgmma_bf16<D, BS, NH, NKV, WINDOW,
                                                        CAUSAL>(fa, 0);
        },
        "wgmma fwd");
  else if (fwd == Forward::WarpSpecialised)
    checkForwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL>(
        p,
        [](const kernels::BlockAttentionFwdArgs &fa) {
          kernels::sm90a_block_attention_fwd_wgmma_ws_bf16<D, BS, NH, NKV,
                                                           WINDOW, CAUSAL>(fa,
                                                                           0);
        },
        "wgmma warp-specialised fwd");
  else if (fwd == Forward::WarpSpecialisedClusters)
    checkForwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL>(
        p,
        [](const kernels::BlockAttentionFwdArgs &fa) {
          kernels::sm90a_block_attention_fwd_wgmma_ws_bf16<D, BS, NH, NKV,
                                                           WINDOW, CAUSAL, 2>(
              fa, 0);
        },
        "wgmma warp-specialised fwd, clusters of 2");
  else
    checkForwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL>(
        p,
        [](const kernels::BlockAttentionFwdArgs &fa) {
          // The step's entry point for it (the kernel with PINGPONG).
          kernels::block_attention_fwd_ws_pingpong_bf16<D, BS, NH, NKV, WINDOW,
                                                        CAUSAL>(fa, 0);
        },
        "wgmma warp-specialised fwd, pingpong");
}

template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL>
void sweepWgmma(int B, int S, int N, uint64_t seed,
                Forward fwd = Forward::Tma) {
  runWgmmaCase<D, BS, NH, NKV, WINDOW, CAUSAL>(
      B, S, N, Anchors::SortedTrailingKeep0, seed, Rows::Unpacked, fwd);
  runWgmmaCase<D, BS, NH, NKV, WINDOW, CAUSAL>(B, S, N, Anchors::ScatteredKeep0,
                                               seed + 1, Rows::Unpacked, fwd);
}

/// The backward's outputs and workspace, poisoned, and its arguments over a
/// problem and the forward's out and lse.
struct BackwardRun {
  DeviceBuffer<bf16> dq, dck, dcv, ddk, ddv;
  DeviceBuffer<float> dqAccum, dot;
  kernels::BlockAttentionBwdArgs args{};

  BackwardRun(const Problem &p, const DeviceBuffer<bf16> &out,
              const DeviceBuffer<float> &lse)
      : dq(p.qElems), dck(p.ctxElems), dcv(p.ctxElems), ddk(p.draftElems),
        ddv(p.draftElems), dqAccum(p.qElems), dot(p.refLse.size()) {
    poisonAll(dq, dck, dcv, ddk, ddv, dqAccum, dot);
    args.dOut = p.dOut.ptr();
    args.q = p.q.ptr();
    args.contextKeys = p.ck.ptr();
    args.contextValues = p.cv.ptr();
    args.draftKeys = p.dk.ptr();
    args.draftValues = p.dv.ptr();
    args.anchors = p.dAnchors.get();
    args.keep = p.dKeep.get();
    args.positionIds = p.dPositions.get();
    args.out = out.get();
    args.lse = lse.get();
    args.dq = dq.get();
    args.dContextKeys = dck.get();
    args.dContextValues = dcv.get();
    args.dDraftKeys = ddk.get();
    args.dDraftValues = ddv.get();
    args.dqAccum = dqAccum.get();
    args.dOutDotOut = dot.get();
    args.B = p.B;
    args.S = p.S;
    args.N = p.N;
  }

  /// Each gradient within 2e-2 relative of the reference (NaN fails);
  /// returns the errors of dq, dK/dV of context keys, dK/dV of draft keys.
  std::array<double, 5> expectClose(const Problem &p) const {
    const double tol = 2e-2;
    std::array<double, 5> e = {
        gputest::relativeError(downloadBf16(dq), p.refDq),
        gputest::relativeError(downloadBf16(dck), p.refDck),
        gputest::relativeError(downloadBf16(dcv), p.refDcv),
        gputest::relativeError(downloadBf16(ddk), p.refDdk),
        gputest::relativeError(downloadBf16(ddv), p.refDdv)};
    const char *names[5] = {"dq", "dContextKeys", "dContextValues",
                            "dDraftKeys", "dDraftValues"};
    for (int i = 0; i < 5; ++i)
      EXPECT_LE(e[i], tol) << names[i] << ": relative error " << e[i];
    return e;
  }
};

template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          kernels::BlockAttentionDq DQ>
void checkBackward(const Problem &p, const DeviceBuffer<bf16> &out,
                   const DeviceBuffer<float> &lse) {
  SCOPED_TRACE(testing::Message() << "backward dq mode " << int(DQ));
  BackwardRun run(p, out, lse);
  kernels::mma_sync_block_attention_bwd_bf16<D, BS, NH, NKV, WINDOW, CAUSAL,
                                             DQ>(run.args, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  run.expectClose(p);
}

/// The wgmma backward (context kernel on wgmma) on the forward's out and
/// lse, checked as checkBackward does; prints the relative errors.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          kernels::BlockAttentionDq DQ, int WGS, bool WALK_DOWN, int GROUP,
          int STAGES = 2, int CLUSTER = 1>
void checkBackwardWgmma(const Problem &p, const DeviceBuffer<bf16> &out,
                        const DeviceBuffer<float> &lse) {
  SCOPED_TRACE(testing::Message()
               << "wgmma backward dq mode " << int(DQ) << " WGS=" << WGS
               << " WALK_DOWN=" << WALK_DOWN << " GROUP=" << GROUP
               << " STAGES=" << STAGES << " CLUSTER=" << CLUSTER);
  BackwardRun run(p, out, lse);
  kernels::sm90a_block_attention_bwd_wgmma_bf16<
      D, BS, NH, NKV, WINDOW, CAUSAL, kernels::WgmmaBwdDqAdd<DQ>, WGS,
      WALK_DOWN, GROUP, STAGES, CLUSTER>(run.args, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::array<double, 5> e = run.expectClose(p);
  std::printf("wgmma bwd D=%d BS=%d NH=%d NKV=%d W=%d DQ=%d WGS=%d down=%d "
              "GR=%d ST=%d CL=%d B=%d S=%d N=%d: relative dq %.3g dck %.3g "
              "dcv %.3g ddk %.3g ddv %.3g\n",
              D, BS, NH, NKV, WINDOW, int(DQ), WGS, int(WALK_DOWN), GROUP,
              STAGES, CLUSTER, p.B, p.S, p.N, e[0], e[1], e[2], e[3], e[4]);
}

template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          bool ALL_VARIANTS = true>
void runBwdWgmmaCase(int B, int S, int N, Anchors mode, uint64_t seed,
                     Rows rows = Rows::Unpacked) {
  SCOPED_TRACE(testing::Message()
               << "D=" << D << " BS=" << BS << " NH=" << NH << " NKV=" << NKV
               << " WINDOW=" << WINDOW << " CAUSAL=" << CAUSAL << " B=" << B
               << " S=" << S << " N=" << N << " mode=" << int(mode)
               << " packed=" << (rows == Rows::Packed));
  std::mt19937_64 rng(seed);
  Problem p(B, S, N, BS, NH, NKV, D, WINDOW, CAUSAL, mode, rng, rows);
  DeviceBuffer<bf16> out(p.qElems);
  DeviceBuffer<float> lse(p.refLse.size());
  checkForward<D, BS, NH, NKV, WINDOW, CAUSAL, 2, 64>(p, out, lse);
  using kernels::BlockAttentionDq;
  // Rows restaged and added by the key warps; the step's modes (fragment
  // atomics where N leaves no room; the default, rows added by a third
  // warpgroup, with key tiles of all pairs and of uneven groups of 3: the
  // default's own group size runs in BlockAttentionStepEntryPoints); then
  // the others.
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL, BlockAttentionDq::RowsVec4,
                     2, true, 0>(p, out, lse);
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL,
                     BlockAttentionDq::AtomicVec2, 2, true, 0>(p, out, lse);
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL,
                     BlockAttentionDq::RowsByAdders, 2, true, 0>(p, out, lse);
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL,
                     BlockAttentionDq::RowsByAdders, 2, true, 3>(p, out, lse);
  // Clusters of two key tiles sharing Q / dO by multicast (groups of 3
  // pairs: uneven; two and three stages).
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL,
                     BlockAttentionDq::RowsByAdders, 2, true, 3, 2, 2>(p, out,
                                                                       lse);
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL,
                     BlockAttentionDq::RowsByAdders, 2, true, 0, 3, 2>(p, out,
                                                                       lse);
  // Clusters of four (one Q / dO box copied by each rank; not selectable).
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL,
                     BlockAttentionDq::RowsByAdders, 2, true, 3, 2, 4>(p, out,
                                                                       lse);
  if constexpr (!ALL_VARIANTS)
    return;
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL, BlockAttentionDq::RowsVec4,
                     1, true, 0>(p, out, lse);
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL, BlockAttentionDq::RowsVec4,
                     2, true, 3>(p, out, lse);
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL,
                     BlockAttentionDq::AtomicVec4, 2, true, 0>(p, out, lse);
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL,
                     BlockAttentionDq::BulkReduce, 2, true, 0>(p, out, lse);
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL,
                     BlockAttentionDq::AtomicVec4, 2, false, 0>(p, out, lse);
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL,
                     BlockAttentionDq::AtomicVec4, 2, true, 1>(p, out, lse);
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL,
                     BlockAttentionDq::AtomicVec4, 1, true, 0>(p, out, lse);
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL,
                     BlockAttentionDq::BulkReduce, 1, true, 0>(p, out, lse);
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL,
                     BlockAttentionDq::AtomicVec4, 2, true, 0, 3>(p, out, lse);
  checkBackwardWgmma<D, BS, NH, NKV, WINDOW, CAUSAL,
                     BlockAttentionDq::BulkReduce, 2, true, 0, 3>(p, out, lse);
}

template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          bool ALL_VARIANTS = true>
void sweepBwdWgmma(int B, int S, int N, uint64_t seed) {
  runBwdWgmmaCase<D, BS, NH, NKV, WINDOW, CAUSAL, ALL_VARIANTS>(
      B, S, N, Anchors::SortedTrailingKeep0, seed);
  runBwdWgmmaCase<D, BS, NH, NKV, WINDOW, CAUSAL, ALL_VARIANTS>(
      B, S, N, Anchors::ScatteredKeep0, seed + 1);
}

template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL>
void runCase(int B, int S, int N, Anchors mode, uint64_t seed,
             Rows rows = Rows::Unpacked) {
  SCOPED_TRACE(testing::Message()
               << "D=" << D << " BS=" << BS << " NH=" << NH << " NKV=" << NKV
               << " WINDOW=" << WINDOW << " CAUSAL=" << CAUSAL << " B=" << B
               << " S=" << S << " N=" << N << " mode=" << int(mode)
               << " packed=" << (rows == Rows::Packed));
  std::mt19937_64 rng(seed);
  Problem p(B, S, N, BS, NH, NKV, D, WINDOW, CAUSAL, mode, rng, rows);
  DeviceBuffer<bf16> out(p.qElems);
  DeviceBuffer<float> lse(p.refLse.size());
  checkForward<D, BS, NH, NKV, WINDOW, CAUSAL, 1, 64>(p, out, lse);
  checkForward<D, BS, NH, NKV, WINDOW, CAUSAL, 2, 64>(p, out, lse);
  checkForward<D, BS, NH, NKV, WINDOW, CAUSAL, 2, 32>(p, out, lse);
  // The backward reads the forward's out and lse (the last variant's).
  using kernels::BlockAttentionDq;
  checkBackward<D, BS, NH, NKV, WINDOW, CAUSAL, BlockAttentionDq::AtomicVec4>(
      p, out, lse);
  checkBackward<D, BS, NH, NKV, WINDOW, CAUSAL, BlockAttentionDq::BulkReduce>(
      p, out, lse);
}

template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL>
void sweep(int B, int S, int N, uint64_t seed) {
  runCase<D, BS, NH, NKV, WINDOW, CAUSAL>(B, S, N, Anchors::SortedTrailingKeep0,
                                          seed);
  runCase<D, BS, NH, NKV, WINDOW, CAUSAL>(B, S, N, Anchors::ScatteredKeep0,
                                          seed + 1);
}

using BackwardEntry = void (*)(const kernels::BlockAttentionBwdArgs &,
                               cudaStream_t);

/// The entry points the generated step calls (block_attention_fwd_bf16,
/// block_attention_bwd_bf16 or another backward entry dflash-select-kernels
/// names), whichever kernels they pick for the shape.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL>
void checkStepEntryPoints(
    int B, int S, int N, uint64_t seed, Rows rows = Rows::Unpacked,
    BackwardEntry backward =
        &kernels::block_attention_bwd_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>) {
  SCOPED_TRACE(testing::Message()
               << "entry points D=" << D << " BS=" << BS << " NH=" << NH
               << " NKV=" << NKV << " WINDOW=" << WINDOW << " wgmma fwd "
               << kernels::wgmmaForwardSupports(D, BS, NH, NKV) << " bwd "
               << kernels::wgmmaBackwardSupports(D, BS, NH, NKV));
  std::mt19937_64 rng(seed);
  Problem p(B, S, N, BS, NH, NKV, D, WINDOW, CAUSAL, Anchors::ScatteredKeep0,
            rng, rows);
  DeviceBuffer<bf16> out(p.qElems);
  DeviceBuffer<float> lse(p.refLse.size());
  poisonAll(out, lse);
  kernels::BlockAttentionFwdArgs fa{
      p.q.ptr(),  p.ck.ptr(),       p.cv.ptr(),    p.dk.ptr(),
      p.dv.ptr(), p.dAnchors.get(), p.dKeep.get(), p.dPositions.get(),
      out.get(),  lse.get(),        p.B,           p.S,
      p.N};
  kernels::block_attention_fwd_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(fa, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  expectForwardClose(p, out, lse);
  BackwardRun run(p, out, lse);
  backward(run.args, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  run.expectClose(p);
}

} // namespace

// qwen3-8b b16: 32/8 heads, d 128, two blocks (128 rows) per forward CTA.
TEST(BlockAttention, Qwen3FullBs16) {
  sweep<128, 16, 32, 8, 0, false>(2, 300, 20, 1);
  sweep<128, 16, 32, 8, 0, false>(1, 131, 19, 2); // odd N: half-empty last CTA
}

// Sliding layer: window 64 < context, causal in-block; and W 2048 > S.
TEST(BlockAttention, SlidingWindowCausal) {
  sweep<128, 16, 32, 8, 64, true>(2, 300, 20, 3);
  sweep<128, 16, 32, 8, 2048, true>(2, 260, 16, 4);
}

// gpt-oss-20b b8: 64/8 heads (8 per group), d 64.
TEST(BlockAttention, GptOssBs8) {
  sweep<64, 8, 16, 2, 0, false>(2, 200, 24, 5);
}

// Llama b10: 40 rows per block, three blocks per CTA, 120 of 128 rows used.
TEST(BlockAttention, LlamaBs10) {
  sweep<128, 10, 8, 2, 0, false>(2, 220, 20, 6);
}

// 128 rows per block: the backward's 64-row query tiles split blocks.
TEST(BlockAttention, GroupOf8Bs16) {
  sweep<128, 16, 8, 1, 0, false>(2, 200, 10, 7);
}

// Small blocks (bs 4, 16 blocks per CTA), tiny window, causal.
TEST(BlockAttention, SmallBlocksWindow7) {
  sweep<64, 4, 4, 2, 7, true>(2, 100, 30, 8);
  sweep<64, 4, 4, 2, 0, false>(1, 40, 37, 9);
}

// DFlash2 drafters' sliding layers (docs/semantics.md section 13): a window
// and no in-block causality. tiny-dflash2 (d 64, 4/2 heads, bs 8, window 32)
// and the published qwen3.8-27b-dflash2-b8 layer (d 128, 32/8 heads, bs 8),
// with a window that cuts contexts mid-tile and one wider than the context.
TEST(BlockAttention, SlidingWindowBidirectional) {
  sweep<64, 8, 4, 2, 32, false>(2, 128, 12, 71);
  sweep<128, 8, 32, 8, 200, false>(2, 900, 30, 72);
  sweep<128, 8, 32, 8, 2048, false>(1, 400, 21, 73);
}

TEST(BlockAttention, NothingKept) {
  runCase<128, 16, 32, 8, 0, false>(1, 100, 6, Anchors::NoneKept, 10);
}

// The wgmma forward: qwen3-8b full and sliding layers (odd N, keep = 0
// blocks, anchors 0, 1, S-2), contexts of several 128-key tiles, a window
// that cuts blocks' contexts mid-tile, one wider than the context; d 64.
TEST(BlockAttentionWgmma, Qwen3Full) {
  sweepWgmma<128, 16, 32, 8, 0, false>(2, 300, 20, 21);
  sweepWgmma<128, 16, 32, 8, 0, false>(1, 1100, 37, 22);
}

TEST(BlockAttentionWgmma, Qwen3Sliding) {
  sweepWgmma<128, 16, 32, 8, 2048, true>(2, 260, 16, 23);
  sweepWgmma<128, 16, 32, 8, 200, true>(2, 900, 30, 25);
}

// A 2048 window inside a 3000-token context (slow reference: about 40 s).
TEST(BlockAttentionWgmma, Qwen3SlidingLong) {
  sweepWgmma<128, 16, 32, 8, 2048, true>(1, 3000, 41, 24);
}

TEST(BlockAttentionWgmma, GptOssD64) {
  sweepWgmma<64, 8, 16, 2, 0, false>(2, 400, 24, 26);
  sweepWgmma<64, 8, 16, 2, 128, true>(1, 500, 21, 27);
}

TEST(BlockAttentionWgmma, NothingKept) {
  runWgmmaCase<128, 16, 32, 8, 0, false>(1, 100, 6, Anchors::NoneKept, 28);
}

// The warp-specialised forward (kernels/BlockAttentionWgmmaFwdWs.cuh) on the
// wgmma forward's cases and longer contexts: many 128-key tiles, blocks of
// a CTA whose contexts end tiles apart (scattered anchors), windows that
// cut contexts mid-tile, d 64, packed rows and nothing kept; each alone and
// in clusters of two block pairs (an odd number of pairs leaves the last
// cluster's second CTA without blocks), and with its consumers issuing in
// turns (pingpong: a CTA whose two blocks see different tiles, or only one
// block, still hands every turn on; a miscount hangs).
constexpr Forward kWarpSpecialisedForms[] = {Forward::WarpSpecialised,
                                             Forward::WarpSpecialisedClusters,
                                             Forward::WarpSpecialisedPingpong};

TEST(BlockAttentionWgmmaWs, Qwen3Full) {
  for (Forward f : kWarpSpecialisedForms) {
    sweepWgmma<128, 16, 32, 8, 0, false>(2, 300, 20, 81, f);
    sweepWgmma<128, 16, 32, 8, 0, false>(1, 1100, 37, 82, f);
    sweepWgmma<128, 16, 32, 8, 0, false>(1, 4000, 9, 83, f);
  }
}

TEST(BlockAttentionWgmmaWs, Qwen3Sliding) {
  for (Forward f : kWarpSpecialisedForms) {
    sweepWgmma<128, 16, 32, 8, 2048, true>(2, 260, 16, 84, f);
    sweepWgmma<128, 16, 32, 8, 200, true>(2, 900, 30, 85, f);
    sweepWgmma<128, 16, 32, 8, 2048, true>(1, 3000, 13, 86, f);
  }
}

TEST(BlockAttentionWgmmaWs, GptOssD64) {
  for (Forward f : kWarpSpecialisedForms) {
    sweepWgmma<64, 8, 16, 2, 0, false>(2, 400, 24, 87, f);
    sweepWgmma<64, 8, 16, 2, 128, true>(1, 500, 21, 88, f);
  }
}

TEST(BlockAttentionWgmmaWs, PackedRows) {
  for (Forward f : kWarpSpecialisedForms) {
    runWgmmaCase<128, 16, 32, 8, 0, false>(2, 900, 30, Anchors::ScatteredKeep0,
                                           89, Rows::Packed, f);
    runWgmmaCase<128, 16, 32, 8, 200, true>(
        2, 900, 30, Anchors::SortedTrailingKeep0, 90, Rows::Packed, f);
  }
}

// Rows shorter than one tile of 128 keys: the context box reaches past the
// row (TMA fills zeros, the mask hides them).
TEST(BlockAttentionWgmmaWs, RowShorterThanATile) {
  for (Forward f : kWarpSpecialisedForms) {
    sweepWgmma<128, 16, 32, 8, 0, false>(2, 100, 5, 92, f);
    sweepWgmma<128, 16, 32, 8, 64, true>(1, 120, 6, 93, f);
  }
}

TEST(BlockAttentionWgmmaWs, NothingKept) {
  for (Forward f : kWarpSpecialisedForms)
    runWgmmaCase<128, 16, 32, 8, 0, false>(1, 100, 6, Anchors::NoneKept, 91,
                                           Rows::Unpacked, f);
}

// The wgmma backward: qwen3-8b full and sliding layers (odd N, keep = 0
// blocks, anchors 0, 1, S-2), contexts of several 128-key tiles, a window
// that cuts contexts mid-tile, one wider than the context; 128-row blocks
// (query tiles of half a block).
// qwen3-8b's N (512) takes the row stage and the adder warpgroup; 3749 is the
// most that fits (1024 + 186432 + 12 N bytes: anchors, conversation starts
// and query tiles), past it the backward adds from the fragments.
static_assert(kernels::wgmmaBwdRowStageFits(128, 16, 32, 8, 512) &&
              kernels::wgmmaBwdRowStageFits(128, 16, 32, 8, 3749) &&
              !kernels::wgmmaBwdRowStageFits(128, 16, 32, 8, 3750));
static_assert(kernels::wgmmaBackwardSupports(128, 16, 32, 8) &&
              kernels::wgmmaBackwardSupports(128, 16, 8, 1) &&
              !kernels::wgmmaBackwardSupports(64, 8, 16, 2) &&
              !kernels::wgmmaBackwardSupports(128, 10, 8, 2));

TEST(BlockAttentionBwdWgmma, Qwen3Full) {
  sweepBwdWgmma<128, 16, 32, 8, 0, false>(2, 300, 20, 41);
  sweepBwdWgmma<128, 16, 32, 8, 0, false>(1, 1100, 37, 42);
}

TEST(BlockAttentionBwdWgmma, Qwen3Sliding) {
  sweepBwdWgmma<128, 16, 32, 8, 2048, true>(2, 260, 16, 43);
  sweepBwdWgmma<128, 16, 32, 8, 200, true>(2, 900, 30, 44);
}

TEST(BlockAttentionBwdWgmma, GroupOf8Bs16) {
  sweepBwdWgmma<128, 16, 8, 1, 0, false>(2, 200, 10, 45);
}

// The backward launching the key tiles of one (row, kv head) pair at a time
// (block_attention_bwd_pair_by_pair_bf16, what dflash-select-kernels picks
// for the longest rows): two rows of 8 kv heads (16 pairs, each of several key
// tiles, the last one partial), full and sliding layers, scattered and
// trailing anchors, packed rows.
TEST(BlockAttentionBwdWgmma, PairByPair) {
  constexpr BackwardEntry full =
      &kernels::block_attention_bwd_pair_by_pair_bf16<128, 16, 32, 8, 0, false>;
  constexpr BackwardEntry sliding =
      &kernels::block_attention_bwd_pair_by_pair_bf16<128, 16, 32, 8, 200,
                                                      true>;
  checkStepEntryPoints<128, 16, 32, 8, 0, false>(2, 1100, 37, 51,
                                                 Rows::Unpacked, full);
  checkStepEntryPoints<128, 16, 32, 8, 0, false>(1, 3000, 21, 52,
                                                 Rows::Unpacked, full);
  checkStepEntryPoints<128, 16, 32, 8, 200, true>(2, 900, 30, 53,
                                                  Rows::Unpacked, sliding);
  checkStepEntryPoints<128, 16, 32, 8, 0, false>(2, 900, 30, 54, Rows::Packed,
                                                 full);
  checkStepEntryPoints<128, 16, 32, 8, 200, true>(2, 900, 30, 55, Rows::Packed,
                                                  sliding);
}

// 32-row blocks, two per query tile: an odd N leaves the last tile half
// empty (its rows past the last block add nothing). The default and the
// fragment atomics only.
TEST(BlockAttentionBwdWgmma, TwoBlocksPerTileOddN) {
  static_assert(kernels::wgmmaBackwardSupports(128, 8, 32, 8));
  sweepBwdWgmma<128, 8, 32, 8, 0, false, false>(2, 300, 21, 46);
  sweepBwdWgmma<128, 8, 32, 8, 100, true, false>(1, 400, 33, 47);
}

TEST(BlockAttentionBwdWgmma, SlidingWindowBidirectional) {
  sweepBwdWgmma<128, 8, 32, 8, 200, false, false>(2, 900, 30, 76);
  sweepBwdWgmma<128, 8, 32, 8, 2048, false, false>(1, 1100, 37, 77);
}

TEST(BlockAttentionBwdWgmma, NothingKept) {
  runBwdWgmmaCase<128, 16, 32, 8, 0, false>(1, 100, 6, Anchors::NoneKept, 46);
}

// Packed rows (docs/semantics.md section 9): each block sees only its anchor's
// conversation, on every kernel: mma.sync both ways (full, a sliding window
// that crosses conversation starts, small blocks), the wgmma forward and
// backward (full and sliding) and the step's entry points.
TEST(BlockAttention, PackedRows) {
  runCase<128, 16, 32, 8, 0, false>(2, 300, 20, Anchors::ScatteredKeep0, 61,
                                    Rows::Packed);
  runCase<128, 16, 32, 8, 64, true>(2, 300, 20, Anchors::SortedTrailingKeep0,
                                    62, Rows::Packed);
  runCase<64, 4, 4, 2, 7, true>(2, 100, 30, Anchors::ScatteredKeep0, 63,
                                Rows::Packed);
}

TEST(BlockAttentionWgmma, PackedRows) {
  runWgmmaCase<128, 16, 32, 8, 0, false>(2, 900, 30, Anchors::ScatteredKeep0,
                                         64, Rows::Packed);
  runWgmmaCase<128, 16, 32, 8, 200, true>(
      2, 900, 30, Anchors::SortedTrailingKeep0, 65, Rows::Packed);
}

TEST(BlockAttentionBwdWgmma, PackedRows) {
  runBwdWgmmaCase<128, 16, 32, 8, 0, false, false>(
      2, 900, 30, Anchors::ScatteredKeep0, 66, Rows::Packed);
  runBwdWgmmaCase<128, 16, 32, 8, 200, true, false>(
      2, 900, 30, Anchors::SortedTrailingKeep0, 67, Rows::Packed);
}

// What the generated step runs: wgmma both ways (qwen3-8b full and sliding),
// wgmma forward only (gpt-oss, d 64), wgmma backward only (128 rows per
// block), and neither (Llama's 40 rows).
TEST(BlockAttentionStepEntryPoints, EveryKernelChoice) {
  checkStepEntryPoints<128, 16, 32, 8, 0, false>(2, 300, 21, 41);
  checkStepEntryPoints<128, 16, 32, 8, 200, true>(1, 700, 25, 42);
  checkStepEntryPoints<64, 8, 16, 2, 0, false>(2, 200, 24, 43);
  checkStepEntryPoints<128, 16, 8, 1, 0, false>(2, 200, 10, 44);
  checkStepEntryPoints<128, 16, 32, 8, 0, false>(2, 300, 21, 45, Rows::Packed);
  checkStepEntryPoints<128, 10, 8, 2, 0, false>(2, 220, 20, 46, Rows::Packed);
  checkStepEntryPoints<128, 10, 8, 2, 0, false>(2, 220, 20, 45);
  // DFlash2's sliding layers: a window without in-block causality.
  checkStepEntryPoints<64, 8, 4, 2, 32, false>(2, 128, 12, 47);
  checkStepEntryPoints<128, 8, 32, 8, 200, false>(1, 700, 25, 48);
}
