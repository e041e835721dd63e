//===- Progress.cpp - Step metrics: JSONL log and live progress -----------===//

#include "runtime/train/Progress.h"

#include "kernels/Selector.h"
#include "runtime/io/AtomicWrite.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

using namespace dflash;
using namespace dflash::rt;

bool StepMetrics::finite() const {
  return std::isfinite(loss) && std::isfinite(gradNorm);
}

void dflash::rt::setThroughput(StepMetrics &m, const ModelConfig &config,
                               int64_t worldSize, double flopsPerStep) {
  m.microSteps = config.gradientAccumulation;
  double seconds = m.stepMs / 1e3;
  if (!(seconds > 0)) {
    m.contextTokensPerS = m.draftTokensPerS = m.tflops = m.drawnTflops = 0;
    return;
  }
  double rows = double(config.rowsPerStep()) * double(worldSize);
  m.contextTokensPerS = rows * double(config.seqLen) / seconds;
  m.draftTokensPerS = rows * double(config.draftLength()) / seconds;
  m.tflops = flopsPerStep / seconds / 1e12;
  m.drawnTflops =
      (m.drawnFlops > 0 ? m.drawnFlops : flopsPerStep) / seconds / 1e12;
}

std::vector<double> dflash::rt::accuracyByPosition(const double *hits,
                                                   const double *counts,
                                                   int64_t bs) {
  std::vector<double> acc;
  for (int64_t k = 1; k < bs; ++k)
    acc.push_back(counts[k] > 0 ? hits[k] / counts[k] : std::nan(""));
  return acc;
}

BucketFigures dflash::rt::figuresByBucket(const double *runs,
                                          const double *blocks,
                                          const double *hits,
                                          const double *counts,
                                          int64_t numBuckets) {
  BucketFigures f;
  if (numBuckets <= 1)
    return f;
  for (int64_t j = 0; j < numBuckets; ++j) {
    f.tau.push_back(blocks[j] > 0 ? runs[j] / blocks[j] : std::nan(""));
    f.acc.push_back(counts[j] > 0 ? hits[j] / counts[j] : std::nan(""));
    f.blocks.push_back(blocks[j]);
  }
  return f;
}

void dflash::rt::setEvalFigures(
    EvalMetrics &m, const std::array<const double *, kNumForwardSums> &sums,
    int64_t bs, int64_t numBuckets, const double *objectiveParts) {
  auto sum = [&](ForwardSum k) { return sums[size_t(k)][0]; };
  const double numerator =
      objectiveParts ? kernels::coveredObjectiveNumerator(
                           sum(ForwardSum::LossSum),
                           objectiveParts[size_t(ObjectivePart::UnarySum)],
                           sum(ForwardSum::WeightSum),
                           objectiveParts[size_t(ObjectivePart::CoveredWeight)])
                     : sum(ForwardSum::LossSum);
  m.loss = numerator / sum(ForwardSum::WeightSum);
  m.acc = sum(ForwardSum::Correct) / sum(ForwardSum::Count);
  m.tau = sum(ForwardSum::RunSum) / sum(ForwardSum::KeptBlocks);
  m.accByPosition =
      accuracyByPosition(sums[size_t(ForwardSum::PositionHits)],
                         sums[size_t(ForwardSum::PositionCounts)], bs);
  m.buckets =
      figuresByBucket(sums[size_t(ForwardSum::BucketRuns)],
                      sums[size_t(ForwardSum::BucketBlocks)],
                      sums[size_t(ForwardSum::BucketHits)],
                      sums[size_t(ForwardSum::BucketCounts)], numBuckets);
}

/// `value` in printf format `format`, or null when it is not finite (JSON
/// has no NaN or infinity).
static std::string jsonNumber(const char *format, double value) {
  if (!std::isfinite(value))
    return "null";
  char text[64];
  std::snprintf(text, sizeof(text), format, value);
  return text;
}

/// `, "<key>": [..]`, or nothing for no values.
static std::string jsonList(const char *key, const std::vector<double> &values,
                            const char *format) {
  if (values.empty())
    return "";
  std::string text = std::string(", \"") + key + "\": [";
  for (size_t i = 0; i < values.size(); ++i)
    text += (i ? ", " : "") + jsonNumber(format, values[i]);
  return text + "]";
}

/// `, "<prefix>tau_by_bucket": [..], ...`, or nothing with one bucket.
static std::string bucketLists(const char *prefix, const BucketFigures &f) {
  std::string p = prefix;
  return jsonList((p + "tau_by_bucket").c_str(), f.tau, "%.6g") +
         jsonList((p + "acc_by_bucket").c_str(), f.acc, "%.6g") +
         jsonList((p + "blocks_by_bucket").c_str(), f.blocks, "%.0f");
}

/// "  tau@pos 3.1 2.9 2.4" ("-" where a bucket had no block), or nothing.
static std::string bucketText(const BucketFigures &f) {
  if (f.tau.empty())
    return "";
  std::string text = "  tau@pos";
  for (double t : f.tau) {
    char value[16] = " -";
    if (std::isfinite(t))
      std::snprintf(value, sizeof(value), " %.1f", t);
    text += value;
  }
  return text;
}

/// "  acc@k 93 81 66" (percent, "-" where unknown), or nothing.
static std::string positionText(const std::vector<double> &acc) {
  if (acc.empty())
    return "";
  std::string text = "  acc@k";
  for (double a : acc) {
    char value[16] = " -";
    if (std::isfinite(a))
      std::snprintf(value, sizeof(value), " %.0f", 100 * a);
    text += value;
  }
  return text;
}

std::string dflash::rt::metricsJsonLine(const StepMetrics &m) {
  // Losses, norms and rates keep 9 significant digits so that runs can be
  // compared bit for bit in float; timings need far fewer.
  std::string edges;
  for (int64_t e : m.positionBuckets)
    edges += (edges.empty() ? "" : ", ") + std::to_string(e);
  return "{\"step\": " + std::to_string(m.step) +
         (m.positionBuckets.empty()
              ? std::string()
              : ", \"position_buckets\": [" + edges + "]") +
         ", \"loss\": " + jsonNumber("%.9g", m.loss) +
         ", \"acc\": " + jsonNumber("%.9g", m.acc) +
         ", \"tau\": " + jsonNumber("%.9g", m.tau) +
         jsonList("acc_by_position", m.accByPosition, "%.6g") +
         bucketLists("", m.buckets) +
         ", \"grad_norm\": " + jsonNumber("%.9g", m.gradNorm) +
         ", \"lr\": " + jsonNumber("%.9g", m.lr) +
         ", \"step_ms\": " + jsonNumber("%.4f", m.stepMs) +
         ", \"compute_ms\": " + jsonNumber("%.4f", m.computeMs) +
         (m.targetMs > 0 ? ", \"target_ms\": " + jsonNumber("%.4f", m.targetMs)
                         : std::string()) +
         (m.targetApart
              ? ", \"feature_wait_ms\": " + jsonNumber("%.4f", m.featureWaitMs)
              : std::string()) +
         ", \"tokens_per_s\": " + jsonNumber("%.1f", m.contextTokensPerS) +
         ", \"draft_tokens_per_s\": " + jsonNumber("%.1f", m.draftTokensPerS) +
         ", \"tflops\": " + jsonNumber("%.3f", m.tflops) +
         ", \"drawn_tflops\": " + jsonNumber("%.3f", m.drawnTflops) +
         ", \"skipped_rows\": " + std::to_string(m.skippedRows) +
         jsonList("rank_step_ms", m.rankStepMs, "%.4f") + "}";
}

/// The serving-order acceptance's fields of an evaluation line, when it was
/// computed.
static std::string servingFields(const EvalMetrics &m) {
  if (m.servingRows <= 0)
    return "";
  return ", \"eval_serving_tau\": " + jsonNumber("%.9g", m.servingTau) +
         ", \"eval_serving_blocks\": " + std::to_string(m.servingBlocks) +
         ", \"eval_serving_rows\": " + std::to_string(m.servingRows);
}

std::string dflash::rt::evalJsonLine(const EvalMetrics &m) {
  return "{\"step\": " + std::to_string(m.step) +
         ", \"eval_loss\": " + jsonNumber("%.9g", m.loss) +
         ", \"eval_acc\": " + jsonNumber("%.9g", m.acc) +
         ", \"eval_tau\": " + jsonNumber("%.9g", m.tau) +
         jsonList("eval_acc_by_position", m.accByPosition, "%.6g") +
         bucketLists("eval_", m.buckets) + servingFields(m) +
         ", \"eval_rows\": " + std::to_string(m.rows) +
         ", \"eval_batches\": " + std::to_string(m.batches) +
         ", \"eval_s\": " + jsonNumber("%.3f", m.seconds) + "}";
}

std::string dflash::rt::evalLine(const EvalMetrics &m) {
  char text[160];
  std::snprintf(text, sizeof(text),
                "eval after step %lld: loss %.4f  acc %.4f  tau %.2f",
                (long long)m.step + 1, m.loss, m.acc, m.tau);
  char tail[96];
  std::snprintf(tail, sizeof(tail), "  (%lld rows, %s)", (long long)m.rows,
                formatDuration(m.seconds).c_str());
  char serving[80] = "";
  if (m.servingRows > 0)
    std::snprintf(serving, sizeof(serving), "  serving tau %.2f (%lld blocks)",
                  m.servingTau, (long long)m.servingBlocks);
  return text + positionText(m.accByPosition) + bucketText(m.buckets) +
         serving + tail;
}

//===----------------------------------------------------------------------===//
// MetricsLog
//===----------------------------------------------------------------------===//

MetricsLog::~MetricsLog() {
  if (file)
    std::fclose(file);
}

/// The lines of `text` that are complete JSON objects with a "step" below
/// `firstStep`.
static std::string linesBefore(const std::string &text, int64_t firstStep) {
  std::istringstream in(text);
  std::string line, kept;
  while (std::getline(in, line)) {
    nlohmann::json value = nlohmann::json::parse(line, nullptr, false);
    if (value.is_discarded() || !value.is_object())
      continue;
    auto step = value.find("step");
    if (step == value.end() || !step->is_number_integer() ||
        step->get<int64_t>() >= firstStep)
      continue;
    kept += line + "\n";
  }
  return kept;
}

Status MetricsLog::open(const std::string &path, int64_t firstStep) {
  if (file)
    return Status::error(path + ": metrics log opened twice");
  filePath = path;
  if (firstStep > 0) {
    std::string text;
    // A missing log is fine: the earlier run may have logged elsewhere.
    if (readTextFile(path, text).ok()) {
      DFLASH_RETURN_IF_ERROR(
          writeFileAtomically(path, linesBefore(text, firstStep)));
    }
  }
  file = std::fopen(path.c_str(), firstStep > 0 ? "a" : "w");
  if (!file)
    return Status::error(
        path + ": cannot open the metrics log: " + std::strerror(errno));
  return Status::success();
}

void MetricsLog::setPositionBuckets(std::vector<int64_t> edges) {
  pendingBuckets = std::move(edges);
}

Status MetricsLog::append(const StepMetrics &metrics) {
  if (pendingBuckets.empty())
    return appendLine(metricsJsonLine(metrics) + "\n");
  // Once per run: a resumed run writes them again on its first line.
  StepMetrics first = metrics;
  first.positionBuckets = std::move(pendingBuckets);
  pendingBuckets.clear();
  return appendLine(metricsJsonLine(first) + "\n");
}

Status MetricsLog::append(const EvalMetrics &metrics) {
  return appendLine(evalJsonLine(metrics) + "\n");
}

Status MetricsLog::appendLine(const std::string &line) {
  if (!file)
    return Status::error("the metrics log is not open");
  if (std::fwrite(line.data(), 1, line.size(), file) != line.size() ||
      std::fflush(file) != 0)
    return Status::error(
        filePath + ": cannot write the metrics log: " + std::strerror(errno));
  return Status::success();
}

//===----------------------------------------------------------------------===//
// Progress line
//===----------------------------------------------------------------------===//

std::string dflash::rt::formatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    return "?";
  long long s = (long long)std::llround(seconds);
  char text[32];
  if (s < 60)
    std::snprintf(text, sizeof(text), "%llds", s);
  else if (s < 3600)
    std::snprintf(text, sizeof(text), "%lldm%02llds", s / 60, s % 60);
  else if (s < 86400)
    std::snprintf(text, sizeof(text), "%lldh%02lldm", s / 3600,
                  (s % 3600) / 60);
  else
    std::snprintf(text, sizeof(text), "%lldd%02lldh", s / 86400,
                  (s % 86400) / 3600);
  return text;
}

std::string dflash::rt::formatRate(double perSecond) {
  if (!std::isfinite(perSecond) || perSecond < 0)
    return "?";
  const char *suffixes[] = {"", "k", "M", "G", "T"};
  int unit = 0;
  while (perSecond >= 999.95 && unit < 4) {
    perSecond /= 1000.0;
    ++unit;
  }
  char text[32];
  if (unit == 0)
    std::snprintf(text, sizeof(text), "%.0f", perSecond);
  else
    std::snprintf(text, sizeof(text), perSecond < 9.995 ? "%.2f%s" : "%.1f%s",
                  perSecond, suffixes[unit]);
  return text;
}

std::string dflash::rt::progressLine(const StepMetrics &m, int64_t stepsDone,
                                     int64_t finalStep, double etaSeconds) {
  char ranks[64] = "";
  if (m.rankStepMs.size() > 1) {
    // Unknown times (NaN) are left out.
    double fastest = m.stepMs;
    for (double t : m.rankStepMs)
      if (std::isfinite(t))
        fastest = std::min(fastest, t);
    std::snprintf(ranks, sizeof(ranks), " (%zu GPUs, fastest %.1f)",
                  m.rankStepMs.size(), fastest);
  }
  char skipped[48] = "";
  if (m.skippedRows > 0)
    std::snprintf(skipped, sizeof(skipped), "  skipped rows %lld",
                  (long long)m.skippedRows);
  // Both sides' busy time, so that a user can balance the split.
  char target[80] = "";
  if (m.targetApart)
    std::snprintf(target, sizeof(target),
                  " (target %.1f, drafter %.1f, waited %.1f)", m.targetMs,
                  m.computeMs, m.featureWaitMs);
  else if (m.targetMs > 0)
    std::snprintf(target, sizeof(target), " (target %.1f, drafter %.1f)",
                  m.targetMs, m.computeMs - m.targetMs);
  // With gradient accumulation, the micro-batches done too.
  char micro[64] = "";
  if (m.microSteps > 1)
    std::snprintf(micro, sizeof(micro), " (micro-step %lld/%lld)",
                  (long long)(stepsDone * m.microSteps),
                  (long long)(finalStep * m.microSteps));
  char head[224], tail[384];
  std::snprintf(
      head, sizeof(head), "step %lld/%lld%s  loss %.4f  acc %.4f  tau %.2f",
      (long long)stepsDone, (long long)finalStep, micro, m.loss, m.acc, m.tau);
  std::snprintf(tail, sizeof(tail),
                "  %s tok/s  draft %s tok/s  %.1f ms/step%s%s%s  ETA %s",
                formatRate(m.contextTokensPerS).c_str(),
                formatRate(m.draftTokensPerS).c_str(), m.stepMs, target, ranks,
                skipped, formatDuration(etaSeconds).c_str());
  return head + positionText(m.accByPosition) + bucketText(m.buckets) + tail;
}

ProgressDisplay::ProgressDisplay(std::FILE *out, bool rewrite,
                                 int64_t plainEvery)
    : out(out), rewrite(rewrite), plainEvery(plainEvery > 0 ? plainEvery : 1) {}

void ProgressDisplay::update(const StepMetrics &metrics, int64_t finalStep) {
  double now = std::chrono::duration<double>(
                   std::chrono::steady_clock::now().time_since_epoch())
                   .count();
  update(metrics, finalStep, now);
}

void ProgressDisplay::update(const StepMetrics &metrics, int64_t finalStep,
                             double nowSeconds) {
  int64_t stepsDone = metrics.step + 1;
  int64_t remaining = finalStep > stepsDone ? finalStep - stepsDone : 0;
  double eta;
  if (updates == 0) {
    // The first step of a run also captures the graph; later estimates
    // start after it.
    firstSeconds = nowSeconds;
    firstStepsDone = stepsDone;
    eta = metrics.stepMs / 1e3 * double(remaining);
  } else {
    double perStep = (nowSeconds - firstSeconds) /
                     double(std::max<int64_t>(stepsDone - firstStepsDone, 1));
    eta = perStep * double(remaining);
  }
  ++updates;
  std::string line = progressLine(metrics, stepsDone, finalStep, eta);
  bool last = stepsDone >= finalStep;
  if (rewrite) {
    if (!last && updates > 1 && lastDrawSeconds >= 0 &&
        nowSeconds - lastDrawSeconds < 0.1)
      return;
    lastDrawSeconds = nowSeconds;
    // Clear to the end of the line: the previous text may have been longer.
    std::fprintf(out, "\r%s\033[K", line.c_str());
    lineOpen = true;
  } else if (updates == 1 || last || stepsDone % plainEvery == 0) {
    std::fprintf(out, "%s\n", line.c_str());
  }
  std::fflush(out);
}

void ProgressDisplay::note(const std::string &message) {
  finish();
  std::fprintf(out, "%s\n", message.c_str());
  std::fflush(out);
}

void ProgressDisplay::finish() {
  if (!lineOpen)
    return;
  std::fputc('\n', out);
  std::fflush(out);
  lineOpen = false;
}
