//===- GpuTestUtil.h - Buffers, bf16 data, comparisons ----------*- C++ -*-===//
//
// Shared by the GPU kernel tests: device buffers that can be poisoned (0xFF
// bytes are NaN in bf16 and fp32, so an unwritten element fails), seeded
// random bf16 tensors kept both as bits for the device and as the rounded
// values for the CPU reference, and the ||out - ref|| / ||ref|| check.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_TEST_GPU_GPUTESTUTIL_H
#define DFLASH_TEST_GPU_GPUTESTUTIL_H

#include "kernels/Bf16.h"
#include "kernels/CudaCheck.cuh"

#include <cmath>
#include <cstdint>
#include <cuda_bf16.h>
#include <gtest/gtest.h>
#include <random>
#include <string>
#include <vector>

namespace dflash::gputest {

template <typename T> class DeviceBuffer {
public:
  explicit DeviceBuffer(size_t count) : count(count) {
    DFLASH_CUDA_CHECK(cudaMalloc(&ptr, (count ? count : 1) * sizeof(T)));
  }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  DeviceBuffer(DeviceBuffer &&other) noexcept
      : ptr(other.ptr), count(other.count) {
    other.ptr = nullptr;
    other.count = 0;
  }
  ~DeviceBuffer() {
    if (ptr)
      cudaFree(ptr);
  }

  T *get() const { return ptr; }
  size_t size() const { return count; }
  size_t bytes() const { return count * sizeof(T); }

  template <typename U> void upload(const std::vector<U> &host) {
    static_assert(sizeof(U) == sizeof(T), "element sizes differ");
    ASSERT_EQ(host.size(), count);
    DFLASH_CUDA_CHECK(
        cudaMemcpy(ptr, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  template <typename U = T> std::vector<U> download() const {
    static_assert(sizeof(U) == sizeof(T), "element sizes differ");
    std::vector<U> host(count);
    DFLASH_CUDA_CHECK(
        cudaMemcpy(host.data(), ptr, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  /// 0xFF bytes: NaN as bf16 and fp32, so unwritten outputs are caught.
  void poison() { DFLASH_CUDA_CHECK(cudaMemset(ptr, 0xFF, bytes())); }

private:
  T *ptr = nullptr;
  size_t count;
};

/// Poisons each buffer in turn; they may hold different element types, which
/// a loop over one initializer list cannot.
template <typename... Buffers> void poisonAll(Buffers &...buffers) {
  (buffers.poison(), ...);
}

/// A bf16 tensor: device copy plus the exact (rounded) values as doubles.
struct Bf16Tensor {
  std::vector<uint16_t> bits;
  std::vector<double> values;
  DeviceBuffer<__nv_bfloat16> dev;

  explicit Bf16Tensor(size_t n) : bits(n), values(n), dev(n) {}
  Bf16Tensor(Bf16Tensor &&) = default;
  __nv_bfloat16 *ptr() const { return dev.get(); }
  void upload() { dev.upload(bits); }
  void set(size_t i, float v) {
    bits[i] = floatToBf16(v);
    values[i] = bf16ToFloat(bits[i]);
  }
};

inline Bf16Tensor randomBf16(size_t n, std::mt19937_64 &rng, double scale = 1.0,
                             double mean = 0.0) {
  Bf16Tensor t(n);
  std::normal_distribution<double> dist(mean, scale);
  for (size_t i = 0; i < n; ++i)
    t.set(i, static_cast<float>(dist(rng)));
  t.upload();
  return t;
}

inline std::vector<double> bf16ToDoubles(const std::vector<uint16_t> &bits) {
  std::vector<double> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i)
    out[i] = bf16ToFloat(bits[i]);
  return out;
}

inline std::vector<double> downloadBf16(const DeviceBuffer<__nv_bfloat16> &b) {
  return bf16ToDoubles(b.download<uint16_t>());
}

inline std::vector<double> downloadF32(const DeviceBuffer<float> &b) {
  std::vector<float> f = b.download();
  return std::vector<double>(f.begin(), f.end());
}

/// Rounds to bf16 and back, as a store of the value would.
inline double roundBf16(double v) {
  return bf16ToFloat(floatToBf16(static_cast<float>(v)));
}

/// ||got - ref|| / ||ref|| (absolute norm when ref is zero); infinity when
/// got has a non-finite value where ref is finite, or any NaN.
inline double relativeError(const std::vector<double> &got,
                            const std::vector<double> &ref) {
  if (got.size() != ref.size())
    return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(ref[i]))
      return INFINITY;
    if (std::isinf(got[i]) || std::isinf(ref[i])) {
      if (got[i] != ref[i])
        return INFINITY;
      continue;
    }
    double d = got[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

#define EXPECT_CLOSE(got, ref, tol, what)                                      \
  do {                                                                         \
    double err_ = ::dflash::gputest::relativeError((got), (ref));              \
    EXPECT_LE(err_, (tol)) << (what) << ": relative error " << err_;           \
  } while (0)

} // namespace dflash::gputest

#endif // DFLASH_TEST_GPU_GPUTESTUTIL_H
