//===- Progress.h - Step metrics: JSONL log and live progress ---*- C++ -*-===//
//
// What the trainer reports after each step, in two forms: one JSON line per
// step in a log file (for plots and for comparing against dflash-reference,
// whose lines carry the same step, loss, acc, grad_norm and lr), and one
// human-readable progress line on stderr, rewritten in place on a terminal
// and printed every few steps otherwise.
//
// Throughput, for a step of `t` seconds on `world` GPUs of B rows each:
//   context tokens/s = B * S * world / t   (JSONL "tokens_per_s")
//   draft tokens/s   = B * Q * world / t   (JSONL "draft_tokens_per_s")
// with S the sequence length and Q = N * bs the draft positions of a row:
// the whole run's rate, summed over its GPUs. "tflops" is the compiler's
// FLOP count of one GPU's step over t: the achieved rate of one GPU,
// comparable with its bf16 GEMM ceiling. The count takes each block's anchor
// uniform over its row; "drawn_tflops" counts the block attention at the
// anchors the step drew instead (long rows whose answers follow a long
// prompt see more context than that).
// Each GPU's step time runs from before the step's input copies to the end
// of its last kernel, measured with CUDA events on that GPU. With several
// GPUs, t ("step_ms", likewise "compute_ms") is the slowest rank's: the
// ranks wait for each other in the all-reduces, so the longest time is the
// run's pace. The JSONL line then also lists every rank's own time,
// "rank_step_ms": [rank 0, rank 1, ...] in global rank order, and the
// progress line shows the fastest next to t: a rank whose step started late
// (its thread or its batch was late) shows the shortest time, since the
// others waited for it inside their step. The loss, acc, grad_norm and lr
// are rank 0's, which equal every rank's: the step all-reduces their sums.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_PROGRESS_H
#define DFLASH_RUNTIME_PROGRESS_H

#include "schema/ModelConfig.h"
#include "schema/Status.h"
#include "schema/StepBuffers.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dflash::rt {

/// Tau and the accuracy per bucket of anchor position (docs/semantics.md
/// section 14), from the Bucket* sums of a step or an evaluation: [j] for
/// bucket j, NaN where it had no kept block (no supervised slot for acc);
/// blocks[j] its kept blocks. All empty with one bucket (tau and acc say it
/// all).
struct BucketFigures {
  std::vector<double> tau, acc, blocks;
};

/// What one step reports.
struct StepMetrics {
  int64_t step = 0; ///< 0-based index: the step counter the step ran with
  double loss = 0, acc = 0, gradNorm = 0, lr = 0;
  /// Acceptance length (docs/semantics.md section 10): mean over kept blocks of
  /// 1 + the run of right predictions.
  double tau = 0;
  /// [k - 1]: the accuracy at block position k = 1 .. bs - 1 (NaN where no
  /// slot at k was supervised); empty when not reported.
  std::vector<double> accByPosition;
  BucketFigures buckets;
  /// The bucket edges (ModelConfig::positionBuckets), written on the line
  /// where they are set: a run's first (MetricsLog::setPositionBuckets).
  std::vector<int64_t> positionBuckets;
  /// Micro-batches a step ran, their gradients added up (gradient
  /// accumulation; 1 without).
  int64_t microSteps = 1;
  double stepMs = 0;    ///< input copies and the step (slowest rank)
  double computeMs = 0; ///< the step alone, without the input copies
  /// The online target's GPU time (0 without one). On the drafter's GPU:
  /// its share of computeMs (slowest rank of this process). On GPUs of its
  /// own (`targetApart`, train --target-gpus): the busiest target GPU of
  /// this process, all the rows it computes per step, and featureWaitMs is
  /// the longest a drafter waited for its features (with the input copies).
  double targetMs = 0;
  bool targetApart = false;
  double featureWaitMs = 0;
  /// Every rank's stepMs, in rank order; empty when not reported per rank.
  std::vector<double> rankStepMs;
  double contextTokensPerS = 0;
  double draftTokensPerS = 0;
  double tflops = 0;
  /// This GPU's step FLOPs with its block attention counted at the anchors
  /// the step drew (schema/AttentionWork.h; a group's: its GPUs' mean), and
  /// their rate; 0: not counted, the rate is then tflops.
  double drawnFlops = 0;
  double drawnTflops = 0;
  /// Distinct rows skipped for non-finite features so far, over every rank,
  /// those a resumed state knew included.
  int64_t skippedRows = 0;
  /// The source rows this step skipped for the first time (one rank's).
  std::vector<int64_t> badRowsNow;

  /// Whether loss and grad_norm are finite (the run stops otherwise).
  bool finite() const;
};

/// What an evaluation over a held-out set reports (`train --eval-data`):
/// its sums added up over every batch and GPU, then divided.
struct EvalMetrics {
  int64_t step = 0; ///< the last training step done before it (0-based)
  double loss = 0, acc = 0, tau = 0;
  std::vector<double> accByPosition; ///< as StepMetrics::accByPosition
  BucketFigures buckets;             ///< as StepMetrics::buckets
  /// The serving-order acceptance of the first servingRows held-out rows
  /// (ServingWalk.h; docs/runtime.md, "Serving tau"): NaN without a walked
  /// block; servingBlocks the blocks walked, over every GPU. servingRows 0:
  /// not computed (the line leaves the figures out).
  double servingTau = std::nan("");
  int64_t servingBlocks = 0, servingRows = 0;
  int64_t rows = 0;    ///< held-out rows read, over every GPU
  int64_t batches = 0; ///< forward passes per GPU
  double seconds = 0;  ///< wall time of the evaluation
};

/// The accuracy per block position k = 1 .. bs - 1 from the sums a step or
/// an evaluation reports ([bs] each, StepMetric::PositionHits and
/// PositionCounts): hits[k] / counts[k], NaN where counts[k] is 0.
std::vector<double> accuracyByPosition(const double *hits, const double *counts,
                                       int64_t bs);

/// The figures per anchor-position bucket from `numBuckets` values each of
/// the Bucket* sums (StepMetric's or ForwardSum's): tau = runs / blocks,
/// acc = hits / counts. Empty for one bucket.
BucketFigures figuresByBucket(const double *runs, const double *blocks,
                              const double *hits, const double *counts,
                              int64_t numBuckets);

/// Sets the loss, acc, tau, accByPosition and buckets of `metrics` from
/// forward sums added up over an evaluation: `sums[k]` points to ForwardSum
/// k's values (one, bs for the per-position sums, numBuckets for the
/// per-bucket ones). `objectiveParts`, where the program reports them (a
/// "covered" DFlash2 objective), points to the totals of ObjectivePart's
/// two scalars, and the loss is that objective formed from the totals.
void setEvalFigures(EvalMetrics &metrics,
                    const std::array<const double *, kNumForwardSums> &sums,
                    int64_t bs, int64_t numBuckets,
                    const double *objectiveParts = nullptr);

/// Sets the throughput fields of `metrics` from its stepMs, and its
/// microSteps from the config.
void setThroughput(StepMetrics &metrics, const ModelConfig &config,
                   int64_t worldSize, double flopsPerStep);

/// One JSON object, without a newline: {"step": 0, "position_buckets":
/// [edges] (when set), "loss": ..., "acc", "tau", "acc_by_position": [k = 1,
/// ...] (when reported), "tau_by_bucket", "acc_by_bucket",
/// "blocks_by_bucket": [bucket 0, ...] (with more than one bucket),
/// "grad_norm", "lr", "step_ms", "compute_ms", "tokens_per_s",
/// "draft_tokens_per_s", "tflops", "drawn_tflops", "skipped_rows"}, and
/// "rank_step_ms": [...] last when rankStepMs is not empty. A non-finite
/// value is written as null.
std::string metricsJsonLine(const StepMetrics &metrics);
/// {"step": ..., "eval_loss", "eval_acc", "eval_tau", "eval_acc_by_position",
/// "eval_tau_by_bucket", "eval_acc_by_bucket", "eval_blocks_by_bucket"
/// (with more than one bucket), "eval_serving_tau", "eval_serving_blocks",
/// "eval_serving_rows" (when computed), "eval_rows", "eval_batches",
/// "eval_s"}: the
/// line of an evaluation, in the same log as the steps, after the line of
/// the step it followed.
std::string evalJsonLine(const EvalMetrics &metrics);
/// "eval after step 300: loss 2.1345  acc 0.5120  tau 3.02  acc@k 91 80 ..
/// tau@pos 3.1 2.9  serving tau 3.41 (812 blocks)  (80 rows, 1.2s)" (tau@pos
/// with more than one bucket, serving tau when computed).
std::string evalLine(const EvalMetrics &metrics);

/// The JSONL metrics file of a run.
class MetricsLog {
public:
  MetricsLog() = default;
  MetricsLog(const MetricsLog &) = delete;
  MetricsLog &operator=(const MetricsLog &) = delete;
  ~MetricsLog();

  /// Opens `path` for a run whose first step is `firstStep`. A fresh run
  /// (firstStep 0) starts an empty file; a resumed run keeps the lines of
  /// the steps before firstStep and drops the rest (steps a crashed or
  /// interrupted run logged after its last checkpoint, and a torn last line).
  Status open(const std::string &path, int64_t firstStep);
  /// The anchor-position bucket edges of the run: written once, on the
  /// first step line appended after (none with one bucket, empty edges).
  void setPositionBuckets(std::vector<int64_t> edges);
  /// Appends one line and flushes it.
  Status append(const StepMetrics &metrics);
  Status append(const EvalMetrics &metrics);
  const std::string &path() const { return filePath; }

private:
  Status appendLine(const std::string &line);

  std::string filePath;
  std::FILE *file = nullptr;
  std::vector<int64_t> pendingBuckets;
};

/// "45s", "3m05s", "2h07m", "3d04h".
std::string formatDuration(double seconds);
/// "950", "12.3k", "4.56M", "1.20G".
std::string formatRate(double perSecond);

/// "step 12/200  loss 2.3456  acc 0.4120  tau 2.31  acc@k 93 81 66 ..  tau@pos
/// 3.1 2.9 2.4 1.8  12.3k tok/s  draft 4.56k tok/s 85.1 ms/step  ETA 3m05s"
/// (acc@k: the accuracy at block positions 1, 2, ... in percent; tau@pos:
/// tau per anchor-position bucket, with more than one); with several ranks
/// "85.1 ms/step
/// (8 GPUs, fastest 80.2)", after rows were skipped "  skipped rows 3" before
/// the ETA. `stepsDone` counts the step just finished.
std::string progressLine(const StepMetrics &metrics, int64_t stepsDone,
                         int64_t finalStep, double etaSeconds);

/// The live progress line. On a terminal (`rewrite`) the line is rewritten
/// with '\r' at most ten times a second; otherwise a plain line is printed
/// for the first step, every `plainEvery` steps and the last step.
class ProgressDisplay {
public:
  ProgressDisplay(std::FILE *out, bool rewrite, int64_t plainEvery);
  ~ProgressDisplay() { finish(); }

  /// Shows the step just finished; the ETA comes from the wall time since
  /// the first update (or the step's own time on the first update).
  void update(const StepMetrics &metrics, int64_t finalStep);
  /// The same with an explicit clock in seconds, for tests.
  void update(const StepMetrics &metrics, int64_t finalStep, double nowSeconds);
  /// Prints a message on a line of its own, below the progress line.
  void note(const std::string &message);
  /// Ends a rewritten line so that later output starts on a fresh line.
  void finish();

private:
  std::FILE *out;
  bool rewrite;
  int64_t plainEvery;
  bool lineOpen = false;
  int64_t updates = 0;
  int64_t firstStepsDone = 0;
  double firstSeconds = 0, lastDrawSeconds = -1;
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_PROGRESS_H
