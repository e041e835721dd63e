//===- DeviceContextGpuTest.cu - Buffers, errors, the profiler ------------===//
//
// DeviceContext on a GPU: buffers aligned to 256 bytes and zeroed, CUDA
// failures turned into messages that name the call, the buffer and the device,
// and DFLASH_PROFILE timing the ops of graph replays (StepProfiler).
//
//===----------------------------------------------------------------------===//

#include "kernels/CudaCheck.cuh"
#include "runtime/device/DeviceContext.h"
#include "runtime/device/StepProfiler.h"
#include "test/gpu/runtime/FakeStepPrograms.h"
#include "test/gpu/runtime/TrainerRuns.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::gpu;
namespace fs = std::filesystem;

TEST(RuntimeDevice, AllocatesAlignedZeroedBuffers) {
  std::unique_ptr<DeviceContext> device;
  Status s = DeviceContext::create(0, 1 << 16, device);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_FALSE(device->name().empty());
  std::vector<BufferSpec> specs = {
      {"a", BufferRole::Metric, DType::F32, {}},
      {"b", BufferRole::Input, DType::U8, {3}},
      {"c", BufferRole::Parameter, DType::BF16, {7, 5}},
      {"empty", BufferRole::Input, DType::U8, {0}},
  };
  Status allocated = device->allocate(specs, 1000);
  ASSERT_TRUE(allocated.ok()) << allocated.message();
  std::set<void *> distinct;
  for (void *p : device->buffers()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    distinct.insert(p);
  }
  EXPECT_EQ(distinct.size(), specs.size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(device->arena()) % 256, 0u);
  std::vector<uint16_t> back(35, 1);
  DFLASH_CUDA_CHECK(cudaMemcpy(back.data(), device->buffers()[2], 70,
                               cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, std::vector<uint16_t>(35, 0));
  DeviceMemory memory;
  ASSERT_TRUE(device->memory(memory).ok());
  EXPECT_GT(memory.totalBytes, memory.freeBytes);
  EXPECT_NE(device->resources().gemm, nullptr);
  EXPECT_EQ(device->resources().allReduceSum, nullptr);
  EXPECT_EQ(device->resources().reduceScatterSum, nullptr);
  EXPECT_EQ(device->resources().allGather, nullptr);
  EXPECT_FALSE(device->allocate(specs, 10).ok());
}

TEST(RuntimeDevice, ErrorsBecomeMessages) {
  std::unique_ptr<DeviceContext> device;
  Status s = DeviceContext::create(4096, 0, device);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cudaSetDevice(4096)"), std::string::npos)
      << s.message();
  ASSERT_TRUE(DeviceContext::create(0, 0, device).ok());
  // More than any GPU has.
  std::vector<BufferSpec> huge = {
      {"huge", BufferRole::Frozen, DType::F32, {int64_t(1) << 40}}};
  Status tooBig = device->allocate(huge, 0);
  ASSERT_FALSE(tooBig.ok());
  EXPECT_NE(tooBig.message().find("cudaMalloc of buffer 'huge' (4.0 TiB) on "
                                  "device 0"),
            std::string::npos)
      << tooBig.message();
}

namespace {

/// A dependent chain of `reps` multiply-adds per element: time that grows
/// with `reps`.
__global__ void multiplyAddChain(float *x, int n, int reps) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  float v = x[i];
  for (int r = 0; r < reps; ++r)
    v = v * 0.999f + 1e-3f;
  x[i] = v;
}

/// The median ms the profiler's report gives `name`, or -1.
double profiledMs(const std::string &report, const std::string &name) {
  std::istringstream lines(report);
  for (std::string line; std::getline(lines, line);) {
    double ms = 0;
    char rest[128] = {};
    if (std::sscanf(line.c_str(), "profile: %lf ms  %127[^\n]", &ms, rest) ==
            2 &&
        name == rest)
      return ms;
  }
  return -1;
}

} // namespace

TEST(RuntimeDevice, ProfilerTimesGraphReplays) {
  // DFLASH_PROFILE with a graph: the events around each op are nodes of the
  // capture, so every replay times the ops, and the report says so.
  ASSERT_EQ(setenv("DFLASH_PROFILE", "1", 1), 0);
  const int n = 1 << 20;
  float *x = nullptr;
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t graphExec = nullptr;
  DFLASH_CUDA_CHECK(cudaStreamCreate(&stream));
  DFLASH_CUDA_CHECK(cudaMalloc(&x, n * sizeof(float)));
  DFLASH_CUDA_CHECK(cudaMemset(x, 0, n * sizeof(float)));
  testing::internal::CaptureStderr();
  {
    StepProfiler profiler({"test.chain short", "test.chain long"});
    DFLASH_CUDA_CHECK(
        cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    profiler.beginStep(stream);
    for (int op = 0; op < 2; ++op) {
      profiler.begin(size_t(op), stream);
      multiplyAddChain<<<n / 256, 256, 0, stream>>>(x, n, op ? 16000 : 2000);
      profiler.end(size_t(op), stream);
    }
    DFLASH_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    DFLASH_CUDA_CHECK(cudaGraphInstantiate(&graphExec, graph, 0));
    for (int replay = 0; replay < 3; ++replay) {
      profiler.beforeReplay();
      DFLASH_CUDA_CHECK(cudaGraphLaunch(graphExec, stream));
    }
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream));
  } // the report is printed here
  const std::string report = testing::internal::GetCapturedStderr();
  unsetenv("DFLASH_PROFILE");
  DFLASH_CUDA_CHECK(cudaGraphExecDestroy(graphExec));
  DFLASH_CUDA_CHECK(cudaGraphDestroy(graph));
  DFLASH_CUDA_CHECK(cudaFree(x));
  DFLASH_CUDA_CHECK(cudaStreamDestroy(stream));
  EXPECT_NE(report.find("median ms per op over 3 graph replays"),
            std::string::npos)
      << report;
  const double shortMs = profiledMs(report, "test.chain short");
  const double longMs = profiledMs(report, "test.chain long");
  EXPECT_GT(shortMs, 0) << report;
  // Eight times the chain: well over twice the time, if the replays' events
  // bracket their own op.
  EXPECT_GT(longMs, 2 * shortMs) << report;
}
