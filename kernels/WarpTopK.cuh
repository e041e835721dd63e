//===- WarpTopK.cuh - A warp's running top-K, K <= 64 ----------*- CUDA -*-===//
//
// The order of docs/semantics.md section 13's candidates: the larger value
// first, on ties the lower token. A warp keeps the best K (value, token)
// pairs it has seen as one sorted list, two slots a lane; a pair enters only
// if it beats slot K - 1, so after the first few hundred pairs of a row
// almost none does and the scan costs one compare a value. The lists of a
// CTA's warps are merged by rank (blockTopKMerge): each entry's place is the
// number of entries before it in every list, found by binary search, so the
// result does not depend on which warp saw which token.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_WARPTOPK_CUH
#define DFLASH_KERNELS_WARPTOPK_CUH

#include <climits>
#include <cstdint>

namespace dflash::kernels::topk {

constexpr unsigned kFullMask = 0xffffffffu;
/// Slots a warp's list has: two a lane.
constexpr int kMaxK = 64;

/// (v, i) comes before (w, j): the larger value, on ties the lower token. A
/// NaN comes before nothing and nothing comes before it.
__device__ __forceinline__ bool before(float v, int i, float w, int j) {
  return v > w || (v == w && i < j);
}

/// A warp's sorted list: lane l holds slots l (a) and l + 32 (b); slots
/// from K on are unused. (thrV, thrI) is slot K - 1, the pair to beat.
/// Empty slots are (-inf, INT_MAX), after every real pair.
struct WarpList {
  float av, bv, thrV;
  int ai, bi, thrI;

  __device__ __forceinline__ void clear() {
    av = bv = thrV = -INFINITY;
    ai = bi = thrI = INT_MAX;
  }

  __device__ __forceinline__ bool beats(float v, int i) const {
    return before(v, i, thrV, thrI);
  }

  /// Inserts (v, i), warp-uniform, at its place; the last pair falls out.
  __device__ __forceinline__ void insert(float v, int i, int K, int lane) {
    const bool pa = lane < K && before(av, ai, v, i);
    const bool pb = lane + 32 < K && before(bv, bi, v, i);
    // The list is sorted: the slots before (v, i) are a prefix.
    const int pos = __popc(__ballot_sync(kFullMask, pa)) +
                    __popc(__ballot_sync(kFullMask, pb));
    if (pos >= K)
      return;
    const float upAv = __shfl_up_sync(kFullMask, av, 1);
    const int upAi = __shfl_up_sync(kFullMask, ai, 1);
    const float upBv = __shfl_up_sync(kFullMask, bv, 1);
    const int upBi = __shfl_up_sync(kFullMask, bi, 1);
    const float lastAv = __shfl_sync(kFullMask, av, 31);
    const int lastAi = __shfl_sync(kFullMask, ai, 31);
    const int sb = lane + 32;
    if (sb == pos) {
      bv = v;
      bi = i;
    } else if (sb > pos) {
      bv = lane == 0 ? lastAv : upBv;
      bi = lane == 0 ? lastAi : upBi;
    }
    if (lane == pos) {
      av = v;
      ai = i;
    } else if (lane > pos) {
      av = upAv;
      ai = upAi;
    }
    refreshThreshold(K);
  }

  /// Takes the pair to beat from slot K - 1 (after the slots were set).
  __device__ __forceinline__ void refreshThreshold(int K) {
    const int s = K - 1;
    thrV = __shfl_sync(kFullMask, s < 32 ? av : bv, s & 31);
    thrI = __shfl_sync(kFullMask, s < 32 ? ai : bi, s & 31);
  }

  /// Offers each lane's pair (ok: it has one); warp-uniform call.
  __device__ __forceinline__ void offer(bool ok, float v, int i, int K,
                                        int lane) {
    for (unsigned m = __ballot_sync(kFullMask, ok && beats(v, i)); m;
         m &= m - 1) {
      const int src = __ffs(m) - 1;
      const float cv = __shfl_sync(kFullMask, v, src);
      const int ci = __shfl_sync(kFullMask, i, src);
      if (beats(cv, ci)) // against the K-th as it is now
        insert(cv, ci, K, lane);
    }
  }

  /// Offers each lane's N consecutive tokens first, first + 1, ... (ok:
  /// the lane has them); warp-uniform call.
  template <int N>
  __device__ __forceinline__ void offer(bool ok, const float (&f)[N], int first,
                                        int K, int lane) {
    unsigned mine = 0;
    if (ok)
#pragma unroll
      for (int e = 0; e < N; ++e)
        mine |= beats(f[e], first + e) ? 1u << e : 0u;
    for (unsigned m = __ballot_sync(kFullMask, mine != 0); m; m &= m - 1) {
      const int src = __ffs(m) - 1;
      const unsigned bits = __shfl_sync(kFullMask, mine, src);
      const int base = __shfl_sync(kFullMask, first, src);
#pragma unroll
      for (int e = 0; e < N; ++e)
        if (bits >> e & 1u) {
          const float cv = __shfl_sync(kFullMask, f[e], src);
          if (beats(cv, base + e))
            insert(cv, base + e, K, lane);
        }
    }
  }

  /// Writes the K slots to sV[0, K), sI[0, K).
  __device__ __forceinline__ void store(float *sV, int *sI, int K,
                                        int lane) const {
    if (lane < K) {
      sV[lane] = av;
      sI[lane] = ai;
    }
    if (lane + 32 < K) {
      sV[lane + 32] = bv;
      sI[lane + 32] = bi;
    }
  }
};

/// Entries of the sorted list (v[0, K), i[0, K)) that come before (w, j).
__device__ __forceinline__ int countBefore(const float *v, const int *i, int K,
                                           float w, int j) {
  int lo = 0, hi = K; // the answer lies in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (before(v[mid], i[mid], w, j))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/// The CTA's top K of `lists` sorted lists of K each in shared memory (sV,
/// sI, list l at l * K), written in order to outV / outI[0, K). Every
/// thread calls it, after a barrier that follows the lists' stores. Each
/// token is in one list at most, so ranks are distinct among real pairs;
/// empty slots rank after them and are not written (there are K real
/// pairs whenever the lists saw K tokens or more).
__device__ __forceinline__ void blockTopKMerge(const float *sV, const int *sI,
                                               int lists, int K, float *outV,
                                               int32_t *outI) {
  for (int e = threadIdx.x; e < lists * K; e += blockDim.x) {
    const float v = sV[e];
    const int i = sI[e];
    if (i == INT_MAX)
      continue;
    const int own = e / K;
    int rank = e - own * K;
    for (int l = 0; l < lists && rank < K; ++l)
      if (l != own)
        rank += countBefore(sV + l * K, sI + l * K, K, v, i);
    if (rank < K) {
      outV[rank] = v;
      outI[rank] = i;
    }
  }
}

} // namespace dflash::kernels::topk

#endif // DFLASH_KERNELS_WARPTOPK_CUH
