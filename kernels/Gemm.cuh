//===- Gemm.cuh - cuBLASLt linear-layer GEMMs ------------------*- CUDA -*-===//
//
// The three products of a bias-free linear layer, on row-major bf16 tensors
// with fp32 accumulation:
//   linear:           y  [M, N] = x [M, K] * w [N, K]^T
//   linearGradInput:  dx [M, K] = dy [M, N] * w [N, K]
//   linearGradWeight: dw [N, K] = dy [M, N]^T * x [M, K]   (beta = 1
//   accumulates)
// A row-major [R, C] matrix is a column-major [C, R] one, so each maps to one
// column-major cuBLASLt matmul with swapped operands. The algorithm is chosen
// once per static shape (cuBLASLt's heuristic, first result) and cached with
// its descriptors; the workspace belongs to the caller (an arena slot). One
// object per GPU worker thread: it is not synchronised.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_GEMM_CUH
#define DFLASH_KERNELS_GEMM_CUH

#include "kernels/CudaCheck.cuh"

#include <cstdint>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <map>
#include <tuple>
#include <type_traits>

namespace dflash::kernels {

class CublasLtGemm {
public:
  CublasLtGemm(cublasLtHandle_t handle, void *workspace, size_t workspaceBytes)
      : handle(handle), workspace(workspace), workspaceBytes(workspaceBytes) {}
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
           beta, stream);
  }

  /// dx [M, K] = dy [M, N] w [N, K] + beta dx.
  void linearGradInput(const __nv_bfloat16 *dy, const __nv_bfloat16 *w,
                       __nv_bfloat16 *dx, int64_t M, int64_t N, int64_t K,
                       cudaStream_t stream, float beta = 0.f) {
    matmul(CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, w, K, dy, N, dx, K, CUDA_R_16BF,
           beta, stream);
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
           std::is_same_v<OutT, float> ? CUDA_R_32F : CUDA_R_16BF, beta,
           stream);
  }

  /// Number of distinct shapes planned so far.
  size_t numPlans() const { return plans.size(); }

private:
  struct Plan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
  };
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int, int, int, int>;

  static int alignmentOf(const void *p) {
    uintptr_t v = reinterpret_cast<uintptr_t>(p);
    int a = 256;
    while (a > 2 && v % a != 0)
      a /= 2;
    return a;
  }

  /// Column-major C [m, n] = op(A) op(B) + beta C.
  void matmul(cublasOperation_t opA, cublasOperation_t opB, int64_t m,
              int64_t n, int64_t k, const void *A, int64_t lda, const void *B,
              int64_t ldb, void *C, int64_t ldc, cudaDataType_t cType,
              float beta, cudaStream_t stream) {
    if (m == 0 || n == 0)
      return;
    int alignA = alignmentOf(A), alignB = alignmentOf(B),
        alignC = alignmentOf(C);
    Key key{opA, opB, m, n, k, lda, ldb, ldc, cType, alignA, alignB, alignC};
    auto it = plans.find(key);
    if (it == plans.end())
      it = plans
               .emplace(key, makePlan(opA, opB, m, n, k, lda, ldb, ldc, cType,
                                      alignA, alignB, alignC))
               .first;
    const Plan &plan = it->second;
    float alpha = 1.f;
    DFLASH_CUBLAS_CHECK(cublasLtMatmul(
        handle, plan.desc, &alpha, A, plan.a, B, plan.b, &beta, C, plan.c, C,
        plan.c, &plan.algo, workspace, workspaceBytes, stream));
  }

  Plan makePlan(cublasOperation_t opA, cublasOperation_t opB, int64_t m,
                int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
                cudaDataType_t cType, int alignA, int alignB, int alignC) {
    Plan plan;
    DFLASH_CUBLAS_CHECK(
        cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
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
    cublasLtMatmulHeuristicResult_t result = {};
    int returned = 0;
    DFLASH_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(
        handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref, 1, &result,
        &returned));
    DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (returned == 0)
      detail::reportCudaFailure(__FILE__, __LINE__,
                                "cublasLtMatmulAlgoGetHeuristic",
                                "no algorithm for this GEMM shape");
    plan.algo = result.algo;
    return plan;
  }

  cublasLtHandle_t handle;
  void *workspace;
  size_t workspaceBytes;
  std::map<Key, Plan> plans;
};

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_GEMM_CUH
