//===- TargetServerGpuTest.cu - The online target on its own GPU ----------===//
//
// TargetServer: features computed on the server's own thread and stream
// arrive in the drafter's buffer only once the drafter's event says the
// buffer is free; and a group whose target runs on its own thread trains
// like the target run before each step.
//
//===----------------------------------------------------------------------===//

#include "kernels/CudaCheck.cuh"
#include "runtime/train/TargetServer.h"
#include "runtime/train/TrainerGroup.h"
#include "test/gpu/runtime/FakeStepPrograms.h"
#include "test/gpu/runtime/TrainerRuns.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::gpu;
namespace fs = std::filesystem;

//===----------------------------------------------------------------------===//
// The online target on a GPU of its own (TargetServer)
//===----------------------------------------------------------------------===//

namespace {

__global__ void spinThenFillKernel(uint16_t *data, int64_t n, uint16_t value,
                                   long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    data[i] = value;
}

} // namespace

// The server computes a batch's features on its own thread and stream and
// copies them into the drafter's buffer only once the drafter's event says
// the buffer is free; its requests are timed by number.
TEST(RuntimeTargetServer, FeaturesArriveAfterTheBufferIsFree) {
  const uint64_t seed = testSeed();
  SCOPED_TRACE("DFLASH_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ModelConfig c = smallConfig();
  Problem p;
  const std::vector<std::vector<uint16_t>> weights = {p.problem.target().embed};
  std::unique_ptr<TargetServer> server;
  Status created = TargetServer::create(
      0, [c] { return std::make_unique<FakeTargetProgram>(c); }, weights, {0},
      TargetServerOptions{}, server);
  ASSERT_TRUE(created.ok()) << created.message();
  EXPECT_EQ(server->clients(), 1);
  EXPECT_EQ(server->featureSpec().shape,
            (std::vector<int64_t>{c.rowsPerGpu, c.seqLen, c.contextWidth()}));

  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const size_t tokens = size_t(c.rowsPerGpu * c.seqLen);
  const size_t featureCount = tokens * size_t(c.contextWidth());
  int32_t *hostTokens = nullptr;
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void **>(&hostTokens),
                          2 * tokens * sizeof(int32_t), cudaHostAllocDefault),
            cudaSuccess);
  uint16_t *destination = nullptr;
  ASSERT_EQ(cudaMalloc(&destination, featureCount * 2), cudaSuccess);
  cudaStream_t drafter = nullptr;
  cudaEvent_t freeEvent = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&drafter, cudaStreamNonBlocking),
            cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&freeEvent, cudaEventDisableTiming),
            cudaSuccess);

  for (int round = 0; round < 2; ++round) {
    std::uniform_int_distribution<int32_t> id(0, int32_t(c.vocabSize - 1)),
        position(0, int32_t(c.seqLen - 1));
    std::vector<int32_t> ids(tokens), positions(tokens);
    for (size_t t = 0; t < tokens; ++t) {
      ids[t] = id(rng);
      positions[t] = position(rng);
    }
    std::copy(ids.begin(), ids.end(), hostTokens);
    std::copy(positions.begin(), positions.end(), hostTokens + tokens);
    // The drafter still uses its buffer for a while (a NaN pattern written
    // at the end of ~20 ms), then marks it free: a copy that did not wait
    // would be overwritten.
    spinThenFillKernel<<<1, 256, 0, drafter>>>(
        destination, int64_t(featureCount), 0x7fc1, 40000000LL);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(freeEvent, drafter), cudaSuccess);
    FeatureRequest request;
    request.inputIds = hostTokens;
    request.positionIds = hostTokens + tokens;
    request.destination = destination;
    request.destinationDevice = 0;
    request.destinationFree = freeEvent;
    cudaEvent_t delivered = nullptr;
    int64_t ticket = -1;
    Status submitted = server->submit(request, delivered, ticket);
    ASSERT_TRUE(submitted.ok()) << submitted.message();
    EXPECT_EQ(ticket, round);
    ASSERT_EQ(cudaStreamWaitEvent(drafter, delivered, 0), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(drafter), cudaSuccess);
    std::vector<uint16_t> got(featureCount);
    ASSERT_EQ(cudaMemcpy(got.data(), destination, featureCount * 2,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    std::vector<uint16_t> want = FakeTargetProgram::expected(
        c, ids, positions, p.problem.target().embed);
    size_t wrong = 0;
    for (size_t i = 0; i < featureCount; ++i)
      wrong += got[i] != want[i];
    EXPECT_EQ(wrong, 0u) << "of " << featureCount << " in round " << round;
    float ms = -1;
    Status timed = server->busyMs(0, ticket, ms);
    ASSERT_TRUE(timed.ok()) << timed.message();
    EXPECT_GT(ms, 0.f);
  }
  float ms = 0;
  EXPECT_FALSE(server->busyMs(0, 7, ms).ok());
  FeatureRequest stray;
  stray.client = 1;
  stray.inputIds = stray.positionIds = hostTokens;
  stray.destination = destination;
  cudaEvent_t delivered = nullptr;
  int64_t ticket = 0;
  Status refused = server->submit(stray, delivered, ticket);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("has no drafter 1"), std::string::npos)
      << refused.message();
  server.reset(); // before the buffers it copies into
  EXPECT_EQ(cudaEventDestroy(freeEvent), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(drafter), cudaSuccess);
  EXPECT_EQ(cudaFree(destination), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(hostTokens), cudaSuccess);
}

// train --target-gpus on one GPU: the target on its own thread and stream,
// a step ahead of the drafter, gives the run of the target enqueued before
// every step, to the bit, captured or eager; without the target the rows'
// own features give another run (so the features do reach the loss).
TEST(RuntimeTrainerGroup, TargetOnItsOwnThreadEqualsTheTargetBeforeTheStep) {
  Problem p;
  GroupSetup before, apart, apartEager, rowsOwn;
  before.onlineTarget = apart.onlineTarget = apartEager.onlineTarget = true;
  apart.targetGpus = apartEager.targetGpus = {0};
  apartEager.graph = false;
  RunResult a, b, e, r;
  Status beforeRun = trainGroup(p, 12, before, a);
  ASSERT_TRUE(beforeRun.ok()) << beforeRun.message();
  Status apartRun = trainGroup(p, 12, apart, b);
  ASSERT_TRUE(apartRun.ok()) << apartRun.message();
  Status eagerRun = trainGroup(p, 12, apartEager, e);
  ASSERT_TRUE(eagerRun.ok()) << eagerRun.message();
  Status rowsRun = trainGroup(p, 12, rowsOwn, r);
  ASSERT_TRUE(rowsRun.ok()) << rowsRun.message();
  expectSameMetrics(b.metrics, a.metrics);
  expectSameState(b, a);
  expectSameMetrics(e.metrics, a.metrics);
  expectSameState(e, a);
  ASSERT_EQ(r.metrics.size(), a.metrics.size());
  EXPECT_NE(r.metrics[0].loss, a.metrics[0].loss);
  for (const StepMetrics &m : a.metrics) {
    EXPECT_FALSE(m.targetApart);
    EXPECT_GT(m.targetMs, 0);
  }
  for (const StepMetrics &m : b.metrics) {
    EXPECT_TRUE(m.targetApart);
    EXPECT_GT(m.targetMs, 0);
    EXPECT_GE(m.featureWaitMs, 0);
    EXPECT_LE(m.featureWaitMs, m.stepMs);
  }
}
