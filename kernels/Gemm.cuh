//===- Gemm.cuh - cuBLASLt linear-layer GEMMs ------------------*- CUDA -*-===//
//
// The three products of a bias-free linear layer, on row-major bf16 tensors
// with fp32 accumulation:
//   linear:           y  [M, N] = x [M, K] * w [N, K]^T  (bf16, or fp32:
//                     linearF32)
//   linearResidual:   y  [M, N] = r [M, N] + x [M, K] * w [N, K]^T
//   linearBias:       y  [M, N] = x [M, K] * w [N, K]^T + b [N]  (a target's
//                     biased projections; cuBLASLt's bias epilogue)
//   linearGradInput:  dx [M, K] = dy [M, N] * w [N, K]
//   linearGradWeight: dw [N, K] = dy [M, N]^T * x [M, K]   (beta = 1
//   accumulates)
// A row-major [R, C] matrix is a column-major [C, R] one, so each maps to one
// column-major cuBLASLt matmul with swapped operands. A plan is made once per
// static shape and cached with its descriptors: cuBLASLt's heuristic lists up
// to kGemmCandidates algorithms, and the first is used until timeCandidates()
// times them all on scratch operands of that shape and keeps the fastest.
// At the step's shapes the heuristic's first choice is 2-10% slower than the
// fastest of its list (bench/RESULTS.md, "GEMM algorithms by timing").
// Timing needs a stream that is not capturing, so the runtime calls it after
// a capture (and captures again if an algorithm changed) or after the first
// eager launch. Every planner of a process on the same kind of GPU agrees on
// a shape's algorithm: the first to time it decides for all, so that ranks,
// the step and its evaluation compute alike. The workspace belongs to the
// caller. One object per GPU worker thread: it is not synchronised.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_GEMM_CUH
#define DFLASH_KERNELS_GEMM_CUH

#include "kernels/CudaCheck.cuh"
#include "kernels/GemmTiming.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace dflash::kernels {

namespace detail {
/// Scratch operands for timing: bounded values that keep the tensor cores as
/// busy (and the power draw as high) as real activations do; zeros would not.
static __global__ void fillGemmScratch(__nv_bfloat16 *p, size_t n,
                                       uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 29;
    p[i] = __float2bfloat16(float(int(z & 0xFFFF) - 32768) / 32768.f);
  }
}
} // namespace detail

class CublasLtGemm {
public:
  /// Plans for the current device (its name and multiprocessor count key
  /// the choices that planners share).
  CublasLtGemm(cublasLtHandle_t handle, void *workspace, size_t workspaceBytes)
      : handle(handle), workspace(workspace), workspaceBytes(workspaceBytes) {
    int device = 0;
    cudaDeviceProp prop;
    DFLASH_CUDA_CHECK(cudaGetDevice(&device));
    DFLASH_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    deviceKind = std::string(prop.name) + "/" +
                 std::to_string(prop.multiProcessorCount) + "/" +
                 std::to_string(workspaceBytes);
  }
  CublasLtGemm(const CublasLtGemm &) = delete;
  CublasLtGemm &operator=(const CublasLtGemm &) = delete;
  ~CublasLtGemm() {
    for (auto &entry : plans) {
      cublasLtMatrixLayoutDestroy(entry.second.a);
      cublasLtMatrixLayoutDestroy(entry.second.b);
      cublasLtMatrixLayoutDestroy(entry.second.c);
      cublasLtMatmulDescDestroy(entry.second.desc);
    }
  }

  /// y [M, N] = x [M, K] w [N, K]^T + beta y.
  void linear(const __nv_bfloat16 *x, const __nv_bfloat16 *w, __nv_bfloat16 *y,
              int64_t M, int64_t N, int64_t K, cudaStream_t stream,
              float beta = 0.f) {
    matmul(CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, w, K, x, K, y, N, CUDA_R_16BF,
           beta, stream, {"linear", M, N, K});
  }

  /// y [M, N] = x [M, K] w [N, K]^T in fp32 (the DFlash2 selector's logits
  /// and projection, kernels/DFlash2Selector.cuh).
  void linearF32(const __nv_bfloat16 *x, const __nv_bfloat16 *w, float *y,
                 int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
    matmul(CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, w, K, x, K, y, N, CUDA_R_32F, 0.f,
           stream, {"linear", M, N, K});
  }

  /// y [M, N] = r [M, N] + x [M, K] w [N, K]^T, rounded once: r is the
  /// epilogue's C operand (beta = 1). y may be r.
  void linearResidual(const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                      const __nv_bfloat16 *r, __nv_bfloat16 *y, int64_t M,
                      int64_t N, int64_t K, cudaStream_t stream) {
    matmul(CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, w, K, x, K, y, N, CUDA_R_16BF,
           1.f, stream, {"linearResidual", M, N, K}, r);
  }

  /// y [M, N] = x [M, K] w [N, K]^T + bias [N], rounded once (the bias is
  /// added to the fp32 product in the epilogue).
  void linearBias(const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                  const __nv_bfloat16 *bias, __nv_bfloat16 *y, int64_t M,
                  int64_t N, int64_t K, cudaStream_t stream) {
    matmul(CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, w, K, x, K, y, N, CUDA_R_16BF,
           0.f, stream, {"linearBias", M, N, K}, nullptr, bias);
  }

  /// dx [M, K] = dy [M, N] w [N, K] + beta dx.
  void linearGradInput(const __nv_bfloat16 *dy, const __nv_bfloat16 *w,
                       __nv_bfloat16 *dx, int64_t M, int64_t N, int64_t K,
                       cudaStream_t stream, float beta = 0.f) {
    matmul(CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, w, K, dy, N, dx, K, CUDA_R_16BF,
           beta, stream, {"linearGradInput", M, N, K});
  }

  /// dw [N, K] = dy [M, N]^T x [M, K] + beta dw; dw bf16 or fp32.
  template <typename OutT>
  void linearGradWeight(const __nv_bfloat16 *dy, const __nv_bfloat16 *x,
                        OutT *dw, int64_t M, int64_t N, int64_t K,
                        cudaStream_t stream, float beta = 0.f) {
    static_assert(std::is_same_v<OutT, float> ||
                      std::is_same_v<OutT, __nv_bfloat16>,
                  "dw is bf16 or fp32");
    matmul(CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, x, K, dy, N, dw, K,
           std::is_same_v<OutT, float> ? CUDA_R_32F : CUDA_R_16BF, beta, stream,
           {"linearGradWeight", M, N, K});
  }

  /// Number of distinct shapes planned so far.
  size_t numPlans() const { return plans.size(); }

  /// Off: every shape keeps the heuristic's first algorithm (runs compare
  /// bit for bit with runs that did not time). Applies to shapes planned
  /// afterwards.
  void setTiming(bool on) { timing = on; }

  /// Number of plans whose candidates have not been timed yet.
  size_t untimedPlans() const {
    size_t n = 0;
    for (const auto &entry : plans)
      n += entry.second.timed ? 0 : 1;
    return n;
  }

  /// Times every untimed plan's candidates on `stream` (which must not be
  /// capturing) on scratch operands of the plan's shape: `rounds` launches of
  /// each, interleaved so that the clock's drift under the power cap falls on
  /// all alike, after one warm-up launch each. A plan keeps the heuristic's
  /// first algorithm unless another's median is at least `margin` faster, so
  /// that near-ties do not flip between runs. The GPU is not warmed to its
  /// power-capped clock first: candidates ranked there made the target's
  /// forward no faster (bench/RESULTS.md, "GEMM timing at the sustained
  /// clock"). Synchronises the stream. Returns how many plans changed
  /// algorithm. A plan whose scratch does not fit in free memory keeps its
  /// first candidate.
  int timeCandidates(cudaStream_t stream, int rounds = 7,
                     float margin = 0.02f) {
    const auto start = std::chrono::steady_clock::now();
    int changed = 0;
    for (auto &entry : plans) {
      Plan &plan = entry.second;
      if (plan.timed)
        continue;
      plan.timed = true;
      const int before = plan.chosen;
      SharedChoices &shared = sharedChoices();
      const auto sharedKey = std::make_pair(deviceKind, entry.first);
      bool decided = false;
      {
        std::lock_guard<std::mutex> lock(shared.mutex);
        auto known = shared.chosen.find(sharedKey);
        if (known != shared.chosen.end()) {
          plan.chosen = known->second;
          decided = true;
          ++summary.agreed;
        }
      }
      if (!decided) { // time it here
        if (!timePlan(plan, stream, rounds, margin))
          ++summary.untimed;
        ++summary.timed;
        std::lock_guard<std::mutex> lock(shared.mutex);
        // Another planner may have decided while this one timed: its
        // choice stands.
        plan.chosen =
            shared.chosen.emplace(sharedKey, plan.chosen).first->second;
      }
      summary.faster += plan.chosen != 0 ? 1 : 0;
      changed += plan.chosen != before ? 1 : 0;
    }
    summary.seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    return changed;
  }

  const GemmTimingSummary &timingSummary() const { return summary; }

  /// One entry per timed plan, in plan order.
  std::vector<GemmCandidateTimes> timings() const {
    std::vector<GemmCandidateTimes> all;
    for (const auto &entry : plans)
      if (entry.second.timed && !entry.second.timing.ms.empty())
        all.push_back(entry.second.timing);
    return all;
  }

private:
  struct Plan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    std::vector<cublasLtMatmulAlgo_t> candidates; // heuristic order
    int chosen = 0;
    bool timed = false;
    // What timePlan needs to make scratch operands.
    uint64_t aBytes = 0, bBytes = 0, cBytes = 0;
    GemmCandidateTimes timing;
  };
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int, int, int, int, bool>;

  /// The process's choices: (deviceKind, shape) -> candidate index. The
  /// candidate lists agree wherever the key does (same GPU kind, library
  /// and workspace size).
  struct SharedChoices {
    std::mutex mutex;
    std::map<std::pair<std::string, Key>, int> chosen;
  };
  static SharedChoices &sharedChoices() {
    static SharedChoices choices;
    return choices;
  }

  static int alignmentOf(const void *p) {
    uintptr_t v = reinterpret_cast<uintptr_t>(p);
    int a = 256;
    while (a > 2 && v % a != 0)
      a /= 2;
    return a;
  }

  /// The linear-layer product a plan serves, in that product's M, N, K.
  struct Product {
    const char *name;
    int64_t M, N, K;
  };

  /// Column-major D [m, n] = op(A) op(B) + beta C (+ bias [m] when given),
  /// where D is `C` and C is `addend` when given, else `C` too.
  void matmul(cublasOperation_t opA, cublasOperation_t opB, int64_t m,
              int64_t n, int64_t k, const void *A, int64_t lda, const void *B,
              int64_t ldb, void *C, int64_t ldc, cudaDataType_t cType,
              float beta, cudaStream_t stream, Product product,
              const void *addend = nullptr, const void *bias = nullptr) {
    if (m == 0 || n == 0)
      return;
    const void *source = addend ? addend : C;
    int alignA = alignmentOf(A), alignB = alignmentOf(B),
        alignC = std::min(alignmentOf(C), alignmentOf(source));
    const bool biased = bias != nullptr;
    Key key{opA, opB,   m,      n,      k,      lda,   ldb,
            ldc, cType, alignA, alignB, alignC, biased};
    auto it = plans.find(key);
    if (it == plans.end())
      it = plans
               .emplace(key, makePlan(opA, opB, m, n, k, lda, ldb, ldc, cType,
                                      alignA, alignB, alignC, product, biased))
               .first;
    const Plan &plan = it->second;
    // The plan's descriptor is this call's: its bias pointer is set per call
    // (a captured graph keeps the launch's).
    if (biased)
      DFLASH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    float alpha = 1.f;
    DFLASH_CUBLAS_CHECK(cublasLtMatmul(handle, plan.desc, &alpha, A, plan.a, B,
                                       plan.b, &beta, source, plan.c, C, plan.c,
                                       &plan.candidates[plan.chosen], workspace,
                                       workspaceBytes, stream));
  }

  /// False when the scratch operands do not fit in free memory: the plan
  /// keeps its first candidate, untimed.
  bool timePlan(Plan &plan, cudaStream_t stream, int rounds, float margin) {
    void *a = nullptr, *b = nullptr, *c = nullptr;
    auto release = [&] {
      cudaFree(a);
      cudaFree(b);
      cudaFree(c);
    };
    if (cudaMalloc(&a, plan.aBytes) != cudaSuccess ||
        cudaMalloc(&b, plan.bBytes) != cudaSuccess ||
        cudaMalloc(&c, plan.cBytes) != cudaSuccess) {
      (void)cudaGetLastError(); // out of memory: not sticky, keep candidate 0
      release();
      return false;
    }
    detail::fillGemmScratch<<<1024, 256, 0, stream>>>(
        static_cast<__nv_bfloat16 *>(a), plan.aBytes / 2, 1);
    DFLASH_CUDA_CHECK_LAUNCH("fillGemmScratch");
    detail::fillGemmScratch<<<1024, 256, 0, stream>>>(
        static_cast<__nv_bfloat16 *>(b), plan.bBytes / 2, 2);
    DFLASH_CUDA_CHECK_LAUNCH("fillGemmScratch");
    const size_t n = plan.candidates.size();
    std::vector<bool> runs(n, true);
    const float alpha = 1.f, beta = 0.f;
    auto launch = [&](size_t i) {
      return cublasLtMatmul(handle, plan.desc, &alpha, a, plan.a, b, plan.b,
                            &beta, c, plan.c, c, plan.c, &plan.candidates[i],
                            workspace, workspaceBytes, stream);
    };
    for (size_t i = 0; i < n; ++i)
      runs[i] = launch(i) == CUBLAS_STATUS_SUCCESS;
    std::vector<cudaEvent_t> events(2 * n * size_t(rounds));
    for (auto &e : events)
      DFLASH_CUDA_CHECK(cudaEventCreate(&e));
    for (int r = 0; r < rounds; ++r)
      for (size_t i = 0; i < n; ++i) {
        if (!runs[i])
          continue;
        cudaEvent_t *pair = &events[2 * (r * n + i)];
        DFLASH_CUDA_CHECK(cudaEventRecord(pair[0], stream));
        DFLASH_CUBLAS_CHECK(launch(i));
        DFLASH_CUDA_CHECK(cudaEventRecord(pair[1], stream));
      }
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream));
    plan.timing.ms.assign(n, -1.f);
    for (size_t i = 0; i < n; ++i) {
      if (!runs[i])
        continue;
      std::vector<float> ms(rounds);
      for (int r = 0; r < rounds; ++r)
        DFLASH_CUDA_CHECK(cudaEventElapsedTime(&ms[r], events[2 * (r * n + i)],
                                               events[2 * (r * n + i) + 1]));
      std::sort(ms.begin(), ms.end());
      plan.timing.ms[i] = ms[rounds / 2];
    }
    for (auto &e : events)
      DFLASH_CUDA_CHECK(cudaEventDestroy(e));
    release();
    int best = 0;
    for (size_t i = 1; i < n; ++i)
      if (plan.timing.ms[i] > 0 && (plan.timing.ms[best] < 0 ||
                                    plan.timing.ms[i] < plan.timing.ms[best]))
        best = int(i);
    if (runs[0] && plan.timing.ms[best] > (1.f - margin) * plan.timing.ms[0])
      best = 0;
    plan.chosen = best;
    plan.timing.chosen = best;
    return true;
  }

  Plan makePlan(cublasOperation_t opA, cublasOperation_t opB, int64_t m,
                int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
                cudaDataType_t cType, int alignA, int alignB, int alignC,
                Product product, bool biased) {
    Plan plan;
    DFLASH_CUBLAS_CHECK(
        cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (biased) {
      // A bf16 bias of m values, one per row of D (an output feature).
      cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      cudaDataType_t biasType = CUDA_R_16BF;
      DFLASH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
          sizeof(epilogue)));
      DFLASH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &biasType,
          sizeof(biasType)));
    }
    int32_t ta = opA, tb = opB;
    DFLASH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    DFLASH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    // Stored shapes: op(X) = X^T means X is stored transposed.
    uint64_t aRows = opA == CUBLAS_OP_N ? m : k,
             aCols = opA == CUBLAS_OP_N ? k : m;
    uint64_t bRows = opB == CUBLAS_OP_N ? k : n,
             bCols = opB == CUBLAS_OP_N ? n : k;
    DFLASH_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, aRows, aCols, lda));
    DFLASH_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, bRows, bCols, ldb));
    DFLASH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, cType, m, n, ldc));

    cublasLtMatmulPreference_t pref;
    DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = workspaceBytes;
    uint32_t aA = alignA, aB = alignB, aC = alignC;
    DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aA, sizeof(aA)));
    DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &aB, sizeof(aB)));
    DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &aC, sizeof(aC)));
    DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &aC, sizeof(aC)));
    cublasLtMatmulHeuristicResult_t results[kGemmCandidates] = {};
    int returned = 0;
    DFLASH_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(
        handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref,
        kGemmCandidates, results, &returned));
    DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    for (int i = 0; i < returned; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS)
        plan.candidates.push_back(results[i].algo);
    if (plan.candidates.empty())
      detail::reportCudaFailure(__FILE__, __LINE__,
                                "cublasLtMatmulAlgoGetHeuristic",
                                "no algorithm for this GEMM shape");
    const uint64_t cElem = cType == CUDA_R_32F ? 4 : 2;
    plan.aBytes = uint64_t(lda) * aCols * 2;
    plan.bBytes = uint64_t(ldb) * bCols * 2;
    plan.cBytes = uint64_t(ldc) * n * cElem;
    plan.timing.flops = 2.0 * double(m) * double(n) * double(k);
    char shape[96];
    std::snprintf(shape, sizeof(shape), "%s M %lld N %lld K %lld%s",
                  product.name, (long long)product.M, (long long)product.N,
                  (long long)product.K, cType == CUDA_R_32F ? " (fp32)" : "");
    plan.timing.shape = shape;
    plan.timed = !timing || plan.candidates.size() < 2 ||
                 plan.timing.flops < kGemmTimingMinFlops;
    return plan;
  }

  cublasLtHandle_t handle;
  void *workspace;
  size_t workspaceBytes;
  std::string deviceKind;
  bool timing = true;
  GemmTimingSummary summary;
  std::map<Key, Plan> plans;
};

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_GEMM_CUH
