//===- KernelBench.cu - Timings of the step's kernels ---------------------===//
//
// Times every hand-written kernel of kernels/ at the qwen3-8b-b16 recipe
// shapes (B 4, S 3072, N 512, bs 16, nh/nkv/d 32/8/128, H 4096, I 12288,
// V 151936) next to the ceilings measured in the same run: a device-to-device
// copy (bytes read + written) and a cuBLASLt bf16 GEMM. CUDA events around
// each launch, warm-up first, median of the repetitions. Every working set
// is larger than the 60 MB L2 (q alone is 268 MB), so consecutive runs do
// not hit in cache. Prints a table and writes one JSON object per line to
// the file named by argv[1] (when given).
//
// Attention FLOPs count visible (query head, key) pairs only: 4 d per pair
// forward (QK^T and PV), 2.5 times that backward (the usual convention).
// The sections "causal" and "hybrid" (TargetBench.cu) time the online
// target's attention and Gated DeltaNet kernels; "swiglu-gemm" and
// "mlp-overlap" the target MLP's forms at the sustained clock (sustainedMs).
//
//===----------------------------------------------------------------------===//

#include "bench/kernels/BenchCommon.cuh"
#include "bench/kernels/TargetBench.h"
#include "bench/kernels/WgmmaBwdDqTiming.cuh"
#include "kernels/AdamW.cuh"
#include "kernels/BlockAttentionBwd.cuh"
#include "kernels/BlockAttentionFwd.cuh"
#include "kernels/BlockAttentionWgmmaFwdWs.cuh"
#include "kernels/DraftBlocks.cuh"
#include "kernels/Gemm.cuh"
#include "kernels/LmHeadCrossEntropy.cuh"
#include "kernels/Moe.cuh"
#include "kernels/QkNormRope.cuh"
#include "kernels/RmsNorm.cuh"
#include "kernels/SwiGlu.cuh"
#include "kernels/SwiGluGemm.cuh"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using namespace dflash::kernels;
using namespace dflash::bench;
using bf16 = __nv_bfloat16;

namespace {

double copyBandwidth() {
  const size_t bytes = size_t(2) << 30;
  char *a = deviceAlloc<char>(bytes), *b = deviceAlloc<char>(bytes);
  DFLASH_CUDA_CHECK(cudaMemset(a, 1, bytes));
  double ms = timeMs([&] {
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
  });
  double gbs = 2.0 * bytes / (ms * 1e6);
  report("copy d2d 2 GiB (read+write)", ms, "GB/s", gbs);
  cudaFree(a);
  cudaFree(b);
  return gbs;
}

double gemmCeiling(CublasLtGemm &gemm) {
  const int64_t n = 8192;
  bf16 *a = deviceAlloc<bf16>(n * n), *b = deviceAlloc<bf16>(n * n),
       *c = deviceAlloc<bf16>(n * n);
  randomBf16(a, n * n, 1);
  randomBf16(b, n * n, 2);
  double ms = timeMs([&] { gemm.linear(a, b, c, n, n, n, 0); });
  double tf = 2.0 * n * n * n / (ms * 1e9);
  report("cuBLASLt bf16 GEMM 8192^3", ms, "TFLOP/s", tf);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return tf;
}

/// cuBLASLt's heuristic first choice against the fastest of its first
/// kGemmCandidates (CublasLtGemm::timeCandidates) at every GEMM shape of the
/// qwen3-8b-b16 step and of the Qwen3-8B target at 4 x 3072 tokens, plus the
/// shapes that fusing q/k/v or gate/up into one GEMM would give. Timed at the
/// sustained (power-capped) clock the step runs at: no cool-down between
/// candidates, which are interleaved.
void gemmAlgorithms(CublasLtGemm &gemm) {
  struct Use {
    const char *product;
    int64_t M, N, K;
    int count; // launches of this shape per step (or target forward)
    const char *where;
  };
  const Use uses[] = {
      // The target forward (34 layers, 12288 tokens).
      {"linear", 12288, 4096, 4096, 68, "target q, o"},
      {"linear", 12288, 1024, 4096, 68, "target k, v"},
      {"linear", 12288, 12288, 4096, 68, "target gate, up"},
      {"linear", 12288, 4096, 12288, 34, "target down"},
      {"linear", 12288, 6144, 4096, 0, "target q|k|v fused"},
      {"linear", 12288, 24576, 4096, 0, "target gate|up fused"},
      // The drafter step (5 layers, 32768 draft rows, 12288 context rows).
      {"linear", 32768, 4096, 4096, 10, "step q, o"},
      {"linear", 32768, 1024, 4096, 10, "step k, v (draft)"},
      {"linear", 32768, 12288, 4096, 10, "step gate, up"},
      {"linear", 32768, 4096, 12288, 5, "step down"},
      {"linear", 12288, 1024, 4096, 10, "step k, v (context)"},
      {"linear", 12288, 4096, 20480, 1, "step fc"},
      {"linearGradInput", 32768, 4096, 4096, 10, "step dX q, o"},
      {"linearGradInput", 32768, 1024, 4096, 10, "step dX k, v"},
      {"linearGradInput", 32768, 12288, 4096, 10, "step dX gate, up"},
      {"linearGradInput", 32768, 4096, 12288, 5, "step dX down"},
      {"linearGradInput", 12288, 1024, 4096, 10, "step dX k, v (ctx)"},
      {"linearGradWeight", 32768, 4096, 4096, 10, "step dW q, o"},
      {"linearGradWeight", 32768, 1024, 4096, 10, "step dW k, v"},
      {"linearGradWeight", 32768, 12288, 4096, 10, "step dW gate, up"},
      {"linearGradWeight", 32768, 4096, 12288, 5, "step dW down"},
      {"linearGradWeight", 12288, 1024, 4096, 10, "step dW k, v (ctx)"},
      {"linearGradWeight", 12288, 4096, 20480, 1, "step dW fc"},
      {"linear", 2048, 151936, 4096, 15, "step lm_head logits chunk"},
      {"linearGradInput", 2048, 151936, 4096, 15, "step lm_head dX chunk"},
  };
  size_t most = 0;
  for (const Use &u : uses)
    most = std::max(
        {most, size_t(u.M * u.N), size_t(u.M * u.K), size_t(u.N * u.K)});
  bf16 *x = deviceAlloc<bf16>(most), *w = deviceAlloc<bf16>(most),
       *y = deviceAlloc<bf16>(most);
  randomBf16(x, most, 1);
  randomBf16(w, most, 2);
  // Plan every shape (one launch each), then time all plans' candidates.
  for (const Use &u : uses) {
    std::string p = u.product;
    if (p == "linear")
      gemm.linear(x, w, y, u.M, u.N, u.K, 0);
    else if (p == "linearGradInput")
      gemm.linearGradInput(x, w, y, u.M, u.N, u.K, 0);
    else
      gemm.linearGradWeight(x, w, y, u.M, u.N, u.K, 0);
  }
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  // Bring the GPU to its sustained clock first, as inside a step.
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
             .count() < 2.0) {
    for (int i = 0; i < 8; ++i)
      gemm.linear(x, w, y, 8192, 8192, 4096, 0);
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  }
  int changed = gemm.timeCandidates(0, 9, 0.0f);
  std::printf("gemm algorithms: %d of %zu shapes have a faster candidate than "
              "the heuristic's first\n",
              changed, gemm.numPlans());
  // [0]: the target forward, [1]: the drafter step.
  double firstTotal[2] = {0, 0}, bestTotal[2] = {0, 0};
  for (const GemmCandidateTimes &t : gemm.timings()) {
    const Use *use = nullptr;
    for (const Use &u : uses) {
      char name[96];
      std::snprintf(name, sizeof(name), "%s M %lld N %lld K %lld", u.product,
                    (long long)u.M, (long long)u.N, (long long)u.K);
      if (t.shape == name)
        use = &u;
    }
    float first = t.ms[0], best = t.ms[t.chosen];
    std::string all;
    for (float ms : t.ms) {
      char one[16];
      std::snprintf(one, sizeof(one), " %.3f", ms);
      all += one;
    }
    int count = use ? use->count : 0;
    const int side = use && std::string(use->where).rfind("step", 0) == 0;
    firstTotal[side] += count * first;
    bestTotal[side] += count * best;
    char note[256];
    std::snprintf(note, sizeof(note),
                  "%s x%d: first %.3f ms %.0f TFLOP/s, best #%d; all:%s",
                  use ? use->where : "?", count, first, t.flops / (first * 1e9),
                  t.chosen, all.c_str());
    report("gemm " + t.shape, best, "TFLOP/s", t.flops / (best * 1e9), note);
  }
  std::printf("gemm algorithms: target forward's GEMMs %.1f ms with the "
              "heuristic's first, %.1f ms with the fastest; the step's %.1f "
              "and %.1f ms\n",
              firstTotal[0], bestTotal[0], firstTotal[1], bestTotal[1]);
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
}

/// Which attention kernels a call times.
enum class AttentionSet {
  All,         ///< every variant (bwdOnly / fwdOnly: one direction)
  Defaults,    ///< the kernels the trainer selects ("attention-long")
  DqCosts,     ///< the step's backward beside its dQ timing-only forms and
               ///< launch groups of 1 and 2 (row, kv head) pairs
  ProfileOnce, ///< one untimed launch each, for Nsight Compute
};

/// bwdOnly / fwdOnly: the backward or forward variants alone (arguments
/// "attention-bwd", "attention-fwd"), at rows of S tokens (one row of 131072
/// for the "attention-long" arguments: the context half of each block's
/// keys dominates there). `set` (above): Defaults, the trainer's kernels
/// ("attention-long"); DqCosts, what each part of the dQ phase costs and
/// the backward with fewer dQ accumulators live ("attention-long-dq");
/// ProfileOnce, the step's forward (and its pingpong form) and backward and
/// the backward without its dQ adds, once each ("attention-long-profile").
template <int WINDOW, bool CAUSAL>
void attention(int B, bool bwdOnly, bool fwdOnly, int S = 3072,
               AttentionSet set = AttentionSet::All) {
  constexpr int D = 128, BS = 16, NH = 32, NKV = 8;
  const int N = 512, Q = N * BS;
  std::mt19937_64 rng(42 + B);
  std::vector<int32_t> anchors(size_t(B) * N);
  std::vector<uint8_t> keep(size_t(B) * N, 1);
  double pairs = 0; // visible (query row, key) pairs, per head
  for (int b = 0; b < B; ++b) {
    std::set<int> chosen;
    std::uniform_int_distribution<int> pos(0, S - 2);
    while (int(chosen.size()) < N)
      chosen.insert(pos(rng));
    int n = 0;
    for (int a : chosen) {
      anchors[b * N + n++] = a;
      for (int k = 0; k < BS; ++k) {
        int lo = WINDOW > 0 ? std::max(0, a + k - (WINDOW - 1)) : 0;
        pairs += std::max(0, a - lo) + (CAUSAL ? k + 1 : BS);
      }
    }
  }
  pairs *= NH;
  if (B == 4 && !anchorFile.empty()) {
    if (FILE *f = std::fopen(anchorFile.c_str(), "wb")) {
      std::fwrite(anchors.data(), sizeof(int32_t), anchors.size(), f);
      std::fclose(f);
    }
  }
  const size_t qn = size_t(B) * Q * NH * D, cn = size_t(B) * S * NKV * D,
               dn = size_t(B) * Q * NKV * D;
  bf16 *q = deviceAlloc<bf16>(qn), *ck = deviceAlloc<bf16>(cn),
       *cv = deviceAlloc<bf16>(cn), *dk = deviceAlloc<bf16>(dn),
       *dv = deviceAlloc<bf16>(dn), *out = deviceAlloc<bf16>(qn),
       *dOut = deviceAlloc<bf16>(qn), *dq = deviceAlloc<bf16>(qn),
       *dck = deviceAlloc<bf16>(cn), *dcv = deviceAlloc<bf16>(cn),
       *ddk = deviceAlloc<bf16>(dn), *ddv = deviceAlloc<bf16>(dn);
  float *lse = deviceAlloc<float>(size_t(B) * Q * NH);
  float *ws = reinterpret_cast<float *>(
      deviceAlloc<char>(blockAttentionBwdWorkspaceBytes(D, BS, NH, B, N)));
  randomBf16(q, qn, 3, 1.5f);
  randomBf16(ck, cn, 4);
  randomBf16(cv, cn, 5);
  randomBf16(dk, dn, 6);
  randomBf16(dv, dn, 7);
  randomBf16(dOut, qn, 8);
  int32_t *dAnchors = deviceAlloc<int32_t>(anchors.size());
  uint8_t *dKeep = deviceAlloc<uint8_t>(keep.size());
  DFLASH_CUDA_CHECK(cudaMemcpy(dAnchors, anchors.data(), anchors.size() * 4,
                               cudaMemcpyHostToDevice));
  DFLASH_CUDA_CHECK(
      cudaMemcpy(dKeep, keep.data(), keep.size(), cudaMemcpyHostToDevice));
  std::vector<int32_t> positions(size_t(B) * S); // unpacked rows
  for (size_t i = 0; i < positions.size(); ++i)
    positions[i] = int32_t(i % size_t(S));
  int32_t *dPositions = deviceAlloc<int32_t>(positions.size());
  DFLASH_CUDA_CHECK(cudaMemcpy(dPositions, positions.data(),
                               positions.size() * 4, cudaMemcpyHostToDevice));
  BlockAttentionFwdArgs fa{q,          ck,  cv,  dk, dv, dAnchors, dKeep,
                           dPositions, out, lse, B,  S,  N};
  BlockAttentionBwdArgs ba{};
  ba.dOut = dOut;
  ba.q = q;
  ba.contextKeys = ck;
  ba.contextValues = cv;
  ba.draftKeys = dk;
  ba.draftValues = dv;
  ba.anchors = dAnchors;
  ba.keep = dKeep;
  ba.positionIds = dPositions;
  ba.out = out;
  ba.lse = lse;
  ba.dq = dq;
  ba.dContextKeys = dck;
  ba.dContextValues = dcv;
  ba.dDraftKeys = ddk;
  ba.dDraftValues = ddv;
  ba.dqAccum = ws;
  ba.dOutDotOut = ws + qn;
  ba.B = B;
  ba.S = S;
  ba.N = N;
  // Rows of other lengths than the step's 3072 carry S in their names.
  const std::string kindName =
      std::string(WINDOW > 0 ? "sliding2048" : "full") +
      (S == 3072 ? "" : " S=" + std::to_string(S));
  const char *kind = kindName.c_str();
  double fwdFlops = 4.0 * D * pairs;
  char name[128];
  // Forward variants: m-tiles per warp x keys per tile.
  auto fwd = [&](auto launch, const char *variant) {
    double ms = timeMs([&] { launch(); });
    std::snprintf(name, sizeof(name), "attention fwd %s B=%d [%s]", kind, B,
                  variant);
    report(name, ms, "TFLOP/s", fwdFlops / (ms * 1e9));
  };
  // The backward reads the forward's out and lse.
  sm90a_block_attention_fwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(fa, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  auto bwd = [&](auto launch, const char *variant) {
    if (fwdOnly)
      return;
    double ms = timeMs([&] { launch(); });
    std::snprintf(name, sizeof(name), "attention bwd %s B=%d [%s]", kind, B,
                  variant);
    report(name, ms, "TFLOP/s", 2.5 * fwdFlops / (ms * 1e9));
  };
  auto freeAll = [&] {
    for (void *p :
         {(void *)q, (void *)ck, (void *)cv, (void *)dk, (void *)dv,
          (void *)out, (void *)dOut, (void *)dq, (void *)dck, (void *)dcv,
          (void *)ddk, (void *)ddv, (void *)lse, (void *)ws, (void *)dAnchors,
          (void *)dKeep, (void *)dPositions})
      cudaFree(p);
  };
  // The warp-specialised forward (what the step runs for long contexts): its
  // outputs at this shape against the default's (poisoned first), then its
  // time.
  auto fwdWarpSpecialised = [&] {
    const size_t ln = size_t(B) * Q * NH;
    auto downloadLse = [&] {
      std::vector<float> h(ln);
      DFLASH_CUDA_CHECK(cudaMemcpy(h.data(), lse, ln * sizeof(float),
                                   cudaMemcpyDeviceToHost));
      return h;
    };
    auto out0 = downloadBf16(out, qn);
    auto lse0 = downloadLse();
    // Each form's outputs against the default's, then its time.
    auto checkAndTime = [&](auto launch, const char *variant) {
      DFLASH_CUDA_CHECK(cudaMemset(out, 0xFF, qn * sizeof(bf16)));
      DFLASH_CUDA_CHECK(cudaMemset(lse, 0xFF, ln * sizeof(float)));
      launch();
      DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
      // Every block is kept here, so every lse is finite (NaN: unwritten).
      double lseDiff = 0;
      const std::vector<float> lse1 = downloadLse();
      for (size_t i = 0; i < ln; ++i) {
        const double d = std::abs(double(lse1[i]) - double(lse0[i]));
        lseDiff = std::isnan(d) ? INFINITY : std::max(lseDiff, d);
      }
      std::printf("attention fwd %s B=%d: %s vs default relative diff out "
                  "%.3g, lse max abs diff %.3g\n",
                  kind, B, variant,
                  relativeDifference(downloadBf16(out, qn), out0), lseDiff);
      fwd(launch, variant);
    };
    checkAndTime(
        [&] {
          sm90a_block_attention_fwd_wgmma_ws_bf16<D, BS, NH, NKV, WINDOW,
                                                  CAUSAL>(fa, 0);
        },
        "wgmma warp-specialised");
    // Clusters of two block pairs sharing each context tile (multicast).
    checkAndTime(
        [&] {
          sm90a_block_attention_fwd_wgmma_ws_bf16<D, BS, NH, NKV, WINDOW,
                                                  CAUSAL, 2>(fa, 0);
        },
        "wgmma warp-specialised, clusters of 2");
    // Its consumers issuing their products in turns (FlashAttention-3's
    // pingpong between warpgroups), by the step's entry point for it.
    checkAndTime(
        [&] {
          block_attention_fwd_ws_pingpong_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(
              fa, 0);
        },
        "wgmma warp-specialised, pingpong");
    // The backward reads the default forward's out and lse.
    sm90a_block_attention_fwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(fa, 0);
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  };
  if (set == AttentionSet::ProfileOnce) {
    // One launch each, untimed, for a profiler (ncu -k): the step's forward,
    // its pingpong form, the step's backward and the backward without its dQ
    // adds.
    sm90a_block_attention_fwd_wgmma_ws_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(fa,
                                                                            0);
    block_attention_fwd_ws_pingpong_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(fa, 0);
    // The backward reads the TMA forward's out and lse, as everywhere here
    // (ncu -k leaves this launch out).
    sm90a_block_attention_fwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(fa, 0);
    sm90a_block_attention_bwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(ba, 0);
    sm90a_block_attention_bwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL,
                                         bench::WgmmaBwdDqProductOnlyForTiming>(
        ba, 0);
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
    std::printf("attention %s B=%d: profiled once each\n", kind, B);
    freeAll();
    return;
  }
  // The backward with dQ policy `policy` (a value of its type).
  auto bwdWithDq = [&](auto policy, const char *variant) {
    bwd(
        [&] {
          sm90a_block_attention_bwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL,
                                               decltype(policy)>(ba, 0);
        },
        variant);
  };
  // The adder warpgroup with other launch groups (pairs; 0: all), stages or
  // clusters of key tiles.
  auto adders = [&](auto group, auto stages, auto cluster,
                    const char *variant) {
    bwd(
        [&] {
          sm90a_block_attention_bwd_wgmma_bf16<
              D, BS, NH, NKV, WINDOW, CAUSAL,
              WgmmaBwdDqAdd<BlockAttentionDq::RowsByAdders>, 2, true,
              decltype(group)::value, decltype(stages)::value,
              decltype(cluster)::value>(ba, 0);
        },
        variant);
  };
  using std::integral_constant;
  using One = integral_constant<int, 1>;
  using Two = integral_constant<int, 2>;
  using Three = integral_constant<int, 3>;
  using Eight = integral_constant<int, kWgmmaBwdPairsPerGroup>;
  // The dQ phase in parts, timing only (a wrong dQ;
  // bench/kernels/WgmmaBwdDqTiming.cuh): the rows staged and released by the
  // adders but not added; dQ formed, not staged; no dQ phase.
  auto dqParts = [&] {
    bwdWithDq(bench::WgmmaBwdDqStagedNotAddedForTiming(),
              "wgmma wgs2 down dq rows staged, released unadded, timing only");
    bwdWithDq(bench::WgmmaBwdDqProductOnlyForTiming(),
              "wgmma wgs2 down dq product without adds, timing only");
    bwdWithDq(bench::WgmmaBwdDqOmittedForTiming(),
              "wgmma wgs2 down no dq phase, timing only");
  };
  if (set == AttentionSet::DqCosts) {
    bwdWithDq(WgmmaBwdDqAdd<BlockAttentionDq::RowsByAdders>(),
              "wgmma dq rows by adders, groups of 8 pairs (default)");
    dqParts();
    // At one row of 128K the 8 kv heads' fp32 dQ accumulators (134 MB) and
    // Q / dO (128 MB) outgrow the L2 (50 MB); the key tiles of one or two
    // kv heads at a time keep 33 or 66 MB live (dropped at 3K, where a
    // pair has 24 key tiles, never timed here). One pair at a time through
    // the step's entry point (block_attention_bwd_pair_by_pair_bf16).
    bwd(
        [&] {
          block_attention_bwd_pair_by_pair_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(
              ba, 0);
        },
        "wgmma dq rows by adders, groups of 1 pair");
    adders(Two(), Two(), One(), "wgmma dq rows by adders, groups of 2 pairs");
    freeAll();
    return;
  }
  if (set == AttentionSet::Defaults) {
    if (!bwdOnly) {
      fwd(
          [&] {
            sm90a_block_attention_fwd_wgmma_bf16<D, BS, NH, NKV, WINDOW,
                                                 CAUSAL>(fa, 0);
          },
          "wgmma tma (default)");
      fwdWarpSpecialised();
    }
    bwd(
        [&] {
          sm90a_block_attention_bwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(
              ba, 0);
        },
        "wgmma dq rows by adders, groups of 8 pairs (default)");
    freeAll();
    return;
  }
  if (!bwdOnly) {
    fwd(
        [&] {
          mma_sync_block_attention_fwd_bf16<D, BS, NH, NKV, WINDOW, CAUSAL, 1,
                                            64>(fa, 0);
        },
        "mt1 kt64");
    fwd(
        [&] {
          mma_sync_block_attention_fwd_bf16<D, BS, NH, NKV, WINDOW, CAUSAL, 2,
                                            64>(fa, 0);
        },
        "mt2 kt64");
    fwd(
        [&] {
          mma_sync_block_attention_fwd_bf16<D, BS, NH, NKV, WINDOW, CAUSAL, 2,
                                            32>(fa, 0);
        },
        "mt2 kt32");
    // wgmma (sm_90a) forward, fed by TMA (the default).
    fwd(
        [&] {
          sm90a_block_attention_fwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(
              fa, 0);
        },
        "wgmma tma (default)");
    fwdWarpSpecialised();
  }
  bwd(
      [&] {
        mma_sync_block_attention_bwd_bf16<D, BS, NH, NKV, WINDOW, CAUSAL,
                                          BlockAttentionDq::AtomicVec4>(ba, 0);
      },
      "dq atomic v4");
  // Context kernel on wgmma (launches 1 and 3 as above). First its outputs
  // at these shapes against the mma.sync backward's (relative L2 difference).
  if (!fwdOnly) {
    mma_sync_block_attention_bwd_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(ba, 0);
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
    auto q0 = downloadBf16(dq, qn), k0 = downloadBf16(dck, cn),
         v0 = downloadBf16(dcv, cn);
    // Poisoned (NaN) first: a row the wgmma backward leaves unwritten shows.
    auto againstMmaSync = [&](auto launch, const char *variant) {
      for (bf16 *p : {dq, dck, dcv})
        DFLASH_CUDA_CHECK(
            cudaMemset(p, 0xFF, (p == dq ? qn : cn) * sizeof(bf16)));
      launch();
      DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
      std::printf("attention bwd %s B=%d: wgmma %s vs mma.sync relative diff "
                  "dq %.3g dck %.3g dcv %.3g\n",
                  kind, B, variant,
                  relativeDifference(downloadBf16(dq, qn), q0),
                  relativeDifference(downloadBf16(dck, cn), k0),
                  relativeDifference(downloadBf16(dcv, cn), v0));
    };
    againstMmaSync(
        [&] {
          sm90a_block_attention_bwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(
              ba, 0);
        },
        "(default)");
    // Clusters of two key tiles (Q / dO multicast): the step's entry point.
    againstMmaSync(
        [&] {
          block_attention_bwd_cluster_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(ba,
                                                                           0);
        },
        "clusters of 2");
    againstMmaSync(
        [&] {
          sm90a_block_attention_bwd_wgmma_bf16<
              D, BS, NH, NKV, WINDOW, CAUSAL,
              WgmmaBwdDqAdd<BlockAttentionDq::RowsByAdders>, 2, true,
              kWgmmaBwdPairsPerGroup, 2, 4>(ba, 0);
        },
        "clusters of 4");
  }
  // Template order: dQ mode, warpgroups of 64 keys per CTA, walk down,
  // (row, kv head) pairs per launch group. The default runs first and last:
  // the two agree when the cool-down (timeMs) removes the order effect. The
  // variants measured and dropped (bulk reductions of rows, tiles or warp
  // slices, one warpgroup, walk up, three stages, row atomics issued under
  // the next tile's products, pairs of CTAs adding their dQ shares together,
  // adders issuing atomics, groups of 1, 2, 6 and 16 pairs) are in NOTES.md.
  bwd(
      [&] {
        sm90a_block_attention_bwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(ba,
                                                                             0);
      },
      "wgmma dq rows by adders, groups of 8 pairs (default)");
  // Clusters of two adjacent key tiles walking one list, each Q / dO tile
  // read from L2 once and multicast to both (two and three stages).
  adders(Eight(), Two(), Two(),
         "wgmma dq rows by adders, groups of 8 pairs, clusters of 2");
  adders(Eight(), Three(), Two(),
         "wgmma dq rows by adders, groups of 8 pairs, clusters of 2, three "
         "stages");
  // Clusters of four: each Q / dO tile read once for four key tiles.
  adders(Eight(), Two(), integral_constant<int, 4>(),
         "wgmma dq rows by adders, groups of 8 pairs, clusters of 4");
  bwd(
      [&] {
        sm90a_block_attention_bwd_wgmma_bf16<
            D, BS, NH, NKV, WINDOW, CAUSAL,
            WgmmaBwdDqAdd<BlockAttentionDq::RowsVec4>, 2, true, 0>(ba, 0);
      },
      "wgmma dq rows v4 by the key warps, all pairs (sixth session)");
  adders(integral_constant<int, 0>(), Two(), One(),
         "wgmma dq rows by adders, all pairs");
  adders(integral_constant<int, 4>(), Two(), One(),
         "wgmma dq rows by adders, groups of 4 pairs");
  adders(integral_constant<int, 12>(), Two(), One(),
         "wgmma dq rows by adders, groups of 12 pairs");
  adders(Eight(), Three(), One(),
         "wgmma dq rows by adders, groups of 8 pairs, three stages");
  bwd(
      [&] {
        sm90a_block_attention_bwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(ba,
                                                                             0);
      },
      "wgmma dq rows by adders, groups of 8 pairs (default, again)");
  bwd(
      [&] {
        sm90a_block_attention_bwd_wgmma_bf16<
            D, BS, NH, NKV, WINDOW, CAUSAL,
            WgmmaBwdDqAdd<BlockAttentionDq::AtomicVec2>>(ba, 0);
      },
      "wgmma dq atomic v2 (fragments)");
  // Launches 1 and 3 alone (shared by every variant above), in GB/s of the
  // bytes they must move. Launch 1 reads Q, dO, O, the draft K / V and
  // writes the fp32 accumulator, D and the draft dK / dV; launch 3 reads the
  // accumulator and writes bf16 dQ.
  auto launchAlone = [&](auto launch, const char *variant, double bytes) {
    if (fwdOnly)
      return;
    double ms = timeMs([&] { launch(); });
    std::snprintf(name, sizeof(name), "attention bwd %s B=%d [%s]", kind, B,
                  variant);
    report(name, ms, "GB/s", bytes / (ms * 1e6));
  };
  const double rows = double(qn) / D;
  const double launch1Bytes = 3.0 * qn * 2 + 4.0 * dn * 2 + qn * 4.0 + rows * 4;
  launchAlone(
      [&] {
        detail::launchBlockAttentionBwdDraft<D, BS, NH, NKV, WINDOW, CAUSAL>(ba,
                                                                             0);
      },
      "launch 1 only (draft keys, D, dQ init)", launch1Bytes);
  launchAlone(
      [&] {
        detail::launchBlockAttentionBwdDraft<D, BS, NH, NKV, WINDOW, CAUSAL, 2>(
            ba, 0);
      },
      "launch 1 only, two blocks per CTA (the forward's 128 rows)",
      launch1Bytes);
  launchAlone([&] { detail::launchBlockAttentionBwdDq<D, BS, NH>(ba, 0); },
              "launch 3 only (dQ to bf16)", qn * 6.0);
  dqParts();
  freeAll();
}

/// The fused lm_head + CE over 8192 rows (512 blocks of 16, slot 0 weighted
/// 0 as draft_targets makes it): every row computed (blockSize 0), slot 0
/// left out (blockSize 16, the trainer's), and the bare GEMMs of all rows.
void lmHead(CublasLtGemm &gemm, int64_t blockSize) {
  const int64_t rows = 8192, V = 151936, H = 4096, bs = 16;
  const int64_t computed = lmHeadComputedRows(rows, blockSize);
  const int64_t chunkRows = lmHeadChunkRows(computed, V);
  bf16 *y = deviceAlloc<bf16>(rows * H), *w = deviceAlloc<bf16>(V * H),
       *dy = deviceAlloc<bf16>(rows * H);
  const size_t wsBytes =
      lmHeadCrossEntropyWorkspaceBytes(rows, V, H, blockSize);
  char *ws = deviceAlloc<char>(wsBytes);
  int32_t *labels = deviceAlloc<int32_t>(rows);
  float *weights = deviceAlloc<float>(rows);
  uint8_t *hits = deviceAlloc<uint8_t>(rows);
  randomBf16(y, rows * H, 11);
  randomBf16(w, V * H, 12, 0.02f);
  std::vector<int32_t> hl(rows);
  std::vector<float> hw(rows);
  std::mt19937_64 rng(13);
  for (int64_t r = 0; r < rows; ++r) {
    hl[r] = static_cast<int32_t>(rng() % V);
    hw[r] = r % bs == 0 ? 0.f : 1.f;
  }
  DFLASH_CUDA_CHECK(
      cudaMemcpy(labels, hl.data(), rows * 4, cudaMemcpyHostToDevice));
  DFLASH_CUDA_CHECK(
      cudaMemcpy(weights, hw.data(), rows * 4, cudaMemcpyHostToDevice));
  LmHeadCrossEntropyArgs args{};
  args.y = y;
  args.lmHead = w;
  args.labels = labels;
  args.weights = weights;
  args.dy = dy;
  args.hits = hits;
  args.rows = rows;
  args.V = V;
  args.H = H;
  args.chunkRows = chunkRows;
  args.blockSize = blockSize;
  useLmHeadWorkspace(args, ws);
  double ms = timeMs([&] { lm_head_cross_entropy_bf16(gemm, args, 0); }, 2, 7);
  double msGemm = 0;
  if (blockSize == 0)
    msGemm = timeMs(
        [&] {
          for (int64_t r0 = 0; r0 < rows; r0 += chunkRows) {
            int64_t m = std::min(chunkRows, rows - r0);
            gemm.linear(y + r0 * H, w, args.logitsChunk, m, V, H, 0);
            gemm.linearGradInput(args.logitsChunk, w, dy + r0 * H, m, V, H, 0);
          }
        },
        2, 7);
  // FLOPs of every row, so that the two variants' rates compare as times.
  double flops = 4.0 * rows * V * H;
  char name[128], note[128];
  std::snprintf(name, sizeof(name),
                "lm_head+CE 8192x151936x4096 blockSize=%ld chunk=%ld",
                long(blockSize), long(chunkRows));
  std::snprintf(note, sizeof(note), "workspace %.0f MB", wsBytes / 1e6);
  report(name, ms, "TFLOP/s (all rows)", flops / (ms * 1e9), note);
  if (blockSize == 0) {
    std::snprintf(name, sizeof(name), "lm_head GEMMs alone chunk=%ld",
                  long(chunkRows));
    report(name, msGemm, "TFLOP/s", flops / (msGemm * 1e9));
  }
  for (void *p : {(void *)y, (void *)w, (void *)dy, (void *)ws, (void *)labels,
                  (void *)weights, (void *)hits})
    cudaFree(p);
}

void memoryBound(double copyGbs) {
  const int64_t rows = 4 * 512 * 16; // B * Q
  constexpr int H = 4096, I = 12288, NH = 32, D = 128;
  auto bw = [&](const char *name, double bytes, double ms) {
    double gbs = bytes / (ms * 1e6);
    char note[64];
    std::snprintf(note, sizeof(note), "%.0f%% of copy", 100.0 * gbs / copyGbs);
    report(name, ms, "GB/s", gbs, note);
  };
  {
    const size_t n = size_t(rows) * H;
    bf16 *x = deviceAlloc<bf16>(n), *d = deviceAlloc<bf16>(n),
         *s = deviceAlloc<bf16>(n), *y = deviceAlloc<bf16>(n),
         *w = deviceAlloc<bf16>(H), *dx = deviceAlloc<bf16>(n);
    float *dw = deviceAlloc<float>(H),
          *ws = deviceAlloc<float>(rmsNormBwdWorkspaceBytes(H) / 4);
    randomBf16(x, n, 21);
    randomBf16(d, n, 22);
    randomBf16(w, H, 23);
    double ms =
        timeMs([&] { rms_norm_fwd_bf16<H>(x, d, w, s, y, rows, 1e-6f, 0); });
    bw("rms_norm+residual fwd 32768x4096", 4.0 * n * 2, ms);
    ms = timeMs(
        [&] { rms_norm_bwd_bf16<H>(y, s, w, d, dx, dw, rows, 1e-6f, ws, 0); });
    bw("rms_norm+residual bwd 32768x4096", 4.0 * n * 2, ms);
    for (void *p : {(void *)x, (void *)d, (void *)s, (void *)y, (void *)w,
                    (void *)dx, (void *)dw, (void *)ws})
      cudaFree(p);
  }
  {
    const size_t n = size_t(rows) * NH * D;
    bf16 *x = deviceAlloc<bf16>(n), *y = deviceAlloc<bf16>(n),
         *dx = deviceAlloc<bf16>(n), *w = deviceAlloc<bf16>(D);
    int32_t *pos = deviceAlloc<int32_t>(rows);
    float *dw = deviceAlloc<float>(D),
          *ws = deviceAlloc<float>(qkNormRopeBwdWorkspaceBytes(D) / 4);
    randomBf16(x, n, 31);
    randomBf16(w, D, 32);
    std::vector<int32_t> positions(static_cast<size_t>(rows)); // to 32767
    for (int i = 0; i < rows; ++i)
      positions[size_t(i)] = i;
    DFLASH_CUDA_CHECK(cudaMemcpy(pos, positions.data(), positions.size() * 4,
                                 cudaMemcpyHostToDevice));
    double ms = timeMs([&] {
      qk_norm_rope_fwd_bf16<D, NH>(x, w, pos, y, rows, 1e-6f, 1e6f, 0);
    });
    bw("q norm+rope fwd 32768x32x128", 2.0 * n * 2, ms);
    ms = timeMs([&] {
      qk_norm_rope_bwd_bf16<D, NH>(y, x, w, pos, dx, dw, rows, 1e-6f, 1e6f, ws,
                                   0);
    });
    bw("q norm+rope bwd 32768x32x128", 3.0 * n * 2, ms);
    for (void *p : {(void *)x, (void *)y, (void *)dx, (void *)w, (void *)pos,
                    (void *)dw, (void *)ws})
      cudaFree(p);
  }
  {
    const size_t n = size_t(rows) * I;
    bf16 *gu = deviceAlloc<bf16>(2 * n), *y = deviceAlloc<bf16>(n),
         *dgu = deviceAlloc<bf16>(2 * n);
    randomBf16(gu, 2 * n, 41);
    StridedBf16 g{gu, 2 * I}, u{gu + I, 2 * I};
    double ms = timeMs([&] { swiglu_fwd_bf16(g, u, {y, I}, rows, I, 0); });
    bw("swiglu fwd 32768x12288", 3.0 * n * 2, ms);
    ms = timeMs([&] {
      swiglu_bwd_bf16({y, I}, g, u, {dgu, 2 * I}, {dgu + I, 2 * I}, rows, I, 0);
    });
    bw("swiglu bwd 32768x12288", 5.0 * n * 2, ms);
    cudaFree(gu);
    cudaFree(y);
    cudaFree(dgu);
  }
  {
    // 256M parameters in 8 tensors; bf16 gradients.
    std::vector<int64_t> sizes(8, int64_t(32) << 20);
    std::vector<AdamWTensor> tensors;
    std::vector<void *> owned;
    for (int64_t s : sizes) {
      AdamWTensor t{};
      t.param = deviceAlloc<bf16>(s);
      t.master = deviceAlloc<float>(s);
      bf16 *g = deviceAlloc<bf16>(s);
      t.grad = g;
      t.m = deviceAlloc<float>(s);
      t.v = deviceAlloc<float>(s);
      t.n = s;
      randomBf16(g, s, 51, 1e-3f);
      DFLASH_CUDA_CHECK(cudaMemset(t.master, 0, s * 4));
      DFLASH_CUDA_CHECK(cudaMemset(t.m, 0, s * 4));
      DFLASH_CUDA_CHECK(cudaMemset(t.v, 0, s * 4));
      tensors.push_back(t);
      owned.insert(owned.end(), {t.param, t.master, g, t.m, t.v});
    }
    auto chunks = buildAdamWChunks(sizes);
    AdamWTensor *dT = deviceAlloc<AdamWTensor>(tensors.size());
    AdamWChunk *dC = deviceAlloc<AdamWChunk>(chunks.size());
    double *partials = deviceAlloc<double>(chunks.size());
    float *nc = deviceAlloc<float>(2);
    AdamWStepState *state = deviceAlloc<AdamWStepState>(1);
    AdamWStepState hs{6e-4f, 1};
    DFLASH_CUDA_CHECK(cudaMemcpy(dT, tensors.data(),
                                 tensors.size() * sizeof(AdamWTensor),
                                 cudaMemcpyHostToDevice));
    DFLASH_CUDA_CHECK(cudaMemcpy(dC, chunks.data(),
                                 chunks.size() * sizeof(AdamWChunk),
                                 cudaMemcpyHostToDevice));
    DFLASH_CUDA_CHECK(
        cudaMemcpy(state, &hs, sizeof(hs), cudaMemcpyHostToDevice));
    AdamWTables tables{dT, dC, int(chunks.size()), partials, nc};
    AdamWHyper hyper;
    double ms =
        timeMs([&] { adamw_multi_tensor_step<bf16>(tables, state, hyper, 0); });
    double params = 8.0 * (32 << 20);
    // grad read twice (norm, step), master/m/v read and written, bf16 param.
    bw("adamw+clip 268M params (3 launches)", params * (2 + 2 + 24 + 2), ms);
    for (void *p : owned)
      cudaFree(p);
    for (void *p :
         {(void *)dT, (void *)dC, (void *)partials, (void *)nc, (void *)state})
      cudaFree(p);
  }
}

/// The median ms of each of `runs` at the sustained (power-capped) clock the
/// programs run at: 2 s of all of them first, then `rounds` of each,
/// alternating, so that the clock's drift falls on all alike.
std::vector<double> sustainedMs(const std::vector<std::function<void()>> &runs,
                                int rounds = 15) {
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
             .count() < 2.0) {
    for (const auto &run : runs)
      run();
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  }
  cudaEvent_t e0, e1;
  DFLASH_CUDA_CHECK(cudaEventCreate(&e0));
  DFLASH_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<std::vector<float>> ms(runs.size());
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < runs.size(); ++i) {
      DFLASH_CUDA_CHECK(cudaEventRecord(e0));
      runs[i]();
      DFLASH_CUDA_CHECK(cudaEventRecord(e1));
      DFLASH_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      DFLASH_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      ms[i].push_back(t);
    }
  DFLASH_CUDA_CHECK(cudaEventDestroy(e0));
  DFLASH_CUDA_CHECK(cudaEventDestroy(e1));
  std::vector<double> medians;
  for (auto &t : ms) {
    std::sort(t.begin(), t.end());
    medians.push_back(t[t.size() / 2]);
  }
  return medians;
}

/// The target MLP's gate/up GEMM with SwiGLU applied (kernels/SwiGluGemm.cuh,
/// one CTA and clusters of two) against what it replaces: cuBLASLt's gate
/// and up products (each shape's fastest candidate, as the planner times
/// them) and the SwiGLU pass, at the Qwen3-8B target's shape (12288 tokens,
/// I 12288, H 4096). Timed rested (the cool-down) and at the sustained clock
/// (after 2 s of all three, then alternating, median of 15 each), as inside
/// the target forward; the outputs differ by the products' bf16 rounding
/// only.
void swigluGemm(CublasLtGemm &gemm) {
  const int64_t M = 12288, F = 12288, K = 4096;
  bf16 *x = deviceAlloc<bf16>(M * K), *wg = deviceAlloc<bf16>(F * K),
       *wu = deviceAlloc<bf16>(F * K), *g = deviceAlloc<bf16>(M * F),
       *u = deviceAlloc<bf16>(M * F), *y0 = deviceAlloc<bf16>(M * F),
       *y1 = deviceAlloc<bf16>(M * F), *y2 = deviceAlloc<bf16>(M * F);
  randomBf16(x, M * K, 41);
  randomBf16(wg, F * K, 42, 2.f / 64);
  randomBf16(wu, F * K, 43, 1.f / 64);
  struct Form {
    const char *name;
    bf16 *y;
    std::function<void()> run;
  };
  std::vector<Form> forms;
  forms.push_back({"cuBLASLt", y0, [&] {
                     gemm.linear(x, wg, g, M, F, K, 0);
                     gemm.linear(x, wu, u, M, F, K, 0);
                     swiglu_fwd_bf16({g, F}, {u, F}, {y0, F}, M, F, 0);
                   }});
  forms.push_back({"fused, 1 CTA", y1, [&] {
                     detail::launchSwiGluGemm<1>(x, wg, wu, {y1, M, F, K}, 0);
                   }});
  forms.push_back({"fused, clusters of 2", y2, [&] {
                     detail::launchSwiGluGemm<2>(x, wg, wu, {y2, M, F, K}, 0);
                   }});
  forms[0].run();
  gemm.timeCandidates(0);
  const std::vector<bf16> ref = downloadBf16(y0, M * F);
  for (size_t i = 1; i < forms.size(); ++i) {
    DFLASH_CUDA_CHECK(cudaMemset(forms[i].y, 0xFF, M * F * 2));
    forms[i].run();
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
    std::printf("swiglu gemm: %s vs cuBLASLt + swiglu relative difference "
                "%.3e\n",
                forms[i].name,
                relativeDifference(downloadBf16(forms[i].y, M * F), ref));
  }
  const double flops = 2.0 * M * (2 * F) * K;
  const std::string shape = "gate+up+swiglu 12288x12288x4096 [";
  for (Form &f : forms) {
    const double ms = timeMs(f.run);
    report(shape + f.name + "]", ms, "TFLOP/s", flops / (ms * 1e9), "rested");
  }
  std::vector<std::function<void()>> runs;
  for (Form &f : forms)
    runs.push_back(f.run);
  const std::vector<double> sustained = sustainedMs(runs);
  for (size_t i = 0; i < forms.size(); ++i)
    report(shape + forms[i].name + "]", sustained[i], "TFLOP/s",
           flops / (sustained[i] * 1e9), "sustained");
  for (void *p : {(void *)x, (void *)wg, (void *)wu, (void *)g, (void *)u,
                  (void *)y0, (void *)y1, (void *)y2})
    DFLASH_CUDA_CHECK(cudaFree(p));
}

/// The Qwen3-30B-A3B expert GEMMs of one layer at 4 x 3072 tokens, 8 of 128
/// experts a token (98304 routed rows), against dense GEMMs of the same total
/// size: the grouped SwiGLU GEMM (gate and up, I 768, K 2048) against the
/// dense SwiGLU GEMM of [98304 x 768 x 2048], and the grouped down GEMM (N
/// 2048, K 768) against cuBLASLt's [98304 x 2048 x 768]; the routing balanced
/// (768 rows an expert) and uneven (256 and 1280 in turn). Rested clock.
void groupedGemm(CublasLtGemm &gemm) {
  const int64_t E = 128, M = 98304, H = 2048, I = 768;
  bf16 *x = deviceAlloc<bf16>(M * H), *wg = deviceAlloc<bf16>(E * I * H),
       *wu = deviceAlloc<bf16>(E * I * H), *wd = deviceAlloc<bf16>(E * H * I),
       *a = deviceAlloc<bf16>(M * I), *y = deviceAlloc<bf16>(M * H);
  randomBf16(x, M * H, 61);
  randomBf16(wg, E * I * H, 62, 2.f / 45);
  randomBf16(wu, E * I * H, 63, 1.f / 45);
  randomBf16(wd, E * H * I, 64, 1.f / 28);
  int32_t *offsets = deviceAlloc<int32_t>(E + 1);
  auto route = [&](bool uneven) {
    std::vector<int32_t> h(E + 1, 0);
    for (int64_t e = 0; e < E; ++e)
      h[e + 1] = h[e] + int32_t(uneven ? (e % 2 ? 1280 : 256) : M / E);
    DFLASH_CUDA_CHECK(
        cudaMemcpy(offsets, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  };
  const double upFlops = 2.0 * M * (2 * I) * H, downFlops = 2.0 * M * H * I;
  for (bool uneven : {false, true}) {
    route(uneven);
    const std::string how = uneven ? "uneven" : "balanced";
    double ms = timeMs([&] {
      grouped_linear_swiglu_bf16(x, wg, wu, offsets, a, M, E, I, H, 0);
    });
    report("moe gate+up grouped 98304x768x2048 [" + how + "]", ms, "TFLOP/s",
           upFlops / (ms * 1e9), "rested");
    ms = timeMs([&] { grouped_linear_bf16(a, wd, offsets, y, M, E, H, I, 0); });
    report("moe down grouped 98304x2048x768 [" + how + "]", ms, "TFLOP/s",
           downFlops / (ms * 1e9), "rested");
  }
  double ms = timeMs([&] { swiglu_gemm_bf16(x, wg, wu, {a, M, I, H}, 0); });
  report("moe gate+up dense 98304x768x2048 [swiglu gemm]", ms, "TFLOP/s",
         upFlops / (ms * 1e9), "rested");
  gemm.linear(a, wd, y, M, H, I, 0);
  gemm.timeCandidates(0);
  ms = timeMs([&] { gemm.linear(a, wd, y, M, H, I, 0); });
  report("moe down dense 98304x2048x768 [cuBLASLt]", ms, "TFLOP/s",
         downFlops / (ms * 1e9), "rested");
  for (void *p : {(void *)x, (void *)wg, (void *)wu, (void *)wd, (void *)a,
                  (void *)y, (void *)offsets})
    DFLASH_CUDA_CHECK(cudaFree(p));
}

/// The target MLP of one layer (gate, up, SwiGLU, down + residual) at 4 x
/// 3072 tokens, as the program runs it (one stream) against its rows split
/// in two halves on two streams, the second half's GEMMs started once the
/// first half's gate and up are done, so that one half's memory-bound
/// SwiGLU runs beside the other half's GEMMs. "halves, one stream" is the
/// split's own cost. Sustained clock; the outputs compared. Each stream's
/// GEMMs have a planner and workspace of their own, as concurrent GEMMs must.
void mlpOverlap(cublasLtHandle_t lt, size_t wsBytes) {
  void *ws[2] = {deviceAlloc<char>(wsBytes), deviceAlloc<char>(wsBytes)};
  CublasLtGemm planner0(lt, ws[0], wsBytes), planner1(lt, ws[1], wsBytes);
  const int64_t M = 12288, F = 12288, H = 4096, half = M / 2;
  bf16 *x = deviceAlloc<bf16>(M * H), *wg = deviceAlloc<bf16>(F * H),
       *wu = deviceAlloc<bf16>(F * H), *wd = deviceAlloc<bf16>(H * F),
       *g = deviceAlloc<bf16>(M * F), *u = deviceAlloc<bf16>(M * F),
       *y = deviceAlloc<bf16>(M * F), *r = deviceAlloc<bf16>(M * H),
       *out = deviceAlloc<bf16>(M * H);
  randomBf16(x, M * H, 51);
  randomBf16(wg, F * H, 52, 2.f / 64);
  randomBf16(wu, F * H, 53, 1.f / 64);
  randomBf16(wd, H * F, 54, 1.f / 110);
  randomBf16(r, M * H, 55);
  cudaStream_t side[2];
  cudaEvent_t fork, upDone, joined[2];
  for (cudaStream_t &st : side)
    DFLASH_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  DFLASH_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  DFLASH_CUDA_CHECK(cudaEventCreateWithFlags(&upDone, cudaEventDisableTiming));
  for (cudaEvent_t &e : joined)
    DFLASH_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  // Rows [r0, r0 + rows) of the MLP on `st`; `afterUp` between up and SwiGLU.
  auto rowsOf = [&](int64_t r0, int64_t rows, cudaStream_t st,
                    const std::function<void()> &afterUp) {
    CublasLtGemm &gemm = st == side[1] ? planner1 : planner0;
    gemm.linear(x + r0 * H, wg, g + r0 * F, rows, F, H, st);
    gemm.linear(x + r0 * H, wu, u + r0 * F, rows, F, H, st);
    if (afterUp)
      afterUp();
    swiglu_fwd_bf16({g + r0 * F, F}, {u + r0 * F, F}, {y + r0 * F, F}, rows, F,
                    st);
    gemm.linearResidual(y + r0 * F, wd, r + r0 * H, out + r0 * H, rows, H, F,
                        st);
  };
  std::vector<const char *> names = {"one stream", "halves, one stream",
                                     "halves, two streams"};
  std::vector<std::function<void()>> runs = {
      [&] { rowsOf(0, M, 0, {}); },
      [&] {
        rowsOf(0, half, 0, {});
        rowsOf(half, half, 0, {});
      },
      [&] {
        DFLASH_CUDA_CHECK(cudaEventRecord(fork, 0));
        DFLASH_CUDA_CHECK(cudaStreamWaitEvent(side[0], fork, 0));
        rowsOf(0, half, side[0],
               [&] { DFLASH_CUDA_CHECK(cudaEventRecord(upDone, side[0])); });
        DFLASH_CUDA_CHECK(cudaStreamWaitEvent(side[1], upDone, 0));
        rowsOf(half, half, side[1], {});
        for (int i = 0; i < 2; ++i) {
          DFLASH_CUDA_CHECK(cudaEventRecord(joined[i], side[i]));
          DFLASH_CUDA_CHECK(cudaStreamWaitEvent(0, joined[i], 0));
        }
      }};
  for (const auto &run : runs) // plan every shape, then time the candidates
    run();
  planner0.timeCandidates(0);
  planner1.timeCandidates(0); // agrees with planner0 (same kind of GPU)
  std::vector<std::vector<bf16>> results;
  for (const auto &run : runs) {
    DFLASH_CUDA_CHECK(cudaMemset(out, 0xFF, M * H * 2));
    run();
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
    results.push_back(downloadBf16(out, M * H));
  }
  for (size_t i = 1; i < runs.size(); ++i)
    std::printf("mlp overlap: %s vs one stream relative difference %.3e\n",
                names[i], relativeDifference(results[i], results[0]));
  const double flops = 2.0 * M * H * F * 3;
  const std::vector<double> ms = sustainedMs(runs);
  for (size_t i = 0; i < runs.size(); ++i)
    report(std::string("target mlp 12288x4096x12288 [") + names[i] + "]", ms[i],
           "TFLOP/s", flops / (ms[i] * 1e9), "sustained");
  for (cudaStream_t st : side)
    DFLASH_CUDA_CHECK(cudaStreamDestroy(st));
  for (cudaEvent_t e : {fork, upDone, joined[0], joined[1]})
    DFLASH_CUDA_CHECK(cudaEventDestroy(e));
  for (void *p : {(void *)x, (void *)wg, (void *)wu, (void *)wd, (void *)g,
                  (void *)u, (void *)y, (void *)r, (void *)out, ws[0], ws[1]})
    DFLASH_CUDA_CHECK(cudaFree(p));
}

} // namespace

int main(int argc, char **argv) {
  benchClock(); // a bad setting is refused before anything runs
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  if (argc > 1) {
    jsonOut = std::fopen(argv[1], "w");
    std::string path = argv[1];
    size_t slash = path.find_last_of('/');
    const std::string dir =
        slash == std::string::npos ? std::string(".") : path.substr(0, slash);
    anchorFile = dir + "/anchors_b4.bin";
    causalPositionsFile = dir + "/causal_positions_b4.bin";
  }
  cudaDeviceProp prop;
  DFLASH_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20);
  cublasLtHandle_t lt;
  DFLASH_CUBLAS_CHECK(cublasLtCreate(&lt));
  size_t wsBytes = size_t(64) << 20;
  void *ws = deviceAlloc<char>(wsBytes);
  CublasLtGemm gemm(lt, ws, wsBytes);
  std::string only = argc > 2 ? argv[2] : "";
  auto want = [&](const char *what) {
    return only.empty() || only.find(what) != std::string::npos;
  };

  double copyGbs = copyBandwidth();
  if (want("gemm"))
    gemmCeiling(gemm);
  if (want("gemm-algorithms"))
    gemmAlgorithms(gemm);
  if (only.find("attention-long-profile") != std::string::npos) {
    // The 128K forward and backward once each, for ncu (NOTES.md).
    attention<0, false>(1, false, false, 131072, AttentionSet::ProfileOnce);
  } else if (only.find("attention-long-dq") != std::string::npos) {
    // The step's 128K backward beside its dQ phase's timing-only forms.
    attention<0, false>(1, true, false, 131072, AttentionSet::DqCosts);
  } else if (only.find("attention-long-bwd") != std::string::npos) {
    // Every backward variant at one row of 131072 tokens (full layer), the
    // timing-only ones without dQ adds included: whether the adds bound the
    // backward at long context as they do at 3K (docs/kernels.md).
    attention<0, false>(1, true, false, 131072);
  } else if (only.find("attention-long") != std::string::npos) {
    // One row of 131072 tokens against one of the step's 3072, same anchors;
    // 8192 and 32768 between them, where a forward's choice may change
    // (kWarpSpecialisedForwardMinKeys).
    attention<0, false>(1, false, false, 3072, AttentionSet::Defaults);
    attention<0, false>(1, false, false, 8192, AttentionSet::Defaults);
    attention<0, false>(1, false, false, 32768, AttentionSet::Defaults);
    attention<0, false>(1, false, false, 131072, AttentionSet::Defaults);
    attention<2048, true>(1, false, false, 131072, AttentionSet::Defaults);
  } else if (want("attention")) {
    bool bwdOnly = only.find("bwd") != std::string::npos;
    bool fwdOnly = only.find("fwd") != std::string::npos;
    attention<0, false>(4, bwdOnly, fwdOnly);
    attention<2048, true>(4, bwdOnly, fwdOnly);
    attention<0, false>(1, bwdOnly, fwdOnly);
  }
  if (want("lmhead")) {
    lmHead(gemm, 0);
    lmHead(gemm, 16);
  }
  if (want("causal"))
    causalAttention();
  if (want("hybrid"))
    hybridTarget();
  if (want("swiglu-gemm"))
    swigluGemm(gemm);
  if (want("grouped-gemm"))
    groupedGemm(gemm);
  if (want("mlp-overlap"))
    mlpOverlap(lt, wsBytes);
  if (want("memory"))
    memoryBound(copyGbs);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  if (jsonOut)
    std::fclose(jsonOut);
  cudaFree(ws);
  cublasLtDestroy(lt);
  return 0;
}
