//===- BlockAttentionBwdWgmma.cuh - Attention backward, wgmma -*- CUDA -*-===//
//
// The backward of BlockAttention.cuh (same arguments, outputs and numerics:
// dK = scale * dS^T Q, dV = P^T dO, the fp32 dQ accumulator unscaled and
// converted with the scale by launch 3) with its context kernel (launch 2)
// on Hopper's warpgroup MMA (sm_90a). Launches 1 (draft keys, D, and the
// accumulator's initial value) and 3 (dQ = bf16(scale * accumulator)) are the
// mma.sync backward's own kernels.
//
// Context kernel, FlashAttention-3's mapping with M = keys: one CTA per (row,
// kv head, WGS * 64 context keys), WGS warpgroups of 64 keys each (WGS = 2:
// one CTA per SM; WGS = 1: two CTAs per SM, whose phases interleave), walking
// the 64-row query tiles whose blocks see the key tile (Q, dO by TMA into
// 128B-swizzled tiles, two stages with transaction barriers; each row's lse,
// D and visible keys by cp.async and the threads), by default from the last
// tile down (CTAs of one (row, kv head) then share Q / dO / dQ lines in L2).
// Per tile and warpgroup:
//   S^T = K Q^T, dP^T = V dO^T    (ss, both K-major; S^T's exponentials run
//                                  under dP^T's product)
//   P^T, dS^T = P^T (dP^T - D)    (masked per key and query row)
//   dV += P^T dO, dK += dS^T Q    (rs: the accumulators packed to bf16 A
//                                  fragments, dO / Q MN-major via the
//                                  descriptor's transpose bit)
//   dS^T -> shared memory; dQ = dS K over the CTA's keys (A = dS^T read
//   MN-major, B = K MN-major), one 64-column d panel per warpgroup (WGS = 2)
//   or both in turn (WGS = 1), added into the accumulator (DQ: each warp's
//   rows restaged in shared memory, then either added by a third warpgroup
//   (bulk reductions of 256-byte row segments) while the two that hold keys
//   go on with the next tile, or by the key warps' own 16-byte atomics; or
//   from the fragments, 8-byte atomics of each thread's column pairs,
//   16-byte ones after a lane exchange; or staged + cp.reduce.async.bulk).
// Q / dO stages: STAGES (2 or 3). Defaults (WGS = 2, walk down, rows added
// by the third warpgroup, the key tiles of 8 (row, kv head) pairs launched
// together, two stages) are the fastest variant measured on the H200
// (bench/kernels/NOTES.md, seventh session: about 4.7 ms full and sliding
// at qwen3-8b-b16 shapes with launches 1 and 3; v2 11.45 / 10.55 ms). The
// mask is one branch per tile (`whole`), descriptors are low words plus offsets
// (wgmma::descLo): both cut instructions a warp waits on, with two warps per
// scheduler. Shared memory grows with N (anchors and tile list): N = 512
// needs 188 KB with the row stage, 151 KB without; block_attention_bwd_bf16
// drops the stage (8-byte atomics) where N is too large for it, and dflashc
// rejects an N past the 227 KB limit even without it
// (kernels/AttentionLimits.h sizes it).
// Needs d 128 and 64-row query tiles of whole blocks or half blocks
// (bs * nh / nkv dividing 64, or 128): wgmmaBackwardSupports in
// AttentionLimits.h. Other shapes stay on sm90_block_attention_bwd_bf16.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BLOCKATTENTIONBWDWGMMA_CUH
#define DFLASH_KERNELS_BLOCKATTENTIONBWDWGMMA_CUH

#include "kernels/BlockAttention.cuh"
#include "kernels/BlockAttentionWgmma.cuh"
#include "kernels/Tma.cuh"

namespace dflash::kernels {

namespace detail {

namespace wgmma {
/// d (m64 x n64 fp32) += A * B with both operands MN-major in shared memory
/// (transpose bits set): dQ = dS K reads dS^T [keys][rows] and K [keys][d].
__device__ __forceinline__ void ssM64N64Transposed(float (&d)[32], uint64_t a,
                                                   uint64_t b, int scaleD) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
      "%30, %31"
      "}, %32, %33, p, 1, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]),
        "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
        "+f"(d[31])
      : "l"(a), "l"(b), "r"(scaleD));
}
} // namespace wgmma

/// Shared-memory plan of the wgmma context kernel (byte offsets from a
/// 1024-byte aligned base; swizzled tiles on 1024-byte boundaries).
template <int D, int BS, int NH, int NKV, int WGS, BlockAttentionDq DQ,
          int STAGES>
struct WgmmaBwdConfig {
  using T = BlockAttentionTiling<D, BS, NH, NKV>;
  static_assert(
      wgmmaBackwardSupports(D, BS, NH, NKV),
      "wgmma backward: needs head dim 128 and bs * (nh / nkv) "
      "dividing 64 or equal to 128; use sm90_block_attention_bwd_bf16 "
      "for other shapes");
  static_assert(T::kBwdRows == 64 && T::kBwdPadRows == 64, "64-row tiles");
  static_assert(WGS == 1 || WGS == 2, "one or two warpgroups of 64 keys");
  static_assert(STAGES == 2 || STAGES == 3, "two or three Q / dO stages");
  // RowsByAdders: a third warpgroup (no keys) issues the dQ adds.
  static constexpr bool kAdders = DQ == BlockAttentionDq::RowsByAdders;
  static_assert(!kAdders || (WGS == 2 && 2 * kWgmmaBwdAdderWarps == 4 * WGS),
                "adders beside two warpgroups, two key warps per adder warp");
  static constexpr int kAdderWarps = kAdders ? int(kWgmmaBwdAdderWarps) : 0;
  static constexpr int kKeys = 64 * WGS, kRows = 64,
                       kThreads = 128 * WGS + 32 * kAdderWarps,
                       kWarps = kThreads / 32;
  static constexpr int kStageStride = dqStageStride<D>(); // fp32, padded
  // RowsVec4: each warp's [16][kRowStride] fp32 slice of the stage.
  static constexpr int kRowStride = int(kWgmmaDqRowStride);
  static constexpr WgmmaDqStage kDqStage =
      DQ == BlockAttentionDq::BulkReduce            ? WgmmaDqStage::Tile
      : DQ == BlockAttentionDq::RowsVec4 || kAdders ? WgmmaDqStage::WarpRows
                                                    : WgmmaDqStage::None;
  static constexpr size_t kKBytes = size_t(kKeys) * D * 2;
  static constexpr size_t kQBytes = size_t(kRows) * D * 2;
  static constexpr size_t kOffK = 0, kOffV = kKBytes, kOffQ = 2 * kKBytes;
  static constexpr size_t kOffdO = kOffQ + STAGES * kQBytes;
  static constexpr size_t kOffdS = kOffdO + STAGES * kQBytes;
  static constexpr size_t kOffdQ = kOffdS + size_t(kKeys) * kRows * 2;
  // The fp32 dQ stage only where DQ restages (without it, WGS = 1 fits two
  // CTAs per SM).
  static constexpr size_t kOffRows =
      kOffdQ + size_t(wgmmaBwdDqStageBytes(D, WGS, kDqStage));
  // lse, dot, lo, hi: [STAGES][64] each; then the Q / dO stages' transaction
  // barriers, the warp counts, the anchors [N] and the tile list.
  static constexpr size_t kOffBar = kOffRows + 4 * STAGES * kRows * 4;
  static constexpr size_t kOffCount = kOffBar + 8 * STAGES;
  static constexpr size_t kFixedBytes = kOffCount + kWarps * 4;
  static_assert(kFixedBytes == wgmmaBwdContextFixedBytes(D, WGS, kDqStage,
                                                         STAGES, kAdderWarps),
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

/// Backward, step 2 on wgmma: context keys, key-tile major (see the file
/// comment). The grid is one dimension: groups of GROUP (row, kv head) pairs
/// (0: all of them) in turn, and in a group the key tiles from the first
/// (longest list) up, each for every pair of the group: a smaller group keeps
/// fewer dQ accumulators live in L2 at once (1: the key tiles of one pair
/// together), and longest first balances the waves. WALK_DOWN walks the query
/// tiles from the last one down: every key tile of a full layer then starts
/// at the same query tile, so CTAs of one (row, kv head) running at once read
/// the same Q / dO and add into the same dQ rows at about the same time (L2
/// hits instead of DRAM).
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          BlockAttentionDq DQ, int WGS, int GROUP, bool WALK_DOWN, int STAGES>
static __global__ void
__launch_bounds__((WgmmaBwdConfig<D, BS, NH, NKV, WGS, DQ, STAGES>::kThreads),
                  WGS == 1 ? 2 : 1)
    sm90a_block_attention_bwd_context_wgmma_bf16_kernel(
        BlockAttentionBwdArgs args, const __grid_constant__ WgmmaBwdMaps maps) {
  using T = BlockAttentionTiling<D, BS, NH, NKV>;
  using C = WgmmaBwdConfig<D, BS, NH, NKV, WGS, DQ, STAGES>;
  using wgmma::descLo;
  using wgmma::descOf;
  using wgmma::tileOffset;
  using wgmma::Wgmma;
  constexpr int G = T::G, KT = C::kKeys, MQ = C::kRows, NW = C::kWarps;
  constexpr int kChunks = D / 8, kThreads = C::kThreads;
  extern __shared__ unsigned char smemRaw[];
  // SWIZZLE_128B atoms must start on 1024-byte boundaries.
  unsigned char *smem =
      smemRaw + ((1024 - (smemAddress(smemRaw) & 1023)) & 1023);
  bf16 *sK = reinterpret_cast<bf16 *>(smem + C::kOffK);     // [KT x D]
  bf16 *sV = reinterpret_cast<bf16 *>(smem + C::kOffV);     // [KT x D]
  bf16 *sQ = reinterpret_cast<bf16 *>(smem + C::kOffQ);     // [STAGES][MQ x D]
  bf16 *sdO = reinterpret_cast<bf16 *>(smem + C::kOffdO);   // same
  bf16 *sdS = reinterpret_cast<bf16 *>(smem + C::kOffdS);   // [KT][MQ]
  float *sdQ = reinterpret_cast<float *>(smem + C::kOffdQ); // see kDqStage
  float *sLse = reinterpret_cast<float *>(smem + C::kOffRows); // [STAGES][MQ]
  float *sDot = sLse + STAGES * MQ;
  int *sLo = reinterpret_cast<int *>(sDot + STAGES * MQ);
  int *sHi = sLo + STAGES * MQ;
  const uint32_t bar0 = smemAddress(smem + C::kOffBar);       // stage s: + 8 s
  int *sCount = reinterpret_cast<int *>(smem + C::kOffCount); // [NW]
  int *sAnchor = sCount + NW;    // [N], -1 where keep = 0
  int *sList = sAnchor + args.N; // tile * 2 + whole

  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4,
            lane = tid % 32;
  const int S = args.S, N = args.N, Q = N * BS;
  // Early keys, most queries: launched first (see the kernel's comment).
  const int pairs = args.B * NKV, group = GROUP > 0 ? GROUP : pairs;
  const int span = group * ((S + KT - 1) / KT);
  const int first = blockIdx.x / span * group, inGroup = blockIdx.x % span,
            groupSize = min(group, pairs - first);
  const int bg = first + inGroup % groupSize;
  const int b = bg / NKV, g = bg % NKV;
  const int j0 = inGroup / groupSize * KT;
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
    sAnchor[n] = args.keep[i] ? args.anchors[i] : -1;
  }
  // RowsByAdders: each key-holding warp's slice of the row stage has a
  // "full" and an "empty" barrier in its padding (row 0, columns 64-67).
  auto sliceBar = [&](int x, int which) {
    return smemAddress(sdQ + (x * 16) * C::kRowStride + 64 + 2 * which);
  };
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s)
      tma::barrierInit(bar0 + 8 * s, 1);
    if constexpr (C::kAdders)
      for (int x = 0; x < 4 * WGS; ++x) {
        tma::barrierInit(sliceBar(x, 0), 32); // the key warp's lanes
        tma::barrierInit(sliceBar(x, 1), 16); // the adder lanes of its rows
      }
    tma::fenceBarrierInit();
  }
  __syncthreads();

  // The query tiles whose blocks see any key of [j0, j0 + KT), in order;
  // `whole` where every row of the tile sees every key.
  const int count = listQueryTilesSeeingKeys<BS, WINDOW, NW>(
      numQueryTiles, MQ, T::kBlockRows, N, totalRows, true, sAnchor, j0, KT,
      sCount, sList);

  auto rowIndex = [&](int row) -> int64_t { // into [B, Q, nh]
    int n = row / T::kBlockRows, k = (row % T::kBlockRows) / G, hh = row % G;
    return (static_cast<int64_t>(b) * Q + n * BS + k) * NH + g * G + hh;
  };
  auto loadQueryTile = [&](int t, int buf) {
    bf16 *tQ = sQ + buf * MQ * D, *tdO = sdO + buf * MQ * D;
    // Q and dO by TMA from one thread: a box per tensor and 64-column panel
    // (positions past Q read as zeros), completing on the stage's barrier.
    // (Each thread's cp.async of 8 chunks with their address arithmetic
    // took a sixth of the warps' issue time: NOTES.md, fifth session.)
    if (tid == 0) {
      const uint32_t bar = bar0 + 8 * buf;
      tma::arriveExpectTx(bar, 2 * MQ * D * 2);
#pragma unroll
      for (int p = 0; p < D / 64; ++p) {
        tma::load4d(smemAddress(tQ) + p * MQ * 128, &maps.q, bar, p * 64, g * G,
                    t * (MQ / G), b);
        tma::load4d(smemAddress(tdO) + p * MQ * 128, &maps.dOut, bar, p * 64,
                    g * G, t * (MQ / G), b);
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
        int a = sAnchor[row / T::kBlockRows];
        if (a >= 0) {
          hi = a;
          lo = WINDOW > 0 ? max(0, a + k - (WINDOW - 1)) : 0;
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
  const int keyOff = wg * 64 + warp * 16 + lane / 4; // key in tile, i = 0
  const uint32_t kAddr = smemAddress(sK) + wg * 64 * 128;
  const uint32_t vAddr = smemAddress(sV) + wg * 64 * 128;
  const uint32_t dsAddr = smemAddress(sdS);

  auto listAt = [&](int i) { return sList[WALK_DOWN ? count - 1 - i : i]; };
  auto arrive = [](uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar)
                 : "memory");
  };
  // RowsByAdders: the third warpgroup adds the restaged dQ rows of two key
  // warps' slices per warp, freeing each slice once its reductions have
  // read it, while the key warpgroups go on with the next tile. The key
  // warpgroups then meet at a named barrier, not __syncthreads.
  if constexpr (C::kAdders) {
    if (wg == WGS) {
      // Registers move to the key warpgroups: setmaxnreg only redistributes
      // the CTA's own (384 x 168 = 256 x 240 + 128 x 24).
      asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
      const int x = 2 * warp + lane / 16, r = lane % 16;
      const int panel = x / 4, w = x % 4;
      const float *slice = sdQ + (x * 16) * C::kRowStride;
      for (int it = 0; it < count; ++it) {
        const int row0 = (listAt(it) >> 1) * MQ + w * 16;
        tma::waitParity(sliceBar(x, 0), it & 1);
        // Lane r: row r of the slice by one bulk reduction of its 64 floats
        // (256 contiguous bytes in both places); v4 atomics from these
        // lanes were 1.3x slower (NOTES.md, seventh session).
        if (row0 + r < totalRows)
          asm volatile(
              "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 "
              "[%0], [%1], 256;\n" ::"l"(args.dqAccum + rowIndex(row0 + r) * D +
                                         panel * 64),
              "r"(smemAddress(slice + r * C::kRowStride))
              : "memory");
        asm volatile("cp.async.bulk.commit_group;\n"
                     "cp.async.bulk.wait_group.read 0;\n" ::
                         : "memory");
        arrive(sliceBar(x, 1));
      }
      asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
      return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  }
  auto keySync = [] {
    if constexpr (C::kAdders)
      asm volatile("bar.sync 1, %0;\n" ::"n"(128 * WGS) : "memory");
    else
      __syncthreads();
  };
  // One commit group per tile slot, empty past the list, so that waiting for
  // all but the newest STAGES - 2 groups always means "tile it landed".
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < count)
      loadQueryTile(listAt(s) >> 1, s);
    cpAsyncCommit();
  }
  for (int it = 0; it < count; ++it) {
    const int cur = it % STAGES;
    cpAsyncWait<STAGES - 2>();
    tma::waitParity(bar0 + 8 * cur, (it / STAGES) & 1);
    wgmma::fenceProxyAsync();
    keySync();
    if (it + STAGES - 1 < count)
      loadQueryTile(listAt(it + STAGES - 1) >> 1, (it + STAGES - 1) % STAGES);
    cpAsyncCommit();
    const int entry = listAt(it);
    const int t = entry >> 1;
    const bool whole = entry & 1;
    const uint32_t qAddr = smemAddress(sQ + cur * MQ * D);
    const uint32_t doAddr = smemAddress(sdO + cur * MQ * D);
    // Descriptors' low words (wgmma::descLo): each k step adds bytes / 16.
    const uint32_t kLo = descLo(kAddr, 16), vLo = descLo(vAddr, 16),
                   qLo = descLo(qAddr, 16), doLo = descLo(doAddr, 16),
                   qMnLo = descLo(qAddr, MQ * 128),
                   doMnLo = descLo(doAddr, MQ * 128);
    const float *tLse = sLse + cur * MQ, *tDot = sDot + cur * MQ;
    const int *tLo = sLo + cur * MQ, *tHi = sHi + cur * MQ;

    // S^T = K Q^T and dP^T = V dO^T (64 keys x 64 rows), two groups.
    float st[MQ / 2], dpt[MQ / 2];
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      Wgmma<MQ>::ss(
          st, descOf<1024>(kLo + ((kk >> 2) * KT * 128 + (kk & 3) * 32) / 16),
          descOf<1024>(qLo + ((kk >> 2) * MQ * 128 + (kk & 3) * 32) / 16),
          kk > 0);
    wgmma::commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      Wgmma<MQ>::ss(
          dpt, descOf<1024>(vLo + ((kk >> 2) * KT * 128 + (kk & 3) * 32) / 16),
          descOf<1024>(doLo + ((kk >> 2) * MQ * 128 + (kk & 3) * 32) / 16),
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
    for (int ks = 0; ks < MQ / 16; ++ks)
      Wgmma<D>::rs(dv, pa[ks], descOf<1024>(doMnLo + ks * 16 * 128 / 16));
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
    for (int ks = 0; ks < MQ / 16; ++ks)
      Wgmma<D>::rs(dk, dsa[ks], descOf<1024>(qMnLo + ks * 16 * 128 / 16));
    wgmma::commit();

    if constexpr (DQ != BlockAttentionDq::OmitForTiming) {
      // dS^T [keys][rows] to shared memory (one 128B-swizzled panel of 64
      // rows per key) while dV / dK run.
#pragma unroll
      for (int j = 0; j < MQ / 8; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i)
          *reinterpret_cast<uint32_t *>(
              sdS + tileOffset<KT>(keyOff + 8 * i, j) + 2 * (lane & 3)) =
              dsa[j / 2][(j & 1) * 2 + i];
      if constexpr (DQ == BlockAttentionDq::BulkReduce) {
        // The stage is rewritten below: the last tile's reductions must have
        // read it (each issuing thread waits for its own group).
        if (tid < MQ)
          asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
      }
      wgmma::fenceProxyAsync();
      keySync();

      // dQ = dS K, one 64-column d panel at a time (WGS = 2: warpgroup w
      // takes panel w over the CTA's 128 keys; WGS = 1: both panels over its
      // 64 keys): A = dS^T read MN-major (rows contiguous), B = K's d panel
      // MN-major.
      const int rowBase = warp * 16 + lane / 4;
#pragma unroll
      for (int h = 0; h < 2 / WGS; ++h) {
        const int panel = WGS == 2 ? wg : h;
        const uint32_t kPanelLo =
            descLo(smemAddress(sK) + panel * KT * 128, KT * 128);
        const uint32_t dsLo = descLo(dsAddr, KT * 128);
        float dq[32];
        wgmma::fence();
#pragma unroll
        for (int ks = 0; ks < KT / 16; ++ks)
          wgmma::ssM64N64Transposed(dq, descOf<1024>(dsLo + ks * 16 * 128 / 16),
                                    descOf<1024>(kPanelLo + ks * 16 * 128 / 16),
                                    ks > 0);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::pin(dq);
        wgmma::pin(dk);
        wgmma::pin(dv);
        if constexpr (DQ == BlockAttentionDq::AtomicVec4) {
          // Lane pairs swap halves: the even lane of a pair then holds 4
          // consecutive columns of row lane/4, the odd lane 4 of row + 8.
          const bool odd = lane & 1;
          int row = t * MQ + rowBase + (odd ? 8 : 0);
          bool valid = row < totalRows;
          float *dst = args.dqAccum + (valid ? rowIndex(row) : 0) * D +
                       panel * 64 + 4 * ((lane & 3) >> 1);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            float s0 = odd ? dq[4 * j] : dq[4 * j + 2];
            float s1 = odd ? dq[4 * j + 1] : dq[4 * j + 3];
            float r0 = __shfl_xor_sync(0xffffffffu, s0, 1);
            float r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
            float4 v = odd ? make_float4(r0, r1, dq[4 * j + 2], dq[4 * j + 3])
                           : make_float4(dq[4 * j], dq[4 * j + 1], r0, r1);
            if (valid)
              atomicAdd(reinterpret_cast<float4 *>(dst + j * 8), v);
          }
        } else if constexpr (DQ == BlockAttentionDq::AtomicVec2) {
          // Each thread adds its own column pairs: twice the instructions of
          // AtomicVec4, but none waits on a shuffle.
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            int row = t * MQ + rowBase + 8 * i;
            if (row >= totalRows)
              continue;
            float *dst =
                args.dqAccum + rowIndex(row) * D + panel * 64 + 2 * (lane & 3);
#pragma unroll
            for (int j = 0; j < 8; ++j)
              atomicAdd(reinterpret_cast<float2 *>(dst + j * 8),
                        make_float2(dq[4 * j + 2 * i], dq[4 * j + 2 * i + 1]));
          }
        } else if constexpr (DQ == BlockAttentionDq::RowsVec4 || C::kAdders) {
          // A warp's fragment holds 16 rows x 64 columns, 32 bytes of each
          // row per instruction: the L2 takes one 32-byte request per row.
          // Through the warp's own slice of shared memory, each 16-byte
          // atomic instruction covers two whole 256-byte row segments
          // (bench/kernels/ReduceProbe.cu: 1.7x the adds per second where
          // the accumulator stays in L2, 1.3x where it does not).
          // (WGS = 1: both panels in turn through the same slice.)
          float *slice = sdQ + ((wg * 4 + warp) * 16) * C::kRowStride;
          if constexpr (C::kAdders) {
            if (it > 0) // the adder has read the previous tile's rows
              tma::waitParity(sliceBar(wg * 4 + warp, 1), (it - 1) & 1);
          } else {
            __syncwarp(); // the last reads of the slice are done
          }
#pragma unroll
          for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 8; ++j)
              *reinterpret_cast<float2 *>(slice +
                                          (lane / 4 + 8 * i) * C::kRowStride +
                                          8 * j + 2 * (lane & 3)) =
                  make_float2(dq[4 * j + 2 * i], dq[4 * j + 2 * i + 1]);
          if constexpr (C::kAdders) {
            // The bulk reductions read the slice through the async proxy.
            wgmma::fenceProxyAsync();
            arrive(sliceBar(wg * 4 + warp, 0));
            continue; // the adder warpgroup adds them
          }
          __syncwarp();
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            const int r = 2 * k + lane / 16, col = 4 * (lane & 15);
            const float4 v = *reinterpret_cast<const float4 *>(
                slice + r * C::kRowStride + col);
            const int row = t * MQ + warp * 16 + r;
            if (row < totalRows)
              atomicAdd(reinterpret_cast<float4 *>(args.dqAccum +
                                                   rowIndex(row) * D +
                                                   panel * 64 + col),
                        v);
          }
        } else if constexpr (DQ == BlockAttentionDq::BulkReduce) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            float *stage = sdQ + (rowBase + 8 * i) * C::kStageStride +
                           panel * 64 + 2 * (lane & 3);
#pragma unroll
            for (int j = 0; j < 8; ++j)
              *reinterpret_cast<float2 *>(stage + j * 8) =
                  make_float2(dq[4 * j + 2 * i], dq[4 * j + 2 * i + 1]);
          }
        }
      }
      if constexpr (DQ == BlockAttentionDq::BulkReduce) {
        // Generic-proxy stores, then the bulk copy engine reads: fence,
        // sync, one row (D fp32, contiguous in global memory) per thread.
        wgmma::fenceProxyAsync();
        __syncthreads();
        if (tid < MQ) {
          int row = t * MQ + tid;
          if (row < totalRows) {
            float *dst = args.dqAccum + rowIndex(row) * D;
            asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group."
                         "add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                         "r"(smemAddress(sdQ + tid * C::kStageStride)),
                         "n"(D * 4)
                         : "memory");
          }
          asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
      }
    } else {
      wgmma::wait<0>();
      wgmma::pin(dk);
      wgmma::pin(dv);
    }
  }
  cpAsyncWait<0>();
  if constexpr (DQ == BlockAttentionDq::BulkReduce) {
    if (tid < MQ)
      asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }

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
}

} // namespace detail

/// The (row, kv head) pairs whose key tiles the context kernel launches
/// together by default: at qwen3-8b-b16 shapes 8 pairs (192 CTAs, about 1.5
/// waves) beat 1, 2, 4, 6, 12, 16 and all 32 with the adder warpgroup
/// (NOTES.md, seventh session): fewer dQ accumulators live in L2 at once, yet
/// enough key tiles apart that their adds rarely meet in the same lines.
constexpr int kWgmmaBwdPairsPerGroup = 8;

/// Backward with the context kernel on wgmma (sm_90a): same arguments and
/// outputs as sm90_block_attention_bwd_bf16. DQ picks how the context kernel
/// adds into the dQ accumulator (rows restaged and added by a third
/// warpgroup measured fastest; then the key warps' own row atomics, 8-byte
/// atomics from the fragments, 16-byte ones after a lane exchange, bulk
/// reductions of staged tiles: bench/kernels/NOTES.md); the caller checks
/// that the shared memory fits (smemBytes); WGS the warpgroups of 64 keys
/// per CTA; WALK_DOWN walks query tiles from the last one down; GROUP the
/// (row, kv head) pairs whose key tiles run together (0: all); STAGES the Q
/// / dO buffers.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          BlockAttentionDq DQ = BlockAttentionDq::RowsByAdders, int WGS = 2,
          bool WALK_DOWN = true, int GROUP = kWgmmaBwdPairsPerGroup,
          int STAGES = 2>
void sm90a_block_attention_bwd_wgmma_bf16(const BlockAttentionBwdArgs &args,
                                          cudaStream_t stream) {
  static_assert(wgmmaBackwardSupports(D, BS, NH, NKV),
                "sm90a_block_attention_bwd_wgmma_bf16 needs head dim 128 and "
                "bs * (nh / nkv) dividing 64 or equal to 128; use "
                "sm90_block_attention_bwd_bf16 for other shapes");
  using C = detail::WgmmaBwdConfig<D, BS, NH, NKV, WGS, DQ, STAGES>;
  detail::launchBlockAttentionBwdDraft<D, BS, NH, NKV, WINDOW, CAUSAL>(args,
                                                                       stream);
  {
    auto kernel = detail::sm90a_block_attention_bwd_context_wgmma_bf16_kernel<
        D, BS, NH, NKV, WINDOW, CAUSAL, DQ, WGS, GROUP, WALK_DOWN, STAGES>;
    // Encoded per call on the host (a few microseconds; a captured graph
    // keeps them).
    constexpr uint32_t G = NH / NKV;
    const uint64_t Q = uint64_t(args.N) * BS;
    detail::WgmmaBwdMaps maps;
    maps.q = tma::bf16RowsOfHeadsMap(args.q, args.B, Q, NH, D, G, 64 / G,
                                     "q [B, Q, nh, d]");
    maps.dOut = tma::bf16RowsOfHeadsMap(args.dOut, args.B, Q, NH, D, G, 64 / G,
                                        "dOut [B, Q, nh, d]");
    size_t smem = C::smemBytes(args.N);
    DFLASH_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const int keyTiles = (args.S + C::kKeys - 1) / C::kKeys;
    kernel<<<keyTiles * args.B * NKV, C::kThreads, smem, stream>>>(args, maps);
    DFLASH_CUDA_CHECK_LAUNCH("sm90a_block_attention_bwd_context_wgmma_bf16");
  }
  detail::launchBlockAttentionBwdDq<D, BS, NH>(args, stream);
}

/// The backward the generated step calls: the wgmma context kernel where the
/// shape allows (wgmmaBackwardSupports), with its row stage and adder
/// warpgroup where N leaves room for them (else 8-byte atomics from the
/// fragments, all pairs at once as measured: the N dflashc
/// accepts, blockAttentionBwdSmemBytes), else the mma.sync backward. Same
/// outputs and workspace (blockAttentionBwdWorkspaceBytes).
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL>
void block_attention_bwd_bf16(const BlockAttentionBwdArgs &args,
                              cudaStream_t stream) {
  if constexpr (wgmmaBackwardSupports(D, BS, NH, NKV)) {
    if (wgmmaBwdRowStageFits(D, BS, NH, NKV, args.N))
      sm90a_block_attention_bwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(
          args, stream);
    else
      sm90a_block_attention_bwd_wgmma_bf16<D, BS, NH, NKV, WINDOW, CAUSAL,
                                           BlockAttentionDq::AtomicVec2, 2,
                                           true, 0>(args, stream);
  } else
    sm90_block_attention_bwd_bf16<D, BS, NH, NKV, WINDOW, CAUSAL>(args, stream);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_BLOCKATTENTIONBWDWGMMA_CUH
