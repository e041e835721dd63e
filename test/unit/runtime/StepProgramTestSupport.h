//===- StepProgramTestSupport.h - Stand-in steps, no kernels ---*- C++ -*-===//
//
// StepPrograms with a config and buffers but no kernels, for the tests of
// the GPU side's host logic that run without a GPU (test/unit/runtime's
// RuntimeGpuSideTest: trainMain, target-features, TrainerGroup's checks):
// any program's buffers, or a compiled step's (stepBuffers() of
// RuntimeTestSupport.h) with its optimizer state per tensor or sharded per
// bucket (ZeRO-1). Apart from RuntimeTestSupport.h because StepProgram.h
// brings in the CUDA runtime's header, which the host-only runtime tests do
// not build with.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_TEST_UNIT_STEPPROGRAMTESTSUPPORT_H
#define DFLASH_TEST_UNIT_STEPPROGRAMTESTSUPPORT_H

#include "runtime/device/OptimizerShards.h"
#include "runtime/device/StepBuffers.h"
#include "runtime/device/StepProgram.h"
#include "schema/ModelConfig.h"
#include "schema/StepBuffers.h"
#include "test/unit/runtime/RuntimeTestSupport.h"

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

namespace dflash::runtimetest {

/// A program with a config and buffers but no kernels.
class FakeProgram : public rt::StepProgram {
public:
  FakeProgram(ModelConfig c, std::vector<BufferSpec> specs)
      : cfg(std::move(c)), specs(std::move(specs)) {}
  const ModelConfig &config() const override { return cfg; }
  const std::vector<BufferSpec> &buffers() const override { return specs; }
  size_t arenaBytes() const override { return 1024; }
  size_t gemmWorkspaceBytes() const override { return 0; }
  double flopsPerStep() const override { return 1e9; }
  Status bind(const std::vector<void *> &, void *, const rt::DeviceResources &,
              const rt::StepHyper &) override {
    return Status::success();
  }
  Status enqueue(cudaStream_t) override { return Status::success(); }

private:
  ModelConfig cfg;
  std::vector<BufferSpec> specs;
};

/// A step program's buffers; its optimizer state sharded as `shards` when
/// given.
class FakeStepProgram : public FakeProgram {
public:
  explicit FakeStepProgram(
      ModelConfig c,
      std::optional<rt::OptimizerShardLayout> shards = std::nullopt)
      : FakeProgram(c,
                    shards ? shardedStepBuffers(c, *shards) : stepBuffers(c)),
        shards(std::move(shards)) {}
  const rt::OptimizerShardLayout *optimizerShards() const override {
    return shards ? &*shards : nullptr;
  }

private:
  std::optional<rt::OptimizerShardLayout> shards;
};

} // namespace dflash::runtimetest

#endif // DFLASH_TEST_UNIT_STEPPROGRAMTESTSUPPORT_H
