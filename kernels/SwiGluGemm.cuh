//===- SwiGluGemm.cuh - The MLP's gate/up GEMM with SwiGLU applied -*- CUDA
//-*-===//
//
// y [M, F] = silu(x Wg^T) * (x Wu^T), x [M, K], Wg and Wu [F, K] (all
// row-major bf16, K contiguous: Hugging Face's Linear weights as stored).
// The products accumulate in fp32 and SwiGLU reads the accumulators, so y is
// rounded once and neither [M, F] product is ever stored: against two GEMMs
// and the elementwise pass (kernels/SwiGlu.cuh) it writes a third of the
// bytes and reads none back. cuBLASLt has no such epilogue. Inference only
// (the target model's MLP): the backward needs the products it drops.
//
// One persistent CTA an SM, three warpgroups: warpgroup 0 only copies (one
// thread issues TMA boxes into a ring of kStages stages, registers lowered
// to 40), warpgroups 1 and 2 each multiply 64 rows of the CTA's 128 by the
// stage's 128 gate rows and 128 up rows as one m64n256k16 operand (the two
// boxes land one above the other), registers raised to 232 for the 128
// accumulators. A stage is 64 of K: x [128 x 64] and W [256 x 64],
// 128B-swizzled. Full barriers carry the copies' bytes; a stage is empty
// once every consumer warp's products reading it have completed (one arrival
// per warp after wgmma.wait). Tiles of 128 x 128 outputs go round the CTAs
// in groups of kGroupRows row tiles (each group's x rows, 32 MB at K 4096,
// stay in L2 while its column tiles pass). In clusters of two CTAs (two row
// tiles, one column tile), each CTA copies one of the two weight boxes to both:
// the weights cross from L2 once per two row tiles, and a stage is empty once
// both CTAs' consumers have read it. Rows past M, columns past F and K past K
// load zeros (TMA fills out-of-bounds boxes) and store nothing.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_SWIGLUGEMM_CUH
#define DFLASH_KERNELS_SWIGLUGEMM_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/GemmLimits.h"
#include "kernels/SwiGlu.cuh"
#include "kernels/Tma.cuh"
#include "kernels/Wgmma.cuh"

#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

struct SwiGluGemmArgs {
  __nv_bfloat16 *y; ///< [M, F]
  int64_t M, F, K;
};

/// Whether swiglu_gemm_bf16 takes these: the shape (kernels/GemmLimits.h)
/// and 16-byte aligned bases (TMA's).
inline bool swigluGemmSupports(const void *x, const void *wGate,
                               const void *wUp, const void *y, int64_t M,
                               int64_t F, int64_t K) {
  auto aligned = [](const void *p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
  };
  return aligned(x) && aligned(wGate) && aligned(wUp) && aligned(y) && M > 0 &&
         M < (int64_t(1) << 31) && swigluGemmSupportsShape(F, K);
}

namespace detail {

/// Cluster: CTAs of a cluster (1 or 2) that take the same column tile of
/// neighbouring row tiles; with 2, each loads half the weight boxes (rank 0
/// the gate's, rank 1 the up projection's) and multicasts them to both, so
/// the weights cross from L2 once per pair of row tiles.
template <int Cluster> struct SwiGluGemmConfig {
  static_assert(Cluster == 1 || Cluster == 2, "clusters of 1 or 2 CTAs");
  static constexpr int kConsumers = 2;                 // warpgroups of 64 rows
  static constexpr int kRows = kConsumers * wgmma::kM; // x rows of a tile
  static constexpr int kCols = 128;                    // outputs of a tile
  static constexpr int kDepth = wgmma::kPanelCols;     // K of a stage
  static constexpr int kStages = 4;
  static constexpr int kThreads = (1 + kConsumers) * wgmma::kWarpgroupThreads;
  static constexpr int kConsumerWarps = kConsumers * wgmma::kWarpgroupWarps;
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  static constexpr int kGroupRows = 32; // row tiles a raster group holds
  static constexpr uint32_t kXBytes = kRows * wgmma::kSwizzleRowBytes;
  static constexpr uint32_t kWBytes = 2 * kCols * wgmma::kSwizzleRowBytes;
  static constexpr uint32_t kStageBytes = kXBytes + kWBytes;
  static constexpr size_t kSmemBytes =
      size_t(kStages) * kStageBytes + wgmma::kSwizzleAtomBytes;
  static_assert(kGroupRows % Cluster == 0, "a raster group holds whole pairs");
  static_assert(kConsumerRegisters * kConsumers * wgmma::kWarpgroupThreads +
                        kProducerRegisters * wgmma::kWarpgroupThreads <=
                    wgmma::kRegistersPerSm,
                "setmaxnreg moves registers within the CTA's share");
};

/// Boxes of 64 K-columns: x by 128 rows, Wg and Wu by 128 rows.
struct SwiGluGemmMaps {
  CUtensorMap x, wGate, wUp;
};

/// silu(g) = g / (1 + e^-g) with the special-function unit's exponential
/// and reciprocal (a few ulp, far below y's bf16 rounding), so the epilogue
/// stays short beside the tile's products; e^-g overflowing to infinity
/// gives 0, as silu tends to.
__device__ __forceinline__ float fastSilu(float g) {
  return __fdividef(g, 1.f + __expf(-g));
}

/// Calls tile(rt, ct, first) for each output tile this CTA computes, in the
/// order its producer and its consumers both walk them: row tile rt, column
/// tile ct, and `first`, the ring position (stages filled before) of the
/// tile's first K step. Work units are a cluster's row tiles (Cluster of
/// them, this CTA's of rank `rank`) by one column tile; they go round the
/// clusters in raster groups of kGroupRows row tiles (each group's x rows
/// stay in L2 while its column tiles pass).
template <int Cluster, typename Tile>
__device__ __forceinline__ void
forEachTile(const SwiGluGemmArgs &args, int rank, int depthSteps, Tile tile) {
  using C = SwiGluGemmConfig<Cluster>;
  constexpr int G = C::kGroupRows / Cluster;
  const int rowTiles = int((args.M + C::kRows - 1) / C::kRows);
  const int rowUnits = (rowTiles + Cluster - 1) / Cluster;
  const int colTiles = int((args.F + C::kCols - 1) / C::kCols);
  const int units = rowUnits * colTiles, perGroup = G * colTiles;
  int first = 0;
  for (int u = blockIdx.x / Cluster; u < units;
       u += gridDim.x / Cluster, first += depthSteps) {
    const int group = u / perGroup, firstRow = group * G;
    const int rows = min(G, rowUnits - firstRow);
    const int within = u - group * perGroup;
    tile((firstRow + within % rows) * Cluster + rank, within / rows, first);
  }
}

template <int Cluster>
static __global__ void __launch_bounds__(SwiGluGemmConfig<Cluster>::kThreads, 1)
    sm90a_swiglu_gemm_bf16_kernel(SwiGluGemmArgs args,
                                  const __grid_constant__ SwiGluGemmMaps maps) {
  using C = SwiGluGemmConfig<Cluster>;
  using namespace wgmma;
  extern __shared__ unsigned char smemRaw[];
  __shared__ __align__(8) uint64_t full[C::kStages], empty[C::kStages];
  unsigned char *smem = smemRaw + swizzleAtomPadding(smemRaw);
  const uint32_t base = smemAddress(smem);
  const uint32_t full0 = smemAddress(&full[0]), empty0 = smemAddress(&empty[0]);

  const int tid = threadIdx.x, wg = tid / kWarpgroupThreads;
  const int rank = Cluster > 1 ? int(tma::clusterRank()) : 0;
  const int depthSteps = int((args.K + C::kDepth - 1) / C::kDepth);

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
  // A peer's first multicast may land as soon as the barriers exist.
  if constexpr (Cluster > 1)
    tma::clusterSync();
  else
    __syncthreads();

  if (wg == 0) {
    decreaseRegisters<C::kProducerRegisters>();
    if (tid == 0) {
      forEachTile<Cluster>(
          args, rank, depthSteps, [&](int rt, int ct, int first) {
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
              tma::load4d(stage, &maps.x, bar, k0, 0, rt * C::kRows, 0);
              const uint32_t gate = stage + C::kXBytes,
                             up = gate + C::kWBytes / 2;
              if constexpr (Cluster == 1) {
                tma::load4d(gate, &maps.wGate, bar, k0, 0, ct * C::kCols, 0);
                tma::load4d(up, &maps.wUp, bar, k0, 0, ct * C::kCols, 0);
              } else if (rank == 0) {
                tma::load4dMulticast(gate, &maps.wGate, bar, k0, 0,
                                     ct * C::kCols, 0, 0b11);
              } else {
                tma::load4dMulticast(up, &maps.wUp, bar, k0, 0, ct * C::kCols,
                                     0, 0b11);
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
    // Columns 0..127 of acc are the gate's, 128..255 the up projection's.
    float acc[2 * C::kCols / 2];
    forEachTile<Cluster>(
        args, rank, depthSteps, [&](int rt, int ct, int first) {
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
              Wgmma<2 * C::kCols, Major::K, Major::K>::ss(
                  acc, descOf(xLo + kMajorStep(kk, C::kRows)),
                  descOf(wLo + kMajorStep(kk, 2 * C::kCols)), kb > 0 || kk > 0);
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

          // SwiGLU on the accumulators; two bf16 a store. A tile wholly inside
          // y stores without tests (fewer branches: 2.5% of the kernel's time);
          // an edge tile stores rows below M and columns below F (F is even, so
          // a pair is in or out whole).
          const int64_t row0 =
              int64_t(rt) * C::kRows + consumer * kM + warp * 16 + lane / 4;
          if (int64_t(rt + 1) * C::kRows <= args.M &&
              int64_t(ct + 1) * C::kCols <= args.F) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              __nv_bfloat16 *out = args.y + (row0 + 8 * i) * args.F +
                                   int64_t(ct) * C::kCols + 2 * (lane % 4);
#pragma unroll
              for (int j = 0; j < C::kCols / 8; ++j) {
                const int g = 4 * j + 2 * i, up = g + C::kCols / 2;
                *reinterpret_cast<uint32_t *>(out + 8 * j) =
                    packBf16(fastSilu(acc[g]) * acc[up],
                             fastSilu(acc[g + 1]) * acc[up + 1]);
              }
            }
            return;
          }
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int64_t row = row0 + 8 * i;
            if (row >= args.M)
              continue;
            __nv_bfloat16 *out = args.y + row * args.F;
#pragma unroll
            for (int j = 0; j < C::kCols / 8; ++j) {
              const int64_t col =
                  int64_t(ct) * C::kCols + 8 * j + 2 * (lane % 4);
              if (col >= args.F)
                continue;
              const int g = 4 * j + 2 * i, up = g + C::kCols / 2;
              *reinterpret_cast<uint32_t *>(out + col) =
                  packBf16(fastSilu(acc[g]) * acc[up],
                           fastSilu(acc[g + 1]) * acc[up + 1]);
            }
          }
        });
  }
  // No CTA leaves while its peer may still arrive on its barriers.
  if constexpr (Cluster > 1)
    tma::clusterSync();
}

/// Launches the Cluster form on `stream`: one CTA an SM (as many clusters as
/// can be resident at once), each going round the work units.
template <int Cluster>
void launchSwiGluGemm(const __nv_bfloat16 *x, const __nv_bfloat16 *wGate,
                      const __nv_bfloat16 *wUp, SwiGluGemmArgs args,
                      cudaStream_t stream) {
  using C = SwiGluGemmConfig<Cluster>;
  auto kernel = sm90a_swiglu_gemm_bf16_kernel<Cluster>;
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cluster[1];
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim.x = Cluster;
  cluster[0].val.clusterDim.y = 1;
  cluster[0].val.clusterDim.z = 1;
  config.blockDim = dim3(C::kThreads);
  config.dynamicSmemBytes = C::kSmemBytes;
  config.stream = stream;
  config.attrs = cluster;
  config.numAttrs = 1;
  // Per launch: the attribute is the current device's.
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmemBytes)));
  // Resident clusters, found once (the kernel's shared memory allows one CTA
  // an SM; the GPUs of one process are alike).
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
                        "no cluster of the SwiGLU GEMM fits an SM's shared "
                        "memory");
    return clusters;
  }();
  const int64_t rowUnits =
      ((args.M + C::kRows - 1) / C::kRows + Cluster - 1) / Cluster;
  const int64_t units = rowUnits * ((args.F + C::kCols - 1) / C::kCols);
  config.gridDim =
      dim3(unsigned(Cluster * (units < resident ? units : resident)));
  DFLASH_CUDA_CHECK(cudaLaunchKernelEx(
      &config, kernel, args,
      SwiGluGemmMaps{
          tma::bf16RowsOfHeadsMap(x, 1, args.M, 1, args.K, 1, C::kRows,
                                  "swiglu_gemm x"),
          tma::bf16RowsOfHeadsMap(wGate, 1, args.F, 1, args.K, 1, C::kCols,
                                  "swiglu_gemm gate weight"),
          tma::bf16RowsOfHeadsMap(wUp, 1, args.F, 1, args.K, 1, C::kCols,
                                  "swiglu_gemm up weight")}));
  DFLASH_CUDA_CHECK_LAUNCH("sm90a_swiglu_gemm_bf16_kernel");
}

/// The form swiglu_gemm_bf16 launches: one CTA (clusters of two were no
/// faster on the H200, bench/RESULTS.md).
constexpr int kSwiGluGemmCluster = 1;

} // namespace detail

/// y = silu(x Wg^T) * (x Wu^T) (see the file comment); `stream` orders it.
/// The caller checks swigluGemmSupports first.
inline void swiglu_gemm_bf16(const __nv_bfloat16 *x, const __nv_bfloat16 *wGate,
                             const __nv_bfloat16 *wUp, SwiGluGemmArgs args,
                             cudaStream_t stream) {
  if (!swigluGemmSupports(x, wGate, wUp, args.y, args.M, args.F, args.K))
    detail::reportCudaFailure(__FILE__, __LINE__, "swiglu_gemm_bf16",
                              "unsupported shape or alignment (16-byte "
                              "bases, K a multiple of 8, F even)");
  detail::launchSwiGluGemm<detail::kSwiGluGemmCluster>(x, wGate, wUp, args,
                                                       stream);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_SWIGLUGEMM_CUH
