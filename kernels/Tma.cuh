//===- Tma.cuh - Tensor memory accelerator and mbarriers -------*- CUDA -*-===//
//
// Hopper's bulk tensor copies (TMA) global -> shared memory and the
// transaction barriers (mbarrier) that say when a copy has landed. A tensor
// map describes one global bf16 tensor of rank 4 and the box one copy moves;
// it is encoded on the host (through the driver entry point, so nothing
// links libcuda) and passed to the kernel as a __grid_constant__ parameter.
// Boxes of 64 bf16 (128 bytes) wide land 128B-swizzled: the layout that
// wgmma reads with SWIZZLE_128B descriptors (kernels/Wgmma.cuh). The bulk
// reductions (shared -> global fp32 adds) share the same async machinery.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_TMA_CUH
#define DFLASH_KERNELS_TMA_CUH

#include "kernels/CudaCheck.cuh"

#include <cstdint>
#include <cstdio>
#include <cuda.h>
#include <cudaTypedefs.h>

namespace dflash::kernels::tma {

//===-- Device side -------------------------------------------------------===//

/// Bytes of one mbarrier (an 8-byte aligned uint64_t in shared memory).
constexpr int kBarrierBytes = 8;

__device__ __forceinline__ void barrierInit(uint32_t bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar),
               "r"(arrivals)
               : "memory");
}

/// Makes barrier initialisation visible to the async proxy (the copies that
/// complete on it); a __syncthreads after it publishes it to the CTA.
__device__ __forceinline__ void fenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n"
               "fence.proxy.async.shared::cta;\n" ::
                   : "memory");
}

/// One arrival that also announces `bytes` of copies completing on `bar`.
__device__ __forceinline__ void arriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
      "r"(bytes)
      : "memory");
}

/// Waits until the barrier's phase of this parity has completed.
__device__ __forceinline__ void waitParity(uint32_t bar, uint32_t parity) {
  asm volatile("{\n.reg .pred done;\n"
               "WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT;\n}\n" ::"r"(bar),
               "r"(parity)
               : "memory");
}

/// Generic-proxy writes of this thread (st.shared, cp.async) become visible
/// to async-proxy reads of shared memory (bulk copies and reductions,
/// wgmma's operands) only after this fence.
__device__ __forceinline__ void fenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/// One arrival on `bar`, announcing no transaction bytes.
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar)
               : "memory");
}

/// Copies the box at coordinates (c0 innermost .. c3) of `map` to shared
/// address dst (1024-byte aligned for 128B swizzling); completes `bytes`
/// (the whole box, out-of-bounds parts zero-filled) on bar.
__device__ __forceinline__ void load4d(uint32_t dst, const CUtensorMap *map,
                                       uint32_t bar, int c0, int c1, int c2,
                                       int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::"
      "complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3)
      : "memory");
}

/// load4d's box copied to the same shared offset (dst, and its completion
/// to bar's offset) in every CTA of the cluster whose bit is set in ctaMask.
__device__ __forceinline__ void
load4dMulticast(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0,
                int c1, int c2, int c3, uint16_t ctaMask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::"
      "complete_tx::bytes.multicast::cluster [%0], [%1, {%3, %4, %5, %6}], "
      "[%2], %7;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2),
      "r"(c3), "h"(ctaMask)
      : "memory");
}

//===-- Thread block clusters ---------------------------------------------===//

/// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t clusterRank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

/// One arrival on the barrier at shared offset `bar` of the cluster's CTA
/// `rank` (this CTA's own included), with mbarrier.arrive's default
/// semantics (release at CTA scope): enough to hand back a stage that this
/// thread's wgmma reads have finished with. A release at cluster scope
/// compiles to MEMBAR.ALL.GPU and ERRBAR before every arrival, which took
/// the cluster form of the SwiGLU GEMM from 672 to 401 TFLOP/s.
__device__ __forceinline__ void arriveInCta(uint32_t bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}

/// Every thread of the cluster waits here for all the others (barrier
/// initialisation before a peer copies into this CTA; no CTA leaves while a
/// peer may still arrive on its barriers).
__device__ __forceinline__ void clusterSync() {
  asm volatile("barrier.cluster.arrive.release;\n"
               "barrier.cluster.wait.acquire;\n" ::
                   : "memory");
}

/// cudaLaunchKernelEx's configuration for clusters of the shape `cluster`
/// (the grid is the caller's to set): `attribute` holds that shape and must
/// outlive the launch.
inline cudaLaunchConfig_t clusterLaunchConfig(dim3 cluster, unsigned threads,
                                              size_t smem, cudaStream_t stream,
                                              cudaLaunchAttribute &attribute) {
  attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = cluster.x;
  attribute.val.clusterDim.y = cluster.y;
  attribute.val.clusterDim.z = cluster.z;
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return config;
}

/// Adds Bytes of fp32 at shared address src into global memory at dst, one
/// bulk reduction performed asynchronously (cp.reduce.async.bulk) in this
/// thread's current bulk group.
template <int Bytes>
__device__ __forceinline__ void bulkReduceAddF32(float *dst, uint32_t src) {
  static_assert(Bytes % 16 == 0, "bulk copies move multiples of 16 bytes");
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 "
               "[%0], [%1], %2;\n" ::"l"(dst),
               "r"(src), "n"(Bytes)
               : "memory");
}
/// Closes this thread's current bulk group.
__device__ __forceinline__ void bulkCommit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
/// Waits until at most Pending of this thread's bulk groups have still to
/// read their shared sources (the sources may then be rewritten).
template <int Pending> __device__ __forceinline__ void bulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(Pending) : "memory");
}
/// Waits until at most Pending of this thread's bulk groups are incomplete.
template <int Pending> __device__ __forceinline__ void bulkWait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(Pending) : "memory");
}

//===-- Host side ---------------------------------------------------------===//

namespace detail {
inline PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void *p = nullptr;
    cudaDriverEntryPointQueryResult found;
    DFLASH_CUDA_CHECK(cudaGetDriverEntryPointByVersion(
        "cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || p == nullptr)
      kernels::detail::reportCudaFailure(
          __FILE__, __LINE__, "cudaGetDriverEntryPointByVersion",
          "the driver has no cuTensorMapEncodeTiled (needs CUDA 12 or later)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}
} // namespace detail

/// bf16 columns of every box: 128 bytes, one SWIZZLE_128B row.
constexpr uint32_t kSwizzle128BBoxCols = 64;

/// Tensor map of a bf16 tensor [batch][rows][heads][d] (d contiguous) and a
/// box of boxRows x boxHeads x 64 (128 bytes of d, 128B-swizzled) of one
/// batch entry; coordinates (d, head, row, batch). Names `what` in the error
/// when the driver refuses the description.
inline CUtensorMap bf16RowsOfHeadsMap(const void *base, uint64_t batch,
                                      uint64_t rows, uint64_t heads, uint64_t d,
                                      uint32_t boxHeads, uint32_t boxRows,
                                      const char *what) {
  CUtensorMap map;
  const cuuint64_t globalDim[4] = {d, heads, rows, batch};
  const cuuint64_t globalStrides[3] = {d * 2, heads * d * 2,
                                       rows * heads * d * 2};
  const cuuint32_t boxDim[4] = {kSwizzle128BBoxCols, boxHeads, boxRows, 1};
  const cuuint32_t elementStrides[4] = {1, 1, 1, 1};
  CUresult r = detail::encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void *>(base),
      globalDim, globalStrides, boxDim, elementStrides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    char message[160];
    std::snprintf(message, sizeof message,
                  "CUresult %d for tensor %s (the base must be 16-byte "
                  "aligned, strides multiples of 16 bytes)",
                  static_cast<int>(r), what);
    kernels::detail::reportCudaFailure(__FILE__, __LINE__,
                                       "cuTensorMapEncodeTiled", message);
  }
  return map;
}

} // namespace dflash::kernels::tma

#endif // DFLASH_KERNELS_TMA_CUH
