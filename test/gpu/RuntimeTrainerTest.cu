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
// Checks: graph replay equals eager execution bit for bit; a checkpoint
// resumed continues exactly like an uninterrupted run; a non-finite loss
// stops the run without touching the last checkpoint; SIGINT saves and exits
// with 130; two trainers on two threads of one GPU capture (one of them while
// the other allocates and synchronises) and replay their own graphs with the
// results of a single thread.
//
//===----------------------------------------------------------------------===//

#include "kernels/Bf16.h"
#include "kernels/CudaCheck.cuh"
#include "runtime/DeviceContext.h"
#include "runtime/Synthetic.h"
#include "runtime/TrainMain.h"
#include "runtime/Trainer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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
#include <unistd.h>

using namespace dflash;
using namespace dflash::rt;
namespace fs = std::filesystem;

namespace {

ModelConfig smallConfig() {
  ModelConfig c;
  c.name = "trainer-test";
  c.targetModel = "test/target";
  c.targetNumLayers = 4;
  c.targetHiddenSize = c.hiddenSize = 16;
  c.vocabSize = 64;
  c.targetLayerIds = {1, 2};
  c.numLayers = 1;
  c.intermediateSize = 32;
  c.numHeads = 2;
  c.numKvHeads = 1;
  c.headDim = 8;
  c.blockSize = 4;
  c.maskTokenId = 63;
  c.maxPositionEmbeddings = 128;
  c.layerWindows = {0};
  c.seqLen = 32;
  c.anchorsPerRow = 3;
  c.rowsPerGpu = 2;
  c.seed = 5;
  c.lr = 1e-2;
  c.warmupRatio = 0.0;
  c.totalSteps = 20;
  return c;
}

std::vector<BufferSpec> stepBuffers(const ModelConfig &c) {
  const int64_t B = c.rowsPerGpu, S = c.seqLen, N = c.anchorsPerRow;
  std::vector<BufferSpec> buffers = {
      {"input_ids", BufferRole::Input, DType::I32, {B, S}},
      {"loss_mask", BufferRole::Input, DType::U8, {B, S}},
      {"target_hidden",
       BufferRole::Input,
       DType::BF16,
       {B, S, c.contextWidth()}},
      {"anchors", BufferRole::Input, DType::I32, {B, N}},
      {"keep", BufferRole::Input, DType::U8, {B, N}},
      {"embed", BufferRole::Frozen, DType::BF16, {c.vocabSize, c.hiddenSize}},
      {"lm_head", BufferRole::Frozen, DType::BF16, {c.vocabSize, c.hiddenSize}},
  };
  for (const ParamInfo &p : parameterTable(c))
    buffers.push_back({p.name, BufferRole::Parameter, DType::BF16, p.shape});
  for (const ParamInfo &p : parameterTable(c)) {
    buffers.push_back({p.name, BufferRole::Master, DType::F32, p.shape});
    buffers.push_back({p.name, BufferRole::Moment1, DType::F32, p.shape});
    buffers.push_back({p.name, BufferRole::Moment2, DType::F32, p.shape});
  }
  buffers.push_back({"step", BufferRole::Counter, DType::I32, {}});
  buffers.push_back({"total_steps", BufferRole::Counter, DType::I32, {}});
  for (const char *name : {"loss", "acc", "grad_norm", "lr"})
    buffers.push_back({name, BufferRole::Metric, DType::F32, {}});
  return buffers;
}

//===----------------------------------------------------------------------===//
// The hand-written step
//===----------------------------------------------------------------------===//

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

/// The step's regression target: a scalar mixing every input and the
/// embedding, so that a different batch gives a different loss.
__global__ void batchTargetKernel(const int32_t *ids, const uint8_t *mask,
                                  const uint16_t *hidden,
                                  const int32_t *anchors, const uint8_t *keep,
                                  const uint16_t *embed, int64_t tokens,
                                  int64_t features, int64_t slots,
                                  float *target, float *acc) {
  __shared__ float shared[kThreads];
  float idSum = 0, hiddenSum = 0, keptSum = 0, anchorSum = 0;
  for (int64_t i = threadIdx.x; i < tokens; i += kThreads)
    idSum += float(ids[i] * mask[i]);
  for (int64_t i = threadIdx.x; i < features; i += kThreads)
    hiddenSum += bf16ToFloat(hidden[i]);
  for (int64_t i = threadIdx.x; i < slots; i += kThreads) {
    keptSum += float(keep[i]);
    anchorSum += float(anchors[i] * keep[i]);
  }
  idSum = blockSum(idSum, shared);
  hiddenSum = blockSum(hiddenSum, shared);
  keptSum = blockSum(keptSum, shared);
  anchorSum = blockSum(anchorSum, shared);
  if (threadIdx.x == 0) {
    target[0] = fmodf(idSum, 97.f) / 97.f + hiddenSum / float(features) +
                anchorSum / 1000.f + bf16ToFloat(embed[0]);
    acc[0] = keptSum / float(slots);
  }
}

/// parts[0] = sum((m - t)^2) / n, parts[1] = its squared gradient norm.
__global__ void tensorLossKernel(const float *master, int64_t n,
                                 const float *target, float *parts) {
  __shared__ float shared[kThreads];
  float t = target[0], sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    float d = master[i] - t;
    sum += d * d;
  }
  sum = blockSum(sum, shared);
  if (threadIdx.x == 0) {
    parts[0] = sum / float(n);
    parts[1] = 4.f * sum / (float(n) * float(n));
  }
}

__global__ void finalizeKernel(const float *parts, int tensors,
                               const int32_t *step, const int32_t *total,
                               float lr0, int nanStep, float *loss,
                               float *gradNorm, float *lr) {
  float l = 0, g = 0;
  for (int i = 0; i < tensors; ++i) {
    l += parts[2 * i];
    g += parts[2 * i + 1];
  }
  if (*step == nanStep)
    l = __int_as_float(0x7fc00000);
  *loss = l;
  *gradNorm = sqrtf(g);
  *lr = lr0 * float(*step + 1) / float(*total);
}

__global__ void updateKernel(uint16_t *param, float *master, float *m1,
                             float *m2, int64_t n, const float *target,
                             const float *lr, const float *loss) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  float g = 2.f * (master[i] - target[0]) / float(n);
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
};

class FakeGpuProgram : public StepProgram {
public:
  explicit FakeGpuProgram(FakeBehaviour behaviour = {})
      : cfg(smallConfig()), specs(stepBuffers(cfg)),
        behaviour(std::move(behaviour)) {}
  const ModelConfig &config() const override { return cfg; }
  const std::vector<BufferSpec> &buffers() const override { return specs; }
  size_t arenaBytes() const override { return 4096; }
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
    boundWithGemm = resources.gemm != nullptr && resources.worldSize == 1;
    for (size_t i = 0; i < pointers.size(); ++i)
      alignedTo256 &= reinterpret_cast<uintptr_t>(pointers[i]) % 256 == 0;
    alignedTo256 &= reinterpret_cast<uintptr_t>(arena) % 256 == 0;
  }

  void enqueue(cudaStream_t stream) override {
    int call = enqueueCalls++;
    if (call == behaviour.signalAtEnqueue)
      std::raise(SIGINT);
    const int64_t B = cfg.rowsPerGpu, S = cfg.seqLen, N = cfg.anchorsPerRow;
    float *target = scratch, *parts = scratch + 1;
    batchTargetKernel<<<1, kThreads, 0, stream>>>(
        at<int32_t>(map.inputIds), at<uint8_t>(map.lossMask),
        at<uint16_t>(map.targetHidden), at<int32_t>(map.anchors),
        at<uint8_t>(map.keep), at<uint16_t>(map.embed), B * S,
        B * S * cfg.contextWidth(), B * N, target, at<float>(map.acc));
    DFLASH_CUDA_CHECK_LAUNCH("batchTargetKernel");
    std::vector<ParamInfo> table = parameterTable(cfg);
    for (size_t t = 0; t < table.size(); ++t) {
      tensorLossKernel<<<1, kThreads, 0, stream>>>(
          at<float>(map.master[t]), table[t].numel(), target, parts + 2 * t);
      DFLASH_CUDA_CHECK_LAUNCH("tensorLossKernel");
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DFLASH_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture == cudaStreamCaptureStatusActive && behaviour.whileCapturing)
      behaviour.whileCapturing();
    finalizeKernel<<<1, 1, 0, stream>>>(
        parts, int(table.size()), at<int32_t>(map.stepCounter),
        at<int32_t>(map.totalStepsCounter), lr0, behaviour.nanStep,
        at<float>(map.loss), at<float>(map.gradNorm), at<float>(map.lr));
    DFLASH_CUDA_CHECK_LAUNCH("finalizeKernel");
    for (size_t t = 0; t < table.size(); ++t) {
      int64_t n = table[t].numel();
      updateKernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0,
                     stream>>>(
          at<uint16_t>(map.param[t]), at<float>(map.master[t]),
          at<float>(map.moment1[t]), at<float>(map.moment2[t]), n, target,
          at<float>(map.lr), at<float>(map.loss));
      DFLASH_CUDA_CHECK_LAUNCH("updateKernel");
    }
  }

  bool boundWithGemm = false;
  bool alignedTo256 = true;
  int enqueueCalls = 0;

private:
  template <typename T> T *at(int index) const {
    return static_cast<T *>(ptrs[size_t(index)]);
  }

  ModelConfig cfg;
  std::vector<BufferSpec> specs;
  FakeBehaviour behaviour;
  StepBufferMap map;
  std::vector<void *> ptrs;
  float *scratch = nullptr;
  float lr0 = 0;
};

//===----------------------------------------------------------------------===//
// Running it
//===----------------------------------------------------------------------===//

struct TempDir {
  std::string path;
  TempDir() {
    std::string pattern =
        (fs::temp_directory_path() / "dflash-trainer-XXXXXX").string();
    path = ::mkdtemp(pattern.data()) ? pattern : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
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
/// `afterCreate` runs once the device context exists.
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
  TrainerHooks hooks;
  hooks.onStep = [&](const StepMetrics &m) {
    result.metrics.push_back(m);
    return Status::success();
  };
  TrainerOutcome outcome;
  if (Status s = trainer.run(hooks, outcome); !s.ok())
    return s;
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

/// trainMain with the fake step; the behaviour is global because a factory
/// is a plain function pointer.
FakeBehaviour mainBehaviour;
std::unique_ptr<StepProgram> makeFakeProgram() {
  return std::make_unique<FakeGpuProgram>(mainBehaviour);
}

int runTrainMain(std::vector<std::string> args, std::string &err,
                 FakeBehaviour behaviour = {}) {
  mainBehaviour = std::move(behaviour);
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

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
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
  TempDir dir;
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
  TempDir dir;
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
  TempDir dir;
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
