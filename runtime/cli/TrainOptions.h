//===- TrainOptions.h - The command line of train, checked ------*- C++ -*-===//
//
// Host code (no CUDA): train's options parsed and checked before any data
// is loaded or any GPU touched, so that every mistake is reported on any
// machine.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_CLI_TRAINOPTIONS_H
#define DFLASH_RUNTIME_CLI_TRAINOPTIONS_H

#include "runtime/io/DirectoryLock.h"
#include "schema/ModelConfig.h"
#include "schema/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::rt {

/// The options of `train`, as given or defaulted.
struct TrainOptions {
  std::string target; ///< --target: the target's HF directory
  std::string data;   ///< --data: "synthetic" or shards
  std::string out = "./dflash-out";
  std::string resume;    ///< --resume: checkpoint or output directory
  std::string init;      ///< --init: exported drafter checkpoint
  std::string log;       ///< --log; empty: <out>/metrics.jsonl
  std::string evalData;  ///< --eval-data: held-out shards, "synthetic"
  int64_t evalEvery = 0; ///< --eval-every; 0: after the last step only
  int64_t evalRows = 64; ///< --eval-rows of --eval-data synthetic
  /// --eval-serving-rows: held-out rows walked in serving order; -1: not
  /// given (defaultServingRows of the spec's seq_len); 0: none.
  int64_t evalServingRows = -1;
  int64_t steps = 0;      ///< --steps: stop after this many in total
  int64_t totalSteps = 0; ///< --total-steps; 0: not given
  int64_t saveEvery = 0;  ///< --save-every; 0: only at the end
  int64_t rows = 256;     ///< --rows of synthetic data
  /// --accumulate: micro-batches per optimizer step; 0: not given (the
  /// compiled gradient_accumulation, the only one its static shapes run).
  int64_t accumulate = 0;
  int64_t progressEvery = 10; ///< --progress-every (plain output)
  /// --max-bad-rows: rows with non-finite features each GPU may skip.
  int64_t maxBadRows = 8;
  double lr = 0;          ///< --lr; default the config's
  double warmupRatio = 0; ///< --warmup-ratio; default the config's
  uint64_t seed = 0;      ///< --seed; default the config's
  std::vector<int> gpus;  ///< --gpus; empty: every visible device
  /// --target-gpus: the online target's own devices; empty: each drafter
  /// GPU runs it.
  std::vector<int> targetGpus;
  bool noGraph = false;      ///< --no-graph
  bool noGemmTiming = false; ///< --no-gemm-timing
  /// --random-target-weights: timing runs of an online target too large
  /// for a checkpoint at hand
  bool randomTargetWeights = false;
  bool nccl = false; ///< --nccl: collectives even on one GPU
  /// --eval-only: evaluate the initial weights on --eval-data and stop,
  /// training, saving and exporting nothing.
  bool evalOnly = false;
  /// --no-save: timing runs write no checkpoint and no export.
  bool noSave = false;

  /// Options whose value on resume comes from the checkpoint unless given.
  bool givenTotalSteps = false, givenLr = false, givenWarmupRatio = false,
       givenSeed = false, givenRows = false, givenEvalEvery = false,
       givenEvalRows = false, givenSteps = false, givenEvalServingRows = false;
};

enum class CommandLineAction { Train, ShowHelp, Fail };

/// Parses `train`'s arguments with defaults from `config`. ShowHelp puts the
/// help text into `text`; Fail puts the error (without "train: error: ").
CommandLineAction parseTrainCommandLine(int argc, const char *const *argv,
                                        const ModelConfig &config,
                                        TrainOptions &options,
                                        std::string &text);

/// Checks what needs no data loaded: numbers in range, paths that exist,
/// an output directory that can be written (created when missing) and does
/// not hold another run unless it is resumed, a GPU list without repeats
/// and the collectives it needs in this build.
Status validateTrainOptions(const TrainOptions &options,
                            const ModelConfig &config);

/// Takes `lock` on options.out (TrainMain holds it for the whole run) after
/// checking that a --resume source's output directory is not held by
/// another live run. Messages name the other process.
Status lockOutputDirectory(const TrainOptions &options, DirectoryLock &lock);

/// Fills an empty --gpus with every device of `visibleDevices` that is not
/// a --target-gpus one (or device 0 when there is none, so that the host
/// checks run and the missing device is reported after them); checks that
/// several GPUs can be used and that each target device has a drafter.
Status resolveGpus(TrainOptions &options, int visibleDevices);

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_CLI_TRAINOPTIONS_H
