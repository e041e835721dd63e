//===- BlockAttentionMmaSyncBwdDraft.cuh - Launches 1, 3 -------*- CUDA -*-===//
//
// The two launches that every attention backward
// (kernels/BlockAttentionBwd.cuh, mma.sync or wgmma context kernel) runs around
// its context kernel:
//   1. the draft kernel, on warp MMA (mma.sync, ldmatrix, cp.async): whole
//      blocks of at most 64 rows per CTA; D = rowsum(dO * O), the draft keys'
//      share of dQ (stored: it initialises the fp32 dQ accumulator), and
//      dK / dV of the draft keys, which only their own block sees;
//   3. dQ = bf16(scale * accumulator), once every context tile has added
//      its share.
// docs/kernels.md has their tiling and numbers.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_BLOCKATTENTIONMMASYNCBWDDRAFT_CUH
#define DFLASH_KERNELS_BLOCKATTENTIONMMASYNCBWDDRAFT_CUH

#include "kernels/BlockAttentionTiling.cuh"

namespace dflash::kernels::detail {

/// Elements of the backward draft kernel's shared region that holds the
/// draft keys and values, then P and dS ([rows][64] each) over them.
constexpr int bwdDraftOverlayElems(int d, int draftKeys, int padRows) {
  return 2 * draftKeys * d > 2 * padRows * 64 ? 2 * draftKeys * d
                                              : 2 * padRows * 64;
}

/// The backward draft kernel's tiling: BLOCKS whole blocks per CTA (0: as
/// many as make at most 64 rows, at least one). Half the forward's rows at
/// qwen3 shapes: four CTAs per SM overlap one's loads with another's
/// products and stores.
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

/// Backward, launch 1: the draft keys of each group of blocks.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          int BLOCKS = 0>
__global__ void
__launch_bounds__((BwdDraftTiling<D, BS, NH, NKV, BLOCKS>::kThreads))
    mma_sync_block_attention_bwd_draft_bf16_kernel(BlockAttentionBwdArgs args) {
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
  // from global memory, its loads issued before the wait (the kernel waits
  // on memory).
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

/// Backward, launch 3: dQ = bf16(scale * accumulator), 4 values per thread.
template <int D>
__global__ void block_attention_bwd_dq_bf16_kernel(const float *accum, bf16 *dq,
                                                   int64_t count4) {
  constexpr float kScale = kBlockAttentionScale<D>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < count4; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float4 v = reinterpret_cast<const float4 *>(accum)[i];
    uint2 packed = make_uint2(packBf16(v.x * kScale, v.y * kScale),
                              packBf16(v.z * kScale, v.w * kScale));
    reinterpret_cast<uint2 *>(dq)[i] = packed;
  }
}

/// Backward launch 1 (draft keys, D = rowsum(dO * O), the accumulator's
/// initial dQ); shared by the mma.sync and wgmma backward passes.
template <int D, int BS, int NH, int NKV, int WINDOW, bool CAUSAL,
          int BLOCKS = 0>
void launchBlockAttentionBwdDraft(const BlockAttentionBwdArgs &args,
                                  cudaStream_t stream) {
  using T = BwdDraftTiling<D, BS, NH, NKV, BLOCKS>;
  auto kernel =
      mma_sync_block_attention_bwd_draft_bf16_kernel<D, BS, NH, NKV, WINDOW,
                                                     CAUSAL, BLOCKS>;
  size_t smem = (2 * T::kPadRows * D +
                 bwdDraftOverlayElems(D, T::kDraftKeys, T::kPadRows)) *
                    sizeof(bf16) +
                T::kPadRows * sizeof(float);
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  dim3 grid(args.B * NKV, (args.N + T::kBlocksPerCta - 1) / T::kBlocksPerCta);
  kernel<<<grid, T::kThreads, smem, stream>>>(args);
  DFLASH_CUDA_CHECK_LAUNCH("mma_sync_block_attention_bwd_draft_bf16");
}

/// Backward launch 3: dQ = bf16(scale * accumulator).
template <int D, int BS, int NH>
void launchBlockAttentionBwdDq(const BlockAttentionBwdArgs &args,
                               cudaStream_t stream) {
  int64_t count4 = static_cast<int64_t>(args.B) * args.N * BS * NH * D / 4;
  int blocks = static_cast<int>((count4 + 255) / 256);
  if (blocks > 4096)
    blocks = 4096;
  block_attention_bwd_dq_bf16_kernel<D>
      <<<blocks, 256, 0, stream>>>(args.dqAccum, args.dq, count4);
  DFLASH_CUDA_CHECK_LAUNCH("block_attention_bwd_dq_bf16");
}

} // namespace dflash::kernels::detail

#endif // DFLASH_KERNELS_BLOCKATTENTIONMMASYNCBWDDRAFT_CUH
