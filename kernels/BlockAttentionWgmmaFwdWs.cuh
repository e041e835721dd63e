//===- BlockAttentionWgmmaFwdWs.cuh - Warp-specialised forward -*- CUDA -*-===//
//
// The attention forward (the arguments, outputs and numerics of
// kernels/BlockAttentionWgmmaFwd.cuh) organised as FlashAttention-3's, for
// rows whose blocks see long contexts:
// - one CTA per (row, kv head, pair of blocks) and per SM: a producer
//   warpgroup (one thread issues every TMA copy; 40 registers) and two
//   consumer warpgroups (232 registers, by setmaxnreg: ptxas allocates each
//   side within its count), one block of 64 query rows each;
// - context tiles of 128 keys (S = Q K^T by m64n128k16: half the shared
//   reads per product of the 64-key tiles, whose B operand is as large as A);
// - K and V in two stages each, with their own full (transaction) and empty
//   (the 8 consumer warps) barriers: a K stage is refilled once its scores
//   are formed, a V stage once its P V has finished;
// - inside a warpgroup, tile j's softmax runs under tile j-1's P V: S_j is
//   issued, then P_{j-1} V_{j-1}; S_j's exponentials are taken in place
//   while that product runs, and once it has finished O is rescaled by
//   tile j's alpha and P_j packed to bf16 (no register a wgmma reads is
//   written while one is in flight, else ptxas serialises them: C7513).
// - PINGPONG (FlashAttention-3's schedule between warpgroups; its entry
//   point block_attention_fwd_ws_pingpong_bf16 awaits its GPU test in
//   kUnvalidatedKernels): the two consumers take turns to issue
//   their tile's products, each handing the turn on by a named barrier once
//   they are issued, so that one's softmax runs while the other's products
//   hold the tensor cores.
// Tile 0 (Q and the CTA's draft keys) is attended as the other forward does.
// Needs bs * (nh / nkv) == 64 and d 64 or 128 (wgmmaForwardSupports).
// block_attention_fwd_ws_bf16 (BlockAttentionFwd.cuh) runs it where
// dflash-select-kernels picks it, for long contexts
// (warpSpecialisedForwardPays); AttentionGpuTest's BlockAttentionWgmmaWs
// cases validate it.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BLOCKATTENTIONWGMMAFWDWS_CUH
#define DFLASH_KERNELS_BLOCKATTENTIONWGMMAFWDWS_CUH

#include "kernels/BlockAttentionWgmmaFwd.cuh"

namespace dflash::kernels {

namespace detail {

/// Tiling of the warp-specialised forward: a producer and two consumer
/// warpgroups (a block each), 128 context keys per tile, two stages of K and
/// of V, one CTA per SM.
template <int D, int BS, int NH, int NKV> struct WgmmaFwdWsConfig {
  using T = BlockAttentionTiling<D, BS, NH, NKV>;
  static constexpr int kConsumers = 2;
  static_assert(D == 64 || D == 128, "wgmma forward: head dim 64 or 128");
  static_assert(T::kBlockRows == wgmma::kM,
                "wgmma forward: needs bs * (nh / nkv) == 64 query rows per "
                "block (one block per consumer warpgroup)");
  static_assert(T::kBlocksPerCta == kConsumers, "two blocks per CTA");
  static constexpr int KT = 128;
  static constexpr int kStages = 2;
  static constexpr int kRows = kConsumers * wgmma::kM;
  static constexpr int kThreads = (kConsumers + 1) * wgmma::kWarpgroupThreads;
  static constexpr int kConsumerWarps = kConsumers * wgmma::kWarpgroupWarps;
  static constexpr int kDraftKeys = roundUp(kConsumers * BS, 16);
  static_assert(kDraftKeys <= KT, "the draft keys fit one stage");
  static constexpr int kBufRows = KT;
  static constexpr size_t kQBytes = size_t(kRows) * D * 2;
  static constexpr size_t kBufBytes = size_t(kBufRows) * D * 2;
  // Q, two stages of K and of V, slack to align the base to a swizzle atom.
  static constexpr size_t kSmemBytes =
      kQBytes + 2 * kStages * kBufBytes + wgmma::kSwizzleAtomBytes;
  // ptxas allocates each side within its setmaxnreg count: the consumers'
  // O, S and the P in flight need more than the 168 of an even split.
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  static_assert(wgmma::kWarpgroupThreads * (kProducerRegisters +
                                            kConsumers * kConsumerRegisters) <=
                    kThreads * wgmma::launchRegistersPerThread(kThreads),
                "setmaxnreg only moves the registers the CTA was launched "
                "with");
};

/// What a consumer warpgroup needs to mask the tiles of its block (block n
/// of a row): the anchor, the first context key each of this thread's two
/// rows sees (rows warp * 16 + lane / 4 + 8 i of the block's G * BS), and
/// the range of first keys over the block's rows. `mine`: the block exists
/// and is kept; a warpgroup without one attends to nothing.
template <int BS, int G, int WINDOW> struct WgmmaBlockRows {
  bool mine;
  int anchor, blockLoMin, blockLoMax;
  int rowLo[2];

  __device__ __forceinline__ WgmmaBlockRows(const int32_t *anchors,
                                            const uint8_t *keep,
                                            const int32_t *positionIds, int n,
                                            bool exists, int warp, int lane) {
    mine = exists && keep[n];
    anchor = mine ? anchors[n] : 0;
    const int start = mine ? conversationStart(positionIds, anchor) : 0;
#pragma unroll
    for (int i = 0; i < 2; ++i)
      rowLo[i] =
          contextKeysBegin<WINDOW>(anchor, rowOfThread(i, warp, lane), start);
    blockLoMax = contextKeysBegin<WINDOW>(anchor, BS - 1, start);
    blockLoMin = contextKeysBegin<WINDOW>(anchor, 0, start);
  }
  /// The position in the block (k) of this thread's row i.
  static __device__ __forceinline__ int rowOfThread(int i, int warp, int lane) {
    return (warp * 16 + lane / 4 + 8 * i) / G;
  }
  /// Whether every row sees every key of [j0, j0 + NK): no mask.
  __device__ __forceinline__ bool seesWhole(int j0, int NK) const {
    return j0 >= blockLoMax && j0 + NK <= anchor;
  }
  /// Row i of this thread sees context key j.
  __device__ __forceinline__ bool seesContextKey(int i, int j) const {
    return (j >= rowLo[i]) & (j < anchor);
  }
  /// Row i sees draft key t of the CTA's draft tile, in which this block's
  /// keys are the `slot`-th run of BS.
  template <bool CAUSAL>
  __device__ __forceinline__ bool seesDraftKey(int i, int t, int slot, int warp,
                                               int lane) const {
    return (t / BS == slot) &
           (!CAUSAL | (t % BS <= rowOfThread(i, warp, lane)));
  }
};

/// Named barriers of the warp-specialised forward (bar.sync ids; 0 is
/// __syncthreads'): PINGPONG's turn of consumer 0 and of consumer 1.
enum class WgmmaFwdWsBarrier : int { Turn0 = 1, Turn1 = 2 };

/// The warp-specialised forward kernel. CLUSTER CTAs of adjacent block pairs
/// of one (row, kv head) walk the context tiles of all their blocks, each
/// tile's K copied by rank 0 and its V by the last rank into every CTA (TMA
/// multicast): the tiles cross from L2 once per cluster. PINGPONG: the
/// consumers issue their products in turns (file comment).
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL, int CLUSTER,
          bool PINGPONG>
static __global__ void
__launch_bounds__((WgmmaFwdWsConfig<D, BS, NH, NKV>::kThreads), 1)
    sm90a_block_attention_fwd_wgmma_ws_bf16_kernel(
        BlockAttentionFwdArgs args, const __grid_constant__ WgmmaFwdMaps maps) {
  using T = BlockAttentionTiling<D, BS, NH, NKV>;
  using C = WgmmaFwdWsConfig<D, BS, NH, NKV>;
  using namespace wgmma;
  constexpr int KT = C::KT, G = T::G, BR = C::kBufRows, NKD = C::kDraftKeys;
  constexpr int kRows = C::kRows, kStages = C::kStages;
  constexpr uint32_t kTileBytes = uint32_t(KT) * D * 2;
  constexpr uint32_t kDraftBytes = uint32_t(NKD) * D * 2;
  extern __shared__ unsigned char smemRaw[];
  // Per stage: K full, V full (transaction barriers), K empty, V empty
  // (one arrival per consumer warp).
  __shared__ __align__(8) uint64_t barriers[4 * kStages];
  unsigned char *smem = smemRaw + swizzleAtomPadding(smemRaw);
  bf16 *sQ = reinterpret_cast<bf16 *>(smem);
  // Shared addresses: Q, two stages of K [BR x D], two of V.
  const uint32_t qBase = smemAddress(smem);
  const uint32_t kBase = qBase + uint32_t(C::kQBytes);
  constexpr uint32_t kStageBytes = uint32_t(C::kBufBytes);
  const uint32_t vBase = kBase + kStages * kStageBytes;
  const uint32_t bar0 = smemAddress(&barriers[0]);
  enum Barrier { KFull, VFull, KEmpty, VEmpty };
  // The barrier of kind `kind` of tile it's stage, and the parity of the
  // phase that tile completes.
  auto barrierOf = [&](Barrier kind, int it) {
    return bar0 + tma::kBarrierBytes * (int(kind) * kStages + it % kStages);
  };
  auto phaseOf = [](int it) { return uint32_t(it / kStages) & 1u; };

  const int tid = threadIdx.x, warpgroup = tid / kWarpgroupThreads,
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
  const int rank = CLUSTER > 1 ? int(tma::clusterRank()) : 0;
  if constexpr (CLUSTER > 1) {
    // The cluster's context: its groups are blockIdx.y - rank + q.
    for (int q = 0; q < CLUSTER; ++q) {
      if (q == rank)
        continue; // this CTA's own, above
      const int nq = (gridDim.y - 1 - (blockIdx.y - rank + q)) * C::kConsumers;
      int loQ, hiQ;
      groupContextKeys<WINDOW>(anchors, keep, positionIds, nq,
                               min(C::kConsumers, N - nq), loQ, hiQ);
      lo = min(lo, loQ);
      hi = max(hi, hiQ);
    }
  }
  const int numTiles = 1 + (hi > lo ? (hi - lo + KT - 1) / KT : 0);

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::barrierInit(barrierOf(KFull, s), 1);
      tma::barrierInit(barrierOf(VFull, s), 1);
      // Every CTA's consumers read a multicast stage.
      tma::barrierInit(barrierOf(KEmpty, s), C::kConsumerWarps * CLUSTER);
      tma::barrierInit(barrierOf(VEmpty, s), C::kConsumerWarps * CLUSTER);
    }
    tma::fenceBarrierInit();
  }
  // A peer's first multicast may land as soon as the barriers exist.
  if constexpr (CLUSTER > 1)
    tma::clusterSync();
  else
    __syncthreads();

  if (warpgroup == 0) {
    // The producer: tile 0 (Q, draft keys and values into stage 0), then
    // every context tile's K and V, each into its stage once the consumers
    // (of every CTA of the cluster) have released that stage's previous
    // tile. In a cluster each CTA expects every tile's bytes on its own
    // barriers; rank 0 copies K and the last rank V into all of them.
    decreaseRegisters<C::kProducerRegisters>();
    if (tid == 0) {
      tma::arriveExpectTx(barrierOf(KFull, 0),
                          uint32_t(C::kQBytes) + kDraftBytes);
      tma::arriveExpectTx(barrierOf(VFull, 0), kDraftBytes);
      issueQueryAndDraftTile<D, BS, G, C::kConsumers, BR>(
          qBase, kBase, vBase, maps, barrierOf(KFull, 0), barrierOf(VFull, 0),
          g, nFirst, b);
      constexpr uint16_t kAll = uint16_t((1u << CLUSTER) - 1);
      // Tile it of `map` (K or V) into its stage of `base`, once the stage's
      // previous tile is released; in a cluster, rank `copier` copies it
      // into every CTA.
      auto copyTile = [&](Barrier full, Barrier empty, uint32_t base,
                          const CUtensorMap *map, int copier, int it) {
        const int j0 = lo + (it - 1) * KT;
        const uint32_t off = uint32_t(it % kStages) * kStageBytes;
        if (it >= kStages)
          tma::waitParity(barrierOf(empty, it), phaseOf(it - kStages));
        tma::arriveExpectTx(barrierOf(full, it), kTileBytes);
#pragma unroll
        for (int p = 0; p < D / kPanelCols; ++p) {
          const uint32_t dst = base + off + p * BR * kSwizzleRowBytes;
          if constexpr (CLUSTER == 1)
            tma::load4d(dst, map, barrierOf(full, it), p * kPanelCols, g, j0,
                        b);
          else if (rank == copier)
            tma::load4dMulticast(dst, map, barrierOf(full, it), p * kPanelCols,
                                 g, j0, b, kAll);
        }
      };
      for (int it = 1; it < numTiles; ++it) {
        copyTile(KFull, KEmpty, kBase, &maps.contextKeys, 0, it);
        copyTile(VFull, VEmpty, vBase, &maps.contextValues, CLUSTER - 1, it);
      }
    }
    // No CTA leaves while a peer may still arrive on its barriers.
    if constexpr (CLUSTER > 1)
      tma::clusterSync();
    return;
  }

  // A consumer: block nFirst + wg. Every warp waits for every tile's K and
  // V, seen or not, before releasing them: a stage is refilled only after
  // its copy has landed.
  increaseRegisters<C::kConsumerRegisters>();
  const int wg = warpgroup - 1;
  const WgmmaBlockRows<BS, G, WINDOW> rows(
      anchors, keep, positionIds, nFirst + wg, wg < nCount, warp, lane);
  auto waitFull = [&](Barrier kind, int it) {
    tma::waitParity(barrierOf(kind, it), phaseOf(it));
  };
  // Lane r arrives on CTA r's barrier (in a cluster, every CTA's producer
  // waits for every CTA's consumers).
  auto release = [&](Barrier kind, int it) {
    __syncwarp();
    if constexpr (CLUSTER == 1) {
      if (lane == 0)
        tma::arrive(barrierOf(kind, it));
    } else if (lane < CLUSTER) {
      tma::arriveInCta(barrierOf(kind, it), uint32_t(lane));
    }
  };
  auto vAddrOf = [&](int it) {
    return vBase + uint32_t(it % kStages) * kStageBytes;
  };
  // PINGPONG: every context tile (seen, or waited for and released) is one
  // turn of each consumer, so both take numTiles - 1 turns; consumer 1 hands
  // the first turn to consumer 0, which takes one more at the end so that no
  // arrival is left on a barrier.
  constexpr int kConsumerThreads = C::kConsumers * kWarpgroupThreads;
  const int myTurn = int(wg == 0 ? WgmmaFwdWsBarrier::Turn0
                                 : WgmmaFwdWsBarrier::Turn1),
            otherTurn = int(wg == 0 ? WgmmaFwdWsBarrier::Turn1
                                    : WgmmaFwdWsBarrier::Turn0);
  auto awaitTurn = [&] {
    if constexpr (PINGPONG)
      namedBarrierSync<kConsumerThreads>(myTurn);
  };
  auto passTurn = [&] {
    if constexpr (PINGPONG)
      namedBarrierArrive<kConsumerThreads>(otherTurn);
  };
  if (wg == 1)
    passTurn();

  float o[D / 2], m[2], l[2];
  wgmmaClearRows<D>(o, m, l);
  const uint32_t qAddr = qBase + wg * kM * kSwizzleRowBytes;
  const uint32_t qLo = descLo(qAddr, kKMajorLbo);
  waitFull(KFull, 0);
  waitFull(VFull, 0);
  if (rows.mine) {
    auto visible = [&](int i, int t) {
      return rows.template seesDraftKey<CAUSAL>(i, t, wg, warp, lane);
    };
    wgmmaAttendTile<D, NKD, kRows, BR>(qAddr, kBase, vBase, o, m, l,
                                       T::kScaleLog2, false, visible, lane);
  }
  release(KEmpty, 0);
  release(VEmpty, 0);

  // The tiles this block sees are one run [first, last] of the CTA's (its
  // context is one interval of keys); every other tile is waited for and
  // released. Inside the run a P V is always in flight across a softmax,
  // with no branch around the products: ptxas serialises wgmma that a
  // divergent path could reach with registers in use (C7518 / C7520).
  int first = numTiles, last = numTiles - 1;
  if (rows.mine) {
    first = 1 + (rows.blockLoMin - lo) / KT;
    last = min(numTiles - 1, (rows.anchor - lo + KT - 1) / KT);
  }
  auto skip = [&](int it) {
    waitFull(KFull, it);
    release(KEmpty, it);
    waitFull(VFull, it);
    release(VEmpty, it);
    awaitTurn();
    passTurn();
  };
  // S = Q K^T of tile it, issued (one commit group).
  auto issueScores = [&](float (&s)[KT / 2], int it) {
    const uint32_t kLo =
        descLo(kBase + uint32_t(it % kStages) * kStageBytes, kKMajorLbo);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      Wgmma<KT, Major::K, Major::K>::ss(s, descOf(qLo + kMajorStep(kk, kRows)),
                                        descOf(kLo + kMajorStep(kk, BR)),
                                        kk > 0);
    commit();
  };
  // The online softmax of tile it's scores, in place (O untouched: alpha
  // says how to rescale it).
  auto softmax = [&](float (&s)[KT / 2], int it, float (&alpha)[2]) {
    const int j0 = lo + (it - 1) * KT;
    auto visible = [&](int i, int t) { return rows.seesContextKey(i, j0 + t); };
    return wgmmaSoftmax<KT>(s, m, l, alpha, T::kScaleLog2,
                            rows.seesWhole(j0, KT), visible, lane);
  };
  auto rescale = [&](const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i)
      o[i] *= alpha[i & 2 ? 1 : 0];
  };

  for (int it = 1; it < first; ++it)
    skip(it);
  if (first <= last) {
    // P (bf16) of the tile whose P V is still to be issued, packed once the
    // P V before it has finished.
    uint32_t pa[KT / 16][4];
    {
      float s[KT / 2], alpha[2];
      waitFull(KFull, first);
      awaitTurn();
      pin(o);
      fence();
      issueScores(s, first);
      passTurn();
      wait<0>();
      pin(s);
      release(KEmpty, first);
      if (softmax(s, first, alpha))
        rescale(alpha);
      packScores<KT>(s, pa);
    }
    for (int it = first + 1; it <= last; ++it) {
      float s[KT / 2], alpha[2];
      waitFull(KFull, it);
      waitFull(VFull, it - 1);
      awaitTurn();
      pin(o);
      fence();
      issueScores(s, it);
      issuePV<D, KT, BR>(pa, vAddrOf(it - 1), o);
      passTurn();
      wait<1>();
      pin(s);
      release(KEmpty, it);
      const bool moved = softmax(s, it, alpha);
      wait<0>();
      pin(o);
      release(VEmpty, it - 1);
      if (moved)
        rescale(alpha);
      packScores<KT>(s, pa);
    }
    waitFull(VFull, last);
    pin(o);
    fence();
    issuePV<D, KT, BR>(pa, vAddrOf(last), o);
    wait<0>();
    pin(o);
    release(VEmpty, last);
  }
  for (int it = max(first, last + 1); it < numTiles; ++it)
    skip(it);

  if (wg < nCount)
    wgmmaStoreBlock<D, BS, NH, NKV, kRows>(args, o, m, l, sQ, wg * kM, b, g,
                                           nFirst + wg, warp, lane);
  if (wg == 0)
    awaitTurn(); // consumer 1's last hand-over
  if constexpr (CLUSTER > 1)
    tma::clusterSync();
}

} // namespace detail

/// The warp-specialised forward (sm_90a): same arguments and outputs as
/// sm90a_block_attention_fwd_wgmma_bf16. CLUSTER: block pairs whose CTAs
/// share each context tile by multicast (1: none; 2 is a measured
/// alternative that lost: docs/kernels.md). PINGPONG: the consumers issue
/// their products in turns (not yet run on a GPU; selectable once its GPU
/// test has passed).
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          int CLUSTER = 1, bool PINGPONG = false>
void sm90a_block_attention_fwd_wgmma_ws_bf16(const BlockAttentionFwdArgs &args,
                                             cudaStream_t stream) {
  detail::launchWgmmaForward<D, BS, NH, NKV,
                             detail::WgmmaFwdWsConfig<D, BS, NH, NKV>, CLUSTER>(
      detail::sm90a_block_attention_fwd_wgmma_ws_bf16_kernel<
          D, BS, NH, NKV, WINDOW, CAUSAL, CLUSTER, PINGPONG>,
      args, stream);
  DFLASH_CUDA_CHECK_LAUNCH("sm90a_block_attention_fwd_wgmma_ws_bf16");
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_BLOCKATTENTIONWGMMAFWDWS_CUH
