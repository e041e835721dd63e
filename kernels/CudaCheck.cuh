//===- CudaCheck.cuh - Checked CUDA and cuBLASLt calls ---------*- CUDA -*-===//
//
// Every CUDA runtime and cuBLASLt call of the kernel library goes through one
// of these macros. A failure is a programming or device error, never a user
// input error, so it reports file:line and the failing call and exits: the
// step cannot continue on a device in an unknown state. quick_exit, because
// other threads (one per GPU) may still be running: exit() would destroy
// the statics under them. Handlers go through std::at_quick_exit.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_CUDACHECK_CUH
#define DFLASH_KERNELS_CUDACHECK_CUH

#include <cstdio>
#include <cstdlib>
#include <cublasLt.h>
#include <cuda_runtime.h>

namespace dflash::kernels::detail {

[[noreturn]] inline void reportCudaFailure(const char *file, int line,
                                           const char *call,
                                           const char *message) {
  std::fprintf(stderr, "%s:%d: %s failed: %s\n", file, line, call, message);
  std::fflush(stderr);
  std::quick_exit(EXIT_FAILURE);
}

inline void checkCuda(cudaError_t status, const char *file, int line,
                      const char *call) {
  if (status != cudaSuccess)
    reportCudaFailure(file, line, call, cudaGetErrorString(status));
}

/// cublasGetStatusString lives in libcublas, which cuBLASLt users need not
/// link: name the statuses here.
inline const char *cublasStatusName(cublasStatus_t status) {
  switch (status) {
  case CUBLAS_STATUS_SUCCESS:
    return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED:
    return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED:
    return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE:
    return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_ARCH_MISMATCH:
    return "CUBLAS_STATUS_ARCH_MISMATCH";
  case CUBLAS_STATUS_MAPPING_ERROR:
    return "CUBLAS_STATUS_MAPPING_ERROR";
  case CUBLAS_STATUS_EXECUTION_FAILED:
    return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_INTERNAL_ERROR:
    return "CUBLAS_STATUS_INTERNAL_ERROR";
  case CUBLAS_STATUS_NOT_SUPPORTED:
    return "CUBLAS_STATUS_NOT_SUPPORTED";
  case CUBLAS_STATUS_LICENSE_ERROR:
    return "CUBLAS_STATUS_LICENSE_ERROR";
  default:
    return "unknown cuBLAS status";
  }
}

inline void checkCublas(cublasStatus_t status, const char *file, int line,
                        const char *call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    reportCudaFailure(file, line, call, cublasStatusName(status));
}

} // namespace dflash::kernels::detail

/// Checks a cudaError_t-returning call.
#define DFLASH_CUDA_CHECK(call)                                                \
  ::dflash::kernels::detail::checkCuda((call), __FILE__, __LINE__, #call)

/// Checks a cublasStatus_t-returning call.
#define DFLASH_CUBLAS_CHECK(call)                                              \
  ::dflash::kernels::detail::checkCublas((call), __FILE__, __LINE__, #call)

/// Checks the launch that precedes it (configuration errors surface here;
/// faults inside the kernel surface at the next synchronizing call).
#define DFLASH_CUDA_CHECK_LAUNCH(name)                                         \
  ::dflash::kernels::detail::checkCuda(cudaGetLastError(), __FILE__, __LINE__, \
                                       "launch of " name)

#endif // DFLASH_KERNELS_CUDACHECK_CUH
