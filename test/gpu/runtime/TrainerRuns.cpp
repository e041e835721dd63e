//===- TrainerRuns.cpp - Running the trainer on the fake step -------------===//
//
// The runs and comparisons TrainerRuns.h declares.
//
//===----------------------------------------------------------------------===//

#include "test/gpu/runtime/TrainerRuns.h"

#include "runtime/cli/TrainMain.h"
#include "runtime/device/DeviceContext.h"
#include "runtime/train/TrainerGroup.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

namespace dflash::runtimetest::gpu {

namespace {

/// trainMain with the fake step; the behaviour is global because a factory
/// is a plain function pointer.
FakeBehaviour mainBehaviour;
std::unique_ptr<StepProgram> makeFakeProgram() {
  return std::make_unique<FakeGpuProgram>(mainBehaviour);
}

} // namespace

Status trainDirect(const Problem &p, int64_t steps, bool graph,
                   RunResult &result, FakeBehaviour behaviour,
                   const std::function<void()> &beforeInit,
                   const std::function<void()> &afterInit) {
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

Status trainGroup(const Problem &p, int64_t steps, const GroupSetup &setup,
                  RunResult &result, std::vector<RunResult> *ranks) {
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

int runTrainMain(std::vector<std::string> args, std::string &err,
                 FakeBehaviour behaviour) {
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

} // namespace dflash::runtimetest::gpu
