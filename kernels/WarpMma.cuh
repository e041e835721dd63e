//===- WarpMma.cuh - mma.sync, ldmatrix, cp.async --------------*- CUDA -*-===//
//
// Thin inline-PTX wrappers for the sm_80+ instructions the hand-written
// kernels use: mma.sync m16n8k16 (bf16 or fp16 in, fp32 accumulate), ldmatrix
// and cp.async, plus the XOR swizzle that keeps ldmatrix free of bank
// conflicts, and the tile products of one warp that the attention kernels
// share.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
// g = lane / 4 and t = lane % 4:
//   A (16x16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..),
//                         a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16x8, "col"):      b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C (16x8, fp32):       c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
// so the C fragments of two adjacent n-tiles, packed to bf16, are the A
// fragment of the next product (the FlashAttention-2 register reuse).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_WARPMMA_CUH
#define DFLASH_KERNELS_WARPMMA_CUH

#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels::detail {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ uint32_t smemAddress(const void *ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

/// 16-byte asynchronous global->shared copy; zero-fills when !valid (the
/// source is then not read).
__device__ __forceinline__ void cpAsync16(uint32_t dst, const void *src,
                                          bool valid) {
  int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(src), "r"(bytes)
               : "memory");
}

/// 4-byte asynchronous global->shared copy; zero-fills when !valid.
__device__ __forceinline__ void cpAsync4(uint32_t dst, const void *src,
                                         bool valid) {
  int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst),
               "l"(src), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void cpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int Pending> __device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

__device__ __forceinline__ void ldmatrixX4(uint32_t addr, uint32_t &r0,
                                           uint32_t &r1, uint32_t &r2,
                                           uint32_t &r3) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
      : "r"(addr)
      : "memory");
}

__device__ __forceinline__ void ldmatrixX4Trans(uint32_t addr, uint32_t &r0,
                                                uint32_t &r1, uint32_t &r2,
                                                uint32_t &r3) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
      : "r"(addr)
      : "memory");
}

/// d += a * b for one m16n8k16 tile.
__device__ __forceinline__ void mmaBf16(float (&d)[4], const uint32_t (&a)[4],
                                        uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// d += a * b for one m16n8k16 tile of fp16 operands.
__device__ __forceinline__ void mmaF16(float (&d)[4], const uint32_t (&a)[4],
                                       uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats as a bf16x2 register, `lo` in the low half (lower column).
__device__ __forceinline__ uint32_t packBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

/// 2^x on the special-function unit; 2^-inf = 0.
__device__ __forceinline__ float exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// Element offset of (row, col) in a shared tile of rows of `RowElems` bf16
/// whose 16-byte chunks are XOR-swizzled by row % 8, so that the 8 row
/// addresses of one ldmatrix phase fall in 8 different bank groups.
template <int RowElems>
__device__ __forceinline__ int swizzle(int row, int col) {
  static_assert(RowElems % 64 == 0, "rows must hold a multiple of 8 chunks");
  return row * RowElems + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

//===-- Tile products of one warp -----------------------------------------===//
// On swizzled bf16 tiles of rows of D (or NK) elements in shared memory.

/// Loads 16 rows x D of a swizzled tile starting at `row0` as A fragments.
template <int D>
__device__ __forceinline__ void loadAFragments(const bf16 *tile, int row0,
                                               uint32_t (&frag)[D / 16][4],
                                               int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrixX4(smemAddress(tile + swizzle<D>(row0 + (lane & 15),
                                             kk * 16 + (lane >> 4) * 8)),
               frag[kk][0], frag[kk][1], frag[kk][2], frag[kk][3]);
}

/// S = Q K^T for one warp's 16 rows against NK keys of a shared tile; qf is
/// the warp's Q as A fragments.
template <int D, int NK>
__device__ __forceinline__ void warpQKt(const uint32_t (&qf)[D / 16][4],
                                        const bf16 *tileK,
                                        float (&s)[NK / 8][4], int lane) {
#pragma unroll
  for (int nt = 0; nt < NK / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[nt][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < NK / 16; ++np) {
      uint32_t b0, b1, b2, b3;
      int key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
      int col = kk * 16 + ((lane >> 3) & 1) * 8;
      ldmatrixX4(smemAddress(tileK + swizzle<D>(key, col)), b0, b1, b2, b3);
      mmaBf16(s[2 * np], qf[kk], b0, b1);
      mmaBf16(s[2 * np + 1], qf[kk], b2, b3);
    }
  }
}

/// acc (16 x D) += P (16 x NK, C fragments in p) * V (NK x D shared tile).
template <int D, int NK>
__device__ __forceinline__ void warpPV(const float (&p)[NK / 8][4],
                                       const bf16 *tileV,
                                       float (&acc)[D / 8][4], int lane) {
#pragma unroll
  for (int ks = 0; ks < NK / 16; ++ks) {
    uint32_t a[4] = {packBf16(p[2 * ks][0], p[2 * ks][1]),
                     packBf16(p[2 * ks][2], p[2 * ks][3]),
                     packBf16(p[2 * ks + 1][0], p[2 * ks + 1][1]),
                     packBf16(p[2 * ks + 1][2], p[2 * ks + 1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b0, b1, b2, b3;
      int key = ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      int col = dp * 16 + (lane >> 4) * 8;
      ldmatrixX4Trans(smemAddress(tileV + swizzle<D>(key, col)), b0, b1, b2,
                      b3);
      mmaBf16(acc[2 * dp], a, b0, b1);
      mmaBf16(acc[2 * dp + 1], a, b2, b3);
    }
  }
}

} // namespace dflash::kernels::detail

#endif // DFLASH_KERNELS_WARPMMA_CUH
