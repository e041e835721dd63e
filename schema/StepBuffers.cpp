//===- StepBuffers.cpp - The persistent buffers of a compiled step --------===//

#include "schema/StepBuffers.h"

using namespace dflash;

namespace {
constexpr const char *kRoleNames[kNumBufferRoles] = {
    "input",   "frozen",  "parameter", "master",
    "moment1", "moment2", "counter",   "metric"};
constexpr const char *kRoleEnumerators[kNumBufferRoles] = {
    "Input",   "Frozen",  "Parameter", "Master",
    "Moment1", "Moment2", "Counter",   "Metric"};
constexpr const char *kInputNames[kNumStepInputs] = {
    "input_ids", "loss_mask", "target_hidden",
    "anchors",   "keep",      "position_ids"};
constexpr DType kInputDTypes[kNumStepInputs] = {
    DType::I32, DType::U8, DType::BF16, DType::I32, DType::U8, DType::I32};
constexpr const char *kFrozenNames[kNumFrozenWeights] = {"embed", "lm_head"};
constexpr const char *kCounterNames[kNumStepCounters] = {"step", "total_steps"};
constexpr const char *kMetricNames[kNumStepMetrics] = {
    "loss",          "acc",           "grad_norm",       "lr",
    "tau",           "position_hits", "position_counts", "bucket_runs",
    "bucket_blocks", "bucket_hits",   "bucket_counts"};
constexpr const char *kForwardSumNames[kNumForwardSums] = {
    "loss_sum",    "weight_sum",    "correct",       "count",
    "run_sum",     "kept_blocks",   "position_hits", "position_counts",
    "bucket_runs", "bucket_blocks", "bucket_hits",   "bucket_counts"};
constexpr const char *kDraftSlotsNames[kNumDraftSlots] = {"draft_hits",
                                                          "draft_weights"};
constexpr const char *kObjectivePartNames[kNumObjectiveParts] = {
    "unary_sum", "covered_weight"};

template <class E, size_t N>
std::optional<E> parse(const char *const (&names)[N], std::string_view name) {
  for (size_t i = 0; i < N; ++i)
    if (name == names[i])
      return E(i);
  return std::nullopt;
}
} // namespace

const char *dflash::nameOf(BufferRole role) { return kRoleNames[int(role)]; }
const char *dflash::enumeratorOf(BufferRole role) {
  return kRoleEnumerators[int(role)];
}
const char *dflash::nameOf(StepInput input) { return kInputNames[int(input)]; }
const char *dflash::nameOf(FrozenWeight weight) {
  return kFrozenNames[int(weight)];
}
const char *dflash::nameOf(StepCounter counter) {
  return kCounterNames[int(counter)];
}
const char *dflash::nameOf(StepMetric metric) {
  return kMetricNames[int(metric)];
}

const char *dflash::nameOf(ForwardSum sum) {
  return kForwardSumNames[int(sum)];
}
const char *dflash::nameOf(DraftSlots slots) {
  return kDraftSlotsNames[int(slots)];
}
const char *dflash::nameOf(ObjectivePart part) {
  return kObjectivePartNames[int(part)];
}
DType dflash::dtypeOf(DraftSlots slots) {
  return slots == DraftSlots::Hits ? DType::U8 : DType::F32;
}
bool dflash::isPerPosition(StepMetric metric) {
  return metric == StepMetric::PositionHits ||
         metric == StepMetric::PositionCounts;
}
bool dflash::isPerPosition(ForwardSum sum) {
  return sum == ForwardSum::PositionHits || sum == ForwardSum::PositionCounts;
}
bool dflash::isPerBucket(StepMetric metric) {
  return metric >= StepMetric::BucketRuns;
}
bool dflash::isPerBucket(ForwardSum sum) {
  return sum >= ForwardSum::BucketRuns;
}
std::vector<int64_t> dflash::shapeOf(StepMetric metric, const ModelConfig &c) {
  if (isPerPosition(metric))
    return {c.blockSize};
  if (isPerBucket(metric))
    return {c.numPositionBuckets()};
  return {};
}
std::vector<int64_t> dflash::shapeOf(ForwardSum sum, const ModelConfig &c) {
  if (isPerPosition(sum))
    return {c.blockSize};
  if (isPerBucket(sum))
    return {c.numPositionBuckets()};
  return {};
}

std::optional<BufferRole> dflash::parseBufferRole(std::string_view name) {
  return parse<BufferRole>(kRoleNames, name);
}
std::optional<StepInput> dflash::parseStepInput(std::string_view name) {
  return parse<StepInput>(kInputNames, name);
}
std::optional<FrozenWeight> dflash::parseFrozenWeight(std::string_view name) {
  return parse<FrozenWeight>(kFrozenNames, name);
}
std::optional<StepCounter> dflash::parseStepCounter(std::string_view name) {
  return parse<StepCounter>(kCounterNames, name);
}
std::optional<StepMetric> dflash::parseStepMetric(std::string_view name) {
  return parse<StepMetric>(kMetricNames, name);
}

std::optional<ForwardSum> dflash::parseForwardSum(std::string_view name) {
  return parse<ForwardSum>(kForwardSumNames, name);
}

std::optional<DraftSlots> dflash::parseDraftSlots(std::string_view name) {
  return parse<DraftSlots>(kDraftSlotsNames, name);
}

std::optional<ObjectivePart> dflash::parseObjectivePart(std::string_view name) {
  return parse<ObjectivePart>(kObjectivePartNames, name);
}

DType dflash::dtypeOf(StepInput input) { return kInputDTypes[int(input)]; }

std::vector<int64_t> dflash::shapeOf(StepInput input, const ModelConfig &c) {
  const int64_t B = c.rowsPerStep(), S = c.seqLen, N = c.anchorsPerRow;
  switch (input) {
  case StepInput::InputIds:
  case StepInput::LossMask:
  case StepInput::PositionIds:
    return {B, S};
  case StepInput::TargetHidden:
    return {B, S, c.contextWidth()};
  case StepInput::Anchors:
  case StepInput::Keep:
    return {B, N};
  }
  return {};
}

std::string dflash::shardBufferName(size_t bucket) {
  return "bucket." + std::to_string(bucket);
}
