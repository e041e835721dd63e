//===- TrainMain.cpp - The train command ----------------------------------===//

#include "runtime/cli/TrainMain.h"

#include "runtime/cli/PrepareRun.h"
#include "runtime/device/Collectives.h"
#include "runtime/device/DeviceContext.h"
#include "runtime/train/TrainerGroup.h"
#include "schema/Parameters.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <mutex>
#include <unistd.h>

using namespace dflash;
using namespace dflash::rt;
namespace fs = std::filesystem;

//===----------------------------------------------------------------------===//
// trainMain
//===----------------------------------------------------------------------===//

namespace {

/// Set by the first SIGINT or SIGTERM; the trainer polls it between steps.
std::atomic<int> stopSignal{0};

extern "C" void recordStopSignal(int signal) { stopSignal.store(signal); }

/// Installs the stop handlers for the lifetime of a run. SA_RESETHAND
/// restores the default action after the first signal, so that a second
/// one ends the process at once.
class StopSignalHandlers {
public:
  StopSignalHandlers() {
    stopSignal.store(0);
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_handler = recordStopSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | SA_RESETHAND;
    sigaction(SIGINT, &action, &previousInt);
    sigaction(SIGTERM, &action, &previousTerm);
  }
  ~StopSignalHandlers() {
    sigaction(SIGINT, &previousInt, nullptr);
    sigaction(SIGTERM, &previousTerm, nullptr);
  }

private:
  struct sigaction previousInt, previousTerm;
};

/// Whether the process is inside the GPU part of a run. The kernel library's
/// checks (kernels/CudaCheck.cuh) report a failed call and quick_exit();
/// this lets the exit path add the line a user of `train` looks for.
std::atomic<bool> deviceWorkActive{false};

void reportDeviceFailureAtExit() {
  if (deviceWorkActive.load())
    std::fprintf(stderr, "train: error: a CUDA or cuBLAS call in the training "
                         "step failed (reported above); stopped without "
                         "saving\n");
}

class DeviceWorkScope {
public:
  DeviceWorkScope() {
    static std::once_flag registered;
    std::call_once(registered,
                   [] { std::at_quick_exit(reportDeviceFailureAtExit); });
    deviceWorkActive.store(true);
  }
  ~DeviceWorkScope() { deviceWorkActive.store(false); }
};

int fail(const std::string &message) {
  std::fprintf(stderr, "train: error: %s\n", message.c_str());
  return 1;
}

/// "0,1,3".
std::string gpuListText(const std::vector<int> &gpus) {
  std::string text;
  for (int gpu : gpus)
    text += (text.empty() ? "" : ",") + std::to_string(gpu);
  return text;
}

std::string numberText(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

const char *signalName(int signal) {
  switch (signal) {
  case SIGINT:
    return "SIGINT";
  case SIGTERM:
    return "SIGTERM";
  default:
    return "a signal";
  }
}

/// Every process of a run trains on the same number of GPUs: ranks are
/// numbered node * gpusPerNode + local index.
Status checkSameGpuCount(ProcessGroup &processes, int64_t gpus) {
  std::vector<int64_t> counts(size_t(processes.size()));
  DFLASH_RETURN_IF_ERROR(
      processes.allGather(&gpus, sizeof(gpus), counts.data()));
  auto gpuCount = [](int64_t n) {
    return std::to_string(n) + (n == 1 ? " GPU" : " GPUs");
  };
  for (size_t node = 0; node < counts.size(); ++node)
    if (counts[node] != gpus)
      return Status::error("--gpus: node " + std::to_string(node) +
                           " trains on " + gpuCount(counts[node]) +
                           " but node " + std::to_string(processes.rank()) +
                           " on " + gpuCount(gpus) +
                           "; every node needs the same number");
  return Status::success();
}

int runTraining(int argc, char **argv, GeneratedPrograms programs) {
  auto factory = programs.step;
  std::unique_ptr<StepProgram> program = factory ? factory() : nullptr;
  if (!program)
    return fail("this trainer was built without a step program");
  const ModelConfig &config = program->config();
  if (Status s = validateModelConfig(config); !s.ok())
    return fail("the compiled drafter: " + s.message());

  TrainOptions options;
  std::string text;
  switch (parseTrainCommandLine(argc, argv, config, options, text)) {
  case CommandLineAction::ShowHelp:
    std::fputs(text.c_str(), stdout);
    return 0;
  case CommandLineAction::Fail:
    return fail(text);
  case CommandLineAction::Train:
    break;
  }

  // The other nodes of an mpirun launch, if any. From here on a failure on
  // one process ends all of them: the others would wait for it forever in
  // their next collective.
  std::unique_ptr<ProcessGroup> processes;
  if (Status s = joinProcessGroup(processes); !s.ok())
    return fail(s.message());
  const int64_t node = processes ? processes->rank() : 0;
  const int64_t nodes = processes ? processes->size() : 1;
  const bool leader = node == 0; // writes the log, progress and files
  auto failRun = [&](const std::string &message) {
    int code = fail(nodes > 1 ? "node " + std::to_string(node) + ": " + message
                              : message);
    if (processes)
      processes->abortAll(code);
    return code;
  };

  if (Status s = validateTrainOptions(options, config); !s.ok())
    return failRun(s.message());
  // One run per output directory, held until this process ends (the
  // writing node only); a directory a live run holds is not resumed either.
  DirectoryLock outputLock;
  if (leader)
    if (Status s = lockOutputDirectory(options, outputLock); !s.ok())
      return failRun(s.message());
  // Counting devices initialises the driver but uses none of them.
  std::string reason;
  int devices = visibleCudaDevices(reason);
  if (Status s = resolveGpus(options, devices); !s.ok())
    return failRun(s.message());
  if (nodes > 1) {
    if (!collectivesAvailable())
      return failRun("a run over " + std::to_string(nodes) +
                     " nodes needs NCCL, and this trainer was built without "
                     "it");
    if (Status s = checkSameGpuCount(*processes, int64_t(options.gpus.size()));
        !s.ok())
      return failRun(s.message());
  }
  // The online target, where the trainer was compiled with one: its
  // buffers say which checkpoint tensors to load.
  std::unique_ptr<StepProgram> target =
      programs.target ? programs.target() : nullptr;
  PreparedRun run;
  if (Status s = prepareRun(options, config, run, node, nodes,
                            target ? &target->buffers() : nullptr);
      !s.ok())
    return failRun(s.message());
  if (run.inputs.targetProgramWeights)
    run.inputs.targetProgram = programs.target;
  run.layout.processes = processes.get();
  int64_t firstStep = run.inputs.resume ? run.inputs.resume->step : 0;
  MetricsLog log;
  if (leader)
    if (Status s = log.open(run.logPath, firstStep); !s.ok())
      return failRun(s.message());
  // The edges that the log's per-bucket figures follow, on its first line.
  if (config.numPositionBuckets() > 1)
    log.setPositionBuckets(config.positionBuckets);

  // Only now the GPUs.
  if (devices == 0)
    return failRun("no CUDA device is visible" +
                   (reason.empty() ? std::string() : " (" + reason + ")"));
  for (int gpu : options.gpus)
    if (gpu >= devices)
      return failRun("--gpus: device " + std::to_string(gpu) +
                     " does not exist (" + std::to_string(devices) +
                     " visible)");
  for (int gpu : options.targetGpus)
    if (gpu >= devices)
      return failRun("--target-gpus: device " + std::to_string(gpu) +
                     " does not exist (" + std::to_string(devices) +
                     " visible)");

  const int64_t world = run.layout.worldSize();
  auto note = [&](const std::string &message) {
    if (leader)
      std::fprintf(stderr, "train: %s\n", message.c_str());
  };
  note(config.name + ": " + std::to_string(numParameters(config)) +
       " trainable parameters; " + std::to_string(config.rowsPerStep()) +
       " rows x " + std::to_string(config.seqLen) + " tokens per GPU and step" +
       (config.gradientAccumulation > 1
            ? ", in " + std::to_string(config.gradientAccumulation) +
                  " micro-steps of " + std::to_string(config.rowsPerGpu) +
                  " rows (gradient accumulation)"
            : std::string()));
  if (world > 1 || options.nccl)
    note("data parallel over " + std::to_string(world) + " GPU" +
         (world > 1 ? "s" : "") +
         (nodes > 1 ? " (" + std::to_string(nodes) + " nodes x " +
                          std::to_string(options.gpus.size()) + ")"
                    : std::string()) +
         " with NCCL: " + std::to_string(world * config.rowsPerStep()) +
         " rows per step");
  if (!run.resumedFrom.empty())
    note("resuming " + run.resumedFrom + " at step " +
         std::to_string(firstStep));
  note("data: " +
       (options.data == "synthetic"
            ? "synthetic, " + std::to_string(run.trainer.run.syntheticRows) +
                  " rows"
            : options.data + ", " + std::to_string(run.rows->numRows()) +
                  " rows") +
       "; schedule of " + std::to_string(run.trainer.run.totalSteps) +
       " steps, lr " + numberText(run.trainer.run.lr) + ", warmup ratio " +
       numberText(run.trainer.run.warmupRatio));
  // --random-target-weights runs the target without a checkpoint to name.
  const std::string targetName = options.randomTargetWeights
                                     ? std::string("random weights")
                                     : options.target;
  if (run.inputs.targetProgram && !run.layout.targetGpus.empty())
    note("online target: " + targetName + ", " +
         std::to_string(run.targetProgramWeights.size()) +
         " tensors, on device" +
         (run.layout.targetGpus.size() > 1 ? "s " : " ") +
         gpuListText(run.layout.targetGpus) +
         "; it computes each step's features while the step before runs and "
         "copies them to the drafter GPUs");
  else if (run.inputs.targetProgram)
    note("online target: " + targetName + ", " +
         std::to_string(run.targetProgramWeights.size()) +
         " tensors; its features are computed on the GPU before every step");
  else if (target)
    note("the rows carry their own features: the compiled online target "
         "is not used");
  if (run.evalRows && options.evalOnly)
    note("held-out data: " + options.evalData + ", " +
         std::to_string(run.evalRows->numRows()) +
         " rows, evaluated once (--eval-only: nothing is trained or saved)");
  else if (run.evalRows)
    note("held-out data: " + options.evalData + ", " +
         std::to_string(run.evalRows->numRows()) + " rows, evaluated " +
         (options.evalEvery > 0
              ? "every " + std::to_string(options.evalEvery) + " steps and "
              : std::string()) +
         "after the last step; the best drafter by eval tau goes to " +
         options.out + "/" + kBestDir);

  StopSignalHandlers signals;
  DeviceWorkScope deviceWork;
  // Each GPU's thread builds its own step program.
  auto evalFactory = programs.eval;
  TrainerGroup group([factory] { return factory(); }, run.trainer, run.layout,
                     [evalFactory]() -> std::unique_ptr<StepProgram> {
                       return evalFactory ? evalFactory() : nullptr;
                     });
  if (Status s = group.init(run.inputs); !s.ok())
    return failRun(s.message());
  // Every device holds its copy now; a real target's weights and the
  // optimizer state can be gigabytes of host memory. (The synthetic problem
  // keeps its own: it generates rows from them.)
  run.inputs.params.clear();
  run.inputs.params.shrink_to_fit();
  run.targetProgramWeights.clear();
  run.targetProgramWeights.shrink_to_fit();
  run.inputs.resume.reset();
  run.loadedTarget = TargetWeights();
  for (int local = 0; local < group.localRanks(); ++local) {
    const DeviceContext &device = group.device(local);
    const DeviceMemory &memory = group.trainer(local).memoryAfterAllocation();
    const size_t evalBytes = group.trainer(local).evalBytes();
    note("device " + std::to_string(device.device()) + " (" + device.name() +
         "): step buffers " + formatBytes(device.bufferBytes()) + ", arena " +
         formatBytes(device.arenaBytes()) + ", GEMM workspace " +
         formatBytes(device.workspaceBytes()) +
         (evalBytes ? ", evaluation arena " + formatBytes(evalBytes)
                    : std::string()) +
         "; " + formatBytes(memory.usedBytes()) + " of " +
         formatBytes(memory.totalBytes) + " in use");
  }

  for (int k = 0; k < group.targetServers(); ++k) {
    const TargetServer &server = group.targetServer(k);
    note("target device " + std::to_string(server.device()) + " (" +
         server.deviceName() + "): serves " + std::to_string(server.clients()) +
         " drafter GPU" + (server.clients() > 1 ? "s" : "") + "; " +
         formatBytes(server.memoryInUse().usedBytes()) + " of " +
         formatBytes(server.memoryInUse().totalBytes) + " in use");
  }

  ProgressDisplay progress(stderr, ::isatty(STDERR_FILENO) != 0,
                           options.progressEvery);
  TrainerHooks hooks;
  hooks.onStep = [&](const StepMetrics &metrics) {
    if (!leader)
      return Status::success();
    progress.update(metrics, run.trainer.finalStep);
    return log.append(metrics);
  };
  hooks.onEval = [&](const EvalMetrics &metrics) {
    if (!leader)
      return Status::success();
    progress.note("train: " + evalLine(metrics));
    return log.append(metrics);
  };
  hooks.onNote = [&](const std::string &message) {
    if (leader)
      progress.note("train: " + message);
  };
  hooks.stopSignal = &stopSignal;
  auto started = std::chrono::steady_clock::now();
  TrainerOutcome outcome;
  Status status = group.run(hooks, outcome);
  progress.finish();
  // The rows this process's GPUs skipped, on every way out of the run:
  // each named once, however many ranks met it; those a resumed state knew
  // were skipped unread and are only counted.
  std::map<int64_t, std::string> skipped;
  for (int local = 0; local < group.localRanks(); ++local)
    for (const SkippedRow &row : group.trainer(local).skippedRows())
      skipped.emplace(row.row, row.what);
  const size_t restored =
      group.localRanks() > 0 ? group.trainer(0).restoredBadRows().size() : 0;
  if (!skipped.empty()) {
    std::string list;
    for (const auto &[row, what] : skipped)
      list += "\n  " + what;
    std::fprintf(stderr,
                 "train: skipped %zu row%s with non-finite features (each "
                 "trained as an empty row):%s\n",
                 skipped.size(), skipped.size() == 1 ? "" : "s", list.c_str());
  }
  if (restored > 0 && leader)
    std::fprintf(stderr,
                 "train: %zu row%s the resumed checkpoint knew as bad %s "
                 "skipped unread (named by the run that met them)\n",
                 restored, restored == 1 ? "" : "s",
                 restored == 1 ? "is" : "are");
  if (!status.ok())
    return failRun(status.message());
  if (outcome.stoppedBySignal) {
    if (leader) {
      std::string saved =
          outcome.lastCheckpoint.empty()
              ? std::string("no checkpoint was saved")
              : "the last checkpoint is " + outcome.lastCheckpoint +
                    " (continue with --resume " + options.out + ")";
      fail("stopped by " + std::string(signalName(outcome.stoppedBySignal)) +
           " after step " + std::to_string(outcome.stepsDone) + "; " + saved);
    }
    return 128 + outcome.stoppedBySignal;
  }
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
          .count();
  size_t usedAfterFirstStep = 0;
  for (int local = 0; local < group.localRanks(); ++local)
    usedAfterFirstStep =
        std::max(usedAfterFirstStep,
                 group.trainer(local).memoryAfterFirstStep().usedBytes());
  if (group.localRanks() > 0) {
    const kernels::GemmTimingSummary &gemms =
        group.device(0).gemmTimingSummary();
    if (gemms.timed + gemms.agreed > 0)
      note("GEMM algorithms: " + std::to_string(gemms.faster) + " of " +
           std::to_string(gemms.timed + gemms.agreed) +
           " large shapes run faster than cuBLASLt's first choice (timed in " +
           formatDuration(gemms.seconds) +
           " at the first step; --no-gemm-timing keeps its first choice)" +
           (gemms.untimed > 0
                ? "; " + std::to_string(gemms.untimed) +
                      " kept it untimed: the free device memory did not "
                      "hold their scratch operands"
                : std::string()));
  }
  if (options.evalOnly) {
    note("done: evaluated in " + formatDuration(seconds));
    return 0;
  }
  note("done: " + std::to_string(outcome.stepsThisRun) + " steps in " +
       formatDuration(seconds) + "; " + formatBytes(usedAfterFirstStep) +
       " in use on the " + (group.localRanks() > 1 ? "fullest " : "") +
       "device after the first step; " +
       (outcome.finalExport.empty() ? std::string("nothing saved (--no-save)")
                                    : "drafter in " + outcome.finalExport));
  return 0;
}

} // namespace

int dflash::rt::trainMain(int argc, char **argv,
                          std::unique_ptr<StepProgram> (*step)()) {
  GeneratedPrograms programs;
  programs.step = step;
  return trainMain(argc, argv, programs);
}

int dflash::rt::trainMain(int argc, char **argv, GeneratedPrograms programs) {
  try {
    return runTraining(argc, argv, programs);
  } catch (const std::exception &error) {
    // Allocation failures of huge host buffers, mostly.
    return fail(error.what());
  }
}
