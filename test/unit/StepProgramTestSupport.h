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

#include "runtime/ModelConfig.h"
#include "runtime/StepProgram.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace dflash::runtimetest {

/// Every buffer a compiled step of `c` has, in the compiler's order: inputs,
/// frozen weights (no lm_head when tied), parameters, their fp32 masters and
/// Adam moments, counters, metrics.
inline std::vector<rt::BufferSpec> stepBuffers(const rt::ModelConfig &c) {
  using rt::BufferRole;
  using rt::DType;
  const int64_t B = c.rowsPerGpu, S = c.seqLen, N = c.anchorsPerRow;
  std::vector<rt::BufferSpec> buffers = {
      {"input_ids", BufferRole::Input, DType::I32, {B, S}},
      {"loss_mask", BufferRole::Input, DType::U8, {B, S}},
      {"target_hidden",
       BufferRole::Input,
       DType::BF16,
       {B, S, c.contextWidth()}},
      {"anchors", BufferRole::Input, DType::I32, {B, N}},
      {"keep", BufferRole::Input, DType::U8, {B, N}},
      {"embed", BufferRole::Frozen, DType::BF16, {c.vocabSize, c.hiddenSize}},
  };
  if (!c.tieWordEmbeddings)
    buffers.push_back({"lm_head",
                       BufferRole::Frozen,
                       DType::BF16,
                       {c.vocabSize, c.hiddenSize}});
  for (const rt::ParamInfo &p : rt::parameterTable(c))
    buffers.push_back({p.name, BufferRole::Parameter, DType::BF16, p.shape});
  for (const rt::ParamInfo &p : rt::parameterTable(c)) {
    buffers.push_back({p.name, BufferRole::Master, DType::F32, p.shape});
    buffers.push_back({p.name, BufferRole::Moment1, DType::F32, p.shape});
    buffers.push_back({p.name, BufferRole::Moment2, DType::F32, p.shape});
  }
  buffers.push_back({"step", BufferRole::Counter, DType::I32, {}});
  buffers.push_back({"total_steps", BufferRole::Counter, DType::I32, {}});
  for (const char *name : {"loss", "acc", "grad_norm", "lr"})
    buffers.push_back({name, BufferRole::Metric, DType::F32, {}});
  return buffers;
}

/// A shard layout of `c`'s optimizer state over `worldSize` ranks: the
/// trainable tensors in parameterTable order, cut into `buckets` buckets of
/// consecutive tensors (at least one each); every tensor starts at a
/// multiple of `alignElements` of its bucket (gaps between them), and every
/// shard has ceil(flat / worldSize) elements rounded up to 64, plus
/// `extraShard` (padding at the end).
inline rt::OptimizerShardLayout shardLayout(const rt::ModelConfig &c,
                                            int64_t worldSize, size_t buckets,
                                            int64_t alignElements = 64,
                                            int64_t extraShard = 0) {
  std::vector<rt::ParamInfo> table = rt::parameterTable(c);
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
    bucket.tensors.push_back({table[t].name, offset, table[t].numel()});
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
inline std::vector<rt::BufferSpec>
shardedStepBuffers(const rt::ModelConfig &c,
                   const rt::OptimizerShardLayout &layout) {
  using rt::BufferRole;
  std::vector<rt::BufferSpec> buffers;
  for (rt::BufferSpec &b : stepBuffers(c)) {
    if (b.role == BufferRole::Master || b.role == BufferRole::Moment1 ||
        b.role == BufferRole::Moment2)
      continue;
    if (b.role == BufferRole::Counter && b.name == "step")
      for (size_t k = 0; k < layout.buckets.size(); ++k)
        for (BufferRole role :
             {BufferRole::Master, BufferRole::Moment1, BufferRole::Moment2})
          buffers.push_back({rt::shardBufferName(k),
                             role,
                             rt::DType::F32,
                             {layout.buckets[k].shardElements}});
    buffers.push_back(std::move(b));
  }
  return buffers;
}

} // namespace dflash::runtimetest

#endif // DFLASH_TEST_UNIT_STEPPROGRAMTESTSUPPORT_H
