//===- BlockAttentionMmaSyncBwd.cuh - Backward, mma.sync -------*- CUDA -*-===//
//
// The attention backward with its context kernel (launch 2) on warp MMA
// (mma.sync m16n8k16, ldmatrix, cp.async; the dQ adds are sm_90 vector
// atomics or bulk reductions), FlashAttention-2's structure, key-tile major:
// one CTA per (row, kv head, 128 context keys) walks every 64-row query
// tile whose blocks see the tile, accumulating dK / dV in registers (each
// warp 16 keys) and adding dQ into the fp32 accumulator (DQ: staged in
// shared memory, one cp.reduce.async.bulk per row; or 16-byte atomics from
// the fragments). Launches 1 and 3 are
// kernels/BlockAttentionMmaSyncBwdDraft.cuh. It runs every shape the wgmma
// backward (kernels/BlockAttentionWgmmaBwd.cuh) does not; docs/kernels.md has
// its tiling and numbers.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BLOCKATTENTIONMMASYNCBWD_CUH
#define DFLASH_KERNELS_BLOCKATTENTIONMMASYNCBWD_CUH

#include "kernels/BlockAttentionMmaSyncBwdDraft.cuh"
#include "kernels/BlockAttentionTiling.cuh"
#include "kernels/Tma.cuh"

namespace dflash::kernels {

namespace detail {

/// Backward, launch 2: context keys, key-tile major.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          BlockAttentionDq DQ>
static __global__ void
__launch_bounds__((BlockAttentionTiling<D, BS, NH, NKV>::kBwdThreads), 1)
    mma_sync_block_attention_bwd_context_bf16_kernel(
        BlockAttentionBwdArgs args) {
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
  int *sAnchor = sCount + NW;     // [N], -1 where keep = 0
  int *sStart = sAnchor + args.N; // [N], conversationStart
  int *sList = sStart + args.N;   // [numQueryTiles]: tile * 2 + whole
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
    int a = args.keep[i] ? args.anchors[i] : -1;
    sAnchor[n] = a;
    sStart[n] = a >= 0 ? conversationStart(
                             args.positionIds + static_cast<int64_t>(b) * S, a)
                       : 0;
  }
  __syncthreads();

  // The query tiles whose blocks see any key of [j0, j0 + KT), in order.
  const int count = listQueryTilesSeeingKeys<BS, WINDOW, NW>(
      numQueryTiles, MQ, T::kBlockRows, N, totalRows, MQ == MQP, sAnchor,
      sStart, j0, KT, sCount, sList);

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
          lo = contextKeysBegin<WINDOW>(a, k, sStart[n]);
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
        tma::bulkWaitRead<0>();
    }
    __syncthreads();

    // dQ (MQP x D) += dS K: units of 16 rows x D/2 columns.
    constexpr int kDqUnits = (MQP / 16) * 2;
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
      tma::fenceProxyAsync();
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
          tma::bulkReduceAddF32<D * 4>(
              dst, smemAddress(sdQ + r * dqStageStride<D>()));
        }
        tma::bulkCommit();
      }
    }
  }
  cpAsyncWait<0>();
  if constexpr (DQ == BlockAttentionDq::BulkReduce) {
    if (threadIdx.x < MQP)
      tma::bulkWait<0>();
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

} // namespace detail

/// Backward: dq, dK/dV of context and draft keys (all overwritten). DQ picks
/// how context tiles add into the dQ accumulator: BulkReduce (what
/// block_attention_bwd_bf16 runs) or AtomicVec4 (an alternative).
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          BlockAttentionDq DQ = BlockAttentionDq::BulkReduce>
void mma_sync_block_attention_bwd_bf16(const BlockAttentionBwdArgs &args,
                                       cudaStream_t stream) {
  static_assert(DQ == BlockAttentionDq::BulkReduce ||
                    DQ == BlockAttentionDq::AtomicVec4,
                "the mma.sync backward adds dQ by BulkReduce or AtomicVec4; "
                "the other modes are the wgmma backward's");
  using T = detail::BlockAttentionTiling<D, BS, NH, NKV>;
  using bf16 = __nv_bfloat16;
  detail::launchBlockAttentionBwdDraft<D, BS, NH, NKV, WINDOW, CAUSAL>(args,
                                                                       stream);
  {
    auto kernel = detail::mma_sync_block_attention_bwd_context_bf16_kernel<
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
    DFLASH_CUDA_CHECK_LAUNCH("mma_sync_block_attention_bwd_context_bf16");
  }
  detail::launchBlockAttentionBwdDq<D, BS, NH>(args, stream);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_BLOCKATTENTIONMMASYNCBWD_CUH
