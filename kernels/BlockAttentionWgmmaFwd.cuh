//===- BlockAttentionWgmmaFwd.cuh - Forward on wgmma -----------*- CUDA -*-===//
//
// The attention forward (same arguments and outputs as the mma.sync one:
// out bf16, lse fp32 natural log, keep = 0 rows out 0 and lse -inf) on
// Hopper's warpgroup MMA (sm_90a), fed by TMA:
// - one CTA per (row, kv head, pair of blocks); the two blocks' 128 query
//   rows (GQA packing, r = (n * bs + k) * G + hh) go to two warpgroups, one
//   block of 64 rows each;
// - S = Q K^T by wgmma m64n64k16 with Q and K from 128B-swizzled shared
//   tiles (both K-major); O += P V with P from registers (the accumulator
//   packed to bf16 A fragments) and V [keys x d] as an MN-major B operand,
//   so V needs no transpose;
// - Q, the draft keys and 64-key context tiles of K and V arrive by TMA
//   into two stages, each with a transaction barrier. Every warp waits on
//   each stage and releases it; the last warp to release refills it, so the
//   warpgroups never meet at a CTA barrier and no compute thread issues
//   copies. A warpgroup skips the tiles no row of its block sees. Two CTAs
//   (four warpgroups) per SM overlap one warpgroup's softmax with another's
//   products.
// Needs bs * (nh / nkv) == 64 and d 64 or 128 (wgmmaForwardSupports);
// docs/kernels.md has its shared memory, registers and numbers.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BLOCKATTENTIONWGMMAFWD_CUH
#define DFLASH_KERNELS_BLOCKATTENTIONWGMMAFWD_CUH

#include "kernels/BlockAttentionTiling.cuh"
#include "kernels/Tma.cuh"
#include "kernels/Wgmma.cuh"

namespace dflash::kernels {

namespace detail {

static_assert(int(tma::kSwizzle128BBoxCols) == wgmma::kPanelCols,
              "a TMA box is one 64-column panel of the wgmma tiles");

/// Tiling of the wgmma forward: 2 blocks of 64 rows per CTA (a warpgroup
/// each), 64 context keys per tile, 2 stages, two CTAs per SM.
template <int D, int BS, int NH, int NKV> struct WgmmaFwdConfig {
  using T = BlockAttentionTiling<D, BS, NH, NKV>;
  static constexpr int kWarpgroups = 2;
  static_assert(D == 64 || D == 128, "wgmma forward: head dim 64 or 128");
  static_assert(T::kBlockRows == 64,
                "wgmma forward: needs bs * (nh / nkv) == 64 query rows per "
                "block (one block per warpgroup); use "
                "mma_sync_block_attention_fwd_bf16 for other shapes");
  static_assert(T::kBlockRows == wgmma::kM, "one block per warpgroup");
  static_assert(T::kBlocksPerCta == kWarpgroups, "two blocks per CTA");
  static constexpr int KT = 64;
  static constexpr int kRows = kWarpgroups * wgmma::kM;
  static constexpr int kThreads = kWarpgroups * wgmma::kWarpgroupThreads;
  static constexpr int kMinBlocksPerSm = 2;
  // K / V stages: tile it uses stage it & 1, of parity (it >> 1) & 1.
  static constexpr int kStages = 2;
  static constexpr int kDraftKeys = roundUp(kWarpgroups * BS, 16);
  static_assert(kDraftKeys <= 128, "draft keys of a CTA above 128");
  static constexpr int kBufRows = KT > kDraftKeys ? KT : kDraftKeys;
  static constexpr size_t kQBytes = size_t(kRows) * D * 2;
  static constexpr size_t kBufBytes = size_t(kBufRows) * D * 2;
  // Q, two stages of K and V, and slack to align the base to a swizzle atom.
  static constexpr size_t kSmemBytes =
      kQBytes + 4 * kBufBytes + wgmma::kSwizzleAtomBytes;
};

/// How far, in log2 units of scaled scores, a row's maximum may rise above
/// the reference m its exponentials are taken against before m moves and O
/// and l are rescaled (lazy rescaling): p stays below 2^8, far inside fp32
/// and bf16 range, and O and l share the reference, so O / l is the same
/// function. After a row's first tiles its maximum seldom rises that far,
/// so most tiles skip the 64 multiplies of O a thread.
constexpr float kLazyRescaleLog2 = 8.f;

/// Masks and exponentiates one tile of scores in place (online softmax: m,
/// the reference maximum in log2 units of scaled scores, and l updated;
/// alpha is what this thread's rows of O must be multiplied by before this
/// tile's P V). Returns whether any row of the warp moved its reference
/// (uniform per warp): only then does O need the multiply. The scale is
/// folded into the exponent, one FFMA a score. NK keys.
template <int NK, typename Visible>
__device__ __forceinline__ bool wgmmaSoftmax(float (&s)[NK / 2], float (&m)[2],
                                             float (&l)[2], float (&alpha)[2],
                                             float scaleLog2, bool whole,
                                             Visible visible, int lane) {
  // One branch per tile (whole is uniform per warpgroup), not per element.
  if (!whole) {
#pragma unroll
    for (int j = 0; j < NK / 8; ++j)
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float &v = s[4 * j + 2 * i + e];
          v = visible(i, j * 8 + 2 * (lane & 3) + e) ? v : -INFINITY;
        }
  }
  bool moved = false;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < NK / 8; ++j)
      mx = fmaxf(mx, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // scaleLog2 > 0: the scaled maximum is the maximum of the scaled
    // scores, and -inf (a row that sees nothing yet) stays -inf.
    const float mTile = mx * scaleLog2;
    alpha[i] = 1.f;
    // m = -inf: the first tile the row sees always moves it (alpha 0).
    if (mTile > m[i] + kLazyRescaleLog2) {
      alpha[i] = exp2Approx(m[i] - mTile);
      m[i] = mTile;
      moved = true;
    }
    // A row that has seen nothing keeps m = -inf: exponentiate against 0 so
    // masked entries give 0, not NaN.
    const float mUse = m[i] == -INFINITY ? 0.f : m[i];
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NK / 8; ++j) {
      float p0 = exp2Approx(fmaf(s[4 * j + 2 * i], scaleLog2, -mUse));
      float p1 = exp2Approx(fmaf(s[4 * j + 2 * i + 1], scaleLog2, -mUse));
      s[4 * j + 2 * i] = p0;
      s[4 * j + 2 * i + 1] = p1;
      sum += p0 + p1;
    }
    l[i] = l[i] * alpha[i] + sum;
  }
  return __any_sync(0xffffffffu, moved);
}

/// P as bf16 A fragments: two adjacent n8 accumulator tiles of the scores
/// are one k16 fragment.
template <int NK>
__device__ __forceinline__ void packScores(const float (&s)[NK / 2],
                                           uint32_t (&pa)[NK / 16][4]) {
#pragma unroll
  for (int ks = 0; ks < NK / 16; ++ks) {
    pa[ks][0] = packBf16(s[8 * ks + 0], s[8 * ks + 1]);
    pa[ks][1] = packBf16(s[8 * ks + 2], s[8 * ks + 3]);
    pa[ks][2] = packBf16(s[8 * ks + 4], s[8 * ks + 5]);
    pa[ks][3] = packBf16(s[8 * ks + 6], s[8 * ks + 7]);
  }
}

/// Issues O += P V (one commit group; no fence, no wait): V [keys x d]
/// MN-major, 8-key groups 1024 bytes apart, d panels BR * 128 bytes apart.
template <int D, int NK, int BR>
__device__ __forceinline__ void issuePV(const uint32_t (&pa)[NK / 16][4],
                                        uint32_t vAddr, float (&o)[D / 2]) {
  using namespace wgmma;
  const uint32_t vLo = descLo(vAddr, BR * kSwizzleRowBytes);
#pragma unroll
  for (int ks = 0; ks < NK / 16; ++ks)
    Wgmma<D, Major::K, Major::MN>::rs(o, pa[ks], descOf(vLo + mnMajorStep(ks)));
  commit();
}

/// O += P V for one tile, P packed from the scores (packScores, issuePV).
template <int D, int NK, int BR>
__device__ __forceinline__ void wgmmaPV(const float (&s)[NK / 2],
                                        uint32_t vAddr, float (&o)[D / 2]) {
  uint32_t pa[NK / 16][4];
  packScores<NK>(s, pa);
  wgmma::pin(o);
  wgmma::fence();
  issuePV<D, NK, BR>(pa, vAddr, o);
}

/// One tile of NK keys for one warpgroup: S = Q K^T, mask, online softmax,
/// O += P V (Q panels QR rows apart, K and V panels BR rows apart).
template <int D, int NK, int QR, int BR, typename Visible>
__device__ __forceinline__ void
wgmmaAttendTile(uint32_t qAddr, uint32_t kAddr, uint32_t vAddr,
                float (&o)[D / 2], float (&m)[2], float (&l)[2],
                float scaleLog2, bool whole, Visible visible, int lane) {
  using namespace wgmma;
  static_assert(NK % 16 == 0, "tile of 16-key steps");
  float s[NK / 2];
  fence();
  const uint32_t qLo = descLo(qAddr, kKMajorLbo),
                 kLo = descLo(kAddr, kKMajorLbo);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    Wgmma<NK, Major::K, Major::K>::ss(s, descOf(qLo + kMajorStep(kk, QR)),
                                      descOf(kLo + kMajorStep(kk, BR)), kk > 0);
  commit();
  float alpha[2];
  wait<0>();
  pin(s);
  if (wgmmaSoftmax<NK>(s, m, l, alpha, scaleLog2, whole, visible, lane)) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i)
      o[i] *= alpha[i & 2 ? 1 : 0];
  }
  wgmmaPV<D, NK, BR>(s, vAddr, o);
  wait<0>();
  pin(o);
}

/// O = 0, m = -inf, l = 0: a warpgroup's rows before their first tile.
template <int D>
__device__ __forceinline__ void wgmmaClearRows(float (&o)[D / 2], float (&m)[2],
                                               float (&l)[2]) {
#pragma unroll
  for (int i = 0; i < D / 2; ++i)
    o[i] = 0.f;
  m[0] = m[1] = -INFINITY;
  l[0] = l[1] = 0.f;
}

/// Issues the TMA copies of one key tile into a stage: KT keys from key j0
/// of kv head `head` of batch row b, K and V, one box per d panel, on the
/// stage's transaction barrier. K panels PANEL_ROWS rows apart.
template <int D, int KT, int PANEL_ROWS>
__device__ __forceinline__ void
issueKeyValueTile(uint32_t kStage, uint32_t vStage, const CUtensorMap *kMap,
                  const CUtensorMap *vMap, uint32_t bar, int head, int j0,
                  int b) {
  using namespace wgmma;
  tma::arriveExpectTx(bar, 2u * KT * D * 2);
#pragma unroll
  for (int p = 0; p < D / kPanelCols; ++p) {
    const uint32_t off = uint32_t(p) * PANEL_ROWS * kSwizzleRowBytes;
    tma::load4d(kStage + off, kMap, bar, p * kPanelCols, head, j0, b);
    tma::load4d(vStage + off, vMap, bar, p * kPanelCols, head, j0, b);
  }
}

/// After a warp's products of tile `it` have completed (wgmmaAttendTile
/// waits): counts the warp out of the tile's stage; the last of the CTA's
/// WARPS warps out refills that stage with tile it + STAGES, if there is
/// one (refill(it + STAGES)).
template <int WARPS, int STAGES, typename Refill>
__device__ __forceinline__ void
releaseStage(int *released, int it, int numTiles, int lane, Refill refill) {
  const int s = it % STAGES;
  __syncwarp();
  if (lane == 0 && atomicAdd(&released[s], 1) == WARPS - 1) {
    released[s] = 0;
    if (it + STAGES < numTiles)
      refill(it + STAGES);
  }
}

/// Normalises this thread's two rows of O (sums over the quad of l) and
/// stages them as bf16 in rows warpRow + lane / 4 + 8 i of a ROWS-row
/// swizzled tile (only this warp's part of its warpgroup's finished wgmma
/// read those rows). `sum` returns the rows' sums (0: an empty row, stored
/// as zeros). With EXTRA, extra[i] is added to row i's sum first (an
/// attention sink's term, the same in every thread of the quad).
template <int D, int ROWS, bool EXTRA>
__device__ __forceinline__ void
wgmmaStageNormalisedRows(const float (&o)[D / 2], const float (&l)[2],
                         bf16 *tile, int warpRow, int lane, float (&sum)[2],
                         const float (&extra)[2]) {
  using namespace wgmma;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    sum[i] = l[i] + __shfl_xor_sync(0xffffffffu, l[i], 1);
    sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 2);
    if constexpr (EXTRA)
      sum[i] += extra[i];
    const float inv = sum[i] > 0.f ? 1.f / sum[i] : 0.f;
    const int r = warpRow + lane / 4 + 8 * i;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int col = j * 8 + 2 * (lane & 3);
      *reinterpret_cast<uint32_t *>(tile + tileOffset<ROWS>(r, col >> 3) +
                                    (col & 7)) =
          packBf16(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
    }
  }
}

/// The same with nothing added to the sums.
template <int D, int ROWS>
__device__ __forceinline__ void
wgmmaStageNormalisedRows(const float (&o)[D / 2], const float (&l)[2],
                         bf16 *tile, int warpRow, int lane, float (&sum)[2]) {
  const float none[2] = {0.f, 0.f};
  wgmmaStageNormalisedRows<D, ROWS, false>(o, l, tile, warpRow, lane, sum,
                                           none);
}

/// A warpgroup's block n of batch row b and kv head g, finished: normalises
/// O and stores out and lse. Each warp stages its 16 rows in its own rows of
/// the block's Q tile (rows wgRow.. of a ROWS-row tile; only this warp's
/// part of the warpgroup's finished wgmma read them), then stores 16 bytes
/// at a time. keep = 0 rows: l = 0 gives out 0 and lse -inf.
template <int D, int BS, int NH, int NKV, int ROWS>
__device__ __forceinline__ void
wgmmaStoreBlock(const BlockAttentionFwdArgs &args, const float (&o)[D / 2],
                const float (&m)[2], const float (&l)[2], bf16 *sQ, int wgRow,
                int b, int g, int n, int warp, int lane) {
  using T = BlockAttentionTiling<D, BS, NH, NKV>;
  constexpr int G = T::G, kChunks = D / 8;
  float sum[2], lseRow[2];
  wgmmaStageNormalisedRows<D, ROWS>(o, l, sQ, wgRow + warp * 16, lane, sum);
#pragma unroll
  for (int i = 0; i < 2; ++i)
    lseRow[i] = sum[i] > 0.f ? (m[i] + __log2f(sum[i])) * T::kLn2 : -INFINITY;
  __syncwarp();
  const int Q = args.N * BS;
  auto rowIndex = [&](int rr) -> int64_t { // into [B, Q, nh]
    int k = rr / G, hh = rr % G;
    return (static_cast<int64_t>(b) * Q + n * BS + k) * NH + g * G + hh;
  };
  for (int idx = lane; idx < 16 * kChunks; idx += 32) {
    int rr = warp * 16 + idx / kChunks, c = idx % kChunks;
    *reinterpret_cast<uint4 *>(args.out + rowIndex(rr) * D + c * 8) =
        *reinterpret_cast<const uint4 *>(
            sQ + wgmma::tileOffset<ROWS>(wgRow + rr, c));
  }
  if ((lane & 3) == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
      args.lse[rowIndex(warp * 16 + lane / 4 + 8 * i)] = lseRow[i];
  }
}

/// Issues the first copies of a CTA of P blocks (from block nFirst): every
/// block's Q rows (blocks past N load zeros; panels of P * 64 rows) and the
/// CTA's NKD draft keys (on barK) and values (on barV), one box per d panel;
/// K and V panels BR rows apart. The caller has announced the bytes.
template <int D, int BS, int G, int P, int BR, typename Maps>
__device__ __forceinline__ void
issueQueryAndDraftTile(uint32_t qBase, uint32_t kBase, uint32_t vBase,
                       const Maps &maps, uint32_t barK, uint32_t barV, int g,
                       int nFirst, int b) {
  using namespace wgmma;
  constexpr int kRows = P * kM;
#pragma unroll
  for (int p = 0; p < D / kPanelCols; ++p) {
#pragma unroll
    for (int n = 0; n < P; ++n) // panels of kRows, blocks of kM
      tma::load4d(qBase + (p * kRows + n * kM) * kSwizzleRowBytes, &maps.q,
                  barK, p * kPanelCols, g * G, (nFirst + n) * BS, b);
    tma::load4d(kBase + p * BR * kSwizzleRowBytes, &maps.draftKeys, barK,
                p * kPanelCols, g, nFirst * BS, b);
    tma::load4d(vBase + p * BR * kSwizzleRowBytes, &maps.draftValues, barV,
                p * kPanelCols, g, nFirst * BS, b);
  }
}

/// The shapes the TMA forward loads (GQA rows of a block: a box of G heads
/// by BS positions is the block's 64 query rows in order r = k * G + hh).
struct WgmmaFwdMaps {
  CUtensorMap q, draftKeys, draftValues, contextKeys, contextValues;
};

/// The tensor maps of one forward call: Q by blocks (a box of G heads by BS
/// positions), NKD draft keys and values, context tiles of KT keys.
template <int D, int BS, int NH, int NKV, int NKD, int KT>
WgmmaFwdMaps wgmmaFwdMaps(const BlockAttentionFwdArgs &args) {
  constexpr uint32_t G = NH / NKV;
  const uint64_t B = args.B, S = args.S, Q = uint64_t(args.N) * BS;
  WgmmaFwdMaps maps;
  maps.q =
      tma::bf16RowsOfHeadsMap(args.q, B, Q, NH, D, G, BS, "q [B, Q, nh, d]");
  maps.draftKeys = tma::bf16RowsOfHeadsMap(args.draftKeys, B, Q, NKV, D, 1, NKD,
                                           "draft keys [B, Q, nkv, d]");
  maps.draftValues = tma::bf16RowsOfHeadsMap(
      args.draftValues, B, Q, NKV, D, 1, NKD, "draft values [B, Q, nkv, d]");
  maps.contextKeys = tma::bf16RowsOfHeadsMap(args.contextKeys, B, S, NKV, D, 1,
                                             KT, "context keys [B, S, nkv, d]");
  maps.contextValues = tma::bf16RowsOfHeadsMap(
      args.contextValues, B, S, NKV, D, 1, KT, "context values [B, S, nkv, d]");
  return maps;
}

/// The forward kernel: thread 0 loads Q, the draft keys and the first
/// context tile; afterwards whichever warp releases a stage last refills it.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL>
static __global__ void
__launch_bounds__((WgmmaFwdConfig<D, BS, NH, NKV>::kThreads),
                  (WgmmaFwdConfig<D, BS, NH, NKV>::kMinBlocksPerSm))
    sm90a_block_attention_fwd_wgmma_bf16_kernel(
        BlockAttentionFwdArgs args, const __grid_constant__ WgmmaFwdMaps maps) {
  using T = BlockAttentionTiling<D, BS, NH, NKV>;
  using C = WgmmaFwdConfig<D, BS, NH, NKV>;
  constexpr int KT = C::KT;
  using namespace wgmma;
  constexpr int G = T::G, BR = C::kBufRows, NKD = C::kDraftKeys;
  constexpr int kRows = C::kRows;
  constexpr int kWarps = C::kThreads / kWarpThreads;
  constexpr uint32_t kFirstBytes = uint32_t(C::kQBytes) + 2u * NKD * D * 2;
  extern __shared__ unsigned char smemRaw[];
  __shared__ __align__(8) uint64_t full[C::kStages];
  __shared__ int released[C::kStages];
  unsigned char *smem = smemRaw + swizzleAtomPadding(smemRaw);
  bf16 *sQ = reinterpret_cast<bf16 *>(smem);
  // Shared addresses (32-bit: the loop keeps them in registers): Q, then
  // two stages of K [BR x D], then two of V.
  const uint32_t qBase = smemAddress(smem);
  const uint32_t kBase = qBase + uint32_t(C::kQBytes);
  constexpr uint32_t kStageBytes = uint32_t(C::kBufBytes);
  const uint32_t vBase = kBase + C::kStages * kStageBytes;

  const int tid = threadIdx.x, wg = tid / kWarpgroupThreads,
            warp = (tid / kWarpThreads) % kWarpgroupWarps,
            lane = tid % kWarpThreads;
  const int b = blockIdx.x / NKV, g = blockIdx.x % NKV;
  const int group = gridDim.y - 1 - blockIdx.y; // longest contexts first
  const int N = args.N;
  const int nFirst = group * T::kBlocksPerCta;
  const int nCount = min(T::kBlocksPerCta, N - nFirst);
  const int32_t *anchors = args.anchors + static_cast<int64_t>(b) * N;
  const uint8_t *keep = args.keep + static_cast<int64_t>(b) * N;
  const int32_t *positionIds =
      args.positionIds + static_cast<int64_t>(b) * args.S;

  int lo, hi;
  groupContextKeys<WINDOW>(anchors, keep, positionIds, nFirst, nCount, lo, hi);
  const int numTiles = 1 + (hi > lo ? (hi - lo + KT - 1) / KT : 0);

  const uint32_t bar0 = smemAddress(&full[0]); // stage s: + kBarrierBytes s
  // Context tile it (>= 1) into stage it & 1: K and V, one box per d panel.
  auto issueContextTile = [&](int it) {
    const int s = it & 1;
    issueKeyValueTile<D, KT, BR>(
        kBase + s * kStageBytes, vBase + s * kStageBytes, &maps.contextKeys,
        &maps.contextValues, bar0 + tma::kBarrierBytes * s, g,
        lo + (it - 1) * KT, b);
  };
  if (tid == 0) {
    tma::barrierInit(bar0, 1);
    tma::barrierInit(bar0 + tma::kBarrierBytes, 1);
    released[0] = released[1] = 0;
    tma::fenceBarrierInit();
  }
  __syncthreads();
  if (tid == 0) {
    // Stage 0: both blocks' Q rows (blocks past N load zeros) and the
    // CTA's draft keys and values.
    tma::arriveExpectTx(bar0, kFirstBytes);
    issueQueryAndDraftTile<D, BS, G, C::kWarpgroups, BR>(
        qBase, kBase, vBase, maps, bar0, bar0, g, nFirst, b);
    if (numTiles > 1)
      issueContextTile(1);
  }

  // This warpgroup's block and this thread's two rows (k = row in block).
  const bool mine = wg < nCount && keep[nFirst + wg];
  const int anchor = mine ? anchors[nFirst + wg] : 0;
  const int start = mine ? conversationStart(positionIds, anchor) : 0;
  int kRow[2], rowLo[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    kRow[i] = (warp * 16 + lane / 4 + 8 * i) / G;
    rowLo[i] = contextKeysBegin<WINDOW>(anchor, kRow[i], start);
  }
  const int blockLoMax = contextKeysBegin<WINDOW>(anchor, BS - 1, start);
  const int blockLoMin = contextKeysBegin<WINDOW>(anchor, 0, start);

  float o[D / 2], m[2], l[2];
  wgmmaClearRows<D>(o, m, l);
  const uint32_t qAddr = qBase + wg * kM * kSwizzleRowBytes;
  auto release = [&](int it) {
    releaseStage<kWarps, C::kStages>(released, it, numTiles, lane,
                                     issueContextTile);
  };
  // Tile 0: Q and the draft keys (stage 0).
  tma::waitParity(bar0, 0);
  if (mine) {
    auto visible = [&](int i, int t) {
      return (t / BS == wg) & (!CAUSAL | (t % BS <= kRow[i]));
    };
    wgmmaAttendTile<D, NKD, kRows, BR>(qAddr, kBase, vBase, o, m, l,
                                       T::kScaleLog2, false, visible, lane);
  }
  release(0);
  for (int it = 1; it < numTiles; ++it) {
    const int s = it & 1;
    // Every warp waits for every tile, seen or not: the last warp to
    // release a stage must know its copy has landed before refilling it.
    tma::waitParity(bar0 + tma::kBarrierBytes * s, (it >> 1) & 1);
    const uint32_t kAddr = kBase + s * kStageBytes;
    const uint32_t vAddr = vBase + s * kStageBytes;
    if (mine) {
      int j0 = lo + (it - 1) * KT;
      // Tiles no row of this block sees are skipped (uniform per warpgroup).
      if (j0 < anchor && j0 + KT > blockLoMin) {
        bool whole = j0 >= blockLoMax && j0 + KT <= anchor;
        auto visible = [&](int i, int t) {
          int j = j0 + t;
          return (j >= rowLo[i]) & (j < anchor);
        };
        wgmmaAttendTile<D, KT, kRows, BR>(qAddr, kAddr, vAddr, o, m, l,
                                          T::kScaleLog2, whole, visible, lane);
      }
    }
    release(it);
  }

  if (wg < nCount)
    wgmmaStoreBlock<D, BS, NH, NKV, kRows>(args, o, m, l, sQ, wg * kM, b, g,
                                           nFirst + wg, warp, lane);
}

} // namespace detail

namespace detail {
/// Launches a wgmma forward kernel whose tiling is C (kDraftKeys, KT,
/// kThreads, kSmemBytes): one CTA per (row, kv head, pair of blocks), with
/// the tensor maps of this call's tensors, encoded on the host (a few
/// microseconds; a captured graph keeps them); with CLUSTER > 1, clusters of
/// CLUSTER CTAs of adjacent pairs (grid.y rounded up to whole clusters: a
/// pair past N has no blocks). The caller checks the launch.
template <int D, int BS, int NH, int NKV, class C, int CLUSTER = 1,
          typename Kernel>
void launchWgmmaForward(Kernel kernel, const BlockAttentionFwdArgs &args,
                        cudaStream_t stream) {
  using T = BlockAttentionTiling<D, BS, NH, NKV>;
  const WgmmaFwdMaps maps =
      wgmmaFwdMaps<D, BS, NH, NKV, C::kDraftKeys, C::KT>(args);
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes)));
  const int pairs = (args.N + T::kBlocksPerCta - 1) / T::kBlocksPerCta;
  dim3 grid(args.B * NKV, (pairs + CLUSTER - 1) / CLUSTER * CLUSTER);
  if constexpr (CLUSTER == 1) {
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(args, maps);
  } else {
    cudaLaunchAttribute cluster;
    cudaLaunchConfig_t config = tma::clusterLaunchConfig(
        dim3(1, CLUSTER, 1), C::kThreads, C::kSmemBytes, stream, cluster);
    config.gridDim = grid;
    DFLASH_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args, maps));
  }
}
} // namespace detail

/// Forward on wgmma (sm_90a), fed by TMA: same arguments and outputs as
/// mma_sync_block_attention_fwd_bf16.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL>
void sm90a_block_attention_fwd_wgmma_bf16(const BlockAttentionFwdArgs &args,
                                          cudaStream_t stream) {
  detail::launchWgmmaForward<D, BS, NH, NKV,
                             detail::WgmmaFwdConfig<D, BS, NH, NKV>>(
      detail::sm90a_block_attention_fwd_wgmma_bf16_kernel<D, BS, NH, NKV,
                                                          WINDOW, CAUSAL>,
      args, stream);
  DFLASH_CUDA_CHECK_LAUNCH("sm90a_block_attention_fwd_wgmma_bf16");
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_BLOCKATTENTIONWGMMAFWD_CUH
