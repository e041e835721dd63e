//===- LmHeadCrossEntropy.cuh - Chunked lm_head + CE -----------*- CUDA -*-===//
//
// sum(w * CE(y lm_head^T, label)) and its gradient with respect to y without
// ever holding the logits of every row (docs/semantics.md section 4). Rows
// whose weight is zero by construction (slot 0 of every draft block, when the
// caller says the rows are blocks) are left out: their terms are zero, their
// hits and dy rows are written as zeros, and the computed rows are gathered
// chunk by chunk into a dense buffer for the GEMMs. Per chunk of rows:
//   0. (blocks) gather the chunk's computed rows of y
//   1. logits = y_c lm_head^T               cuBLASLt, bf16 into the chunk
//   buffer
//   2. one CTA per row: max/argmax/log-sum-exp in fp32 from the bf16 logits,
//      the row's loss, weight and accuracy terms, then
//      d(logits) = w * dLossSum * (softmax - onehot), bf16, in place
//   3. dy_c = d(logits) lm_head               cuBLASLt
//   4. (blocks) scatter dy_c to the chunk's rows, zeros at slot 0
// The per-row terms are summed at the end in a fixed order (double), so the
// four results are deterministic. lm_head is frozen: no weight gradient.
//
// With topK (a DFlash2 drafter's selector_candidates folded in, its
// transform the cross-entropy's; docs/semantics.md section 13), step 2 also
// keeps each row's top-K of the same logits while it scans them for the
// log-sum-exp (kernels/WarpTopK.cuh: a list per warp, merged by rank), and
// writes values (fp32 of the bf16 logits, or their transform), candidates and
// label values before the logits become their gradient; no second lm_head GEMM.
// Rows of weight 0 and the skipped slot-0 rows get candidates -1, values 0.
// Without topK the row kernel is the same code as before (a template switch).
//
// With a unary transform (a DFlash2 drafter's CE_u: multiplier != 1 or
// softcap != 0; docs/semantics.md section 13, "Unary logits"), step 2 reads
// each bf16 logit z as u = T(z) in fp32 (kernels/UnaryTransform.cuh): the
// max, argmax, log-sum-exp, label value and top-K values are u's (the
// candidates are z's too: T is monotonic), and the gradient is
// T'(z) * w * dLossSum * (softmax(u) - onehot). Without one the row kernel is
// the same code as before (a second template switch).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_LMHEADCROSSENTROPY_CUH
#define DFLASH_KERNELS_LMHEADCROSSENTROPY_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/Gemm.cuh"
#include "kernels/Reduce.cuh"
#include "kernels/UnaryTransform.cuh"
#include "kernels/WarpTopK.cuh"
#include "kernels/Workspaces.h"

#include <climits>
#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

struct LmHeadCrossEntropyArgs {
  const __nv_bfloat16 *y;      ///< [rows, H]
  const __nv_bfloat16 *lmHead; ///< [V, H]
  const int32_t *labels;       ///< [rows]
  const float *weights;        ///< [rows]
  /// Device scalar: d(loss) / d(sum w * CE), e.g. 1 / global sum(w);
  /// nullptr means 1.
  const float *dLossSum;
  /// [rows, H] (overwritten); nullptr: the forward alone (no dX GEMM).
  __nv_bfloat16 *dy;
  /// [4]: sum(w * CE), sum(w), sum([argmax == label] [w > 0]), sum([w > 0]).
  float *sums;
  /// [rows] (optional): [argmax == label] [w > 0] per row, for the
  /// acceptance length (draft_acceptance_f32).
  uint8_t *hits;
  __nv_bfloat16 *logitsChunk; ///< workspace [chunkRows, V]
  float *rowTerms;            ///< workspace [computed rows, 4]
  /// Workspaces [chunkRows, H] when blockSize >= 2: the chunk's gathered
  /// rows of y and their gradient.
  __nv_bfloat16 *yChunk, *dyChunk;
  int64_t rows, V, H;
  /// Rows per chunk of computed rows (lmHeadChunkRows of
  /// lmHeadComputedRows).
  int64_t chunkRows;
  /// >= 2: the rows are draft blocks of blockSize slots and slot 0 of each
  /// is skipped (its weight is 0 by docs/semantics.md section 4's [k > 0]);
  /// rows must be a multiple of it and H of 8. 0: every row is computed.
  int64_t blockSize;
  /// 1..min(kLmHeadMaxTopK, V): also each row's top topK of the logits
  /// (selector_candidates with the cross-entropy's transform). 0: none.
  int64_t topK = 0;
  float *values = nullptr;       ///< [rows, topK] descending
  int32_t *candidates = nullptr; ///< [rows, topK] ties: the lower token
  float *labelValues = nullptr;  ///< [rows] the label's logit
  /// The unary transform T(z) = softcap tanh(multiplier z / softcap), or
  /// multiplier z without a cap (softcap 0): CE, argmax and the top-K are
  /// of T(logits). multiplier > 0, softcap >= 0; the defaults are the
  /// identity.
  float multiplier = 1.f, softcap = 0.f;
};

namespace detail {

constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2eF = 1.4426950408889634f;

/// Combines two (max, sum of 2^(x - max)) pairs in base 2.
__device__ __forceinline__ void combineLse(float &m, float &s, float m2,
                                           float s2) {
  float mn = fmaxf(m, m2);
  if (mn == -INFINITY)
    return;
  s = s * exp2f(m - mn) + s2 * exp2f(m2 - mn);
  m = mn;
}

/// Keeps the larger value, the lower index on ties (first maximum).
__device__ __forceinline__ void combineArgmax(float &v, int &i, float v2,
                                              int i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

/// The row's top-K (TopK): where it goes, and its warp lists' room.
struct RowTopK {
  int K;
  float *values;
  int32_t *candidates;
  float *labelValues;
};

template <int Threads, bool TopK> struct RowTopKShared {
  float v[Threads / 32 * topk::kMaxK];
  int i[Threads / 32 * topk::kMaxK];
};
template <int Threads> struct RowTopKShared<Threads, false> {};

/// The unary transform's m and c (Unary; unread otherwise).
struct RowUnary {
  float m, c;
};

template <int Threads, bool TopK, bool Unary>
__global__ void __launch_bounds__(Threads)
    cross_entropy_rows_bf16_kernel(__nv_bfloat16 *logits, int64_t V,
                                   int64_t firstRow, int64_t blockSize,
                                   const int32_t *labels, const float *weights,
                                   const float *dLossSum, float *rowTerms,
                                   uint8_t *hits, RowTopK top, RowUnary t) {
  constexpr int kWarps = Threads / 32;
  __shared__ float sM[kWarps], sS[kWarps], sBest[kWarps];
  __shared__ int sIdx[kWarps];
  __shared__ float sLabelLogit;
  __shared__ RowTopKShared<Threads, TopK> sTop;
  // Chunk row blockIdx.x is computed row `computed`, batch row `row`.
  const int64_t computed = firstRow + blockIdx.x;
  const int64_t row = lmHeadSourceRow(computed, blockSize);
  __nv_bfloat16 *x = logits + int64_t(blockIdx.x) * V;
  const int label = labels[row];
  const float w = weights[row];
  const bool vec = V % 8 == 0;
  // The top-K of a row that counts (CTA-uniform); the scan's loops run
  // warp-uniform trip counts then, for the list's shuffles.
  const bool keep = TopK && w != 0.f;
  const int lane = threadIdx.x % 32;
  topk::WarpList list;
  if constexpr (TopK)
    list.clear();

  float m = -INFINITY, s = 0.f, best = -INFINITY;
  int bestIdx = INT_MAX;
  if (vec) {
    const uint4 *xv = reinterpret_cast<const uint4 *>(x);
    const int64_t V8 = V / 8;
    for (int64_t v = threadIdx.x; keep ? v - lane < V8 : v < V8; v += Threads) {
      // With the top-K every lane of a warp takes each turn (the list's
      // shuffles): one past the row's end offers nothing.
      const bool in = !keep || v < V8;
      float f[8];
      if (in) {
        unpackBf16x8(xv[v], f);
        if constexpr (Unary) {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            f[e] = unaryLogit(f[e], t.m, t.c);
        }
        float lmax = f[0];
        int li = 0;
#pragma unroll
        for (int e = 1; e < 8; ++e)
          if (f[e] > lmax) {
            lmax = f[e];
            li = e;
          }
        if (lmax > best) {
          best = lmax;
          bestIdx = static_cast<int>(v * 8 + li);
        }
        float mn = fmaxf(m, lmax * kLog2eF);
        float acc = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e)
          acc += exp2f(f[e] * kLog2eF - mn);
        s = s * exp2f(m - mn) + acc;
        m = mn;
      }
      if (keep)
        list.offer(in, f, static_cast<int>(v * 8), top.K, lane);
    }
  } else {
    for (int64_t v = threadIdx.x; keep ? v - lane < V : v < V; v += Threads) {
      const bool in = !keep || v < V;
      float f = -INFINITY;
      if (in) {
        f = __bfloat162float(x[v]);
        if constexpr (Unary)
          f = unaryLogit(f, t.m, t.c);
        if (f > best) {
          best = f;
          bestIdx = static_cast<int>(v);
        }
        float mn = fmaxf(m, f * kLog2eF);
        s = s * exp2f(m - mn) + exp2f(f * kLog2eF - mn);
        m = mn;
      }
      if (keep)
        list.offer(in, f, static_cast<int>(v), top.K, lane);
    }
  }
  if (threadIdx.x == 0) {
    sLabelLogit = __bfloat162float(x[label]);
    if constexpr (Unary)
      sLabelLogit = unaryLogit(sLabelLogit, t.m, t.c);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    combineLse(m, s, __shfl_xor_sync(0xffffffffu, m, o),
               __shfl_xor_sync(0xffffffffu, s, o));
    combineArgmax(best, bestIdx, __shfl_xor_sync(0xffffffffu, best, o),
                  __shfl_xor_sync(0xffffffffu, bestIdx, o));
  }
  if (threadIdx.x % 32 == 0) {
    sM[threadIdx.x / 32] = m;
    sS[threadIdx.x / 32] = s;
    sBest[threadIdx.x / 32] = best;
    sIdx[threadIdx.x / 32] = bestIdx;
  }
  if constexpr (TopK)
    if (keep)
      list.store(sTop.v + threadIdx.x / 32 * top.K,
                 sTop.i + threadIdx.x / 32 * top.K, top.K, lane);
  __syncthreads();
  if constexpr (TopK) {
    // From the lists and sLabelLogit only: the row itself may change now.
    float *rowValues = top.values + row * top.K;
    int32_t *rowCandidates = top.candidates + row * top.K;
    if (keep) {
      topk::blockTopKMerge(sTop.v, sTop.i, kWarps, top.K, rowValues,
                           rowCandidates);
    } else {
      for (int j = threadIdx.x; j < top.K; j += Threads) {
        rowValues[j] = 0.f;
        rowCandidates[j] = -1;
      }
    }
    if (threadIdx.x == 0)
      top.labelValues[row] = keep ? sLabelLogit : 0.f;
  }
  m = sM[0];
  s = sS[0];
  best = sBest[0];
  bestIdx = sIdx[0];
  for (int i = 1; i < kWarps; ++i) {
    combineLse(m, s, sM[i], sS[i]);
    combineArgmax(best, bestIdx, sBest[i], sIdx[i]);
  }
  const float lse2 = m + log2f(s); // log2-sum-exp2 of x * log2(e)
  if (threadIdx.x == 0) {
    float loss = lse2 * kLn2 - sLabelLogit;
    float *t = rowTerms + computed * 4;
    t[0] = w * loss;
    t[1] = w;
    t[2] = (w > 0.f && bestIdx == label) ? 1.f : 0.f;
    t[3] = w > 0.f ? 1.f : 0.f;
    if (hits)
      hits[row] = (w > 0.f && bestIdx == label) ? 1 : 0;
  }

  // Gradient in place: every read of this row happened before the barrier.
  const float scale = w * (dLossSum ? *dLossSum : 1.f);
  if (vec) {
    uint4 *xv = reinterpret_cast<uint4 *>(x);
    for (int64_t v = threadIdx.x; v < V / 8; v += Threads) {
      float f[8];
      if (scale != 0.f) {
        unpackBf16x8(xv[v], f);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if constexpr (Unary) {
            // d/dz = T'(z) d/du, T'(z) from u = T(z).
            const float u = unaryLogit(f[e], t.m, t.c);
            float p = exp2f(u * kLog2eF - lse2);
            f[e] = scale * (p - (v * 8 + e == label ? 1.f : 0.f)) *
                   unaryLogitSlope(u, t.m, t.c);
          } else {
            float p = exp2f(f[e] * kLog2eF - lse2);
            f[e] = scale * (p - (v * 8 + e == label ? 1.f : 0.f));
          }
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          f[e] = 0.f;
      }
      xv[v] = packBf16x8(f);
    }
  } else {
    for (int64_t v = threadIdx.x; v < V; v += Threads) {
      float g = 0.f;
      if (scale != 0.f) {
        if constexpr (Unary) {
          const float u = unaryLogit(__bfloat162float(x[v]), t.m, t.c);
          float p = exp2f(u * kLog2eF - lse2);
          g = scale * (p - (v == label ? 1.f : 0.f)) *
              unaryLogitSlope(u, t.m, t.c);
        } else {
          float p = exp2f(__bfloat162float(x[v]) * kLog2eF - lse2);
          g = scale * (p - (v == label ? 1.f : 0.f));
        }
      }
      x[v] = __float2bfloat16(g);
    }
  }
}

/// out[i] = y[lmHeadSourceRow(firstRow + i)] for the m rows of a chunk, and
/// hits = 0 at slot 0 of each block whose slot 1 is among them. One CTA a
/// row, 16-byte copies (H % 8 == 0).
static __global__ void __launch_bounds__(256)
    lm_head_gather_rows_bf16_kernel(const __nv_bfloat16 *y, __nv_bfloat16 *out,
                                    int64_t firstRow, int64_t blockSize,
                                    int64_t H, uint8_t *hits, RowTopK top) {
  const int64_t computed = firstRow + blockIdx.x;
  const int64_t row = lmHeadSourceRow(computed, blockSize);
  const uint4 *src = reinterpret_cast<const uint4 *>(y + row * H);
  uint4 *dst = reinterpret_cast<uint4 *>(out + int64_t(blockIdx.x) * H);
  for (int64_t i = threadIdx.x; i < H / 8; i += blockDim.x)
    dst[i] = src[i];
  if (computed % (blockSize - 1) != 0)
    return;
  if (hits && threadIdx.x == 0)
    hits[row - 1] = 0;
  // Slot 0's top-K: a row of weight 0.
  if (top.K > 0) {
    for (int j = threadIdx.x; j < top.K; j += blockDim.x) {
      top.values[(row - 1) * top.K + j] = 0.f;
      top.candidates[(row - 1) * top.K + j] = -1;
    }
    if (threadIdx.x == 0)
      top.labelValues[row - 1] = 0.f;
  }
}

/// dy[lmHeadSourceRow(firstRow + i)] = dyChunk[i] for the m rows of a chunk,
/// and zeros at slot 0 of each block whose slot 1 is among them.
static __global__ void __launch_bounds__(256)
    lm_head_scatter_rows_bf16_kernel(const __nv_bfloat16 *dyChunk,
                                     __nv_bfloat16 *dy, int64_t firstRow,
                                     int64_t blockSize, int64_t H) {
  const int64_t computed = firstRow + blockIdx.x;
  const int64_t row = lmHeadSourceRow(computed, blockSize);
  const uint4 *src =
      reinterpret_cast<const uint4 *>(dyChunk + int64_t(blockIdx.x) * H);
  uint4 *dst = reinterpret_cast<uint4 *>(dy + row * H);
  const bool firstOfBlock = computed % (blockSize - 1) == 0;
  uint4 *slot0 = reinterpret_cast<uint4 *>(dy + (row - 1) * H);
  for (int64_t i = threadIdx.x; i < H / 8; i += blockDim.x) {
    dst[i] = src[i];
    if (firstOfBlock)
      slot0[i] = make_uint4(0, 0, 0, 0);
  }
}

/// sums[i] = sum over rows of rowTerms[row, i], one CTA, fixed order.
static __global__ void __launch_bounds__(1024)
    cross_entropy_sums_kernel(const float *rowTerms, int64_t rows,
                              float *sums) {
  __shared__ double part[32][4];
  double acc[4] = {0, 0, 0, 0};
  for (int64_t r = threadIdx.x; r < rows; r += 1024)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      acc[i] += rowTerms[r * 4 + i];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
  if (threadIdx.x % 32 == 0)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      part[threadIdx.x / 32][i] = acc[i];
  __syncthreads();
  if (threadIdx.x < 4) {
    double t = 0;
    for (int w = 0; w < 32; ++w)
      t += part[w][threadIdx.x];
    sums[threadIdx.x] = static_cast<float>(t);
  }
}

} // namespace detail

/// Points sums, rowTerms, logitsChunk and (blocks) yChunk / dyChunk into
/// one workspace of lmHeadCrossEntropyWorkspaceBytes(rows, V, H, blockSize)
/// bytes (kernels/Workspaces.h); rows, V, H, chunkRows and blockSize must be
/// set first.
inline void useLmHeadWorkspace(LmHeadCrossEntropyArgs &args, void *workspace) {
  char *base = static_cast<char *>(workspace);
  const int64_t computed = lmHeadComputedRows(args.rows, args.blockSize);
  // The workspace holds lmHeadChunkRows rows of logits and gathered rows; a
  // longer chunk would run past it into whatever lies next.
  if (args.chunkRows < 1 || args.chunkRows > lmHeadChunkRows(computed, args.V))
    detail::reportCudaFailure(__FILE__, __LINE__, "useLmHeadWorkspace",
                              "chunkRows must lie in 1..lmHeadChunkRows of "
                              "the computed rows, the workspace's chunk");
  args.sums = reinterpret_cast<float *>(base);
  base += kLmHeadSumsBytes;
  args.rowTerms = reinterpret_cast<float *>(base);
  base += lmHeadRowTermBytes(computed);
  args.logitsChunk = reinterpret_cast<__nv_bfloat16 *>(base);
  base += lmHeadChunkBytes(args.chunkRows, args.V);
  args.yChunk = args.dyChunk = nullptr;
  if (args.blockSize >= 2) {
    args.yChunk = reinterpret_cast<__nv_bfloat16 *>(base);
    args.dyChunk = reinterpret_cast<__nv_bfloat16 *>(
        base + lmHeadGatherBytes(args.chunkRows, args.H));
  }
}

/// Forward and backward of lm_head + weighted CE, chunk by chunk (the
/// forward alone when args.dy is null).
inline void lm_head_cross_entropy_bf16(CublasLtGemm &gemm,
                                       const LmHeadCrossEntropyArgs &args,
                                       cudaStream_t stream) {
  constexpr int kThreads = 512;
  constexpr int kCopyThreads = 256;
  const bool blocks = args.blockSize >= 2;
  // The compiler chooses blockSize only where both hold; a caller that
  // breaks them is a programming error, not an input error.
  if (blocks && (args.rows % args.blockSize != 0 || args.H % 8 != 0))
    detail::reportCudaFailure(__FILE__, __LINE__, "lm_head_cross_entropy_bf16",
                              "rows must be whole blocks and H a multiple "
                              "of 8 to skip slot 0");
  if (args.topK < 0 || args.topK > kLmHeadMaxTopK || args.topK > args.V ||
      (args.topK > 0 &&
       (!args.values || !args.candidates || !args.labelValues)))
    detail::reportCudaFailure(__FILE__, __LINE__, "lm_head_cross_entropy_bf16",
                              "topK must lie in 0..min(64, V), with its "
                              "three results");
  static_assert(kLmHeadMaxTopK <= topk::kMaxK,
                "a warp's list holds the largest top-K");
  if (!(args.multiplier > 0.f) || !(args.softcap >= 0.f))
    detail::reportCudaFailure(__FILE__, __LINE__, "lm_head_cross_entropy_bf16",
                              "the unary transform needs multiplier > 0 and "
                              "softcap >= 0");
  const detail::RowTopK top{static_cast<int>(args.topK), args.values,
                            args.candidates, args.labelValues};
  const detail::RowUnary unary{args.multiplier, args.softcap};
  const bool transform = args.multiplier != 1.f || args.softcap != 0.f;
  const int64_t computed = lmHeadComputedRows(args.rows, args.blockSize);
  for (int64_t r0 = 0; r0 < computed; r0 += args.chunkRows) {
    int64_t m = computed - r0 < args.chunkRows ? computed - r0 : args.chunkRows;
    const unsigned grid = static_cast<unsigned>(m);
    const __nv_bfloat16 *y = args.y + r0 * args.H;
    if (blocks) {
      detail::
          lm_head_gather_rows_bf16_kernel<<<grid, kCopyThreads, 0, stream>>>(
              args.y, args.yChunk, r0, args.blockSize, args.H, args.hits, top);
      DFLASH_CUDA_CHECK_LAUNCH("lm_head_gather_rows_bf16");
      y = args.yChunk;
    }
    gemm.linear(y, args.lmHead, args.logitsChunk, m, args.V, args.H, stream);
    // The row kernel of (top-K, transform): without either it is the code
    // validated before them.
    auto rowKernel = [&](auto kernel) {
      kernel<<<grid, kThreads, 0, stream>>>(
          args.logitsChunk, args.V, r0, blocks ? args.blockSize : 0,
          args.labels, args.weights, args.dLossSum, args.rowTerms, args.hits,
          top, unary);
    };
    if (top.K > 0 && transform)
      rowKernel(detail::cross_entropy_rows_bf16_kernel<kThreads, true, true>);
    else if (top.K > 0)
      rowKernel(detail::cross_entropy_rows_bf16_kernel<kThreads, true, false>);
    else if (transform)
      rowKernel(detail::cross_entropy_rows_bf16_kernel<kThreads, false, true>);
    else
      rowKernel(detail::cross_entropy_rows_bf16_kernel<kThreads, false, false>);
    DFLASH_CUDA_CHECK_LAUNCH("cross_entropy_rows_bf16");
    if (!args.dy)
      continue;
    __nv_bfloat16 *dy = blocks ? args.dyChunk : args.dy + r0 * args.H;
    gemm.linearGradInput(args.logitsChunk, args.lmHead, dy, m, args.V, args.H,
                         stream);
    if (blocks) {
      detail::
          lm_head_scatter_rows_bf16_kernel<<<grid, kCopyThreads, 0, stream>>>(
              args.dyChunk, args.dy, r0, args.blockSize, args.H);
      DFLASH_CUDA_CHECK_LAUNCH("lm_head_scatter_rows_bf16");
    }
  }
  detail::cross_entropy_sums_kernel<<<1, 1024, 0, stream>>>(
      args.rowTerms, computed, args.sums);
  DFLASH_CUDA_CHECK_LAUNCH("cross_entropy_sums");
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_LMHEADCROSSENTROPY_CUH
