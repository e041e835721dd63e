//===- GeneratedStepThreadsTest.cpp - The compiled step on worker threads -===//
//
// The failure mode of threaded PyTorch pipelines, with the step dflashc
// compiles for specs/tiny.toml (generated into the build directory): two
// worker threads on one GPU each capture and replay their own CUDA graph of
// the step, concurrently, for 100 steps; each gives exactly the results of
// a single thread.
//
//===----------------------------------------------------------------------===//

#include "runtime/data/InitialParameters.h"
#include "runtime/data/Synthetic.h"
#include "runtime/device/DeviceContext.h"
#include "runtime/train/Trainer.h"
#include "runtime/train/TrainerGroup.h"

#include <gtest/gtest.h>

#include <thread>

using namespace dflash;
using namespace dflash::rt;

namespace {

struct TrainRun {
  Status status;
  std::vector<StepMetrics> metrics;
  std::vector<std::vector<uint16_t>> params;
  TrainingState state;
};

/// One fresh run of `steps` steps of the generated tiny step on GPU 0.
void train(const SyntheticProblem &problem, const RowSource &rows,
           int64_t steps, TrainRun &out) {
  std::unique_ptr<StepProgram> program = createStepProgram();
  std::unique_ptr<DeviceContext> device;
  if (Status s =
          DeviceContext::create(0, program->gemmWorkspaceBytes(), device);
      !s.ok()) {
    out.status = s;
    return;
  }
  TrainerOptions options;
  options.run.totalSteps = steps;
  options.run.seed = 3;
  options.run.lr = program->config().lr;
  options.run.warmupRatio = program->config().warmupRatio;
  options.run.data = "synthetic";
  options.run.syntheticRows = rows.numRows();
  options.finalStep = steps;
  options.useGraph = true;
  Trainer trainer(*program, *device, options);
  TrainerInputs inputs;
  inputs.target = &problem.target();
  inputs.rows = &rows;
  inputs.params = problem.initialParameters();
  if (Status s = trainer.init(inputs); !s.ok()) {
    out.status = s;
    return;
  }
  while (trainer.stepsDone() < steps) {
    StepMetrics m;
    if (Status s = trainer.step(m); !s.ok()) {
      out.status = s;
      return;
    }
    out.metrics.push_back(m);
  }
  out.status = trainer.readState(out.params, out.state);
}

TEST(GeneratedStepThreads, TwoThreadsOnOneGpuEqualOneThread) {
  std::unique_ptr<StepProgram> probe = createStepProgram();
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(probe->config(), 3).ok());
  SyntheticRowSource rows(problem, 32, /*pinAnchors=*/false);
  rows.materialize();
  const int64_t steps = 100;

  TrainRun single;
  train(problem, rows, steps, single);
  ASSERT_TRUE(single.status.ok()) << single.status.message();
  ASSERT_EQ(single.metrics.size(), size_t(steps));
  EXPECT_LT(single.metrics.back().loss, single.metrics.front().loss);

  TrainRun a, b;
  std::thread ta([&] { train(problem, rows, steps, a); });
  std::thread tb([&] { train(problem, rows, steps, b); });
  ta.join();
  tb.join();
  for (TrainRun *r : {&a, &b}) {
    ASSERT_TRUE(r->status.ok()) << r->status.message();
    ASSERT_EQ(r->metrics.size(), single.metrics.size());
    for (size_t i = 0; i < single.metrics.size(); ++i) {
      EXPECT_EQ(r->metrics[i].loss, single.metrics[i].loss) << "step " << i;
      EXPECT_EQ(r->metrics[i].gradNorm, single.metrics[i].gradNorm)
          << "step " << i;
    }
    EXPECT_EQ(r->params, single.params);
    EXPECT_EQ(r->state.master, single.state.master);
  }
  std::printf("generated step: 2 threads x %lld steps, loss %.4f -> %.4f, "
              "identical to one thread\n",
              (long long)steps, single.metrics.front().loss,
              single.metrics.back().loss);
}

} // namespace
