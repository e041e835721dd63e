//===- StepBuffers.cpp - A step program's buffers, bound by role ----------===//

#include "runtime/device/StepBuffers.h"

#include "schema/Parameters.h"

#include <map>
#include <string>

using namespace dflash;
using namespace dflash::rt;

namespace {
/// Checks buffers one at a time against what the runtime fills or reads.
class BufferChecker {
public:
  BufferChecker(const std::vector<BufferSpec> &buffers, const char *program)
      : buffers(buffers), program(program) {}

  std::string describe(int index) const {
    const BufferSpec &b = buffers[size_t(index)];
    return std::string(program) + ": " + nameOf(b.role) + " buffer '" + b.name +
           "'";
  }

  /// Puts `index` into `slot` after checking its dtype (one of `dtypes`)
  /// and shape.
  Status claim(int index, int &slot, std::initializer_list<DType> dtypes,
               const std::vector<int64_t> &shape) const {
    const BufferSpec &b = buffers[size_t(index)];
    if (slot != -1)
      return Status::error(describe(index) + " appears twice");
    bool dtypeOk = false;
    std::string expected;
    for (DType d : dtypes) {
      dtypeOk |= b.dtype == d;
      expected += std::string(expected.empty() ? "" : " or ") + dtypeName(d);
    }
    if (!dtypeOk)
      return Status::error(describe(index) + " has dtype " +
                           dtypeName(b.dtype) + " but the runtime needs " +
                           expected);
    if (b.shape != shape)
      return Status::error(describe(index) + " has shape " +
                           shapeString(b.shape) + " but the config needs " +
                           shapeString(shape));
    slot = index;
    return Status::success();
  }

  /// A scalar: any shape of one element.
  Status claimScalar(int index, int &slot, DType dtype) const {
    const BufferSpec &b = buffers[size_t(index)];
    if (shapeNumel(b.shape) != 1)
      return Status::error(describe(index) + " has shape " +
                           shapeString(b.shape) + " but must be a scalar");
    return claim(index, slot, {dtype}, b.shape);
  }

  /// The buffer's index within its role, if it is below `count`.
  Status member(int index, int64_t count, const char *what) const {
    int64_t i = buffers[size_t(index)].index;
    if (i < 0 || i >= count)
      return Status::error(describe(index) + " has index " + std::to_string(i) +
                           ", which is not " + what);
    return Status::success();
  }

private:
  const std::vector<BufferSpec> &buffers;
  const char *program; ///< "step program", for messages
};

/// The buffers a step and an evaluation program share: a step input, a
/// frozen weight or a parameter, checked against the config.
Status claimDataBuffer(const BufferChecker &check, int i, const BufferSpec &b,
                       const ModelConfig &c,
                       const std::vector<ParamInfo> &table,
                       std::array<int, kNumStepInputs> &inputs,
                       std::array<int, kNumFrozenWeights> &frozen,
                       std::vector<int> &param) {
  switch (b.role) {
  case BufferRole::Input: {
    DFLASH_RETURN_IF_ERROR(check.member(i, kNumStepInputs, "a step input"));
    StepInput input = StepInput(b.index);
    std::initializer_list<DType> flag = {DType::U8, DType::BOOL};
    std::initializer_list<DType> exact = {dtypeOf(input)};
    return check.claim(i, inputs[size_t(b.index)],
                       dtypeOf(input) == DType::U8 ? flag : exact,
                       shapeOf(input, c));
  }
  case BufferRole::Frozen:
    DFLASH_RETURN_IF_ERROR(
        check.member(i, kNumFrozenWeights, "a frozen weight"));
    return check.claim(i, frozen[size_t(b.index)], {DType::BF16},
                       {c.vocabSize, c.hiddenSize});
  case BufferRole::Parameter:
    DFLASH_RETURN_IF_ERROR(check.member(i, int64_t(table.size()),
                                        "a trainable tensor of "
                                        "the config"));
    return check.claim(i, param[size_t(b.index)], {DType::BF16},
                       table[size_t(b.index)].shape);
  default:
    return Status::error(check.describe(i) + " is not a step input, frozen "
                                             "weight or parameter");
  }
}

/// Every step input, the frozen weights the config needs and every
/// parameter were found.
Status checkDataBuffers(const char *program, const ModelConfig &c,
                        const std::vector<ParamInfo> &table,
                        const std::array<int, kNumStepInputs> &inputs,
                        const std::array<int, kNumFrozenWeights> &frozen,
                        const std::vector<int> &param) {
  const std::string p = program;
  for (int k = 0; k < kNumStepInputs; ++k)
    if (inputs[size_t(k)] < 0)
      return Status::error(p + ": has no input buffer '" +
                           nameOf(StepInput(k)) + "'");
  if (frozen[size_t(FrozenWeight::Embed)] < 0)
    return Status::error(p + ": has no frozen buffer 'embed'");
  if (!c.tieWordEmbeddings && frozen[size_t(FrozenWeight::LmHead)] < 0)
    return Status::error(p + ": has no frozen buffer 'lm_head' but the "
                             "target does not tie it to the embedding");
  for (size_t t = 0; t < table.size(); ++t)
    if (param[t] < 0)
      return Status::error(p + ": has no parameter buffer for '" +
                           table[t].name + "'");
  return Status::success();
}
} // namespace

/// Checks a shard layout against the trainable tensors and records, per
/// bucket, which tensor of `table` each of its entries is.
static Status mapShardLayout(const OptimizerShardLayout &layout,
                             const std::vector<ParamInfo> &table,
                             StepBufferMap &m) {
  if (Status s = checkShardLayout(layout); !s.ok())
    return Status::error("step program: " + s.message());
  std::vector<int64_t> bucketOf(table.size(), -1);
  m.shardTensors.assign(layout.buckets.size(), {});
  for (size_t k = 0; k < layout.buckets.size(); ++k) {
    const std::string where =
        "step program: optimizer shard layout, bucket " + std::to_string(k);
    for (const ShardedTensor &tensor : layout.buckets[k].tensors) {
      if (tensor.param < 0 || tensor.param >= int64_t(table.size()))
        return Status::error(where + ": '" + tensor.name + "' (index " +
                             std::to_string(tensor.param) +
                             ") is not a trainable tensor of the config");
      size_t t = size_t(tensor.param);
      if (bucketOf[t] >= 0)
        return Status::error(where + ": tensor '" + tensor.name +
                             "' is already in bucket " +
                             std::to_string(bucketOf[t]));
      if (tensor.numel != table[t].numel())
        return Status::error(where + ": tensor '" + tensor.name + "' has " +
                             std::to_string(tensor.numel) +
                             " elements but the config gives it " +
                             std::to_string(table[t].numel()));
      bucketOf[t] = int64_t(k);
      m.shardTensors[k].push_back(t);
    }
  }
  for (size_t t = 0; t < table.size(); ++t)
    if (bucketOf[t] < 0)
      return Status::error("step program: the optimizer shard layout has no "
                           "bucket for '" +
                           table[t].name + "'");
  m.sharded = true;
  for (std::vector<int> *v : {&m.shardMaster, &m.shardMoment1, &m.shardMoment2})
    v->assign(layout.buckets.size(), -1);
  return Status::success();
}

Status dflash::rt::mapStepBuffers(const std::vector<BufferSpec> &buffers,
                                  const ModelConfig &c,
                                  const OptimizerShardLayout *shards,
                                  StepBufferMap &map) {
  StepBufferMap m;
  BufferChecker check(buffers, "step program");
  std::vector<ParamInfo> table = parameterTable(c);
  for (std::vector<int> *v : {&m.param, &m.master, &m.moment1, &m.moment2})
    v->assign(table.size(), -1);
  m.inputs.fill(-1);
  m.frozen.fill(-1);
  m.counters.fill(-1);
  m.namedMetrics.fill(-1);
  if (shards)
    DFLASH_RETURN_IF_ERROR(mapShardLayout(*shards, table, m));

  for (int i = 0; i < int(buffers.size()); ++i) {
    const BufferSpec &b = buffers[size_t(i)];
    Status status;
    switch (b.role) {
    case BufferRole::Input:
    case BufferRole::Frozen:
      status =
          claimDataBuffer(check, i, b, c, table, m.inputs, m.frozen, m.param);
      break;
    case BufferRole::Master:
    case BufferRole::Moment1:
    case BufferRole::Moment2:
      if (m.sharded) {
        status = check.member(
            i, int64_t(shards->buckets.size()),
            ("a bucket of the optimizer shard layout: the step shards its "
             "optimizer state into " +
             std::to_string(shards->buckets.size()) +
             " buckets ('bucket.<k>'), with no per-tensor state")
                .c_str());
        if (!status.ok())
          break;
        size_t k = size_t(b.index);
        std::vector<int> &slots = b.role == BufferRole::Master ? m.shardMaster
                                  : b.role == BufferRole::Moment1
                                      ? m.shardMoment1
                                      : m.shardMoment2;
        status = check.claim(i, slots[k], {DType::F32},
                             {shards->buckets[k].shardElements});
        break;
      }
      [[fallthrough]];
    case BufferRole::Parameter: {
      status = check.member(i, int64_t(table.size()),
                            "a trainable tensor of the config");
      if (!status.ok())
        break;
      size_t t = size_t(b.index);
      std::vector<int> &slots = b.role == BufferRole::Parameter ? m.param
                                : b.role == BufferRole::Master  ? m.master
                                : b.role == BufferRole::Moment1 ? m.moment1
                                                                : m.moment2;
      DType dtype = b.role == BufferRole::Parameter ? DType::BF16 : DType::F32;
      status = check.claim(i, slots[t], {dtype}, table[t].shape);
      break;
    }
    case BufferRole::Counter:
      status = check.member(i, kNumStepCounters, "a step counter");
      if (status.ok())
        status = check.claimScalar(i, m.counters[size_t(b.index)], DType::I32);
      break;
    case BufferRole::Metric: {
      if (b.dtype != DType::F32 || shapeNumel(b.shape) < 1) {
        status = Status::error(check.describe(i) + " has dtype " +
                               dtypeName(b.dtype) + " and shape " +
                               shapeString(b.shape) +
                               " but metrics are F32 with at least one "
                               "element");
        break;
      }
      m.metrics.push_back(i);
      // Metrics past the named ones are reported, not interpreted.
      if (b.index >= 0) {
        status = check.member(i, kNumStepMetrics, "a step metric");
        std::vector<int64_t> shape = status.ok()
                                         ? shapeOf(StepMetric(b.index), c)
                                         : std::vector<int64_t>{};
        if (status.ok() && !shape.empty())
          status = check.claim(i, m.namedMetrics[size_t(b.index)], {DType::F32},
                               shape);
        else if (status.ok())
          status =
              check.claimScalar(i, m.namedMetrics[size_t(b.index)], DType::F32);
      }
      break;
    }
    }
    if (!status.ok())
      return status;
  }

  DFLASH_RETURN_IF_ERROR(
      checkDataBuffers("step program", c, table, m.inputs, m.frozen, m.param));
  for (int k = 0; k < kNumStepCounters; ++k)
    if (m.counters[size_t(k)] < 0)
      return Status::error("step program: has no counter buffer '" +
                           std::string(nameOf(StepCounter(k))) + "'");
  for (int k = 0; k < kNumStepMetrics; ++k)
    if (m.namedMetrics[size_t(k)] < 0)
      return Status::error("step program: has no metric buffer '" +
                           std::string(nameOf(StepMetric(k))) + "'");
  const BufferRole perTensor[] = {BufferRole::Parameter, BufferRole::Master,
                                  BufferRole::Moment1, BufferRole::Moment2};
  // Sharded: the parameters per tensor, the state per bucket.
  const int perTensorRoles = m.sharded ? 1 : 4;
  const std::vector<int> *lists[] = {&m.param, &m.master, &m.moment1,
                                     &m.moment2};
  for (int r = 0; r < perTensorRoles; ++r)
    for (size_t t = 0; t < table.size(); ++t)
      if ((*lists[r])[t] < 0)
        return Status::error("step program: has no " +
                             std::string(nameOf(perTensor[r])) +
                             " buffer for '" + table[t].name + "'");
  if (m.sharded) {
    const std::vector<int> *shardLists[] = {&m.shardMaster, &m.shardMoment1,
                                            &m.shardMoment2};
    for (int r = 0; r < 3; ++r)
      for (size_t k = 0; k < shardLists[r]->size(); ++k)
        if ((*shardLists[r])[k] < 0)
          return Status::error(
              "step program: has no " + std::string(nameOf(perTensor[1 + r])) +
              " buffer '" + shardBufferName(k) + "' for bucket " +
              std::to_string(k) + " of its optimizer shard layout");
    m.master.clear();
    m.moment1.clear();
    m.moment2.clear();
  }
  map = std::move(m);
  return Status::success();
}

Status dflash::rt::mapEvalBuffers(const std::vector<BufferSpec> &buffers,
                                  const ModelConfig &c, EvalBufferMap &map) {
  EvalBufferMap m;
  BufferChecker check(buffers, "evaluation program");
  std::vector<ParamInfo> table = parameterTable(c);
  m.param.assign(table.size(), -1);
  m.inputs.fill(-1);
  m.frozen.fill(-1);
  m.sums.fill(-1);
  const int64_t microBatches = c.gradientAccumulation;
  std::array<int, kNumDraftSlots> none;
  none.fill(-1);
  m.draftSlots.assign(size_t(microBatches), none);
  m.objectiveParts.fill(-1);
  const int64_t firstPart =
      objectivePartIndex(ObjectivePart::UnarySum, microBatches);
  for (int i = 0; i < int(buffers.size()); ++i) {
    const BufferSpec &b = buffers[size_t(i)];
    Status status;
    if (b.role == BufferRole::Metric && b.index >= firstPart) {
      // Past the draft slots: only an objective part, at its own index.
      std::optional<ObjectivePart> part = parseObjectivePart(b.name);
      status = check.member(
          i, part ? objectivePartIndex(*part, microBatches) + 1 : firstPart,
          "a forward sum, a micro-batch's draft slots or an objective part");
      if (status.ok())
        status = check.claimScalar(
            i, m.objectiveParts[size_t(b.index - firstPart)], DType::F32);
    } else if (b.role == BufferRole::Metric && b.index >= kNumForwardSums) {
      status = check.member(i, kNumForwardSums + microBatches * kNumDraftSlots,
                            "a forward sum or a micro-batch's draft slots");
      const int64_t k = b.index - kNumForwardSums;
      const DraftSlots which = DraftSlots(k % kNumDraftSlots);
      std::initializer_list<DType> flag = {DType::U8, DType::BOOL};
      std::initializer_list<DType> exact = {dtypeOf(which)};
      if (status.ok())
        status = check.claim(
            i, m.draftSlots[size_t(k / kNumDraftSlots)][size_t(which)],
            which == DraftSlots::Hits ? flag : exact,
            {c.rowsPerGpu, c.anchorsPerRow * c.blockSize});
    } else if (b.role == BufferRole::Metric) {
      status = check.member(i, kNumForwardSums, "a forward sum");
      std::vector<int64_t> shape = status.ok() ? shapeOf(ForwardSum(b.index), c)
                                               : std::vector<int64_t>{};
      if (status.ok() && !shape.empty())
        status = check.claim(i, m.sums[size_t(b.index)], {DType::F32}, shape);
      else if (status.ok())
        status = check.claimScalar(i, m.sums[size_t(b.index)], DType::F32);
    } else {
      status =
          claimDataBuffer(check, i, b, c, table, m.inputs, m.frozen, m.param);
    }
    if (!status.ok())
      return status;
  }
  DFLASH_RETURN_IF_ERROR(checkDataBuffers("evaluation program", c, table,
                                          m.inputs, m.frozen, m.param));
  for (int k = 0; k < kNumForwardSums; ++k)
    if (m.sums[size_t(k)] < 0)
      return Status::error("evaluation program: has no metric buffer '" +
                           std::string(nameOf(ForwardSum(k))) + "'");
  for (int64_t mb = 0; mb < microBatches; ++mb)
    for (int k = 0; k < kNumDraftSlots; ++k)
      if (m.draftSlots[size_t(mb)][size_t(k)] < 0)
        return Status::error("evaluation program: has no metric buffer '" +
                             std::string(nameOf(DraftSlots(k))) +
                             "' of micro-batch " + std::to_string(mb) +
                             " (compiled by an older dflashc? compile "
                             "the trainer again)");
  const bool anyPart = m.objectiveParts[0] >= 0 || m.objectiveParts[1] >= 0;
  for (int k = 0; anyPart && k < kNumObjectiveParts; ++k)
    if (m.objectiveParts[size_t(k)] < 0)
      return Status::error("evaluation program: has no metric buffer '" +
                           std::string(nameOf(ObjectivePart(k))) +
                           "' beside the other objective part");
  map = std::move(m);
  return Status::success();
}

StepHyper dflash::rt::stepHyperFor(const ModelConfig &c, double lr,
                                   double warmupRatio) {
  StepHyper hyper;
  hyper.lr = float(lr);
  hyper.warmupRatio = float(warmupRatio);
  hyper.maxGradNorm = float(c.maxGradNorm);
  hyper.beta1 = float(c.beta1);
  hyper.beta2 = float(c.beta2);
  hyper.eps = float(c.adamEps);
  hyper.weightDecay = float(c.weightDecay);
  return hyper;
}

namespace {
/// `model.layers.<i>.mlp.expert_ids`: a sparse layer's chosen experts.
bool isExpertIds(const std::string &name) {
  return tensorNameEndsWith(name, ".mlp.expert_ids");
}
} // namespace

Status dflash::rt::mapTargetBuffers(const std::vector<BufferSpec> &buffers,
                                    TargetBufferMap &map) {
  map = TargetBufferMap();
  for (size_t i = 0; i < buffers.size(); ++i) {
    const BufferSpec &b = buffers[i];
    if (b.role == BufferRole::Frozen) {
      map.frozen.push_back(int(i));
    } else if (b.role == BufferRole::Input && b.name == "input_ids") {
      map.inputIds = int(i);
    } else if (b.role == BufferRole::Input && b.name == "position_ids") {
      map.positionIds = int(i);
    } else if (b.role == BufferRole::Input && b.name == "target_hidden") {
      map.features = int(i);
    } else if (b.role == BufferRole::Metric && b.dtype == DType::I32 &&
               b.shape.size() == 2 && isExpertIds(b.name)) {
      map.expertIds.push_back(int(i));
    } else {
      return Status::error("the target program has an unexpected buffer '" +
                           b.name + "' (role " + nameOf(b.role) + ")");
    }
  }
  if (map.inputIds < 0 || map.positionIds < 0 || map.features < 0)
    return Status::error("the target program lacks input_ids, position_ids "
                         "or target_hidden");
  return Status::success();
}

Status dflash::rt::checkShardWorld(const OptimizerShardLayout &shards,
                                   int64_t world) {
  if (shards.worldSize == world)
    return Status::success();
  auto gpus = [](int64_t n) {
    return std::to_string(n) + (n == 1 ? " GPU" : " GPUs");
  };
  return Status::error(
      "this trainer was compiled to shard the optimizer state over " +
      gpus(shards.worldSize) +
      " ([parallel] gpus_per_node x nodes in its spec) but runs on " +
      std::to_string(world) + "; recompile the spec for " + gpus(world) +
      " or drop shard_optimizer_state");
}
