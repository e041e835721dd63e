//===- TrainerRuns.h - Running the trainer on the fake step -----*- C++ -*-===//
//
// How the runtime's GPU tests run the hand-written step (FakeStepPrograms.h):
// a Trainer on the calling thread (trainDirect), a TrainerGroup the way
// trainMain drives one (trainGroup), trainMain itself (runTrainMain), and the
// comparisons of their metrics and final states.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_TEST_GPU_RUNTIME_TRAINERRUNS_H
#define DFLASH_TEST_GPU_RUNTIME_TRAINERRUNS_H

#include "runtime/data/Synthetic.h"
#include "runtime/train/Trainer.h"
#include "test/gpu/runtime/FakeStepPrograms.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dflash::runtimetest::gpu {

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
                   const std::function<void()> &afterInit = nullptr);

void expectSameMetrics(const std::vector<StepMetrics> &a,
                       const std::vector<StepMetrics> &b);

void expectSameState(const RunResult &a, const RunResult &b);

/// |a - b| <= tolerance * max(1, |b|).
void expectClose(double a, double b, double tolerance, const std::string &what);

void expectCloseTensors(const std::vector<std::vector<float>> &a,
                        const std::vector<std::vector<float>> &b,
                        double tolerance, const std::string &what);

int visibleDevices();

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
                  RunResult &result, std::vector<RunResult> *ranks = nullptr);

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

/// Without --gpus in `args`: on device 0 alone, whatever the machine has.
int runTrainMain(std::vector<std::string> args, std::string &err,
                 FakeBehaviour behaviour = {});

/// The loss, acc, grad_norm and lr of every line of a metrics log, by step.
std::map<int64_t, std::vector<double>> readMetricsLog(const std::string &path);

} // namespace dflash::runtimetest::gpu

#endif // DFLASH_TEST_GPU_RUNTIME_TRAINERRUNS_H
