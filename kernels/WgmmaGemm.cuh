//===- WgmmaGemm.cuh - Persistent TMA + wgmma GEMM, two schedules -*- CUDA -*-//
//
// One kernel body for the hand-written bf16 GEMMs y = x W^T (x [M, K], W
// rows [., K], all row-major with K contiguous: Hugging Face's Linear
// weights as stored), fp32 accumulation, y rounded once. Two choices make
// its forms:
//   - the epilogue: SwiGLU (two weight boxes, the gate's and the up
//     projection's rows of the same outputs; y = silu(g) * u, 128 outputs a
//     tile) or Plain (the two boxes are 256 consecutive weight rows; 256
//     outputs a tile); either with gpt-oss's extras when asked (a template
//     flag, so that the plain forms' epilogues stay as they were): a bias
//     of each output added in fp32 before the rounding (and before the
//     activation: the gate's bias to g, the up projection's to u), and the
//     clamped activation y = (u' + 1) * g' * sigmoid(alpha g') with
//     g' = min(g, limit), u' = clamp(u, -limit, limit);
//   - the schedule: Dense (row tiles of x in raster groups) or Grouped (a
//     mixture-of-experts' rows grouped by expert: expert e's rows
//     [offsets[e], offsets[e + 1]) times its weight [N, K], the weights
//     stacked as [E, N, K]; offsets are read from device memory, so the
//     launch is static and a CUDA graph replays it whatever the routing).
//
// One persistent CTA an SM, three warpgroups: warpgroup 0 only copies (one
// thread issues TMA boxes into a ring of kStages stages, registers lowered
// to 40), warpgroups 1 and 2 each multiply 64 rows of the CTA's 128 by the
// stage's 256 weight rows as one m64n256k16 operand (the two boxes land one
// above the other), registers raised to 232 for the 128 accumulators. A stage
// is 64 of K: x [128 x 64] and W [256 x 64], 128B-swizzled. Full barriers
// carry the copies' bytes; a stage is empty once every consumer warp's
// products reading it have completed (one arrival per warp after
// wgmma.wait). With the Dense schedule, in clusters of two CTAs (two row
// tiles, one column tile), each CTA copies one of the two weight boxes to
// both: the weights cross from L2 once per two row tiles. Rows past M and K
// past K load zeros (TMA fills out-of-bounds boxes); rows past the tile's
// group (another expert's) and columns past N are computed and not stored.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_WGMMAGEMM_CUH
#define DFLASH_KERNELS_WGMMAGEMM_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/GemmLimits.h"
#include "kernels/Tma.cuh"
#include "kernels/Wgmma.cuh"

#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels::detail {

enum class GemmEpilogue { SwiGlu, Plain };

/// Cluster: CTAs of a cluster (1 or 2) that take the same column tile of
/// neighbouring row tiles; with 2, each loads one of the two weight boxes
/// and multicasts it to both.
template <GemmEpilogue Epi, int Cluster> struct WgmmaGemmConfig {
  static_assert(Cluster == 1 || Cluster == 2, "clusters of 1 or 2 CTAs");
  static constexpr int kConsumers = 2;                 // warpgroups of 64 rows
  static constexpr int kRows = kConsumers * wgmma::kM; // x rows of a tile
  static constexpr int kBoxRows = 128;                 // weight rows a box
  static constexpr int kWeightRows = 2 * kBoxRows;     // the wgmma's n256
  /// Outputs of a tile, and where the second box starts in the weight rows.
  static constexpr int kCols = Epi == GemmEpilogue::SwiGlu ? 128 : 256;
  static constexpr int kSecondBoxRow = Epi == GemmEpilogue::SwiGlu ? 0 : 128;
  static constexpr int kDepth = wgmma::kPanelCols; // K of a stage
  static constexpr int kStages = 4;
  static constexpr int kThreads = (1 + kConsumers) * wgmma::kWarpgroupThreads;
  static constexpr int kConsumerWarps = kConsumers * wgmma::kWarpgroupWarps;
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  static constexpr int kGroupRows = 32; // row tiles a raster group holds
  static constexpr uint32_t kXBytes = kRows * wgmma::kSwizzleRowBytes;
  static constexpr uint32_t kWBytes = kWeightRows * wgmma::kSwizzleRowBytes;
  static constexpr uint32_t kStageBytes = kXBytes + kWBytes;
  static constexpr size_t kSmemBytes =
      size_t(kStages) * kStageBytes + wgmma::kSwizzleAtomBytes;
  static_assert(kGroupRows % Cluster == 0, "a raster group holds whole pairs");
  static_assert(kConsumerRegisters * kConsumers * wgmma::kWarpgroupThreads +
                        kProducerRegisters * wgmma::kWarpgroupThreads <=
                    wgmma::kRegistersPerSm,
                "setmaxnreg moves registers within the CTA's share");
};

/// Boxes of 64 K-columns: x by 128 rows; the two weight boxes by 128 rows
/// (the same map twice for Plain).
struct WgmmaGemmMaps {
  CUtensorMap x, w0, w1;
};

/// Where one output tile reads and writes: its first x row, the row its
/// group ends at (rows from there on are not stored), its first weight row
/// and its first output column.
struct GemmTile {
  int64_t xRow, rowEnd, wRow, col0;
};

/// silu(g) = g / (1 + e^-g) with the special-function unit's exponential
/// and reciprocal (a few ulp, far below y's bf16 rounding), so the epilogue
/// stays short beside the tile's products; e^-g overflowing to infinity
/// gives 0, as silu tends to.
__device__ __forceinline__ float fastSilu(float g) {
  return __fdividef(g, 1.f + __expf(-g));
}

/// gpt-oss's epilogue extras (the kernel's GptOss forms only): biases of
/// the weight rows (bias0 the first box's map's, bias1 the second's; for
/// Plain only bias0, of all 256 rows; null for none) and the clamped
/// activation's constants.
struct GemmEpilogueExtras {
  const __nv_bfloat16 *bias0 = nullptr, *bias1 = nullptr;
  bool clamped = false;
  float alpha = 1.702f, limit = 7.f;
};

/// The bf16 pair of `bias` at weight row `row` (even) as fp32; zeros
/// without a bias.
__device__ __forceinline__ float2 biasPair(const __nv_bfloat16 *bias,
                                           int64_t row) {
  if (!bias)
    return make_float2(0.f, 0.f);
  return __bfloat1622float2(
      __ldg(reinterpret_cast<const __nv_bfloat162 *>(bias + row)));
}

/// gpt-oss's gated activation (see the file comment), with fastSilu's
/// exponential and division.
__device__ __forceinline__ float clampedSwiglu(float g, float u, float alpha,
                                               float limit) {
  g = fminf(g, limit);
  u = fminf(fmaxf(u, -limit), limit);
  return (u + 1.f) * __fdividef(g, 1.f + __expf(-alpha * g));
}

/// Dense rows: tiles of M x N. Work units are a cluster's row tiles (Cluster
/// of them, this CTA's of rank `rank`) by one column tile; they go round the
/// clusters in raster groups of kGroupRows row tiles (each group's x rows
/// stay in L2 while its column tiles pass).
template <GemmEpilogue Epi, int Cluster> struct DenseSchedule {
  using C = WgmmaGemmConfig<Epi, Cluster>;
  int64_t M, N;
  struct Shared {};

  __host__ __device__ int64_t rowUnits() const {
    return ((M + C::kRows - 1) / C::kRows + Cluster - 1) / Cluster;
  }
  __host__ __device__ int64_t colTiles() const {
    return (N + C::kCols - 1) / C::kCols;
  }
  /// Work units (the grid never needs more CTAs than these).
  int64_t maxUnits() const { return rowUnits() * colTiles(); }
  __device__ void prepare(Shared &) const {}

  /// Calls tile(coords, first) for each of this CTA's tiles in the order
  /// its producer and consumers both walk them; `first` is the ring
  /// position (stages filled before) of the tile's first K step.
  template <typename Tile>
  __device__ __forceinline__ void forEachTile(const Shared &, int rank,
                                              int depthSteps, Tile tile) const {
    constexpr int G = C::kGroupRows / Cluster;
    const int units = int(rowUnits() * colTiles()), perGroup = G * colTiles();
    int first = 0;
    for (int u = blockIdx.x / Cluster; u < units;
         u += gridDim.x / Cluster, first += depthSteps) {
      const int group = u / perGroup, firstRow = group * G;
      const int rows = min(G, int(rowUnits()) - firstRow);
      const int within = u - group * perGroup;
      const int64_t rt = (firstRow + within % rows) * Cluster + rank;
      const int64_t ct = within / rows;
      tile(GemmTile{rt * C::kRows, M, ct * C::kCols, ct * C::kCols}, first);
    }
  }
};

/// Rows grouped by expert (see the file comment): work units are each
/// expert's row tiles by its column tiles, the row tiles of one column tile
/// together (that tile's weights stay in L2 while the expert's rows pass),
/// the experts in order. How many row tiles an expert has is known only on
/// the GPU: every CTA counts them from `offsets` into shared memory first.
template <GemmEpilogue Epi> struct GroupedSchedule {
  using C = WgmmaGemmConfig<Epi, 1>;
  static constexpr int kMaxExperts = kGroupedGemmMaxExperts;
  const int32_t *offsets; ///< [E + 1], device memory
  int64_t M, N;           ///< all rows (T * k), each expert's outputs
  int E;
  struct Shared {
    int rowStart[kMaxExperts + 1];  ///< offsets, copied
    int unitStart[kMaxExperts + 1]; ///< units before expert e's
  };

  int64_t colTiles() const { return (N + C::kCols - 1) / C::kCols; }
  /// At most one partial row tile an expert beside the whole ones.
  int64_t maxUnits() const {
    return ((M + C::kRows - 1) / C::kRows + E) * colTiles();
  }

  /// Each expert's row tiles, then their running sum by one warp.
  __device__ void prepare(Shared &s) const {
    const int colTileCount = int((N + C::kCols - 1) / C::kCols);
    for (int e = threadIdx.x; e <= E; e += blockDim.x)
      s.rowStart[e] = offsets[e];
    __syncthreads();
    if (threadIdx.x < wgmma::kWarpThreads) {
      const int lane = threadIdx.x;
      int carry = 0;
      for (int e0 = 0; e0 < E; e0 += wgmma::kWarpThreads) {
        const int e = e0 + lane;
        int units = 0;
        if (e < E) {
          const int rows = s.rowStart[e + 1] - s.rowStart[e];
          units = int((rows + C::kRows - 1) / C::kRows) * colTileCount;
        }
        int sum = units; // inclusive scan over the warp
#pragma unroll
        for (int d = 1; d < wgmma::kWarpThreads; d *= 2) {
          const int other = __shfl_up_sync(0xffffffffu, sum, d);
          if (lane >= d)
            sum += other;
        }
        if (e < E)
          s.unitStart[e + 1] = carry + sum;
        carry += __shfl_sync(0xffffffffu, sum, wgmma::kWarpThreads - 1);
      }
      if (lane == 0)
        s.unitStart[0] = 0;
    }
    __syncthreads();
  }

  template <typename Tile>
  __device__ __forceinline__ void forEachTile(const Shared &s, int,
                                              int depthSteps, Tile tile) const {
    const int units = s.unitStart[E];
    int e = 0, first = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x, first += depthSteps) {
      while (s.unitStart[e + 1] <= u)
        ++e;
      const int rows = s.rowStart[e + 1] - s.rowStart[e];
      const int rowTiles = (rows + C::kRows - 1) / C::kRows;
      const int within = u - s.unitStart[e];
      const int64_t rt = within % rowTiles, ct = within / rowTiles;
      tile(GemmTile{s.rowStart[e] + rt * C::kRows, s.rowStart[e + 1],
                    e * N + ct * C::kCols, ct * C::kCols},
           first);
    }
  }
};

/// GptOss: the epilogue adds `extras`' biases and, when extras.clamped,
/// takes the clamped activation; without it `extras` is not read.
template <GemmEpilogue Epi, int Cluster, typename Schedule, bool GptOss>
static __global__ void
__launch_bounds__(WgmmaGemmConfig<Epi, Cluster>::kThreads, 1)
    sm90a_wgmma_gemm_bf16_kernel(Schedule schedule, __nv_bfloat16 *y, int64_t K,
                                 const __grid_constant__ WgmmaGemmMaps maps,
                                 const GemmEpilogueExtras extras) {
  using C = WgmmaGemmConfig<Epi, Cluster>;
  using namespace wgmma;
  extern __shared__ unsigned char smemRaw[];
  __shared__ __align__(8) uint64_t full[C::kStages], empty[C::kStages];
  __shared__ typename Schedule::Shared scheduleShared;
  unsigned char *smem = smemRaw + swizzleAtomPadding(smemRaw);
  const uint32_t base = smemAddress(smem);
  const uint32_t full0 = smemAddress(&full[0]), empty0 = smemAddress(&empty[0]);

  const int tid = threadIdx.x, wg = tid / kWarpgroupThreads;
  const int rank = Cluster > 1 ? int(tma::clusterRank()) : 0;
  const int depthSteps = int((K + C::kDepth - 1) / C::kDepth);
  const int64_t N = schedule.N;

  if (tid == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      tma::barrierInit(full0 + tma::kBarrierBytes * s, 1);
      // A stage is free once every consumer warp of every CTA its weight
      // boxes were multicast to has read it.
      tma::barrierInit(empty0 + tma::kBarrierBytes * s,
                       C::kConsumerWarps * Cluster);
    }
    tma::fenceBarrierInit();
  }
  schedule.prepare(scheduleShared); // ends with __syncthreads when it works
  // A peer's first multicast may land as soon as the barriers exist.
  if constexpr (Cluster > 1)
    tma::clusterSync();
  else
    __syncthreads();

  if (wg == 0) {
    decreaseRegisters<C::kProducerRegisters>();
    if (tid == 0) {
      schedule.forEachTile(
          scheduleShared, rank, depthSteps, [&](GemmTile t, int first) {
            for (int kb = 0; kb < depthSteps; ++kb) {
              const int it = first + kb, s = it % C::kStages;
              // A fresh barrier's "previous phase" counts as complete: the
              // first pass round the ring does not wait.
              tma::waitParity(empty0 + tma::kBarrierBytes * s,
                              ((it / C::kStages) & 1) ^ 1);
              const uint32_t bar = full0 + tma::kBarrierBytes * s;
              const uint32_t stage = base + s * C::kStageBytes;
              tma::arriveExpectTx(bar, C::kStageBytes);
              const int k0 = kb * C::kDepth;
              tma::load4d(stage, &maps.x, bar, k0, 0, int(t.xRow), 0);
              const uint32_t box0 = stage + C::kXBytes,
                             box1 = box0 + C::kWBytes / 2;
              const int row0 = int(t.wRow), row1 = row0 + C::kSecondBoxRow;
              if constexpr (Cluster == 1) {
                tma::load4d(box0, &maps.w0, bar, k0, 0, row0, 0);
                tma::load4d(box1, &maps.w1, bar, k0, 0, row1, 0);
              } else if (rank == 0) {
                tma::load4dMulticast(box0, &maps.w0, bar, k0, 0, row0, 0, 0b11);
              } else {
                tma::load4dMulticast(box1, &maps.w1, bar, k0, 0, row1, 0, 0b11);
              }
            }
          });
    }
  } else {
    increaseRegisters<C::kConsumerRegisters>();
    const int consumer = wg - 1, warp = (tid / kWarpThreads) % kWarpgroupWarps,
              lane = tid % kWarpThreads;
    // Hands stage s back to every CTA whose producer waits on it.
    auto release = [&](int s) {
      __syncwarp();
      // With clusters, lane r arrives on CTA r's barrier: the arrivals go
      // out side by side, not one after the other.
      if constexpr (Cluster == 1) {
        if (lane == 0)
          tma::arrive(empty0 + tma::kBarrierBytes * s);
      } else if (lane < Cluster) {
        tma::arriveInCta(empty0 + tma::kBarrierBytes * s, lane);
      }
    };
    // Columns 0..127 of acc are the first box's rows, 128..255 the second's.
    float acc[C::kWeightRows / 2] = {};
    // The products of one accumulator pair (4j + 2i, + 1) as the two bf16
    // outputs they give: SwiGLU pairs a gate column with its up column.
    // `wRow` is the tile's first weight row (the biases' index).
    auto outputPair = [&](int j, int i, int64_t wRow) -> uint32_t {
      const int a = 4 * j + 2 * i;
      if constexpr (GptOss) {
        const int64_t row = wRow + 8 * j + 2 * (lane % 4);
        const float2 b0 = biasPair(extras.bias0, row);
        if constexpr (Epi == GemmEpilogue::SwiGlu) {
          const int up = a + C::kWeightRows / 4;
          const float2 b1 = biasPair(extras.bias1, row);
          const float g0 = acc[a] + b0.x, g1 = acc[a + 1] + b0.y;
          const float u0 = acc[up] + b1.x, u1 = acc[up + 1] + b1.y;
          if (extras.clamped)
            return packBf16(clampedSwiglu(g0, u0, extras.alpha, extras.limit),
                            clampedSwiglu(g1, u1, extras.alpha, extras.limit));
          return packBf16(fastSilu(g0) * u0, fastSilu(g1) * u1);
        } else {
          return packBf16(acc[a] + b0.x, acc[a + 1] + b0.y);
        }
      } else if constexpr (Epi == GemmEpilogue::SwiGlu) {
        const int up = a + C::kWeightRows / 4;
        return packBf16(fastSilu(acc[a]) * acc[up],
                        fastSilu(acc[a + 1]) * acc[up + 1]);
      } else {
        return packBf16(acc[a], acc[a + 1]);
      }
    };
    schedule.forEachTile(
        scheduleShared, rank, depthSteps, [&](GemmTile t, int first) {
          for (int kb = 0; kb < depthSteps; ++kb) {
            const int it = first + kb, s = it % C::kStages;
            tma::waitParity(full0 + tma::kBarrierBytes * s,
                            (it / C::kStages) & 1);
            const uint32_t stage = base + s * C::kStageBytes;
            const uint32_t xLo =
                descLo(stage + consumer * kM * kSwizzleRowBytes, kKMajorLbo);
            const uint32_t wLo = descLo(stage + C::kXBytes, kKMajorLbo);
            fence();
#pragma unroll
            for (int kk = 0; kk < C::kDepth / kK; ++kk)
              Wgmma<C::kWeightRows, Major::K, Major::K>::ss(
                  acc, descOf(xLo + kMajorStep(kk, C::kRows)),
                  descOf(wLo + kMajorStep(kk, C::kWeightRows)),
                  kb > 0 || kk > 0);
            commit();
            // The stage before this one is read: hand it back.
            wait<1>();
            pin(acc);
            if (kb > 0)
              release((it - 1) % C::kStages);
          }
          wait<0>();
          pin(acc);
          release((first + depthSteps - 1) % C::kStages);

          // Two bf16 a store. A tile wholly inside its group and y stores
          // without tests (fewer branches: 2.5% of the SwiGLU GEMM's time);
          // an edge tile stores rows below the group's end and columns below
          // N (N is even, so a pair is in or out whole).
          const int64_t row0 = t.xRow + consumer * kM + warp * 16 + lane / 4;
          if (t.xRow + C::kRows <= t.rowEnd && t.col0 + C::kCols <= N) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              __nv_bfloat16 *out =
                  y + (row0 + 8 * i) * N + t.col0 + 2 * (lane % 4);
#pragma unroll
              for (int j = 0; j < C::kCols / 8; ++j)
                *reinterpret_cast<uint32_t *>(out + 8 * j) =
                    outputPair(j, i, t.wRow);
            }
            return;
          }
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int64_t row = row0 + 8 * i;
            if (row >= t.rowEnd)
              continue;
            __nv_bfloat16 *out = y + row * N;
#pragma unroll
            for (int j = 0; j < C::kCols / 8; ++j) {
              const int64_t col = t.col0 + 8 * j + 2 * (lane % 4);
              if (col >= N)
                continue;
              *reinterpret_cast<uint32_t *>(out + col) =
                  outputPair(j, i, t.wRow);
            }
          }
        });
  }
  // No CTA leaves while its peer may still arrive on its barriers.
  if constexpr (Cluster > 1)
    tma::clusterSync();
}

/// Launches the kernel on `stream`: one CTA an SM (as many clusters as can
/// be resident at once, never more than the schedule's work units), each
/// going round the work units. x [M, K]; w0/w1 [weightRows, K]; with
/// GptOss, the epilogue takes `extras` (biases [weightRows] of w0's and
/// w1's rows).
template <GemmEpilogue Epi, int Cluster, typename Schedule, bool GptOss = false>
void launchWgmmaGemm(const Schedule &schedule, const __nv_bfloat16 *x,
                     const __nv_bfloat16 *w0, const __nv_bfloat16 *w1,
                     int64_t weightRows, __nv_bfloat16 *y, int64_t K,
                     cudaStream_t stream, const char *what,
                     const GemmEpilogueExtras &extras = {}) {
  using C = WgmmaGemmConfig<Epi, Cluster>;
  auto kernel = sm90a_wgmma_gemm_bf16_kernel<Epi, Cluster, Schedule, GptOss>;
  cudaLaunchAttribute cluster;
  cudaLaunchConfig_t config = tma::clusterLaunchConfig(
      dim3(Cluster, 1, 1), C::kThreads, C::kSmemBytes, stream, cluster);
  // Per launch: the attribute is the current device's.
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes)));
  // Resident clusters, found once per form (the kernel's shared memory
  // allows one CTA an SM; the GPUs of one process are alike).
  static const int resident = [&] {
    int device = 0, sms = 0, clusters = 0;
    DFLASH_CUDA_CHECK(cudaGetDevice(&device));
    DFLASH_CUDA_CHECK(
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cudaLaunchConfig_t probe = config;
    probe.gridDim = dim3(sms / Cluster * Cluster);
    DFLASH_CUDA_CHECK(
        cudaOccupancyMaxActiveClusters(&clusters, kernel, &probe));
    if (clusters < 1)
      reportCudaFailure(__FILE__, __LINE__, "cudaOccupancyMaxActiveClusters",
                        "no cluster of the wgmma GEMM fits an SM's shared "
                        "memory");
    return clusters;
  }();
  const int64_t units = schedule.maxUnits();
  config.gridDim =
      dim3(unsigned(Cluster * (units < resident ? units : resident)));
  if (units == 0)
    return;
  const int64_t M = schedule.M;
  DFLASH_CUDA_CHECK(cudaLaunchKernelEx(
      &config, kernel, schedule, y, K,
      WgmmaGemmMaps{tma::bf16RowsOfHeadsMap(x, 1, M, 1, K, 1, C::kRows, what),
                    tma::bf16RowsOfHeadsMap(w0, 1, weightRows, 1, K, 1,
                                            C::kBoxRows, what),
                    tma::bf16RowsOfHeadsMap(w1, 1, weightRows, 1, K, 1,
                                            C::kBoxRows, what)},
      extras));
  DFLASH_CUDA_CHECK_LAUNCH("sm90a_wgmma_gemm_bf16_kernel");
}

} // namespace dflash::kernels::detail

#endif // DFLASH_KERNELS_WGMMAGEMM_CUH
