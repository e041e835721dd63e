//===- BlockAttentionWgmmaBwdDq.cuh - wgmma dQ adds ------------*- CUDA -*-===//
//
// How the wgmma context kernel (kernels/BlockAttentionWgmmaBwd.cuh) adds a
// query tile's dQ = dS K into the fp32 accumulator, as policies: types with
// static device functions that the kernel calls at fixed points of a tile.
// The policy of mode DQ is WgmmaBwdDqAdd<DQ>: block_attention_bwd_bf16 runs
// RowsByAdders (or AtomicVec2 where N leaves no room for the row stage);
// RowsVec4, AtomicVec4 and BulkReduce are measured alternatives that
// AttentionGpuTest keeps correct. Policies that only time the others live in
// bench/kernels/WgmmaBwdDqTiming.cuh.
//
// A warp's dQ fragment holds 16 rows x 64 columns, 32 bytes of each row per
// instruction, and the L2 takes one request per 32-byte sector: restaging
// the rows in shared memory lets one 16-byte atomic (or one bulk reduction)
// cover whole 256-byte row segments (docs/kernels.md).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BLOCKATTENTIONWGMMABWDDQ_CUH
#define DFLASH_KERNELS_BLOCKATTENTIONWGMMABWDDQ_CUH

#include "kernels/BlockAttentionTiling.cuh"
#include "kernels/Tma.cuh"
#include "kernels/Wgmma.cuh"

namespace dflash::kernels {

namespace detail {

/// One thread's share of a 64-row x 64-column dQ panel (the accumulators of
/// wgmma m64n64).
using WgmmaDqPanel = float[wgmma::kPanelCols / 2];

/// Where the context kernel's dQ adds go, and which thread adds.
struct WgmmaBwdDqTarget {
  /// The kernel's operands: args.dqAccum is the fp32 accumulator.
  const BlockAttentionBwdArgs &args;
  float *stage;  ///< the policy's fp32 stage in shared memory (kStage)
  int totalRows; ///< query rows of one (row, kv head)
  int tid, wg, warp, lane;
};

/// The query tile a dQ add step is for.
struct WgmmaBwdDqTile {
  int t;       ///< rows [t * 64, t * 64 + 64) of the (row, kv head)
  int it;      ///< its place in the CTA's walk
  int rowBase; ///< this thread's first fragment row: warp * 16 + lane / 4
};

/// What every hook does unless a policy says otherwise: no stage, no adder
/// warps, nothing before or after a tile's panels.
///
/// The hooks, in the order the kernel calls them (C: its WgmmaBwdConfig):
///   initBarriers(stage)               thread 0, before the CTA's first sync
///   runAdders<C>(to, count, listAt, rowIndex)   the adder warpgroup's whole
///                                     work (kAdderWarps > 0 only)
///   reclaimStage<C>(tid)              before the dS^T barrier of each tile
///   addPanel<C>(dq, to, tile, panel, rowIndex)   each 64-column d panel
///   finishTile<C>(to, tile, rowIndex) after a tile's panels
///   drain<C>(tid)                     after the walk
struct WgmmaBwdDqAddBase {
  static constexpr WgmmaDqStage kStage = WgmmaDqStage::None;
  /// Warps beside the key warpgroups that only add (a third warpgroup).
  static constexpr int kAdderWarps = 0;
  /// Registers per thread of the key warpgroups and of the adders after
  /// setmaxnreg (0: no split).
  static constexpr int kKeyRegisters = 0, kAdderRegisters = 0;
  /// Whether the kernel stores dS^T and forms dQ = dS K at all.
  static constexpr bool kDqProduct = true;

  static __device__ __forceinline__ void initBarriers(float *) {}
  template <class C, class ListAt, class RowIndex>
  static __device__ __forceinline__ void
  runAdders(const WgmmaBwdDqTarget &, int, const ListAt &, const RowIndex &) {}
  template <class C> static __device__ __forceinline__ void reclaimStage(int) {}
  template <class C, class RowIndex>
  static __device__ __forceinline__ void
  addPanel(const WgmmaDqPanel &, const WgmmaBwdDqTarget &,
           const WgmmaBwdDqTile &, int, const RowIndex &) {}
  template <class C, class RowIndex>
  static __device__ __forceinline__ void finishTile(const WgmmaBwdDqTarget &,
                                                    const WgmmaBwdDqTile &,
                                                    const RowIndex &) {}
  template <class C> static __device__ __forceinline__ void drain(int) {}
};

/// This warp's fragment rows (16 x 64 fp32) into its own slice of the row
/// stage, [16][kWgmmaDqRowStride] (8 floats of padding: the 8-byte stores
/// are free of bank conflicts).
__device__ __forceinline__ void
storeWarpRows(float *slice, const WgmmaDqPanel &dq, int lane) {
  constexpr int kStride = int(kWgmmaDqRowStride);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j)
      *reinterpret_cast<float2 *>(slice + (lane / 4 + 8 * i) * kStride + 8 * j +
                                  2 * (lane & 3)) =
          make_float2(dq[4 * j + 2 * i], dq[4 * j + 2 * i + 1]);
}

/// This warp's slice of the row stage (WGS = 1: both panels in turn through
/// the same slice).
__device__ __forceinline__ float *warpRowSlice(const WgmmaBwdDqTarget &to) {
  return to.stage + ((to.wg * wgmma::kWarpgroupWarps + to.warp) * 16) *
                        int(kWgmmaDqRowStride);
}

/// The dQ-add policy of each BlockAttentionDq mode.
template <BlockAttentionDq DQ> struct WgmmaBwdDqAdd;

/// 16-byte atomics from the fragments: lane pairs swap halves, so the even
/// lane of a pair holds 4 consecutive columns of row lane/4, the odd lane 4
/// of row + 8.
template <>
struct WgmmaBwdDqAdd<BlockAttentionDq::AtomicVec4> : WgmmaBwdDqAddBase {
  template <class C, class RowIndex>
  static __device__ __forceinline__ void
  addPanel(const WgmmaDqPanel &dq, const WgmmaBwdDqTarget &to,
           const WgmmaBwdDqTile &tile, int panel, const RowIndex &rowIndex) {
    const int lane = to.lane;
    const bool odd = lane & 1;
    int row = tile.t * C::kRows + tile.rowBase + (odd ? 8 : 0);
    bool valid = row < to.totalRows;
    float *dst = to.args.dqAccum + (valid ? rowIndex(row) : 0) * C::kD +
                 panel * wgmma::kPanelCols + 4 * ((lane & 3) >> 1);
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
  }
};

/// 8-byte atomics of each thread's own column pairs: twice the instructions
/// of AtomicVec4, but none waits on a shuffle. No stage: the N that dflashc
/// accepts (blockAttentionBwdSmemBytes) is sized with this policy.
template <>
struct WgmmaBwdDqAdd<BlockAttentionDq::AtomicVec2> : WgmmaBwdDqAddBase {
  template <class C, class RowIndex>
  static __device__ __forceinline__ void
  addPanel(const WgmmaDqPanel &dq, const WgmmaBwdDqTarget &to,
           const WgmmaBwdDqTile &tile, int panel, const RowIndex &rowIndex) {
    const int lane = to.lane;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int row = tile.t * C::kRows + tile.rowBase + 8 * i;
      if (row >= to.totalRows)
        continue;
      float *dst = to.args.dqAccum + rowIndex(row) * C::kD +
                   panel * wgmma::kPanelCols + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        atomicAdd(reinterpret_cast<float2 *>(dst + j * 8),
                  make_float2(dq[4 * j + 2 * i], dq[4 * j + 2 * i + 1]));
    }
  }
};

/// The rows restaged in the warp's slice, then 16-byte atomics by the key
/// warps themselves, each covering two whole 256-byte row segments.
template <>
struct WgmmaBwdDqAdd<BlockAttentionDq::RowsVec4> : WgmmaBwdDqAddBase {
  static constexpr WgmmaDqStage kStage = WgmmaDqStage::WarpRows;

  template <class C, class RowIndex>
  static __device__ __forceinline__ void
  addPanel(const WgmmaDqPanel &dq, const WgmmaBwdDqTarget &to,
           const WgmmaBwdDqTile &tile, int panel, const RowIndex &rowIndex) {
    constexpr int kStride = int(kWgmmaDqRowStride);
    const int lane = to.lane;
    float *slice = warpRowSlice(to);
    __syncwarp(); // the last reads of the slice are done
    storeWarpRows(slice, dq, lane);
    __syncwarp();
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int r = 2 * k + lane / 16, col = 4 * (lane & 15);
      const float4 v =
          *reinterpret_cast<const float4 *>(slice + r * kStride + col);
      const int row = tile.t * C::kRows + to.warp * 16 + r;
      if (row < to.totalRows)
        atomicAdd(reinterpret_cast<float4 *>(to.args.dqAccum +
                                             rowIndex(row) * C::kD +
                                             panel * wgmma::kPanelCols + col),
                  v);
    }
  }
};

/// RowsVec4's restaged rows added by a third warpgroup that holds no keys
/// (kAdderWarps warps, two key warps' slices each), by one 256-byte bulk
/// reduction per slice row, while the key warpgroups go on with the next
/// tile. Each key warp's slice has a "full" barrier (the key warp's 32
/// lanes arrive) and an "empty" one (the 16 adder lanes of its rows arrive
/// once their reductions have read it) in its padding: row 0, columns 64-67.
/// FlashAttention-3's register split moves the adders' registers to the key
/// warpgroups.
template <>
struct WgmmaBwdDqAdd<BlockAttentionDq::RowsByAdders> : WgmmaBwdDqAddBase {
  static constexpr WgmmaDqStage kStage = WgmmaDqStage::WarpRows;
  static constexpr int kAdderWarps = int(kWgmmaBwdAdderWarps);
  static constexpr int kKeyRegisters = 240, kAdderRegisters = 24;
  static_assert(kAdderWarps == wgmma::kWarpgroupWarps,
                "setmaxnreg moves registers of whole warpgroups");
  /// Slices per adder warp (lanes 0-15 add one, 16-31 the other).
  static constexpr int kSlicesPerAdderWarp = 2;
  static constexpr int kSliceRows = 16;
  static_assert(kSlicesPerAdderWarp * kSliceRows == wgmma::kWarpThreads,
                "one adder lane per slice row");

  /// Shared address of slice x's barrier (0: full, 1: empty).
  static __device__ __forceinline__ uint32_t sliceBarrier(float *stage, int x,
                                                          int which) {
    return smemAddress(stage + (x * kSliceRows) * int(kWgmmaDqRowStride) +
                       wgmma::kPanelCols + 2 * which);
  }

  static __device__ __forceinline__ void initBarriers(float *stage) {
    for (int x = 0; x < kSlicesPerAdderWarp * kAdderWarps; ++x) {
      tma::barrierInit(sliceBarrier(stage, x, 0), wgmma::kWarpThreads);
      tma::barrierInit(sliceBarrier(stage, x, 1), kSliceRows);
    }
  }

  /// Adder lane l: row l % 16 of slice 2 warp + l / 16 of every tile.
  template <class C, class ListAt, class RowIndex>
  static __device__ __forceinline__ void
  runAdders(const WgmmaBwdDqTarget &to, int count, const ListAt &listAt,
            const RowIndex &rowIndex) {
    constexpr int kKeyWarps = wgmma::kWarpgroupWarps;
    const int x = kSlicesPerAdderWarp * to.warp + to.lane / kSliceRows,
              r = to.lane % kSliceRows;
    const int panel = x / kKeyWarps, w = x % kKeyWarps;
    const float *slice = to.stage + (x * kSliceRows) * int(kWgmmaDqRowStride);
    for (int it = 0; it < count; ++it) {
      const int row0 = (listAt(it) >> 1) * C::kRows + w * kSliceRows;
      tma::waitParity(sliceBarrier(to.stage, x, 0), it & 1);
      if (row0 + r < to.totalRows)
        tma::bulkReduceAddF32<wgmma::kPanelCols * 4>(
            to.args.dqAccum + rowIndex(row0 + r) * C::kD +
                panel * wgmma::kPanelCols,
            smemAddress(slice + r * int(kWgmmaDqRowStride)));
      tma::bulkCommit();
      tma::bulkWaitRead<0>();
      tma::arrive(sliceBarrier(to.stage, x, 1));
    }
    tma::bulkWait<0>();
  }

  template <class C, class RowIndex>
  static __device__ __forceinline__ void
  addPanel(const WgmmaDqPanel &dq, const WgmmaBwdDqTarget &to,
           const WgmmaBwdDqTile &tile, int, const RowIndex &) {
    const int x = to.wg * wgmma::kWarpgroupWarps + to.warp;
    float *slice = warpRowSlice(to);
    if (tile.it > 0) // the adders have read the previous tile's rows
      tma::waitParity(sliceBarrier(to.stage, x, 1), (tile.it - 1) & 1);
    storeWarpRows(slice, dq, to.lane);
    // The bulk reductions read the slice through the async proxy.
    tma::fenceProxyAsync();
    tma::arrive(sliceBarrier(to.stage, x, 0));
  }
};

/// The whole 64-row tile staged [64][d + 4], then one bulk reduction of d
/// fp32 per row from the first 64 threads.
template <>
struct WgmmaBwdDqAdd<BlockAttentionDq::BulkReduce> : WgmmaBwdDqAddBase {
  static constexpr WgmmaDqStage kStage = WgmmaDqStage::Tile;

  /// The stage is rewritten this tile: the last tile's reductions must have
  /// read it (each issuing thread waits for its own group).
  template <class C>
  static __device__ __forceinline__ void reclaimStage(int tid) {
    if (tid < C::kRows)
      tma::bulkWaitRead<0>();
  }

  template <class C, class RowIndex>
  static __device__ __forceinline__ void
  addPanel(const WgmmaDqPanel &dq, const WgmmaBwdDqTarget &to,
           const WgmmaBwdDqTile &tile, int panel, const RowIndex &) {
    constexpr int kStride = dqStageStride<C::kD>();
    const int lane = to.lane;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float *stage = to.stage + (tile.rowBase + 8 * i) * kStride +
                     panel * wgmma::kPanelCols + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        *reinterpret_cast<float2 *>(stage + j * 8) =
            make_float2(dq[4 * j + 2 * i], dq[4 * j + 2 * i + 1]);
    }
  }

  /// Generic-proxy stores, then the bulk copy engine reads: fence, sync, one
  /// row (d fp32, contiguous in global memory) per thread.
  template <class C, class RowIndex>
  static __device__ __forceinline__ void finishTile(const WgmmaBwdDqTarget &to,
                                                    const WgmmaBwdDqTile &tile,
                                                    const RowIndex &rowIndex) {
    tma::fenceProxyAsync();
    __syncthreads();
    if (to.tid < C::kRows) {
      int row = tile.t * C::kRows + to.tid;
      if (row < to.totalRows)
        tma::bulkReduceAddF32<C::kD * 4>(
            to.args.dqAccum + rowIndex(row) * C::kD,
            smemAddress(to.stage + to.tid * dqStageStride<C::kD>()));
      tma::bulkCommit();
    }
  }

  template <class C> static __device__ __forceinline__ void drain(int tid) {
    if (tid < C::kRows)
      tma::bulkWait<0>();
  }
};

} // namespace detail

// The policies are template arguments of sm90a_block_attention_bwd_wgmma_bf16.
using detail::WgmmaBwdDqAdd;
using detail::WgmmaBwdDqAddBase;
using detail::WgmmaBwdDqTarget;

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_BLOCKATTENTIONWGMMABWDDQ_CUH
