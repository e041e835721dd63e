//===- FakeStepPrograms.h - The hand-written step and target ----*- C++ -*-===//
//
// StepPrograms written by hand for the runtime's GPU tests: FakeGpuProgram,
// a small real data-parallel computation that reads every input, the frozen
// embedding, the counters and the optimizer state (whole or sharded), writes
// the four metrics and applies an Adam-like update in a fixed order, so that
// the same inputs give the same bits; and FakeTargetProgram, an online target
// whose features depend on each token's id, position and tap. Their kernels
// are in FakeStepPrograms.cu.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_TEST_GPU_RUNTIME_FAKESTEPPROGRAMS_H
#define DFLASH_TEST_GPU_RUNTIME_FAKESTEPPROGRAMS_H

#include "kernels/Bf16.h"
#include "runtime/device/OptimizerShards.h"
#include "runtime/device/StepBuffers.h"
#include "runtime/device/StepProgram.h"
#include "schema/Parameters.h"
#include "test/unit/runtime/RuntimeTestSupport.h"
#include "test/unit/runtime/StepProgramTestSupport.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dflash::runtimetest::gpu {

using namespace dflash::rt;

/// The one-layer drafter every trainer test runs.
ModelConfig smallConfig();

/// What a test wants the fake step to do besides computing.
struct FakeBehaviour {
  int nanStep = -1;         ///< step counter whose loss is NaN
  int signalAtEnqueue = -1; ///< raise SIGINT in this enqueue() call (0-based)
  /// Called inside enqueue() while the stream is being captured.
  std::function<void()> whileCapturing;
  /// Called by bind() with what the runtime gave the step.
  std::function<void(const DeviceResources &)> onBind;
  /// In this enqueue() call (0-based) of rank failRank: skip the
  /// collectives and make a launch fail, as a rank that breaks mid-step.
  int failAtEnqueue = -1;
  int64_t failRank = -1;
  /// Above 0: the optimizer state is sharded over this many ranks (ZeRO-1;
  /// shardLayout() in 3 buckets, with gaps and padding). Over one rank,
  /// rank 0's shards hold every tensor at its bucket offset and the step
  /// computes what the unsharded one does, on the shards. Over several, the
  /// step leaves parameters and state as they are (it reports a loss of 0):
  /// enough for what the runtime does with the shards.
  int64_t shardWorld = 0;
};

class FakeGpuProgram : public StepProgram {
public:
  explicit FakeGpuProgram(FakeBehaviour behaviour = {},
                          ModelConfig config = smallConfig())
      : cfg(std::move(config)), specs(stepBuffers(cfg)),
        behaviour(std::move(behaviour)) {
    if (this->behaviour.shardWorld > 0) {
      shards = shardLayout(cfg, this->behaviour.shardWorld, 3, 64, 32);
      specs = shardedStepBuffers(cfg, *shards);
      std::map<std::string, size_t> index;
      std::vector<ParamInfo> table = parameterTable(cfg);
      for (size_t t = 0; t < table.size(); ++t)
        index[table[t].name] = t;
      shardOf.resize(table.size());
      for (size_t k = 0; k < shards->buckets.size(); ++k)
        for (const ShardedTensor &tensor : shards->buckets[k].tensors)
          shardOf[index[tensor.name]] = {k, tensor.offset};
    }
    // Arena layout in floats, each part 64-float aligned.
    auto round = [](size_t n) { return (n + 63) / 64 * 64; };
    size_t tensors = parameterTable(cfg).size();
    targetsAt = 0;
    scalarsAt = targetsAt + round(size_t(cfg.rowsPerGpu));
    normsAt = scalarsAt + round(1 + tensors);
    gradsAt = normsAt + round(tensors);
    size_t at = gradsAt;
    for (const ParamInfo &p : parameterTable(cfg)) {
      gradOffsets.push_back(at);
      at += round(size_t(p.numel()));
    }
    arenaFloats = at;
  }
  ~FakeGpuProgram() override {
    for (cudaEvent_t event : {gradsReady, gradsDone})
      if (event)
        (void)cudaEventDestroy(event);
    if (commStream)
      (void)cudaStreamDestroy(commStream);
  }
  const ModelConfig &config() const override { return cfg; }
  const std::vector<BufferSpec> &buffers() const override { return specs; }
  const OptimizerShardLayout *optimizerShards() const override {
    return shards ? &*shards : nullptr;
  }
  size_t arenaBytes() const override { return arenaFloats * sizeof(float); }
  size_t gemmWorkspaceBytes() const override { return 1 << 20; }
  double flopsPerStep() const override { return 1e6; }

  Status bind(const std::vector<void *> &pointers, void *arena,
              const DeviceResources &resources,
              const StepHyper &hyper) override;

  Status enqueue(cudaStream_t stream) override;

  bool boundWithGemm = false;
  bool alignedTo256 = true;
  int enqueueCalls = 0;

private:
  template <typename T> T *at(int index) const {
    return static_cast<T *>(ptrs[size_t(index)]);
  }
  float *grad(int tensor) const {
    return scratch + gradOffsets[size_t(tensor)];
  }
  /// Tensor `t`'s master or Adam moment (`which`: 1 or 2). Sharded over one
  /// rank, its shard holds the whole tensor at its bucket offset.
  float *master(int t) const { return state(0, t); }
  float *moment(int which, int t) const { return state(which, t); }
  float *state(int which, int t) const {
    if (!map.sharded) {
      const std::vector<int> &slots = which == 0   ? map.master
                                      : which == 1 ? map.moment1
                                                   : map.moment2;
      return at<float>(slots[size_t(t)]);
    }
    const auto &[bucket, offset] = shardOf[size_t(t)];
    const std::vector<int> &slots = which == 0   ? map.shardMaster
                                    : which == 1 ? map.shardMoment1
                                                 : map.shardMoment2;
    return at<float>(slots[bucket]) + offset;
  }

  ModelConfig cfg;
  std::vector<BufferSpec> specs;
  FakeBehaviour behaviour;
  std::optional<OptimizerShardLayout> shards;
  /// Per tensor: its bucket and offset there, when sharded.
  std::vector<std::pair<size_t, int64_t>> shardOf;
  StepBufferMap map;
  std::vector<void *> ptrs;
  float *scratch = nullptr;
  float lr0 = 0;
  DeviceResources res;
  size_t targetsAt = 0, scalarsAt = 0, normsAt = 0, gradsAt = 0;
  size_t arenaFloats = 0;
  std::vector<size_t> gradOffsets;
  cudaStream_t commStream = nullptr;
  cudaEvent_t gradsReady = nullptr, gradsDone = nullptr;
};

//===----------------------------------------------------------------------===//
// A hand-written online target
//===----------------------------------------------------------------------===//
//
// What the generated target.cu is to the runtime: inputs input_ids and
// position_ids, one frozen weight by its checkpoint name, and target_hidden
// after them. Feature j of token (b, s) is embed[id, j % H] * (1 + pos / 64)
// + (j / H) / 8: every token's features depend on its id, its position and
// its tap, so a batch that reached the wrong drafter, in the wrong order or
// at the wrong step changes the losses.

class FakeTargetProgram : public StepProgram {
public:
  explicit FakeTargetProgram(ModelConfig config = smallConfig())
      : cfg(std::move(config)) {
    const int64_t B = cfg.rowsPerGpu, S = cfg.seqLen;
    specs = {
        {"input_ids", BufferRole::Input, DType::I32, {B, S}, 0},
        {"position_ids", BufferRole::Input, DType::I32, {B, S}, 1},
        {"model.embed_tokens.weight",
         BufferRole::Frozen,
         DType::BF16,
         {cfg.vocabSize, cfg.hiddenSize},
         -1},
        {"target_hidden",
         BufferRole::Input,
         DType::BF16,
         {B, S, cfg.contextWidth()},
         -3},
    };
  }
  const ModelConfig &config() const override { return cfg; }
  const std::vector<BufferSpec> &buffers() const override { return specs; }
  size_t arenaBytes() const override { return 256; }
  size_t gemmWorkspaceBytes() const override { return 1 << 16; }
  double flopsPerStep() const override { return 1e6; }
  Status bind(const std::vector<void *> &pointers, void *arena,
              const DeviceResources &, const StepHyper &) override {
    if (pointers.size() != specs.size())
      return Status::error("bound with the wrong number of buffers");
    ptrs = pointers;
    return Status::success();
  }
  Status enqueue(cudaStream_t stream) override;

  /// The same on the host, for one batch.
  static std::vector<uint16_t> expected(const ModelConfig &c,
                                        const std::vector<int32_t> &ids,
                                        const std::vector<int32_t> &positions,
                                        const std::vector<uint16_t> &embed) {
    const int64_t W = c.contextWidth(), H = c.hiddenSize;
    std::vector<uint16_t> out(ids.size() * size_t(W));
    for (size_t t = 0; t < ids.size(); ++t)
      for (int64_t j = 0; j < W; ++j) {
        float e = bf16ToFloat(embed[size_t(int64_t(ids[t]) * H + j % H)]);
        out[t * size_t(W) + size_t(j)] = floatToBf16(
            e * (1.f + float(positions[t]) / 64.f) + float(j / H) / 8.f);
      }
    return out;
  }

private:
  ModelConfig cfg;
  std::vector<BufferSpec> specs;
  std::vector<void *> ptrs;
};

} // namespace dflash::runtimetest::gpu

#endif // DFLASH_TEST_GPU_RUNTIME_FAKESTEPPROGRAMS_H
