//===- DFlash2Selector.cuh - The DFlash2 selector's kernels ----*- CUDA -*-===//
//
// docs/semantics.md section 13, "Unary logits", "Selector" and "Loss"; the
// CPU reference is kernels/reference/DFlash2.h, the ops' contracts
// dialect/DFlashOps.td and dialect/DFlashGradientOps.td.
//
// - selector_candidates_bf16: the top-K of u = T(y lm_head^T) per row
//   without the [rows, V] logits: the vocabulary is streamed in chunks of
//   selectorVocabChunk columns (kernels/Workspaces.h), each one cuBLASLt
//   GEMM into an fp32 [rows, chunk] workspace, then one CTA a row merges the
//   chunk into the row's running top-K, kept in the results themselves.
//   The lm_head + CE kernel (kernels/LmHeadCrossEntropy.cuh) computes the
//   same logits; folding this merge into it, so that the logits are made
//   once, is the later step.
// - selector_candidates_grad_bf16: sparse, K + 1 lm_head rows a row.
// - selector_loss_bf16 / selector_loss_grad_bf16: t = y Wh^T (cuBLASLt,
//   fp32 into the workspace), then one CTA a row: scores, softmax over K,
//   CE_s, cov, hits (and the gradients). The codebook gradients are row
//   scatter-adds: fp32 atomics into zeroed [V, r] accumulators (rows repeat
//   across rows and candidates), rounded once into the bf16 results.
// - draft_predecessors, selector_alpha_f32, selector_objective(_grad)_f32:
//   index and scalar kernels of microseconds.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_DFLASH2SELECTOR_CUH
#define DFLASH_KERNELS_DFLASH2SELECTOR_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/DraftBlocks.cuh"
#include "kernels/Gemm.cuh"
#include "kernels/Reduce.cuh"
#include "kernels/Selector.h"
#include "kernels/UnaryTransform.cuh"
#include "kernels/WarpTopK.cuh"
#include "kernels/Workspaces.h"

#include <climits>
#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

struct SelectorCandidatesArgs {
  const __nv_bfloat16 *y;      ///< [rows, H]
  const __nv_bfloat16 *lmHead; ///< [V, H]
  const int32_t *labels;       ///< [rows]
  const float *weights;        ///< [rows]
  float *values;               ///< [rows, K] u of the candidates
  int32_t *candidates;         ///< [rows, K] descending u, ties lower token
  float *labelValues;          ///< [rows] u[label]
  float *logitsChunk;          ///< workspace [rows, chunk] fp32
  int64_t rows, V, H, K;
  int64_t chunk; ///< selectorVocabChunk(rows, V)
  float multiplier, softcap;
};

struct SelectorCandidatesGradArgs {
  const __nv_bfloat16 *y, *lmHead;
  const int32_t *candidates, *labels;
  const float *weights;
  const float *valuesGrad;      ///< [rows, K] or nullptr (zero)
  const float *labelValuesGrad; ///< [rows] or nullptr (zero)
  __nv_bfloat16 *dy;            ///< [rows, H], overwritten
  int64_t rows, V, H, K;
  float multiplier, softcap;
};

/// selector_loss and selector_loss_grad: the same operands; the forward
/// writes lossSum, coveredWeight and hits, the backward the gradients.
struct SelectorLossArgs {
  const float *values;             ///< [rows, K]
  const int32_t *candidates;       ///< [rows, K]
  const float *labelValues;        ///< [rows]
  const __nv_bfloat16 *y;          ///< [rows, H]
  const __nv_bfloat16 *projection; ///< Wh [r, H]
  const int32_t *predecessors, *labels;
  const float *weights;
  const __nv_bfloat16 *predecessorCodebook, *successorCodebook; ///< [V, r]
  bool inject = false, stopGradient = false;
  // Forward results (device scalars and [rows] flags).
  float *lossSum = nullptr, *coveredWeight = nullptr;
  uint8_t *hits = nullptr;
  // Backward: the seed d(loss)/d(loss_sum) (device scalar) and results.
  const float *lossSumGrad = nullptr;
  float *valuesGrad = nullptr, *labelValuesGrad = nullptr;
  __nv_bfloat16 *projectedGrad = nullptr; ///< [rows, r]
  __nv_bfloat16 *predecessorCodebookGrad = nullptr,
                *successorCodebookGrad = nullptr;
  // Workspace (useSelectorLossWorkspace).
  float *projected = nullptr; ///< t [rows, r]
  float *rowTerms = nullptr;  ///< forward: [rows, 2]
  float *predecessorAccum = nullptr, *successorAccum = nullptr; ///< [V, r]
  int64_t rows = 0, V = 0, H = 0, r = 0, K = 0;
};

namespace detail {

constexpr unsigned kSelectorFullMask = 0xffffffffu;

/// Rows of weight 0 get their final results (candidates -1, values 0);
/// the others an empty running top-K (-inf, token INT_MAX). label_values
/// start at 0: the chunk that holds the label overwrites it.
static __global__ void selector_candidates_init_kernel(const float *weights,
                                                       int64_t rows, int64_t K,
                                                       float *values,
                                                       int32_t *candidates,
                                                       float *labelValues) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < rows * K;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = e / K;
    const bool skip = weights[row] == 0.f;
    values[e] = skip ? 0.f : -INFINITY;
    candidates[e] = skip ? -1 : INT_MAX;
    if (e % K == 0)
      labelValues[row] = 0.f;
  }
}

/// One CTA a row: merges the chunk's u (columns [v0, v0 + n)) into the
/// row's running top-K (kernels/WarpTopK.cuh, as the lm_head kernel's
/// folded top-K): each warp keeps the top-K of a strided share of the chunk,
/// warp 0's also of the running list, and the warps' lists are merged by
/// rank; the result is the same whatever the order of the scan, as the order
/// is total.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    selector_topk_merge_kernel(const float *logits, int64_t n, int64_t v0,
                               const int32_t *labels, const float *weights,
                               float multiplier, float softcap, int K,
                               float *values, int32_t *candidates,
                               float *labelValues) {
  constexpr int kWarps = Threads / 32;
  __shared__ float sV[kWarps * kSelectorKernelMaxTopK];
  __shared__ int sI[kWarps * kSelectorKernelMaxTopK];
  const int64_t row = blockIdx.x;
  if (weights[row] == 0.f)
    return; // uniform: the init kernel wrote its results
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float *x = logits + row * n;
  float *rowValues = values + row * K;
  int32_t *rowCandidates = candidates + row * K;
  // Warp 0 starts from the running list of the earlier chunks, the other
  // warps from empty lists: every token is in one list at most, and the
  // lists stay sorted for blockTopKMerge.
  topk::WarpList l;
  l.clear();
  if (warp == 0) {
    l.av = lane < K ? rowValues[lane] : -INFINITY;
    l.ai = lane < K ? rowCandidates[lane] : INT_MAX;
    l.bv = lane + 32 < K ? rowValues[lane + 32] : -INFINITY;
    l.bi = lane + 32 < K ? rowCandidates[lane + 32] : INT_MAX;
    l.refreshThreshold(K);
  }
  for (int64_t base = int64_t(warp) * 32; base < n; base += Threads) {
    const int64_t c = base + lane;
    const bool have = c < n;
    const float v = have ? unaryLogit(x[c], multiplier, softcap) : 0.f;
    l.offer(have, v, static_cast<int>(v0 + c), K, lane);
  }
  if (threadIdx.x == 0) {
    const int64_t at = int64_t(labels[row]) - v0;
    if (at >= 0 && at < n)
      labelValues[row] = unaryLogit(x[at], multiplier, softcap);
  }
  l.store(sV + warp * K, sI + warp * K, K, lane);
  __syncthreads(); // the running list was read before any write below
  topk::blockTopKMerge(sV, sI, kWarps, K, rowValues, rowCandidates);
}

/// One CTA a row: dy = sum_e g_e T'(z_e) lm_head[tok_e] over the K
/// candidates and the label, z_e = y . lm_head[tok_e] (recomputed: the op
/// has not the values, and it is K + 1 dot products a row). H % 8 == 0.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    selector_candidates_grad_kernel(SelectorCandidatesGradArgs a) {
  constexpr int kWarps = Threads / 32;
  __shared__ float sCoef[kSelectorKernelMaxTopK + 1];
  __shared__ int sTok[kSelectorKernelMaxTopK + 1];
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int E = static_cast<int>(a.K) + 1;
  const float w = a.weights[row];
  if (threadIdx.x < E) {
    const int j = threadIdx.x;
    int tok = -1;
    float g = 0.f;
    if (w != 0.f) {
      if (j < a.K && a.valuesGrad) {
        tok = a.candidates[row * a.K + j];
        g = a.valuesGrad[row * a.K + j];
      } else if (j == a.K && a.labelValuesGrad) {
        tok = a.labels[row];
        g = a.labelValuesGrad[row];
      }
    }
    // A token outside the vocabulary (never one of a row that counts) is
    // left out rather than read.
    if (tok < 0 || tok >= a.V || g == 0.f) {
      tok = -1;
      g = 0.f;
    }
    sTok[j] = tok;
    sCoef[j] = g * a.multiplier;
  }
  __syncthreads();
  const int64_t H8 = a.H / 8;
  const uint4 *yRow = reinterpret_cast<const uint4 *>(a.y + row * a.H);
  if (a.softcap != 0.f) {
    // T'(z) = m (1 - tanh^2(m z / c)).
    for (int e = warp; e < E; e += kWarps) {
      const int tok = sTok[e];
      if (tok < 0)
        continue; // warp-uniform
      const uint4 *wRow = reinterpret_cast<const uint4 *>(a.lmHead + tok * a.H);
      float acc = 0.f;
      for (int64_t h = lane; h < H8; h += 32) {
        float fy[8], fw[8];
        unpackBf16x8(yRow[h], fy);
        unpackBf16x8(wRow[h], fw);
#pragma unroll
        for (int k = 0; k < 8; ++k)
          acc += fy[k] * fw[k];
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(kSelectorFullMask, acc, o);
      if (lane == 0) {
        const float th = tanhf(a.multiplier * acc / a.softcap);
        sCoef[e] *= 1.f - th * th;
      }
    }
    __syncthreads();
  }
  uint4 *dyRow = reinterpret_cast<uint4 *>(a.dy + row * a.H);
  for (int64_t h = threadIdx.x; h < H8; h += Threads) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int e = 0; e < E; ++e) {
      const int tok = sTok[e];
      if (tok < 0)
        continue;
      float fw[8];
      unpackBf16x8(reinterpret_cast<const uint4 *>(a.lmHead + tok * a.H)[h],
                   fw);
      const float g = sCoef[e];
#pragma unroll
      for (int k = 0; k < 8; ++k)
        acc[k] += g * fw[k];
    }
    dyRow[h] = packBf16x8(acc);
  }
}

/// One CTA a row of selector_loss (Backward false) or selector_loss_grad:
/// z = P[p] * t in shared memory, the K + 1 scores (the candidates', then
/// the label's for an injection), then thread 0's softmax over K.
template <bool Backward, int Threads>
__global__ void __launch_bounds__(Threads)
    selector_loss_rows_kernel(SelectorLossArgs a) {
  constexpr int kWarps = Threads / 32;
  extern __shared__ float sZ[]; // [r]
  __shared__ float sScore[kSelectorKernelMaxTopK + 1];
  __shared__ int sTok[kSelectorKernelMaxTopK + 1];
  __shared__ float sE[kSelectorKernelMaxTopK];
  __shared__ int sGold, sInjected;
  const int64_t row = blockIdx.x, r = a.r;
  const int K = static_cast<int>(a.K);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float w = a.weights[row];
  const int label = a.labels[row], p = a.predecessors[row];
  auto inVocabulary = [&](int t) { return t >= 0 && int64_t(t) < a.V; };
  if (threadIdx.x <= K)
    sTok[threadIdx.x] =
        threadIdx.x < K ? a.candidates[row * a.K + threadIdx.x] : label;
  // A row of weight 0 has no term; so has one whose indices lie outside the
  // vocabulary (the interpreter refuses those), rather than a stray read.
  const bool skip =
      __syncthreads_or(w == 0.f || !inVocabulary(label) || !inVocabulary(p) ||
                       (threadIdx.x < K && !inVocabulary(sTok[threadIdx.x])));
  float *tRow = a.projected + row * r;
  if (skip) {
    if constexpr (Backward) {
      for (int j = threadIdx.x; j < K; j += Threads)
        a.valuesGrad[row * K + j] = 0.f;
      for (int64_t i = threadIdx.x; i < r; i += Threads)
        a.projectedGrad[row * r + i] = __float2bfloat16(0.f);
      if (threadIdx.x == 0)
        a.labelValuesGrad[row] = 0.f;
    } else if (threadIdx.x == 0) {
      a.hits[row] = 0;
      a.rowTerms[row * 2] = a.rowTerms[row * 2 + 1] = 0.f;
    }
    return;
  }
  const __nv_bfloat16 *pRow = a.predecessorCodebook + int64_t(p) * r;
  for (int64_t i = threadIdx.x; i < r; i += Threads)
    sZ[i] = __bfloat162float(pRow[i]) * tRow[i];
  __syncthreads();
  // s_e = v_e + z . S[tok_e]; entry K is the label with its own u.
  for (int e = warp; e <= K; e += kWarps) {
    const __nv_bfloat16 *sRow = a.successorCodebook + int64_t(sTok[e]) * r;
    float acc = 0.f;
    for (int64_t i = lane; i < r; i += 32)
      acc += sZ[i] * __bfloat162float(sRow[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      acc += __shfl_xor_sync(kSelectorFullMask, acc, o);
    if (lane == 0)
      sScore[e] = (e < K ? a.values[row * a.K + e] : a.labelValues[row]) + acc;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // Greedy serving's pick over the true top-K (ties: the lower j), before
    // any injection.
    int best = 0, gold = -1;
    for (int j = 1; j < K; ++j)
      if (sScore[j] > sScore[best])
        best = j;
    for (int j = 0; j < K && gold < 0; ++j)
      if (sTok[j] == label)
        gold = j;
    [[maybe_unused]] const bool hit = sTok[best] == label;
    const bool injected = gold < 0 && a.inject;
    if (injected) {
      gold = K - 1;
      sTok[K - 1] = label;
      sScore[K - 1] = sScore[K];
    }
    float m = sScore[0];
    for (int j = 1; j < K; ++j)
      m = fmaxf(m, sScore[j]);
    float s = 0.f;
    for (int j = 0; j < K; ++j)
      s += expf(sScore[j] - m);
    const float lse = m + logf(s);
    if constexpr (!Backward) {
      a.hits[row] = hit ? 1 : 0;
      a.rowTerms[row * 2] = gold >= 0 ? w * (lse - sScore[gold]) : 0.f;
      a.rowTerms[row * 2 + 1] = gold >= 0 ? w : 0.f;
    } else {
      const float g = *a.lossSumGrad * w;
      for (int j = 0; j < K; ++j)
        sE[j] = gold >= 0
                    ? g * (expf(sScore[j] - lse) - (j == gold ? 1.f : 0.f))
                    : 0.f;
    }
    sGold = gold;
    sInjected = injected ? 1 : 0;
  }
  if constexpr (Backward) {
    __syncthreads();
    const int gold = sGold;
    const bool injected = sInjected != 0;
    // values_grad: e_j at candidate j (not at the one an injected label
    // replaced: its e is the label's); none with stop_gradient.
    for (int j = threadIdx.x; j < K; j += Threads)
      a.valuesGrad[row * K + j] =
          a.stopGradient || (injected && j == K - 1) ? 0.f : sE[j];
    if (threadIdx.x == 0)
      a.labelValuesGrad[row] = !a.stopGradient && injected ? sE[K - 1] : 0.f;
    if (gold < 0) { // uncovered: no term
      for (int64_t i = threadIdx.x; i < r; i += Threads)
        a.projectedGrad[row * r + i] = __float2bfloat16(0.f);
      return;
    }
    // dz = sum_j e_j S[c_j]; dt = dz * P[p]; P[p] += dz * t; S[c_j] += e_j z.
    // Rows repeat (one predecessor, many candidates of many rows): fp32
    // atomics into the accumulators.
    float *pAcc = a.predecessorAccum + int64_t(p) * r;
    for (int64_t i = threadIdx.x; i < r; i += Threads) {
      float dz = 0.f;
      for (int j = 0; j < K; ++j)
        dz += sE[j] *
              __bfloat162float(a.successorCodebook[int64_t(sTok[j]) * r + i]);
      a.projectedGrad[row * r + i] =
          __float2bfloat16(dz * __bfloat162float(pRow[i]));
      atomicAdd(pAcc + i, dz * tRow[i]);
      const float z = sZ[i];
      for (int j = 0; j < K; ++j)
        atomicAdd(a.successorAccum + int64_t(sTok[j]) * r + i, sE[j] * z);
    }
  }
}

/// lossSum = sum of rowTerms[:, 0], coveredWeight = of [:, 1]: one CTA,
/// double partials in a fixed order (deterministic).
static __global__ void __launch_bounds__(1024)
    selector_sums_kernel(const float *rowTerms, int64_t rows, float *lossSum,
                         float *coveredWeight) {
  __shared__ double part[32][2];
  double acc[2] = {0, 0};
  for (int64_t r = threadIdx.x; r < rows; r += 1024) {
    acc[0] += rowTerms[r * 2];
    acc[1] += rowTerms[r * 2 + 1];
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      acc[i] += __shfl_xor_sync(kSelectorFullMask, acc[i], o);
  if (threadIdx.x % 32 == 0) {
    part[threadIdx.x / 32][0] = acc[0];
    part[threadIdx.x / 32][1] = acc[1];
  }
  __syncthreads();
  if (threadIdx.x < 2) {
    double t = 0;
    for (int w = 0; w < 32; ++w)
      t += part[w][threadIdx.x];
    (threadIdx.x == 0 ? *lossSum : *coveredWeight) = static_cast<float>(t);
  }
}

/// out = bf16(acc) over n elements, for both codebooks.
static __global__ void selector_round_accumulators_kernel(const float *pAcc,
                                                          const float *sAcc,
                                                          __nv_bfloat16 *pOut,
                                                          __nv_bfloat16 *sOut,
                                                          int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    pOut[i] = __float2bfloat16(pAcc[i]);
    sOut[i] = __float2bfloat16(sAcc[i]);
  }
}

static __global__ void draft_predecessors_kernel(const int32_t *inputIds,
                                                 const int32_t *anchors,
                                                 const uint8_t *keep,
                                                 int32_t *out,
                                                 DraftBlocksShape shape) {
  const int64_t total = shape.B * shape.Q();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / shape.Q(), q = i % shape.Q();
    const int64_t n = q / shape.bs, k = q % shape.bs;
    const int64_t bn = b * shape.N + n;
    const int64_t at = int64_t(anchors[bn]) + k - 1;
    out[i] = k >= 1 && keep[bn] && at >= 0 && at < shape.S
                 ? inputIds[b * shape.S + at]
                 : 0;
  }
}

static __global__ void selector_alpha_kernel(const int32_t *step,
                                             const int32_t *total, double alpha,
                                             double warmupRatio,
                                             double rampRatio, float *out) {
  *out = static_cast<float>(
      selectorAlphaAt(*step, *total, alpha, warmupRatio, rampRatio));
}

/// grad == nullptr: the objective unary + selector * scale; else the
/// selector sum's gradient grad * scale.
static __global__ void
selector_objective_kernel(const float *unarySum, const float *selectorSum,
                          const float *grad, const float *alpha,
                          const float *weightSum, const float *coveredWeight,
                          bool covered, float *out) {
  const double scale =
      selectorTermScale(*alpha, *weightSum, *coveredWeight, covered);
  *out = static_cast<float>(grad ? double(*grad) * scale
                                 : double(*unarySum) +
                                       double(*selectorSum) * scale);
}

inline unsigned selectorGrid(int64_t total, int64_t cap) {
  const int64_t blocks = (total + 255) / 256;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks < cap ? blocks : cap);
}

} // namespace detail

/// The top-K of u = T(y lm_head^T) per row of nonzero weight, and u[label]
/// (docs/semantics.md section 13). K <= kSelectorKernelMaxTopK and K <= V
/// (dflash-select-kernels checks both; a caller that breaks them is a
/// programming error).
inline void selector_candidates_bf16(CublasLtGemm &gemm,
                                     const SelectorCandidatesArgs &a,
                                     cudaStream_t stream) {
  constexpr int kThreads = 256;
  if (a.K < 1 || a.K > kSelectorKernelMaxTopK || a.K > a.V || a.chunk < 1)
    detail::reportCudaFailure(__FILE__, __LINE__, "selector_candidates_bf16",
                              "top_k must lie in 1..min(64, V) and the "
                              "vocabulary chunk be positive");
  if (a.rows == 0)
    return;
  detail::selector_candidates_init_kernel<<<
      detail::selectorGrid(a.rows * a.K, 4096), 256, 0, stream>>>(
      a.weights, a.rows, a.K, a.values, a.candidates, a.labelValues);
  DFLASH_CUDA_CHECK_LAUNCH("selector_candidates_init");
  for (int64_t v0 = 0; v0 < a.V; v0 += a.chunk) {
    const int64_t n = a.V - v0 < a.chunk ? a.V - v0 : a.chunk;
    gemm.linearF32(a.y, a.lmHead + v0 * a.H, a.logitsChunk, a.rows, n, a.H,
                   stream);
    detail::selector_topk_merge_kernel<kThreads>
        <<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(
            a.logitsChunk, n, v0, a.labels, a.weights, a.multiplier, a.softcap,
            static_cast<int>(a.K), a.values, a.candidates, a.labelValues);
    DFLASH_CUDA_CHECK_LAUNCH("selector_topk_merge");
  }
}

/// dy of selector_candidates from values_grad and label_values_grad (either
/// may be null). H % 8 == 0, K <= kSelectorKernelMaxTopK.
inline void selector_candidates_grad_bf16(const SelectorCandidatesGradArgs &a,
                                          cudaStream_t stream) {
  constexpr int kThreads = 256;
  if (a.K < 1 || a.K > kSelectorKernelMaxTopK || a.H % 8 != 0)
    detail::reportCudaFailure(__FILE__, __LINE__,
                              "selector_candidates_grad_bf16",
                              "top_k must lie in 1..64 and H be a multiple "
                              "of 8");
  if (a.rows == 0)
    return;
  detail::selector_candidates_grad_kernel<kThreads>
      <<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a);
  DFLASH_CUDA_CHECK_LAUNCH("selector_candidates_grad");
}

/// Points projected, rowTerms and (backward) the accumulators into one
/// workspace of selectorLossWorkspaceBytes(rows, r) bytes, or
/// selectorLossGradWorkspaceBytes(rows, r, V) for the backward
/// (kernels/Workspaces.h); rows, V and r must be set first.
inline void useSelectorLossWorkspace(SelectorLossArgs &a, void *workspace,
                                     bool backward) {
  char *base = static_cast<char *>(workspace);
  a.projected = reinterpret_cast<float *>(base);
  base += selectorProjectedBytes(a.rows, a.r);
  a.rowTerms = a.predecessorAccum = a.successorAccum = nullptr;
  if (!backward) {
    a.rowTerms = reinterpret_cast<float *>(base);
    return;
  }
  a.predecessorAccum = reinterpret_cast<float *>(base);
  a.successorAccum = a.predecessorAccum + a.V * a.r;
}

namespace detail {
inline void selectorLossCheck(const SelectorLossArgs &a, const char *what) {
  if (a.K < 1 || a.K > kSelectorKernelMaxTopK || a.r < 1 ||
      a.r > kSelectorKernelMaxRank)
    reportCudaFailure(__FILE__, __LINE__, what,
                      "top_k must lie in 1..64 and the rank in 1..4096");
}
} // namespace detail

/// loss_sum, covered_weight and hits of selector_loss.
inline void selector_loss_bf16(CublasLtGemm &gemm, const SelectorLossArgs &a,
                               cudaStream_t stream) {
  constexpr int kThreads = 128;
  detail::selectorLossCheck(a, "selector_loss_bf16");
  if (a.rows > 0) {
    gemm.linearF32(a.y, a.projection, a.projected, a.rows, a.r, a.H, stream);
    detail::selector_loss_rows_kernel<false, kThreads>
        <<<static_cast<unsigned>(a.rows), kThreads, a.r * sizeof(float),
           stream>>>(a);
    DFLASH_CUDA_CHECK_LAUNCH("selector_loss_rows");
  }
  detail::selector_sums_kernel<<<1, 1024, 0, stream>>>(
      a.rowTerms, a.rows, a.lossSum, a.coveredWeight);
  DFLASH_CUDA_CHECK_LAUNCH("selector_sums");
}

/// values_grad, label_values_grad, projected_grad and the two codebook
/// gradients of selector_loss_grad, for the seed lossSumGrad.
inline void selector_loss_grad_bf16(CublasLtGemm &gemm,
                                    const SelectorLossArgs &a,
                                    cudaStream_t stream) {
  constexpr int kThreads = 128;
  detail::selectorLossCheck(a, "selector_loss_grad_bf16");
  const int64_t n = a.V * a.r;
  DFLASH_CUDA_CHECK(cudaMemsetAsync(a.predecessorAccum, 0,
                                    size_t(n) * sizeof(float), stream));
  DFLASH_CUDA_CHECK(
      cudaMemsetAsync(a.successorAccum, 0, size_t(n) * sizeof(float), stream));
  if (a.rows > 0) {
    gemm.linearF32(a.y, a.projection, a.projected, a.rows, a.r, a.H, stream);
    detail::selector_loss_rows_kernel<true, kThreads>
        <<<static_cast<unsigned>(a.rows), kThreads, a.r * sizeof(float),
           stream>>>(a);
    DFLASH_CUDA_CHECK_LAUNCH("selector_loss_grad_rows");
  }
  detail::selector_round_accumulators_kernel<<<detail::selectorGrid(n, 8192),
                                               256, 0, stream>>>(
      a.predecessorAccum, a.successorAccum, a.predecessorCodebookGrad,
      a.successorCodebookGrad, n);
  DFLASH_CUDA_CHECK_LAUNCH("selector_round_accumulators");
}

/// out [B, Q]: the predecessor token of each slot (draft_predecessors).
inline void draft_predecessors(const int32_t *inputIds, const int32_t *anchors,
                               const uint8_t *keep, int32_t *out,
                               DraftBlocksShape shape, cudaStream_t stream) {
  detail::draft_predecessors_kernel<<<detail::gridFor(shape.B * shape.Q()), 256,
                                      0, stream>>>(inputIds, anchors, keep, out,
                                                   shape);
  DFLASH_CUDA_CHECK_LAUNCH("draft_predecessors");
}

/// out = alpha_t at the device step counter `step` of `total`.
inline void selector_alpha_f32(const int32_t *step, const int32_t *total,
                               double alpha, double warmupRatio,
                               double rampRatio, float *out,
                               cudaStream_t stream) {
  detail::selector_alpha_kernel<<<1, 1, 0, stream>>>(
      step, total, alpha, warmupRatio, rampRatio, out);
  DFLASH_CUDA_CHECK_LAUNCH("selector_alpha_f32");
}

/// out = unarySum + selectorSum * selectorTermScale(...).
inline void selector_objective_f32(const float *unarySum,
                                   const float *selectorSum, const float *alpha,
                                   const float *weightSum,
                                   const float *coveredWeight, bool covered,
                                   float *out, cudaStream_t stream) {
  detail::selector_objective_kernel<<<1, 1, 0, stream>>>(
      unarySum, selectorSum, nullptr, alpha, weightSum, coveredWeight, covered,
      out);
  DFLASH_CUDA_CHECK_LAUNCH("selector_objective_f32");
}

/// out = grad * selectorTermScale(...).
inline void selector_objective_grad_f32(const float *grad, const float *alpha,
                                        const float *weightSum,
                                        const float *coveredWeight,
                                        bool covered, float *out,
                                        cudaStream_t stream) {
  detail::selector_objective_kernel<<<1, 1, 0, stream>>>(
      nullptr, nullptr, grad, alpha, weightSum, coveredWeight, covered, out);
  DFLASH_CUDA_CHECK_LAUNCH("selector_objective_grad_f32");
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_DFLASH2SELECTOR_CUH
