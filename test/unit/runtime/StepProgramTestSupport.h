//===- StepProgramTestSupport.h - Buffers of a stand-in step ----*- C++ -*-===//
//
// The buffer list of a compiled step, for the tests that put a hand-written
// StepProgram in its place (test/unit/RuntimeTrainMainTest without kernels,
// test/gpu/RuntimeTrainerTest with a small real one), with the optimizer
// state per tensor or sharded per bucket (ZeRO-1). Apart from
// RuntimeTestSupport.h because StepProgram.h brings in the CUDA runtime's
// header, which the host-only runtime tests do not build with.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_TEST_UNIT_STEPPROGRAMTESTSUPPORT_H
#define DFLASH_TEST_UNIT_STEPPROGRAMTESTSUPPORT_H

#include "runtime/device/StepProgram.h"
#include "schema/Parameters.h"
#include "schema/StepBuffers.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace dflash::runtimetest {

/// Every buffer a compiled step of `c` has, in the compiler's order: inputs,
/// frozen weights (no lm_head when tied), parameters, their fp32 masters and
/// Adam moments, counters, metrics.
inline std::vector<BufferSpec> stepBuffers(const ModelConfig &c) {
  std::vector<BufferSpec> buffers;
  for (int k = 0; k < kNumStepInputs; ++k) {
    StepInput input = StepInput(k);
    buffers.push_back({nameOf(input), BufferRole::Input, dtypeOf(input),
                       shapeOf(input, c), k});
  }
  for (int k = 0; k < kNumFrozenWeights; ++k)
    if (!(FrozenWeight(k) == FrozenWeight::LmHead && c.tieWordEmbeddings))
      buffers.push_back({nameOf(FrozenWeight(k)),
                         BufferRole::Frozen,
                         DType::BF16,
                         {c.vocabSize, c.hiddenSize},
                         k});
  std::vector<ParamInfo> table = parameterTable(c);
  for (size_t t = 0; t < table.size(); ++t)
    buffers.push_back({table[t].name, BufferRole::Parameter, DType::BF16,
                       table[t].shape, int64_t(t)});
  for (size_t t = 0; t < table.size(); ++t)
    for (BufferRole role :
         {BufferRole::Master, BufferRole::Moment1, BufferRole::Moment2})
      buffers.push_back(
          {table[t].name, role, DType::F32, table[t].shape, int64_t(t)});
  for (int k = 0; k < kNumStepCounters; ++k)
    buffers.push_back(
        {nameOf(StepCounter(k)), BufferRole::Counter, DType::I32, {}, k});
  for (int k = 0; k < kNumStepMetrics; ++k)
    buffers.push_back({nameOf(StepMetric(k)), BufferRole::Metric, DType::F32,
                       isPerPosition(StepMetric(k))
                           ? std::vector<int64_t>{c.blockSize}
                           : std::vector<int64_t>{},
                       k});
  return buffers;
}

/// A shard layout of `c`'s optimizer state over `worldSize` ranks: the
/// trainable tensors in parameterTable order, cut into `buckets` buckets of
/// consecutive tensors (at least one each); every tensor starts at a
/// multiple of `alignElements` of its bucket (gaps between them), and every
/// shard has ceil(flat / worldSize) elements rounded up to 64, plus
/// `extraShard` (padding at the end).
inline rt::OptimizerShardLayout shardLayout(const ModelConfig &c,
                                            int64_t worldSize, size_t buckets,
                                            int64_t alignElements = 64,
                                            int64_t extraShard = 0) {
  std::vector<ParamInfo> table = parameterTable(c);
  rt::OptimizerShardLayout layout;
  layout.worldSize = worldSize;
  buckets = std::max<size_t>(1, std::min(buckets, table.size()));
  layout.buckets.resize(buckets);
  for (size_t t = 0; t < table.size(); ++t) {
    rt::ShardedBucket &bucket = layout.buckets[t * buckets / table.size()];
    int64_t end = bucket.tensors.empty() ? 0
                                         : bucket.tensors.back().offset +
                                               bucket.tensors.back().numel;
    int64_t offset = (end + alignElements - 1) / alignElements * alignElements;
    bucket.tensors.push_back(
        {table[t].name, offset, table[t].numel(), int64_t(t)});
  }
  for (rt::ShardedBucket &bucket : layout.buckets) {
    int64_t flat = bucket.tensors.back().offset + bucket.tensors.back().numel;
    int64_t shard = (flat + worldSize - 1) / worldSize;
    bucket.shardElements = (shard + 63) / 64 * 64 + extraShard;
  }
  return layout;
}

/// The buffers of a compiled step of `c` whose optimizer state is sharded
/// as `layout`: stepBuffers(c) with the per-tensor master and moments
/// replaced by one F32 [S_k] master, moment1 and moment2 buffer per bucket,
/// named "bucket.<k>".
inline std::vector<BufferSpec>
shardedStepBuffers(const ModelConfig &c,
                   const rt::OptimizerShardLayout &layout) {
  std::vector<BufferSpec> buffers;
  for (BufferSpec &b : stepBuffers(c)) {
    if (b.role == BufferRole::Master || b.role == BufferRole::Moment1 ||
        b.role == BufferRole::Moment2)
      continue;
    if (b.role == BufferRole::Counter && b.index == int64_t(StepCounter::Step))
      for (size_t k = 0; k < layout.buckets.size(); ++k)
        for (BufferRole role :
             {BufferRole::Master, BufferRole::Moment1, BufferRole::Moment2})
          buffers.push_back({shardBufferName(k),
                             role,
                             DType::F32,
                             {layout.buckets[k].shardElements},
                             int64_t(k)});
    buffers.push_back(std::move(b));
  }
  return buffers;
}

} // namespace dflash::runtimetest

#endif // DFLASH_TEST_UNIT_STEPPROGRAMTESTSUPPORT_H
