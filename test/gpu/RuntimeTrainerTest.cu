//===- RuntimeTrainerTest.cu - The trainer around a hand-written step -----===//
//
// The runtime's GPU side (DeviceContext, Trainer, trainMain) driven by a
// StepProgram written by hand: its "step" is a small real computation on the
// GPU that reads every input, the frozen embedding, the counters and the
// optimizer state, writes the four metrics and applies an Adam-like update,
// so that any difference in data order, counters or restored state shows in
// the metrics. All reductions run in one block in a fixed order: the same
// inputs give the same bits, whether the step is replayed from a graph or
// run eagerly, on one thread or two.
//
// The step is data parallel for real: every rank's loss sums and gradients
// go through DeviceResources::allReduceSum (NCCL), the gradients on a second
// stream inside the captured graph, as in the generated step.
//
// Checks: DFLASH_PROFILE times the ops of graph replays (StepProfiler);
// graph replay equals eager execution bit for bit; a checkpoint
// resumed continues exactly like an uninterrupted run; a non-finite loss
// stops the run without touching the last checkpoint; SIGINT saves and exits
// with 130; two trainers on two threads of one GPU capture (one of them while
// the other allocates and synchronises) and replay their own graphs with the
// results of a single thread; the NCCL path on one GPU (--nccl) equals the
// one-GPU path bit for bit. With two GPUs (skipped with fewer): two ranks of
// B rows train like one GPU of 2B rows, a rank that fails stops the other
// instead of leaving it in the all-reduce, and a data-parallel run resumes
// exactly, every rank's anchor stream included.
//
// Sharded optimizer state (ZeRO-1): init fills this rank's shards from the
// parameters or the resumed state, a sharded step on one GPU equals the
// unsharded one, checkpoints are whole and resume across both kinds, a
// sharded step refuses another world size; the reduce-scatter and all-gather
// hooks work in place (on every visible GPU); with two GPUs each rank holds
// only its own elements and the checkpoint holds them all.
//
//===----------------------------------------------------------------------===//

#include "kernels/Bf16.h"
#include "kernels/CudaCheck.cuh"
#include "runtime/cli/TrainMain.h"
#include "runtime/data/InitialParameters.h"
#include "runtime/data/Synthetic.h"
#include "runtime/device/DeviceContext.h"
#include "runtime/device/StepProfiler.h"
#include "runtime/train/TargetServer.h"
#include "runtime/train/Trainer.h"
#include "runtime/train/TrainerGroup.h"
#include "schema/Parameters.h"
#include "test/unit/runtime/RuntimeTestSupport.h"
#include "test/unit/runtime/StepProgramTestSupport.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
namespace fs = std::filesystem;

namespace {

ModelConfig smallConfig() {
  ModelConfig c = oneLayerDrafterConfig();
  c.name = "trainer-test";
  c.seed = 5;
  c.lr = 1e-2;
  c.warmupRatio = 0.0;
  c.totalSteps = 20;
  return c;
}

//===----------------------------------------------------------------------===//
// The hand-written step
//===----------------------------------------------------------------------===//
//
// A data-parallel regression: row b of the global batch (G rows over every
// rank) has a target t_b mixing all its inputs and the embedding, and every
// trainable tensor m of n elements is pulled towards the targets:
//   loss = sum_t sum_b sum_i (m_i - t_b)^2 / (n G)
//   grad_i = sum_b 2 (m_i - t_b) / (n G)
// Each rank sums over its own rows; allReduceSum adds the ranks' loss sums
// (with the kept-anchor count for acc, on the main stream) and their
// gradients (two buckets on a communication stream, joined before the
// update), as the generated step does. Without the hook (one GPU) those
// calls are skipped; with NCCL on one GPU they are sums of one term, so the
// results are the same bits.

constexpr int kThreads = 256;

/// Sum over the block in a fixed order; every thread gets the result.
__device__ float blockSum(float value, float *shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (int(threadIdx.x) < stride)
      shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  float sum = shared[0];
  __syncthreads();
  return sum;
}

/// targets[b] for this rank's B rows; kept[0] = kept anchor slots.
__global__ void rowTargetsKernel(const int32_t *ids, const uint8_t *mask,
                                 const uint16_t *hidden, const int32_t *anchors,
                                 const uint8_t *keep, const uint16_t *embed,
                                 int64_t rows, int64_t seq, int64_t width,
                                 int64_t slots, float *targets, float *kept) {
  __shared__ float shared[kThreads];
  float keptTotal = 0;
  for (int64_t b = 0; b < rows; ++b) {
    float idSum = 0, hiddenSum = 0, keptSum = 0, anchorSum = 0;
    for (int64_t i = threadIdx.x; i < seq; i += kThreads)
      idSum += float(ids[b * seq + i] * mask[b * seq + i]);
    for (int64_t i = threadIdx.x; i < seq * width; i += kThreads)
      hiddenSum += bf16ToFloat(hidden[b * seq * width + i]);
    for (int64_t i = threadIdx.x; i < slots; i += kThreads) {
      keptSum += float(keep[b * slots + i]);
      anchorSum += float(anchors[b * slots + i] * keep[b * slots + i]);
    }
    idSum = blockSum(idSum, shared);
    hiddenSum = blockSum(hiddenSum, shared);
    keptSum = blockSum(keptSum, shared);
    anchorSum = blockSum(anchorSum, shared);
    if (threadIdx.x == 0)
      targets[b] = fmodf(idSum, 97.f) / 97.f + hiddenSum / float(seq * width) +
                   anchorSum / 1000.f + bf16ToFloat(embed[0]);
    keptTotal += keptSum;
  }
  if (threadIdx.x == 0)
    kept[0] = keptTotal;
}

/// This rank's loss sum of one tensor and its gradient contribution.
__global__ void tensorLossKernel(const float *master, int64_t n,
                                 const float *targets, int64_t rows,
                                 float globalRows, float *lossSum,
                                 float *grad) {
  __shared__ float shared[kThreads];
  float scale = 1.f / (float(n) * globalRows), sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    float g = 0;
    for (int64_t b = 0; b < rows; ++b) {
      float d = master[i] - targets[b];
      sum += d * d;
      g += 2.f * d;
    }
    grad[i] = g * scale;
  }
  sum = blockSum(sum, shared);
  if (threadIdx.x == 0)
    lossSum[0] = sum * scale;
}

/// Squared norm of one tensor's (summed) gradient.
__global__ void gradNormKernel(const float *grad, int64_t n, float *part) {
  __shared__ float shared[kThreads];
  float sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    sum += grad[i] * grad[i];
  sum = blockSum(sum, shared);
  if (threadIdx.x == 0)
    part[0] = sum;
}

/// scalars = [kept anchors, loss sum of each tensor], summed over ranks.
__global__ void finalizeKernel(const float *scalars, const float *normParts,
                               int tensors, float anchorSlots,
                               const int32_t *step, const int32_t *total,
                               float lr0, int nanStep, float *loss, float *acc,
                               float *gradNorm, float *lr) {
  float l = 0, g = 0;
  for (int i = 0; i < tensors; ++i) {
    l += scalars[1 + i];
    g += normParts[i];
  }
  if (*step == nanStep)
    l = __int_as_float(0x7fc00000);
  *loss = l;
  *acc = scalars[0] / anchorSlots;
  *gradNorm = sqrtf(g);
  *lr = lr0 * float(*step + 1) / float(*total);
}

__global__ void updateKernel(uint16_t *param, float *master, float *m1,
                             float *m2, const float *grad, int64_t n,
                             const float *lr, const float *loss) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  float g = grad[i];
  if (!isfinite(*loss)) // as a real step would: a NaN loss poisons all
    g = __int_as_float(0x7fc00000);
  float a = 0.9f * m1[i] + 0.1f * g;
  float b = 0.999f * m2[i] + 0.001f * g * g;
  float m = master[i] - *lr * a / (sqrtf(b) + 1e-8f);
  m1[i] = a;
  m2[i] = b;
  master[i] = m;
  param[i] = floatToBf16(m);
}

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

__global__ void emptyKernel() {}

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
              const StepHyper &hyper) override {
    if (Status s = mapStepBuffers(specs, cfg, optimizerShards(), map); !s.ok())
      return s;
    ptrs = pointers;
    scratch = static_cast<float *>(arena);
    lr0 = hyper.lr;
    res = resources;
    boundWithGemm = resources.gemm != nullptr;
    for (size_t i = 0; i < pointers.size(); ++i)
      alignedTo256 &= reinterpret_cast<uintptr_t>(pointers[i]) % 256 == 0;
    alignedTo256 &= reinterpret_cast<uintptr_t>(arena) % 256 == 0;
    // The buckets' gaps are summed too: keep them zero.
    DFLASH_CUDA_CHECK(cudaMemset(arena, 0, arenaBytes()));
    if (res.allReduceSum) {
      DFLASH_CUDA_CHECK(
          cudaStreamCreateWithFlags(&commStream, cudaStreamNonBlocking));
      DFLASH_CUDA_CHECK(
          cudaEventCreateWithFlags(&gradsReady, cudaEventDisableTiming));
      DFLASH_CUDA_CHECK(
          cudaEventCreateWithFlags(&gradsDone, cudaEventDisableTiming));
    }
    if (behaviour.onBind)
      behaviour.onBind(resources);
    return Status::success();
  }

  Status enqueue(cudaStream_t stream) override {
    int call = enqueueCalls++;
    if (call == behaviour.signalAtEnqueue)
      std::raise(SIGINT);
    const bool broken =
        call == behaviour.failAtEnqueue && res.rank == behaviour.failRank;
    const bool collectives = res.allReduceSum && !broken;
    const int64_t B = cfg.rowsPerGpu, S = cfg.seqLen, N = cfg.anchorsPerRow;
    const float globalRows = float(B * res.worldSize);
    std::vector<ParamInfo> table = parameterTable(cfg);
    const int tensors = int(table.size());
    float *targets = scratch + targetsAt, *scalars = scratch + scalarsAt;
    float *norms = scratch + normsAt;
    if (shards && res.worldSize > 1) {
      // No rank holds whole tensors: only the metrics, from the zeroed
      // scalars, and the state stays as it is.
      finalizeKernel<<<1, 1, 0, stream>>>(
          scalars, norms, 0, globalRows * float(N),
          at<int32_t>(map.counter(StepCounter::Step)),
          at<int32_t>(map.counter(StepCounter::TotalSteps)), lr0,
          behaviour.nanStep, at<float>(map.metric(StepMetric::Loss)),
          at<float>(map.metric(StepMetric::Acc)),
          at<float>(map.metric(StepMetric::GradNorm)),
          at<float>(map.metric(StepMetric::Lr)));
      DFLASH_CUDA_CHECK_LAUNCH("finalizeKernel");
      return Status::success();
    }
    rowTargetsKernel<<<1, kThreads, 0, stream>>>(
        at<int32_t>(map.input(StepInput::InputIds)),
        at<uint8_t>(map.input(StepInput::LossMask)),
        at<uint16_t>(map.input(StepInput::TargetHidden)),
        at<int32_t>(map.input(StepInput::Anchors)),
        at<uint8_t>(map.input(StepInput::Keep)),
        at<uint16_t>(map.frozenWeight(FrozenWeight::Embed)), B, S,
        cfg.contextWidth(), N, targets, scalars);
    DFLASH_CUDA_CHECK_LAUNCH("rowTargetsKernel");
    for (int t = 0; t < tensors; ++t) {
      tensorLossKernel<<<1, kThreads, 0, stream>>>(
          master(t), table[size_t(t)].numel(), targets, B, globalRows,
          scalars + 1 + t, grad(t));
      DFLASH_CUDA_CHECK_LAUNCH("tensorLossKernel");
    }
    if (collectives) {
      // Gradients on the communication stream, in two buckets, while the
      // main stream sums the scalars.
      DFLASH_CUDA_CHECK(cudaEventRecord(gradsReady, stream));
      DFLASH_CUDA_CHECK(cudaStreamWaitEvent(commStream, gradsReady, 0));
      int half = tensors / 2;
      float *first = grad(0), *middle = grad(half);
      float *end = grad(tensors - 1) + table.back().numel();
      res.allReduceSum(res.collectives, first, size_t(middle - first),
                       commStream);
      res.allReduceSum(res.collectives, middle, size_t(end - middle),
                       commStream);
      DFLASH_CUDA_CHECK(cudaEventRecord(gradsDone, commStream));
      res.allReduceSum(res.collectives, scalars, size_t(1 + tensors), stream);
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DFLASH_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture == cudaStreamCaptureStatusActive && behaviour.whileCapturing)
      behaviour.whileCapturing();
    if (collectives)
      DFLASH_CUDA_CHECK(cudaStreamWaitEvent(stream, gradsDone, 0));
    for (int t = 0; t < tensors; ++t) {
      gradNormKernel<<<1, kThreads, 0, stream>>>(
          grad(t), table[size_t(t)].numel(), norms + t);
      DFLASH_CUDA_CHECK_LAUNCH("gradNormKernel");
    }
    finalizeKernel<<<1, 1, 0, stream>>>(
        scalars, norms, tensors, globalRows * float(N),
        at<int32_t>(map.counter(StepCounter::Step)),
        at<int32_t>(map.counter(StepCounter::TotalSteps)), lr0,
        behaviour.nanStep, at<float>(map.metric(StepMetric::Loss)),
        at<float>(map.metric(StepMetric::Acc)),
        at<float>(map.metric(StepMetric::GradNorm)),
        at<float>(map.metric(StepMetric::Lr)));
    DFLASH_CUDA_CHECK_LAUNCH("finalizeKernel");
    for (int t = 0; t < tensors; ++t) {
      int64_t n = table[size_t(t)].numel();
      updateKernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0,
                     stream>>>(at<uint16_t>(map.param[size_t(t)]), master(t),
                               moment(1, t), moment(2, t), grad(t), n,
                               at<float>(map.metric(StepMetric::Lr)),
                               at<float>(map.metric(StepMetric::Loss)));
      DFLASH_CUDA_CHECK_LAUNCH("updateKernel");
    }
    // Last, unchecked: the runtime's launch check must see it.
    if (broken)
      emptyKernel<<<0, 1, 0, stream>>>(); // invalid: zero blocks
    return Status::success();
  }

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

__global__ void fakeTargetKernel(const int32_t *ids, const int32_t *positions,
                                 const uint16_t *embed, int64_t tokens,
                                 int64_t hidden, int64_t width,
                                 uint16_t *features) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * width)
    return;
  int64_t token = i / width, j = i % width;
  float e = bf16ToFloat(embed[int64_t(ids[token]) * hidden + j % hidden]);
  // No fused multiply-add: the host's expected() rounds twice too.
  features[i] =
      floatToBf16(__fadd_rn(__fmul_rn(e, 1.f + float(positions[token]) / 64.f),
                            float(j / hidden) / 8.f));
}

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
  Status enqueue(cudaStream_t stream) override {
    const int64_t tokens = cfg.rowsPerGpu * cfg.seqLen;
    const int64_t n = tokens * cfg.contextWidth();
    fakeTargetKernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0,
                       stream>>>(static_cast<const int32_t *>(ptrs[0]),
                                 static_cast<const int32_t *>(ptrs[1]),
                                 static_cast<const uint16_t *>(ptrs[2]), tokens,
                                 cfg.hiddenSize, cfg.contextWidth(),
                                 static_cast<uint16_t *>(ptrs[3]));
    DFLASH_CUDA_CHECK_LAUNCH("fakeTargetKernel");
    return Status::success();
  }

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

//===----------------------------------------------------------------------===//
// Running it
//===----------------------------------------------------------------------===//

/// Named after this binary, like the trainer runs' directories it holds.
struct TrainerTempDir : TempDir {
  TrainerTempDir() : TempDir("dflash-trainer") {}
};

/// The synthetic problem the direct (non-trainMain) runs train on.
struct Problem {
  SyntheticProblem problem;
  std::unique_ptr<SyntheticRowSource> rows;
  Problem() {
    EXPECT_TRUE(problem.init(smallConfig(), 5).ok());
    rows = std::make_unique<SyntheticRowSource>(problem, 16, false);
  }
};

struct RunResult {
  std::vector<StepMetrics> metrics;
  std::vector<std::vector<uint16_t>> params;
  TrainingState state;
};

/// Trains `steps` steps of a fresh run with a Trainer on the calling thread.
/// `beforeInit` runs before the device context exists, `afterInit` once the
/// trainer is initialised.
Status trainDirect(const Problem &p, int64_t steps, bool graph,
                   RunResult &result, FakeBehaviour behaviour = {},
                   const std::function<void()> &beforeInit = nullptr,
                   const std::function<void()> &afterInit = nullptr) {
  FakeGpuProgram program(std::move(behaviour));
  if (beforeInit)
    beforeInit();
  std::unique_ptr<DeviceContext> device;
  if (Status s = DeviceContext::create(0, program.gemmWorkspaceBytes(), device);
      !s.ok())
    return s;
  TrainerOptions options;
  options.run.totalSteps = steps;
  options.run.seed = 5;
  options.run.lr = program.config().lr;
  options.run.data = "synthetic";
  options.run.syntheticRows = 16;
  options.finalStep = steps;
  options.useGraph = graph;
  Trainer trainer(program, *device, options);
  TrainerInputs inputs;
  inputs.target = &p.problem.target();
  inputs.rows = p.rows.get();
  inputs.params = p.problem.initialParameters();
  if (Status s = trainer.init(std::move(inputs)); !s.ok())
    return s;
  if (afterInit)
    afterInit();
  while (trainer.stepsDone() < steps) {
    StepMetrics m;
    if (Status s = trainer.step(m); !s.ok())
      return s;
    result.metrics.push_back(m);
  }
  if (!program.boundWithGemm || !program.alignedTo256)
    return Status::error("bind() saw no GEMM planner or unaligned buffers");
  if (program.enqueueCalls != (graph ? 1 : int(steps)))
    return Status::error("enqueue() ran " +
                         std::to_string(program.enqueueCalls) + " times");
  return trainer.readState(result.params, result.state);
}

void expectSameMetrics(const std::vector<StepMetrics> &a,
                       const std::vector<StepMetrics> &b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].step, b[i].step);
    EXPECT_EQ(a[i].loss, b[i].loss) << "step " << a[i].step;
    EXPECT_EQ(a[i].acc, b[i].acc) << "step " << a[i].step;
    EXPECT_EQ(a[i].gradNorm, b[i].gradNorm) << "step " << a[i].step;
    EXPECT_EQ(a[i].lr, b[i].lr) << "step " << a[i].step;
  }
}

void expectSameState(const RunResult &a, const RunResult &b) {
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(a.state.master, b.state.master);
  EXPECT_EQ(a.state.adamM, b.state.adamM);
  EXPECT_EQ(a.state.adamV, b.state.adamV);
  EXPECT_EQ(a.state.step, b.state.step);
  EXPECT_EQ(a.state.data.epoch, b.state.data.epoch);
  EXPECT_EQ(a.state.data.row, b.state.data.row);
  EXPECT_EQ(a.state.rngState, b.state.rngState);
}

/// |a - b| <= tolerance * max(1, |b|).
void expectClose(double a, double b, double tolerance,
                 const std::string &what) {
  EXPECT_LE(std::fabs(a - b), tolerance * std::max(1.0, std::fabs(b)))
      << what << ": " << a << " vs " << b;
}

void expectCloseTensors(const std::vector<std::vector<float>> &a,
                        const std::vector<std::vector<float>> &b,
                        double tolerance, const std::string &what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t t = 0; t < a.size(); ++t) {
    ASSERT_EQ(a[t].size(), b[t].size()) << what;
    double worst = 0;
    for (size_t i = 0; i < a[t].size(); ++i)
      worst = std::max(worst, std::fabs(double(a[t][i]) - double(b[t][i])) /
                                  std::max(1.0, std::fabs(double(b[t][i]))));
    EXPECT_LE(worst, tolerance) << what << " of tensor " << t;
  }
}

int visibleDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess)
    return 0;
  return count;
}

/// How trainGroup runs.
struct GroupSetup {
  std::vector<int> gpus = {0};
  bool nccl = false; ///< --nccl
  bool graph = true;
  ModelConfig config = smallConfig(); ///< its rowsPerGpu, mostly
  const RowSource *rows = nullptr;    ///< default: the problem's
  FakeBehaviour behaviour;
  /// The online target (FakeTargetProgram) computes the features; with
  /// targetGpus, on those devices (GroupLayout::targetGpus).
  bool onlineTarget = false;
  std::vector<int> targetGpus;
};

/// Trains `steps` steps of a fresh run with a TrainerGroup, the way
/// trainMain does. `result` gets the run's metrics and local rank 0's
/// final state, `ranks` (when given) every local rank's.
Status trainGroup(const Problem &p, int64_t steps, const GroupSetup &setup,
                  RunResult &result, std::vector<RunResult> *ranks = nullptr) {
  GroupLayout layout;
  layout.gpus = setup.gpus;
  layout.targetGpus = setup.targetGpus;
  layout.forceCollectives = setup.nccl;
  TrainerOptions options;
  options.run.totalSteps = steps;
  options.run.seed = 5;
  options.run.lr = setup.config.lr;
  options.run.data = "synthetic";
  options.run.syntheticRows = 16;
  options.run.worldSize = layout.worldSize();
  options.finalStep = steps;
  options.useGraph = setup.graph;
  FakeBehaviour behaviour = setup.behaviour;
  ModelConfig config = setup.config;
  TrainerGroup group(
      [behaviour, config] {
        return std::make_unique<FakeGpuProgram>(behaviour, config);
      },
      options, layout);
  TrainerInputs inputs;
  inputs.target = &p.problem.target();
  inputs.rows = setup.rows ? setup.rows : p.rows.get();
  inputs.params = p.problem.initialParameters();
  const std::vector<std::vector<uint16_t>> targetWeights = {
      p.problem.target().embed};
  if (setup.onlineTarget) {
    inputs.targetProgram = [config] {
      return std::make_unique<FakeTargetProgram>(config);
    };
    inputs.targetProgramWeights = &targetWeights;
  }
  if (Status s = group.init(inputs); !s.ok())
    return s;
  TrainerHooks hooks;
  hooks.onStep = [&](const StepMetrics &m) {
    result.metrics.push_back(m);
    return Status::success();
  };
  TrainerOutcome outcome;
  if (Status s = group.run(hooks, outcome); !s.ok())
    return s;
  if (outcome.stepsDone != steps)
    return Status::error("the group did " + std::to_string(outcome.stepsDone) +
                         " steps");
  if (Status s = group.readState(0, result.params, result.state); !s.ok())
    return s;
  if (ranks)
    for (int local = 0; local < group.localRanks(); ++local) {
      RunResult rank;
      if (Status s = group.readState(local, rank.params, rank.state); !s.ok())
        return s;
      ranks->push_back(std::move(rank));
    }
  return Status::success();
}

/// Rows of the synthetic problem; row `failing` cannot be read.
class FailingSource : public RowSource {
public:
  FailingSource(const RowSource &inner, int64_t failing)
      : inner(inner), failing(failing) {}
  int64_t numRows() const override { return inner.numRows(); }
  bool hasPinnedAnchors() const override { return inner.hasPinnedAnchors(); }
  Status readRow(int64_t index, const RowBuffers &out) const override {
    if (index == failing)
      return Status::error("row " + std::to_string(index) + ": read failed");
    return inner.readRow(index, out);
  }

private:
  const RowSource &inner;
  int64_t failing;
};

/// trainMain with the fake step; the behaviour is global because a factory
/// is a plain function pointer.
FakeBehaviour mainBehaviour;
std::unique_ptr<StepProgram> makeFakeProgram() {
  return std::make_unique<FakeGpuProgram>(mainBehaviour);
}

/// Without --gpus in `args`: on device 0 alone, whatever the machine has.
int runTrainMain(std::vector<std::string> args, std::string &err,
                 FakeBehaviour behaviour = {}) {
  mainBehaviour = std::move(behaviour);
  if (std::find(args.begin(), args.end(), "--gpus") == args.end()) {
    args.push_back("--gpus");
    args.push_back("0");
  }
  args.insert(args.begin(), "train");
  std::vector<char *> argv;
  for (std::string &a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  testing::internal::CaptureStderr();
  int code = trainMain(int(args.size()), argv.data(), &makeFakeProgram);
  err = testing::internal::GetCapturedStderr();
  return code;
}

/// The loss, acc, grad_norm and lr of every line of a metrics log, by step.
std::map<int64_t, std::vector<double>> readMetricsLog(const std::string &path) {
  std::map<int64_t, std::vector<double>> byStep;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    std::vector<double> values;
    for (const char *key : {"loss", "acc", "grad_norm", "lr"})
      values.push_back(j[key].is_null() ? std::nan("") : j[key].get<double>());
    byStep[j["step"].get<int64_t>()] = values;
  }
  return byStep;
}

} // namespace

//===----------------------------------------------------------------------===//
// Tests
//===----------------------------------------------------------------------===//

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

TEST(RuntimeTrainer, GraphReplayEqualsEager) {
  Problem p;
  RunResult graph, eager;
  Status graphRun = trainDirect(p, 30, /*graph=*/true, graph);
  ASSERT_TRUE(graphRun.ok()) << graphRun.message();
  Status eagerRun = trainDirect(p, 30, /*graph=*/false, eager);
  ASSERT_TRUE(eagerRun.ok()) << eagerRun.message();
  ASSERT_EQ(graph.metrics.size(), 30u);
  expectSameMetrics(graph.metrics, eager.metrics);
  expectSameState(graph, eager);
  // The step did something: the loss moved and the lr followed the counter.
  EXPECT_NE(graph.metrics.front().loss, graph.metrics.back().loss);
  EXPECT_FLOAT_EQ(float(graph.metrics[9].lr), 1e-2f * 10 / 30);
  EXPECT_GT(graph.metrics[3].stepMs, 0);
  EXPECT_GT(graph.metrics[3].contextTokensPerS, 0);
  EXPECT_EQ(graph.state.step, 30);
}

TEST(RuntimeTrainer, ResumeContinuesExactly) {
  TrainerTempDir dir;
  std::string whole = dir.path + "/whole", split = dir.path + "/split";
  std::string err;
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--rows", "10", "--steps",
                          "20", "--out", whole},
                         err),
            0)
      << err;
  EXPECT_EQ(readFile(whole + "/latest"), "checkpoint-20\n");
  ASSERT_TRUE(fs::exists(whole + "/final/model.safetensors"));

  // The same run in two parts: 10 steps of a 20-step schedule, then resumed
  // from the output directory.
  ASSERT_EQ(
      runTrainMain({"--data", "synthetic", "--rows", "10", "--steps", "10",
                    "--total-steps", "20", "--save-every", "5", "--out", split},
                   err),
      0)
      << err;
  EXPECT_TRUE(fs::exists(split + "/checkpoint-5/training/state.safetensors"));
  EXPECT_EQ(readFile(split + "/latest"), "checkpoint-10\n");
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--steps", "20", "--resume",
                          split, "--out", split},
                         err),
            0)
      << err;
  EXPECT_NE(err.find("resuming " + split + "/checkpoint-10 at step 10"),
            std::string::npos)
      << err;

  auto expected = readMetricsLog(whole + "/metrics.jsonl");
  auto resumed = readMetricsLog(split + "/metrics.jsonl");
  ASSERT_EQ(expected.size(), 20u);
  ASSERT_EQ(resumed.size(), 20u);
  for (const auto &[step, values] : expected)
    EXPECT_EQ(resumed[step], values) << "step " << step;
  // Same bits in the exported drafter and in the last training state.
  EXPECT_EQ(readFile(split + "/final/model.safetensors"),
            readFile(whole + "/final/model.safetensors"));
  EXPECT_EQ(readFile(split + "/checkpoint-20/training/state.safetensors"),
            readFile(whole + "/checkpoint-20/training/state.safetensors"));
}

TEST(RuntimeTrainer, NonFiniteLossKeepsTheLastCheckpoint) {
  TrainerTempDir dir;
  std::string out = dir.path + "/out";
  std::string err;
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--rows", "10", "--steps",
                          "10", "--total-steps", "20", "--out", out},
                         err),
            0)
      << err;
  std::string state =
      readFile(out + "/checkpoint-10/training/state.safetensors");
  std::string model = readFile(out + "/final/model.safetensors");
  ASSERT_FALSE(state.empty());

  FakeBehaviour nan;
  nan.nanStep = 12;
  int code = runTrainMain({"--data", "synthetic", "--steps", "20",
                           "--save-every", "1", "--resume", out, "--out", out},
                          err, nan);
  EXPECT_EQ(code, 1);
  EXPECT_NE(err.find("train: error: step 12: the loss is nan"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("the last checkpoint is " + out + "/checkpoint-12"),
            std::string::npos)
      << err;
  // Steps 10 and 11 were good and saved; step 12 was not, nor anything after.
  EXPECT_TRUE(fs::exists(out + "/checkpoint-12"));
  EXPECT_FALSE(fs::exists(out + "/checkpoint-13"));
  EXPECT_EQ(readFile(out + "/latest"), "checkpoint-12\n");
  EXPECT_EQ(readFile(out + "/checkpoint-10/training/state.safetensors"), state);
  EXPECT_EQ(readFile(out + "/final/model.safetensors"), model);
  TrainingState saved;
  ASSERT_TRUE(
      loadTrainingState(out + "/checkpoint-12", smallConfig(), saved).ok());
  EXPECT_EQ(saved.step, 12);
  for (const std::vector<float> &master : saved.master)
    for (float v : master)
      ASSERT_TRUE(std::isfinite(v));
  // The bad step is in the log, as null.
  auto log = readMetricsLog(out + "/metrics.jsonl");
  ASSERT_EQ(log.size(), 13u);
  EXPECT_TRUE(std::isnan(log[12][0]));
}

TEST(RuntimeTrainer, InterruptSavesAndExits) {
  TrainerTempDir dir;
  std::string out = dir.path + "/out";
  FakeBehaviour interrupt;
  interrupt.signalAtEnqueue = 3; // during the fourth step, run eagerly
  std::string err;
  int code = runTrainMain({"--data", "synthetic", "--rows", "10", "--steps",
                           "20", "--no-graph", "--out", out},
                          err, interrupt);
  EXPECT_EQ(code, 128 + SIGINT);
  EXPECT_NE(err.find("train: error: stopped by SIGINT after step 4; the last "
                     "checkpoint is " +
                     out + "/checkpoint-4"),
            std::string::npos)
      << err;
  EXPECT_EQ(readFile(out + "/latest"), "checkpoint-4\n");
  EXPECT_FALSE(fs::exists(out + "/final"));
  // It resumes from there.
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--steps", "6", "--resume",
                          out, "--out", out},
                         err),
            0)
      << err;
  EXPECT_EQ(readFile(out + "/latest"), "checkpoint-6\n");
}

TEST(RuntimeTrainer, TwoThreadsCaptureAndReplayTheirOwnGraphs) {
  Problem p;
  const int64_t steps = 100;
  RunResult single;
  Status s = trainDirect(p, steps, true, single);
  ASSERT_TRUE(s.ok()) << s.message();

  // Thread A captures its step while thread B creates its context,
  // allocates and uploads (calls a global-mode capture would refuse); then
  // B captures its own graph and both replay concurrently.
  std::mutex mutex;
  std::condition_variable changed;
  bool aCapturing = false, bReady = false;
  auto waitFor = [&](bool &flag) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, std::chrono::seconds(20),
                            [&] { return flag; });
  };
  auto set = [&](bool &flag) {
    std::lock_guard<std::mutex> lock(mutex);
    flag = true;
    changed.notify_all();
  };
  // Status is [[nodiscard]]: keep the threads' results in a plain struct.
  struct ThreadResult {
    Status status;
  } resultA, resultB;
  RunResult a, b;
  bool overlapped = false;
  FakeBehaviour captureA;
  captureA.whileCapturing = [&] {
    set(aCapturing);
    overlapped = waitFor(bReady);
  };
  std::thread threadA(
      [&] { resultA = {trainDirect(p, steps, true, a, captureA)}; });
  std::thread threadB([&] {
    resultB = {trainDirect(
        p, steps, true, b, {}, [&] { waitFor(aCapturing); },
        [&] { set(bReady); })};
  });
  threadA.join();
  threadB.join();
  ASSERT_TRUE(resultA.status.ok()) << resultA.status.message();
  ASSERT_TRUE(resultB.status.ok()) << resultB.status.message();
  EXPECT_TRUE(overlapped);
  expectSameMetrics(a.metrics, single.metrics);
  expectSameMetrics(b.metrics, single.metrics);
  expectSameState(a, single);
  expectSameState(b, single);
}

//===----------------------------------------------------------------------===//
// Data parallelism
//===----------------------------------------------------------------------===//

TEST(RuntimeTrainerGroup, OneGpuEqualsTheTrainerAlone) {
  Problem p;
  RunResult alone, group;
  Status aloneRun = trainDirect(p, 20, true, alone);
  ASSERT_TRUE(aloneRun.ok()) << aloneRun.message();
  Status groupRun = trainGroup(p, 20, {}, group);
  ASSERT_TRUE(groupRun.ok()) << groupRun.message();
  expectSameMetrics(group.metrics, alone.metrics);
  expectSameState(group, alone);
  ASSERT_EQ(group.metrics.size(), 20u);
  EXPECT_EQ(group.metrics[3].rankStepMs.size(), 1u);
  EXPECT_EQ(group.metrics[3].rankStepMs[0], group.metrics[3].stepMs);
}

TEST(RuntimeTrainerGroup, NcclWithOneGpuEqualsOneGpu) {
  Problem p;
  // What bind() was given, by every program of the runs.
  struct Bound {
    std::mutex mutex;
    std::vector<DeviceResources> resources;
  };
  auto bound = std::make_shared<Bound>();
  GroupSetup plain, nccl, ncclEager;
  for (GroupSetup *setup : {&plain, &nccl, &ncclEager})
    setup->behaviour.onBind = [bound](const DeviceResources &r) {
      std::lock_guard<std::mutex> lock(bound->mutex);
      bound->resources.push_back(r);
    };
  nccl.nccl = ncclEager.nccl = true;
  ncclEager.graph = false;
  RunResult a, b, c;
  Status plainRun = trainGroup(p, 30, plain, a);
  ASSERT_TRUE(plainRun.ok()) << plainRun.message();
  Status ncclRun = trainGroup(p, 30, nccl, b);
  ASSERT_TRUE(ncclRun.ok()) << ncclRun.message();
  Status eagerRun = trainGroup(p, 30, ncclEager, c);
  ASSERT_TRUE(eagerRun.ok()) << eagerRun.message();
  ASSERT_EQ(bound->resources.size(), 3u);
  EXPECT_EQ(bound->resources[0].allReduceSum, nullptr);
  EXPECT_EQ(bound->resources[0].reduceScatterSum, nullptr);
  EXPECT_EQ(bound->resources[0].allGather, nullptr);
  for (int i : {1, 2}) {
    EXPECT_NE(bound->resources[size_t(i)].allReduceSum, nullptr);
    EXPECT_NE(bound->resources[size_t(i)].reduceScatterSum, nullptr);
    EXPECT_NE(bound->resources[size_t(i)].allGather, nullptr);
    EXPECT_NE(bound->resources[size_t(i)].collectives, nullptr);
    EXPECT_EQ(bound->resources[size_t(i)].rank, 0);
    EXPECT_EQ(bound->resources[size_t(i)].worldSize, 1);
  }
  // The all-reduces of one rank are sums of one term: the same bits.
  expectSameMetrics(b.metrics, a.metrics);
  expectSameState(b, a);
  expectSameMetrics(c.metrics, a.metrics);
  expectSameState(c, a);
  EXPECT_NE(a.metrics.front().loss, a.metrics.back().loss);
}

TEST(RuntimeTrainerGroup, TwoGpusEqualOneGpuWithTwiceTheRows) {
  if (visibleDevices() < 2)
    GTEST_SKIP() << "skipped: needs 2 GPUs";
  Problem p;
  // Pinned anchors: the one-GPU run and the two ranks see the same ones
  // (sampled anchors come from per-rank streams).
  SyntheticRowSource pinned(p.problem, 16, /*pinAnchors=*/true);
  GroupSetup two, twoEager, one;
  two.gpus = twoEager.gpus = {0, 1};
  twoEager.graph = false;
  one.config.rowsPerGpu = 2 * two.config.rowsPerGpu;
  for (GroupSetup *setup : {&two, &twoEager, &one})
    setup->rows = &pinned;
  const int64_t steps = 20; // 5 epochs of 4 global batches
  RunResult a, eager, single;
  std::vector<RunResult> ranks;
  Status twoRun = trainGroup(p, steps, two, a, &ranks);
  ASSERT_TRUE(twoRun.ok()) << twoRun.message();
  Status eagerRun = trainGroup(p, steps, twoEager, eager);
  ASSERT_TRUE(eagerRun.ok()) << eagerRun.message();
  Status singleRun = trainGroup(p, steps, one, single);
  ASSERT_TRUE(singleRun.ok()) << singleRun.message();

  // After the all-reduce every rank applies the same update.
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[0].params, ranks[1].params);
  EXPECT_EQ(ranks[0].state.master, ranks[1].state.master);
  EXPECT_EQ(ranks[0].state.adamM, ranks[1].state.adamM);
  EXPECT_EQ(ranks[0].state.adamV, ranks[1].state.adamV);
  EXPECT_NE(ranks[0].state.rngState, ranks[1].state.rngState);
  // Graph replay and eager steps agree over two GPUs too.
  expectSameMetrics(eager.metrics, a.metrics);
  expectSameState(eager, a);

  // Two GPUs of B rows train like one GPU of 2B rows, up to the order of
  // the float sums.
  ASSERT_EQ(a.metrics.size(), size_t(steps));
  ASSERT_EQ(single.metrics.size(), size_t(steps));
  for (size_t i = 0; i < a.metrics.size(); ++i) {
    std::string at = "step " + std::to_string(i);
    expectClose(a.metrics[i].loss, single.metrics[i].loss, 1e-5, at + " loss");
    expectClose(a.metrics[i].gradNorm, single.metrics[i].gradNorm, 1e-5,
                at + " grad_norm");
    EXPECT_EQ(a.metrics[i].acc, single.metrics[i].acc) << at;
    EXPECT_EQ(a.metrics[i].lr, single.metrics[i].lr) << at;
    ASSERT_EQ(a.metrics[i].rankStepMs.size(), 2u) << at;
    EXPECT_EQ(a.metrics[i].stepMs,
              std::max(a.metrics[i].rankStepMs[0], a.metrics[i].rankStepMs[1]));
  }
  EXPECT_NE(a.metrics.front().loss, a.metrics.back().loss);
  expectCloseTensors(a.state.master, single.state.master, 1e-4, "master");
  expectCloseTensors(a.state.adamM, single.state.adamM, 1e-4, "adam_m");
  EXPECT_EQ(a.state.data.epoch, single.state.data.epoch);
  EXPECT_EQ(a.state.data.row, single.state.data.row);
  // The whole run's tokens: twice the rows of one rank.
  EXPECT_DOUBLE_EQ(a.metrics[5].contextTokensPerS,
                   4.0 * 32 / (a.metrics[5].stepMs / 1e3));
}

TEST(RuntimeTrainerGroup, AFailedRankStopsTheOthers) {
  if (visibleDevices() < 2)
    GTEST_SKIP() << "skipped: needs 2 GPUs";
  Problem p;
  // Rank 1 cannot read the first row of its step 3: no rank starts that
  // step.
  BatchLoader probe(*p.rows, smallConfig(), 5, 1, 2);
  HostBatch batch;
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(probe.next(batch).ok());
  FailingSource failing(*p.rows, batch.rows[0]);
  for (bool graph : {true, false}) {
    GroupSetup setup;
    setup.gpus = {0, 1};
    setup.graph = graph;
    setup.rows = &failing;
    RunResult result;
    Status s = trainGroup(p, 10, setup, result);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.message(),
              "step 3: row " + std::to_string(batch.rows[0]) + ": read failed");
    EXPECT_EQ(result.metrics.size(), 3u);
  }

  // Rank 1 breaks in the middle of step 3 without its all-reduces: rank 0
  // is left waiting in them on the device, and must give up.
  GroupSetup setup;
  setup.gpus = {0, 1};
  setup.graph = false;
  setup.behaviour.failAtEnqueue = 3;
  setup.behaviour.failRank = 1;
  RunResult result;
  auto started = std::chrono::steady_clock::now();
  Status s = trainGroup(p, 10, setup, result);
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
          .count();
  ASSERT_FALSE(s.ok());
  // Rank 1's own error, not rank 0's "another GPU of the run failed".
  EXPECT_EQ(s.message().rfind("step 3: launching the step: ", 0), 0u)
      << s.message();
  EXPECT_EQ(result.metrics.size(), 3u);
  EXPECT_LT(seconds, 60.0);
}

TEST(RuntimeTrainer, NcclFlagGivesTheSameRun) {
  TrainerTempDir dir;
  std::string plain = dir.path + "/plain", nccl = dir.path + "/nccl";
  std::string err;
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--rows", "10", "--steps",
                          "12", "--out", plain},
                         err),
            0)
      << err;
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--rows", "10", "--steps",
                          "12", "--nccl", "--out", nccl},
                         err),
            0)
      << err;
  EXPECT_NE(err.find("data parallel over 1 GPU with NCCL"), std::string::npos)
      << err;
  auto expected = readMetricsLog(plain + "/metrics.jsonl");
  auto got = readMetricsLog(nccl + "/metrics.jsonl");
  ASSERT_EQ(expected.size(), 12u);
  for (const auto &[step, values] : expected)
    EXPECT_EQ(got[step], values) << "step " << step;
  EXPECT_EQ(readFile(nccl + "/final/model.safetensors"),
            readFile(plain + "/final/model.safetensors"));
  EXPECT_EQ(readFile(nccl + "/checkpoint-12/training/state.safetensors"),
            readFile(plain + "/checkpoint-12/training/state.safetensors"));
}

TEST(RuntimeTrainer, DataParallelResumeContinuesExactly) {
  if (visibleDevices() < 2)
    GTEST_SKIP() << "skipped: needs 2 GPUs";
  TrainerTempDir dir;
  std::string whole = dir.path + "/whole", split = dir.path + "/split";
  std::string err;
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--rows", "12", "--steps",
                          "16", "--gpus", "0,1", "--out", whole},
                         err),
            0)
      << err;
  EXPECT_NE(err.find("data parallel over 2 GPUs with NCCL: 4 rows per step"),
            std::string::npos)
      << err;
  ASSERT_EQ(
      runTrainMain({"--data", "synthetic", "--rows", "12", "--steps", "8",
                    "--total-steps", "16", "--gpus", "0,1", "--out", split},
                   err),
      0)
      << err;
  // Every rank's anchor stream is in the checkpoint.
  TrainingState saved;
  ASSERT_TRUE(
      loadTrainingState(split + "/checkpoint-8", smallConfig(), saved).ok());
  EXPECT_EQ(saved.worldSize(), 2);
  // Resuming needs the same number of GPUs.
  EXPECT_EQ(runTrainMain({"--data", "synthetic", "--steps", "16", "--resume",
                          split, "--gpus", "0", "--out", split},
                         err),
            1);
  EXPECT_NE(err.find("resume on the same number of GPUs"), std::string::npos)
      << err;
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--steps", "16", "--resume",
                          split, "--gpus", "0,1", "--out", split},
                         err),
            0)
      << err;
  auto expected = readMetricsLog(whole + "/metrics.jsonl");
  auto resumed = readMetricsLog(split + "/metrics.jsonl");
  ASSERT_EQ(expected.size(), 16u);
  ASSERT_EQ(resumed.size(), 16u);
  for (const auto &[step, values] : expected)
    EXPECT_EQ(resumed[step], values) << "step " << step;
  EXPECT_EQ(readFile(split + "/final/model.safetensors"),
            readFile(whole + "/final/model.safetensors"));
  EXPECT_EQ(readFile(split + "/checkpoint-16/training/state.safetensors"),
            readFile(whole + "/checkpoint-16/training/state.safetensors"));
  // Every line lists both ranks' times.
  std::ifstream in(whole + "/metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  nlohmann::json first = nlohmann::json::parse(line);
  ASSERT_TRUE(first["rank_step_ms"].is_array());
  EXPECT_EQ(first["rank_step_ms"].size(), 2u);
}

//===----------------------------------------------------------------------===//
// Sharded optimizer state (ZeRO-1)
//===----------------------------------------------------------------------===//

namespace {

/// A fresh seed per run (DFLASH_TEST_SEED=<n> repeats one), printed with
/// any failure.
uint64_t testSeed() {
  if (const char *given = std::getenv("DFLASH_TEST_SEED"))
    return std::strtoull(given, nullptr, 10);
  return std::random_device{}();
}

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

//===----------------------------------------------------------------------===//
// The online target on a GPU of its own (TargetServer)
//===----------------------------------------------------------------------===//

__global__ void spinThenFillKernel(uint16_t *data, int64_t n, uint16_t value,
                                   long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    data[i] = value;
}

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
