//===- StepBuffersTest.cpp - A compiled step's buffers, by role -----------===//
//
// mapStepBuffers and mapEvalBuffers on the buffer lists of a compiled step
// and of an evaluation program: every buffer found by (role, index), with
// the optimizer state per tensor or sharded per bucket (ZeRO-1, random
// layouts in any order), and every mismatch named by its buffer, bucket or
// tensor.
//
// The seed is fresh on every run and printed with any failure;
// DFLASH_TEST_SEED=<n> repeats a run.
//
//===----------------------------------------------------------------------===//

#include "runtime/device/StepBuffers.h"
#include "runtime/device/OptimizerShards.h"
#include "schema/Parameters.h"
#include "schema/StepBuffers.h"
#include "test/unit/runtime/RuntimeTestSupport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::trainhost;

TEST(TrainBuffers, MapsEveryBuffer) {
  ModelConfig c = smallConfig();
  std::vector<BufferSpec> buffers = stepBuffers(c);
  StepBufferMap map;
  Status s = mapStepBuffers(buffers, c, nullptr, map);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(buffers[size_t(map.input(StepInput::InputIds))].name, "input_ids");
  EXPECT_EQ(buffers[size_t(map.frozenWeight(FrozenWeight::LmHead))].name,
            "lm_head");
  std::vector<ParamInfo> table = parameterTable(c);
  ASSERT_EQ(map.master.size(), table.size());
  for (size_t t = 0; t < table.size(); ++t) {
    EXPECT_EQ(buffers[size_t(map.master[t])].name, table[t].name);
    EXPECT_EQ(buffers[size_t(map.master[t])].role, BufferRole::Master);
    EXPECT_EQ(buffers[size_t(map.moment2[t])].role, BufferRole::Moment2);
  }
  EXPECT_EQ(map.metrics.size(), size_t(kNumStepMetrics));
  EXPECT_EQ(buffers[size_t(map.metric(StepMetric::GradNorm))].name,
            "grad_norm");
  EXPECT_EQ(buffers[size_t(map.metric(StepMetric::PositionCounts))].shape,
            (std::vector<int64_t>{c.blockSize}));

  c.tieWordEmbeddings = true;
  ASSERT_TRUE(mapStepBuffers(stepBuffers(c), c, nullptr, map).ok());
  EXPECT_EQ(map.frozenWeight(FrozenWeight::LmHead), -1);
}

// An evaluation program: the step's inputs, frozen weights and parameters,
// one metric per forward sum and the draft slots of each micro-batch,
// nothing else.
TEST(TrainBuffers, MapsAnEvaluationProgram) {
  ModelConfig c = smallConfig();
  std::vector<BufferSpec> buffers;
  for (const BufferSpec &b : stepBuffers(c))
    if (b.role == BufferRole::Input || b.role == BufferRole::Frozen ||
        b.role == BufferRole::Parameter)
      buffers.push_back(b);
  for (int k = 0; k < kNumForwardSums; ++k)
    buffers.push_back({nameOf(ForwardSum(k)), BufferRole::Metric, DType::F32,
                       shapeOf(ForwardSum(k), c), k});
  const std::vector<int64_t> slots = {c.rowsPerGpu,
                                      c.anchorsPerRow * c.blockSize};
  for (DraftSlots which : {DraftSlots::Hits, DraftSlots::Weights})
    buffers.push_back({nameOf(which), BufferRole::Metric, dtypeOf(which), slots,
                       draftSlotsIndex(which, 0)});
  EvalBufferMap map;
  Status s = mapEvalBuffers(buffers, c, map);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(buffers[size_t(map.sums[size_t(ForwardSum::RunSum)])].name,
            "run_sum");
  ASSERT_EQ(map.draftSlots.size(), 1u);
  EXPECT_EQ(
      buffers[size_t(map.draftSlots[0][size_t(DraftSlots::Weights)])].name,
      "draft_weights");
  EXPECT_EQ(buffers[size_t(map.param.back())].role, BufferRole::Parameter);
  auto expectError = [&](std::vector<BufferSpec> list,
                         const std::string &message) {
    EvalBufferMap m;
    Status status = mapEvalBuffers(list, c, m);
    ASSERT_FALSE(status.ok()) << message;
    EXPECT_NE(status.message().find(message), std::string::npos)
        << status.message() << "\nexpected: " << message;
  };
  // A step's buffers are not an evaluation program's.
  expectError(stepBuffers(c), "evaluation program: master buffer");
  auto noSum = buffers;
  noSum.erase(noSum.begin() + map.sums[size_t(ForwardSum::BucketCounts)]);
  expectError(noSum, "evaluation program: has no metric buffer "
                     "'bucket_counts'");
  auto noSlots = buffers;
  noSlots.pop_back();
  expectError(noSlots, "has no metric buffer 'draft_weights' of micro-batch 0");
  auto wideHits = buffers;
  wideHits[size_t(map.draftSlots[0][0])].shape = {c.rowsPerStep() + 1,
                                                  slots[1]};
  expectError(wideHits, "metric buffer 'draft_hits' has shape");
  // A second micro-batch's slots where the config has one.
  auto extra = buffers;
  extra.push_back({"draft_hits", BufferRole::Metric, DType::U8, slots,
                   draftSlotsIndex(DraftSlots::Hits, 1)});
  expectError(extra, "which is not a forward sum, a micro-batch's draft "
                     "slots or an objective part");
  // A "covered" objective's two parts, after the slots; both or neither.
  auto parts = buffers;
  for (ObjectivePart which :
       {ObjectivePart::UnarySum, ObjectivePart::CoveredWeight})
    parts.push_back({nameOf(which),
                     BufferRole::Metric,
                     DType::F32,
                     {},
                     objectivePartIndex(which, 1)});
  EvalBufferMap partMap;
  s = mapEvalBuffers(parts, c, partMap);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(size_t(partMap.objectiveParts[1]), buffers.size() + 1);
  EXPECT_EQ(parts[size_t(partMap.objectiveParts[0])].name, "unary_sum");
  EXPECT_EQ(map.objectiveParts[0], -1);
  auto onePart = parts;
  onePart.pop_back();
  expectError(onePart, "has no metric buffer 'covered_weight' beside the "
                       "other objective part");
  auto swapped = parts;
  std::swap(swapped[swapped.size() - 1].index,
            swapped[swapped.size() - 2].index);
  expectError(swapped, "metric buffer 'unary_sum' has index 15, which is not "
                       "a forward sum");
  auto noParam = buffers;
  noParam.erase(
      std::find_if(noParam.begin(), noParam.end(), [](const BufferSpec &b) {
        return b.role == BufferRole::Parameter;
      }));
  expectError(noParam, "evaluation program: has no parameter buffer for");
  auto scalarHits = buffers;
  scalarHits[size_t(map.sums[size_t(ForwardSum::PositionHits)])].shape = {};
  expectError(scalarHits, "metric buffer 'position_hits' has shape []");
  // One per anchor-position bucket of the config (here 3).
  c.positionBuckets = {8, 16};
  auto buckets = buffers;
  for (BufferSpec &b : buckets)
    if (b.role == BufferRole::Metric && b.index < kNumForwardSums)
      b.shape = shapeOf(ForwardSum(b.index), c);
  EvalBufferMap bucketMap;
  s = mapEvalBuffers(buckets, c, bucketMap);
  EXPECT_TRUE(s.ok()) << s.message();
  expectError(buffers, "metric buffer 'bucket_runs' has shape [1]");
}

TEST(TrainBuffers, MismatchesNameTheBuffer) {
  ModelConfig c = smallConfig();
  auto expectError = [&](std::vector<BufferSpec> buffers,
                         const std::string &message) {
    StepBufferMap map;
    Status s = mapStepBuffers(buffers, c, nullptr, map);
    ASSERT_FALSE(s.ok()) << message;
    EXPECT_NE(s.message().find(message), std::string::npos)
        << s.message() << "\nexpected: " << message;
  };
  std::vector<BufferSpec> buffers = stepBuffers(c);
  auto find = [&](std::vector<BufferSpec> &list, const std::string &name,
                  BufferRole role) -> BufferSpec & {
    for (BufferSpec &b : list)
      if (b.name == name && b.role == role)
        return b;
    return list.front();
  };

  auto noMaster = buffers;
  noMaster.erase(
      std::find_if(noMaster.begin(), noMaster.end(), [](const BufferSpec &b) {
        return b.name == "fc.weight" && b.role == BufferRole::Master;
      }));
  expectError(noMaster, "step program: has no master buffer for 'fc.weight'");
  auto badShape = buffers;
  find(badShape, "target_hidden", BufferRole::Input).shape = {2, 32, 16};
  expectError(badShape, "step program: input buffer 'target_hidden' has "
                        "shape [2, 32, 16] but the config needs [2, 32, 32]");
  auto badDtype = buffers;
  find(badDtype, "norm.weight", BufferRole::Parameter).dtype = DType::F32;
  expectError(badDtype, "parameter buffer 'norm.weight' has dtype F32 but "
                        "the runtime needs BF16");
  auto unknown = buffers;
  unknown.push_back({"extra", BufferRole::Input, DType::I32, {2}, 9});
  expectError(unknown,
              "input buffer 'extra' has index 9, which is not a step input");
  auto noLmHead = buffers;
  noLmHead.erase(
      std::find_if(noLmHead.begin(), noLmHead.end(), [](const BufferSpec &b) {
        return b.role == BufferRole::Frozen && b.name == "lm_head";
      }));
  expectError(noLmHead, "has no frozen buffer 'lm_head'");
  auto noLoss = buffers;
  // A metric the runtime only reports (index -1) is not the loss.
  find(noLoss, "loss", BufferRole::Metric).index = -1;
  expectError(noLoss, "has no metric buffer 'loss'");
  auto twice = buffers;
  twice.push_back(twice.front());
  expectError(twice, "input buffer 'input_ids' appears twice");
  auto vectorCounter = buffers;
  find(vectorCounter, "step", BufferRole::Counter).shape = {2};
  expectError(vectorCounter, "counter buffer 'step' has shape [2] but must "
                             "be a scalar");
  auto scalarPositions = buffers;
  find(scalarPositions, "position_hits", BufferRole::Metric).shape = {};
  expectError(scalarPositions, "metric buffer 'position_hits' has shape []");
}

TEST(TrainBuffers, MapsShardedBuffers) {
  const uint64_t seed = testSeed();
  SCOPED_TRACE("DFLASH_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  ModelConfig c = smallConfig();
  std::vector<ParamInfo> table = parameterTable(c);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t aligns[] = {1, 8, 64, 256};
    OptimizerShardLayout layout =
        shardLayout(c, uniform(1, 8), size_t(uniform(1, int64_t(table.size()))),
                    aligns[uniform(0, 3)], uniform(0, 1) * uniform(1, 500));
    SCOPED_TRACE("world " + std::to_string(layout.worldSize) + ", " +
                 std::to_string(layout.buckets.size()) + " buckets");
    std::vector<BufferSpec> buffers = shardedStepBuffers(c, layout);
    // The buffers in any order.
    std::shuffle(buffers.begin(), buffers.end(), rng);
    StepBufferMap map;
    Status s = mapStepBuffers(buffers, c, &layout, map);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_TRUE(map.sharded);
    EXPECT_TRUE(map.master.empty());
    EXPECT_TRUE(map.moment1.empty());
    EXPECT_TRUE(map.moment2.empty());
    ASSERT_EQ(map.param.size(), table.size());
    for (size_t t = 0; t < table.size(); ++t) {
      EXPECT_EQ(buffers[size_t(map.param[t])].name, table[t].name);
      EXPECT_EQ(buffers[size_t(map.param[t])].role, BufferRole::Parameter);
    }
    const size_t K = layout.buckets.size();
    ASSERT_EQ(map.shardMaster.size(), K);
    ASSERT_EQ(map.shardMoment1.size(), K);
    ASSERT_EQ(map.shardMoment2.size(), K);
    ASSERT_EQ(map.shardTensors.size(), K);
    for (size_t k = 0; k < K; ++k) {
      const std::pair<int, BufferRole> slots[] = {
          {map.shardMaster[k], BufferRole::Master},
          {map.shardMoment1[k], BufferRole::Moment1},
          {map.shardMoment2[k], BufferRole::Moment2}};
      for (const auto &[index, role] : slots) {
        const BufferSpec &b = buffers[size_t(index)];
        EXPECT_EQ(b.name, "bucket." + std::to_string(k));
        EXPECT_EQ(b.role, role);
        EXPECT_EQ(b.shape,
                  std::vector<int64_t>{layout.buckets[k].shardElements});
      }
      ASSERT_EQ(map.shardTensors[k].size(), layout.buckets[k].tensors.size());
      for (size_t j = 0; j < map.shardTensors[k].size(); ++j)
        EXPECT_EQ(table[map.shardTensors[k][j]].name,
                  layout.buckets[k].tensors[j].name);
    }
  }
  // Unsharded, nothing of the above.
  StepBufferMap plain;
  ASSERT_TRUE(mapStepBuffers(stepBuffers(c), c, nullptr, plain).ok());
  EXPECT_FALSE(plain.sharded);
  EXPECT_TRUE(plain.shardMaster.empty());
  EXPECT_EQ(plain.master.size(), table.size());
}

TEST(TrainBuffers, ShardedMismatchesNameTheBucketOrTensor) {
  ModelConfig c = smallConfig();
  OptimizerShardLayout layout = shardLayout(c, 4, 3, 64);
  std::vector<BufferSpec> buffers = shardedStepBuffers(c, layout);
  auto expectError = [&](const std::vector<BufferSpec> &list,
                         const OptimizerShardLayout *shards,
                         const std::string &message) {
    StepBufferMap map;
    Status s = mapStepBuffers(list, c, shards, map);
    ASSERT_FALSE(s.ok()) << message;
    EXPECT_NE(s.message().find(message), std::string::npos)
        << s.message() << "\nexpected: " << message;
  };
  auto find = [](std::vector<BufferSpec> &list, const std::string &name,
                 BufferRole role) -> BufferSpec & {
    for (BufferSpec &b : list)
      if (b.name == name && b.role == role)
        return b;
    return list.front();
  };
  const std::string first = layout.buckets[0].tensors[0].name;
  const std::string last = layout.buckets[2].tensors.back().name;

  // Per-tensor state in a sharded step.
  auto perTensor = buffers;
  perTensor.push_back({first, BufferRole::Master, DType::F32,
                       parameterTable(c)[0].shape, int64_t(3 + 5)});
  expectError(perTensor, &layout,
              "step program: master buffer '" + first +
                  "' has index 8, which is not a bucket of the optimizer "
                  "shard layout");
  // A bucket the layout does not have.
  auto extra = buffers;
  extra.push_back({"bucket.3", BufferRole::Moment1, DType::F32, {64}, 3});
  expectError(extra, &layout,
              "moment1 buffer 'bucket.3' has index 3, which is not a bucket");
  // A missing shard.
  auto missing = buffers;
  missing.erase(
      std::find_if(missing.begin(), missing.end(), [](const BufferSpec &b) {
        return b.name == "bucket.1" && b.role == BufferRole::Moment2;
      }));
  expectError(missing, &layout,
              "step program: has no moment2 buffer 'bucket.1' for bucket 1");
  // A shard of the wrong size or type.
  const int64_t S = layout.buckets[2].shardElements;
  auto wrongSize = buffers;
  find(wrongSize, "bucket.2", BufferRole::Master).shape = {S + 1};
  expectError(wrongSize, &layout,
              "master buffer 'bucket.2' has shape [" + std::to_string(S + 1) +
                  "] but the config needs [" + std::to_string(S) + "]");
  auto wrongType = buffers;
  find(wrongType, "bucket.0", BufferRole::Moment1).dtype = DType::BF16;
  expectError(wrongType, &layout,
              "moment1 buffer 'bucket.0' has dtype BF16 but the runtime "
              "needs F32");
  // Shards without a layout: bucket 0's state is read as fc.weight's.
  expectError(buffers, nullptr,
              "master buffer 'bucket.0' has shape [" +
                  std::to_string(layout.buckets[0].shardElements) +
                  "] but the config needs [" +
                  std::to_string(parameterTable(c)[0].shape[0]) + ", " +
                  std::to_string(parameterTable(c)[0].shape[1]) + "]");

  // Layouts that do not fit the config.
  OptimizerShardLayout unknown = layout;
  unknown.buckets[1].tensors[0].name = "layers.7.mlp.up_proj.weight";
  unknown.buckets[1].tensors[0].param = 99;
  expectError(buffers, &unknown,
              "step program: optimizer shard layout, bucket 1: "
              "'layers.7.mlp.up_proj.weight' (index 99) is not a trainable "
              "tensor of the config");
  OptimizerShardLayout twice = layout;
  twice.buckets[2].tensors.back().name = first;
  twice.buckets[2].tensors.back().param = 0;
  expectError(buffers, &twice,
              "optimizer shard layout, bucket 2: tensor '" + first +
                  "' is already in bucket 0");
  OptimizerShardLayout resized = layout;
  resized.buckets[2].tensors.back().numel -= 1;
  expectError(buffers, &resized,
              "optimizer shard layout, bucket 2: tensor '" + last + "' has " +
                  std::to_string(layout.buckets[2].tensors.back().numel - 1) +
                  " elements but the config gives it " +
                  std::to_string(layout.buckets[2].tensors.back().numel));
  OptimizerShardLayout dropped = layout;
  dropped.buckets[2].tensors.pop_back();
  expectError(buffers, &dropped,
              "step program: the optimizer shard layout has no bucket for '" +
                  last + "'");
  OptimizerShardLayout broken = layout;
  broken.buckets[1].shardElements = 0;
  expectError(buffers, &broken,
              "step program: optimizer shard layout, bucket 1: shards of 0 "
              "elements");
}

// A target program's buffers: tokens in, weights by checkpoint name,
// target_hidden out, and each sparse layer's expert ids (I32 metrics);
// anything else is named.
TEST(TrainBuffers, MapsATargetProgram) {
  const int64_t B = 2, S = 8;
  std::vector<BufferSpec> buffers = {
      {"input_ids", BufferRole::Input, DType::I32, {B, S}, 0},
      {"position_ids", BufferRole::Input, DType::I32, {B, S}, 5},
      {"model.embed_tokens.weight",
       BufferRole::Frozen,
       DType::BF16,
       {64, 16},
       -1},
      {"target_hidden", BufferRole::Input, DType::BF16, {B, S, 32}, 2},
      {"model.layers.1.mlp.expert_ids",
       BufferRole::Metric,
       DType::I32,
       {B * S, 2},
       -1},
      {"model.layers.3.mlp.expert_ids",
       BufferRole::Metric,
       DType::I32,
       {B * S, 2},
       -1}};
  TargetBufferMap map;
  Status s = mapTargetBuffers(buffers, map);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ((std::vector<int>{map.inputIds, map.positionIds, map.features}),
            (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(map.frozen, std::vector<int>{2});
  EXPECT_EQ(map.expertIds, (std::vector<int>{4, 5}));

  // Expert ids must be I32 [B*S, k] under their name; a float metric is
  // not one.
  for (BufferSpec wrong : {BufferSpec{"model.layers.1.mlp.expert_ids",
                                      BufferRole::Metric,
                                      DType::F32,
                                      {B * S, 2},
                                      -1},
                           BufferSpec{"model.layers.1.mlp.router",
                                      BufferRole::Metric,
                                      DType::I32,
                                      {B * S, 2},
                                      -1}}) {
    std::vector<BufferSpec> bad = buffers;
    bad[4] = wrong;
    s = mapTargetBuffers(bad, map);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("unexpected buffer '" + wrong.name + "'"),
              std::string::npos)
        << s.message();
  }
}
