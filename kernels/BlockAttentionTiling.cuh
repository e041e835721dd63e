//===- BlockAttentionTiling.cuh - Attention rows and tiles -----*- CUDA -*-===//
//
// What every attention kernel (mma.sync and wgmma, forward and backward)
// agrees on: how the query rows of one (row, kv head) are numbered and cut
// into CTA tiles (GQA packing: the nh / nkv heads of a kv head share its
// keys, so a block of bs positions is bs * nh / nkv query rows), the softmax
// scale, and which context keys a group of blocks or a query tile sees
// (from the anchors, the window and, in a packed row, the conversations).
// docs/kernels.md describes the kernels built on it.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BLOCKATTENTIONTILING_CUH
#define DFLASH_KERNELS_BLOCKATTENTIONTILING_CUH

#include "kernels/AttentionLimits.h"
#include "kernels/BlockAttentionArgs.h"
#include "kernels/CudaCheck.cuh"
#include "kernels/WarpMma.cuh"

#include <climits>
#include <cstddef>
#include <cstdint>

namespace dflash::kernels::detail {

constexpr int constMin(int a, int b) { return a < b ? a : b; }
constexpr int roundUp(int x, int m) { return (x + m - 1) / m * m; }

/// The softmax scale 1 / sqrt(d), as a float, of every head dim an
/// attention kernel takes (the drafter's 64 and 128, the targets' 256 too).
/// A head dim without an entry here is a compile error, never a wrong scale.
template <int D> constexpr float attentionScaleOfHeadDim() {
  static_assert(D == 64 || D == 128 || D == 256,
                "softmax scale: head dim 64, 128 or 256");
  return D == 64 ? 0.125f : D == 128 ? 0.08838834764831845f : 0.0625f;
}
template <int D>
constexpr float kBlockAttentionScale = attentionScaleOfHeadDim<D>();

/// How the query rows of one (row, kv head) are cut into CTA tiles. Query
/// rows are numbered r = (n * bs + k) * G + hh (block, row in block, head in
/// the GQA group).
template <int D, int BS, int NH, int NKV> struct BlockAttentionTiling {
  static_assert(blockAttentionSupportsHeadDim(D), "head dim must be 64 or 128");
  static_assert(NH % NKV == 0, "num_heads must be a multiple of num_kv_heads");
  static constexpr int G = NH / NKV;
  static constexpr int kBlockRows = BS * G;
  static_assert(blockAttentionSupportsBlockRows(kBlockRows),
                "bs * (nh / nkv) must be at most 64 rows, or 128");
  static_assert(BS <= kBlockAttentionMaxBlockSize, "block size above 64");

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
  static constexpr int kBwdRows =
      kBlockRows <= 64 ? (64 / kBlockRows) * kBlockRows : 64;
  static constexpr int kBwdPadRows = roundUp(kBwdRows, 16);

  static constexpr float kScale = kBlockAttentionScale<D>;
  static constexpr float kLog2e = 1.4426950408889634f;
  static constexpr float kScaleLog2 = kScale * kLog2e;
  /// ln 2: the softmax runs in log2 units, lse is stored in natural ones.
  static constexpr float kLn2 = 0.6931471805599453f;
};

/// Shared-memory row stride (fp32) of a staged 64-row dQ tile that bulk
/// reductions read (BlockAttentionDq::BulkReduce): padded by 16 bytes so
/// that the C-fragment stores of 8 rows hit 8 bank groups.
template <int D> constexpr int dqStageStride() { return D + 4; }

/// The first context key of block n's conversation (docs/semantics.md section
/// 9): anchor - position_ids[anchor] of its row; 0 in an unpacked row.
/// positionIds points at the row.
__device__ __forceinline__ int conversationStart(const int32_t *positionIds,
                                                 int anchor) {
  return anchor - positionIds[anchor];
}

/// The first context key that row k of a block anchored at `anchor`, whose
/// conversation starts at `start`, sees: the conversation's start, or the
/// sliding window's, whichever is later.
template <int WINDOW>
__device__ __forceinline__ int contextKeysBegin(int anchor, int k, int start) {
  return WINDOW > 0 ? max(start, anchor + k - (WINDOW - 1)) : start;
}

/// The context keys that any row of blocks [nFirst, nFirst + nCount) may
/// see: [lo, hi); hi <= lo when no block is kept. anchors, keep and
/// positionIds point at the row.
template <int WINDOW>
__device__ __forceinline__ void
groupContextKeys(const int32_t *anchors, const uint8_t *keep,
                 const int32_t *positionIds, int nFirst, int nCount, int &lo,
                 int &hi) {
  lo = INT_MAX;
  hi = 0;
  for (int p = 0; p < nCount; ++p) {
    if (!keep[nFirst + p])
      continue;
    int a = anchors[nFirst + p];
    lo = min(lo,
             contextKeysBegin<WINDOW>(a, 0, conversationStart(positionIds, a)));
    hi = max(hi, a);
  }
}

/// Backward, key-tile major: whether the query tile t (rows [t MQ, (t+1) MQ)
/// of blocks of blockRows rows) sees any context key of [j0, j0 + KT), and
/// whether all of its rows see all of them (no masking needed: every block
/// kept, the tile unpadded and not past the last row). sAnchor[n] < 0 marks
/// a dropped block; sStart[n] is block n's conversationStart.
template <int BS, int WINDOW>
__device__ __forceinline__ void
queryTileSeesKeys(int t, int MQ, int blockRows, int N, int totalRows,
                  bool unpadded, const int *sAnchor, const int *sStart, int j0,
                  int KT, bool &seen, bool &whole) {
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
    int loN = contextKeysBegin<WINDOW>(a, 0, sStart[n]);
    seen |= a > j0 && loN < j0 + KT;
    aMin = min(aMin, a);
    loMax = max(loMax, contextKeysBegin<WINDOW>(a, BS - 1, sStart[n]));
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
                         const int *sStart, int j0, int KT, int *sCount,
                         int *sList) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int count = 0;
  for (int base = 0; base < numQueryTiles; base += WARPS * 32) {
    int t = base + threadIdx.x;
    bool seen = false, whole = false;
    if (t < numQueryTiles)
      queryTileSeesKeys<BS, WINDOW>(t, MQ, blockRows, N, totalRows, unpadded,
                                    sAnchor, sStart, j0, KT, seen, whole);
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

} // namespace dflash::kernels::detail

#endif // DFLASH_KERNELS_BLOCKATTENTIONTILING_CUH
