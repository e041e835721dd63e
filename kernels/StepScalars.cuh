//===- StepScalars.cuh - Kernels around the step's scalars -----*- CUDA -*-===//
//
// The few scalars of a step live on the device so that a whole step needs no
// host round trip: the loss seed 1/sum(w), the reported loss and accuracy,
// the learning rate of the current step (read from the device step counter)
// for AdamW. Plus the elementwise bf16 add that sums gradients the graph
// could not fold into a GEMM. Launch configurations are tiny; these kernels
// cost microseconds.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_STEPSCALARS_CUH
#define DFLASH_KERNELS_STEPSCALARS_CUH

#include "kernels/AdamW.cuh"
#include "kernels/CudaCheck.cuh"

#include <cstdint>
#include <cuda_bf16.h>

namespace dflash::kernels {

namespace detail {

static __global__ void __launch_bounds__(1024)
    sum_f32_kernel(const float *x, int64_t n, float *out) {
  // fp64 partials: the sum of up to millions of loss weights stays exact
  // enough for the seed 1/sum(w).
  __shared__ double partial[32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    s += x[i];
  for (int o = 16; o > 0; o >>= 1)
    s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0)
    partial[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    s = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o >>= 1)
      s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0)
      *out = float(s);
  }
}

static __global__ void reciprocal_kernel(const float *x, float *out) {
  *out = 1.0f / *x;
}

static __global__ void
loss_stats_kernel(const float *lossSum, const float *weightSum,
                  const float *correct, const float *count, const float *runSum,
                  const float *keptBlocks, float *loss, float *acc, float *tau,
                  float *seed) {
  *loss = *lossSum / *weightSum;
  *acc = *count > 0 ? *correct / *count : 0.f;
  *tau = *keptBlocks > 0 ? *runSum / *keptBlocks : 0.f;
  *seed = 1.0f / *weightSum;
}

/// docs/semantics.md section 5: warm = int(ratio * total); linear warmup, then
/// cosine to 0. Writes AdamW's (lr, 1-based step) and the reported lr.
static __global__ void lr_schedule_kernel(const int32_t *step,
                                          const int32_t *total, float peak,
                                          float warmupRatio,
                                          AdamWStepState *state, float *lrOut) {
  int64_t t = *step, n = *total;
  int64_t warm = int64_t(double(warmupRatio) * double(n));
  double lr;
  if (t < warm)
    lr = double(peak) * double(t + 1) / double(warm);
  else if (n <= warm || t >= n)
    lr = 0.0;
  else
    lr = double(peak) * 0.5 *
         (1.0 + cos(3.141592653589793 * double(t - warm) / double(n - warm)));
  state->lr = float(lr);
  state->step = int32_t(t + 1);
  *lrOut = float(lr);
}

static __global__ void add_bf16_kernel(const __nv_bfloat16 *a,
                                       const __nv_bfloat16 *b,
                                       __nv_bfloat16 *out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

static __global__ void add_f32_kernel(const float *a, const float *b,
                                      float *out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

static __global__ void convert_bf16_f32_kernel(const __nv_bfloat16 *in,
                                               float *out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}

} // namespace detail

/// out = float(in), n elements: gradients into their fp32 all-reduce bucket.
inline void convert_bf16_f32(const __nv_bfloat16 *in, float *out, int64_t n,
                             cudaStream_t stream) {
  int64_t blocks = (n + 255) / 256;
  detail::convert_bf16_f32_kernel<<<unsigned(blocks < 8192 ? blocks : 8192),
                                    256, 0, stream>>>(in, out, n);
  DFLASH_CUDA_CHECK_LAUNCH("convert_bf16_f32");
}

/// out = sum of n floats (one CTA; n is the number of draft slots).
inline void sum_f32(const float *x, int64_t n, float *out,
                    cudaStream_t stream) {
  detail::sum_f32_kernel<<<1, 1024, 0, stream>>>(x, n, out);
  DFLASH_CUDA_CHECK_LAUNCH("sum_f32");
}

inline void reciprocal_f32(const float *x, float *out, cudaStream_t stream) {
  detail::reciprocal_kernel<<<1, 1, 0, stream>>>(x, out);
  DFLASH_CUDA_CHECK_LAUNCH("reciprocal_f32");
}

/// loss = lossSum / weightSum, acc = correct / count, tau = runSum /
/// keptBlocks, seed = 1 / weightSum.
inline void loss_stats_f32(const float *lossSum, const float *weightSum,
                           const float *correct, const float *count,
                           const float *runSum, const float *keptBlocks,
                           float *loss, float *acc, float *tau, float *seed,
                           cudaStream_t stream) {
  detail::loss_stats_kernel<<<1, 1, 0, stream>>>(lossSum, weightSum, correct,
                                                 count, runSum, keptBlocks,
                                                 loss, acc, tau, seed);
  DFLASH_CUDA_CHECK_LAUNCH("loss_stats_f32");
}

inline void lr_schedule(const int32_t *step, const int32_t *total, float lr,
                        float warmupRatio, AdamWStepState *state, float *lrOut,
                        cudaStream_t stream) {
  detail::lr_schedule_kernel<<<1, 1, 0, stream>>>(step, total, lr, warmupRatio,
                                                  state, lrOut);
  DFLASH_CUDA_CHECK_LAUNCH("lr_schedule");
}

inline void add_bf16(const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                     __nv_bfloat16 *out, int64_t n, cudaStream_t stream) {
  int64_t blocks = (n + 255) / 256;
  detail::add_bf16_kernel<<<unsigned(blocks < 4096 ? blocks : 4096), 256, 0,
                            stream>>>(a, b, out, n);
  DFLASH_CUDA_CHECK_LAUNCH("add_bf16");
}

/// out = a + b in fp32: the micro-batches' forward sums (gradient
/// accumulation).
inline void add_f32(const float *a, const float *b, float *out, int64_t n,
                    cudaStream_t stream) {
  int64_t blocks = (n + 255) / 256;
  detail::add_f32_kernel<<<unsigned(blocks < 4096 ? blocks : 4096), 256, 0,
                           stream>>>(a, b, out, n);
  DFLASH_CUDA_CHECK_LAUNCH("add_f32");
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_STEPSCALARS_CUH
