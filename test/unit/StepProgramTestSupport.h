//===- StepProgramTestSupport.h - Buffers of a stand-in step ----*- C++ -*-===//
//
// The buffer list of a compiled step, for the tests that put a hand-written
// StepProgram in its place (test/unit/RuntimeTrainMainTest without kernels,
// test/gpu/RuntimeTrainerTest with a small real one). Apart from
// RuntimeTestSupport.h because StepProgram.h brings in the CUDA runtime's
// header, which the host-only runtime tests do not build with.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_TEST_UNIT_STEPPROGRAMTESTSUPPORT_H
#define DFLASH_TEST_UNIT_STEPPROGRAMTESTSUPPORT_H

#include "runtime/ModelConfig.h"
#include "runtime/StepProgram.h"

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

} // namespace dflash::runtimetest

#endif // DFLASH_TEST_UNIT_STEPPROGRAMTESTSUPPORT_H
