//===- BlockAttentionMmaSyncFwd.cuh - Forward, mma.sync --------*- CUDA -*-===//
//
// The attention forward on warp MMA (mma.sync m16n8k16, ldmatrix, cp.async:
// SM80 instructions), FlashAttention-2's structure: one CTA per (row, kv
// head, group of P consecutive blocks); the P * bs * (nh / nkv) query rows
// of the group share every K/V tile, the group's draft keys first, then its
// context keys [min lo, max anchor) in tiles of KT, double-buffered by
// cp.async. Each warp owns MT m-tiles of 16 rows; masking is per row,
// skipped for tiles that every row of a warp sees whole. It runs every
// shape the wgmma forward (kernels/BlockAttentionWgmmaFwd.cuh) does not;
// docs/kernels.md has its tiling and numbers.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BLOCKATTENTIONMMASYNCFWD_CUH
#define DFLASH_KERNELS_BLOCKATTENTIONMMASYNCFWD_CUH

#include "kernels/BlockAttentionTiling.cuh"

namespace dflash::kernels {

namespace detail {

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

/// Zeroes MT m-tiles of N n8 accumulator tiles (mma.sync's C fragments).
template <int MT, int N>
__device__ __forceinline__ void zeroAccumulators(float (&c)[MT][N][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        c[mt][n][e] = 0.f;
}

/// O = 0, m = -inf, l = 0: a warp's MT m-tiles of rows before their first
/// tile.
template <int D, int MT>
__device__ __forceinline__ void clearAttentionRows(float (&o)[MT][D / 8][4],
                                                   float (&m)[MT][2],
                                                   float (&l)[MT][2]) {
  zeroAccumulators(o);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      m[mt][i] = -INFINITY;
      l[mt][i] = 0.f;
    }
}

/// Whether a warp of MT m-tiles keeps its Q as A fragments in registers
/// (qf): one m-tile up to head dim 128. At 256 they would take 64 registers
/// beside O's 128.
template <int D, int MT>
constexpr bool kQueryFragmentsInRegisters = MT == 1 && D <= 128;

/// One K/V tile of the forward for MT m-tiles of one warp: scores, mask,
/// online softmax, P V. qf holds Q when kQueryFragmentsInRegisters;
/// otherwise Q fragments come from the warp's rows of sQ (row0 on).
template <int D, int NK, int MT, typename Visible>
__device__ __forceinline__ void
attendTile(const uint32_t (&qf)[D / 16][4], const bf16 *sQ, int row0,
           const bf16 *tileK, const bf16 *tileV, float (&o)[MT][D / 8][4],
           float (&m)[MT][2], float (&l)[MT][2], float scaleLog2,
           bool wholeTile, Visible visible, int lane) {
  float s[MT][NK / 8][4];
  zeroAccumulators(s);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (kQueryFragmentsInRegisters<D, MT>) {
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
    mma_sync_block_attention_fwd_bf16_kernel(BlockAttentionFwdArgs args) {
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
  const int32_t *positionIds = args.positionIds + static_cast<int64_t>(b) * S;

  int lo, hi;
  groupContextKeys<WINDOW>(anchors, keep, positionIds, nFirst, nCount, lo, hi);
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
      rlo = contextKeysBegin<WINDOW>(a, k, conversationStart(positionIds, a));
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
  float o[MT][D / 8][4], m[MT][2], l[MT][2];
  clearAttentionRows<D, MT>(o, m, l);
  // Context tiles this warp's rows all see whole skip the mask.
  int warpLoMax = INT_MIN, warpHiMin = INT_MAX;

  const int numTiles = 1 + numContextTiles;
  for (int it = 0; it < numTiles; ++it) {
    cpAsyncWait<0>();
    __syncthreads();
    if (it == 0) {
      if constexpr (kQueryFragmentsInRegisters<D, MT>)
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
      lseRow[mt][i] =
          sum > 0.f ? (m[mt][i] + __log2f(sum)) * T::kLn2 : -INFINITY;
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

} // namespace detail

/// Forward: out and lse of every query row. Template arguments decide code:
/// head dim D, block size BS, query/kv heads NH/NKV, WINDOW (0 = full layer),
/// CAUSAL (in-block causality of sliding layers); MT, the m-tiles (16 query
/// rows each) per warp, and KT, the context keys per tile.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL, int MT = 2,
          int KT = 64>
void mma_sync_block_attention_fwd_bf16(const BlockAttentionFwdArgs &args,
                                       cudaStream_t stream) {
  using T = detail::BlockAttentionTiling<D, BS, NH, NKV>;
  using W = detail::BlockAttentionFwdWarps<D, BS, NH, NKV, MT, KT>;
  auto kernel =
      detail::mma_sync_block_attention_fwd_bf16_kernel<D, BS, NH, NKV, WINDOW,
                                                       CAUSAL, MT, KT>;
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(W::kSmemBytes)));
  dim3 grid(args.B * NKV, (args.N + T::kBlocksPerCta - 1) / T::kBlocksPerCta);
  kernel<<<grid, W::kThreads, W::kSmemBytes, stream>>>(args);
  DFLASH_CUDA_CHECK_LAUNCH("mma_sync_block_attention_fwd_bf16");
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_BLOCKATTENTIONMMASYNCFWD_CUH
