//===- Moe.cuh - A mixture-of-experts target's sparse MLP ------*- CUDA -*-===//
//
// The four steps of dflash.moe_route / moe_permute / grouped_linear(_swiglu)
// / moe_unpermute (docs/dialect.md, "Mixture-of-experts ops") on bf16 rows:
//   moe_route_bf16      one warp a token: softmax over the E router logits
//                       in fp32, the k largest (ties: the lower expert),
//                       renormalised when asked (Qwen3-MoE); or, gpt-oss's
//                       form, the k largest logits (same ties), then
//                       softmax over those k in fp32;
//   moe_permute_bf16    the T * k routed rows grouped by expert, in order of
//                       t * k + j within an expert (a counting sort in
//                       chunks of kMoePermuteChunkRows, no atomics on the
//                       order: the same routing groups the same way every
//                       run), with each expert's first row in `offsets`;
//   grouped_linear_bf16 / grouped_linear_swiglu_bf16
//                       kernels/WgmmaGemm.cuh's GEMM on the grouped rows,
//                       each expert's rows times its weight [N, K] of the
//                       stacked [E, N, K] (and SwiGLU of the gate and up
//                       products in the epilogue), with gpt-oss's extras
//                       when asked: each expert's bias [N] of the stacked
//                       [E, N], and the clamped activation;
//   moe_unpermute_bf16  each token's k expert rows weighted and summed in
//                       fp32 (j ascending), rounded once.
// Every launch has a static shape: the routing changes only what the
// kernels read from device memory, so the forward stays one CUDA graph.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_MOE_CUH
#define DFLASH_KERNELS_MOE_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/GemmLimits.h"
#include "kernels/WgmmaGemm.cuh"
#include "kernels/Workspaces.h"

#include <cfloat>
#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

namespace detail {

constexpr int kMoeWarp = 32;
constexpr int kMoeLogitsPerLane = kGroupedGemmMaxExperts / kMoeWarp;

/// topKThenSoftmax: gpt-oss's form (scores are the logits, `normalize` is
/// moot); otherwise the probabilities are.
static __global__ void moeRouteKernel(const __nv_bfloat16 *logits,
                                      __nv_bfloat16 *weights, int32_t *experts,
                                      int64_t T, int E, int k, bool normalize,
                                      bool topKThenSoftmax) {
  const int64_t t = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kMoeWarp;
  const int lane = threadIdx.x % kMoeWarp;
  if (t >= T)
    return;
  float p[kMoeLogitsPerLane];
  float top = -INFINITY;
#pragma unroll
  for (int i = 0; i < kMoeLogitsPerLane; ++i) {
    const int e = i * kMoeWarp + lane;
    p[i] = e < E ? __bfloat162float(logits[t * E + e]) : -INFINITY;
    top = fmaxf(top, p[i]);
  }
  // A chosen (or padding) entry becomes `none`, below every score.
  float none = -1.f;
  if (topKThenSoftmax) {
    // Logits of +-inf or NaN become finite, so that -inf is below all and
    // k valid experts are always chosen (an index out of range would break
    // the permutation); a NaN row still carries its NaN on through the
    // experts' products.
    none = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMoeLogitsPerLane; ++i)
      if (i * kMoeWarp + lane < E)
        p[i] = fminf(fmaxf(p[i], -FLT_MAX), FLT_MAX);
  } else {
    for (int d = kMoeWarp / 2; d > 0; d /= 2)
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, d));
    float sum = 0;
#pragma unroll
    for (int i = 0; i < kMoeLogitsPerLane; ++i) {
      p[i] = i * kMoeWarp + lane < E ? expf(p[i] - top) : 0.f;
      sum += p[i];
    }
    for (int d = kMoeWarp / 2; d > 0; d /= 2)
      sum += __shfl_xor_sync(0xffffffffu, sum, d);
    // Probabilities are >= 0.
#pragma unroll
    for (int i = 0; i < kMoeLogitsPerLane; ++i)
      p[i] = i * kMoeWarp + lane < E ? p[i] / sum : -1.f;
  }
  float mine = 0, kept = 0, first = 0;
  for (int j = 0; j < k; ++j) {
    // This lane's largest (its lowest expert among equals), then the
    // warp's, equal values going to the lower expert.
    float best = none;
    int bestExpert = E;
#pragma unroll
    for (int i = 0; i < kMoeLogitsPerLane; ++i)
      if (p[i] > best) {
        best = p[i];
        bestExpert = i * kMoeWarp + lane;
      }
    for (int d = kMoeWarp / 2; d > 0; d /= 2) {
      const float otherBest = __shfl_xor_sync(0xffffffffu, best, d);
      const int otherExpert = __shfl_xor_sync(0xffffffffu, bestExpert, d);
      if (otherBest > best || (otherBest == best && otherExpert < bestExpert)) {
        best = otherBest;
        bestExpert = otherExpert;
      }
    }
    if (bestExpert % kMoeWarp == lane) {
#pragma unroll
      for (int i = 0; i < kMoeLogitsPerLane; ++i)
        if (i == bestExpert / kMoeWarp)
          p[i] = none;
    }
    // gpt-oss: softmax's terms relative to the first (largest) logit.
    if (topKThenSoftmax) {
      if (j == 0)
        first = best;
      best = expf(best - first);
    }
    if (lane == j) {
      mine = best;
      experts[t * k + j] = bestExpert;
    }
    kept += best;
  }
  if (lane < k)
    weights[t * k + lane] =
        __float2bfloat16(normalize || topKThenSoftmax ? mine / kept : mine);
}

/// Each chunk's rows of each expert, and each row's rank among its chunk's
/// rows of the same expert (the rows before it with that expert).
static __global__ void __launch_bounds__(kMoePermuteChunkRows)
    moeCountKernel(const int32_t *experts, int64_t R, int E,
                   int32_t *chunkCounts, int32_t *ranks) {
  __shared__ int32_t chunk[kMoePermuteChunkRows];
  __shared__ int32_t counts[kGroupedGemmMaxExperts];
  const int64_t r = int64_t(blockIdx.x) * kMoePermuteChunkRows + threadIdx.x;
  const int32_t mine = r < R ? experts[r] : -1;
  chunk[threadIdx.x] = mine;
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    counts[e] = 0;
  __syncthreads();
  if (mine >= 0) {
    int32_t rank = 0;
    for (int i = 0; i < int(threadIdx.x); ++i)
      rank += chunk[i] == mine;
    ranks[r] = rank;
    atomicAdd(&counts[mine], 1); // a count: the same whatever the order
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    chunkCounts[int64_t(blockIdx.x) * E + e] = counts[e];
}

/// One CTA, a thread an expert: where each chunk's rows of the expert start
/// among the expert's (chunkCounts becomes that), and where each expert's
/// rows start (offsets [E + 1]).
static __global__ void __launch_bounds__(kGroupedGemmMaxExperts)
    moeOffsetsKernel(int32_t *chunkCounts, int64_t chunks, int E,
                     int32_t *offsets) {
  __shared__ int32_t scan[kGroupedGemmMaxExperts];
  const int e = threadIdx.x;
  int32_t total = 0;
  if (e < E)
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t n = chunkCounts[c * E + e];
      chunkCounts[c * E + e] = total;
      total += n;
    }
  scan[e] = total;
  __syncthreads();
  for (int d = 1; d < kGroupedGemmMaxExperts; d *= 2) {
    const int32_t before = e >= d ? scan[e - d] : 0;
    __syncthreads();
    scan[e] += before;
    __syncthreads();
  }
  if (e < E)
    offsets[e + 1] = scan[e];
  if (e == 0)
    offsets[0] = 0;
}

/// One warp a routed row: its place in `permuted`, and its token's row
/// copied there (16 bytes a lane at a time).
static __global__ void
moeScatterKernel(const __nv_bfloat16 *x, const int32_t *experts,
                 const int32_t *chunkStarts, const int32_t *ranks,
                 const int32_t *offsets, __nv_bfloat16 *permuted,
                 int32_t *source, int64_t R, int64_t H, int k, int E) {
  const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kMoeWarp;
  const int lane = threadIdx.x % kMoeWarp;
  if (r >= R)
    return;
  const int32_t e = experts[r];
  const int64_t p = int64_t(offsets[e]) +
                    chunkStarts[r / kMoePermuteChunkRows * E + e] + ranks[r];
  if (lane == 0)
    source[p] = int32_t(r);
  const uint4 *from = reinterpret_cast<const uint4 *>(x + (r / k) * H);
  uint4 *to = reinterpret_cast<uint4 *>(permuted + p * H);
  for (int64_t v = lane; v < H / 8; v += kMoeWarp)
    to[v] = from[v];
}

static __global__ void moeInvertKernel(const int32_t *source,
                                       int32_t *destination, int64_t R) {
  const int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p < R)
    destination[source[p]] = int32_t(p);
}

/// One warp a token: y[t] = sum_j weights[t, j] * permuted[destination[t *
/// k + j]], eight columns a lane at a time.
static __global__ void moeGatherKernel(const __nv_bfloat16 *permuted,
                                       const int32_t *destination,
                                       const __nv_bfloat16 *weights,
                                       __nv_bfloat16 *y, int64_t T, int64_t H,
                                       int k) {
  const int64_t t = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kMoeWarp;
  const int lane = threadIdx.x % kMoeWarp;
  if (t >= T)
    return;
  for (int64_t v = lane; v < H / 8; v += kMoeWarp) {
    float acc[8] = {};
    for (int j = 0; j < k; ++j) {
      const float w = __bfloat162float(weights[t * k + j]);
      const uint4 packed = reinterpret_cast<const uint4 *>(
          permuted + int64_t(destination[t * k + j]) * H)[v];
      const __nv_bfloat16 *vals =
          reinterpret_cast<const __nv_bfloat16 *>(&packed);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        acc[i] += w * __bfloat162float(vals[i]);
    }
    uint4 out;
    __nv_bfloat16 *o = reinterpret_cast<__nv_bfloat16 *>(&out);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      o[i] = __float2bfloat16(acc[i]);
    reinterpret_cast<uint4 *>(y + t * H)[v] = out;
  }
}

inline unsigned warpBlocks(int64_t warps, int threads) {
  return unsigned((warps * kMoeWarp + threads - 1) / threads);
}

inline bool aligned16(const void *p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

/// Biases may be null (null is aligned).
inline void checkGroupedGemm(const void *x, const void *w0, const void *w1,
                             const void *y, int64_t M, int64_t E, int64_t N,
                             int64_t K, const char *what,
                             const void *bias0 = nullptr,
                             const void *bias1 = nullptr) {
  if (!aligned16(x) || !aligned16(w0) || !aligned16(w1) || !aligned16(y) ||
      !aligned16(bias0) || !aligned16(bias1) || M <= 0 ||
      M >= (int64_t(1) << 31) || !groupedGemmSupportsShape(E, N, K))
    reportCudaFailure(__FILE__, __LINE__, what,
                      "unsupported shape or alignment (16-byte bases, at "
                      "most 512 experts, K a multiple of 8, N even)");
}

} // namespace detail

/// Routing: weights [T, k] and experts [T, k] of logits [T, E] (E <= 512,
/// k <= min(E, 32)), by descending weight; topKThenSoftmax picks gpt-oss's
/// form (the file comment), which ignores `normalize`.
inline void moe_route_bf16(const __nv_bfloat16 *logits, __nv_bfloat16 *weights,
                           int32_t *experts, int64_t T, int64_t E, int64_t k,
                           bool normalize, cudaStream_t stream,
                           bool topKThenSoftmax = false) {
  if (E < 1 || E > kGroupedGemmMaxExperts || k < 1 || k > E || k > kMoeMaxTopK)
    detail::reportCudaFailure(__FILE__, __LINE__, "moe_route_bf16",
                              "at most 512 experts and top-k at most 32");
  constexpr int threads = 256;
  detail::
      moeRouteKernel<<<detail::warpBlocks(T, threads), threads, 0, stream>>>(
          logits, weights, experts, T, int(E), int(k), normalize,
          topKThenSoftmax);
  DFLASH_CUDA_CHECK_LAUNCH("moeRouteKernel");
}

/// The routed rows of x [T, H] grouped by expert: permuted [T * k, H],
/// offsets [E + 1], source [T * k]; `workspace` holds
/// moePermuteWorkspaceBytes(T * k, E).
inline void moe_permute_bf16(const __nv_bfloat16 *x, const int32_t *experts,
                             __nv_bfloat16 *permuted, int32_t *offsets,
                             int32_t *source, int64_t T, int64_t H, int64_t k,
                             int64_t E, int32_t *workspace,
                             cudaStream_t stream) {
  if (E < 1 || E > kGroupedGemmMaxExperts || H % 8 != 0 ||
      !detail::aligned16(x) || !detail::aligned16(permuted))
    detail::reportCudaFailure(__FILE__, __LINE__, "moe_permute_bf16",
                              "at most 512 experts, rows of a multiple of 8 "
                              "on 16-byte bases");
  const int64_t R = T * k, chunks = moePermuteChunks(R);
  int32_t *chunkCounts = workspace, *ranks = workspace + chunks * E;
  detail::moeCountKernel<<<unsigned(chunks), kMoePermuteChunkRows, 0, stream>>>(
      experts, R, int(E), chunkCounts, ranks);
  DFLASH_CUDA_CHECK_LAUNCH("moeCountKernel");
  detail::moeOffsetsKernel<<<1, kGroupedGemmMaxExperts, 0, stream>>>(
      chunkCounts, chunks, int(E), offsets);
  DFLASH_CUDA_CHECK_LAUNCH("moeOffsetsKernel");
  constexpr int threads = 256;
  detail::
      moeScatterKernel<<<detail::warpBlocks(R, threads), threads, 0, stream>>>(
          x, experts, chunkCounts, ranks, offsets, permuted, source, R, H,
          int(k), int(E));
  DFLASH_CUDA_CHECK_LAUNCH("moeScatterKernel");
}

/// y [M, N] = each expert's rows of x [M, K] times its weight of w [E, N,
/// K] (+ its bias of `bias` [E, N] when not null), the experts' rows as
/// `offsets` [E + 1] (device memory) says.
inline void grouped_linear_bf16(const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                                const int32_t *offsets, __nv_bfloat16 *y,
                                int64_t M, int64_t E, int64_t N, int64_t K,
                                cudaStream_t stream,
                                const __nv_bfloat16 *bias = nullptr) {
  using namespace detail;
  checkGroupedGemm(x, w, w, y, M, E, N, K, "grouped_linear_bf16", bias);
  using Schedule = GroupedSchedule<GemmEpilogue::Plain>;
  const Schedule schedule{offsets, M, N, int(E)};
  // Without a bias, the form without extras: the same code as before them.
  if (!bias)
    launchWgmmaGemm<GemmEpilogue::Plain, 1>(
        schedule, x, w, w, E * N, y, K, stream, "grouped_linear x or weights");
  else
    launchWgmmaGemm<GemmEpilogue::Plain, 1, Schedule, true>(
        schedule, x, w, w, E * N, y, K, stream, "grouped_linear x or weights",
        GemmEpilogueExtras{bias, bias, false});
}

/// y [M, N] = silu(g) * u with g = x Wg_e^T (+ gateBias_e) and u = x Wu_e^T
/// (+ upBias_e) for each expert e's rows, Wg and Wu [E, N, K] stacked, the
/// biases [E, N] (each may be null); clamped: gpt-oss's (u' + 1) * g' *
/// sigmoid(alpha g'), g' = min(g, limit), u' = clamp(u, -limit, limit).
inline void grouped_linear_swiglu_bf16(
    const __nv_bfloat16 *x, const __nv_bfloat16 *wGate,
    const __nv_bfloat16 *wUp, const int32_t *offsets, __nv_bfloat16 *y,
    int64_t M, int64_t E, int64_t N, int64_t K, cudaStream_t stream,
    const __nv_bfloat16 *gateBias = nullptr,
    const __nv_bfloat16 *upBias = nullptr, bool clamped = false,
    float alpha = 1.702f, float limit = 7.f) {
  using namespace detail;
  checkGroupedGemm(x, wGate, wUp, y, M, E, N, K, "grouped_linear_swiglu_bf16",
                   gateBias, upBias);
  using Schedule = GroupedSchedule<GemmEpilogue::SwiGlu>;
  const Schedule schedule{offsets, M, N, int(E)};
  // Qwen3-MoE's form keeps the epilogue without extras.
  if (!gateBias && !upBias && !clamped)
    launchWgmmaGemm<GemmEpilogue::SwiGlu, 1>(
        schedule, x, wGate, wUp, E * N, y, K, stream,
        "grouped_linear_swiglu x or weights");
  else
    launchWgmmaGemm<GemmEpilogue::SwiGlu, 1, Schedule, true>(
        schedule, x, wGate, wUp, E * N, y, K, stream,
        "grouped_linear_swiglu x or weights",
        GemmEpilogueExtras{gateBias, upBias, clamped, alpha, limit});
}

/// y [T, H] = sum over each token's k routed rows of permuted [T * k, H],
/// weighted; `workspace` holds moeUnpermuteWorkspaceBytes(T * k).
inline void moe_unpermute_bf16(const __nv_bfloat16 *permuted,
                               const int32_t *source,
                               const __nv_bfloat16 *weights, __nv_bfloat16 *y,
                               int64_t T, int64_t H, int64_t k,
                               int32_t *workspace, cudaStream_t stream) {
  if (H % 8 != 0 || !detail::aligned16(permuted) || !detail::aligned16(y))
    detail::reportCudaFailure(__FILE__, __LINE__, "moe_unpermute_bf16",
                              "rows of a multiple of 8 on 16-byte bases");
  const int64_t R = T * k;
  constexpr int threads = 256;
  detail::moeInvertKernel<<<unsigned((R + threads - 1) / threads), threads, 0,
                            stream>>>(source, workspace, R);
  DFLASH_CUDA_CHECK_LAUNCH("moeInvertKernel");
  detail::
      moeGatherKernel<<<detail::warpBlocks(T, threads), threads, 0, stream>>>(
          permuted, workspace, weights, y, T, H, int(k));
  DFLASH_CUDA_CHECK_LAUNCH("moeGatherKernel");
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_MOE_CUH
