//===- BlockAttention.cuh - Block-prefix attention -------------*- CUDA -*-===//
//
// The DFlash attention of SEMANTICS.md section 3: query (n, k) of a draft
// block sees the context keys [lo, anchor_n) (lo from the sliding window, per
// query row k) and the keys of its own block (all of them in a full layer,
// k' <= k in a sliding one). Layouts are those of ref::blockAttention:
//   q, out [B, Q, nh, d]; context K/V [B, S, nkv, d]; draft K/V [B, Q, nkv, d];
//   anchors int32 / keep uint8 [B, N]; lse fp32 [B, Q, nh] (natural log).
//
// FlashAttention-2 structure on mma.sync m16n8k16 (bf16 in, fp32 accumulate),
// ldmatrix from XOR-swizzled shared tiles, cp.async double buffering:
// - Forward: one CTA per (row, kv head, group of P consecutive blocks). The
//   P * bs * (nh/nkv) query rows of the group (GQA packing: 128 rows for
//   qwen3-8b, 16 x 4 x 2) share every K/V tile: the draft keys of the group
//   first, then the context keys [min lo, max anchor) in tiles of KT. Each
//   warp owns MT m-tiles of 16 rows (MT = 2 by default: 4 warps, two CTAs per
//   SM, each K/V fragment feeding two m-tiles); masking is per row, skipped
//   for tiles that every row of a warp sees whole.
// - Backward, in three launches:
//   1. draft kernel (whole blocks of at most 64 rows per CTA: BwdDraftTiling):
//      D = rowsum(dO * O), the draft keys' share of dQ (stored: it
//      initialises the fp32 dQ accumulator), and dK/dV of the draft keys,
//      which only their own block sees;
//   2. context kernel, key-tile major: one CTA per (row, kv head, 128 context
//      keys) walks every 64-row query tile whose blocks see the tile,
//      accumulating dK/dV in registers (each warp 16 keys) and adding dQ into
//      the accumulator (default: staged in shared memory, one
//      cp.reduce.async.bulk add per row; or vector fp32 atomics);
//   3. dQ = bf16(scale * accumulator).
// Measured variants and their timings: bench/kernels/NOTES.md.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BLOCKATTENTION_CUH
#define DFLASH_KERNELS_BLOCKATTENTION_CUH

#include "kernels/AttentionLimits.h"
#include "kernels/CudaCheck.cuh"
#include "kernels/WarpMma.cuh"
#include "kernels/Workspaces.h"

#include <climits>
#include <cstddef>
#include <cstdint>

namespace dflash::kernels {

/// Forward operands; B, S, N are the runtime batch dimensions.
struct BlockAttentionFwdArgs {
  const __nv_bfloat16 *q;
  const __nv_bfloat16 *contextKeys, *contextValues;
  const __nv_bfloat16 *draftKeys, *draftValues;
  const int32_t *anchors;
  const uint8_t *keep;
  __nv_bfloat16 *out;
  float *lse;
  int B, S, N;
};

/// Backward operands. dqAccum [B, Q, nh, d] and dOutDotOut [B, Q, nh] are fp32
/// workspace (blockAttentionBwdWorkspaceBytes); every output is overwritten.
struct BlockAttentionBwdArgs {
  const __nv_bfloat16 *dOut;
  const __nv_bfloat16 *q;
  const __nv_bfloat16 *contextKeys, *contextValues;
  const __nv_bfloat16 *draftKeys, *draftValues;
  const int32_t *anchors;
  const uint8_t *keep;
  const __nv_bfloat16 *out;
  const float *lse;
  __nv_bfloat16 *dq;
  __nv_bfloat16 *dContextKeys, *dContextValues;
  __nv_bfloat16 *dDraftKeys, *dDraftValues;
  float *dqAccum;
  float *dOutDotOut;
  int B, S, N;
};

/// How the backward's context kernel adds its dQ share into the fp32
/// accumulator.
enum class BlockAttentionDq {
  AtomicVec4,   ///< red.global.add.v4.f32 from registers (lane pairs swap rows)
  AtomicVec2,   ///< (wgmma only) red.global.add.v2.f32, no lane exchange
  RowsVec4,     ///< (wgmma only) each warp's fragment rows restaged in shared
                ///< memory, then red.global.add.v4.f32 of whole row segments
  RowsByAdders, ///< (wgmma only) RowsVec4's rows added by a third warpgroup
                ///< (bulk reductions) while the two that hold keys go on
  BulkReduce,   ///< staged in shared memory, one cp.reduce.async.bulk per row
  OmitForTiming,  ///< no dQ phase at all: wrong dQ, only to time its cost
  NoAddForTiming, ///< (wgmma only) the dQ product without the adds: timing
};

namespace detail {

constexpr int constMin(int a, int b) { return a < b ? a : b; }
constexpr int roundUp(int x, int m) { return (x + m - 1) / m * m; }

/// How the query rows of one (row, kv head) are cut into CTA tiles. Query
/// rows are numbered r = (n * bs + k) * G + hh (block, row in block, head in
/// the GQA group).
template <int D, int BS, int NH, int NKV> struct BlockAttentionTiling {
  static_assert(D == 64 || D == 128, "head dim must be 64 or 128");
  static_assert(NH % NKV == 0, "num_heads must be a multiple of num_kv_heads");
  static constexpr int G = NH / NKV;
  static constexpr int kBlockRows = BS * G;
  static_assert(kBlockRows <= 128, "bs * (nh / nkv) above 128 rows");
  static_assert(BS <= 64, "block size above 64");

  // Forward and draft backward: P whole blocks per CTA, at most 128 rows and
  // 64 draft keys.
  static constexpr int kBlocksPerCta =
      constMin(128 / kBlockRows, constMin(64 / BS, 16));
  static constexpr int kCtaRows = kBlocksPerCta * kBlockRows;
  static constexpr int kWarps = (kCtaRows + 15) / 16;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kPadRows = 16 * kWarps;
  static constexpr int kDraftKeys = roundUp(kBlocksPerCta * BS, 16);

  // Context backward: 128 keys per CTA (16 per warp), query tiles of at most
  // 64 rows (whole blocks, or half a block when a block has 128 rows).
  static constexpr int kBwdKeyTile = 128;
  static constexpr int kBwdWarps = 8;
  static constexpr int kBwdThreads = 32 * kBwdWarps;
  static_assert(kBlockRows <= 64 || kBlockRows % 64 == 0,
                "blocks above 64 rows must be a multiple of 64 rows");
  static constexpr int kBwdRows =
      kBlockRows <= 64 ? (64 / kBlockRows) * kBlockRows : 64;
  static constexpr int kBwdPadRows = roundUp(kBwdRows, 16);

  static constexpr float kScale = D == 64 ? 0.125f : 0.08838834764831845f;
  static constexpr float kLog2e = 1.4426950408889634f;
  static constexpr float kScaleLog2 = kScale * kLog2e;
};

/// The context keys that any row of blocks [nFirst, nFirst + nCount) may
/// see: [lo, hi); hi <= lo when no block is kept.
template <int WINDOW>
__device__ __forceinline__ void
groupContextKeys(const int32_t *anchors, const uint8_t *keep, int nFirst,
                 int nCount, int &lo, int &hi) {
  lo = INT_MAX;
  hi = 0;
  for (int p = 0; p < nCount; ++p) {
    if (!keep[nFirst + p])
      continue;
    int a = anchors[nFirst + p];
    lo = min(lo, WINDOW > 0 ? max(0, a - (WINDOW - 1)) : 0);
    hi = max(hi, a);
  }
}

/// Backward, key-tile major: whether the query tile t (rows [t MQ, (t+1) MQ)
/// of blocks of blockRows rows) sees any context key of [j0, j0 + KT), and
/// whether all of its rows see all of them (no masking needed: every block
/// kept, the tile unpadded and not past the last row). sAnchor[n] < 0 marks
/// a dropped block.
template <int BS, int WINDOW>
__device__ __forceinline__ void
queryTileSeesKeys(int t, int MQ, int blockRows, int N, int totalRows,
                  bool unpadded, const int *sAnchor, int j0, int KT, bool &seen,
                  bool &whole) {
  int nA = t * MQ / blockRows;
  int nB = min(N - 1, ((t + 1) * MQ - 1) / blockRows);
  bool allKept = unpadded && (t + 1) * MQ <= totalRows;
  int aMin = INT_MAX, loMax = 0;
  seen = false;
  for (int n = nA; n <= nB; ++n) {
    int a = sAnchor[n];
    if (a < 0) {
      allKept = false;
      continue;
    }
    int loN = WINDOW > 0 ? max(0, a - (WINDOW - 1)) : 0;
    seen |= a > j0 && loN < j0 + KT;
    aMin = min(aMin, a);
    loMax = max(loMax, WINDOW > 0 ? max(0, a + BS - 1 - (WINDOW - 1)) : 0);
  }
  whole = seen && allKept && j0 + KT <= aMin && j0 >= loMax;
}

/// Lists, in order, the query tiles that see any key of [j0, j0 + KT) as
/// sList[i] = tile * 2 + whole, and returns how many there are. Every
/// thread of the CTA (WARPS warps) calls it; sCount holds a count per warp.
template <int BS, int WINDOW, int WARPS>
__device__ __forceinline__ int
listQueryTilesSeeingKeys(int numQueryTiles, int MQ, int blockRows, int N,
                         int totalRows, bool unpadded, const int *sAnchor,
                         int j0, int KT, int *sCount, int *sList) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int count = 0;
  for (int base = 0; base < numQueryTiles; base += WARPS * 32) {
    int t = base + threadIdx.x;
    bool seen = false, whole = false;
    if (t < numQueryTiles)
      queryTileSeesKeys<BS, WINDOW>(t, MQ, blockRows, N, totalRows, unpadded,
                                    sAnchor, j0, KT, seen, whole);
    unsigned ballot = __ballot_sync(0xffffffffu, seen);
    if (lane == 0)
      sCount[warp] = __popc(ballot);
    __syncthreads();
    int pos = count;
    for (int w = 0; w < warp; ++w)
      pos += sCount[w];
    if (seen)
      sList[pos + __popc(ballot & ((1u << lane) - 1u))] = t * 2 + whole;
    for (int w = 0; w < WARPS; ++w)
      count += sCount[w];
    __syncthreads();
  }
  return count;
}

/// S = Q K^T for one warp's 16 rows against NK keys of a shared tile; qf is
/// the warp's Q as A fragments.
template <int D, int NK>
__device__ __forceinline__ void warpQKt(const uint32_t (&qf)[D / 16][4],
                                        const bf16 *tileK,
                                        float (&s)[NK / 8][4], int lane) {
#pragma unroll
  for (int nt = 0; nt < NK / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[nt][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < NK / 16; ++np) {
      uint32_t b0, b1, b2, b3;
      int key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
      int col = kk * 16 + ((lane >> 3) & 1) * 8;
      ldmatrixX4(smemAddress(tileK + swizzle<D>(key, col)), b0, b1, b2, b3);
      mmaBf16(s[2 * np], qf[kk], b0, b1);
      mmaBf16(s[2 * np + 1], qf[kk], b2, b3);
    }
  }
}

/// Loads 16 rows x D of a swizzled tile starting at `row0` as A fragments.
template <int D>
__device__ __forceinline__ void loadAFragments(const bf16 *tile, int row0,
                                               uint32_t (&frag)[D / 16][4],
                                               int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrixX4(smemAddress(tile + swizzle<D>(row0 + (lane & 15),
                                             kk * 16 + (lane >> 4) * 8)),
               frag[kk][0], frag[kk][1], frag[kk][2], frag[kk][3]);
}

/// acc (16 x D) += P (16 x NK, C fragments in p) * V (NK x D shared tile).
template <int D, int NK>
__device__ __forceinline__ void warpPV(const float (&p)[NK / 8][4],
                                       const bf16 *tileV,
                                       float (&acc)[D / 8][4], int lane) {
#pragma unroll
  for (int ks = 0; ks < NK / 16; ++ks) {
    uint32_t a[4] = {packBf16(p[2 * ks][0], p[2 * ks][1]),
                     packBf16(p[2 * ks][2], p[2 * ks][3]),
                     packBf16(p[2 * ks + 1][0], p[2 * ks + 1][1]),
                     packBf16(p[2 * ks + 1][2], p[2 * ks + 1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b0, b1, b2, b3;
      int key = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      int col = dp * 16 + (lane >> 4) * 8;
      ldmatrixX4Trans(smemAddress(tileV + swizzle<D>(key, col)), b0, b1, b2,
                      b3);
      mmaBf16(acc[2 * dp], a, b0, b1);
      mmaBf16(acc[2 * dp + 1], a, b2, b3);
    }
  }
}

/// The forward's warp layout: MT m-tiles (16 rows each) per warp. MT = 1
/// keeps Q in registers, 8 warps per 128-row CTA; MT = 2 (FlashAttention-2's
/// layout) reads Q fragments from shared memory and lets each K/V fragment
/// feed two m-tiles, 4 warps per CTA, two CTAs per SM.
/// KT context keys per tile (a K/V buffer also holds the draft keys).
template <int D, int BS, int NH, int NKV, int MT, int KT>
struct BlockAttentionFwdWarps {
  using T = BlockAttentionTiling<D, BS, NH, NKV>;
  static_assert(MT == 1 || MT == 2, "one or two m-tiles per warp");
  static_assert(KT % 16 == 0 && KT <= 128, "key tile");
  static constexpr int kWarpRows = 16 * MT;
  static constexpr int kWarps = (T::kCtaRows + kWarpRows - 1) / kWarpRows;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kPadRows = kWarpRows * kWarps;
  static constexpr int kMinBlocks = MT == 2 ? 2 : 1;
  static constexpr int kBufRows = KT > T::kDraftKeys ? KT : T::kDraftKeys;
  static constexpr size_t kSmemBytes =
      (kPadRows + 4 * kBufRows) * D * sizeof(bf16) + 4 * kPadRows * 4;
};

/// One K/V tile of the forward for MT m-tiles of one warp: scores, mask,
/// online softmax, P V. qf holds Q when MT == 1; otherwise Q fragments come
/// from the warp's rows of sQ (row0 on).
template <int D, int NK, int MT, typename Visible>
__device__ __forceinline__ void
attendTile(const uint32_t (&qf)[D / 16][4], const bf16 *sQ, int row0,
           const bf16 *tileK, const bf16 *tileV, float (&o)[MT][D / 8][4],
           float (&m)[MT][2], float (&l)[MT][2], float scaleLog2,
           bool wholeTile, Visible visible, int lane) {
  float s[MT][NK / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NK / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[mt][nt][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (MT == 1) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          a[mt][e] = qf[kk][e];
      } else {
        ldmatrixX4(smemAddress(sQ + swizzle<D>(row0 + mt * 16 + (lane & 15),
                                               kk * 16 + (lane >> 4) * 8)),
                   a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
      }
    }
#pragma unroll
    for (int np = 0; np < NK / 16; ++np) {
      uint32_t b0, b1, b2, b3;
      int key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
      int col = kk * 16 + ((lane >> 3) & 1) * 8;
      ldmatrixX4(smemAddress(tileK + swizzle<D>(key, col)), b0, b1, b2, b3);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mmaBf16(s[mt][2 * np], a[mt], b0, b1);
        mmaBf16(s[mt][2 * np + 1], a[mt], b2, b3);
      }
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NK / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int col = nt * 8 + 2 * (lane & 3) + (e & 1);
        s[mt][nt][e] = (wholeTile || visible(mt, e >> 1, col))
                           ? s[mt][nt][e] * scaleLog2
                           : -INFINITY;
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NK / 8; ++nt)
        mx = fmaxf(mx, fmaxf(s[mt][nt][2 * i], s[mt][nt][2 * i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      float mNew = fmaxf(m[mt][i], mx);
      // A row that has seen nothing yet keeps m = -inf; exponentiate
      // against 0 so that masked entries give 0 instead of NaN.
      float mUse = mNew == -INFINITY ? 0.f : mNew;
      float alpha = exp2Approx(m[mt][i] - mUse);
      m[mt][i] = mNew;
      l[mt][i] *= alpha;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[mt][dt][2 * i] *= alpha;
        o[mt][dt][2 * i + 1] *= alpha;
      }
#pragma unroll
      for (int nt = 0; nt < NK / 8; ++nt) {
        float p0 = exp2Approx(s[mt][nt][2 * i] - mUse);
        float p1 = exp2Approx(s[mt][nt][2 * i + 1] - mUse);
        s[mt][nt][2 * i] = p0;
        s[mt][nt][2 * i + 1] = p1;
        l[mt][i] += p0 + p1;
      }
    }
  }
  // O += P V; each V fragment serves every m-tile.
#pragma unroll
  for (int ks = 0; ks < NK / 16; ++ks) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      a[mt][0] = packBf16(s[mt][2 * ks][0], s[mt][2 * ks][1]);
      a[mt][1] = packBf16(s[mt][2 * ks][2], s[mt][2 * ks][3]);
      a[mt][2] = packBf16(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
      a[mt][3] = packBf16(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b0, b1, b2, b3;
      int key = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      int col = dp * 16 + (lane >> 4) * 8;
      ldmatrixX4Trans(smemAddress(tileV + swizzle<D>(key, col)), b0, b1, b2,
                      b3);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mmaBf16(o[mt][2 * dp], a[mt], b0, b1);
        mmaBf16(o[mt][2 * dp + 1], a[mt], b2, b3);
      }
    }
  }
}

template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL, int MT,
          int KT>
static __global__ void
__launch_bounds__((BlockAttentionFwdWarps<D, BS, NH, NKV, MT, KT>::kThreads),
                  (BlockAttentionFwdWarps<D, BS, NH, NKV, MT, KT>::kMinBlocks))
    sm90_block_attention_fwd_bf16_kernel(BlockAttentionFwdArgs args) {
  using T = BlockAttentionTiling<D, BS, NH, NKV>;
  using W = BlockAttentionFwdWarps<D, BS, NH, NKV, MT, KT>;
  constexpr int G = T::G, NKD = T::kDraftKeys, BR = W::kBufRows;
  constexpr int PR = W::kPadRows, WR = W::kWarpRows;
  constexpr int kChunks = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *sQ = reinterpret_cast<bf16 *>(smem);
  bf16 *sK = sQ + PR * D; // [2][BR][D]
  bf16 *sV = sK + 2 * BR * D;
  // Per-row visibility: context [sLo, sHi), draft block sBlock (-1: none).
  int *sLo = reinterpret_cast<int *>(sV + 2 * BR * D);
  int *sHi = sLo + PR;
  int *sBlock = sHi + PR;
  int *sRowK = sBlock + PR;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.x / NKV, g = blockIdx.x % NKV;
  // Groups of late blocks have the longest contexts: launch them first.
  const int group = gridDim.y - 1 - blockIdx.y;
  const int S = args.S, N = args.N, Q = N * BS;
  const int nFirst = group * T::kBlocksPerCta;
  const int nCount = min(T::kBlocksPerCta, N - nFirst);
  const int32_t *anchors = args.anchors + static_cast<int64_t>(b) * N;
  const uint8_t *keep = args.keep + static_cast<int64_t>(b) * N;

  int lo, hi;
  groupContextKeys<WINDOW>(anchors, keep, nFirst, nCount, lo, hi);
  const int numContextTiles = hi > lo ? (hi - lo + KT - 1) / KT : 0;

  auto rowIndex = [&](int r) -> int64_t { // into [B, Q, nh]
    int p = r / T::kBlockRows, k = (r % T::kBlockRows) / G, hh = r % G;
    return (static_cast<int64_t>(b) * Q + (nFirst + p) * BS + k) * NH + g * G +
           hh;
  };
  auto rowValid = [&](int r) {
    return r < T::kCtaRows && r / T::kBlockRows < nCount;
  };

  for (int r = threadIdx.x; r < PR; r += W::kThreads) {
    int p = r / T::kBlockRows;
    int rlo = INT_MAX, rhi = INT_MIN, blk = -1, k = 0;
    if (rowValid(r) && keep[nFirst + p]) {
      k = (r % T::kBlockRows) / G;
      int a = anchors[nFirst + p];
      rhi = a;
      rlo = WINDOW > 0 ? max(0, a + k - (WINDOW - 1)) : 0;
      blk = p;
    }
    sLo[r] = rlo;
    sHi[r] = rhi;
    sBlock[r] = blk;
    sRowK[r] = k;
  }

  // Q and the group's draft keys.
  for (int idx = threadIdx.x; idx < PR * kChunks; idx += W::kThreads) {
    int r = idx / kChunks, c = idx % kChunks;
    bool valid = rowValid(r);
    const bf16 *src = valid ? args.q + rowIndex(r) * D + c * 8 : args.q;
    cpAsync16(smemAddress(sQ + swizzle<D>(r, c * 8)), src, valid);
  }
  for (int idx = threadIdx.x; idx < NKD * kChunks; idx += W::kThreads) {
    int t = idx / kChunks, c = idx % kChunks;
    bool valid = t < nCount * BS;
    int64_t off =
        ((static_cast<int64_t>(b) * Q + nFirst * BS + t) * NKV + g) * D + c * 8;
    cpAsync16(smemAddress(sK + swizzle<D>(t, c * 8)),
              valid ? args.draftKeys + off : args.draftKeys, valid);
    cpAsync16(smemAddress(sV + swizzle<D>(t, c * 8)),
              valid ? args.draftValues + off : args.draftValues, valid);
  }
  cpAsyncCommit();

  auto loadContextTile = [&](int j0, bf16 *tK, bf16 *tV) {
    for (int idx = threadIdx.x; idx < KT * kChunks; idx += W::kThreads) {
      int t = idx / kChunks, c = idx % kChunks;
      int j = j0 + t;
      // Keys past the context are zero-filled: masked scores multiply them.
      bool valid = j < S;
      int64_t off = ((static_cast<int64_t>(b) * S + j) * NKV + g) * D + c * 8;
      cpAsync16(smemAddress(tK + swizzle<D>(t, c * 8)),
                valid ? args.contextKeys + off : args.contextKeys, valid);
      cpAsync16(smemAddress(tV + swizzle<D>(t, c * 8)),
                valid ? args.contextValues + off : args.contextValues, valid);
    }
  };

  const int row0 = warp * WR;
  uint32_t qf[D / 16][4];
  float o[MT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o[mt][dt][e] = 0.f;
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      m[mt][i] = -INFINITY;
      l[mt][i] = 0.f;
    }
  // Context tiles this warp's rows all see whole skip the mask.
  int warpLoMax = INT_MIN, warpHiMin = INT_MAX;

  const int numTiles = 1 + numContextTiles;
  for (int it = 0; it < numTiles; ++it) {
    cpAsyncWait<0>();
    __syncthreads();
    if (it == 0) {
      if constexpr (MT == 1)
        loadAFragments<D>(sQ, row0, qf, lane);
      for (int r = row0 + lane; r < row0 + WR; r += 32) {
        warpLoMax = max(warpLoMax, sLo[r]);
        warpHiMin = min(warpHiMin, sHi[r]);
      }
#pragma unroll
      for (int o2 = 16; o2 > 0; o2 >>= 1) {
        warpLoMax = max(warpLoMax, __shfl_xor_sync(0xffffffffu, warpLoMax, o2));
        warpHiMin = min(warpHiMin, __shfl_xor_sync(0xffffffffu, warpHiMin, o2));
      }
    }
    if (it + 1 < numTiles) {
      int nb = (it + 1) & 1;
      loadContextTile(lo + it * KT, sK + nb * BR * D, sV + nb * BR * D);
      cpAsyncCommit();
    }
    const bf16 *tK = sK + (it & 1) * BR * D;
    const bf16 *tV = sV + (it & 1) * BR * D;
    if (it == 0) {
      auto visible = [&](int mt, int i, int t) {
        int r = row0 + mt * 16 + lane / 4 + 8 * i;
        int blk = sBlock[r];
        return blk >= 0 && t / BS == blk && (!CAUSAL || t % BS <= sRowK[r]);
      };
      attendTile<D, NKD, MT>(qf, sQ, row0, tK, tV, o, m, l, T::kScaleLog2,
                             false, visible, lane);
    } else {
      int j0 = lo + (it - 1) * KT;
      bool whole = j0 >= warpLoMax && j0 + KT <= warpHiMin;
      auto visible = [&](int mt, int i, int t) {
        int r = row0 + mt * 16 + lane / 4 + 8 * i;
        int j = j0 + t;
        return j >= sLo[r] && j < sHi[r];
      };
      attendTile<D, KT, MT>(qf, sQ, row0, tK, tV, o, m, l, T::kScaleLog2, whole,
                            visible, lane);
    }
  }

  // Normalise, stage the warp's rows in its own part of sQ (no other warp
  // reads them), store 16 bytes at a time.
  __syncwarp();
  float lseRow[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sum = l[mt][i] + __shfl_xor_sync(0xffffffffu, l[mt][i], 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      float inv = sum > 0.f ? 1.f / sum : 0.f;
      lseRow[mt][i] = sum > 0.f
                          ? (m[mt][i] + __log2f(sum)) * 0.6931471805599453f
                          : -INFINITY;
      int r = row0 + mt * 16 + lane / 4 + 8 * i;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        int col = dt * 8 + 2 * (lane & 3);
        *reinterpret_cast<uint32_t *>(sQ + swizzle<D>(r, col)) =
            packBf16(o[mt][dt][2 * i] * inv, o[mt][dt][2 * i + 1] * inv);
      }
    }
  __syncwarp();
  for (int idx = lane; idx < WR * kChunks; idx += 32) {
    int r = row0 + idx / kChunks, c = idx % kChunks;
    if (rowValid(r))
      *reinterpret_cast<uint4 *>(args.out + rowIndex(r) * D + c * 8) =
          *reinterpret_cast<const uint4 *>(sQ + swizzle<D>(r, c * 8));
  }
  if ((lane & 3) == 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        int r = row0 + mt * 16 + lane / 4 + 8 * i;
        if (rowValid(r))
          args.lse[rowIndex(r)] = lseRow[mt][i];
      }
  }
}

/// Elements of the backward draft kernel's shared region that holds the
/// draft keys and values, then P and dS ([rows][64] each) over them.
constexpr int bwdDraftOverlayElems(int d, int draftKeys, int padRows) {
  return 2 * draftKeys * d > 2 * padRows * 64 ? 2 * draftKeys * d
                                              : 2 * padRows * 64;
}

/// The backward draft kernel's tiling: BLOCKS whole blocks per CTA (0: as
/// many as make at most 64 rows, at least one). At qwen3-8b-b16 shapes that
/// is half the forward's 128 rows, and four CTAs per SM instead of two
/// overlap one CTA's loads with another's products and stores (0.530 ->
/// 0.472 ms).
template <int D, int BS, int NH, int NKV, int BLOCKS>
struct BwdDraftTiling : BlockAttentionTiling<D, BS, NH, NKV> {
  using Base = BlockAttentionTiling<D, BS, NH, NKV>;
  static constexpr int kBlocksUpTo64Rows =
      Base::kBlockRows >= 64
          ? 1
          : constMin(constMin(64 / Base::kBlockRows, 64 / BS), 16);
  static constexpr int kBlocksPerCta = BLOCKS > 0 ? BLOCKS : kBlocksUpTo64Rows;
  static constexpr int kCtaRows = kBlocksPerCta * Base::kBlockRows;
  static_assert(kCtaRows <= 128 && kBlocksPerCta * BS <= 64,
                "at most 128 rows and 64 draft keys per CTA");
  static constexpr int kWarps = (kCtaRows + 15) / 16;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kPadRows = 16 * kWarps;
  static constexpr int kDraftKeys = roundUp(kBlocksPerCta * BS, 16);
};

/// Backward, step 1: the draft keys of each group of blocks.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          int BLOCKS = 0>
__global__ void
__launch_bounds__((BwdDraftTiling<D, BS, NH, NKV, BLOCKS>::kThreads))
    sm90_block_attention_bwd_draft_bf16_kernel(BlockAttentionBwdArgs args) {
  using T = BwdDraftTiling<D, BS, NH, NKV, BLOCKS>;
  constexpr int G = T::G, NKD = T::kDraftKeys, PR = T::kPadRows;
  constexpr int kChunks = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *sQ = reinterpret_cast<bf16 *>(smem);
  bf16 *sdO = sQ + PR * D;
  bf16 *sK = sdO + PR * D;
  bf16 *sV = sK + NKD * D;
  // P and dS overlay the draft keys and values once dQ has read them: fewer
  // bytes per CTA, more CTAs per SM (the kernel waits on memory, not math).
  bf16 *sP = sK;            // [PR][64] probabilities
  bf16 *sdS = sP + PR * 64; // [PR][64] score gradients
  float *sDot =
      reinterpret_cast<float *>(sK + bwdDraftOverlayElems(D, NKD, PR)); // [PR]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.x / NKV, g = blockIdx.x % NKV;
  const int group = blockIdx.y;
  const int N = args.N, Q = N * BS;
  const int nFirst = group * T::kBlocksPerCta;
  const int nCount = min(T::kBlocksPerCta, N - nFirst);
  const uint8_t *keep = args.keep + static_cast<int64_t>(b) * N;

  auto rowIndex = [&](int r) -> int64_t {
    int p = r / T::kBlockRows, k = (r % T::kBlockRows) / G, hh = r % G;
    return (static_cast<int64_t>(b) * Q + (nFirst + p) * BS + k) * NH + g * G +
           hh;
  };
  auto rowValid = [&](int r) {
    return r < T::kCtaRows && r / T::kBlockRows < nCount;
  };

  for (int idx = threadIdx.x; idx < PR * kChunks; idx += T::kThreads) {
    int r = idx / kChunks, c = idx % kChunks;
    bool valid = rowValid(r);
    int64_t off = valid ? rowIndex(r) * D + c * 8 : 0;
    cpAsync16(smemAddress(sQ + swizzle<D>(r, c * 8)), args.q + off, valid);
    cpAsync16(smemAddress(sdO + swizzle<D>(r, c * 8)), args.dOut + off, valid);
  }
  for (int idx = threadIdx.x; idx < NKD * kChunks; idx += T::kThreads) {
    int t = idx / kChunks, c = idx % kChunks;
    bool valid = t < nCount * BS;
    int64_t off =
        valid
            ? ((static_cast<int64_t>(b) * Q + nFirst * BS + t) * NKV + g) * D +
                  c * 8
            : 0;
    cpAsync16(smemAddress(sK + swizzle<D>(t, c * 8)), args.draftKeys + off,
              valid);
    cpAsync16(smemAddress(sV + swizzle<D>(t, c * 8)), args.draftValues + off,
              valid);
  }
  cpAsyncCommit();

  // D = rowsum(dO * O) while the copies land: two lanes per row, O straight
  // from global memory, its loads issued before the wait (0.566 -> 0.503 ms
  // at qwen3-8b-b16 shapes; streaming them past the L2 was slower).
  {
    int r = warp * 16 + lane / 2, half = lane % 2;
    float dot = 0.f;
    bool valid = rowValid(r);
    uint4 oChunk[kChunks / 2];
    if (valid) {
      const uint4 *o =
          reinterpret_cast<const uint4 *>(args.out + rowIndex(r) * D) +
          half * (kChunks / 2);
#pragma unroll
      for (int c = 0; c < kChunks / 2; ++c)
        oChunk[c] = __ldg(o + c);
    }
    cpAsyncWait<0>();
    __syncthreads();
    if (valid) {
#pragma unroll
      for (int c = 0; c < kChunks / 2; ++c) {
        uint4 ov = oChunk[c];
        uint4 dv = *reinterpret_cast<const uint4 *>(
            sdO + swizzle<D>(r, (half * (kChunks / 2) + c) * 8));
        const __nv_bfloat162 *o2 =
            reinterpret_cast<const __nv_bfloat162 *>(&ov);
        const __nv_bfloat162 *d2 =
            reinterpret_cast<const __nv_bfloat162 *>(&dv);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float2 of = __bfloat1622float2(o2[e]);
          float2 df = __bfloat1622float2(d2[e]);
          dot += of.x * df.x + of.y * df.y;
        }
      }
    }
    dot += __shfl_xor_sync(0xffffffffu, dot, 1);
    sDot[r] = dot;
    if (valid && half == 0)
      args.dOutDotOut[rowIndex(r)] = dot;
  }
  __syncthreads();

  // Per-thread rows of the C fragments.
  int rowBlock[2], rowK[2];
  float rowLse[2], rowDot[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int r = warp * 16 + lane / 4 + 8 * i;
    int p = r / T::kBlockRows;
    rowBlock[i] = -1;
    rowK[i] = 0;
    rowLse[i] = 0.f;
    rowDot[i] = sDot[r];
    if (rowValid(r) && keep[nFirst + p]) {
      rowBlock[i] = p;
      rowK[i] = (r % T::kBlockRows) / G;
      rowLse[i] = args.lse[rowIndex(r)] * T::kLog2e;
    }
  }

  // S, P, dP, dS for the warp's 16 rows.
  float s[NKD / 8][4], dp[NKD / 8][4];
  {
    uint32_t frag[D / 16][4];
    loadAFragments<D>(sQ, warp * 16, frag, lane);
    warpQKt<D, NKD>(frag, sK, s, lane);
    loadAFragments<D>(sdO, warp * 16, frag, lane);
    warpQKt<D, NKD>(frag, sV, dp, lane);
  }
#pragma unroll
  for (int nt = 0; nt < NKD / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int i = e >> 1, t = nt * 8 + 2 * (lane & 3) + (e & 1);
      bool visible = rowBlock[i] >= 0 && t / BS == rowBlock[i] &&
                     (!CAUSAL || t % BS <= rowK[i]);
      float p =
          visible ? exp2Approx(s[nt][e] * T::kScaleLog2 - rowLse[i]) : 0.f;
      s[nt][e] = p;
      dp[nt][e] = p * (dp[nt][e] - rowDot[i]);
    }

  // The draft share of dQ initialises the accumulator (unscaled; the
  // conversion applies the softmax scale).
  {
    float dq[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        dq[dt][e] = 0.f;
    warpPV<D, NKD>(dp, sK, dq, lane);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int r = warp * 16 + lane / 4 + 8 * i;
      if (!rowValid(r))
        continue;
      float *dst = args.dqAccum + rowIndex(r) * D;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt)
        *reinterpret_cast<float2 *>(dst + dt * 8 + 2 * (lane & 3)) =
            make_float2(dq[dt][2 * i], dq[dt][2 * i + 1]);
    }
  }

  // P and dS to shared memory for the key-major products, over K and V:
  // every warp must be done with them.
  __syncthreads();
#pragma unroll
  for (int nt = 0; nt < NKD / 8; ++nt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int r = warp * 16 + lane / 4 + 8 * i, t = nt * 8 + 2 * (lane & 3);
      *reinterpret_cast<uint32_t *>(sP + swizzle<64>(r, t)) =
          packBf16(s[nt][2 * i], s[nt][2 * i + 1]);
      *reinterpret_cast<uint32_t *>(sdS + swizzle<64>(r, t)) =
          packBf16(dp[nt][2 * i], dp[nt][2 * i + 1]);
    }
  __syncthreads();

  // dV = P^T dO and dK = scale * dS^T Q over the group's rows; each unit is
  // 16 keys x 32 columns.
  constexpr int kColUnits = D / 32;
  for (int u = warp; u < (NKD / 16) * kColUnits; u += T::kWarps) {
    int k0 = (u / kColUnits) * 16, d0 = (u % kColUnits) * 32;
    float dv[4][4] = {}, dk[4][4] = {};
#pragma unroll
    for (int ks = 0; ks < PR / 16; ++ks) {
      int srow = ks * 16 + (lane >> 4) * 8 + (lane & 7);
      int skey = k0 + ((lane >> 3) & 1) * 8;
      uint32_t ap[4], ads[4];
      ldmatrixX4Trans(smemAddress(sP + swizzle<64>(srow, skey)), ap[0], ap[1],
                      ap[2], ap[3]);
      ldmatrixX4Trans(smemAddress(sdS + swizzle<64>(srow, skey)), ads[0],
                      ads[1], ads[2], ads[3]);
#pragma unroll
      for (int dp2 = 0; dp2 < 2; ++dp2) {
        int brow = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        int bcol = d0 + dp2 * 16 + (lane >> 4) * 8;
        uint32_t b0, b1, b2, b3;
        ldmatrixX4Trans(smemAddress(sdO + swizzle<D>(brow, bcol)), b0, b1, b2,
                        b3);
        mmaBf16(dv[2 * dp2], ap, b0, b1);
        mmaBf16(dv[2 * dp2 + 1], ap, b2, b3);
        ldmatrixX4Trans(smemAddress(sQ + swizzle<D>(brow, bcol)), b0, b1, b2,
                        b3);
        mmaBf16(dk[2 * dp2], ads, b0, b1);
        mmaBf16(dk[2 * dp2 + 1], ads, b2, b3);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int t = k0 + lane / 4 + 8 * i;
      if (t >= nCount * BS)
        continue;
      int64_t off =
          ((static_cast<int64_t>(b) * Q + nFirst * BS + t) * NKV + g) * D;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        int col = d0 + nt * 8 + 2 * (lane & 3);
        *reinterpret_cast<uint32_t *>(args.dDraftValues + off + col) =
            packBf16(dv[nt][2 * i], dv[nt][2 * i + 1]);
        *reinterpret_cast<uint32_t *>(args.dDraftKeys + off + col) =
            packBf16(dk[nt][2 * i] * T::kScale, dk[nt][2 * i + 1] * T::kScale);
      }
    }
  }
}

/// Shared-memory row stride of the bulk-reduce dQ stage (fp32): padded by 16
/// bytes so that the C-fragment stores of 8 rows hit 8 bank groups.
template <int D> constexpr int dqStageStride() { return D + 4; }

/// Backward, step 2: context keys, key-tile major.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          BlockAttentionDq DQ>
static __global__ void
__launch_bounds__((BlockAttentionTiling<D, BS, NH, NKV>::kBwdThreads), 1)
    sm90_block_attention_bwd_context_bf16_kernel(BlockAttentionBwdArgs args) {
  using T = BlockAttentionTiling<D, BS, NH, NKV>;
  constexpr int G = T::G, KT = T::kBwdKeyTile, MQ = T::kBwdRows,
                MQP = T::kBwdPadRows, NW = T::kBwdWarps;
  constexpr int kChunks = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *sK = reinterpret_cast<bf16 *>(smem);
  bf16 *sV = sK + KT * D;
  bf16 *sQ = sV + KT * D;                                 // [2][64][D]
  bf16 *sdO = sQ + 2 * 64 * D;                            // [2][64][D]
  bf16 *sdS = sdO + 2 * 64 * D;                           // [KT][64]
  float *sLse = reinterpret_cast<float *>(sdS + KT * 64); // [2][64]
  float *sDot = sLse + 2 * 64;                            // [2][64]
  int *sLo = reinterpret_cast<int *>(sDot + 2 * 64);      // [2][64]
  int *sHi = sLo + 2 * 64;                                // [2][64]
  int *sCount = sHi + 2 * 64;                             // [NW]
  int *sAnchor = sCount + NW;    // [N], -1 where keep = 0
  int *sList = sAnchor + args.N; // [numQueryTiles]: tile * 2 + whole
  // BulkReduce: fp32 dQ stage [64][D + 4], 16-byte aligned, after the list.
  float *sdQ = reinterpret_cast<float *>(
      (reinterpret_cast<uintptr_t>(sList +
                                   (args.N * T::kBlockRows + MQ - 1) / MQ) +
       15) &
      ~uintptr_t(15));

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.x / NKV, g = blockIdx.x % NKV;
  const int j0 = blockIdx.y * KT; // early keys, most queries: launched first
  const int S = args.S, N = args.N, Q = N * BS;
  const int totalRows = N * T::kBlockRows;
  const int numQueryTiles = (totalRows + MQ - 1) / MQ;

  for (int idx = threadIdx.x; idx < KT * kChunks; idx += T::kBwdThreads) {
    int t = idx / kChunks, c = idx % kChunks;
    int j = j0 + t;
    bool valid = j < S;
    int64_t off =
        valid ? ((static_cast<int64_t>(b) * S + j) * NKV + g) * D + c * 8 : 0;
    cpAsync16(smemAddress(sK + swizzle<D>(t, c * 8)), args.contextKeys + off,
              valid);
    cpAsync16(smemAddress(sV + swizzle<D>(t, c * 8)), args.contextValues + off,
              valid);
  }
  cpAsyncCommit();
  for (int n = threadIdx.x; n < N; n += T::kBwdThreads) {
    int64_t i = static_cast<int64_t>(b) * N + n;
    sAnchor[n] = args.keep[i] ? args.anchors[i] : -1;
  }
  __syncthreads();

  // The query tiles whose blocks see any key of [j0, j0 + KT), in order.
  const int count = listQueryTilesSeeingKeys<BS, WINDOW, NW>(
      numQueryTiles, MQ, T::kBlockRows, N, totalRows, MQ == MQP, sAnchor, j0,
      KT, sCount, sList);

  auto loadQueryTile = [&](int t, int buf) {
    bf16 *tQ = sQ + buf * 64 * D, *tdO = sdO + buf * 64 * D;
    for (int idx = threadIdx.x; idx < MQP * kChunks; idx += T::kBwdThreads) {
      int r = idx / kChunks, c = idx % kChunks;
      int row = t * MQ + r;
      bool valid = r < MQ && row < totalRows;
      int64_t off = 0;
      if (valid) {
        int n = row / T::kBlockRows, k = (row % T::kBlockRows) / G,
            hh = row % G;
        off =
            ((static_cast<int64_t>(b) * Q + n * BS + k) * NH + g * G + hh) * D +
            c * 8;
      }
      cpAsync16(smemAddress(tQ + swizzle<D>(r, c * 8)), args.q + off, valid);
      cpAsync16(smemAddress(tdO + swizzle<D>(r, c * 8)), args.dOut + off,
                valid);
    }
    if (threadIdx.x < MQP) {
      int r = threadIdx.x, row = t * MQ + r;
      bool valid = r < MQ && row < totalRows;
      int lo = INT_MAX, hi = INT_MIN;
      int64_t ri = 0;
      if (valid) {
        int n = row / T::kBlockRows, k = (row % T::kBlockRows) / G,
            hh = row % G;
        ri = (static_cast<int64_t>(b) * Q + n * BS + k) * NH + g * G + hh;
        int a = sAnchor[n];
        if (a >= 0) {
          hi = a;
          lo = WINDOW > 0 ? max(0, a + k - (WINDOW - 1)) : 0;
        }
      }
      // Rows that see nothing are masked everywhere, so their (possibly
      // infinite) lse is never used.
      cpAsync4(smemAddress(sLse + buf * 64 + r), args.lse + ri, valid);
      cpAsync4(smemAddress(sDot + buf * 64 + r), args.dOutDotOut + ri, valid);
      sLo[buf * 64 + r] = lo;
      sHi[buf * 64 + r] = hi;
    }
  };

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dk[dt][e] = 0.f;
      dv[dt][e] = 0.f;
    }

  if (count > 0) {
    loadQueryTile(sList[0] >> 1, 0);
    cpAsyncCommit();
  }
  const int keyRow = warp * 16; // this warp's keys in the tile
  for (int it = 0; it < count; ++it) {
    const int cur = it & 1;
    cpAsyncWait<0>();
    __syncthreads();
    if (it + 1 < count) {
      loadQueryTile(sList[it + 1] >> 1, cur ^ 1);
      cpAsyncCommit();
    }
    const int entry = sList[it];
    const int t = entry >> 1;
    const bool whole = entry & 1;
    const bf16 *tQ = sQ + cur * 64 * D, *tdO = sdO + cur * 64 * D;
    const float *tLse = sLse + cur * 64, *tDot = sDot + cur * 64;
    const int *tLo = sLo + cur * 64, *tHi = sHi + cur * 64;

    // S^T = K Q^T and dP^T = V dO^T: 16 keys x MQP rows per warp.
    float st[MQP / 8][4], dpt[MQP / 8][4];
#pragma unroll
    for (int nt = 0; nt < MQP / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        st[nt][e] = 0.f;
        dpt[nt][e] = 0.f;
      }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ak[4], av[4];
      int arow = keyRow + (lane & 15), acol = kk * 16 + (lane >> 4) * 8;
      ldmatrixX4(smemAddress(sK + swizzle<D>(arow, acol)), ak[0], ak[1], ak[2],
                 ak[3]);
      ldmatrixX4(smemAddress(sV + swizzle<D>(arow, acol)), av[0], av[1], av[2],
                 av[3]);
#pragma unroll
      for (int np = 0; np < MQP / 16; ++np) {
        int brow = np * 16 + (lane & 7) + ((lane >> 4) << 3);
        int bcol = kk * 16 + ((lane >> 3) & 1) * 8;
        uint32_t b0, b1, b2, b3;
        ldmatrixX4(smemAddress(tQ + swizzle<D>(brow, bcol)), b0, b1, b2, b3);
        mmaBf16(st[2 * np], ak, b0, b1);
        mmaBf16(st[2 * np + 1], ak, b2, b3);
        ldmatrixX4(smemAddress(tdO + swizzle<D>(brow, bcol)), b0, b1, b2, b3);
        mmaBf16(dpt[2 * np], av, b0, b1);
        mmaBf16(dpt[2 * np + 1], av, b2, b3);
      }
    }
    // P^T and dS^T = P^T (dP^T - D).
#pragma unroll
    for (int nt = 0; nt < MQP / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int key = j0 + keyRow + lane / 4 + 8 * (e >> 1);
        int r = nt * 8 + 2 * (lane & 3) + (e & 1);
        bool visible = whole || (key >= tLo[r] && key < tHi[r]);
        float p =
            visible
                ? exp2Approx(st[nt][e] * T::kScaleLog2 - tLse[r] * T::kLog2e)
                : 0.f;
        st[nt][e] = p;
        dpt[nt][e] = p * (dpt[nt][e] - tDot[r]);
      }
      // dV += P^T dO, dK += dS^T Q (the 16 x MQP C fragments are A fragments).
#pragma unroll
    for (int ks = 0; ks < MQP / 16; ++ks) {
      uint32_t ap[4] = {packBf16(st[2 * ks][0], st[2 * ks][1]),
                        packBf16(st[2 * ks][2], st[2 * ks][3]),
                        packBf16(st[2 * ks + 1][0], st[2 * ks + 1][1]),
                        packBf16(st[2 * ks + 1][2], st[2 * ks + 1][3])};
      uint32_t ads[4] = {packBf16(dpt[2 * ks][0], dpt[2 * ks][1]),
                         packBf16(dpt[2 * ks][2], dpt[2 * ks][3]),
                         packBf16(dpt[2 * ks + 1][0], dpt[2 * ks + 1][1]),
                         packBf16(dpt[2 * ks + 1][2], dpt[2 * ks + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        int brow = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        int bcol = dp * 16 + (lane >> 4) * 8;
        uint32_t b0, b1, b2, b3;
        ldmatrixX4Trans(smemAddress(tdO + swizzle<D>(brow, bcol)), b0, b1, b2,
                        b3);
        mmaBf16(dv[2 * dp], ap, b0, b1);
        mmaBf16(dv[2 * dp + 1], ap, b2, b3);
        ldmatrixX4Trans(smemAddress(tQ + swizzle<D>(brow, bcol)), b0, b1, b2,
                        b3);
        mmaBf16(dk[2 * dp], ads, b0, b1);
        mmaBf16(dk[2 * dp + 1], ads, b2, b3);
      }
      // dS^T to shared memory for dQ.
      int k0 = keyRow + lane / 4;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int r = ks * 16 + h * 8 + 2 * (lane & 3);
        *reinterpret_cast<uint32_t *>(sdS + swizzle<64>(k0, r)) =
            packBf16(dpt[2 * ks + h][0], dpt[2 * ks + h][1]);
        *reinterpret_cast<uint32_t *>(sdS + swizzle<64>(k0 + 8, r)) =
            packBf16(dpt[2 * ks + h][2], dpt[2 * ks + h][3]);
      }
    }
    if constexpr (DQ == BlockAttentionDq::BulkReduce) {
      // The stage is rewritten below: the last tile's reductions must have
      // read it (each issuing thread waits for its own group).
      if (threadIdx.x < MQP)
        asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    }
    __syncthreads();

    // dQ (MQP x D) += dS K: units of 16 rows x D/2 columns.
    constexpr int kDqUnits =
        DQ == BlockAttentionDq::OmitForTiming ? 0 : (MQP / 16) * 2;
    for (int u = warp; u < kDqUnits; u += NW) {
      int r0 = (u / 2) * 16, d0 = (u % 2) * (D / 2);
      float dq[D / 16][4];
#pragma unroll
      for (int nt = 0; nt < D / 16; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dq[nt][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KT / 16; ++ks) {
        uint32_t a[4];
        int akey = ks * 16 + (lane & 7) + (lane >> 4) * 8;
        int arow = r0 + ((lane >> 3) & 1) * 8;
        ldmatrixX4Trans(smemAddress(sdS + swizzle<64>(akey, arow)), a[0], a[1],
                        a[2], a[3]);
#pragma unroll
        for (int dp = 0; dp < D / 32; ++dp) {
          int brow = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
          int bcol = d0 + dp * 16 + (lane >> 4) * 8;
          uint32_t b0, b1, b2, b3;
          ldmatrixX4Trans(smemAddress(sK + swizzle<D>(brow, bcol)), b0, b1, b2,
                          b3);
          mmaBf16(dq[2 * dp], a, b0, b1);
          mmaBf16(dq[2 * dp + 1], a, b2, b3);
        }
      }
      if constexpr (DQ == BlockAttentionDq::AtomicVec4) {
        // Lane pairs swap halves: the even lane of a pair then holds 4
        // consecutive columns of row g, the odd lane 4 of row g + 8.
        const bool odd = lane & 1;
        int r = r0 + lane / 4 + (odd ? 8 : 0), row = t * MQ + r;
        bool valid = r < MQ && row < totalRows;
        int n = row / T::kBlockRows, k = (row % T::kBlockRows) / G,
            hh = row % G;
        float *dst =
            args.dqAccum +
            ((static_cast<int64_t>(b) * Q + n * BS + k) * NH + g * G + hh) * D +
            d0 + 4 * ((lane & 3) >> 1);
#pragma unroll
        for (int nt = 0; nt < D / 16; ++nt) {
          float s0 = odd ? dq[nt][0] : dq[nt][2];
          float s1 = odd ? dq[nt][1] : dq[nt][3];
          float r0v = __shfl_xor_sync(0xffffffffu, s0, 1);
          float r1v = __shfl_xor_sync(0xffffffffu, s1, 1);
          float4 v = odd ? make_float4(r0v, r1v, dq[nt][2], dq[nt][3])
                         : make_float4(dq[nt][0], dq[nt][1], r0v, r1v);
          if (valid)
            atomicAdd(reinterpret_cast<float4 *>(dst + nt * 8), v);
        }
      } else {
        constexpr int kStride = dqStageStride<D>();
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float *stage =
              sdQ + (r0 + lane / 4 + 8 * i) * kStride + d0 + 2 * (lane & 3);
#pragma unroll
          for (int nt = 0; nt < D / 16; ++nt)
            *reinterpret_cast<float2 *>(stage + nt * 8) =
                make_float2(dq[nt][2 * i], dq[nt][2 * i + 1]);
        }
      }
    }
    if constexpr (DQ == BlockAttentionDq::BulkReduce) {
      // Generic-proxy stores, then the bulk copy engine reads: fence, sync,
      // one row (D fp32, contiguous in global memory) per thread.
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();
      if (threadIdx.x < MQP) {
        int r = threadIdx.x, row = t * MQ + r;
        if (r < MQ && row < totalRows) {
          int n = row / T::kBlockRows, k = (row % T::kBlockRows) / G,
              hh = row % G;
          float *dst =
              args.dqAccum +
              ((static_cast<int64_t>(b) * Q + n * BS + k) * NH + g * G + hh) *
                  D;
          asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group."
                       "add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                       "r"(smemAddress(sdQ + r * dqStageStride<D>())),
                       "n"(D * 4)
                       : "memory");
        }
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      }
    }
  }
  cpAsyncWait<0>();
  if constexpr (DQ == BlockAttentionDq::BulkReduce) {
    if (threadIdx.x < MQP)
      asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int j = j0 + keyRow + lane / 4 + 8 * i;
    if (j >= S)
      continue;
    int64_t off = ((static_cast<int64_t>(b) * S + j) * NKV + g) * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      int col = dt * 8 + 2 * (lane & 3);
      *reinterpret_cast<uint32_t *>(args.dContextValues + off + col) =
          packBf16(dv[dt][2 * i], dv[dt][2 * i + 1]);
      *reinterpret_cast<uint32_t *>(args.dContextKeys + off + col) =
          packBf16(dk[dt][2 * i] * T::kScale, dk[dt][2 * i + 1] * T::kScale);
    }
  }
}

/// Backward, step 3: dQ = bf16(scale * accumulator), 4 values per thread.
template <int D>
__global__ void sm90_block_attention_bwd_dq_bf16_kernel(const float *accum,
                                                        bf16 *dq,
                                                        int64_t count4) {
  constexpr float kScale = D == 64 ? 0.125f : 0.08838834764831845f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < count4; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float4 v = reinterpret_cast<const float4 *>(accum)[i];
    uint2 packed = make_uint2(packBf16(v.x * kScale, v.y * kScale),
                              packBf16(v.z * kScale, v.w * kScale));
    reinterpret_cast<uint2 *>(dq)[i] = packed;
  }
}

} // namespace detail

/// Forward: out and lse of every query row. Template arguments decide code:
/// head dim D, block size BS, query/kv heads NH/NKV, WINDOW (0 = full layer),
/// CAUSAL (in-block causality of sliding layers); MT, the m-tiles (16 query
/// rows each) per warp, and KT, the context keys per tile.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL, int MT = 2,
          int KT = 64>
void sm90_block_attention_fwd_bf16(const BlockAttentionFwdArgs &args,
                                   cudaStream_t stream) {
  using T = detail::BlockAttentionTiling<D, BS, NH, NKV>;
  using W = detail::BlockAttentionFwdWarps<D, BS, NH, NKV, MT, KT>;
  auto kernel =
      detail::sm90_block_attention_fwd_bf16_kernel<D, BS, NH, NKV, WINDOW,
                                                   CAUSAL, MT, KT>;
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(W::kSmemBytes)));
  dim3 grid(args.B * NKV, (args.N + T::kBlocksPerCta - 1) / T::kBlocksPerCta);
  kernel<<<grid, W::kThreads, W::kSmemBytes, stream>>>(args);
  DFLASH_CUDA_CHECK_LAUNCH("sm90_block_attention_fwd_bf16");
}

namespace detail {

/// Backward launch 1 (draft keys, D = rowsum(dO * O), the accumulator's
/// initial dQ); shared by the mma.sync and wgmma backward passes.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          int BLOCKS = 0>
void launchBlockAttentionBwdDraft(const BlockAttentionBwdArgs &args,
                                  cudaStream_t stream) {
  using T = BwdDraftTiling<D, BS, NH, NKV, BLOCKS>;
  auto kernel =
      sm90_block_attention_bwd_draft_bf16_kernel<D, BS, NH, NKV, WINDOW, CAUSAL,
                                                 BLOCKS>;
  size_t smem = (2 * T::kPadRows * D +
                 bwdDraftOverlayElems(D, T::kDraftKeys, T::kPadRows)) *
                    sizeof(bf16) +
                T::kPadRows * sizeof(float);
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  dim3 grid(args.B * NKV, (args.N + T::kBlocksPerCta - 1) / T::kBlocksPerCta);
  kernel<<<grid, T::kThreads, smem, stream>>>(args);
  DFLASH_CUDA_CHECK_LAUNCH("sm90_block_attention_bwd_draft_bf16");
}

/// Backward launch 3: dQ = bf16(scale * accumulator).
template <int D, int BS, int NH>
void launchBlockAttentionBwdDq(const BlockAttentionBwdArgs &args,
                               cudaStream_t stream) {
  int64_t count4 = static_cast<int64_t>(args.B) * args.N * BS * NH * D / 4;
  int blocks = static_cast<int>((count4 + 255) / 256);
  if (blocks > 4096)
    blocks = 4096;
  sm90_block_attention_bwd_dq_bf16_kernel<D>
      <<<blocks, 256, 0, stream>>>(args.dqAccum, args.dq, count4);
  DFLASH_CUDA_CHECK_LAUNCH("sm90_block_attention_bwd_dq_bf16");
}

} // namespace detail

/// Bytes of fp32 workspace the backward needs (dqAccum, then dOutDotOut).
template <int D, int BS, int NH, int NKV>
size_t blockAttentionBwdWorkspaceBytes(int B, int N) {
  return blockAttentionBwdWorkspaceBytes(D, BS, NH, B, N);
}

/// Backward: dq, dK/dV of context and draft keys (all overwritten). DQ picks
/// how context tiles add into the dQ accumulator.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          BlockAttentionDq DQ = BlockAttentionDq::BulkReduce>
void sm90_block_attention_bwd_bf16(const BlockAttentionBwdArgs &args,
                                   cudaStream_t stream) {
  static_assert(DQ != BlockAttentionDq::NoAddForTiming &&
                    DQ != BlockAttentionDq::AtomicVec2 &&
                    DQ != BlockAttentionDq::RowsVec4 &&
                    DQ != BlockAttentionDq::RowsByAdders,
                "NoAddForTiming, AtomicVec2, RowsVec4 and RowsByAdders are "
                "modes of the wgmma backward only");
  using T = detail::BlockAttentionTiling<D, BS, NH, NKV>;
  using bf16 = __nv_bfloat16;
  detail::launchBlockAttentionBwdDraft<D, BS, NH, NKV, WINDOW, CAUSAL>(args,
                                                                       stream);
  {
    auto kernel = detail::sm90_block_attention_bwd_context_bf16_kernel<
        D, BS, NH, NKV, WINDOW, CAUSAL, DQ>;
    static_assert(T::kBwdRows == mmaSyncBwdQueryTileRows(T::kBlockRows) &&
                      T::kBwdKeyTile == 128 && T::kBwdWarps == 8 &&
                      detail::dqStageStride<D>() == D + 4,
                  "AttentionLimits.h sizes this kernel's shared memory");
    size_t smem = size_t(mmaSyncBwdContextSmemBytes(
        D, T::kBlockRows, args.N, DQ == BlockAttentionDq::BulkReduce));
    DFLASH_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    dim3 grid(args.B * NKV, (args.S + T::kBwdKeyTile - 1) / T::kBwdKeyTile);
    kernel<<<grid, T::kBwdThreads, smem, stream>>>(args);
    DFLASH_CUDA_CHECK_LAUNCH("sm90_block_attention_bwd_context_bf16");
  }
  detail::launchBlockAttentionBwdDq<D, BS, NH>(args, stream);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_BLOCKATTENTION_CUH
