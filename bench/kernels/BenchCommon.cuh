//===- BenchCommon.cuh - What KernelBench's sections share ------*- CUDA
//-*-===//
//
// The clock discipline (cool-down, warm-up, median of repetitions), the
// report line and its JSON, device buffers of random bf16, and relative
// differences: for KernelBench.cu and TargetBench.cu.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_BENCH_KERNELS_BENCHCOMMON_CUH
#define DFLASH_BENCH_KERNELS_BENCHCOMMON_CUH

#include "kernels/CudaCheck.cuh"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda_bf16.h>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace dflash::bench {

using bf16 = __nv_bfloat16;

/// Where report() writes its JSON lines (argv[1]); where the B = 4 anchors
/// and the causal section's packed positions go, for torch_reference.py.
inline FILE *jsonOut = nullptr;
inline std::string anchorFile;
inline std::string causalPositionsFile;

/// Milliseconds from environment variable `name` (unset or empty: `dflt`);
/// anything but a whole number from 0 to 600000 is refused, naming it.
inline int msFromEnv(const char *name, int dflt) {
  const char *v = std::getenv(name);
  if (!v || !*v)
    return dflt;
  char *end = nullptr;
  long ms = std::strtol(v, &end, 10);
  if (*end != '\0' || ms < 0 || ms > 600000) {
    std::fprintf(stderr,
                 "KernelBench: %s must be a whole number of milliseconds "
                 "from 0 to 600000, got '%s'\n",
                 name, v);
    std::exit(2);
  }
  return int(ms);
}

/// The H200 reaches its power cap within a second of heavy work and then
/// lowers its clock (1980 -> 1440-1740 MHz), so a kernel timed right after
/// others runs slower than the same kernel timed first (NOTES.md, seventh
/// session). Each variant therefore starts from rest: the GPU idles
/// DFLASH_BENCH_COOLDOWN_MS (default 1000) first, so every variant and the
/// PyTorch baselines (torch_reference.py does the same) are timed at the same
/// clock. DFLASH_BENCH_WARMUP_MS (default 0) then runs the variant that long
/// before timing it: with COOLDOWN 0 that times each at its own sustained,
/// power-capped clock instead.
struct BenchClock {
  int cooldownMs = msFromEnv("DFLASH_BENCH_COOLDOWN_MS", 1000);
  int warmupMs = msFromEnv("DFLASH_BENCH_WARMUP_MS", 0);
};
inline const BenchClock &benchClock() {
  static const BenchClock clock;
  return clock;
}

/// Median milliseconds of `reps` runs of f after the cool-down and at least
/// `warmup` runs (and DFLASH_BENCH_WARMUP_MS of them). DFLASH_BENCH_ONCE=1
/// runs each variant once, without either: for profilers.
inline double timeMs(const std::function<void()> &f, int warmup = 3,
                     int reps = 15) {
  int cooldownMs = benchClock().cooldownMs, untilMs = benchClock().warmupMs;
  if (const char *once = std::getenv("DFLASH_BENCH_ONCE"); once && *once == '1')
    warmup = 0, reps = 1, cooldownMs = 0, untilMs = 0;
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::this_thread::sleep_for(std::chrono::milliseconds(cooldownMs));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    const double elapsedMs = std::chrono::duration<double, std::milli>(
                                 std::chrono::steady_clock::now() - start)
                                 .count();
    if (i >= warmup && elapsedMs >= untilMs)
      break;
    f();
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  }
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto &e : ev)
    DFLASH_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    DFLASH_CUDA_CHECK(cudaEventRecord(ev[2 * i]));
    f();
    DFLASH_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1]));
  }
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i)
    DFLASH_CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto &e : ev)
    cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

inline void report(const std::string &name, double ms,
                   const std::string &metric, double value,
                   const std::string &note = "") {
  std::printf("%-44s %9.3f ms  %9.1f %-8s %s\n", name.c_str(), ms, value,
              metric.c_str(), note.c_str());
  if (jsonOut)
    std::fprintf(jsonOut,
                 "{\"name\": \"%s\", \"ms\": %.5f, \"metric\": \"%s\", "
                 "\"value\": %.4f, \"note\": \"%s\"}\n",
                 name.c_str(), ms, metric.c_str(), value, note.c_str());
}

template <typename T> inline T *deviceAlloc(size_t count) {
  T *p = nullptr;
  DFLASH_CUDA_CHECK(cudaMalloc(&p, count * sizeof(T)));
  return p;
}

/// n bf16 values of device memory, on the host.
inline std::vector<bf16> downloadBf16(const bf16 *d, size_t n) {
  std::vector<bf16> h(n);
  DFLASH_CUDA_CHECK(
      cudaMemcpy(h.data(), d, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  return h;
}

/// ||a - b|| / ||b|| (||a - b|| where b is all zeros).
inline double relativeDifference(const std::vector<bf16> &a,
                                 const std::vector<bf16> &b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// Per translation unit (a kernel cannot be inline).
static __global__ void fillRandomBf16(bf16 *p, size_t n, uint64_t seed,
                                      float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    // Sum of two uniforms: cheap, roughly bell-shaped, never all zeros.
    float u1 = (z & 0xFFFFFF) / 16777216.f,
          u2 = ((z >> 24) & 0xFFFFFF) / 16777216.f;
    p[i] = __float2bfloat16((u1 + u2 - 1.f) * 1.7f * scale);
  }
}

inline void randomBf16(bf16 *p, size_t n, uint64_t seed, float scale = 1.f) {
  fillRandomBf16<<<4096, 256>>>(p, n, seed, scale);
  DFLASH_CUDA_CHECK_LAUNCH("fillRandomBf16");
}

} // namespace dflash::bench

#endif // DFLASH_BENCH_KERNELS_BENCHCOMMON_CUH
