//===- ProgressTest.cpp - The metrics log and the progress line -----------===//
//
// Throughput, the JSONL lines of steps and evaluations (every rank's step
// time, the online target's times, accuracy by position, non-finite values
// as null), the log kept up to a resumed step, and the progress line:
// durations and rates, plain lines every N steps, a terminal line rewritten.
//
//===----------------------------------------------------------------------===//

#include "runtime/train/Progress.h"
#include "test/unit/runtime/RuntimeTestSupport.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::trainhost;

namespace {
StepMetrics sampleMetrics() {
  StepMetrics m;
  m.step = 12;
  m.loss = 2.5;
  m.acc = 0.25;
  m.tau = 2.75;
  m.gradNorm = 1.125;
  m.lr = 0.0006;
  m.stepMs = 80;
  m.computeMs = 70;
  setThroughput(m, smallConfig(), 1, 4e12);
  return m;
}
} // namespace

TEST(TrainMetrics, Throughput) {
  StepMetrics m = sampleMetrics();
  // B 2 x S 32 tokens and B 2 x Q 12 draft slots in 0.08 s; 4e12 FLOP.
  EXPECT_DOUBLE_EQ(m.contextTokensPerS, 64 / 0.08);
  EXPECT_DOUBLE_EQ(m.draftTokensPerS, 24 / 0.08);
  EXPECT_DOUBLE_EQ(m.tflops, 50.0);
  setThroughput(m, smallConfig(), 4, 4e12);
  EXPECT_DOUBLE_EQ(m.contextTokensPerS, 4 * 64 / 0.08);
  EXPECT_DOUBLE_EQ(m.tflops, 50.0); // one GPU's rate
  // Not counted at the drawn anchors: the compiler's count.
  EXPECT_DOUBLE_EQ(m.drawnTflops, 50.0);
  // Counted: the attention of the anchors drawn (5.2e12 FLOP).
  m.drawnFlops = 5.2e12;
  setThroughput(m, smallConfig(), 1, 4e12);
  EXPECT_DOUBLE_EQ(m.tflops, 50.0);
  EXPECT_DOUBLE_EQ(m.drawnTflops, 65.0);
  m.stepMs = 0;
  setThroughput(m, smallConfig(), 1, 4e12);
  EXPECT_EQ(m.contextTokensPerS, 0);
  EXPECT_EQ(m.drawnTflops, 0);
}

TEST(TrainMetrics, JsonLine) {
  EXPECT_EQ(metricsJsonLine(sampleMetrics()),
            "{\"step\": 12, \"loss\": 2.5, \"acc\": 0.25, \"tau\": 2.75, "
            "\"grad_norm\": "
            "1.125, \"lr\": 0.0006, \"step_ms\": 80.0000, \"compute_ms\": "
            "70.0000, \"tokens_per_s\": "
            "800.0, \"draft_tokens_per_s\": 300.0, \"tflops\": 50.000, "
            "\"drawn_tflops\": 50.000, \"skipped_rows\": 0}");
  StepMetrics bad = sampleMetrics();
  bad.loss = std::numeric_limits<double>::quiet_NaN();
  bad.gradNorm = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(bad.finite());
  std::string line = metricsJsonLine(bad);
  EXPECT_NE(line.find("\"loss\": null"), std::string::npos) << line;
  EXPECT_NE(line.find("\"grad_norm\": null"), std::string::npos) << line;
  // float metrics keep every bit through the log
  float lr = 0.000123456789f;
  StepMetrics exact;
  exact.lr = lr;
  std::string text = metricsJsonLine(exact);
  size_t at = text.find("\"lr\": ") + 6;
  EXPECT_EQ(float(std::strtod(text.c_str() + at, nullptr)), lr);
}

TEST(TrainMetrics, EveryRanksStepTime) {
  StepMetrics m = sampleMetrics();
  m.rankStepMs = {80, 75.5};
  setThroughput(m, smallConfig(), 2, 4e12);
  // The whole run's tokens over the slowest rank's time.
  EXPECT_DOUBLE_EQ(m.contextTokensPerS, 2 * 64 / 0.08);
  EXPECT_EQ(metricsJsonLine(m),
            "{\"step\": 12, \"loss\": 2.5, \"acc\": 0.25, \"tau\": 2.75, "
            "\"grad_norm\": "
            "1.125, \"lr\": 0.0006, \"step_ms\": 80.0000, \"compute_ms\": "
            "70.0000, \"tokens_per_s\": 1600.0, \"draft_tokens_per_s\": "
            "600.0, \"tflops\": 50.000, \"drawn_tflops\": 50.000, "
            "\"skipped_rows\": 0, "
            "\"rank_step_ms\": [80.0000, "
            "75.5000]}");
  EXPECT_EQ(
      progressLine(m, 13, 200, 185),
      "step 13/200  loss 2.5000  acc 0.2500  tau 2.75  1.60k tok/s  draft 600 "
      "tok/s  80.0 ms/step (2 GPUs, fastest 75.5)  ETA 3m05s");
  // A rank whose time is not known (another node's, after a failed step).
  m.rankStepMs = {80, std::nan("")};
  std::string line = metricsJsonLine(m);
  EXPECT_NE(line.find("\"rank_step_ms\": [80.0000, null]"), std::string::npos)
      << line;
  // One rank: the plain line.
  m.rankStepMs = {80};
  EXPECT_EQ(progressLine(m, 13, 200, 185).find("GPUs"), std::string::npos);
  // Skipped rows, once there are any, in the line and the JSON.
  EXPECT_EQ(progressLine(m, 13, 200, 185).find("skipped"), std::string::npos);
  m.skippedRows = 3;
  EXPECT_EQ(
      progressLine(m, 13, 200, 185),
      "step 13/200  loss 2.5000  acc 0.2500  tau 2.75  1.60k tok/s  draft 600 "
      "tok/s  80.0 ms/step  skipped rows 3  ETA 3m05s");
  EXPECT_EQ(nlohmann::json::parse(metricsJsonLine(m))["skipped_rows"], 3);
  nlohmann::json parsed = nlohmann::json::parse(metricsJsonLine(m));
  EXPECT_EQ(parsed["rank_step_ms"], nlohmann::json::array({80.0}));
}

// With gradient accumulation the line counts the micro-batches too; the
// step, the schedule and the log count optimizer steps.
TEST(TrainMetrics, MicroStepsOfGradientAccumulation) {
  StepMetrics m = sampleMetrics();
  ModelConfig config;
  config.gradientAccumulation = 4;
  setThroughput(m, config, 1, 1e12);
  EXPECT_EQ(m.microSteps, 4);
  std::string line = progressLine(m, 13, 200, 185);
  EXPECT_EQ(line.rfind("step 13/200 (micro-step 52/800)  loss 2.5000", 0), 0u)
      << line;
  config.gradientAccumulation = 1;
  setThroughput(m, config, 1, 1e12);
  EXPECT_EQ(progressLine(m, 13, 200, 185).find("micro"), std::string::npos);
}

// Both sides' busy time, so that a user can balance the split: on the
// drafter's GPU the target is a share of the step; on its own GPUs it is
// beside it, and the drafter's wait for its features shows.
TEST(TrainMetrics, OnlineTargetTimes) {
  StepMetrics m = sampleMetrics();
  m.targetMs = 30;
  EXPECT_NE(progressLine(m, 13, 200, 185)
                .find("80.0 ms/step (target 30.0, drafter 40.0)"),
            std::string::npos)
      << progressLine(m, 13, 200, 185);
  nlohmann::json parsed = nlohmann::json::parse(metricsJsonLine(m));
  EXPECT_EQ(parsed["target_ms"], 30.0);
  EXPECT_FALSE(parsed.contains("feature_wait_ms"));
  m.targetApart = true;
  m.featureWaitMs = 10;
  EXPECT_NE(progressLine(m, 13, 200, 185)
                .find("80.0 ms/step (target 30.0, drafter 70.0, waited 10.0)"),
            std::string::npos)
      << progressLine(m, 13, 200, 185);
  parsed = nlohmann::json::parse(metricsJsonLine(m));
  EXPECT_EQ(parsed["feature_wait_ms"], 10.0);
}

TEST(TrainMetrics, LogKeepsEarlierStepsOnResume) {
  TrainMainTempDir dir;
  std::string path = dir.path + "/metrics.jsonl";
  {
    MetricsLog log;
    ASSERT_TRUE(log.open(path, 0).ok());
    for (int i = 0; i < 6; ++i) {
      StepMetrics m = sampleMetrics();
      m.step = i;
      ASSERT_TRUE(log.append(m).ok());
    }
  }
  // A crash mid-line leaves a torn last line.
  std::ofstream(path, std::ios::app) << "{\"step\": 6, \"lo";
  {
    MetricsLog log;
    ASSERT_TRUE(log.open(path, 4).ok());
    StepMetrics m = sampleMetrics();
    m.step = 4;
    ASSERT_TRUE(log.append(m).ok());
  }
  std::string text = readFile(path);
  std::vector<int64_t> steps;
  size_t at = 0;
  while ((at = text.find("{\"step\": ", at)) != std::string::npos) {
    steps.push_back(std::strtoll(text.c_str() + at + 9, nullptr, 10));
    ++at;
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  // A fresh run starts over.
  MetricsLog fresh;
  ASSERT_TRUE(fresh.open(path, 0).ok());
  EXPECT_EQ(readFile(path), "");
  MetricsLog bad;
  Status s = bad.open(dir.path + "/no/dir/m.jsonl", 0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir.path + "/no/dir/m.jsonl: cannot open"),
            std::string::npos)
      << s.message();
}

TEST(TrainMetrics, AccuracyByPosition) {
  // bs 4: position 0 never counts; position 3 had no supervised slot.
  const double hits[] = {0, 9, 3, 0}, counts[] = {0, 10, 6, 0};
  std::vector<double> acc = accuracyByPosition(hits, counts, 4);
  ASSERT_EQ(acc.size(), 3u);
  EXPECT_DOUBLE_EQ(acc[0], 0.9);
  EXPECT_DOUBLE_EQ(acc[1], 0.5);
  EXPECT_TRUE(std::isnan(acc[2]));
  StepMetrics m = sampleMetrics();
  m.accByPosition = acc;
  nlohmann::json parsed = nlohmann::json::parse(metricsJsonLine(m));
  EXPECT_EQ(parsed["acc_by_position"],
            nlohmann::json::parse("[0.9, 0.5, null]"));
  EXPECT_EQ(
      progressLine(m, 13, 200, 185),
      "step 13/200  loss 2.5000  acc 0.2500  tau 2.75  acc@k 90 50 -  800 "
      "tok/s  draft 300 tok/s  80.0 ms/step  ETA 3m05s");
}

// Tau and the accuracy per anchor-position bucket (docs/semantics.md
// section 14): in the JSON lines and the progress lines with more than one
// bucket, nothing more with one; the edges once, on the run's first line.
TEST(TrainMetrics, ByAnchorPositionBucket) {
  // Three buckets; the last had no kept block.
  const double runs[] = {30, 9, 0}, blocks[] = {10, 4, 0}, hits[] = {60, 10, 0},
               counts[] = {70, 20, 0};
  BucketFigures f = figuresByBucket(runs, blocks, hits, counts, 3);
  ASSERT_EQ(f.tau.size(), 3u);
  EXPECT_DOUBLE_EQ(f.tau[0], 3.0);
  EXPECT_DOUBLE_EQ(f.tau[1], 2.25);
  EXPECT_TRUE(std::isnan(f.tau[2]));
  EXPECT_DOUBLE_EQ(f.acc[0], 60.0 / 70);
  EXPECT_DOUBLE_EQ(f.acc[1], 0.5);
  EXPECT_TRUE(std::isnan(f.acc[2]));
  EXPECT_EQ(f.blocks, (std::vector<double>{10, 4, 0}));
  // One bucket: tau and acc say it all.
  BucketFigures one = figuresByBucket(runs, blocks, hits, counts, 1);
  EXPECT_TRUE(one.tau.empty() && one.acc.empty() && one.blocks.empty());

  StepMetrics m = sampleMetrics();
  m.buckets = f;
  nlohmann::json parsed = nlohmann::json::parse(metricsJsonLine(m));
  EXPECT_EQ(parsed["tau_by_bucket"], nlohmann::json::parse("[3, 2.25, null]"));
  EXPECT_EQ(parsed["acc_by_bucket"],
            nlohmann::json::parse("[0.857143, 0.5, null]"));
  EXPECT_EQ(parsed["blocks_by_bucket"], nlohmann::json::parse("[10, 4, 0]"));
  EXPECT_FALSE(parsed.contains("position_buckets"));
  EXPECT_EQ(
      progressLine(m, 13, 200, 185),
      "step 13/200  loss 2.5000  acc 0.2500  tau 2.75  tau@pos 3.0 2.2 -  800 "
      "tok/s  draft 300 tok/s  80.0 ms/step  ETA 3m05s");
  EXPECT_EQ(metricsJsonLine(sampleMetrics()).find("by_bucket"),
            std::string::npos);

  EvalMetrics e;
  e.step = 9;
  e.tau = 2.5;
  e.buckets = f;
  parsed = nlohmann::json::parse(evalJsonLine(e));
  EXPECT_EQ(parsed["eval_tau_by_bucket"],
            nlohmann::json::parse("[3, 2.25, null]"));
  EXPECT_EQ(parsed["eval_blocks_by_bucket"],
            nlohmann::json::parse("[10, 4, 0]"));
  EXPECT_NE(evalLine(e).find("tau 2.50  tau@pos 3.0 2.2 -  ("),
            std::string::npos)
      << evalLine(e);

  // The edges go on the first line the log writes, not on later ones; a
  // resumed run writes them again on its first.
  TrainMainTempDir dir;
  std::string path = dir.path + "/metrics.jsonl";
  for (int64_t first : {0, 2}) {
    MetricsLog log;
    ASSERT_TRUE(log.open(path, first).ok());
    log.setPositionBuckets({4096, 16384, 65536});
    for (int64_t i = first; i < first + 2; ++i) {
      m.step = i;
      ASSERT_TRUE(log.append(m).ok());
    }
  }
  std::vector<std::string> lines;
  std::istringstream in(readFile(path));
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  ASSERT_EQ(lines.size(), 4u);
  for (size_t i = 0; i < lines.size(); ++i) {
    parsed = nlohmann::json::parse(lines[i]);
    EXPECT_EQ(parsed.contains("position_buckets"), i % 2 == 0) << lines[i];
    if (i % 2 == 0) {
      EXPECT_EQ(parsed["position_buckets"],
                nlohmann::json::parse("[4096, 16384, 65536]"));
    }
  }
}

// An evaluation of two batches whose "covered" ratios differ: the loss is
// the objective of the totals (docs/semantics.md section 13), unary + alpha
// * selector * sum(w) / sum(w cov) over sum(w), not the sum of the batches'
// objectives; without the parts, loss_sum / weight_sum as before.
TEST(TrainMetrics, CoveredObjectiveOfAnEvaluationsTotals) {
  const double alpha = 0.5;
  struct Batch {
    double unary, selector, weight, covered;
  } batches[] = {{12.0, 3.0, 10.0, 2.0}, {7.0, 1.0, 6.0, 5.0}};
  double sums[kNumForwardSums][8] = {};
  double parts[kNumObjectiveParts] = {};
  double perBatchObjectives = 0, unary = 0, selector = 0, weight = 0,
         covered = 0;
  for (const Batch &b : batches) {
    // What the evaluation program reports for a batch.
    sums[size_t(ForwardSum::LossSum)][0] += b.unary + alpha * b.selector;
    sums[size_t(ForwardSum::WeightSum)][0] += b.weight;
    parts[size_t(ObjectivePart::UnarySum)] += b.unary;
    parts[size_t(ObjectivePart::CoveredWeight)] += b.covered;
    perBatchObjectives += b.unary + alpha * b.selector * b.weight / b.covered;
    unary += b.unary;
    selector += b.selector;
    weight += b.weight;
    covered += b.covered;
  }
  for (ForwardSum k : {ForwardSum::Correct, ForwardSum::Count,
                       ForwardSum::RunSum, ForwardSum::KeptBlocks})
    sums[size_t(k)][0] = 1;
  std::array<const double *, kNumForwardSums> byIndex{};
  for (int k = 0; k < kNumForwardSums; ++k)
    byIndex[size_t(k)] = sums[k];
  EvalMetrics e;
  setEvalFigures(e, byIndex, 8, 1, parts);
  EXPECT_DOUBLE_EQ(e.loss,
                   (unary + alpha * selector * weight / covered) / weight);
  EXPECT_GT(std::abs(e.loss - perBatchObjectives / weight), 0.1);
  // Nothing covered: the selector term is 0, as in the step.
  parts[size_t(ObjectivePart::CoveredWeight)] = 0;
  setEvalFigures(e, byIndex, 8, 1, parts);
  EXPECT_DOUBLE_EQ(e.loss, unary / weight);
  setEvalFigures(e, byIndex, 8, 1);
  EXPECT_DOUBLE_EQ(e.loss, (unary + alpha * selector) / weight);
}

TEST(TrainMetrics, EvalLines) {
  EvalMetrics e;
  e.step = 299;
  e.loss = 2.125;
  e.acc = 0.5;
  e.tau = 3.25;
  e.accByPosition = {0.75, 0.5};
  e.rows = 80;
  e.batches = 40;
  e.seconds = 1.5;
  EXPECT_EQ(evalJsonLine(e),
            "{\"step\": 299, \"eval_loss\": 2.125, \"eval_acc\": 0.5, "
            "\"eval_tau\": 3.25, \"eval_acc_by_position\": [0.75, 0.5], "
            "\"eval_rows\": 80, \"eval_batches\": 40, \"eval_s\": 1.500}");
  EXPECT_EQ(evalLine(e), "eval after step 300: loss 2.1250  acc 0.5000  tau "
                         "3.25  acc@k 75 50  (80 rows, 2s)");
  // With the serving walk (ServingWalk.h) of 16 rows.
  EvalMetrics walked = e;
  walked.servingTau = 4.125;
  walked.servingBlocks = 96;
  walked.servingRows = 16;
  EXPECT_NE(evalJsonLine(walked).find(
                "[0.75, 0.5], \"eval_serving_tau\": 4.125, "
                "\"eval_serving_blocks\": 96, \"eval_serving_rows\": 16, "
                "\"eval_rows\": 80"),
            std::string::npos)
      << evalJsonLine(walked);
  EXPECT_EQ(evalLine(walked),
            "eval after step 300: loss 2.1250  acc 0.5000  tau 3.25  acc@k 75 "
            "50  serving tau 4.12 (96 blocks)  (80 rows, 2s)");
  walked.servingBlocks = 0;
  walked.servingTau = std::nan("");
  EXPECT_NE(evalJsonLine(walked).find("\"eval_serving_tau\": null"),
            std::string::npos);
  // The log keeps an evaluation with the step it followed on resume.
  TrainMainTempDir dir;
  std::string path = dir.path + "/metrics.jsonl";
  {
    MetricsLog log;
    ASSERT_TRUE(log.open(path, 0).ok());
    StepMetrics m = sampleMetrics();
    m.step = 299;
    ASSERT_TRUE(log.append(m).ok());
    ASSERT_TRUE(log.append(e).ok());
    m.step = 300;
    ASSERT_TRUE(log.append(m).ok());
  }
  MetricsLog log;
  ASSERT_TRUE(log.open(path, 300).ok());
  std::string text = readFile(path);
  EXPECT_NE(text.find("\"eval_tau\": 3.25"), std::string::npos) << text;
  EXPECT_EQ(text.find("\"step\": 300"), std::string::npos) << text;
}

TEST(TrainProgress, Formatting) {
  EXPECT_EQ(formatDuration(45), "45s");
  EXPECT_EQ(formatDuration(185), "3m05s");
  EXPECT_EQ(formatDuration(7620), "2h07m");
  EXPECT_EQ(formatDuration(3 * 86400 + 4 * 3600), "3d04h");
  EXPECT_EQ(formatDuration(std::nan("")), "?");
  EXPECT_EQ(formatRate(950), "950");
  EXPECT_EQ(formatRate(12345), "12.3k");
  EXPECT_EQ(formatRate(4.56e6), "4.56M");
  EXPECT_EQ(formatRate(1.2e9), "1.20G");
  EXPECT_EQ(
      progressLine(sampleMetrics(), 13, 200, 185),
      "step 13/200  loss 2.5000  acc 0.2500  tau 2.75  800 tok/s  draft 300 "
      "tok/s  80.0 ms/step  ETA 3m05s");
}

namespace {
std::string readBack(std::FILE *file) {
  std::fflush(file);
  std::rewind(file);
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0)
    text.append(buffer, n);
  return text;
}
} // namespace

TEST(TrainProgress, PlainLinesEveryNSteps) {
  std::FILE *file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    ProgressDisplay display(file, /*rewrite=*/false, /*plainEvery=*/4);
    for (int i = 0; i < 10; ++i) {
      StepMetrics m = sampleMetrics();
      m.step = i;
      display.update(m, 10, 100.0 + i);
      if (i == 5)
        display.note("train: saved checkpoint x");
    }
  }
  std::string text = readBack(file);
  std::fclose(file);
  // Steps done 1 (first), 4, 8 and 10 (last), plus the note.
  EXPECT_NE(text.find("step 1/10 "), std::string::npos) << text;
  EXPECT_NE(text.find("step 4/10 "), std::string::npos) << text;
  EXPECT_NE(text.find("step 8/10 "), std::string::npos) << text;
  EXPECT_NE(text.find("step 10/10 "), std::string::npos) << text;
  EXPECT_EQ(text.find("step 2/10 "), std::string::npos) << text;
  EXPECT_NE(text.find("\ntrain: saved checkpoint x\n"), std::string::npos);
  EXPECT_EQ(text.find('\r'), std::string::npos);
  // After the first step, ETA is the wall time per step: 1 s.
  EXPECT_NE(text.find("step 4/10 "), std::string::npos);
  EXPECT_NE(text.find("ETA 6s"), std::string::npos) << text;
}

TEST(TrainProgress, TerminalLineIsRewritten) {
  std::FILE *file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    ProgressDisplay display(file, /*rewrite=*/true, 1);
    StepMetrics m = sampleMetrics();
    for (int i = 0; i < 5; ++i) {
      m.step = i;
      // Steps 1..3 come within 0.1 s of each other: only the first and the
      // last are drawn.
      display.update(m, 5, i == 4 ? 10.0 : 1.0 + 0.01 * i);
    }
    display.note("train: done");
  }
  std::string text = readBack(file);
  std::fclose(file);
  EXPECT_EQ(text.rfind("\rstep 1/5 ", 0), 0u) << text;
  EXPECT_EQ(text.find("step 2/5 "), std::string::npos) << text;
  EXPECT_NE(text.find("\rstep 5/5 "), std::string::npos) << text;
  EXPECT_NE(text.find("\033[K\ntrain: done\n"), std::string::npos) << text;
}
