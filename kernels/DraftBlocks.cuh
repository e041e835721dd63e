//===- DraftBlocks.cuh - Draft-block bookkeeping ---------------*- CUDA -*-===//
//
// The per-step bookkeeping of docs/semantics.md sections 3 and 4 on the device:
// - draft_embed_bf16: x[b, n*bs + k] = embed[token] * scale, token =
//   input_ids[b, anchor_n] for the first slot of a kept block, the mask token
//   otherwise (ref::draftTokens followed by ref::embed, fused; the scale is a
//   DFlash2 drafter's input_embedding_scale, 1 otherwise);
// - draft_positions: the anchor's position in its conversation plus k
//   (ref::draftPositions);
// - draft_targets: labels (same position, no shift) and fp32 weights with the
//   gamma decay, zero past the anchor's conversation (ref::draftTargets);
// - draft_acceptance_f32: the sums of the acceptance length from the
//   lm_head's per-slot hits, also per bucket of anchor position
//   (ref::draftAcceptance, docs/semantics.md sections 10 and 14).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_DRAFTBLOCKS_CUH
#define DFLASH_KERNELS_DRAFTBLOCKS_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/Embedding.cuh"

#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

struct DraftBlocksShape {
  int B, S, N, bs;
  __host__ __device__ int64_t Q() const { return static_cast<int64_t>(N) * bs; }
};

/// The NB - 1 edges of NB anchor-position buckets, ascending: an anchor at
/// position p of its conversation is in bucket "edges <= p". The compiler
/// prints them (dflash.draft_acceptance's bucket_edges); NB is at most
/// kMaxPositionBuckets (schema/ModelConfig.h).
template <int NB> struct PositionBuckets {
  int32_t edges[NB > 1 ? NB - 1 : 1];
  __host__ __device__ int of(int32_t position) const {
    int j = 0;
    while (j < NB - 1 && edges[j] <= position)
      ++j;
    return j;
  }
};

namespace detail {

__device__ __forceinline__ int32_t draftToken(const int32_t *inputIds,
                                              const int32_t *anchors,
                                              const uint8_t *keep,
                                              DraftBlocksShape shape,
                                              int64_t slot, int maskTokenId) {
  int64_t Q = shape.Q();
  int64_t b = slot / Q, q = slot % Q;
  int64_t n = q / shape.bs, k = q % shape.bs;
  int64_t bn = b * shape.N + n;
  if (k != 0 || !keep[bn])
    return maskTokenId;
  return inputIds[b * shape.S + anchors[bn]];
}

/// One CTA per draft slot; H/8 16-byte vectors per row.
template <int H>
__global__ void __launch_bounds__(128)
    draft_embed_bf16_kernel(const __nv_bfloat16 *embed, const int32_t *inputIds,
                            const int32_t *anchors, const uint8_t *keep,
                            __nv_bfloat16 *out, int32_t *tokensOut,
                            DraftBlocksShape shape, int maskTokenId,
                            float scale) {
  static_assert(H % 8 == 0, "hidden size must be a multiple of 8");
  const int64_t slot = blockIdx.x;
  int32_t token = draftToken(inputIds, anchors, keep, shape, slot, maskTokenId);
  if (tokensOut && threadIdx.x == 0)
    tokensOut[slot] = token;
  const uint4 *src =
      reinterpret_cast<const uint4 *>(embed + static_cast<int64_t>(token) * H);
  uint4 *dst = reinterpret_cast<uint4 *>(out + slot * H);
  for (int c = threadIdx.x; c < H / 8; c += blockDim.x)
    dst[c] = scaledEmbedVector(src[c], scale);
}

static __global__ void draft_positions_kernel(const int32_t *anchors,
                                              const int32_t *positionIds,
                                              int32_t *out,
                                              DraftBlocksShape shape) {
  int64_t total = shape.B * shape.Q();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t b = i / shape.Q(), q = i % shape.Q();
    out[i] = positionIds[b * shape.S + anchors[b * shape.N + q / shape.bs]] +
             static_cast<int32_t>(q % shape.bs);
  }
}

static __global__ void
draft_targets_kernel(const int32_t *inputIds, const uint8_t *lossMask,
                     const int32_t *anchors, const uint8_t *keep,
                     const int32_t *positionIds, int32_t *labels,
                     float *weights, DraftBlocksShape shape, double gamma) {
  int64_t total = shape.B * shape.Q();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t b = i / shape.Q(), q = i % shape.Q();
    int64_t n = q / shape.bs, k = q % shape.bs;
    int64_t bn = b * shape.N + n;
    int64_t anchor = anchors[bn], pos = anchor + k;
    bool inside = pos < shape.S;
    labels[i] = inside ? inputIds[b * shape.S + pos] : 0;
    double w = 0.0;
    if (keep[bn] && inside && k > 0 && lossMask[b * shape.S + pos] &&
        positionIds[b * shape.S + pos] == positionIds[b * shape.S + anchor] + k)
      w = gamma > 0 ? exp(-static_cast<double>(k - 1) / gamma) : 1.0;
    weights[i] = static_cast<float>(w);
  }
}

/// One CTA: each thread walks its blocks' slots in order (a block's run is
/// sequential), then the sums are added in a fixed order; the per-position
/// and per-bucket sums are integers (shared-memory atomics), so every result
/// is deterministic.
template <int BS, int NB>
__global__ void __launch_bounds__(1024)
    draft_acceptance_kernel(const uint8_t *hits, const float *weights,
                            const uint8_t *keep, const int32_t *anchors,
                            const int32_t *positionIds,
                            PositionBuckets<NB> buckets, DraftBlocksShape shape,
                            float *runSum, float *keptBlocks,
                            float *positionHits, float *positionCounts,
                            float *bucketRuns, float *bucketBlocks,
                            float *bucketHits, float *bucketCounts) {
  __shared__ double sRuns[32], sKept[32];
  __shared__ unsigned long long sHits[BS], sCounts[BS];
  __shared__ unsigned long long sBucket[4][NB]; // runs, blocks, hits, counts
  for (int k = threadIdx.x; k < BS; k += blockDim.x)
    sHits[k] = sCounts[k] = 0;
  for (int j = threadIdx.x; j < 4 * NB; j += blockDim.x)
    sBucket[j / NB][j % NB] = 0;
  __syncthreads();
  const int64_t blocks = int64_t(shape.B) * shape.N;
  double runs = 0, kept = 0;
  for (int64_t n = threadIdx.x; n < blocks; n += blockDim.x) {
    if (!keep[n])
      continue;
    const uint8_t *hit = hits + n * BS;
    const float *w = weights + n * BS;
    int run = 0;
    while (run + 1 < BS && w[run + 1] > 0.f && hit[run + 1])
      ++run;
    runs += 1 + run;
    kept += 1;
    // Slot 0 is the given anchor token: never counted.
    unsigned blockHits = 0, blockCounts = 0;
    for (int k = 1; k < BS; ++k) {
      if (!(w[k] > 0.f))
        continue;
      atomicAdd(&sCounts[k], 1ull);
      ++blockCounts;
      if (hit[k]) {
        atomicAdd(&sHits[k], 1ull);
        ++blockHits;
      }
    }
    // The bucket of the anchor's position in its conversation.
    const int64_t b = n / shape.N;
    const int j = buckets.of(positionIds[b * shape.S + anchors[n]]);
    atomicAdd(&sBucket[0][j], static_cast<unsigned long long>(1 + run));
    atomicAdd(&sBucket[1][j], 1ull);
    atomicAdd(&sBucket[2][j], static_cast<unsigned long long>(blockHits));
    atomicAdd(&sBucket[3][j], static_cast<unsigned long long>(blockCounts));
  }
  for (int o = 16; o > 0; o >>= 1) {
    runs += __shfl_xor_sync(0xffffffffu, runs, o);
    kept += __shfl_xor_sync(0xffffffffu, kept, o);
  }
  if (threadIdx.x % 32 == 0) {
    sRuns[threadIdx.x / 32] = runs;
    sKept[threadIdx.x / 32] = kept;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double r = 0, k = 0;
    for (int i = 0; i < int(blockDim.x / 32); ++i) {
      r += sRuns[i];
      k += sKept[i];
    }
    *runSum = static_cast<float>(r);
    *keptBlocks = static_cast<float>(k);
  }
  for (int k = threadIdx.x; k < BS; k += blockDim.x) {
    positionHits[k] = static_cast<float>(sHits[k]);
    positionCounts[k] = static_cast<float>(sCounts[k]);
  }
  for (int j = threadIdx.x; j < NB; j += blockDim.x) {
    bucketRuns[j] = static_cast<float>(sBucket[0][j]);
    bucketBlocks[j] = static_cast<float>(sBucket[1][j]);
    bucketHits[j] = static_cast<float>(sBucket[2][j]);
    bucketCounts[j] = static_cast<float>(sBucket[3][j]);
  }
}

inline unsigned gridFor(int64_t total) {
  int64_t blocks = (total + 255) / 256;
  if (blocks > 4096)
    blocks = 4096;
  return static_cast<unsigned>(blocks > 0 ? blocks : 1);
}

} // namespace detail

/// out [B, Q, H] = embed[draft tokens] * scale (1: a copy); tokensOut
/// [B, Q] (optional) gets the ids. embed [V, H], inputIds [B, S],
/// anchors/keep [B, N].
template <int H>
void draft_embed_bf16(const __nv_bfloat16 *embed, const int32_t *inputIds,
                      const int32_t *anchors, const uint8_t *keep,
                      __nv_bfloat16 *out, int32_t *tokensOut,
                      DraftBlocksShape shape, int maskTokenId, float scale,
                      cudaStream_t stream) {
  int64_t slots = shape.B * shape.Q();
  if (slots == 0)
    return;
  detail::draft_embed_bf16_kernel<H>
      <<<static_cast<unsigned>(slots), 128, 0, stream>>>(
          embed, inputIds, anchors, keep, out, tokensOut, shape, maskTokenId,
          scale);
  DFLASH_CUDA_CHECK_LAUNCH("draft_embed_bf16");
}

/// out [B, Q] = positionIds[anchor] + k; positionIds [B, S].
inline void draft_positions(const int32_t *anchors, const int32_t *positionIds,
                            int32_t *out, DraftBlocksShape shape,
                            cudaStream_t stream) {
  detail::draft_positions_kernel<<<detail::gridFor(shape.B * shape.Q()), 256, 0,
                                   stream>>>(anchors, positionIds, out, shape);
  DFLASH_CUDA_CHECK_LAUNCH("draft_positions");
}

/// labels [B, Q] int32 and weights [B, Q] fp32 of the draft outputs.
inline void draft_targets(const int32_t *inputIds, const uint8_t *lossMask,
                          const int32_t *anchors, const uint8_t *keep,
                          const int32_t *positionIds, int32_t *labels,
                          float *weights, DraftBlocksShape shape, double gamma,
                          cudaStream_t stream) {
  detail::draft_targets_kernel<<<detail::gridFor(shape.B * shape.Q()), 256, 0,
                                 stream>>>(inputIds, lossMask, anchors, keep,
                                           positionIds, labels, weights, shape,
                                           gamma);
  DFLASH_CUDA_CHECK_LAUNCH("draft_targets");
}

/// runSum = sum over kept blocks of 1 + run_n, keptBlocks = their count
/// (device scalars); positionHits / positionCounts [BS]: per block position,
/// the kept slots with w > 0 that hit and all of them (0 at k = 0);
/// bucketRuns / bucketBlocks / bucketHits / bucketCounts [NB]: the same sums
/// over the kept blocks whose anchor's position (positionIds[b, anchor]) is
/// in bucket j, the hits and counts over every k. hits uint8 / weights fp32
/// [B, Q], keep uint8 / anchors int32 [B, N], positionIds int32 [B, S].
template <int BS, int NB>
void draft_acceptance_f32(const uint8_t *hits, const float *weights,
                          const uint8_t *keep, const int32_t *anchors,
                          const int32_t *positionIds,
                          PositionBuckets<NB> buckets, float *runSum,
                          float *keptBlocks, float *positionHits,
                          float *positionCounts, float *bucketRuns,
                          float *bucketBlocks, float *bucketHits,
                          float *bucketCounts, DraftBlocksShape shape,
                          cudaStream_t stream) {
  static_assert(BS >= 1 && BS <= 64, "block size must be in [1, 64]");
  static_assert(NB >= 1 && NB <= 8, "1 to 8 anchor-position buckets");
  detail::draft_acceptance_kernel<BS, NB><<<1, 1024, 0, stream>>>(
      hits, weights, keep, anchors, positionIds, buckets, shape, runSum,
      keptBlocks, positionHits, positionCounts, bucketRuns, bucketBlocks,
      bucketHits, bucketCounts);
  DFLASH_CUDA_CHECK_LAUNCH("draft_acceptance_f32");
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_DRAFTBLOCKS_CUH
