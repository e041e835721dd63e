//===- TargetBench.cu - KernelBench's sections of the online target -------===//
//
// The target forward's own kernels at 4 x 3072 tokens, unpacked and on
// rows packed with conversations of lognormal lengths (the same rows for
// every kernel): the causal attention at Qwen3-8B's shape (nh/nkv/d
// 32/8/128) and at Qwen3.6-27B's gated attention (24/4/256), and the gated
// delta rule at Qwen3.6-27B's DeltaNet shape (16 key and 48 value heads of
// 128), each kernel's variants side by side.
//
//===----------------------------------------------------------------------===//

#include "bench/kernels/BenchCommon.cuh"
#include "bench/kernels/TargetBench.h"
#include "kernels/CausalAttention.cuh"
#include "kernels/GatedDeltaRule.cuh"

#include <random>

using namespace dflash::kernels;

namespace dflash::bench {

namespace {

constexpr int kRows = 4, kSeq = 3072;

/// Rows of position ids: one conversation a row, or conversations of
/// lognormal lengths (sigma 0.8, mean exp(mu + sigma^2 / 2) = 900 tokens;
/// the last of a row cut at S). `pairs` counts the causally visible (query,
/// key) pairs of one head.
struct Rows {
  std::vector<int32_t> positions;
  int conversations = 0;
  double pairs = 0;
  std::string note() const {
    char text[96];
    std::snprintf(text, sizeof(text), "%d conversations, mean %.0f tokens",
                  conversations, double(positions.size()) / conversations);
    return text;
  }
};

Rows rowsOf(bool packed) {
  Rows rows;
  rows.positions.resize(size_t(kRows) * kSeq);
  std::mt19937_64 rng(77);
  std::lognormal_distribution<double> length(std::log(900.0) - 0.32, 0.8);
  for (int b = 0; b < kRows; ++b)
    for (int j = 0; j < kSeq;) {
      int len =
          packed ? std::clamp(int(std::lround(length(rng))), 1, kSeq) : kSeq;
      len = std::min(len, kSeq - j);
      for (int t = 0; t < len; ++t)
        rows.positions[size_t(b) * kSeq + j + t] = t;
      rows.pairs += 0.5 * double(len) * (len + 1);
      ++rows.conversations;
      j += len;
    }
  return rows;
}

int32_t *uploadPositions(const Rows &rows) {
  int32_t *d = deviceAlloc<int32_t>(rows.positions.size());
  DFLASH_CUDA_CHECK(cudaMemcpy(d, rows.positions.data(),
                               rows.positions.size() * sizeof(int32_t),
                               cudaMemcpyHostToDevice));
  return d;
}

/// Both causal kernels at one shape. `shape` names it in the report ("" for
/// Qwen3-8B's, whose names the suites read); the Qwen3-8B shape's packed
/// positions go to causalPositionsFile for torch_reference.py. FLOPs count
/// visible (query head, key) pairs, 4 d each.
template <int D, int NH, int NKV> void causalShape(const char *shape) {
  const size_t qn = size_t(kRows) * kSeq * NH * D,
               kn = size_t(kRows) * kSeq * NKV * D;
  bf16 *q = deviceAlloc<bf16>(qn), *k = deviceAlloc<bf16>(kn),
       *v = deviceAlloc<bf16>(kn), *out = deviceAlloc<bf16>(qn);
  randomBf16(q, qn, 21, 1.5f);
  randomBf16(k, kn, 22);
  randomBf16(v, kn, 23);
  for (bool packed : {false, true}) {
    const Rows rows = rowsOf(packed);
    if (packed && *shape == '\0' && !causalPositionsFile.empty()) {
      if (FILE *f = std::fopen(causalPositionsFile.c_str(), "wb")) {
        std::fwrite(rows.positions.data(), sizeof(int32_t),
                    rows.positions.size(), f);
        std::fclose(f);
      }
    }
    int32_t *dPositions = uploadPositions(rows);
    CausalAttentionFwdArgs a{q, k, v, dPositions, out, kRows, kSeq};
    const double flops = 4.0 * D * rows.pairs * NH;
    auto run = [&](auto launch, const char *variant) {
      const double ms = timeMs([&] { launch(); });
      char name[128];
      std::snprintf(name, sizeof(name), "causal fwd%s %s B=%d [%s]", shape,
                    packed ? "packed" : "unpacked", kRows, variant);
      report(name, ms, "TFLOP/s", flops / (ms * 1e9), rows.note());
    };
    run([&] { causal_attention_fwd_bf16<D, NH, NKV>(a, 0); },
        "wgmma tma (default)");
    run([&] { mma_sync_causal_attention_fwd_bf16<D, NH, NKV>(a, 0); },
        "mma.sync");
    cudaFree(dPositions);
  }
  for (void *p : {(void *)q, (void *)k, (void *)v, (void *)out})
    cudaFree(p);
}

} // namespace

void causalAttention() { causalShape<128, 32, 8>(""); }

/// Qwen3.6-27B's own kernels: its gated attention (24 / 4 heads of 256),
/// and the gated delta rule at its shape (B 4, S 3072, Hk 16, Hv 48, d 128),
/// with the rates against the op's own FLOP count (dflash.gated_delta_rule:
/// 7 dk dv a token and value head, the recurrent form's; the chunk-wise form
/// does more).
void hybridTarget() {
  causalShape<256, 24, 4>(" d256 nh24 nkv4");
  constexpr int64_t Hk = 16, Hv = 48, Dh = 128;
  const size_t tokens = size_t(kRows) * kSeq;
  bf16 *q = deviceAlloc<bf16>(tokens * Hk * Dh),
       *k = deviceAlloc<bf16>(tokens * Hk * Dh),
       *v = deviceAlloc<bf16>(tokens * Hv * Dh),
       *a = deviceAlloc<bf16>(tokens * Hv),
       *beta = deviceAlloc<bf16>(tokens * Hv), *aLog = deviceAlloc<bf16>(Hv),
       *dtBias = deviceAlloc<bf16>(Hv),
       *out = deviceAlloc<bf16>(tokens * Hv * Dh);
  randomBf16(q, tokens * Hk * Dh, 31);
  randomBf16(k, tokens * Hk * Dh, 32);
  randomBf16(v, tokens * Hv * Dh, 33);
  randomBf16(a, tokens * Hv, 34);
  randomBf16(beta, tokens * Hv, 35);
  // exp(A_log) spread around e^-3 (a real model's range), dt_bias small.
  std::vector<bf16> logs(Hv), biases(Hv);
  for (int64_t h = 0; h < Hv; ++h) {
    logs[h] = __float2bfloat16(-5.f + 4.f * float(h) / float(Hv - 1));
    biases[h] = __float2bfloat16(0.05f * float(h % 5));
  }
  DFLASH_CUDA_CHECK(
      cudaMemcpy(aLog, logs.data(), Hv * sizeof(bf16), cudaMemcpyHostToDevice));
  DFLASH_CUDA_CHECK(cudaMemcpy(dtBias, biases.data(), Hv * sizeof(bf16),
                               cudaMemcpyHostToDevice));
  const double flops = 7.0 * Dh * Dh * double(tokens) * Hv;
  for (bool packed : {false, true}) {
    const Rows rows = rowsOf(packed);
    int32_t *dPositions = uploadPositions(rows);
    const double ms = timeMs([&] {
      gated_delta_rule_bf16(q, k, v, a, beta, aLog, dtBias, dPositions, out,
                            kRows, kSeq, Hk, Hv, Dh, Dh, cudaStream_t(0));
    });
    char name[128];
    std::snprintf(name, sizeof(name),
                  "gated delta rule %s B=%d Hv=48 d=128 [mma.sync]",
                  packed ? "packed" : "unpacked", kRows);
    report(name, ms, "TFLOP/s", flops / (ms * 1e9), rows.note());
    cudaFree(dPositions);
  }
  for (void *p : {(void *)q, (void *)k, (void *)v, (void *)a, (void *)beta,
                  (void *)aLog, (void *)dtBias, (void *)out})
    cudaFree(p);
}

} // namespace dflash::bench
