//===- BlockAttentionWgmmaBwd.cuh - Backward on wgmma ----------*- CUDA -*-===//
//
// The attention backward (same arguments, outputs and numerics as the
// mma.sync one: dK = scale * dS^T Q, dV = P^T dO, the fp32 dQ accumulator
// unscaled and converted with the scale by launch 3) with its context
// kernel (launch 2) on Hopper's warpgroup MMA (sm_90a). Launches 1 and 3
// are kernels/BlockAttentionMmaSyncBwdDraft.cuh.
//
// Context kernel, FlashAttention-3's mapping with M = keys: one CTA per (row,
// kv head, WGS * 64 context keys), WGS warpgroups of 64 keys each (WGS = 2:
// one CTA per SM; WGS = 1: two CTAs per SM), walking the 64-row query tiles
// whose blocks see the key tile (Q, dO by TMA into 128B-swizzled tiles,
// STAGES stages with transaction barriers; each row's lse, D and visible
// keys by cp.async and the threads), by default from the last tile down.
// Per tile and warpgroup:
//   S^T = K Q^T, dP^T = V dO^T    (ss, both K-major; S^T's exponentials run
//                                  under dP^T's product)
//   P^T, dS^T = P^T (dP^T - D)    (masked per key and query row unless the
//                                  tile is whole: one branch per tile)
//   dV += P^T dO, dK += dS^T Q    (rs: the accumulators packed to bf16 A
//                                  fragments, dO / Q MN-major)
//   dS^T -> shared memory; dQ = dS K over the CTA's keys (A = dS^T read
//   MN-major, B = K MN-major), one 64-column d panel per warpgroup (WGS = 2)
//   or both in turn (WGS = 1), added into the accumulator by the DqAdd
//   policy (kernels/BlockAttentionWgmmaBwdDq.cuh).
// Shared memory grows with N (anchors and tile list): AttentionLimits.h
// sizes it, and block_attention_bwd_bf16 drops the row stage where N is too
// large for it. Needs d 128 and 64-row query tiles of whole or half blocks
// (wgmmaBackwardSupports). docs/kernels.md has the numbers.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BLOCKATTENTIONWGMMABWD_CUH
#define DFLASH_KERNELS_BLOCKATTENTIONWGMMABWD_CUH

#include "kernels/BlockAttentionMmaSyncBwdDraft.cuh"
#include "kernels/BlockAttentionTiling.cuh"
#include "kernels/BlockAttentionWgmmaBwdDq.cuh"
#include "kernels/Tma.cuh"
#include "kernels/Wgmma.cuh"

#include <type_traits>

namespace dflash::kernels {

namespace detail {

static_assert(kWgmmaTileAlignBytes == wgmma::kSwizzleAtomBytes,
              "AttentionLimits.h aligns the tiles to swizzle atoms");

/// Named barriers of the wgmma context kernel (bar.sync ids; 0 is
/// __syncthreads').
enum class WgmmaBwdBarrier : int {
  KeyWarpgroups = 1, ///< the key warpgroups, while an adder warpgroup runs
};

/// Shared-memory plan of the wgmma context kernel (byte offsets from a
/// 1024-byte aligned base; swizzled tiles on 1024-byte boundaries).
template <int D, int BS, int NH, int NKV, int WGS, class DqAdd, int STAGES,
          int CLUSTER = 1>
struct WgmmaBwdConfig {
  using T = BlockAttentionTiling<D, BS, NH, NKV>;
  static_assert(
      wgmmaBackwardSupports(D, BS, NH, NKV),
      "wgmma backward: needs head dim 128 and bs * (nh / nkv) "
      "dividing 64 or equal to 128; use mma_sync_block_attention_bwd_bf16 "
      "for other shapes");
  static_assert(T::kBwdRows == 64 && T::kBwdPadRows == 64, "64-row tiles");
  static_assert(WGS == 1 || WGS == 2, "one or two warpgroups of 64 keys");
  static_assert(STAGES == 2 || STAGES == 3, "two or three Q / dO stages");
  static_assert(CLUSTER == 1 || CLUSTER == 2 || CLUSTER == 4,
                "clusters of one, two or four CTAs");
  static constexpr int kD = D;
  // An adder warpgroup (no keys) issues the dQ adds.
  static constexpr int kAdderWarps = DqAdd::kAdderWarps;
  static constexpr bool kAdders = kAdderWarps > 0;
  static_assert(!kAdders || (WGS == 2 && 2 * kAdderWarps == 4 * WGS),
                "adders beside two warpgroups, two key warps per adder warp");
  static constexpr int kKeys = wgmma::kM * WGS, kRows = T::kBwdRows,
                       kThreads = wgmma::kWarpgroupThreads * WGS +
                                  wgmma::kWarpThreads * kAdderWarps,
                       kWarps = kThreads / wgmma::kWarpThreads;
  static constexpr int kMinBlocksPerSm = WGS == 1 ? 2 : 1;
  // The adders' split: the key warpgroups take the registers they give back.
  static constexpr int kKeyRegisters = DqAdd::kKeyRegisters,
                       kAdderRegisters = DqAdd::kAdderRegisters;
  static_assert(!kAdders ||
                    (kMinBlocksPerSm == 1 &&
                     WGS * wgmma::kWarpgroupThreads * kKeyRegisters +
                             kAdderWarps * wgmma::kWarpThreads *
                                 kAdderRegisters <=
                         kThreads * wgmma::launchRegistersPerThread(kThreads)),
                "setmaxnreg can only move the registers the CTA has");
  static constexpr WgmmaDqStage kDqStage = DqAdd::kStage;
  static constexpr size_t kKBytes = size_t(kKeys) * D * 2;
  static constexpr size_t kQBytes = size_t(kRows) * D * 2;
  static constexpr size_t kOffK = 0, kOffV = kKBytes, kOffQ = 2 * kKBytes;
  static constexpr size_t kOffdO = kOffQ + STAGES * kQBytes;
  static constexpr size_t kOffdS = kOffdO + STAGES * kQBytes;
  static constexpr size_t kOffdQ = kOffdS + size_t(kKeys) * kRows * 2;
  // The fp32 dQ stage only where DqAdd restages (without it, WGS = 1 fits
  // two CTAs per SM).
  static constexpr size_t kOffRows =
      kOffdQ + size_t(wgmmaBwdDqStageBytes(D, WGS, kDqStage));
  // lse, dot, lo, hi: [STAGES][64] each; then the Q / dO stages' transaction
  // barriers (in clusters, then their "empty" barriers), the warp counts,
  // the anchors [N] and the tile list.
  static constexpr size_t kOffBar = kOffRows + 4 * STAGES * kRows * 4;
  static constexpr size_t kOffEmpty = kOffBar + tma::kBarrierBytes * STAGES;
  static constexpr size_t kOffCount =
      kOffEmpty + (CLUSTER > 1 ? tma::kBarrierBytes * STAGES : 0);
  static constexpr size_t kFixedBytes = kOffCount + kWarps * 4;
  static_assert(kFixedBytes == wgmmaBwdContextFixedBytes(D, WGS, kDqStage,
                                                         STAGES, kAdderWarps,
                                                         CLUSTER),
                "AttentionLimits.h sizes this kernel's shared memory");
  static size_t smemBytes(int N) {
    return size_t(wgmmaBwdContextSmemBytes(kFixedBytes, T::kBlockRows, N));
  }
};

/// The tensors the context kernel loads by TMA: 64-row query tiles of Q and
/// dO (a box of G heads by 64 / G positions is a tile's rows in order).
struct WgmmaBwdMaps {
  CUtensorMap q, dOut;
};

/// Backward, launch 2 on wgmma: context keys, key-tile major (see the file
/// comment); DqAdd adds each tile's dQ (BlockAttentionWgmmaBwdDq.cuh). The grid
/// is one dimension: groups of GROUP (row, kv head) pairs (0: all of them) in
/// turn, and in a group the key tiles from the first (longest list) up, each
/// for every pair of the group: a smaller group keeps fewer dQ accumulators
/// live in L2 at once (1: the key tiles of one pair together), and longest
/// first balances the waves. WALK_DOWN walks the query tiles from the last one
/// down: every key tile of a full layer then starts at the same query tile, so
/// CTAs of one (row, kv head) running at once read the same Q / dO and add into
/// the same dQ rows at about the same time (L2 hits instead of DRAM).
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL, class DqAdd,
          int WGS, int GROUP, bool WALK_DOWN, int STAGES, int CLUSTER>
static __global__ void __launch_bounds__(
    (WgmmaBwdConfig<D, BS, NH, NKV, WGS, DqAdd, STAGES, CLUSTER>::kThreads),
    (WgmmaBwdConfig<D, BS, NH, NKV, WGS, DqAdd, STAGES,
                    CLUSTER>::kMinBlocksPerSm))
    sm90a_block_attention_bwd_context_wgmma_bf16_kernel(
        BlockAttentionBwdArgs args, const __grid_constant__ WgmmaBwdMaps maps) {
  using T = BlockAttentionTiling<D, BS, NH, NKV>;
  using C = WgmmaBwdConfig<D, BS, NH, NKV, WGS, DqAdd, STAGES, CLUSTER>;
  using namespace wgmma;
  constexpr int G = T::G, KT = C::kKeys, MQ = C::kRows, NW = C::kWarps;
  constexpr int kChunks = D / 8, kThreads = C::kThreads;
  extern __shared__ unsigned char smemRaw[];
  unsigned char *smem = smemRaw + swizzleAtomPadding(smemRaw);
  bf16 *sK = reinterpret_cast<bf16 *>(smem + C::kOffK);     // [KT x D]
  bf16 *sV = reinterpret_cast<bf16 *>(smem + C::kOffV);     // [KT x D]
  bf16 *sQ = reinterpret_cast<bf16 *>(smem + C::kOffQ);     // [STAGES][MQ x D]
  bf16 *sdO = reinterpret_cast<bf16 *>(smem + C::kOffdO);   // same
  bf16 *sdS = reinterpret_cast<bf16 *>(smem + C::kOffdS);   // [KT][MQ]
  float *sdQ = reinterpret_cast<float *>(smem + C::kOffdQ); // DqAdd::kStage
  float *sLse = reinterpret_cast<float *>(smem + C::kOffRows); // [STAGES][MQ]
  float *sDot = sLse + STAGES * MQ;
  int *sLo = reinterpret_cast<int *>(sDot + STAGES * MQ);
  int *sHi = sLo + STAGES * MQ;
  const uint32_t bar0 = smemAddress(smem + C::kOffBar);     // + kBarrierBytes s
  const uint32_t empty0 = smemAddress(smem + C::kOffEmpty); // CLUSTER > 1
  int *sCount = reinterpret_cast<int *>(smem + C::kOffCount); // [NW]
  int *sAnchor = sCount + NW;     // [N], -1 where keep = 0
  int *sStart = sAnchor + args.N; // [N], conversationStart
  int *sList = sStart + args.N;   // tile * 2 + whole

  const int tid = threadIdx.x, wg = tid / kWarpgroupThreads,
            warp = (tid / kWarpThreads) % kWarpgroupWarps,
            lane = tid % kWarpThreads;
  const int S = args.S, N = args.N, Q = N * BS;
  // Early keys, most queries: launched first (see the kernel's comment). A
  // cluster takes CLUSTER adjacent key tiles of one (row, kv head): the
  // keys [jSpan, jSpan + CLUSTER * KT), this CTA the tile of its rank.
  const int rank = CLUSTER > 1 ? int(tma::clusterRank()) : 0;
  const auto unit = blockIdx.x / CLUSTER; // unsigned, as blockIdx.x
  const int pairs = args.B * NKV, group = GROUP > 0 ? GROUP : pairs;
  const int span = group * ((S + CLUSTER * KT - 1) / (CLUSTER * KT));
  const int first = unit / span * group, inGroup = unit % span,
            groupSize = min(group, pairs - first);
  const int bg = first + inGroup % groupSize;
  const int b = bg / NKV, g = bg % NKV;
  const int jSpan = inGroup / groupSize * (CLUSTER * KT);
  const int j0 = jSpan + rank * KT;
  const int totalRows = N * T::kBlockRows;
  const int numQueryTiles = (totalRows + MQ - 1) / MQ;

  for (int idx = tid; idx < KT * kChunks; idx += kThreads) {
    int t = idx / kChunks, c = idx % kChunks;
    int j = j0 + t;
    // Keys past the context are zero-filled; no query sees them.
    bool valid = j < S;
    int64_t off =
        valid ? ((static_cast<int64_t>(b) * S + j) * NKV + g) * D + c * 8 : 0;
    cpAsync16(smemAddress(sK + tileOffset<KT>(t, c)), args.contextKeys + off,
              valid);
    cpAsync16(smemAddress(sV + tileOffset<KT>(t, c)), args.contextValues + off,
              valid);
  }
  cpAsyncCommit();
  for (int n = tid; n < N; n += kThreads) {
    int64_t i = static_cast<int64_t>(b) * N + n;
    int a = args.keep[i] ? args.anchors[i] : -1;
    sAnchor[n] = a;
    sStart[n] = a >= 0 ? conversationStart(
                             args.positionIds + static_cast<int64_t>(b) * S, a)
                       : 0;
  }
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      tma::barrierInit(bar0 + tma::kBarrierBytes * s, 1);
      // A stage is refilled once every CTA of the cluster has read it.
      if constexpr (CLUSTER > 1)
        tma::barrierInit(empty0 + tma::kBarrierBytes * s, CLUSTER);
    }
    DqAdd::initBarriers(sdQ);
    tma::fenceBarrierInit();
  }
  // A peer's first multicast may land as soon as the barriers exist.
  if constexpr (CLUSTER > 1)
    tma::clusterSync();
  else
    __syncthreads();

  // The query tiles whose blocks see any key of the cluster's [jSpan, jSpan
  // + CLUSTER * KT), in order (every CTA of a cluster walks the same list:
  // each Q / dO tile is read from L2 once and multicast to all); `whole`
  // where every row of the tile sees every one of those keys. A tile that
  // sees only a peer's keys runs masked here, adding zeros.
  const int count = listQueryTilesSeeingKeys<BS, WINDOW, NW>(
      numQueryTiles, MQ, T::kBlockRows, N, totalRows, true, sAnchor, sStart,
      jSpan, CLUSTER * KT, sCount, sList);

  auto rowIndex = [&](int row) -> int64_t { // into [B, Q, nh]
    int n = row / T::kBlockRows, k = (row % T::kBlockRows) / G, hh = row % G;
    return (static_cast<int64_t>(b) * Q + n * BS + k) * NH + g * G + hh;
  };
  // Tile `it` of the walk (tile t) into stage buf.
  auto loadQueryTile = [&](int t, int buf, int it) {
    bf16 *tQ = sQ + buf * MQ * D, *tdO = sdO + buf * MQ * D;
    // Q and dO by TMA from one thread: a box per tensor and 64-column panel
    // (positions past Q read as zeros), completing on the stage's barrier.
    // (Each thread's cp.async of 8 chunks with their address arithmetic
    // took a sixth of the warps' issue time.) In a cluster, the boxes (Q
    // and dO of each panel, in turn) are dealt out to the ranks, each copied
    // into every CTA once all have read the stage's previous tile: with two,
    // rank 0 copies Q and rank 1 dO; with four, one box each.
    if (tid == 0) {
      const uint32_t bar = bar0 + tma::kBarrierBytes * buf;
      if constexpr (CLUSTER > 1)
        if (it >= STAGES)
          tma::waitParity(empty0 + tma::kBarrierBytes * buf,
                          (it / STAGES - 1) & 1);
      tma::arriveExpectTx(bar, 2 * MQ * D * 2);
#pragma unroll
      for (int box = 0; box < 2 * (D / kPanelCols); ++box) {
        const int p = box / 2;
        const bool isQ = box % 2 == 0;
        const uint32_t dst =
            smemAddress(isQ ? tQ : tdO) + p * MQ * kSwizzleRowBytes;
        const CUtensorMap *map = isQ ? &maps.q : &maps.dOut;
        if constexpr (CLUSTER == 1)
          tma::load4d(dst, map, bar, p * kPanelCols, g * G, t * (MQ / G), b);
        else if (box % CLUSTER == rank)
          tma::load4dMulticast(dst, map, bar, p * kPanelCols, g * G,
                               t * (MQ / G), b, uint16_t((1u << CLUSTER) - 1));
      }
    }
    if (tid < MQ) {
      int r = tid, row = t * MQ + r;
      bool valid = row < totalRows;
      int lo = INT_MAX, hi = INT_MIN;
      int64_t ri = 0;
      if (valid) {
        ri = rowIndex(row);
        int k = (row % T::kBlockRows) / G;
        int n = row / T::kBlockRows, a = sAnchor[n];
        if (a >= 0) {
          hi = a;
          lo = contextKeysBegin<WINDOW>(a, k, sStart[n]);
        }
      }
      // Rows that see nothing are masked everywhere: their (possibly
      // infinite) lse is never used.
      cpAsync4(smemAddress(sLse + buf * MQ + r), args.lse + ri, valid);
      cpAsync4(smemAddress(sDot + buf * MQ + r), args.dOutDotOut + ri, valid);
      sLo[buf * MQ + r] = lo;
      sHi[buf * MQ + r] = hi;
    }
  };

  // dK^T / dV^T accumulators of the warpgroup's 64 keys: element 4j + 2i + e
  // is key 16 warp + lane/4 + 8i, column 8j + 2(lane%4) + e.
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) {
    dk[i] = 0.f;
    dv[i] = 0.f;
  }
  const int keyOff = wg * kM + warp * 16 + lane / 4; // key in tile, i = 0
  const uint32_t kAddr = smemAddress(sK) + wg * kM * kSwizzleRowBytes;
  const uint32_t vAddr = smemAddress(sV) + wg * kM * kSwizzleRowBytes;
  const uint32_t dsAddr = smemAddress(sdS);

  auto listAt = [&](int i) { return sList[WALK_DOWN ? count - 1 - i : i]; };
  const WgmmaBwdDqTarget dqTo{args, sdQ, totalRows, tid, wg, warp, lane};
  // An adder warpgroup (DqAdd::kAdderWarps) adds the restaged dQ rows while
  // the key warpgroups go on with the next tile; they then meet at a named
  // barrier, not __syncthreads. setmaxnreg only redistributes the registers
  // the CTA was launched with (C::kKeyRegisters, kAdderRegisters).
  if constexpr (C::kAdders) {
    if (wg == WGS) {
      decreaseRegisters<C::kAdderRegisters>();
      DqAdd::template runAdders<C>(dqTo, count, listAt, rowIndex);
      if constexpr (CLUSTER > 1)
        tma::clusterSync(); // the key warps' exit sync (below)
      return;
    }
    increaseRegisters<C::kKeyRegisters>();
  }
  auto keySync = [] {
    if constexpr (C::kAdders)
      namedBarrierSync<int(WgmmaBwdBarrier::KeyWarpgroups),
                       kWarpgroupThreads * WGS>();
    else
      __syncthreads();
  };
  // One commit group per tile slot, empty past the list, so that waiting for
  // all but the newest STAGES - 2 groups always means "tile it landed".
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < count)
      loadQueryTile(listAt(s) >> 1, s, s);
    cpAsyncCommit();
  }
  for (int it = 0; it < count; ++it) {
    const int cur = it % STAGES;
    cpAsyncWait<STAGES - 2>();
    tma::waitParity(bar0 + tma::kBarrierBytes * cur, (it / STAGES) & 1);
    tma::fenceProxyAsync();
    keySync();
    if (it + STAGES - 1 < count) {
      // The stage of tile it - 1 is free here: in a cluster, say so to every
      // CTA (each copies into all), lane r arriving on CTA r's barrier.
      if constexpr (CLUSTER > 1)
        if (it > 0 && tid < CLUSTER)
          tma::arriveInCta(empty0 + tma::kBarrierBytes * ((it - 1) % STAGES),
                           uint32_t(tid));
      loadQueryTile(listAt(it + STAGES - 1) >> 1, (it + STAGES - 1) % STAGES,
                    it + STAGES - 1);
    }
    cpAsyncCommit();
    const int entry = listAt(it);
    const int t = entry >> 1;
    const bool whole = entry & 1;
    const uint32_t qAddr = smemAddress(sQ + cur * MQ * D);
    const uint32_t doAddr = smemAddress(sdO + cur * MQ * D);
    // Descriptors' low words (wgmma::descLo): each k step adds bytes / 16.
    const uint32_t kLo = descLo(kAddr, kKMajorLbo),
                   vLo = descLo(vAddr, kKMajorLbo),
                   qLo = descLo(qAddr, kKMajorLbo),
                   doLo = descLo(doAddr, kKMajorLbo),
                   qMnLo = descLo(qAddr, MQ * kSwizzleRowBytes),
                   doMnLo = descLo(doAddr, MQ * kSwizzleRowBytes);
    const float *tLse = sLse + cur * MQ, *tDot = sDot + cur * MQ;
    const int *tLo = sLo + cur * MQ, *tHi = sHi + cur * MQ;

    // S^T = K Q^T and dP^T = V dO^T (64 keys x 64 rows), two groups.
    float st[MQ / 2], dpt[MQ / 2];
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / kK; ++kk)
      Wgmma<MQ, Major::K, Major::K>::ss(st, descOf(kLo + kMajorStep(kk, KT)),
                                        descOf(qLo + kMajorStep(kk, MQ)),
                                        kk > 0);
    wgmma::commit();
#pragma unroll
    for (int kk = 0; kk < D / kK; ++kk)
      Wgmma<MQ, Major::K, Major::K>::ss(dpt, descOf(vLo + kMajorStep(kk, KT)),
                                        descOf(doLo + kMajorStep(kk, MQ)),
                                        kk > 0);
    wgmma::commit();

    // P^T while dP^T is in flight; then dV += P^T dO (B = dO [rows x d]
    // MN-major, d panels MQ rows apart) runs under dS^T = P^T (dP^T - D), and
    // dK += dS^T Q under the dS^T stores. The accumulators packed to bf16 A
    // fragments: two adjacent n8 accumulator tiles are one k16 fragment.
    wgmma::wait<1>();
    wgmma::pin(st);
    uint32_t pa[MQ / 16][4], dsa[MQ / 16][4];
    // P^T, masked per key and row unless the tile is whole: one branch per
    // tile (`whole` is uniform), not a select per element.
    auto probabilities = [&](auto maskedTag) {
      constexpr bool kMasked = decltype(maskedTag)::value;
#pragma unroll
      for (int j = 0; j < MQ / 8; ++j) {
        // This thread's two query rows r, r + 1 of the n8 tile: 8-byte loads.
        const int r = j * 8 + 2 * (lane & 3);
        const float2 lse2 = *reinterpret_cast<const float2 *>(tLse + r);
        int2 lo2{}, hi2{};
        if constexpr (kMasked) {
          lo2 = *reinterpret_cast<const int2 *>(tLo + r);
          hi2 = *reinterpret_cast<const int2 *>(tHi + r);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float &v0 = st[4 * j + 2 * i], &v1 = st[4 * j + 2 * i + 1];
          if constexpr (kMasked) {
            const int key = j0 + keyOff + 8 * i;
            const bool vis0 = (key >= lo2.x) & (key < hi2.x);
            const bool vis1 = (key >= lo2.y) & (key < hi2.y);
            v0 = vis0 ? exp2Approx(v0 * T::kScaleLog2 - lse2.x * T::kLog2e)
                      : 0.f;
            v1 = vis1 ? exp2Approx(v1 * T::kScaleLog2 - lse2.y * T::kLog2e)
                      : 0.f;
          } else {
            v0 = exp2Approx(v0 * T::kScaleLog2 - lse2.x * T::kLog2e);
            v1 = exp2Approx(v1 * T::kScaleLog2 - lse2.y * T::kLog2e);
          }
          pa[j / 2][(j & 1) * 2 + i] = packBf16(v0, v1);
        }
      }
    };
    if (whole)
      probabilities(std::false_type());
    else
      probabilities(std::true_type());
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < MQ / kK; ++ks)
      Wgmma<D, Major::K, Major::MN>::rs(dv, pa[ks],
                                        descOf(doMnLo + mnMajorStep(ks)));
    wgmma::commit();
    // In flight: dP^T, dV.
    wgmma::wait<1>();
    wgmma::pin(dpt);
#pragma unroll
    for (int j = 0; j < MQ / 8; ++j)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float2 dot2 =
            *reinterpret_cast<const float2 *>(tDot + j * 8 + 2 * (lane & 3));
        float d0 = st[4 * j + 2 * i] * (dpt[4 * j + 2 * i] - dot2.x);
        float d1 = st[4 * j + 2 * i + 1] * (dpt[4 * j + 2 * i + 1] - dot2.y);
        dsa[j / 2][(j & 1) * 2 + i] = packBf16(d0, d1);
      }
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < MQ / kK; ++ks)
      Wgmma<D, Major::K, Major::MN>::rs(dk, dsa[ks],
                                        descOf(qMnLo + mnMajorStep(ks)));
    wgmma::commit();

    if constexpr (DqAdd::kDqProduct) {
      // dS^T [keys][rows] to shared memory (one 128B-swizzled panel of 64
      // rows per key) while dV / dK run.
#pragma unroll
      for (int j = 0; j < MQ / 8; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i)
          *reinterpret_cast<uint32_t *>(
              sdS + tileOffset<KT>(keyOff + 8 * i, j) + 2 * (lane & 3)) =
              dsa[j / 2][(j & 1) * 2 + i];
      DqAdd::template reclaimStage<C>(tid);
      tma::fenceProxyAsync();
      keySync();

      // dQ = dS K, one 64-column d panel at a time (WGS = 2: warpgroup w
      // takes panel w over the CTA's 128 keys; WGS = 1: both panels over its
      // 64 keys): A = dS^T read MN-major (rows contiguous), B = K's d panel
      // MN-major.
      const WgmmaBwdDqTile tile{t, it, warp * 16 + lane / 4};
#pragma unroll
      for (int h = 0; h < 2 / WGS; ++h) {
        const int panel = WGS == 2 ? wg : h;
        const uint32_t kPanelLo =
            descLo(smemAddress(sK) + panel * KT * kSwizzleRowBytes,
                   KT * kSwizzleRowBytes);
        const uint32_t dsLo = descLo(dsAddr, KT * kSwizzleRowBytes);
        float dq[kPanelCols / 2];
        wgmma::fence();
#pragma unroll
        for (int ks = 0; ks < KT / kK; ++ks)
          Wgmma<kPanelCols, Major::MN, Major::MN>::ss(
              dq, descOf(dsLo + mnMajorStep(ks)),
              descOf(kPanelLo + mnMajorStep(ks)), ks > 0);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::pin(dq);
        wgmma::pin(dk);
        wgmma::pin(dv);
        DqAdd::template addPanel<C>(dq, dqTo, tile, panel, rowIndex);
      }
      DqAdd::template finishTile<C>(dqTo, tile, rowIndex);
    } else {
      wgmma::wait<0>();
      wgmma::pin(dk);
      wgmma::pin(dv);
    }
  }
  cpAsyncWait<0>();
  DqAdd::template drain<C>(tid);

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int j = j0 + keyOff + 8 * i;
    if (j >= S)
      continue;
    int64_t off = ((static_cast<int64_t>(b) * S + j) * NKV + g) * D;
#pragma unroll
    for (int jj = 0; jj < D / 8; ++jj) {
      int col = jj * 8 + 2 * (lane & 3);
      *reinterpret_cast<uint32_t *>(args.dContextValues + off + col) =
          packBf16(dv[4 * jj + 2 * i], dv[4 * jj + 2 * i + 1]);
      *reinterpret_cast<uint32_t *>(args.dContextKeys + off + col) = packBf16(
          dk[4 * jj + 2 * i] * T::kScale, dk[4 * jj + 2 * i + 1] * T::kScale);
    }
  }
  // No CTA leaves while a peer may still copy into it or arrive on its
  // barriers.
  if constexpr (CLUSTER > 1)
    tma::clusterSync();
}

} // namespace detail

/// The (row, kv head) pairs whose key tiles the context kernel launches
/// together by default: fewer dQ accumulators live in L2 at once, yet enough
/// key tiles apart that their adds rarely meet in the same lines. 8 is the
/// measured optimum at qwen3 shapes (docs/kernels.md), not a rule.
constexpr int kWgmmaBwdPairsPerGroup = 8;

/// Backward with the context kernel on wgmma (sm_90a): same arguments and
/// outputs as mma_sync_block_attention_bwd_bf16. DqAdd is how the context
/// kernel adds into the dQ accumulator (WgmmaBwdDqAdd<BlockAttentionDq>;
/// the caller checks that its shared memory fits: smemBytes); WGS the
/// warpgroups of 64 keys per CTA; WALK_DOWN walks query tiles from the last
/// one down; GROUP the (row, kv head) pairs whose key tiles run together (0:
/// all); STAGES the Q / dO buffers; CLUSTER the adjacent key tiles that walk
/// one query tile list together, each Q / dO tile multicast to all of them.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          class DqAdd = WgmmaBwdDqAdd<BlockAttentionDq::RowsByAdders>,
          int WGS = 2, bool WALK_DOWN = true,
          int GROUP = kWgmmaBwdPairsPerGroup, int STAGES = 2, int CLUSTER = 1>
void sm90a_block_attention_bwd_wgmma_bf16(const BlockAttentionBwdArgs &args,
                                          cudaStream_t stream) {
  static_assert(wgmmaBackwardSupports(D, BS, NH, NKV),
                "sm90a_block_attention_bwd_wgmma_bf16 needs head dim 128 and "
                "bs * (nh / nkv) dividing 64 or equal to 128; use "
                "mma_sync_block_attention_bwd_bf16 for other shapes");
  using C = detail::WgmmaBwdConfig<D, BS, NH, NKV, WGS, DqAdd, STAGES, CLUSTER>;
  detail::launchBlockAttentionBwdDraft<D, BS, NH, NKV, WINDOW, CAUSAL>(args,
                                                                       stream);
  {
    auto kernel = detail::sm90a_block_attention_bwd_context_wgmma_bf16_kernel<
        D, BS, NH, NKV, WINDOW, CAUSAL, DqAdd, WGS, GROUP, WALK_DOWN, STAGES,
        CLUSTER>;
    // Encoded per call on the host (a few microseconds; a captured graph
    // keeps them).
    constexpr uint32_t G = NH / NKV;
    const uint64_t Q = uint64_t(args.N) * BS;
    detail::WgmmaBwdMaps maps;
    maps.q = tma::bf16RowsOfHeadsMap(args.q, args.B, Q, NH, D, G, C::kRows / G,
                                     "q [B, Q, nh, d]");
    maps.dOut = tma::bf16RowsOfHeadsMap(args.dOut, args.B, Q, NH, D, G,
                                        C::kRows / G, "dOut [B, Q, nh, d]");
    size_t smem = C::smemBytes(args.N);
    DFLASH_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    // Whole clusters: a last tile past S has no keys and stores nothing.
    const int keyTiles =
        (args.S + CLUSTER * C::kKeys - 1) / (CLUSTER * C::kKeys) * CLUSTER;
    const unsigned grid = unsigned(keyTiles * args.B * NKV);
    if constexpr (CLUSTER == 1) {
      kernel<<<grid, C::kThreads, smem, stream>>>(args, maps);
      DFLASH_CUDA_CHECK_LAUNCH("sm90a_block_attention_bwd_context_wgmma_bf16");
    } else {
      cudaLaunchAttribute cluster;
      cudaLaunchConfig_t config = tma::clusterLaunchConfig(
          dim3(CLUSTER, 1, 1), C::kThreads, smem, stream, cluster);
      config.gridDim = dim3(grid);
      DFLASH_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args, maps));
      DFLASH_CUDA_CHECK_LAUNCH(
          "sm90a_block_attention_bwd_context_wgmma_bf16 (clusters)");
    }
  }
  detail::launchBlockAttentionBwdDq<D, BS, NH>(args, stream);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_BLOCKATTENTIONWGMMABWD_CUH
