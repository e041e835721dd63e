//===- TrainMain.cpp - The command line of the `train` binary -------------===//

#include "runtime/TrainMain.h"
#include "schema/Parameters.h"
#include "runtime/InitialParameters.h"

#include "runtime/Collectives.h"
#include "runtime/DeviceContext.h"
#include "runtime/FeatureShard.h"
#include "runtime/Progress.h"

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
#include <mutex>
#include <unistd.h>

using namespace dflash;
using namespace dflash::rt;
namespace fs = std::filesystem;

//===----------------------------------------------------------------------===//
// Command line
//===----------------------------------------------------------------------===//

/// CLI11's messages start with a capital letter; ours do not.
static std::string lowerFirst(std::string text) {
  if (!text.empty())
    text[0] = char(std::tolower((unsigned char)text[0]));
  return text;
}

/// "0,1" -> {0, 1}.
static bool parseGpuList(const std::string &text, std::vector<int> &gpus,
                         std::string &error) {
  gpus.clear();
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(
        start, comma == std::string::npos ? std::string::npos : comma - start);
    char *end = nullptr;
    errno = 0;
    long value = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || value < 0 ||
        value > 4096) {
      error = "--gpus '" + text + "': '" + item + "' is not a device index";
      return false;
    }
    gpus.push_back(int(value));
    if (comma == std::string::npos)
      break;
    start = comma + 1;
  }
  return true;
}

CommandLineAction dflash::rt::parseTrainCommandLine(int argc,
                                                    const char *const *argv,
                                                    const ModelConfig &config,
                                                    TrainOptions &options,
                                                    std::string &text) {
  options = TrainOptions();
  options.lr = config.lr;
  options.warmupRatio = config.warmupRatio;
  options.seed = uint64_t(config.seed);
  if (config.totalSteps > 0)
    options.steps = config.totalSteps;

  CLI::App app("Trains the '" + config.name +
                   "' DFlash drafter, compiled by dflashc: " +
                   std::to_string(config.rowsPerGpu) + " rows of " +
                   std::to_string(config.seqLen) + " tokens per GPU, " +
                   std::to_string(config.anchorsPerRow) + " blocks of " +
                   std::to_string(config.blockSize) + " draft tokens per row.",
               "train");
  app.get_formatter()->column_width(34);
  app.add_option("--target", options.target,
                 "Hugging Face directory of the target model, for its frozen "
                 "embedding and lm_head (default with --data synthetic: the "
                 "synthetic target)")
      ->type_name("DIR");
  app.add_option("--data", options.data,
                 "'synthetic' (a learnable synthetic problem, for smoke runs "
                 "and benchmarks), or a directory or file of feature shards")
      ->type_name("synthetic|DIR")
      ->required();
  CLI::Option *steps = app.add_option(
      "--steps", options.steps,
      "Stop once this many optimizer steps are done in total (a resumed run "
      "counts the steps of its checkpoint)");
  steps->type_name("N");
  if (config.totalSteps > 0)
    steps->capture_default_str();
  else
    steps->required();
  CLI::Option *totalSteps = app.add_option(
      "--total-steps", options.totalSteps,
      "Length of the learning-rate schedule (default: --steps; on resume: the "
      "checkpoint's)");
  totalSteps->type_name("N");
  CLI::Option *lr = app.add_option(
      "--lr", options.lr,
      "Peak learning rate (default: the spec's; on resume: the checkpoint's)");
  lr->type_name("X")->capture_default_str();
  CLI::Option *warmup = app.add_option(
      "--warmup-ratio", options.warmupRatio,
      "Fraction of the schedule spent warming up linearly (default: the "
      "spec's; on resume: the checkpoint's)");
  warmup->type_name("X")->capture_default_str();
  app.add_option("--save-every", options.saveEvery,
                 "Save a resumable checkpoint every K steps (0: only after "
                 "the last step)")
      ->type_name("K")
      ->capture_default_str();
  app.add_option("--out", options.out,
                 "Output directory: checkpoint-<step>/, latest, final/, "
                 "metrics.jsonl")
      ->type_name("DIR")
      ->capture_default_str();
  app.add_option("--resume", options.resume,
                 "Continue a run from a training checkpoint, or from the "
                 "newest one of an output directory (its 'latest' file)")
      ->type_name("DIR");
  app.add_option("--init", options.init,
                 "Initial drafter weights: an exported checkpoint (default: "
                 "the synthetic problem's, else N(0, 0.02) from --seed)")
      ->type_name("DIR");
  CLI::Option *seed = app.add_option(
      "--seed", options.seed,
      "Seed of the data order, anchors, synthetic data and initial weights "
      "(default: the spec's; on resume: the checkpoint's)");
  seed->type_name("S")->capture_default_str();
  app.add_option("--log", options.log,
                 "Metrics file, one JSON line per step (default: "
                 "<out>/metrics.jsonl)")
      ->type_name("FILE");
  CLI::Option *rows = app.add_option(
      "--rows", options.rows,
      "Rows of the synthetic data set (only with --data synthetic)");
  rows->type_name("R")->capture_default_str();
  std::string gpuText;
  CLI::Option *gpus = app.add_option(
      "--gpus", gpuText,
      "CUDA devices to train on, comma-separated, one data-parallel rank "
      "each (default: every visible device); under mpirun, the devices of "
      "each node");
  gpus->type_name("LIST");
  app.add_flag("--nccl", options.nccl,
               "Sum over the GPUs with NCCL even when there is one (checks "
               "the data-parallel path; with several GPUs it is always on)");
  app.add_option("--progress-every", options.progressEvery,
                 "When stderr is not a terminal, print progress every N "
                 "steps")
      ->type_name("N")
      ->capture_default_str();
  app.add_flag("--no-graph", options.noGraph,
               "Run the step eagerly every time instead of replaying a "
               "captured CUDA graph (debugging)");
  app.footer(
      "The first SIGINT or SIGTERM finishes the current step, saves a "
      "checkpoint and exits with 128 + the signal; a second one quits at "
      "once. A step whose loss or gradient norm is not finite stops the run "
      "without saving.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp &) {
    text = app.help();
    return CommandLineAction::ShowHelp;
  } catch (const CLI::CallForAllHelp &) {
    text = app.help("", CLI::AppFormatMode::All);
    return CommandLineAction::ShowHelp;
  } catch (const CLI::ParseError &error) {
    text = lowerFirst(error.what());
    return CommandLineAction::Fail;
  }
  if (gpus->count() > 0 && !parseGpuList(gpuText, options.gpus, text))
    return CommandLineAction::Fail;
  options.givenTotalSteps = totalSteps->count() > 0;
  options.givenLr = lr->count() > 0;
  options.givenWarmupRatio = warmup->count() > 0;
  options.givenSeed = seed->count() > 0;
  options.givenRows = rows->count() > 0;
  return CommandLineAction::Train;
}

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

/// Creates `dir` when missing and checks that a file can be created in it.
static Status checkWritableDirectory(const std::string &option,
                                     const std::string &dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    return Status::error(option + " " + dir +
                         ": exists and is not a directory");
  fs::create_directories(dir, ec);
  if (ec)
    return Status::error(option + " " + dir +
                         ": cannot create the directory: " + ec.message());
  std::string probe = dir + "/.dflash-write-test-" + std::to_string(::getpid());
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    return Status::error(option + " " + dir +
                         ": cannot write there: " + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::success();
}

static Status checkDirectory(const std::string &option,
                             const std::string &dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec))
    return Status::error(option + " " + dir + ": no such directory");
  if (!fs::is_directory(dir, ec))
    return Status::error(option + " " + dir + ": not a directory");
  return Status::success();
}

Status dflash::rt::validateTrainOptions(const TrainOptions &o,
                                        const ModelConfig &config) {
  if (o.steps < 1)
    return Status::error("--steps must be at least 1 (got " +
                         std::to_string(o.steps) + ")");
  if (o.givenTotalSteps && o.totalSteps < 1)
    return Status::error("--total-steps must be at least 1 (got " +
                         std::to_string(o.totalSteps) + ")");
  if (o.givenTotalSteps && o.resume.empty() && o.totalSteps < o.steps)
    return Status::error("--total-steps (" + std::to_string(o.totalSteps) +
                         ") is smaller than --steps (" +
                         std::to_string(o.steps) + ")");
  if (o.saveEvery < 0)
    return Status::error("--save-every must not be negative (got " +
                         std::to_string(o.saveEvery) + ")");
  if (o.rows < 1)
    return Status::error("--rows must be at least 1 (got " +
                         std::to_string(o.rows) + ")");
  if (o.progressEvery < 1)
    return Status::error("--progress-every must be at least 1");
  if (!std::isfinite(o.lr) || o.lr <= 0)
    return Status::error("--lr must be a positive number");
  if (!std::isfinite(o.warmupRatio) || o.warmupRatio < 0 || o.warmupRatio >= 1)
    return Status::error("--warmup-ratio must be in [0, 1)");
  for (size_t i = 0; i < o.gpus.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (o.gpus[i] == o.gpus[j])
        return Status::error("--gpus: device " + std::to_string(o.gpus[i]) +
                             " is listed twice (each GPU is one rank)");
  if (o.nccl && !collectivesAvailable())
    return Status::error("--nccl: this trainer was built without NCCL");
  if (o.gpus.size() > 1 && !collectivesAvailable())
    return Status::error("--gpus: training on " +
                         std::to_string(o.gpus.size()) +
                         " GPUs needs NCCL, and this trainer was built "
                         "without it; give one device index");

  bool synthetic = o.data == "synthetic";
  if (o.data.empty())
    return Status::error("--data is empty");
  if (!synthetic) {
    std::error_code ec;
    if (!fs::exists(o.data, ec))
      return Status::error("--data " + o.data + ": no such file or directory");
    if (o.target.empty())
      return Status::error("--data " + o.data +
                           " needs --target DIR for the frozen embedding and "
                           "lm_head");
    if (o.givenRows)
      return Status::error("--rows applies only to --data synthetic");
  }
  if (!o.target.empty())
    if (Status s = checkDirectory("--target", o.target); !s.ok())
      return s;
  if (!o.init.empty() && !o.resume.empty())
    return Status::error("--init and --resume exclude each other: a resumed "
                         "run continues from its checkpoint's weights");
  if (!o.init.empty())
    if (Status s = checkDirectory("--init", o.init); !s.ok())
      return s;
  if (!o.resume.empty())
    if (Status s = checkDirectory("--resume", o.resume); !s.ok())
      return s;

  if (o.out.empty())
    return Status::error("--out is empty");
  if (Status s = checkWritableDirectory("--out", o.out); !s.ok())
    return s;
  std::error_code ec;
  if (o.resume.empty() && fs::exists(o.out + "/" + kLatestFile, ec))
    return Status::error("--out " + o.out + " already holds a run (" + o.out +
                         "/" + kLatestFile + "); continue it with --resume " +
                         o.out + " or choose another --out");
  if (!o.log.empty()) {
    fs::path parent = fs::path(o.log).parent_path();
    if (!parent.empty() && !fs::is_directory(parent, ec))
      return Status::error("--log " + o.log + ": directory " + parent.string() +
                           " does not exist");
    if (fs::is_directory(o.log, ec))
      return Status::error("--log " + o.log + ": is a directory");
  }
  return Status::success();
}

Status dflash::rt::resolveGpus(TrainOptions &o, int visibleDevices) {
  if (!o.gpus.empty())
    return Status::success();
  for (int d = 0; d < visibleDevices; ++d)
    o.gpus.push_back(d);
  if (o.gpus.empty())
    o.gpus.push_back(0);
  if (o.gpus.size() > 1 && !collectivesAvailable())
    return Status::error(std::to_string(o.gpus.size()) +
                         " GPUs are visible but this trainer was built "
                         "without NCCL; train on one with --gpus 0");
  return Status::success();
}

//===----------------------------------------------------------------------===//
// Host-side loading
//===----------------------------------------------------------------------===//

/// Settles the run settings of a resumed run against its checkpoint.
static Status settleResumedRun(const TrainOptions &o, const std::string &ckpt,
                               RunSettings &run) {
  RunSettings stored;
  bool found = false;
  if (Status s = readRunSettings(ckpt, stored, found); !s.ok())
    return s;
  std::string file = ckpt + "/" + kRunSettingsFile;
  if (!found) {
    if (!o.givenTotalSteps)
      return Status::error(ckpt + ": has no " + kRunSettingsFile +
                           "; give the schedule length with --total-steps");
    run.totalSteps = o.totalSteps;
    return Status::success();
  }
  if (o.givenTotalSteps && o.totalSteps != stored.totalSteps)
    return Status::error("--total-steps " + std::to_string(o.totalSteps) +
                         " does not match the schedule of " +
                         std::to_string(stored.totalSteps) + " steps in " +
                         file);
  if (o.givenSeed && o.seed != stored.seed)
    return Status::error("--seed " + std::to_string(o.seed) +
                         " does not match the seed " +
                         std::to_string(stored.seed) + " in " + file);
  bool synthetic = o.data == "synthetic";
  if (synthetic != (stored.data == "synthetic"))
    return Status::error("--data " + o.data + " differs from the data '" +
                         stored.data + "' in " + file);
  if (synthetic && o.givenRows && o.rows != stored.syntheticRows)
    return Status::error(
        "--rows " + std::to_string(o.rows) + " does not match the " +
        std::to_string(stored.syntheticRows) + " rows in " + file);
  // Each rank has its own rows and anchor stream: another world size
  // would read other batches than the run being continued.
  if (stored.worldSize != run.worldSize)
    return Status::error(
        "--gpus: " + file + " is a run on " + std::to_string(stored.worldSize) +
        " GPUs but this one has " + std::to_string(run.worldSize) +
        "; resume on the same number of GPUs");
  run.totalSteps = stored.totalSteps;
  run.seed = stored.seed;
  if (synthetic)
    run.syntheticRows = stored.syntheticRows;
  if (!o.givenLr)
    run.lr = stored.lr;
  if (!o.givenWarmupRatio)
    run.warmupRatio = stored.warmupRatio;
  return Status::success();
}

Status dflash::rt::prepareRun(const TrainOptions &o, const ModelConfig &config,
                              PreparedRun &run, int64_t node, int64_t nodes) {
  if (o.gpus.empty())
    return Status::error("--gpus: no device to train on");
  bool synthetic = o.data == "synthetic";
  RunSettings settings;
  settings.totalSteps = o.givenTotalSteps ? o.totalSteps : o.steps;
  settings.seed = o.seed;
  settings.lr = o.lr;
  settings.warmupRatio = o.warmupRatio;
  settings.data = o.data;
  settings.syntheticRows = synthetic ? o.rows : 0;
  settings.worldSize = nodes * int64_t(o.gpus.size());

  // Resumed state first: it settles the seed the data depends on.
  std::vector<std::vector<uint16_t>> params;
  if (!o.resume.empty()) {
    std::string ckpt;
    if (Status s = resolveCheckpoint(o.resume, ckpt); !s.ok())
      return s;
    if (Status s = settleResumedRun(o, ckpt, settings); !s.ok())
      return s;
    TrainingState state;
    if (Status s = loadTrainingState(ckpt, config, state); !s.ok())
      return s;
    if (state.worldSize() != settings.worldSize)
      return Status::error(
          "--gpus: " + ckpt + "/" + kTrainingStateFile +
          " holds the state of " + std::to_string(state.worldSize()) +
          " GPUs but this run has " + std::to_string(settings.worldSize) +
          "; resume on the same number of GPUs");
    if (Status s = loadCheckpoint(ckpt, config, params); !s.ok())
      return s;
    if (state.step >= o.steps)
      return Status::error(ckpt + " is at step " + std::to_string(state.step) +
                           "; --steps " + std::to_string(o.steps) +
                           " leaves nothing to train");
    if (state.step > settings.totalSteps)
      return Status::error(ckpt + " is at step " + std::to_string(state.step) +
                           ", past its schedule of " +
                           std::to_string(settings.totalSteps) + " steps");
    run.resumedFrom = ckpt;
    run.inputs.resume = std::move(state);
  }
  if (o.steps > settings.totalSteps)
    return Status::error("--steps " + std::to_string(o.steps) +
                         " exceeds the schedule length of " +
                         std::to_string(settings.totalSteps) + " steps");

  // Data.
  if (synthetic) {
    run.synthetic = std::make_unique<SyntheticProblem>();
    if (Status s = run.synthetic->init(config, settings.seed); !s.ok())
      return s;
    auto rows = std::make_unique<SyntheticRowSource>(
        *run.synthetic, settings.syntheticRows, /*pinAnchors=*/false);
    // Rows made on the fly cannot keep up with a GPU step at full size;
    // keep them in memory when that costs at most 16 GiB.
    if (rows->materializedBytes() <= (size_t(16) << 30))
      rows->materialize();
    run.rows = std::move(rows);
  } else {
    auto reader = std::make_unique<FeatureShardReader>();
    if (Status s = reader->open(o.data, config); !s.ok())
      return s;
    if (reader->numRows() == 0)
      return Status::error(
          o.data + ": no usable rows (" +
          std::to_string(reader->numDroppedRows()) +
          " dropped for having fewer than 2 consecutive supervised tokens)");
    run.rows = std::move(reader);
  }
  {
    // The loader's own checks, before the GPU is touched.
    BatchLoader probe(*run.rows, config, settings.seed, 0, settings.worldSize);
    if (Status s = probe.validate(); !s.ok())
      return Status::error("--data " + o.data + ": " + s.message());
    if (run.inputs.resume)
      if (Status s =
              probe.seek(run.inputs.resume->data, run.inputs.resume->rngState);
          !s.ok())
        return Status::error(run.resumedFrom + ": " + s.message());
  }

  // Frozen weights.
  if (!o.target.empty()) {
    if (Status s = loadTargetWeights(o.target, config, run.loadedTarget);
        !s.ok())
      return s;
    run.inputs.target = &run.loadedTarget;
  } else if (synthetic) {
    run.inputs.target = &run.synthetic->target();
  } else {
    return Status::error("--data " + o.data +
                         " needs --target DIR for the frozen embedding and "
                         "lm_head");
  }

  // Initial parameters of a fresh run.
  if (o.resume.empty()) {
    if (!o.init.empty()) {
      if (Status s = loadCheckpoint(o.init, config, params); !s.ok())
        return s;
    } else if (synthetic) {
      params = run.synthetic->initialParameters();
    } else {
      params = initialParameters(config, settings.seed);
    }
  }
  run.inputs.params = std::move(params);
  run.inputs.rows = run.rows.get();

  run.trainer.run = settings;
  run.trainer.finalStep = o.steps;
  run.trainer.useGraph = !o.noGraph;
  run.trainer.outDir = o.out;
  run.trainer.saveEvery = o.saveEvery;
  run.trainer.exportFinal = true;
  run.logPath = o.log.empty() ? o.out + "/metrics.jsonl" : o.log;
  run.layout.gpus = o.gpus;
  run.layout.node = node;
  run.layout.nodes = nodes;
  run.layout.forceCollectives = o.nccl;
  return Status::success();
}

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
  if (Status s = processes.allGather(&gpus, sizeof(gpus), counts.data());
      !s.ok())
    return s;
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

int runTraining(int argc, char **argv,
                std::unique_ptr<StepProgram> (*factory)()) {
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
  PreparedRun run;
  if (Status s = prepareRun(options, config, run, node, nodes); !s.ok())
    return failRun(s.message());
  run.layout.processes = processes.get();
  int64_t firstStep = run.inputs.resume ? run.inputs.resume->step : 0;
  MetricsLog log;
  if (leader)
    if (Status s = log.open(run.logPath, firstStep); !s.ok())
      return failRun(s.message());

  // Only now the GPUs.
  if (devices == 0)
    return failRun("no CUDA device is visible" +
                   (reason.empty() ? std::string() : " (" + reason + ")"));
  for (int gpu : options.gpus)
    if (gpu >= devices)
      return failRun("--gpus: device " + std::to_string(gpu) +
                     " does not exist (" + std::to_string(devices) +
                     " visible)");

  const int64_t world = run.layout.worldSize();
  auto note = [&](const std::string &message) {
    if (leader)
      std::fprintf(stderr, "train: %s\n", message.c_str());
  };
  note(config.name + ": " + std::to_string(numParameters(config)) +
       " trainable parameters; " + std::to_string(config.rowsPerGpu) +
       " rows x " + std::to_string(config.seqLen) + " tokens per GPU and step");
  if (world > 1 || options.nccl)
    note("data parallel over " + std::to_string(world) + " GPU" +
         (world > 1 ? "s" : "") +
         (nodes > 1 ? " (" + std::to_string(nodes) + " nodes x " +
                          std::to_string(options.gpus.size()) + ")"
                    : std::string()) +
         " with NCCL: " + std::to_string(world * config.rowsPerGpu) +
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

  StopSignalHandlers signals;
  DeviceWorkScope deviceWork;
  // Each GPU's thread builds its own step program.
  TrainerGroup group([factory] { return factory(); }, run.trainer, run.layout);
  if (Status s = group.init(run.inputs); !s.ok())
    return failRun(s.message());
  // Every device holds its copy now; a real target's weights and the
  // optimizer state can be gigabytes of host memory. (The synthetic problem
  // keeps its own: it generates rows from them.)
  run.inputs.params.clear();
  run.inputs.params.shrink_to_fit();
  run.inputs.resume.reset();
  run.loadedTarget = TargetWeights();
  for (int local = 0; local < group.localRanks(); ++local) {
    const DeviceContext &device = group.device(local);
    const DeviceMemory &memory = group.trainer(local).memoryAfterAllocation();
    note("device " + std::to_string(device.device()) + " (" + device.name() +
         "): step buffers " + formatBytes(device.bufferBytes()) + ", arena " +
         formatBytes(device.arenaBytes()) + ", GEMM workspace " +
         formatBytes(device.workspaceBytes()) + "; " +
         formatBytes(memory.usedBytes()) + " of " +
         formatBytes(memory.totalBytes) + " in use");
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
  hooks.onNote = [&](const std::string &message) {
    if (leader)
      progress.note("train: " + message);
  };
  hooks.stopSignal = &stopSignal;
  auto started = std::chrono::steady_clock::now();
  TrainerOutcome outcome;
  Status status = group.run(hooks, outcome);
  progress.finish();
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
  note("done: " + std::to_string(outcome.stepsThisRun) + " steps in " +
       formatDuration(seconds) + "; " + formatBytes(usedAfterFirstStep) +
       " in use on the " + (group.localRanks() > 1 ? "fullest " : "") +
       "device after the first step; drafter in " + outcome.finalExport);
  return 0;
}

} // namespace

int dflash::rt::trainMain(int argc, char **argv,
                          std::unique_ptr<StepProgram> (*factory)()) {
  try {
    return runTraining(argc, argv, factory);
  } catch (const std::exception &error) {
    // Allocation failures of huge host buffers, mostly.
    return fail(error.what());
  }
}
