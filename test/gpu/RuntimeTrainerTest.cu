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
// Checks: graph replay equals eager execution bit for bit; a checkpoint
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
//===----------------------------------------------------------------------===//

#include "kernels/Bf16.h"
#include "kernels/CudaCheck.cuh"
#include "runtime/DeviceContext.h"
#include "runtime/Synthetic.h"
#include "runtime/TrainMain.h"
#include "runtime/Trainer.h"
#include "test/unit/RuntimeTestSupport.h"
#include "test/unit/StepProgramTestSupport.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
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
                                 const uint16_t *hidden,
                                 const int32_t *anchors, const uint8_t *keep,
                                 const uint16_t *embed, int64_t rows,
                                 int64_t seq, int64_t width, int64_t slots,
                                 float *targets, float *kept) {
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
};

__global__ void emptyKernel() {}

class FakeGpuProgram : public StepProgram {
public:
  explicit FakeGpuProgram(FakeBehaviour behaviour = {},
                          ModelConfig config = smallConfig())
      : cfg(std::move(config)), specs(stepBuffers(cfg)),
        behaviour(std::move(behaviour)) {
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
  size_t arenaBytes() const override { return arenaFloats * sizeof(float); }
  size_t gemmWorkspaceBytes() const override { return 1 << 20; }
  double flopsPerStep() const override { return 1e6; }

  void bind(const std::vector<void *> &pointers, void *arena,
            const DeviceResources &resources, const StepHyper &hyper) override {
    Status s = mapStepBuffers(specs, cfg, map);
    if (!s.ok()) {
      std::fprintf(stderr, "fake step: %s\n", s.message().c_str());
      std::abort();
    }
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
  }

  void enqueue(cudaStream_t stream) override {
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
    rowTargetsKernel<<<1, kThreads, 0, stream>>>(
        at<int32_t>(map.inputIds), at<uint8_t>(map.lossMask),
        at<uint16_t>(map.targetHidden), at<int32_t>(map.anchors),
        at<uint8_t>(map.keep), at<uint16_t>(map.embed), B, S,
        cfg.contextWidth(), N, targets, scalars);
    DFLASH_CUDA_CHECK_LAUNCH("rowTargetsKernel");
    for (int t = 0; t < tensors; ++t) {
      tensorLossKernel<<<1, kThreads, 0, stream>>>(
          at<float>(map.master[size_t(t)]), table[size_t(t)].numel(), targets,
          B, globalRows, scalars + 1 + t, grad(t));
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
        at<int32_t>(map.stepCounter), at<int32_t>(map.totalStepsCounter), lr0,
        behaviour.nanStep, at<float>(map.loss), at<float>(map.acc),
        at<float>(map.gradNorm), at<float>(map.lr));
    DFLASH_CUDA_CHECK_LAUNCH("finalizeKernel");
    for (int t = 0; t < tensors; ++t) {
      int64_t n = table[size_t(t)].numel();
      updateKernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0,
                     stream>>>(
          at<uint16_t>(map.param[size_t(t)]), at<float>(map.master[size_t(t)]),
          at<float>(map.moment1[size_t(t)]), at<float>(map.moment2[size_t(t)]),
          grad(t), n, at<float>(map.lr), at<float>(map.loss));
      DFLASH_CUDA_CHECK_LAUNCH("updateKernel");
    }
    // Last, unchecked: the runtime's launch check must see it.
    if (broken)
      emptyKernel<<<0, 1, 0, stream>>>(); // invalid: zero blocks
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

  ModelConfig cfg;
  std::vector<BufferSpec> specs;
  FakeBehaviour behaviour;
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
};

/// Trains `steps` steps of a fresh run with a TrainerGroup, the way
/// trainMain does. `result` gets the run's metrics and local rank 0's
/// final state, `ranks` (when given) every local rank's.
Status trainGroup(const Problem &p, int64_t steps, const GroupSetup &setup,
                  RunResult &result, std::vector<RunResult> *ranks = nullptr) {
  GroupLayout layout;
  layout.gpus = setup.gpus;
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
  EXPECT_TRUE(fs::exists(split + "/checkpoint-5/training_state.safetensors"));
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
  EXPECT_EQ(readFile(split + "/checkpoint-20/training_state.safetensors"),
            readFile(whole + "/checkpoint-20/training_state.safetensors"));
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
      readFile(out + "/checkpoint-10/training_state.safetensors");
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
  EXPECT_EQ(readFile(out + "/checkpoint-10/training_state.safetensors"), state);
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
  for (int i : {1, 2}) {
    EXPECT_NE(bound->resources[size_t(i)].allReduceSum, nullptr);
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
    EXPECT_EQ(a.metrics[i].stepMs, std::max(a.metrics[i].rankStepMs[0],
                                            a.metrics[i].rankStepMs[1]));
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
    EXPECT_EQ(s.message(), "step 3: row " + std::to_string(batch.rows[0]) +
                               ": read failed");
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
  double seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - started)
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
  EXPECT_EQ(readFile(nccl + "/checkpoint-12/training_state.safetensors"),
            readFile(plain + "/checkpoint-12/training_state.safetensors"));
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
  ASSERT_EQ(runTrainMain({"--data", "synthetic", "--rows", "12", "--steps",
                          "8", "--total-steps", "16", "--gpus", "0,1", "--out",
                          split},
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
  EXPECT_EQ(readFile(split + "/checkpoint-16/training_state.safetensors"),
            readFile(whole + "/checkpoint-16/training_state.safetensors"));
  // Every line lists both ranks' times.
  std::ifstream in(whole + "/metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  nlohmann::json first = nlohmann::json::parse(line);
  ASSERT_TRUE(first["rank_step_ms"].is_array());
  EXPECT_EQ(first["rank_step_ms"].size(), 2u);
}
