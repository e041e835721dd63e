//===- Wgmma.cuh - Hopper warpgroup MMA and its operands -------*- CUDA -*-===//
//
// Inline-PTX wrappers for the sm_90a warpgroup instructions the attention
// kernels and the SwiGLU GEMM use: wgmma.mma_async m64nNk16 (bf16 in, fp32
// accumulate) with its fence / commit / wait, the shared-memory matrix
// descriptors of its 128B-swizzled operands, setmaxnreg and named barriers. The
// layout facts that descriptors, TMA boxes (kernels/Tma.cuh, SWIZZLE_128B) and
// the tile offsets must agree on are named here once.
//
// Accumulator layout per warp w of the warpgroup: d[4j + 2i + e] is row
// 16w + lane/4 + 8i, column 8j + 2(lane%4) + e (mma.sync's C layout).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_WGMMA_CUH
#define DFLASH_KERNELS_WGMMA_CUH

#include "kernels/WarpMma.cuh"

#include <cstdint>

// wgmma and setmaxnreg exist only on the sm_90a target (not plain sm_90).
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "kernels/Wgmma.cuh needs -gencode=arch=compute_90a,code=sm_90a"
#endif

namespace dflash::kernels::detail::wgmma {

//===-- Warpgroups --------------------------------------------------------===//

constexpr int kWarpThreads = 32;
constexpr int kWarpgroupWarps = 4;
constexpr int kWarpgroupThreads = kWarpgroupWarps * kWarpThreads;
/// Rows of one wgmma (m64): a warpgroup's, 16 per warp.
constexpr int kM = 64;
static_assert(kM == 16 * kWarpgroupWarps, "m64: 16 rows per warp");
/// Depth of one bf16 wgmma (k16).
constexpr int kK = 16;

/// The register file a CTA's warpgroups share; setmaxnreg only moves
/// registers between them: a CTA of `threads` threads (one CTA per SM) is
/// launched with kRegistersPerSm / threads registers each, rounded down to
/// the allocation unit, and the warpgroups' new counts must fit in that.
constexpr int kRegistersPerSm = 64 * 1024;
constexpr int kRegisterUnit = 8;
constexpr int kMaxRegistersPerThread = 255;
constexpr int launchRegistersPerThread(int threads) {
  return kRegistersPerSm / threads / kRegisterUnit * kRegisterUnit <
                 kMaxRegistersPerThread
             ? kRegistersPerSm / threads / kRegisterUnit * kRegisterUnit
             : kMaxRegistersPerThread;
}

/// setmaxnreg.dec / .inc: this warpgroup's registers per thread become Regs.
template <int Regs> __device__ __forceinline__ void decreaseRegisters() {
  static_assert(Regs % kRegisterUnit == 0 && Regs >= 24 && Regs <= 256,
                "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs) : "memory");
}
template <int Regs> __device__ __forceinline__ void increaseRegisters() {
  static_assert(Regs % kRegisterUnit == 0 && Regs >= 24 && Regs <= 256,
                "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs) : "memory");
}

/// bar.sync on named barrier Id for Threads threads (whole warps); id 0 is
/// __syncthreads'.
template <int Id, int Threads>
__device__ __forceinline__ void namedBarrierSync() {
  static_assert(Id > 0 && Id < 16, "named barriers 1-15 (0: __syncthreads)");
  static_assert(Threads % kWarpThreads == 0, "whole warps");
  asm volatile("bar.sync %0, %1;\n" ::"n"(Id), "n"(Threads) : "memory");
}

/// bar.sync / bar.arrive on a named barrier chosen at run time (id in
/// [1, 15]) for Threads threads: a warp that arrives does not wait; the
/// barrier completes once Threads threads have synced or arrived. Apart from
/// the immediate form above because ptxas reserves all 16 named barriers for
/// a kernel that takes an id from a register.
template <int Threads>
__device__ __forceinline__ void namedBarrierSync(int id) {
  static_assert(Threads % kWarpThreads == 0, "whole warps");
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(Threads) : "memory");
}
template <int Threads>
__device__ __forceinline__ void namedBarrierArrive(int id) {
  static_assert(Threads % kWarpThreads == 0, "whole warps");
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(Threads) : "memory");
}

//===-- 128B-swizzled operands --------------------------------------------===//

/// SWIZZLE_128B: rows of 128 bytes (64 bf16: a tile wider than that is
/// stored as panels of 64 columns), in atoms of 8 rows (1024 bytes, also the
/// alignment an atom needs), the 16-byte chunk index XORed with row % 8.
constexpr int kSwizzleRowBytes = 128;
constexpr int kPanelCols = kSwizzleRowBytes / 2;
constexpr int kSwizzleAtomRows = 8;
constexpr int kSwizzleAtomBytes = kSwizzleAtomRows * kSwizzleRowBytes;
/// One k16 step of a K-major bf16 operand spans 32 bytes of its rows.
constexpr int kKStepBytes = kK * 2;
constexpr int kKStepsPerRow = kSwizzleRowBytes / kKStepBytes;

/// Bytes from p to the first swizzle-atom boundary at or after it (atoms
/// must start there).
__device__ __forceinline__ uint32_t swizzleAtomPadding(const void *p) {
  return (kSwizzleAtomBytes - (smemAddress(p) & (kSwizzleAtomBytes - 1))) &
         (kSwizzleAtomBytes - 1);
}

/// Element offset of (row, 16-byte chunk c) in a tile of `Rows` rows stored
/// as panels of [Rows][kPanelCols], each 128B-swizzled: the layout wgmma
/// reads with SWIZZLE_128B (the chunk index XORs with row % 8).
template <int Rows> __device__ __forceinline__ int tileOffset(int row, int c) {
  return (c >> 3) * Rows * kPanelCols + row * kPanelCols +
         (((c & 7) ^ (row & 7)) << 3);
}

//===-- Matrix descriptors ------------------------------------------------===//
//
// A descriptor (PTX ISA, "Matrix Descriptor Format") counts addresses and
// byte offsets in 16-byte units: the start address in bits 0-13, the leading
// byte offset (LBO) from bit 16, the stride byte offset (SBO) from bit 32,
// the swizzle mode in bits 62-63. The kernels keep it as two 32-bit words:
// the low word (start address and LBO) varies, the high word (SBO of one
// atom, 128B swizzle) is a constant, so a tile adds k-step offsets
// (descriptor units) to one register per operand; shared addresses stay
// below 2^18, so the address field never carries.

constexpr int kDescUnitShift = 4;
constexpr int kDescUnitBytes = 1 << kDescUnitShift;
constexpr uint32_t kDescAddressMask = 0x3FFFF;
constexpr int kDescLboBit = 16;
/// Swizzle mode 1 (128B) in bits 62-63, as a bit of the high word.
constexpr uint32_t kDescSwizzle128B = 1u << 30;
/// LBO of a K-major 128B-swizzled operand (unused by that layout: one unit).
constexpr uint32_t kKMajorLbo = kDescUnitBytes;

__device__ __forceinline__ uint32_t descLo(uint32_t addr, uint32_t lbo) {
  return ((addr & kDescAddressMask) >> kDescUnitShift) |
         ((lbo >> kDescUnitShift) << kDescLboBit);
}
__device__ __forceinline__ uint64_t descOf(uint32_t lo) {
  return (static_cast<uint64_t>(
              (uint32_t(kSwizzleAtomBytes) >> kDescUnitShift) |
              kDescSwizzle128B)
          << 32) |
         lo;
}

/// Descriptor offset of k16 step kk of a K-major operand whose panels are
/// panelRows rows apart: kKStepsPerRow steps along a row, then the next panel.
constexpr int kMajorStep(int kk, int panelRows) {
  return ((kk / kKStepsPerRow) * panelRows * kSwizzleRowBytes +
          (kk % kKStepsPerRow) * kKStepBytes) /
         kDescUnitBytes;
}
/// Descriptor offset of k16 step ks of an MN-major operand: 16 rows further.
constexpr int mnMajorStep(int ks) {
  return ks * kK * kSwizzleRowBytes / kDescUnitBytes;
}

//===-- wgmma.mma_async ---------------------------------------------------===//

/// How an operand lies in shared memory, the instruction's transpose bit:
/// K-major (K contiguous along each 128-byte row) or MN-major (transposed).
enum class Major : int { K = 0, MN = 1 };
/// imm-scale-a / imm-scale-b: 1 keeps an operand as it is (-1 would negate).
constexpr int kKeepSign = 1;

/// The instruction for each N, its flags as immediates (Wgmma below).
template <int N> struct MmaAsync;

template <> struct MmaAsync<16> {
  template <int TransA, int TransB>
  static __device__ __forceinline__ void ss(float (&d)[8], uint64_t a,
                                            uint64_t b, int scaleD) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7"
                 "}, %8, %9, p, %11, %12, %13, %14;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
                   "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(a), "l"(b), "r"(scaleD), "n"(kKeepSign), "n"(kKeepSign),
                   "n"(TransA), "n"(TransB));
  }
  template <int TransB>
  static __device__ __forceinline__ void
  rs(float (&d)[8], const uint32_t (&a)[4], uint64_t b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7"
                 "}, {%8, %9, %10, %11}, %12, p, %14, %15, %16;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
                   "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1),
                   "n"(kKeepSign), "n"(kKeepSign), "n"(TransB));
  }
};

template <> struct MmaAsync<32> {
  template <int TransA, int TransB>
  static __device__ __forceinline__ void ss(float (&d)[16], uint64_t a,
                                            uint64_t b, int scaleD) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, p, %19, %20, %21, %22;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
          "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15])
        : "l"(a), "l"(b), "r"(scaleD), "n"(kKeepSign), "n"(kKeepSign),
          "n"(TransA), "n"(TransB));
  }
  template <int TransB>
  static __device__ __forceinline__ void
  rs(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, {%16, %17, %18, %19}, %20, p, %22, %23, %24;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
          "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1),
          "n"(kKeepSign), "n"(kKeepSign), "n"(TransB));
  }
};

template <> struct MmaAsync<64> {
  template <int TransA, int TransB>
  static __device__ __forceinline__ void ss(float (&d)[32], uint64_t a,
                                            uint64_t b, int scaleD) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
        "%30, %31"
        "}, %32, %33, p, %35, %36, %37, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
          "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(scaleD), "n"(kKeepSign), "n"(kKeepSign),
          "n"(TransA), "n"(TransB));
  }
  template <int TransB>
  static __device__ __forceinline__ void
  rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
        "%30, %31"
        "}, {%32, %33, %34, %35}, %36, p, %38, %39, %40;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
          "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1),
          "n"(kKeepSign), "n"(kKeepSign), "n"(TransB));
  }
};

template <> struct MmaAsync<128> {
  template <int TransA, int TransB>
  static __device__ __forceinline__ void ss(float (&d)[64], uint64_t a,
                                            uint64_t b, int scaleD) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
        "%30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
        "%46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
        "%62, %63"
        "}, %64, %65, p, %67, %68, %69, %70;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
          "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]),
          "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
          "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
          "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(scaleD), "n"(kKeepSign), "n"(kKeepSign),
          "n"(TransA), "n"(TransB));
  }
  template <int TransB>
  static __device__ __forceinline__ void
  rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
        "%30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
        "%46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
        "%62, %63"
        "}, {%64, %65, %66, %67}, %68, p, %70, %71, %72;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
          "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]),
          "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
          "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
          "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1),
          "n"(kKeepSign), "n"(kKeepSign), "n"(TransB));
  }
};

template <> struct MmaAsync<256> {
  template <int TransA, int TransB>
  static __device__ __forceinline__ void ss(float (&d)[128], uint64_t a,
                                            uint64_t b, int scaleD) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
        "%30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
        "%46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
        "%62, %63,"
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, "
        "%78, %79,"
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, "
        "%94, %95,"
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
        "%108, %109, %110, %111,"
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, "
        "%123, %124, %125, %126, %127"
        "}, %128, %129, p, %131, %132, %133, %134;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
          "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]),
          "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
          "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
          "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
          "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
          "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]),
          "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),
          "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]),
          "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]),
          "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
          "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
          "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
          "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]),
          "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]),
          "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(a), "l"(b), "r"(scaleD), "n"(kKeepSign), "n"(kKeepSign),
          "n"(TransA), "n"(TransB));
  }
  template <int TransB>
  static __device__ __forceinline__ void
  rs(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
        "%30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
        "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, "
        "%58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, "
        "%72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, "
        "%86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, "
        "%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "
        "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, "
        "%122, %123, %124, %125, %126, %127"
        "}, {%128, %129, %130, %131}, %132, p, %134, %135, %136;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
          "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]),
          "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
          "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
          "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
          "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
          "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]),
          "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),
          "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]),
          "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]),
          "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
          "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
          "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
          "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]),
          "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]),
          "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1),
          "n"(kKeepSign), "n"(kKeepSign), "n"(TransB));
  }
};

/// d (m64 x N fp32, N / 2 per thread) += A * B for one k16 step, A and B
/// laid out as the template says. ss: both operands by descriptor, scaleD = 0
/// overwrites d. rs: A as bf16 fragments in registers (K-major by nature).
template <int N, Major A = Major::K, Major B = Major::K> struct Wgmma {
  static __device__ __forceinline__ void ss(float (&d)[N / 2], uint64_t a,
                                            uint64_t b, int scaleD) {
    MmaAsync<N>::template ss<int(A), int(B)>(d, a, b, scaleD);
  }
  static __device__ __forceinline__ void
  rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b) {
    static_assert(A == Major::K, "register A fragments are K-major");
    MmaAsync<N>::template rs<int(B)>(d, a, b);
  }
};

__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int Pending> __device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}
/// Keeps the compiler from moving accesses of r across wgmma issue/wait.
template <int K> __device__ __forceinline__ void pin(float (&r)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i)
    asm volatile("" : "+f"(r[i])::"memory");
}

} // namespace dflash::kernels::detail::wgmma

#endif // DFLASH_KERNELS_WGMMA_CUH
