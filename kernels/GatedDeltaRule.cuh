//===- GatedDeltaRule.cuh - The gated delta rule, chunk-wise --*- CUDA -*-===//
//
// dflash.gated_delta_rule (docs/dialect.md) on bf16 tensors, in the
// chunk-wise form of docs/kernels.md ("The gated delta rule, chunk-wise"):
// one CTA per (row, value head) walks its row in chunks of at most
// kDeltaChunk tokens that never cross a conversation start (a chunk that
// begins a conversation zeroes the state). Per chunk, in fp32 shared
// memory: the L2-normalised keys and queries, beta and the cumulative
// decay; the strictly lower A (beta e^(gamma_t - gamma_s) k_t.k_s) and the
// causal P (e^(gamma_t - gamma_s) q_t.k_s); the UT solve (I + A) D = R by
// forward substitution, one thread a value column; the outputs e^gamma Q M
// + P D; and the state M [dk, dv] carried to the next chunk. The first
// kernel, on CUDA cores; GatedDeltaRuleMmaSync.cuh has the tensor-core form,
// chunks of 64 (the two are each other's cross-check in DeltaNetGpuTest).
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_GATEDDELTARULE_CUH
#define DFLASH_KERNELS_GATEDDELTARULE_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/DeltaNetLimits.h"
#include "kernels/GatedDeltaRuleMmaSync.cuh"

#include <cstdint>
#include <cuda_bf16.h>
#include <type_traits>

namespace dflash::kernels {

/// Tokens of one chunk.
constexpr int kDeltaChunk = 32;

namespace detail {

constexpr int kDeltaThreads = 256;

/// Floats of shared memory a CTA of (DK, DV) uses.
constexpr int deltaSharedFloats(int DK, int DV) {
  const int C = kDeltaChunk;
  return DK * DV + 2 * C * DK + 2 * C * DV + 2 * C * C + 3 * C;
}

template <int DK, int DV>
__global__ void __launch_bounds__(kDeltaThreads)
    gatedDeltaRuleKernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                         const __nv_bfloat16 *v, const __nv_bfloat16 *a,
                         const __nv_bfloat16 *beta, const __nv_bfloat16 *aLog,
                         const __nv_bfloat16 *dtBias, const int32_t *pos,
                         __nv_bfloat16 *out, int S, int Hk, int Hv) {
  constexpr int C = kDeltaChunk;
  extern __shared__ float deltaSmem[];
  float *M = deltaSmem;    // [DK][DV], the state
  float *Ks = M + DK * DV; // [C][DK], normalised keys
  float *Qs = Ks + C * DK; // [C][DK], normalised queries times dk^-1/2
  float *Ds = Qs + C * DK; // [C][DV]: v, then R, then D
  float *Os = Ds + C * DV; // [C][DV]: e^gamma Q M
  float *As = Os + C * DV; // [C][C], strictly lower
  float *Ps = As + C * C;  // [C][C], causal
  float *gam = Ps + C * C; // [C], cumulative decay
  float *bet = gam + C;    // [C], sigmoid(b)
  float *carry = bet + C;  // [C], e^(gamma_last - gamma_s)
  __shared__ int chunkEnd, restart;

  const int h = blockIdx.x, row = blockIdx.y, hk = h / (Hv / Hk);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int32_t *p = pos + int64_t(row) * S;
  const float decayRate = -__expf(__bfloat162float(aLog[h]));
  const float bias = __bfloat162float(dtBias[h]);
  const float scale = rsqrtf(float(DK));

  for (int t0 = 0, end = 0; t0 < S; t0 = end) {
    if (tid == 0) {
      int e = t0 + 1;
      while (e < S && e < t0 + C && p[e] == p[e - 1] + 1)
        ++e;
      chunkEnd = e;
      restart = t0 == 0 || p[t0] != p[t0 - 1] + 1;
    }
    __syncthreads();
    // Read once: thread 0 writes the next chunk's after the last barrier.
    end = chunkEnd;
    const int L = end - t0;
    if (restart)
      for (int i = tid; i < DK * DV; i += kDeltaThreads)
        M[i] = 0.f;
    // Keys and queries normalised, a warp a token; values; the gates.
    for (int t = warp; t < L; t += kDeltaThreads / 32) {
      const int64_t tok = int64_t(row) * S + t0 + t;
      const __nv_bfloat16 *kt = k + (tok * Hk + hk) * DK;
      const __nv_bfloat16 *qt = q + (tok * Hk + hk) * DK;
      float kk = 0.f, qq = 0.f;
      for (int i = lane; i < DK; i += 32) {
        const float kv = __bfloat162float(kt[i]), qv = __bfloat162float(qt[i]);
        Ks[t * DK + i] = kv;
        Qs[t * DK + i] = qv;
        kk += kv * kv;
        qq += qv * qv;
      }
      for (int o = 16; o > 0; o /= 2) {
        kk += __shfl_xor_sync(0xffffffffu, kk, o);
        qq += __shfl_xor_sync(0xffffffffu, qq, o);
      }
      const float kn = rsqrtf(kk + 1e-6f), qn = rsqrtf(qq + 1e-6f) * scale;
      for (int i = lane; i < DK; i += 32) {
        Ks[t * DK + i] *= kn;
        Qs[t * DK + i] *= qn;
      }
      const __nv_bfloat16 *vt = v + (tok * Hv + h) * DV;
      for (int j = lane; j < DV; j += 32)
        Ds[t * DV + j] = __bfloat162float(vt[j]);
      if (lane == 0) {
        const float x = __bfloat162float(a[tok * Hv + h]) + bias;
        const float softplus = x > 20.f ? x : log1pf(__expf(x));
        gam[t] = decayRate * softplus;
        bet[t] = 1.f / (1.f + __expf(-__bfloat162float(beta[tok * Hv + h])));
      }
    }
    __syncthreads();
    if (tid == 0)
      for (int t = 1; t < L; ++t)
        gam[t] += gam[t - 1];
    __syncthreads();
    // A and P.
    for (int idx = tid; idx < L * L; idx += kDeltaThreads) {
      const int t = idx / L, s = idx % L;
      float kk = 0.f, qk = 0.f;
      if (s <= t)
        for (int i = 0; i < DK; ++i) {
          kk += Ks[t * DK + i] * Ks[s * DK + i];
          qk += Qs[t * DK + i] * Ks[s * DK + i];
        }
      const float d = s <= t ? __expf(gam[t] - gam[s]) : 0.f;
      As[t * C + s] = s < t ? bet[t] * d * kk : 0.f;
      Ps[t * C + s] = d * qk;
    }
    // R = beta (V - e^gamma K M) in place of V; e^gamma Q M.
    for (int idx = tid; idx < L * DV; idx += kDeltaThreads) {
      const int t = idx / DV, j = idx % DV;
      float km = 0.f, qm = 0.f;
      for (int i = 0; i < DK; ++i) {
        km += Ks[t * DK + i] * M[i * DV + j];
        qm += Qs[t * DK + i] * M[i * DV + j];
      }
      const float decay = __expf(gam[t]);
      Ds[t * DV + j] = bet[t] * (Ds[t * DV + j] - decay * km);
      Os[t * DV + j] = decay * qm;
    }
    __syncthreads();
    // (I + A) D = R: each thread its value columns, tokens in order.
    for (int j = tid; j < DV; j += kDeltaThreads)
      for (int t = 1; t < L; ++t) {
        float acc = Ds[t * DV + j];
        for (int s = 0; s < t; ++s)
          acc -= As[t * C + s] * Ds[s * DV + j];
        Ds[t * DV + j] = acc;
      }
    if (tid < L)
      carry[tid] = __expf(gam[L - 1] - gam[tid]);
    __syncthreads();
    // Outputs.
    for (int idx = tid; idx < L * DV; idx += kDeltaThreads) {
      const int t = idx / DV, j = idx % DV;
      float o = Os[t * DV + j];
      for (int s = 0; s <= t; ++s)
        o += Ps[t * C + s] * Ds[s * DV + j];
      const int64_t tok = int64_t(row) * S + t0 + t;
      out[(tok * Hv + h) * DV + j] = __float2bfloat16(o);
    }
    // The state the next chunk starts with.
    const float last = __expf(gam[L - 1]);
    for (int idx = tid; idx < DK * DV; idx += kDeltaThreads) {
      const int i = idx / DV, j = idx % DV;
      float m = last * M[idx];
      for (int s = 0; s < L; ++s)
        m += carry[s] * Ks[s * DK + i] * Ds[s * DV + j];
      M[idx] = m;
    }
    __syncthreads();
  }
}

template <int DK, int DV>
void launchGatedDeltaRule(const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                          const __nv_bfloat16 *v, const __nv_bfloat16 *a,
                          const __nv_bfloat16 *beta, const __nv_bfloat16 *aLog,
                          const __nv_bfloat16 *dtBias, const int32_t *pos,
                          __nv_bfloat16 *out, int64_t B, int64_t S, int64_t Hk,
                          int64_t Hv, cudaStream_t stream) {
  const int bytes = deltaSharedFloats(DK, DV) * int(sizeof(float));
  DFLASH_CUDA_CHECK(
      cudaFuncSetAttribute(gatedDeltaRuleKernel<DK, DV>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  gatedDeltaRuleKernel<DK, DV>
      <<<dim3(unsigned(Hv), unsigned(B)), kDeltaThreads, bytes, stream>>>(
          q, k, v, a, beta, aLog, dtBias, pos, out, int(S), int(Hk), int(Hv));
  DFLASH_CUDA_CHECK_LAUNCH("gatedDeltaRuleKernel");
}

/// Runs launch(std::integral_constant<int, d>{}) for head dim d (keys and
/// values alike), after checking the shapes the kernels take.
template <typename Launch>
void forGatedDeltaRuleShape(const char *kernel, int64_t Hk, int64_t Hv,
                            int64_t dk, int64_t dv, Launch launch) {
  if (!gatedDeltaRuleSupports(dk, dv) || Hk < 1 || Hv % Hk != 0)
    reportCudaFailure(__FILE__, __LINE__, kernel,
                      "head dims 32, 64 or 128 (keys and values alike), "
                      "value heads a multiple of key heads");
  if (dk == 32)
    launch(std::integral_constant<int, 32>{});
  else if (dk == 64)
    launch(std::integral_constant<int, 64>{});
  else
    launch(std::integral_constant<int, 128>{});
}

} // namespace detail

/// out [B, S, Hv, dv] of q, k [B, S, Hk, dk], v [B, S, Hv, dv], a and beta's
/// logits [B, S, Hv], aLog and dtBias [Hv], pos [B, S] (docs/dialect.md), on
/// CUDA cores (the first kernel; the cross-check of the tensor-core one).
inline void cuda_core_gated_delta_rule_bf16(
    const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
    const __nv_bfloat16 *a, const __nv_bfloat16 *beta,
    const __nv_bfloat16 *aLog, const __nv_bfloat16 *dtBias, const int32_t *pos,
    __nv_bfloat16 *out, int64_t B, int64_t S, int64_t Hk, int64_t Hv,
    int64_t dk, int64_t dv, cudaStream_t stream) {
  detail::forGatedDeltaRuleShape(
      "cuda_core_gated_delta_rule_bf16", Hk, Hv, dk, dv, [&](auto d) {
        detail::launchGatedDeltaRule<d(), d()>(q, k, v, a, beta, aLog, dtBias,
                                               pos, out, B, S, Hk, Hv, stream);
      });
}

/// The same on tensor cores (kernels/GatedDeltaRuleMmaSync.cuh).
inline void mma_sync_gated_delta_rule_bf16(
    const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
    const __nv_bfloat16 *a, const __nv_bfloat16 *beta,
    const __nv_bfloat16 *aLog, const __nv_bfloat16 *dtBias, const int32_t *pos,
    __nv_bfloat16 *out, int64_t B, int64_t S, int64_t Hk, int64_t Hv,
    int64_t dk, int64_t dv, cudaStream_t stream) {
  if (B <= 0 || S <= 0)
    return;
  detail::forGatedDeltaRuleShape(
      "mma_sync_gated_delta_rule_bf16", Hk, Hv, dk, dv, [&](auto d) {
        detail::launchMmaSyncGatedDeltaRule<d(), d()>(
            q, k, v, a, beta, aLog, dtBias, pos, out, B, S, Hk, Hv, stream);
      });
}

/// What the generated step calls: the CUDA-core kernel until the
/// tensor-core one has passed DeltaNetGpuTest on the H200.
inline void
gated_delta_rule_bf16(const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                      const __nv_bfloat16 *v, const __nv_bfloat16 *a,
                      const __nv_bfloat16 *beta, const __nv_bfloat16 *aLog,
                      const __nv_bfloat16 *dtBias, const int32_t *pos,
                      __nv_bfloat16 *out, int64_t B, int64_t S, int64_t Hk,
                      int64_t Hv, int64_t dk, int64_t dv, cudaStream_t stream) {
  cuda_core_gated_delta_rule_bf16(q, k, v, a, beta, aLog, dtBias, pos, out, B,
                                  S, Hk, Hv, dk, dv, stream);
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_GATEDDELTARULE_CUH
