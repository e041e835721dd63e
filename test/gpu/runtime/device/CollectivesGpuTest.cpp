//===- CollectivesGpuTest.cpp - NCCL hooks on every GPU -------------------===//
//
// The collectives' reduce-scatter and all-gather hooks, in place, on every
// visible GPU (one GPU is a world of one), and an aborted communicator that
// reports which collective it was in.
//
//===----------------------------------------------------------------------===//

#include "runtime/device/Collectives.h"
#include "runtime/device/DeviceContext.h"
#include "test/gpu/runtime/FakeStepPrograms.h"
#include "test/gpu/runtime/TrainerRuns.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::gpu;
namespace fs = std::filesystem;

TEST(RuntimeCollectives, ReduceScatterAndAllGatherInPlace) {
  if (!collectivesAvailable())
    GTEST_SKIP() << "skipped: built without NCCL";
  const uint64_t seed = testSeed();
  SCOPED_TRACE("DFLASH_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Every visible GPU (up to 8) is a rank; one GPU is a world of one.
  const int world = std::min(visibleDevices(), 8);
  std::vector<int> devices;
  for (int d = 0; d < world; ++d)
    devices.push_back(d);
  disableNvlinkMulticastByDefault();
  CollectiveId id;
  ASSERT_TRUE(createCollectiveId(id).ok());
  std::vector<std::unique_ptr<Collectives>> comms;
  Status s = Collectives::create({devices, 0, world}, id, comms);
  ASSERT_TRUE(s.ok()) << s.message();

  const size_t shard = size_t(std::uniform_int_distribution<int>(1, 5000)(rng));
  const size_t shardBytes = shard * 2 + size_t(rng() % 2); // odd sizes too
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<std::vector<float>> sums(devices.size());
  std::vector<std::vector<uint8_t>> parts(devices.size());
  for (int r = 0; r < world; ++r) {
    sums[size_t(r)].resize(size_t(world) * shard);
    for (float &v : sums[size_t(r)])
      v = value(rng);
    parts[size_t(r)].resize(shardBytes);
    for (uint8_t &b : parts[size_t(r)])
      b = uint8_t(rng());
  }
  struct RankResult {
    std::string error;
    std::vector<float> summed;
    std::vector<uint8_t> gathered;
  };
  std::vector<RankResult> results(devices.size());
  auto rankJob = [&](int r) {
    RankResult &out = results[size_t(r)];
    auto cuda = [&](cudaError_t e, const char *what) {
      if (e != cudaSuccess && out.error.empty())
        out.error = std::string(what) + ": " + cudaGetErrorString(e);
      return e == cudaSuccess;
    };
    if (!cuda(cudaSetDevice(r), "cudaSetDevice"))
      return;
    cudaStream_t stream = nullptr;
    float *data = nullptr;
    uint8_t *bytes = nullptr;
    if (!cuda(cudaStreamCreate(&stream), "cudaStreamCreate") ||
        !cuda(cudaMalloc(&data, size_t(world) * shard * 4), "cudaMalloc") ||
        !cuda(cudaMalloc(&bytes, size_t(world) * shardBytes), "cudaMalloc"))
      return;
    // Every rank's floats; its own part of the bytes, the rest garbage.
    std::vector<uint8_t> mine(size_t(world) * shardBytes, 0xab);
    std::copy(parts[size_t(r)].begin(), parts[size_t(r)].end(),
              mine.begin() + size_t(r) * shardBytes);
    cuda(cudaMemcpy(data, sums[size_t(r)].data(), size_t(world) * shard * 4,
                    cudaMemcpyHostToDevice),
         "cudaMemcpy");
    cuda(cudaMemcpy(bytes, mine.data(), mine.size(), cudaMemcpyHostToDevice),
         "cudaMemcpy");
    comms[size_t(r)]->reduceScatterSum(data, shard, stream);
    comms[size_t(r)]->allGather(bytes, shardBytes, stream);
    cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    out.summed.resize(shard);
    out.gathered.resize(mine.size());
    cuda(cudaMemcpy(out.summed.data(), data + size_t(r) * shard, shard * 4,
                    cudaMemcpyDeviceToHost),
         "cudaMemcpy");
    cuda(cudaMemcpy(out.gathered.data(), bytes, mine.size(),
                    cudaMemcpyDeviceToHost),
         "cudaMemcpy");
    if (Status c = comms[size_t(r)]->check(); !c.ok() && out.error.empty())
      out.error = c.message();
    (void)cudaFree(data);
    (void)cudaFree(bytes);
    (void)cudaStreamDestroy(stream);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back(rankJob, r);
  for (std::thread &t : threads)
    t.join();

  std::vector<uint8_t> everyPart;
  for (const std::vector<uint8_t> &part : parts)
    everyPart.insert(everyPart.end(), part.begin(), part.end());
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(world));
    const RankResult &got = results[size_t(r)];
    ASSERT_TRUE(got.error.empty()) << got.error;
    for (size_t i = 0; i < shard; ++i) {
      // Up to two terms the float sum has one result whatever the order;
      // more are summed in NCCL's order.
      float expected = 0;
      for (int q = 0; q < world; ++q)
        expected += sums[size_t(q)][size_t(r) * shard + i];
      ASSERT_NEAR(got.summed[i], expected, world <= 2 ? 0.0 : 1e-5)
          << "element " << i;
    }
    EXPECT_EQ(got.gathered, everyPart);
  }
}

TEST(RuntimeCollectives, AnAbortedCommunicatorReportsTheCollective) {
  if (!collectivesAvailable())
    GTEST_SKIP() << "skipped: built without NCCL";
  disableNvlinkMulticastByDefault();
  const std::pair<std::string, std::function<void(Collectives &, void *)>>
      calls[] = {
          {"reduce-scatter",
           [](Collectives &c, void *d) {
             c.reduceScatterSum(static_cast<float *>(d), 4, nullptr);
           }},
          {"all-gather",
           [](Collectives &c, void *d) { c.allGather(d, 16, nullptr); }},
      };
  for (const auto &[name, call] : calls) {
    CollectiveId id;
    ASSERT_TRUE(createCollectiveId(id).ok());
    std::vector<std::unique_ptr<Collectives>> comms;
    Status s = Collectives::create({{0}, 0, 1}, id, comms);
    ASSERT_TRUE(s.ok()) << s.message();
    comms[0]->abort();
    float data[4] = {};
    call(*comms[0], data); // nothing reaches the device
    Status c = comms[0]->check();
    EXPECT_EQ(c.message(),
              name +
                  " on rank 0 (device 0) after its communicator was aborted");
  }
}
