//===- TrainOptions.cpp - The command line of train, checked --------------===//

#include "runtime/cli/TrainOptions.h"

#include "runtime/train/RunLayout.h"
#include "runtime/train/TrainerSetup.h"

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
static bool parseGpuList(const char *option, const std::string &text,
                         std::vector<int> &gpus, std::string &error) {
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
      error = std::string(option) + " '" + text + "': '" + item +
              "' is not a device index";
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
                   std::to_string(config.rowsPerStep()) + " rows of " +
                   std::to_string(config.seqLen) + " tokens per GPU" +
                   (config.gradientAccumulation > 1
                        ? " (" + std::to_string(config.gradientAccumulation) +
                              " micro-batches of " +
                              std::to_string(config.rowsPerGpu) + ")"
                        : std::string()) +
                   ", " + std::to_string(config.anchorsPerRow) + " blocks of " +
                   std::to_string(config.blockSize) + " draft tokens per row.",
               "train");
  app.get_formatter()->column_width(34);
  app.add_option("--target", options.target,
                 "Hugging Face directory of the target model, for its frozen "
                 "embedding and lm_head, and, in a trainer compiled with "
                 "dflashc --target, the weights of the online target that "
                 "computes the features of token shards (default with "
                 "--data synthetic: the synthetic target)")
      ->type_name("DIR");
  app.add_option("--data", options.data,
                 "'synthetic' (a learnable synthetic problem, for smoke runs "
                 "and benchmarks), or a directory or file of feature shards "
                 "(token shards where the trainer has an online target)")
      ->type_name("synthetic|DIR")
      ->required();
  CLI::Option *steps = app.add_option(
      "--steps", options.steps,
      "Stop once this many optimizer steps are done in total (a resumed run "
      "counts the steps of its checkpoint)");
  steps->type_name("N");
  if (config.totalSteps > 0)
    steps->capture_default_str();
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
  CLI::Option *evalData = app.add_option(
      "--eval-data", options.evalData,
      "Held-out feature shards to evaluate on (the forward alone: eval loss, "
      "acc and tau in the log), or 'synthetic' (--eval-rows rows of the "
      "synthetic problem that training never reads); the best drafter by "
      "eval tau is kept as <out>/best");
  evalData->type_name("DIR|synthetic");
  CLI::Option *evalEvery = app.add_option(
      "--eval-every", options.evalEvery,
      "Evaluate every K steps, and after the last step (0: only then)");
  evalEvery->type_name("K")->capture_default_str();
  CLI::Option *evalRows = app.add_option("--eval-rows", options.evalRows,
                                         "Rows of --eval-data synthetic");
  evalRows->type_name("R")->capture_default_str();
  CLI::Option *evalServingRows = app.add_option(
      "--eval-serving-rows", options.evalServingRows,
      "Also walk the first K held-out rows in serving order, drafting from "
      "wherever the last block's accepted tokens end: eval_serving_tau, the "
      "acceptance a server would measure (about seq_len / anchors_per_row "
      "evaluation passes per batch of rows; default: the rows of 131072 "
      "tokens; 0: none)");
  evalServingRows->type_name("K");
  app.add_option("--out", options.out,
                 "Output directory: checkpoint-<step>/, latest, final/, "
                 "best/ (with --eval-data), metrics.jsonl")
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
  app.add_option("--accumulate", options.accumulate,
                 "Micro-batches of rows_per_gpu rows whose gradients add up "
                 "before each optimizer step (gradient accumulation). Shapes "
                 "are static: it must be the spec's [training] "
                 "gradient_accumulation, which this trainer was compiled "
                 "with (" +
                     std::to_string(config.gradientAccumulation) + ")")
      ->type_name("K");
  CLI::Option *rows = app.add_option(
      "--rows", options.rows,
      "Rows of the synthetic data set (only with --data synthetic)");
  rows->type_name("R")->capture_default_str();
  std::string gpuText;
  CLI::Option *gpus = app.add_option(
      "--gpus,--drafter-gpus", gpuText,
      "CUDA devices to train on, comma-separated, one data-parallel rank "
      "each (default: every visible device, less the --target-gpus); under "
      "mpirun, the devices of each node");
  gpus->type_name("LIST");
  std::string targetGpuText;
  CLI::Option *targetGpus = app.add_option(
      "--target-gpus", targetGpuText,
      "With an online target (token shards): CUDA devices that run the "
      "target and send its features to the drafter GPUs, which then hold no "
      "copy of it; drafter rank r gets them from target device r % count. "
      "Default: each drafter GPU runs the target before its step. A device "
      "may be in both lists");
  targetGpus->type_name("LIST");
  app.add_flag("--nccl", options.nccl,
               "Sum over the GPUs with NCCL even when there is one (checks "
               "the data-parallel path; with several GPUs it is always on)");
  app.add_option("--max-bad-rows", options.maxBadRows,
                 "Rows with non-finite features each GPU skips (each becomes "
                 "an empty row, counted and named) before the run stops at "
                 "the next one")
      ->type_name("N")
      ->capture_default_str();
  app.add_option("--progress-every", options.progressEvery,
                 "When stderr is not a terminal, print progress every N "
                 "steps")
      ->type_name("N")
      ->capture_default_str();
  app.add_flag("--eval-only", options.evalOnly,
               "Evaluate the drafter (--init's, --resume's or the initial "
               "weights) on --eval-data once and exit: no step, checkpoint or "
               "export; the figures go to the log and the progress output. "
               "--data still says whether rows carry features or the online "
               "target computes them");
  app.add_flag("--no-save", options.noSave,
               "Timing only: save no checkpoint and export no drafter (the "
               "log is still written; a stopped run keeps nothing), for "
               "benchmarks of drafters whose checkpoints would take minutes "
               "and tens of GB to write");
  app.add_flag("--no-graph", options.noGraph,
               "Run the step eagerly every time instead of replaying a "
               "captured CUDA graph (debugging)");
  app.add_flag("--no-gemm-timing", options.noGemmTiming,
               "Run every GEMM with cuBLASLt's first heuristic choice instead "
               "of timing its candidates at the first step and keeping the "
               "fastest (a run then repeats another run of this flag bit for "
               "bit where the step itself is deterministic)");
  app.add_flag("--random-target-weights", options.randomTargetWeights,
               "Timing only: the online target's weights, and the embedding "
               "and lm_head, are random instead of read from --target (which "
               "is then not needed), so the features, the losses and the "
               "checkpoints mean nothing; for a target's step time and memory "
               "without its checkpoint");
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
  if (gpus->count() > 0 && !parseGpuList("--gpus", gpuText, options.gpus, text))
    return CommandLineAction::Fail;
  if (targetGpus->count() > 0 &&
      !parseGpuList("--target-gpus", targetGpuText, options.targetGpus, text))
    return CommandLineAction::Fail;
  options.givenSteps = steps->count() > 0;
  if (!options.givenSteps && config.totalSteps <= 0 && !options.evalOnly) {
    text = "--steps is required: the spec sets no total_steps";
    return CommandLineAction::Fail;
  }
  options.givenTotalSteps = totalSteps->count() > 0;
  options.givenLr = lr->count() > 0;
  options.givenWarmupRatio = warmup->count() > 0;
  options.givenSeed = seed->count() > 0;
  options.givenRows = rows->count() > 0;
  options.givenEvalEvery = evalEvery->count() > 0;
  options.givenEvalRows = evalRows->count() > 0;
  options.givenEvalServingRows = evalServingRows->count() > 0;
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
  if (o.evalOnly) {
    if (o.evalData.empty())
      return Status::error(
          "--eval-only needs --eval-data: the held-out rows to evaluate on");
    if (o.givenSteps)
      return Status::error("--eval-only trains nothing: leave --steps out");
    if (o.saveEvery != 0 || o.givenEvalEvery)
      return Status::error("--eval-only evaluates once and saves nothing: "
                           "leave --save-every and --eval-every out");
  } else if (o.steps < 1) {
    return Status::error("--steps must be at least 1 (got " +
                         std::to_string(o.steps) + ")");
  }
  if (o.noSave) {
    if (o.evalOnly)
      return Status::error("--eval-only saves nothing anyway: leave --no-save "
                           "out");
    if (o.saveEvery != 0)
      return Status::error("--no-save writes no checkpoint: leave "
                           "--save-every out");
    if (!o.evalData.empty())
      return Status::error("--no-save exports no best drafter: leave "
                           "--eval-data out");
  }
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
  if (o.accumulate != 0 && o.accumulate != config.gradientAccumulation)
    return Status::error(
        "--accumulate " + std::to_string(o.accumulate) +
        ": this trainer was compiled for " +
        std::to_string(config.gradientAccumulation) + " micro-batch" +
        (config.gradientAccumulation == 1 ? "" : "es") + " of " +
        std::to_string(config.rowsPerGpu) +
        " rows per optimizer step, and its shapes are static; set "
        "[training] gradient_accumulation = " +
        std::to_string(o.accumulate) + " in the spec and compile it again");
  if (o.evalEvery < 0)
    return Status::error("--eval-every must not be negative (got " +
                         std::to_string(o.evalEvery) + ")");
  if (o.evalRows < 1)
    return Status::error("--eval-rows must be at least 1 (got " +
                         std::to_string(o.evalRows) + ")");
  if (o.givenEvalServingRows && o.evalServingRows < 0)
    return Status::error("--eval-serving-rows must not be negative (got " +
                         std::to_string(o.evalServingRows) + ")");
  if (o.evalData.empty() && o.givenEvalServingRows)
    return Status::error("--eval-serving-rows needs --eval-data: the "
                         "held-out rows to walk");
  if (o.evalData.empty() && o.givenEvalEvery)
    return Status::error("--eval-every needs --eval-data: the held-out rows "
                         "to evaluate on");
  if (o.givenEvalRows && o.evalData != "synthetic")
    return Status::error("--eval-rows applies only to --eval-data synthetic");
  if (!o.evalData.empty() && o.evalData != "synthetic") {
    std::error_code ec;
    if (!fs::exists(o.evalData, ec))
      return Status::error("--eval-data " + o.evalData +
                           ": no such file or directory");
    if (o.data == "synthetic")
      return Status::error("--eval-data " + o.evalData +
                           " holds feature shards but --data is synthetic: "
                           "evaluate a synthetic run with --eval-data "
                           "synthetic");
  }
  if (o.evalData == "synthetic" && o.data != "synthetic")
    return Status::error("--eval-data synthetic evaluates the synthetic "
                         "problem, but --data " +
                         o.data + " is feature shards: give held-out shards");
  if (o.randomTargetWeights && o.data == "synthetic")
    return Status::error("--random-target-weights stands in for an online "
                         "target's weights, which need token shards in "
                         "--data; the synthetic problem has its own target");
  if (o.randomTargetWeights && !o.target.empty())
    return Status::error("--random-target-weights reads no weights: leave "
                         "out --target " +
                         o.target);
  if (o.progressEvery < 1)
    return Status::error("--progress-every must be at least 1");
  if (o.maxBadRows < 0)
    return Status::error("--max-bad-rows must be at least 0");
  if (!std::isfinite(o.lr) || o.lr <= 0)
    return Status::error("--lr must be a positive number");
  if (!std::isfinite(o.warmupRatio) || o.warmupRatio < 0 || o.warmupRatio >= 1)
    return Status::error("--warmup-ratio must be in [0, 1)");
  for (size_t i = 0; i < o.gpus.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (o.gpus[i] == o.gpus[j])
        return Status::error("--gpus: device " + std::to_string(o.gpus[i]) +
                             " is listed twice (each GPU is one rank)");
  for (size_t i = 0; i < o.targetGpus.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (o.targetGpus[i] == o.targetGpus[j])
        return Status::error("--target-gpus: device " +
                             std::to_string(o.targetGpus[i]) +
                             " is listed twice");
  if (!o.targetGpus.empty()) {
    if (o.data == "synthetic")
      return Status::error("--target-gpus runs the online target, which "
                           "needs token shards in --data; the synthetic "
                           "problem carries its features");
    if (o.target.empty() && !o.randomTargetWeights)
      return Status::error("--target-gpus needs --target DIR, the online "
                           "target's Hugging Face directory");
    if (!o.gpus.empty() && o.targetGpus.size() > o.gpus.size())
      return Status::error(
          "--target-gpus lists " + std::to_string(o.targetGpus.size()) +
          " devices for " + std::to_string(o.gpus.size()) +
          " drafter GPUs (--gpus); each target device serves at least one");
  }
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
    if (o.target.empty() && !o.randomTargetWeights)
      return Status::error("--data " + o.data +
                           " needs --target DIR for the frozen embedding and "
                           "lm_head (and, for token shards, the online "
                           "target's weights)");
    if (o.givenRows)
      return Status::error("--rows applies only to --data synthetic");
  }
  if (!o.target.empty())
    DFLASH_RETURN_IF_ERROR(checkDirectory("--target", o.target));
  if (!o.init.empty() && !o.resume.empty())
    return Status::error("--init and --resume exclude each other: a resumed "
                         "run continues from its checkpoint's weights");
  if (!o.init.empty())
    DFLASH_RETURN_IF_ERROR(checkDirectory("--init", o.init));
  if (!o.resume.empty())
    DFLASH_RETURN_IF_ERROR(checkDirectory("--resume", o.resume));

  if (o.out.empty())
    return Status::error("--out is empty");
  DFLASH_RETURN_IF_ERROR(checkWritableDirectory("--out", o.out));
  std::error_code ec;
  // An evaluation writes only its log line: it may look at a finished run.
  if (o.resume.empty() && !o.evalOnly &&
      fs::exists(o.out + "/" + kLatestFile, ec)) {
    // A live run there is named first: resuming it would be refused too.
    DFLASH_RETURN_IF_ERROR(DirectoryLock::checkFree(o.out));
    return Status::error("--out " + o.out + " already holds a run (" + o.out +
                         "/" + kLatestFile + "); continue it with --resume " +
                         o.out + " or choose another --out");
  }
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
  // The target's own devices are not drafters unless the user says so.
  for (int d = 0; d < visibleDevices; ++d)
    if (std::find(o.targetGpus.begin(), o.targetGpus.end(), d) ==
        o.targetGpus.end())
      o.gpus.push_back(d);
  if (o.gpus.empty() && !o.targetGpus.empty() && visibleDevices > 0)
    return Status::error(
        "--target-gpus takes every visible device (" +
        std::to_string(visibleDevices) +
        "), so none is left for the drafter: give --gpus (a device may be "
        "in both lists)");
  if (o.gpus.empty())
    o.gpus.push_back(0);
  if (o.targetGpus.size() > o.gpus.size())
    return Status::error("--target-gpus lists " +
                         std::to_string(o.targetGpus.size()) +
                         " devices but only " + std::to_string(o.gpus.size()) +
                         " are left for the drafter; each target device "
                         "serves at least one");
  if (o.gpus.size() > 1 && !collectivesAvailable())
    return Status::error(std::to_string(o.gpus.size()) +
                         " GPUs are visible but this trainer was built "
                         "without NCCL; train on one with --gpus 0");
  return Status::success();
}

Status dflash::rt::lockOutputDirectory(const TrainOptions &o,
                                       DirectoryLock &lock) {
  std::error_code ec;
  if (!o.resume.empty()) {
    // The resumed checkpoint's output directory (the checkpoint's parent,
    // or the directory itself when it is given), unless it is ours.
    std::string checkpoint;
    DFLASH_RETURN_IF_ERROR(resolveCheckpoint(o.resume, checkpoint));
    for (const fs::path &dir :
         {fs::path(o.resume), fs::path(checkpoint).parent_path()}) {
      if (dir.empty() || !fs::is_directory(dir, ec))
        continue;
      if (fs::equivalent(dir, o.out, ec))
        continue;
      if (Status s = DirectoryLock::checkFree(dir.string()); !s.ok())
        return Status::error("--resume: " + s.message());
    }
  }
  return DirectoryLock::acquire(o.out, lock);
}
