//===- ShardedStateGpuTest.cpp - A sharded optimizer state ----------------===//
//
// Sharded optimizer state (ZeRO-1) on a GPU: init fills this rank's shards
// from the parameters or the resumed state, a sharded step on one GPU equals
// the unsharded one, checkpoints are whole and resume across both kinds, a
// sharded step refuses another world size; with two GPUs (skipped with fewer)
// each rank holds only its own elements and the checkpoint holds them all.
//
//===----------------------------------------------------------------------===//

#include "kernels/CudaCheck.cuh"
#include "runtime/device/DeviceContext.h"
#include "runtime/train/Trainer.h"
#include "runtime/train/TrainerGroup.h"
#include "test/gpu/runtime/FakeStepPrograms.h"
#include "test/gpu/runtime/TrainerRuns.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::gpu;
namespace fs = std::filesystem;

//===----------------------------------------------------------------------===//
// Sharded optimizer state (ZeRO-1)
//===----------------------------------------------------------------------===//

namespace {

/// Random bf16 parameters of `c`, none of them zero.
std::vector<std::vector<uint16_t>> randomParams(const ModelConfig &c,
                                                std::mt19937_64 &rng) {
  std::uniform_real_distribution<float> value(0.05f, 1.0f);
  std::vector<std::vector<uint16_t>> params;
  for (const ParamInfo &p : parameterTable(c)) {
    std::vector<uint16_t> tensor(size_t(p.numel()));
    for (uint16_t &v : tensor)
      v = floatToBf16(rng() % 2 ? value(rng) : -value(rng));
    params.push_back(std::move(tensor));
  }
  return params;
}

/// A random resumable state of `c` for `ranks` ranks at `step`, with no
/// zero in its masters and moments.
TrainingState randomState(const ModelConfig &c, int64_t ranks, int64_t step,
                          std::mt19937_64 &rng) {
  std::uniform_real_distribution<float> value(0.01f, 2.0f);
  TrainingState state;
  for (const ParamInfo &p : parameterTable(c)) {
    std::vector<float> master(size_t(p.numel())), m(master.size()),
        v(master.size());
    for (size_t i = 0; i < master.size(); ++i) {
      master[i] = rng() % 2 ? value(rng) : -value(rng);
      m[i] = rng() % 2 ? value(rng) : -value(rng);
      v[i] = value(rng) * 1e-3f;
    }
    state.master.push_back(std::move(master));
    state.adamM.push_back(std::move(m));
    state.adamV.push_back(std::move(v));
  }
  state.step = step;
  state.rngState = Rng(rng()).state();
  for (int64_t r = 1; r < ranks; ++r)
    state.otherRankRngStates.push_back(Rng(rng()).state());
  state.data = {0, 0};
  return state;
}

/// Rank `rank`'s shard of bucket `k`, built from whole tensors by laying
/// them out in the bucket's flat range (zero elsewhere) and cutting that:
/// independent of shardPieces().
std::vector<float> expectedShard(const OptimizerShardLayout &layout, size_t k,
                                 int64_t rank, const ModelConfig &c,
                                 const std::vector<std::vector<float>> &full) {
  const ShardedBucket &bucket = layout.buckets[k];
  std::vector<ParamInfo> table = parameterTable(c);
  std::vector<float> flat(size_t(layout.worldSize * bucket.shardElements), 0);
  for (const ShardedTensor &tensor : bucket.tensors)
    for (size_t t = 0; t < table.size(); ++t)
      if (table[t].name == tensor.name)
        std::copy(full[t].begin(), full[t].end(), flat.begin() + tensor.offset);
  auto begin = flat.begin() + rank * bucket.shardElements;
  return std::vector<float>(begin, begin + bucket.shardElements);
}

/// Which rank owns element `i` of tensor `name` in `layout`.
int64_t ownerOf(const OptimizerShardLayout &layout, const std::string &name,
                int64_t i) {
  for (const ShardedBucket &bucket : layout.buckets)
    for (const ShardedTensor &tensor : bucket.tensors)
      if (tensor.name == name)
        return (tensor.offset + i) / bucket.shardElements;
  return -1;
}

std::vector<float> widen(const std::vector<uint16_t> &bf16) {
  std::vector<float> out(bf16.size());
  bf16ToFloats(bf16.data(), out.data(), bf16.size());
  return out;
}

FakeBehaviour shardedOver(int64_t world) {
  FakeBehaviour behaviour;
  behaviour.shardWorld = world;
  return behaviour;
}

} // namespace

TEST(RuntimeTrainerSharded, InitFillsThisRanksShards) {
  const uint64_t seed = testSeed();
  SCOPED_TRACE("DFLASH_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Problem p;
  for (bool resumed : {false, true}) {
    SCOPED_TRACE(resumed ? "resumed" : "fresh");
    FakeGpuProgram program(shardedOver(1));
    const ModelConfig &c = program.config();
    const OptimizerShardLayout &layout = *program.optimizerShards();
    std::unique_ptr<DeviceContext> device;
    Status s = DeviceContext::create(0, program.gemmWorkspaceBytes(), device);
    ASSERT_TRUE(s.ok()) << s.message();
    TrainerOptions options;
    options.run.totalSteps = options.finalStep = 10;
    options.run.seed = 5;
    options.run.lr = c.lr;
    options.run.data = "synthetic";
    options.run.syntheticRows = 16;
    Trainer trainer(program, *device, options);
    TrainerInputs inputs;
    inputs.target = &p.problem.target();
    inputs.rows = p.rows.get();
    inputs.params = randomParams(c, rng);
    std::vector<std::vector<uint16_t>> params = inputs.params;
    if (resumed)
      inputs.resume = randomState(c, 1, 3, rng);
    // What the shards must hold, as whole tensors.
    std::vector<std::vector<float>> master, moment1, moment2;
    for (size_t t = 0; t < params.size(); ++t) {
      master.push_back(resumed ? inputs.resume->master[t] : widen(params[t]));
      moment1.push_back(resumed ? inputs.resume->adamM[t]
                                : std::vector<float>(params[t].size(), 0));
      moment2.push_back(resumed ? inputs.resume->adamV[t]
                                : std::vector<float>(params[t].size(), 0));
    }
    Status initialised = trainer.init(inputs);
    ASSERT_TRUE(initialised.ok()) << initialised.message();

    const std::vector<BufferSpec> &specs = program.buffers();
    for (size_t k = 0; k < layout.buckets.size(); ++k) {
      const std::pair<BufferRole, const std::vector<std::vector<float>> *>
          roles[] = {{BufferRole::Master, &master},
                     {BufferRole::Moment1, &moment1},
                     {BufferRole::Moment2, &moment2}};
      for (const auto &[role, full] : roles) {
        size_t index = 0;
        while (index < specs.size() &&
               !(specs[index].name == shardBufferName(k) &&
                 specs[index].role == role))
          ++index;
        ASSERT_LT(index, specs.size());
        std::vector<float> shard(size_t(layout.buckets[k].shardElements));
        DFLASH_CUDA_CHECK(cudaMemcpy(shard.data(), device->buffers()[index],
                                     shard.size() * 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(shard, expectedShard(layout, k, 0, c, *full))
            << "buffer '" << shardBufferName(k) << "' role " << int(role);
      }
    }
    // Read back as whole tensors.
    std::vector<std::vector<uint16_t>> paramsBack;
    TrainingState state;
    Status read = trainer.readState(paramsBack, state);
    ASSERT_TRUE(read.ok()) << read.message();
    EXPECT_EQ(paramsBack, params);
    EXPECT_EQ(state.master, master);
    EXPECT_EQ(state.adamM, moment1);
    EXPECT_EQ(state.adamV, moment2);
    EXPECT_EQ(state.step, resumed ? 3 : 0);
  }
}

TEST(RuntimeTrainerSharded, OneGpuEqualsTheUnshardedStep) {
  Problem p;
  RunResult plain, graph, eager;
  Status plainRun = trainDirect(p, 25, true, plain);
  ASSERT_TRUE(plainRun.ok()) << plainRun.message();
  Status graphRun = trainDirect(p, 25, true, graph, shardedOver(1));
  ASSERT_TRUE(graphRun.ok()) << graphRun.message();
  Status eagerRun = trainDirect(p, 25, false, eager, shardedOver(1));
  ASSERT_TRUE(eagerRun.ok()) << eagerRun.message();
  expectSameMetrics(graph.metrics, plain.metrics);
  expectSameState(graph, plain);
  expectSameMetrics(eager.metrics, plain.metrics);
  expectSameState(eager, plain);
  EXPECT_NE(plain.metrics.front().loss, plain.metrics.back().loss);
}

TEST(RuntimeTrainerSharded, RunsOnTheWorldItWasCompiledFor) {
  Problem p;
  RunResult result;
  Status s = trainDirect(p, 5, true, result, shardedOver(2));
  EXPECT_EQ(s.message(),
            "this trainer was compiled to shard the optimizer state over 2 "
            "GPUs ([parallel] gpus_per_node x nodes in its spec) but runs on "
            "1; recompile the spec for 1 GPU or drop shard_optimizer_state");
}

TEST(RuntimeTrainerSharded, CheckpointsAreWholeAndResumeEitherWay) {
  TrainerTempDir dir;
  std::string whole = dir.path + "/whole", plain = dir.path + "/plain",
              sharded = dir.path + "/sharded";
  std::string err;
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--rows", "10", "--steps",
                          "20", "--out", whole},
                         err),
            0)
      << err;
  // 10 steps of a 20-step schedule, into `out`.
  auto firstHalf = [](const std::string &out) {
    return std::vector<std::string>{
        "--data", "synthetic",     "--rows", "10",    "--steps",
        "10",     "--total-steps", "20",     "--out", out};
  };
  ASSERT_EQ(runTrainMain(firstHalf(plain), err), 0) << err;
  ASSERT_EQ(runTrainMain(firstHalf(sharded), err, shardedOver(1)), 0) << err;
  // The same checkpoint, sharded or not.
  EXPECT_EQ(readFile(sharded + "/checkpoint-10/training/state.safetensors"),
            readFile(plain + "/checkpoint-10/training/state.safetensors"));
  EXPECT_EQ(readFile(sharded + "/checkpoint-10/model.safetensors"),
            readFile(plain + "/checkpoint-10/model.safetensors"));
  // Each resumed by the other kind of step.
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--steps", "20", "--resume",
                          sharded, "--out", sharded},
                         err),
            0)
      << err;
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--steps", "20", "--resume",
                          plain, "--out", plain},
                         err, shardedOver(1)),
            0)
      << err;
  auto expected = readMetricsLog(whole + "/metrics.jsonl");
  ASSERT_EQ(expected.size(), 20u);
  for (const std::string &run : {plain, sharded}) {
    SCOPED_TRACE(run);
    auto resumed = readMetricsLog(run + "/metrics.jsonl");
    ASSERT_EQ(resumed.size(), 20u);
    for (const auto &[step, values] : expected)
      EXPECT_EQ(resumed[step], values) << "step " << step;
    EXPECT_EQ(readFile(run + "/final/model.safetensors"),
              readFile(whole + "/final/model.safetensors"));
    EXPECT_EQ(readFile(run + "/checkpoint-20/training/state.safetensors"),
              readFile(whole + "/checkpoint-20/training/state.safetensors"));
  }
}

TEST(RuntimeTrainerSharded, TwoGpusAssembleTheWholeState) {
  if (visibleDevices() < 2)
    GTEST_SKIP() << "skipped: needs 2 GPUs";
  const uint64_t seed = testSeed();
  SCOPED_TRACE("DFLASH_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Problem p;
  TrainerTempDir dir;
  const ModelConfig c = smallConfig();
  const OptimizerShardLayout layout =
      *FakeGpuProgram(shardedOver(2)).optimizerShards();
  GroupLayout gpus;
  gpus.gpus = {0, 1};
  TrainerOptions options;
  options.run.totalSteps = 8;
  options.run.seed = 5;
  options.run.lr = c.lr;
  options.run.data = "synthetic";
  options.run.syntheticRows = 16;
  options.run.worldSize = 2;
  options.finalStep = 6;
  options.outDir = dir.path + "/out";
  options.exportFinal = false;
  TrainerGroup group(
      [] { return std::make_unique<FakeGpuProgram>(shardedOver(2)); }, options,
      gpus);
  TrainerInputs inputs;
  inputs.target = &p.problem.target();
  inputs.rows = p.rows.get();
  inputs.params = randomParams(c, rng);
  inputs.resume = randomState(c, 2, 4, rng);
  const TrainingState resume = *inputs.resume;
  const std::vector<std::vector<uint16_t>> params = inputs.params;
  Status s = group.init(inputs);
  ASSERT_TRUE(s.ok()) << s.message();

  // Each rank holds its own elements, and only those.
  std::vector<ParamInfo> table = parameterTable(c);
  for (int local = 0; local < 2; ++local) {
    SCOPED_TRACE("rank " + std::to_string(local));
    std::vector<std::vector<uint16_t>> paramsBack;
    TrainingState state;
    Status read = group.readState(local, paramsBack, state);
    ASSERT_TRUE(read.ok()) << read.message();
    EXPECT_EQ(paramsBack, params);
    for (size_t t = 0; t < table.size(); ++t)
      for (size_t i = 0; i < resume.master[t].size(); ++i) {
        bool mine = ownerOf(layout, table[t].name, int64_t(i)) == local;
        ASSERT_EQ(state.master[t][i], mine ? resume.master[t][i] : 0.0f)
            << table[t].name << "[" << i << "]";
        ASSERT_EQ(state.adamM[t][i], mine ? resume.adamM[t][i] : 0.0f);
        ASSERT_EQ(state.adamV[t][i], mine ? resume.adamV[t][i] : 0.0f);
      }
  }
  std::vector<std::vector<uint16_t>> paramsBack;
  TrainingState full;
  Status readFull = group.readFullState(paramsBack, full);
  ASSERT_TRUE(readFull.ok()) << readFull.message();
  EXPECT_EQ(full.master, resume.master);
  EXPECT_EQ(full.adamM, resume.adamM);
  EXPECT_EQ(full.adamV, resume.adamV);

  // The step leaves the state as it is: the checkpoint after it is the
  // resumed state, whole.
  TrainerOutcome outcome;
  Status ran = group.run(TrainerHooks(), outcome);
  ASSERT_TRUE(ran.ok()) << ran.message();
  EXPECT_EQ(outcome.lastCheckpoint, options.outDir + "/checkpoint-6");
  TrainingState saved;
  Status loaded = loadTrainingState(outcome.lastCheckpoint, c, saved);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  EXPECT_EQ(saved.step, 6);
  EXPECT_EQ(saved.worldSize(), 2);
  EXPECT_EQ(saved.master, resume.master);
  EXPECT_EQ(saved.adamM, resume.adamM);
  EXPECT_EQ(saved.adamV, resume.adamV);
}
