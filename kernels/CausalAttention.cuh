//===- CausalAttention.cuh - Causal attention over packed rows -*- CUDA -*-===//
//
// The target model's attention forward (inference only, no lse), over rows
// that may pack several conversations (kernels/CausalAttentionArgs.h has
// the semantics; ref::causalAttention is the oracle). With c[i] = i -
// pos[i] (the start of row i's conversation in a well-formed packed row),
// key j is visible to query i iff j <= i and c[j] == c[i], and with a
// sliding window (window > 0) also i - j < window; positions are
// non-negative, so no key below min c[i], nor below i0 - window + 1, of a
// query tile from row i0 is visible. With sinks, head h's softmax
// denominator also holds exp(sinks[h]) (a logit, not scaled by d^-0.5),
// added at the normalisation: exp2(sinks[h] log2 e - m) against the row's
// reference maximum m of the exp2 domain the kernels work in.
//
// Two kernels, one CTA per (head, row, 128-query tile), tiles of the longest
// contexts launched first (the query tile is the slowest grid dimension,
// counted down); key tiles of 64 from lo = max(0, min c, i0 - window + 1)
// of the tile's rows up to its last row:
// - sm90a_causal_attention_fwd_wgmma_bf16 (what causal_attention_fwd_bf16
//   runs): the structure of the drafter's wgmma forward
//   (kernels/BlockAttentionWgmmaFwd.cuh, whose wgmmaAttendTile it calls):
//   two warpgroups of 64 query rows, Q and two stages of K/V by TMA with
//   transaction barriers, refilled by the last warp to release a stage; two
//   CTAs per SM.
// - mma_sync_causal_attention_fwd_bf16: mma.sync (attendTile of
//   kernels/BlockAttentionMmaSyncFwd.cuh), 4 warps of 32 rows, cp.async
//   double buffering. A cross-check and the fallback should the wgmma one
//   be wrong somewhere.
// Skipping and masking are per group of rows (a warpgroup, or a warp): a
// key tile no row of the group sees is skipped; a tile every row sees
// whole (all its keys at or below the group's first row, within the window
// of its last row, and no break in the positions between the tile's first
// key and the group's last row) is not masked; every other tile applies the
// exact predicate per element, reading the keys' positions.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_CAUSALATTENTION_CUH
#define DFLASH_KERNELS_CAUSALATTENTION_CUH

#include "kernels/BlockAttentionMmaSyncFwd.cuh"
#include "kernels/BlockAttentionWgmmaFwd.cuh"
#include "kernels/CausalAttentionArgs.h"
#include "kernels/CudaCheck.cuh"

#include <climits>

namespace dflash::kernels {

namespace detail {

/// Query rows per CTA and keys per tile of both causal kernels.
constexpr int kCausalRows = 128;
constexpr int kCausalKeyTile = 64;

constexpr float kCausalLog2e = 1.4426950408889634f;
template <int D>
constexpr float kCausalScaleLog2 = kBlockAttentionScale<D> * kCausalLog2e;

/// The window as the kernels use it: INT_MAX for none, so that i - j <
/// window always holds and i - window + 1 cannot overflow.
__device__ __forceinline__ int causalWindow(int window) {
  return window > 0 ? window : INT_MAX;
}

/// exp2(sinks[h] log2 e - m): a row's sink term of the denominator, against
/// its reference maximum m (0 without sinks, or for a row that saw nothing:
/// rows past S). m is finite for every row below S (it sees its own key),
/// and the sink an unscaled logit, so the term stays finite for any bf16
/// sink a model has (exp2 of a few tens at most).
__device__ __forceinline__ float causalSinkTerm(const bf16 *sinks, int h,
                                                float m) {
  if (sinks == nullptr || m == -INFINITY)
    return 0.f;
  return exp2Approx(__bfloat162float(sinks[h]) * kCausalLog2e - m);
}

/// What the rows [i0, i0 + ROWS) of a query tile need, in GROUPS groups of
/// ROWS / GROUPS consecutive rows: sCMin[g] = min (i - pos[i]) over the
/// group's rows below S (INT_MAX when it has none), sRun[g] = the last
/// break k (pos[k] != pos[k - 1] + 1) with lo < k <= the group's last row
/// (-1 when none). Returns lo = max(0, min over the groups, i0 - window +
/// 1) (window from causalWindow): no key below it is visible to the tile.
/// Every thread of the CTA calls it (three __syncthreads).
template <int ROWS, int GROUPS>
__device__ __forceinline__ int
causalRowsSetup(const int32_t *pos, int S, int i0, int window, int *sCMin,
                int *sRun, int tid, int threads) {
  constexpr int GR = ROWS / GROUPS;
  static_assert(ROWS % GROUPS == 0, "groups of equal rows");
  if (tid < GROUPS) {
    sCMin[tid] = INT_MAX;
    sRun[tid] = -1;
  }
  __syncthreads();
  for (int r = tid; r < ROWS; r += threads) {
    const int i = i0 + r;
    if (i < S)
      atomicMin(&sCMin[r / GR], i - pos[i]);
  }
  __syncthreads();
  int lo = INT_MAX;
#pragma unroll
  for (int g = 0; g < GROUPS; ++g)
    lo = min(lo, sCMin[g]);
  // The window bounds lo before the break scan: breaks at or below lo do
  // not matter (runStart = max(lo, sRun)).
  lo = max(max(lo, 0), i0 - window + 1);
  const int rowEnd = min(S, i0 + ROWS);
  for (int k = lo + 1 + tid; k < rowEnd; k += threads) {
    if (pos[k] != pos[k - 1] + 1) {
#pragma unroll
      for (int g = 0; g < GROUPS; ++g)
        if (k < i0 + (g + 1) * GR)
          atomicMax(&sRun[g], k);
    }
  }
  __syncthreads();
  return lo;
}

/// Whether key j (>= 0) is visible to a query row whose index is `row` and
/// c = row - pos[row] is `rowC` (INT_MIN for rows past S: sees nothing),
/// under a window from causalWindow.
__device__ __forceinline__ bool causalVisible(const int32_t *pos, int S, int j,
                                              int row, int rowC, int window) {
  return (j <= row) & (row - j < window) &
         (j - __ldg(pos + min(j, S - 1)) == rowC);
}

//===-- wgmma + TMA -------------------------------------------------------===//

template <int D> struct CausalWgmmaConfig {
  static_assert(D == 64 || D == 128 || D == 256,
                "causal wgmma forward: head dim 64, 128, 256");
  static constexpr int kWarpgroups = 2;
  static constexpr int KT = kCausalKeyTile;
  static constexpr int kRows = kWarpgroups * wgmma::kM;
  static_assert(kRows == kCausalRows, "128 query rows per CTA");
  static constexpr int kThreads = kWarpgroups * wgmma::kWarpgroupThreads;
  // At head dim 256 a thread holds 128 floats of O and the CTA 193 KiB of
  // shared memory: one CTA per SM.
  static constexpr int kMinBlocksPerSm = D == 256 ? 1 : 2;
  static constexpr int kStages = 2;
  static constexpr size_t kQBytes = size_t(kRows) * D * 2;
  static constexpr size_t kBufBytes = size_t(KT) * D * 2;
  // Q, two stages of K and V, and slack to align the base to a swizzle atom.
  static constexpr size_t kSmemBytes =
      kQBytes + 2 * kStages * kBufBytes + wgmma::kSwizzleAtomBytes;
};

/// q boxes of 64 rows of one head; k and v boxes of 64 keys of one kv head.
struct CausalWgmmaMaps {
  CUtensorMap q, k, v;
};

template <int D, int NH, int NKV>
static __global__ void
__launch_bounds__((CausalWgmmaConfig<D>::kThreads),
                  (CausalWgmmaConfig<D>::kMinBlocksPerSm))
    sm90a_causal_attention_fwd_wgmma_bf16_kernel(
        CausalAttentionFwdArgs args,
        const __grid_constant__ CausalWgmmaMaps maps) {
  using C = CausalWgmmaConfig<D>;
  using namespace wgmma;
  constexpr int KT = C::KT, G = NH / NKV, kRows = C::kRows;
  constexpr int kChunks = D / 8, kPanels = D / kPanelCols;
  constexpr int kWarps = C::kThreads / kWarpThreads;
  extern __shared__ unsigned char smemRaw[];
  __shared__ __align__(8) uint64_t bars[C::kStages + 1]; // stages, then Q
  __shared__ int released[C::kStages];
  __shared__ int sCMin[C::kWarpgroups], sRun[C::kWarpgroups];
  unsigned char *smem = smemRaw + swizzleAtomPadding(smemRaw);
  bf16 *sQ = reinterpret_cast<bf16 *>(smem);
  // Q [kRows x D], then two stages of K [KT x D], then two of V.
  const uint32_t qBase = smemAddress(smem);
  const uint32_t kBase = qBase + uint32_t(C::kQBytes);
  constexpr uint32_t kStageBytes = uint32_t(C::kBufBytes);
  const uint32_t vBase = kBase + C::kStages * kStageBytes;

  const int tid = threadIdx.x, wg = tid / kWarpgroupThreads,
            warp = (tid / kWarpThreads) % kWarpgroupWarps,
            lane = tid % kWarpThreads;
  const int h = blockIdx.x, b = blockIdx.y, kvh = h / G;
  const int i0 = (gridDim.z - 1 - blockIdx.z) * kRows; // longest first
  const int S = args.S, window = causalWindow(args.window);
  const int32_t *pos = args.positionIds + static_cast<int64_t>(b) * S;

  const uint32_t bar0 = smemAddress(&bars[0]); // stage s: + kBarrierBytes s
  const uint32_t qBar = bar0 + tma::kBarrierBytes * C::kStages;
  if (tid == 0) {
    tma::barrierInit(bar0, 1);
    tma::barrierInit(bar0 + tma::kBarrierBytes, 1);
    tma::barrierInit(qBar, 1);
    released[0] = released[1] = 0;
    tma::fenceBarrierInit();
    // Q first (rows past S load zeros): it needs no position.
    tma::arriveExpectTx(qBar, uint32_t(C::kQBytes));
#pragma unroll
    for (int p = 0; p < kPanels; ++p)
#pragma unroll
      for (int n = 0; n < C::kWarpgroups; ++n)
        tma::load4d(qBase + (p * kRows + n * kM) * kSwizzleRowBytes, &maps.q,
                    qBar, p * kPanelCols, h, i0 + n * kM, b);
  }
  // Its first __syncthreads publishes the barriers.
  const int lo = causalRowsSetup<kRows, C::kWarpgroups>(
      pos, S, i0, window, sCMin, sRun, tid, C::kThreads);
  const int rowEnd = min(S, i0 + kRows); // lo <= i0 < rowEnd
  const int numTiles = (rowEnd - lo + KT - 1) / KT;

  // Key tile it into stage it & 1: K and V, one box per d panel (keys past
  // S load zeros; no row sees them).
  auto issueTile = [&](int it) {
    const int s = it & 1;
    issueKeyValueTile<D, KT, KT>(
        kBase + s * kStageBytes, vBase + s * kStageBytes, &maps.k, &maps.v,
        bar0 + tma::kBarrierBytes * s, kvh, lo + it * KT, b);
  };
  if (tid == 0) {
    issueTile(0);
    if (numTiles > 1)
      issueTile(1);
  }

  // This warpgroup's rows [gRowMin, gRowMax] below S, this thread's two.
  const int gRowMin = i0 + wg * kM, gRowMax = min(S, gRowMin + kM) - 1;
  const bool mine = gRowMin < S;
  // The lowest key any row of the group sees, and the lowest every row's
  // window holds.
  const int gKeyMin = max(max(sCMin[wg], 0), gRowMin - window + 1),
            gWindowMin = gRowMax - window + 1, runStart = max(lo, sRun[wg]);
  // Row i of this thread: rowBase + 8 i.
  const int rowBase = gRowMin + warp * 16 + lane / 4;
  int rowC[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = rowBase + 8 * i;
    rowC[i] = row < S ? row - pos[row] : INT_MIN;
  }

  float o[D / 2], m[2], l[2];
  wgmmaClearRows<D>(o, m, l);
  const uint32_t qAddr = qBase + wg * kM * kSwizzleRowBytes;
  tma::waitParity(qBar, 0);
  for (int it = 0; it < numTiles; ++it) {
    const int s = it & 1;
    // Every warp waits for every tile, seen or not: the last warp to
    // release a stage must know its copy has landed before refilling it.
    tma::waitParity(bar0 + tma::kBarrierBytes * s, (it >> 1) & 1);
    const uint32_t kAddr = kBase + s * kStageBytes;
    const uint32_t vAddr = vBase + s * kStageBytes;
    const int j0 = lo + it * KT;
    // Tiles no row of this warpgroup sees are skipped (uniform per
    // warpgroup, as wgmma needs).
    if (mine && j0 <= gRowMax && j0 + KT > gKeyMin) {
      const bool whole =
          j0 >= runStart && j0 >= gWindowMin && j0 + KT - 1 <= gRowMin;
      auto visible = [&](int i, int t) {
        return causalVisible(pos, S, j0 + t, rowBase + 8 * i, rowC[i], window);
      };
      wgmmaAttendTile<D, KT, kRows, KT>(qAddr, kAddr, vAddr, o, m, l,
                                        kCausalScaleLog2<D>, whole, visible,
                                        lane);
    }
    releaseStage<kWarps, C::kStages>(released, it, numTiles, lane, issueTile);
  }

  // Normalise; stage the warp's 16 rows in its own rows of sQ, then store
  // 16 bytes at a time, rows below S.
  if (!mine)
    return;
  const int warpRow = wg * kM + warp * 16; // in the CTA's tile
  // m is per row (reduced over the quad before it moves), as is l's sum.
  float sum[2], sink[2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
    sink[i] = causalSinkTerm(args.sinks, h, m[i]);
  // No sinks: the terms are 0, and sum + 0 is sum.
  wgmmaStageNormalisedRows<D, kRows, true>(o, l, sQ, warpRow, lane, sum, sink);
  __syncwarp();
  for (int idx = lane; idx < 16 * kChunks; idx += 32) {
    int rr = warpRow + idx / kChunks, c = idx % kChunks;
    int row = i0 + rr;
    if (row < S)
      *reinterpret_cast<uint4 *>(
          args.out + ((static_cast<int64_t>(b) * S + row) * NH + h) * D +
          c * 8) =
          *reinterpret_cast<const uint4 *>(sQ + tileOffset<kRows>(rr, c));
  }
}

//===-- mma.sync ----------------------------------------------------------===//

/// 4 warps of two m-tiles (32 rows) each, 64-key tiles double-buffered; at
/// head dim 256, 8 warps of one m-tile (O of two would not fit in
/// registers), one CTA per SM.
template <int D> struct CausalMmaSyncConfig {
  static_assert(D == 64 || D == 128 || D == 256,
                "causal mma.sync forward: head dim");
  static constexpr int MT = D == 256 ? 1 : 2, KT = kCausalKeyTile,
                       kRows = kCausalRows;
  static constexpr int kWarpRows = 16 * MT;
  static constexpr int kWarps = kRows / kWarpRows;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMinBlocks = D == 256 ? 1 : 2;
  static constexpr size_t kSmemBytes = size_t(kRows + 4 * KT) * D * 2;
};

template <int D, int NH, int NKV>
static __global__ void __launch_bounds__((CausalMmaSyncConfig<D>::kThreads),
                                         (CausalMmaSyncConfig<D>::kMinBlocks))
    mma_sync_causal_attention_fwd_bf16_kernel(CausalAttentionFwdArgs args) {
  using W = CausalMmaSyncConfig<D>;
  constexpr int MT = W::MT, KT = W::KT, kRows = W::kRows, WR = W::kWarpRows;
  constexpr int G = NH / NKV, kChunks = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *sQ = reinterpret_cast<bf16 *>(smem);
  bf16 *sK = sQ + kRows * D; // [2][KT][D]
  bf16 *sV = sK + 2 * KT * D;
  __shared__ int sCMin[W::kWarps], sRun[W::kWarps];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = blockIdx.x, b = blockIdx.y, kvh = h / G;
  const int i0 = (gridDim.z - 1 - blockIdx.z) * kRows; // longest first
  const int S = args.S, window = causalWindow(args.window);
  const int32_t *pos = args.positionIds + static_cast<int64_t>(b) * S;
  auto qRow = [&](int row) -> int64_t { // into [B, S, nh]
    return (static_cast<int64_t>(b) * S + row) * NH + h;
  };

  // Q (rows past S zero-filled), before the positions are read.
  for (int idx = threadIdx.x; idx < kRows * kChunks; idx += W::kThreads) {
    int r = idx / kChunks, c = idx % kChunks;
    bool valid = i0 + r < S;
    cpAsync16(smemAddress(sQ + swizzle<D>(r, c * 8)),
              valid ? args.q + qRow(i0 + r) * D + c * 8 : args.q, valid);
  }
  const int lo = causalRowsSetup<kRows, W::kWarps>(
      pos, S, i0, window, sCMin, sRun, threadIdx.x, W::kThreads);
  const int rowEnd = min(S, i0 + kRows);
  const int numTiles = (rowEnd - lo + KT - 1) / KT;
  auto loadTile = [&](int it) {
    const int j0 = lo + it * KT;
    bf16 *tK = sK + (it & 1) * KT * D, *tV = sV + (it & 1) * KT * D;
    for (int idx = threadIdx.x; idx < KT * kChunks; idx += W::kThreads) {
      int t = idx / kChunks, c = idx % kChunks, j = j0 + t;
      // Keys past S are zero-filled: masked scores multiply them.
      bool valid = j < S;
      int64_t off = ((static_cast<int64_t>(b) * S + j) * NKV + kvh) * D + c * 8;
      cpAsync16(smemAddress(tK + swizzle<D>(t, c * 8)),
                valid ? args.k + off : args.k, valid);
      cpAsync16(smemAddress(tV + swizzle<D>(t, c * 8)),
                valid ? args.v + off : args.v, valid);
    }
  };
  loadTile(0);
  cpAsyncCommit();

  // This warp's rows [gRowMin, gRowMax] below S, this thread's four.
  const int row0 = warp * WR;
  const int gRowMin = i0 + row0, gRowMax = min(S, gRowMin + WR) - 1;
  const bool mine = gRowMin < S;
  // As in the wgmma kernel, per warp.
  const int gKeyMin = max(max(sCMin[warp], 0), gRowMin - window + 1),
            gWindowMin = gRowMax - window + 1, runStart = max(lo, sRun[warp]);
  // Row (mt, i) of this thread: rowBase + 16 mt + 8 i.
  const int rowBase = gRowMin + lane / 4;
  int rowC[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int row = rowBase + mt * 16 + 8 * i;
      rowC[mt][i] = row < S ? row - pos[row] : INT_MIN;
    }

  uint32_t qf[D / 16][4]; // unused: attendTile reads Q fragments from sQ
  float o[MT][D / 8][4], m[MT][2], l[MT][2];
  clearAttentionRows<D, MT>(o, m, l);

  for (int it = 0; it < numTiles; ++it) {
    cpAsyncWait<0>();
    __syncthreads(); // tile it landed; tile it - 1's buffer is free
    if (it + 1 < numTiles) {
      loadTile(it + 1);
      cpAsyncCommit();
    }
    const bf16 *tK = sK + (it & 1) * KT * D;
    const bf16 *tV = sV + (it & 1) * KT * D;
    const int j0 = lo + it * KT;
    if (mine && j0 <= gRowMax && j0 + KT > gKeyMin) {
      const bool whole =
          j0 >= runStart && j0 >= gWindowMin && j0 + KT - 1 <= gRowMin;
      auto visible = [&](int mt, int i, int t) {
        return causalVisible(pos, S, j0 + t, rowBase + mt * 16 + 8 * i,
                             rowC[mt][i], window);
      };
      attendTile<D, KT, MT>(qf, sQ, row0, tK, tV, o, m, l, kCausalScaleLog2<D>,
                            whole, visible, lane);
    }
  }

  // Normalise, stage the warp's rows in its own part of sQ (no other warp
  // reads them), store 16 bytes at a time, rows below S.
  if (!mine)
    return;
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sum = l[mt][i] + __shfl_xor_sync(0xffffffffu, l[mt][i], 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      // m is the row's running maximum, the same in the quad.
      sum += causalSinkTerm(args.sinks, h, m[mt][i]);
      float inv = sum > 0.f ? 1.f / sum : 0.f;
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
    if (i0 + r < S)
      *reinterpret_cast<uint4 *>(args.out + qRow(i0 + r) * D + c * 8) =
          *reinterpret_cast<const uint4 *>(sQ + swizzle<D>(r, c * 8));
  }
}

/// Grid of both kernels: (head, row, query tile counted down).
inline dim3 causalAttentionGrid(int NH, const CausalAttentionFwdArgs &a) {
  return dim3(unsigned(NH), unsigned(a.B),
              unsigned((a.S + kCausalRows - 1) / kCausalRows));
}

} // namespace detail

/// The causal forward on wgmma (sm_90a), fed by TMA. Encodes the tensor
/// maps of this call's tensors on the host (a few microseconds; a captured
/// graph keeps them).
template <int D, int NH, int NKV>
void sm90a_causal_attention_fwd_wgmma_bf16(const CausalAttentionFwdArgs &a,
                                           cudaStream_t stream) {
  static_assert(NKV > 0 && NH % NKV == 0,
                "num_heads must be a multiple of num_kv_heads");
  using C = detail::CausalWgmmaConfig<D>;
  if (a.B <= 0 || a.S <= 0)
    return;
  const uint64_t B = a.B, S = a.S;
  detail::CausalWgmmaMaps maps;
  maps.q = tma::bf16RowsOfHeadsMap(a.q, B, S, NH, D, 1, detail::wgmma::kM,
                                   "q [B, S, nh, d]");
  maps.k =
      tma::bf16RowsOfHeadsMap(a.k, B, S, NKV, D, 1, C::KT, "k [B, S, nkv, d]");
  maps.v =
      tma::bf16RowsOfHeadsMap(a.v, B, S, NKV, D, 1, C::KT, "v [B, S, nkv, d]");
  auto kernel =
      detail::sm90a_causal_attention_fwd_wgmma_bf16_kernel<D, NH, NKV>;
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes)));
  kernel<<<detail::causalAttentionGrid(NH, a), C::kThreads, C::kSmemBytes,
           stream>>>(a, maps);
  DFLASH_CUDA_CHECK_LAUNCH("sm90a_causal_attention_fwd_wgmma_bf16");
}

/// The causal forward on mma.sync (sm_80 instructions).
template <int D, int NH, int NKV>
void mma_sync_causal_attention_fwd_bf16(const CausalAttentionFwdArgs &a,
                                        cudaStream_t stream) {
  static_assert(NKV > 0 && NH % NKV == 0,
                "num_heads must be a multiple of num_kv_heads");
  using W = detail::CausalMmaSyncConfig<D>;
  if (a.B <= 0 || a.S <= 0)
    return;
  auto kernel = detail::mma_sync_causal_attention_fwd_bf16_kernel<D, NH, NKV>;
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(W::kSmemBytes)));
  kernel<<<detail::causalAttentionGrid(NH, a), W::kThreads, W::kSmemBytes,
           stream>>>(a);
  DFLASH_CUDA_CHECK_LAUNCH("mma_sync_causal_attention_fwd_bf16");
}

/// Causal attention forward over packed rows (CausalAttentionArgs.h): head
/// dim D (64, 128 or 256), NH query heads, NKV kv heads; any B, S >= 1.
template <int D, int NH, int NKV>
void causal_attention_fwd_bf16(const CausalAttentionFwdArgs &a,
                               cudaStream_t stream) {
  sm90a_causal_attention_fwd_wgmma_bf16<D, NH, NKV>(a, stream);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_CAUSALATTENTION_CUH
