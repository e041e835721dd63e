//===- ReduceProbe.cu - fp32 reduction throughput into global memory ------===//
//
// How fast can the SMs add fp32 values into global memory, and does the
// pattern matter? The attention backward's dQ phase adds one 64 x 128 fp32
// tile per (key tile, query tile) pair: this probe times the same volume in
// the shapes the kernel could use, into a buffer that fits in L2 (16 MB) and
// one that does not (512 MB):
//   frag-v2   each thread its wgmma fragment's column pairs (8 rows x 32 B
//             per warp instruction: the kernel's AtomicVec2)
//   row-v4    a warp adds one contiguous 512-byte row per instruction
//   bulk-row  cp.reduce.async.bulk of 512-byte rows from shared memory
//   hot-v2    frag-v2, but every CTA adds into the same 64 tiles (the walks'
//             worst overlap)
// Build and run (on the GPU machine):
//   nvcc -std=c++17 -O3 -I. -gencode=arch=compute_90a,code=sm_90a \
//     bench/kernels/ReduceProbe.cu -o build-bench/ReduceProbe
//   build-bench/ReduceProbe   (one line per case: GB/s of fp32 added)
// H200, 2026-11-29 (NOTES.md, fifth session): 16 MB frag-v2 2259 GB/s,
// row-v4 3791, bulk-row 3796, hot-v2 2247; 512 MB frag-v2 1129, row-v4
// 1497, bulk-row 1502.
//
//===----------------------------------------------------------------------===//

#include "kernels/CudaCheck.cuh"

#include <cstdio>
#include <cuda_runtime.h>

namespace {

constexpr int kCols = 128, kTileRows = 64, kThreads = 256;

__device__ __forceinline__ uint32_t hashTile(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  return x;
}

enum Pattern { FragV2, RowV4, BulkRow, HotV2 };

/// Each CTA adds `tiles` 64 x 128 tiles at pseudo-random tile positions of
/// dst (numTiles tiles).
template <Pattern P>
__global__ void __launch_bounds__(kThreads)
    addTiles(float *dst, int numTiles, int tiles) {
  __shared__ __align__(128) float stage[kTileRows * kCols / 2]; // 32 rows
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if constexpr (P == BulkRow) {
    for (int i = tid; i < kTileRows * kCols / 2; i += kThreads)
      stage[i] = 1e-3f * (i % 7);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
  }
  for (int it = 0; it < tiles; ++it) {
    uint32_t tile = P == HotV2
                        ? (it % 64)
                        : hashTile(blockIdx.x * 977u + it * 131u) % numTiles;
    float *t = dst + size_t(tile) * kTileRows * kCols;
    const float v = 1e-3f * (lane + it);
    if constexpr (P == FragV2 || P == HotV2) {
      // 8 warps: rows 16 (warp % 4) + lane / 4 + 8 i, panel warp / 4.
      float *base = t + (16 * (warp % 4) + lane / 4) * kCols + (warp / 4) * 64 +
                    2 * (lane % 4);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          atomicAdd(reinterpret_cast<float2 *>(base + i * 8 * kCols + j * 8),
                    make_float2(v, v));
    } else if constexpr (P == RowV4) {
      // 8 warps x 8 rows: each instruction one whole row.
#pragma unroll
      for (int r = 0; r < 8; ++r)
        atomicAdd(
            reinterpret_cast<float4 *>(t + (warp * 8 + r) * kCols + 4 * lane),
            make_float4(v, v, v, v));
    } else {
      // 64 threads issue one row each (the stage holds 32 distinct rows).
      if (tid < kTileRows)
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group."
                     "add.f32 [%0], [%1], %2;\n" ::"l"(t + tid * kCols),
                     "r"(static_cast<uint32_t>(
                         __cvta_generic_to_shared(stage + (tid % 32) * kCols))),
                     "n"(kCols * 4)
                     : "memory");
      if (tid < kTileRows)
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    }
  }
  if constexpr (P == BulkRow)
    if (tid < kTileRows)
      asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

template <Pattern P>
void run(const char *name, float *buf, int numTiles, int ctas, int tiles) {
  auto launch = [&] {
    addTiles<P><<<ctas, kThreads>>>(buf, numTiles, tiles);
    DFLASH_CUDA_CHECK_LAUNCH("addTiles");
  };
  launch();
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  DFLASH_CUDA_CHECK(cudaEventCreate(&a));
  DFLASH_CUDA_CHECK(cudaEventCreate(&b));
  const int reps = 5;
  DFLASH_CUDA_CHECK(cudaEventRecord(a));
  for (int r = 0; r < reps; ++r)
    launch();
  DFLASH_CUDA_CHECK(cudaEventRecord(b));
  DFLASH_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  DFLASH_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  ms /= reps;
  double bytes = double(ctas) * tiles * kTileRows * kCols * 4;
  std::printf("%-10s buffer %4d MB  %8.1f GB added  %7.3f ms  %7.1f GB/s\n",
              name, int(double(numTiles) * kTileRows * kCols * 4 / 1e6),
              bytes / 1e9, ms, bytes / (ms * 1e6));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

} // namespace

int main() {
  int sms = 0;
  DFLASH_CUDA_CHECK(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int tileFloats = kTileRows * kCols;
  for (int mb : {16, 512}) {
    int numTiles = int(size_t(mb) * 1000000 / (tileFloats * 4));
    float *buf = nullptr;
    DFLASH_CUDA_CHECK(cudaMalloc(&buf, size_t(numTiles) * tileFloats * 4));
    DFLASH_CUDA_CHECK(cudaMemset(buf, 0, size_t(numTiles) * tileFloats * 4));
    const int ctas = sms * 4, tiles = 400; // ~2.2 GB added per launch
    run<FragV2>("frag-v2", buf, numTiles, ctas, tiles);
    run<RowV4>("row-v4", buf, numTiles, ctas, tiles);
    run<BulkRow>("bulk-row", buf, numTiles, ctas, tiles);
    if (mb == 16)
      run<HotV2>("hot-v2", buf, numTiles, ctas, tiles);
    DFLASH_CUDA_CHECK(cudaFree(buf));
  }
  return 0;
}
