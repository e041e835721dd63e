//===- StepBuffers.h - A step program's buffers, bound by role --*- C++ -*-===//
//
// Host code (no CUDA): which buffer of a compiled step is which, checked
// against the model config by (role, index) before anything is allocated;
// and the hyperparameters the step reads at run time.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_DEVICE_STEPBUFFERS_H
#define DFLASH_RUNTIME_DEVICE_STEPBUFFERS_H

#include "runtime/device/OptimizerShards.h"
#include "schema/ModelConfig.h"
#include "schema/Status.h"
#include "schema/StepBuffers.h"

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace dflash::rt {

/// Hyperparameters the step reads at run time. Defaults are the spec's;
/// `train --lr/--warmup-ratio` override them before the graph is captured.
struct StepHyper {
  float lr = 0;
  float warmupRatio = 0;
  float maxGradNorm = 1;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weightDecay = 0;
};

/// Which entry of StepProgram::buffers() holds what; -1 when absent.
struct StepBufferMap {
  /// By StepInput, FrozenWeight (lm_head is -1 when the target ties them),
  /// StepCounter and StepMetric.
  std::array<int, kNumStepInputs> inputs{};
  std::array<int, kNumFrozenWeights> frozen{};
  std::array<int, kNumStepCounters> counters{};
  std::array<int, kNumStepMetrics> namedMetrics{};
  int input(StepInput k) const { return inputs[size_t(k)]; }
  int frozenWeight(FrozenWeight k) const { return frozen[size_t(k)]; }
  int counter(StepCounter k) const { return counters[size_t(k)]; }
  int metric(StepMetric k) const { return namedMetrics[size_t(k)]; }
  /// One entry per parameterTable(config) tensor. master, moment1 and
  /// moment2 are empty when the optimizer state is sharded.
  std::vector<int> param, master, moment1, moment2;
  /// ZeRO-1 (StepProgram::optimizerShards): whether the optimizer state is
  /// held as one shard per bucket instead of per tensor.
  bool sharded = false;
  /// With `sharded`, one entry per bucket of the layout: its "bucket.<k>"
  /// buffers.
  std::vector<int> shardMaster, shardMoment1, shardMoment2;
  /// With `sharded`, per bucket and per tensor of the bucket (in layout
  /// order): its index in parameterTable(config).
  std::vector<std::vector<size_t>> shardTensors;
  /// Every Metric buffer, in buffers() order.
  std::vector<int> metrics;
};

/// Maps every buffer of a step program and checks it against `config`:
/// the five inputs, embed (and lm_head unless tied), four buffers per
/// trainable tensor, the step and total_steps counters and the loss, acc,
/// grad_norm and lr metrics, each with the dtype and shape docs/semantics.md
/// gives. With `shards` (StepProgram::optimizerShards; null: unsharded),
/// the layout must be valid and hold every trainable tensor exactly once,
/// and the optimizer state is instead one F32 [S_k] master, moment1 and
/// moment2 buffer per bucket k, named shardBufferName(k). Messages name the
/// buffer, bucket or tensor.
Status mapStepBuffers(const std::vector<BufferSpec> &buffers,
                      const ModelConfig &config,
                      const OptimizerShardLayout *shards, StepBufferMap &map);

/// Which entry of an evaluation program's buffers() holds what; -1 when
/// absent. Its inputs, frozen weights and parameters are bound to the
/// step's buffers of the same role and index.
struct EvalBufferMap {
  std::array<int, kNumStepInputs> inputs{};
  std::array<int, kNumFrozenWeights> frozen{};
  std::vector<int> param; ///< per parameterTable(config) tensor
  std::array<int, kNumForwardSums> sums{}; ///< by ForwardSum
  /// Per micro-batch, by DraftSlots: its rows' per-slot hits and weights.
  std::vector<std::array<int, kNumDraftSlots>> draftSlots;
  /// By ObjectivePart: a "covered" DFlash2 objective's parts, or all -1.
  std::array<int, kNumObjectiveParts> objectiveParts{};
};

/// Maps every buffer of an evaluation program (StepProgram.h,
/// createEvalProgram) and checks it against `config`: the six inputs,
/// embed (and lm_head unless tied), one parameter per trainable tensor, one
/// metric per ForwardSum, per micro-batch its two DraftSlots ([rowsPerGpu,
/// N*bs]), and either both ObjectivePart scalars or neither; nothing else.
/// Messages name the buffer.
Status mapEvalBuffers(const std::vector<BufferSpec> &buffers,
                      const ModelConfig &config, EvalBufferMap &map);

/// Which entry of an online target program's buffers() holds what
/// (StepProgram.h, createTargetProgram).
struct TargetBufferMap {
  int inputIds = -1, positionIds = -1, features = -1;
  std::vector<int> frozen;    ///< its weights, in binding order
  std::vector<int> expertIds; ///< each sparse layer's chosen experts
};

/// Maps every buffer of a target program: input_ids, position_ids, its
/// frozen weights (by checkpoint name), its output target_hidden and the
/// expert ids its sparse layers report (I32 metrics named
/// `model.layers.<i>.mlp.expert_ids`, [B*S, k]), nothing else. Messages
/// name the buffer.
Status mapTargetBuffers(const std::vector<BufferSpec> &buffers,
                        TargetBufferMap &map);

/// The shard size is compiled in: a sharded step runs on its world only
/// (`world` GPUs); the error says how to recompile.
Status checkShardWorld(const OptimizerShardLayout &shards, int64_t world);

/// The step's hyperparameters: the config's, with lr and warmup ratio as
/// given.
StepHyper stepHyperFor(const ModelConfig &config, double lr,
                       double warmupRatio);

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_DEVICE_STEPBUFFERS_H
