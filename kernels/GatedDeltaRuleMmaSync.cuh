//===- GatedDeltaRuleMmaSync.cuh - Gated delta rule, mma.sync --*- CUDA -*-===//
//
// dflash.gated_delta_rule (docs/dialect.md) in the chunk-wise UT form of
// docs/kernels.md ("The gated delta rule, chunk-wise"), its products on
// mma.sync (bf16 operands, fp32 accumulators). One CTA of 8 warps per
// (row, value head, slice of BV <= 64 value columns): the columns of the
// state M [dk, dv] evolve independently, so a slice carries its own
// [dk, BV] part (in fp32 registers, 32 a thread at dk 128) and recomputes
// the chunk's key-only products. Chunks of up to 64 tokens never cross a
// conversation start (one that begins a conversation zeroes M). Per chunk:
//   1. the chunk's keys and queries L2-normalised (bf16, queries times
//      dk^-1/2), its values, beta and the cumulative decay gamma;
//   2. G = K K^T and Q K^T (tensor cores, from fp16 copies of the
//      normalised k and q: a bf16 dot of two unit vectors loses the first
//      token of a conversation, whose output is that dot times v, to
//      cancellation; test/Reference/delta_rule_chunks.py), then in fp32
//      the strictly lower
//      A = beta_t e^(gamma_t - gamma_s) G and the causal, decayed P; and
//      K M and Q M against M's bf16 copy: R = beta (V - e^gamma K M) and
//      e^gamma Q M;
//   3. T = (I + A)^-1 in fp32: its four 16 x 16 diagonal blocks by forward
//      substitution (a lane a column), then the blocks below them by
//      distance from the diagonal, T_ij = -T_ii sum_k A_ik T_kj;
//   4. D = T R, then the outputs e^gamma Q M + P D (T and P lower
//      triangular: k steps past a row tile's diagonal are skipped);
//   5. M = e^gamma_L M + K^T (e^(gamma_L - gamma_s) D), and its bf16 copy.
// The operands rounded to bf16 are those flash-linear-attention's
// chunk_gated_delta_rule rounds (k, q, the state, A^-1, the corrected
// values), the accumulations fp32; k and q's own products are fp16. Tiles are
// swizzled rows of at least 64 bf16 (WarpMma.cuh's swizzle), so every ldmatrix
// is conflict-free.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_GATEDDELTARULEMMASYNC_CUH
#define DFLASH_KERNELS_GATEDDELTARULEMMASYNC_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/WarpMma.cuh"

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace dflash::kernels {

namespace detail {

/// Tokens of one chunk of the tensor-core form (flash-linear-attention's
/// BT), warps of a CTA.
constexpr int kDeltaMmaChunk = 64;
constexpr int kDeltaMmaWarps = 8;
constexpr int kDeltaMmaThreads = 32 * kDeltaMmaWarps;

template <int DK, int DV> struct DeltaMmaConfig {
  static_assert(DK == 32 || DK == 64 || DK == 128, "key head dim");
  static constexpr int C = kDeltaMmaChunk;
  /// Value columns of a CTA, and the CTAs of one value head.
  static constexpr int BV = DV < 64 ? DV : 64;
  static constexpr int kSlices = DV / BV;
  static_assert(DV % BV == 0 && BV % 32 == 0, "value head dim");
  /// Row lengths of the bf16 tiles (swizzle<> wants 8 chunks a row).
  static constexpr int RK = DK < 64 ? 64 : DK;
  static constexpr int RV = 64;
  static constexpr int RC = C;
  /// fp32 [C][C] tiles, one float of padding a row.
  static constexpr int LD = C + 1;
  /// Chunk products [C x N]: warp w takes rows 16 (w % 4), half the
  /// columns (w / 4); n8 tiles a warp of a [C x BV] and a [C x C] product.
  static constexpr int kVTiles = BV / 16;
  static constexpr int kCTiles = C / 16;
  /// k16 steps over a chunk's tokens.
  static constexpr int kChunkSteps = C / 16;
  /// The state [DK x BV]: kMWarps warps share one 16-row tile of it, each
  /// with kMTiles n8 tiles.
  static constexpr int kMWarps = kDeltaMmaWarps / (DK / 16);
  static constexpr int kMTiles = BV / 8 / kMWarps;
  static_assert(kMTiles >= 1, "state columns per warp");
  /// Elements of a key / value row a lane loads.
  static constexpr int kKeyElems = DK / 32, kValueElems = BV / 32;

  // Shared memory: bf16 tiles, then fp32.
  static constexpr int kKOff = 0;                    // [C][RK] normalised k
  static constexpr int kQOff = kKOff + C * RK;       // [C][RK] scaled q
  static constexpr int kMOff = kQOff + C * RK;       // [DK][RV] bf16 M
  static constexpr int kVOff = kMOff + DK * RV;      // [C][RV] v, then R
  static constexpr int kDOff = kVOff + C * RV;       // [C][RV] D
  static constexpr int kDcOff = kDOff + C * RV;      // [C][RV] carry * D
  static constexpr int kTOff = kDcOff + C * RV;      // [C][RC] T, bf16
  static constexpr int kPOff = kTOff + C * RC;       // [C][RC] P, bf16
  static constexpr int kKhOff = kPOff + C * RC;      // [C][RK] k, fp16
  static constexpr int kQhOff = kKhOff + C * RK;     // [C][RK] q, fp16
  static constexpr int kBf16Elems = kQhOff + C * RK; // 16-bit elements
  static constexpr int kAOff = 0;                    // [C][LD] A
  static constexpr int kTfOff = kAOff + C * LD;      // [C][LD] T
  static constexpr int kXOff = kTfOff + C * LD;      // [3][16][16] scratch
  static constexpr int kGamOff = kXOff + 3 * 256;    // [C] gamma
  static constexpr int kBetOff = kGamOff + C;        // [C] beta
  static constexpr int kEgOff = kBetOff + C;         // [C] e^gamma
  static constexpr int kCarryOff = kEgOff + C;       // [C] e^(gamma_L - gamma)
  static constexpr int kFloats = kCarryOff + C;
  static constexpr size_t kSmemBytes =
      size_t(kBf16Elems) * 2 + size_t(kFloats) * 4;
  static_assert(kBf16Elems % 8 == 0, "fp32 part 16-byte aligned");
};

/// E consecutive bf16 (E = 1, 2 or 4, aligned to E) as floats.
template <int E>
__device__ __forceinline__ void loadBf16Run(const bf16 *src, float (&out)[E]) {
  if constexpr (E == 4) {
    const uint2 raw = *reinterpret_cast<const uint2 *>(src);
    const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162 *>(&raw.x),
                         hi = *reinterpret_cast<const __nv_bfloat162 *>(&raw.y);
    out[0] = __low2float(lo);
    out[1] = __high2float(lo);
    out[2] = __low2float(hi);
    out[3] = __high2float(hi);
  } else if constexpr (E == 2) {
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162 *>(src);
    out[0] = __low2float(v);
    out[1] = __high2float(v);
  } else {
    static_assert(E == 1, "runs of 1, 2 or 4");
    out[0] = __bfloat162float(*src);
  }
}

/// Stores E floats (times `scale`) as consecutive bf16 at `dst`, and as
/// fp16 at `half` when given.
template <int E>
__device__ __forceinline__ void storeRun(bf16 *dst, __half *half,
                                         const float (&in)[E], float scale) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    dst[e] = __float2bfloat16(in[e] * scale);
    if (half)
      half[e] = __float2half_rn(in[e] * scale);
  }
}

/// A fragment of rows [row0, row0 + 16), k columns [16 kk, 16 kk + 16) of a
/// row-major swizzled tile of R-element rows.
template <int R, typename T>
__device__ __forceinline__ void
loadRowsFragment(const T *tile, int row0, int kk, uint32_t (&a)[4], int lane) {
  ldmatrixX4(smemAddress(tile + swizzle<R>(row0 + (lane & 15),
                                           kk * 16 + (lane >> 4) * 8)),
             a[0], a[1], a[2], a[3]);
}

/// A fragment of the transpose: rows [m0, m0 + 16) of A^T, k [16 kk, +16),
/// where the tile holds A row-major, [k][m] (ldmatrix .trans).
template <int R>
__device__ __forceinline__ void loadColumnsFragment(const bf16 *tile, int m0,
                                                    int kk, uint32_t (&a)[4],
                                                    int lane) {
  ldmatrixX4Trans(
      smemAddress(tile + swizzle<R>(kk * 16 + (lane & 7) + ((lane >> 4) << 3),
                                    m0 + ((lane >> 3) & 1) * 8)),
      a[0], a[1], a[2], a[3]);
}

/// B fragments of two n8 tiles [n0, n0 + 16), k [16 kk, +16), of B^T held
/// as a row-major [n][k] tile (keys by their features).
template <int R, typename T>
__device__ __forceinline__ void loadTransposedB(const T *tile, int n0, int kk,
                                                uint32_t (&b)[4], int lane) {
  ldmatrixX4(smemAddress(tile + swizzle<R>(n0 + (lane & 7) + ((lane >> 4) << 3),
                                           kk * 16 + ((lane >> 3) & 1) * 8)),
             b[0], b[1], b[2], b[3]);
}

/// B fragments of two n8 tiles [n0, n0 + 16), k [16 kk, +16), of B held
/// row-major, [k][n] (ldmatrix .trans).
template <int R>
__device__ __forceinline__ void loadB(const bf16 *tile, int n0, int kk,
                                      uint32_t (&b)[4], int lane) {
  ldmatrixX4Trans(smemAddress(tile + swizzle<R>(kk * 16 + (lane & 7) +
                                                    ((lane >> 3) & 1) * 8,
                                                n0 + (lane >> 4) * 8)),
                  b[0], b[1], b[2], b[3]);
}

/// acc[n] += a * (the B fragments of NT n8 tiles loaded two at a time by
/// `load(n0, b)`); an odd NT drops the second tile of the last pair.
template <int NT, typename LoadB>
__device__ __forceinline__ void
mmaTiles(float (&acc)[NT][4], const uint32_t (&a)[4], int n0, LoadB load) {
#pragma unroll
  for (int np = 0; np < (NT + 1) / 2; ++np) {
    uint32_t b[4];
    load(n0 + 16 * np, b);
    mmaBf16(acc[2 * np], a, b[0], b[1]);
    if (2 * np + 1 < NT)
      mmaBf16(acc[2 * np + 1], a, b[2], b[3]);
  }
}

/// keys += K B and queries += Q B over KS k steps for one warp's 16 rows
/// (row0 on) of the key and query tiles, sharing each B fragment pair:
/// load(n, kk, b) gives those of n8 tiles n and n + 8 at k step kk; mma is
/// mmaBf16 or mmaF16, as the tiles hold.
template <int R, int KS, int NT, typename T, typename Mma, typename LoadB>
__device__ __forceinline__ void
mmaKeysAndQueries(Mma mma, const T *keyTile, const T *queryTile, int row0,
                  float (&keys)[NT][4], float (&queries)[NT][4], int lane,
                  LoadB load) {
  static_assert(NT % 2 == 0, "n8 tiles in pairs");
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    uint32_t ak[4], aq[4];
    loadRowsFragment<R>(keyTile, row0, kk, ak, lane);
    loadRowsFragment<R>(queryTile, row0, kk, aq, lane);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      load(16 * np, kk, b);
      mma(keys[2 * np], ak, b[0], b[1]);
      mma(keys[2 * np + 1], ak, b[2], b[3]);
      mma(queries[2 * np], aq, b[0], b[1]);
      mma(queries[2 * np + 1], aq, b[2], b[3]);
    }
  }
}

/// acc += A B for one warp's 16 rows (row0 on) of a lower triangular A
/// [C][RA] (T or P), B [C][RB] from column col0: the k steps past the rows'
/// diagonal block are zeros of A and skipped.
template <int RA, int RB, int KS, int NT>
__device__ __forceinline__ void mmaLowerRows(const bf16 *a, int row0,
                                             const bf16 *b, int col0,
                                             float (&acc)[NT][4], int lane) {
  const int steps = row0 / 16 + 1;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
    if (kk < steps) {
      uint32_t frag[4];
      loadRowsFragment<RA>(a, row0, kk, frag, lane);
      mmaTiles<NT>(acc, frag, col0, [&](int n0, uint32_t (&bf)[4]) {
        loadB<RB>(b, n0, kk, bf, lane);
      });
    }
}

template <int NT> __device__ __forceinline__ void zeroTiles(float (&c)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      c[n][e] = 0.f;
}

/// Row and column of accumulator element e of n8 tile n, for a warp whose
/// tile starts at (row0, col0).
__device__ __forceinline__ int fragmentRow(int row0, int e, int lane) {
  return row0 + lane / 4 + 8 * (e >> 1);
}
__device__ __forceinline__ int fragmentCol(int col0, int n, int e, int lane) {
  return col0 + 8 * n + 2 * (lane & 3) + (e & 1);
}

template <int DK, int DV>
__global__ void __launch_bounds__(kDeltaMmaThreads, 1)
    mmaSyncGatedDeltaRuleKernel(const bf16 *q, const bf16 *k, const bf16 *v,
                                const bf16 *a, const bf16 *beta,
                                const bf16 *aLog, const bf16 *dtBias,
                                const int32_t *pos, bf16 *out, int S, int Hk,
                                int Hv) {
  using Cfg = DeltaMmaConfig<DK, DV>;
  constexpr int C = Cfg::C, BV = Cfg::BV, RK = Cfg::RK, RV = Cfg::RV,
                RC = Cfg::RC, LD = Cfg::LD;
  constexpr int kVTiles = Cfg::kVTiles, kCTiles = Cfg::kCTiles,
                kChunkSteps = Cfg::kChunkSteps, kMTiles = Cfg::kMTiles;
  // The declaration the mma.sync attention kernels make (one per namespace).
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *sh = reinterpret_cast<bf16 *>(smem);
  bf16 *sK = sh + Cfg::kKOff, *sQ = sh + Cfg::kQOff, *sM = sh + Cfg::kMOff,
       *sV = sh + Cfg::kVOff, *sD = sh + Cfg::kDOff, *sDc = sh + Cfg::kDcOff,
       *sT = sh + Cfg::kTOff, *sP = sh + Cfg::kPOff;
  __half *sKh = reinterpret_cast<__half *>(sh + Cfg::kKhOff),
         *sQh = reinterpret_cast<__half *>(sh + Cfg::kQhOff);
  float *fl = reinterpret_cast<float *>(sh + Cfg::kBf16Elems);
  float *fA = fl + Cfg::kAOff, *fT = fl + Cfg::kTfOff, *fX = fl + Cfg::kXOff,
        *gam = fl + Cfg::kGamOff, *bet = fl + Cfg::kBetOff,
        *eg = fl + Cfg::kEgOff, *carry = fl + Cfg::kCarryOff;
  __shared__ int chunkEnd, restart;
  __shared__ float lastDecay;

  const int h = blockIdx.x, row = blockIdx.y, slice = blockIdx.z;
  const int hk = h / (Hv / Hk);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int32_t *p = pos + int64_t(row) * S;
  const float decayRate = -__expf(__bfloat162float(aLog[h]));
  const float bias = __bfloat162float(dtBias[h]);
  const float qScale = rsqrtf(float(DK));
  // This warp's tile of the chunk products, and of the state.
  const int cRow0 = 16 * (warp % 4), cHalf = warp / 4;
  const int vCol0 = cHalf * (BV / 2), cCol0 = cHalf * (C / 2);
  const int mRow0 = 16 * (warp / Cfg::kMWarps),
            mCol0 = (warp % Cfg::kMWarps) * 8 * kMTiles;

  float state[kMTiles][4];
  zeroTiles(state);

  for (int t0 = 0, end = 0; t0 < S; t0 = end) {
    // The chunk: up to C tokens, ending before the next conversation start.
    if (warp == 0) {
      const int limit = min(S, t0 + C);
      const int i0 = t0 + 1 + lane, i1 = t0 + 33 + lane;
      const bool b0 = i0 >= limit || p[i0] != p[i0 - 1] + 1;
      const bool b1 = i1 >= limit || p[i1] != p[i1 - 1] + 1;
      const unsigned m0 = __ballot_sync(0xffffffffu, b0),
                     m1 = __ballot_sync(0xffffffffu, b1);
      if (lane == 0) {
        // i1 reaches t0 + C >= limit, so m1 has a bit when m0 has none.
        chunkEnd = m0 ? t0 + __ffs(int(m0)) : t0 + 32 + __ffs(int(m1));
        restart = t0 == 0 || p[t0] != p[t0 - 1] + 1;
      }
    }
    __syncthreads();
    end = chunkEnd; // thread 0 rewrites it only after the chunk's last barrier
    const int L = end - t0;
    if (restart) {
      zeroTiles(state);
      for (int i = tid; i < DK * RV; i += kDeltaMmaThreads)
        sM[i] = __float2bfloat16(0.f);
    }

    // 1. Keys, queries and values of the chunk, a warp a token; rows past
    // L are zeros (beta 0, no decay), so they add nothing anywhere.
    for (int t = warp; t < C; t += kDeltaMmaWarps) {
      float kv[Cfg::kKeyElems], qv[Cfg::kKeyElems], vv[Cfg::kValueElems];
      const int64_t tok = int64_t(row) * S + t0 + t;
      float kk = 0.f, qq = 0.f;
      if (t < L) {
        loadBf16Run(k + (tok * Hk + hk) * DK + lane * Cfg::kKeyElems, kv);
        loadBf16Run(q + (tok * Hk + hk) * DK + lane * Cfg::kKeyElems, qv);
        loadBf16Run(
            v + (tok * Hv + h) * DV + slice * BV + lane * Cfg::kValueElems, vv);
#pragma unroll
        for (int e = 0; e < Cfg::kKeyElems; ++e) {
          kk += kv[e] * kv[e];
          qq += qv[e] * qv[e];
        }
      } else {
#pragma unroll
        for (int e = 0; e < Cfg::kKeyElems; ++e)
          kv[e] = qv[e] = 0.f;
#pragma unroll
        for (int e = 0; e < Cfg::kValueElems; ++e)
          vv[e] = 0.f;
      }
#pragma unroll
      for (int o = 16; o > 0; o /= 2) {
        kk += __shfl_xor_sync(0xffffffffu, kk, o);
        qq += __shfl_xor_sync(0xffffffffu, qq, o);
      }
      const int at = swizzle<RK>(t, lane * Cfg::kKeyElems);
      storeRun(sK + at, sKh + at, kv, rsqrtf(kk + 1e-6f));
      storeRun(sQ + at, sQh + at, qv, rsqrtf(qq + 1e-6f) * qScale);
      storeRun(sV + swizzle<RV>(t, lane * Cfg::kValueElems), nullptr, vv, 1.f);
      if (lane == 0) {
        float g = 0.f, b = 0.f;
        if (t < L) {
          const float x = __bfloat162float(a[tok * Hv + h]) + bias;
          g = decayRate * (x > 20.f ? x : log1pf(__expf(x)));
          b = 1.f / (1.f + __expf(-__bfloat162float(beta[tok * Hv + h])));
        }
        gam[t] = g;
        bet[t] = b;
      }
    }
    __syncthreads();
    // The cumulative decay, a warp-wide scan of pairs.
    if (warp == 0) {
      const float g0 = gam[2 * lane], g1 = gam[2 * lane + 1];
      float incl = g0 + g1;
#pragma unroll
      for (int o = 1; o < 32; o *= 2) {
        const float up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
          incl += up;
      }
      const float before = incl - (g0 + g1);
      const float c0 = before + g0, c1 = incl;
      // gamma at the chunk's last token L - 1.
      const float last =
          __shfl_sync(0xffffffffu, (L - 1) % 2 ? c1 : c0, (L - 1) / 2);
      gam[2 * lane] = c0;
      gam[2 * lane + 1] = c1;
      eg[2 * lane] = __expf(c0);
      eg[2 * lane + 1] = __expf(c1);
      carry[2 * lane] = 2 * lane < L ? __expf(last - c0) : 0.f;
      carry[2 * lane + 1] = 2 * lane + 1 < L ? __expf(last - c1) : 0.f;
      if (lane == 0)
        lastDecay = __expf(last);
    }
    __syncthreads();

    // 2. The chunk's products.
    float o[kVTiles][4];
    {
      // A and P: a warp whose columns all lie above its rows has none.
      if (cCol0 <= cRow0 + 15) {
        float gk[kCTiles][4], qk[kCTiles][4];
        zeroTiles(gk);
        zeroTiles(qk);
        mmaKeysAndQueries<RK, DK / 16>(mmaF16, sKh, sQh, cRow0, gk, qk, lane,
                                       [&](int n, int kk, uint32_t (&b)[4]) {
                                         loadTransposedB<RK>(sKh, cCol0 + n, kk,
                                                             b, lane);
                                       });
#pragma unroll
        for (int n = 0; n < kCTiles; ++n)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const int t = fragmentRow(cRow0, e, lane);
            const int s = fragmentCol(cCol0, n, e, lane);
            float pv[2];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              // Exponents of s <= t only: gamma is non-increasing.
              const float d = s + j <= t ? __expf(gam[t] - gam[s + j]) : 0.f;
              fA[t * LD + s + j] = s + j < t ? bet[t] * d * gk[n][e + j] : 0.f;
              pv[j] = d * qk[n][e + j];
            }
            *reinterpret_cast<uint32_t *>(sP + swizzle<RC>(t, s)) =
                packBf16(pv[0], pv[1]);
          }
      }
      // K M and Q M: R = beta (V - e^gamma K M) over V, e^gamma Q M in o.
      float km[kVTiles][4];
      zeroTiles(km);
      zeroTiles(o);
      mmaKeysAndQueries<RK, DK / 16>(mmaBf16, sK, sQ, cRow0, km, o, lane,
                                     [&](int n, int kk, uint32_t (&b)[4]) {
                                       loadB<RV>(sM, vCol0 + n, kk, b, lane);
                                     });
#pragma unroll
      for (int n = 0; n < kVTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int t = fragmentRow(cRow0, e, lane);
          const int j = fragmentCol(vCol0, n, e, lane);
          uint32_t *vr = reinterpret_cast<uint32_t *>(sV + swizzle<RV>(t, j));
          const __nv_bfloat162 vx = *reinterpret_cast<__nv_bfloat162 *>(vr);
          *vr = packBf16(bet[t] * (__low2float(vx) - eg[t] * km[n][e]),
                         bet[t] * (__high2float(vx) - eg[t] * km[n][e + 1]));
          o[n][e] *= eg[t];
          o[n][e + 1] *= eg[t];
        }
    }
    __syncthreads();

    // 3. T = (I + A)^-1. The diagonal blocks: warp i < 4, lane j < 16 its
    // column j, rows in order (T's column is 0 above j, 1 at j).
    if (warp < 4 && lane < 16) {
      const int base = 16 * warp, j = lane;
      float col[16];
#pragma unroll
      for (int t = 0; t < 16; ++t) {
        float acc = 0.f;
#pragma unroll
        for (int s = 0; s < t; ++s)
          acc += fA[(base + t) * LD + base + s] * col[s];
        col[t] = t < j ? 0.f : t == j ? 1.f : -acc;
        fT[(base + t) * LD + base + j] = col[t];
        sT[swizzle<RC>(base + t, base + j)] = __float2bfloat16(col[t]);
      }
    }
    __syncthreads();
    // Blocks (i, i - dist), nearest the diagonal first: X = sum over k in
    // [j, i) of A_ik T_kj, then T_ij = -T_ii X.
#pragma unroll
    for (int dist = 1; dist < 4; ++dist) {
      const int outputs = (4 - dist) * 256;
      for (int idx = tid; idx < outputs; idx += kDeltaMmaThreads) {
        const int jb = idx / 256, ib = jb + dist, r = (idx / 16) % 16,
                  c = idx % 16;
        float acc = 0.f;
        for (int kk = 16 * jb; kk < 16 * ib; ++kk)
          acc += fA[(16 * ib + r) * LD + kk] * fT[kk * LD + 16 * jb + c];
        fX[idx] = acc;
      }
      __syncthreads();
      for (int idx = tid; idx < outputs; idx += kDeltaMmaThreads) {
        const int jb = idx / 256, ib = jb + dist, r = (idx / 16) % 16,
                  c = idx % 16;
        float acc = 0.f;
#pragma unroll
        for (int kk = 0; kk < 16; ++kk)
          acc += fT[(16 * ib + r) * LD + 16 * ib + kk] *
                 fX[jb * 256 + kk * 16 + c];
        fT[(16 * ib + r) * LD + 16 * jb + c] = -acc;
        sT[swizzle<RC>(16 * ib + r, 16 * jb + c)] = __float2bfloat16(-acc);
      }
      __syncthreads();
    }

    // 4. D = T R, and the carried copy for the state.
    {
      float d[kVTiles][4];
      zeroTiles(d);
      mmaLowerRows<RC, RV, kChunkSteps>(sT, cRow0, sV, vCol0, d, lane);
#pragma unroll
      for (int n = 0; n < kVTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int t = fragmentRow(cRow0, e, lane);
          const int j = fragmentCol(vCol0, n, e, lane);
          *reinterpret_cast<uint32_t *>(sD + swizzle<RV>(t, j)) =
              packBf16(d[n][e], d[n][e + 1]);
          *reinterpret_cast<uint32_t *>(sDc + swizzle<RV>(t, j)) =
              packBf16(carry[t] * d[n][e], carry[t] * d[n][e + 1]);
        }
    }
    __syncthreads();

    // The outputs: o += P D, rows below L stored.
    {
      mmaLowerRows<RC, RV, kChunkSteps>(sP, cRow0, sD, vCol0, o, lane);
#pragma unroll
      for (int n = 0; n < kVTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int t = fragmentRow(cRow0, e, lane);
          if (t < L) {
            const int j = fragmentCol(vCol0, n, e, lane);
            const int64_t tok = int64_t(row) * S + t0 + t;
            *reinterpret_cast<uint32_t *>(out + (tok * Hv + h) * DV +
                                          slice * BV + j) =
                packBf16(o[n][e], o[n][e + 1]);
          }
        }
    }

    // 5. The state: M = e^gamma_L M + K^T (carry D), and its bf16 copy.
    {
      const float decay = lastDecay;
#pragma unroll
      for (int n = 0; n < kMTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          state[n][e] *= decay;
#pragma unroll
      for (int kk = 0; kk < kChunkSteps; ++kk) {
        uint32_t ak[4];
        loadColumnsFragment<RK>(sK, mRow0, kk, ak, lane);
        mmaTiles<kMTiles>(state, ak, mCol0, [&](int n0, uint32_t (&b)[4]) {
          loadB<RV>(sDc, n0, kk, b, lane);
        });
      }
#pragma unroll
      for (int n = 0; n < kMTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; e += 2)
          *reinterpret_cast<uint32_t *>(
              sM + swizzle<RV>(fragmentRow(mRow0, e, lane),
                               fragmentCol(mCol0, n, e, lane))) =
              packBf16(state[n][e], state[n][e + 1]);
    }
    __syncthreads();
  }
}

template <int DK, int DV>
void launchMmaSyncGatedDeltaRule(const bf16 *q, const bf16 *k, const bf16 *v,
                                 const bf16 *a, const bf16 *beta,
                                 const bf16 *aLog, const bf16 *dtBias,
                                 const int32_t *pos, bf16 *out, int64_t B,
                                 int64_t S, int64_t Hk, int64_t Hv,
                                 cudaStream_t stream) {
  using Cfg = DeltaMmaConfig<DK, DV>;
  auto kernel = mmaSyncGatedDeltaRuleKernel<DK, DV>;
  DFLASH_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(Cfg::kSmemBytes)));
  kernel<<<dim3(unsigned(Hv), unsigned(B), unsigned(Cfg::kSlices)),
           kDeltaMmaThreads, Cfg::kSmemBytes, stream>>>(
      q, k, v, a, beta, aLog, dtBias, pos, out, int(S), int(Hk), int(Hv));
  DFLASH_CUDA_CHECK_LAUNCH("mma_sync_gated_delta_rule_bf16");
}

} // namespace detail
} // namespace dflash::kernels

#endif // DFLASH_KERNELS_GATEDDELTARULEMMASYNC_CUH
