//===- StepBuffers.h - The persistent buffers of a step ---------*- C++ -*-===//
//
// What lives across steps, by role, and the fixed members of each role: the
// six per-step inputs, the frozen weights, the counters and the metrics.
// The importer declares the step's arguments from these tables (with
// #dflash.arg roles of the same names), the emitter prints each buffer with
// its role and index, and the runtime binds buffers by (role, index), so a
// name is only ever shown to a user, never matched.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_SCHEMA_STEPBUFFERS_H
#define DFLASH_SCHEMA_STEPBUFFERS_H

#include "schema/DType.h"
#include "schema/ModelConfig.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dflash {

/// What a persistent buffer holds. Names ("input") are #dflash.arg's role
/// keywords.
enum class BufferRole : uint8_t {
  Input,     ///< per-step data: StepInput
  Frozen,    ///< FrozenWeight (lm_head absent when tied)
  Parameter, ///< bf16 trainable weight, updated in place by the step
  Master,    ///< its fp32 master copy (or, with ZeRO-1, a bucket's shard)
  Moment1,   ///< Adam first moment (fp32)
  Moment2,   ///< Adam second moment (fp32)
  Counter,   ///< StepCounter: int32 scalars
  Metric,    ///< StepMetric (or another value a program only reports: an
             ///< f32 of the step, a target's expert ids as I32)
};

/// The per-step inputs (docs/semantics.md section 1), in argument order.
/// PositionIds is each token's position in its conversation (section 9):
/// arange(S) in an unpacked row.
enum class StepInput : uint8_t {
  InputIds,
  LossMask,
  TargetHidden,
  Anchors,
  Keep,
  PositionIds
};
/// The target's frozen tensors.
enum class FrozenWeight : uint8_t { Embed, LmHead };
/// Scalars the runtime writes before each step.
enum class StepCounter : uint8_t { Step, TotalSteps };
/// What every step reports. Tau is the acceptance length (docs/semantics.md
/// section 10). PositionHits and PositionCounts are [block_size]: per block
/// position k, the supervised slots predicted right and all supervised slots
/// (summed over the GPUs); the accuracy at k is their ratio, k = 0 never
/// counts. The Bucket* metrics are [numPositionBuckets()], per bucket of
/// anchor position (section 14): the runs (1 + run_n) and the kept blocks
/// whose ratio is the bucket's tau, and the supervised slots predicted right
/// and all of them. The others are scalars.
enum class StepMetric : uint8_t {
  Loss,
  Acc,
  GradNorm,
  Lr,
  Tau,
  PositionHits,
  PositionCounts,
  BucketRuns,
  BucketBlocks,
  BucketHits,
  BucketCounts
};
/// The sums the forward graph returns, per GPU (docs/semantics.md sections 4
/// and 10): what a step all-reduces before it divides, and what an
/// evaluation program reports (summed over the GPUs) for the runtime to add
/// up over a held-out set. PositionHits and PositionCounts are
/// [block_size], the Bucket* sums [numPositionBuckets()] (as StepMetric's;
/// each adds up over the buckets to RunSum, KeptBlocks and the position
/// sums' totals), the others scalars.
enum class ForwardSum : uint8_t {
  LossSum,
  WeightSum,
  Correct,
  Count,
  RunSum,
  KeptBlocks,
  PositionHits,
  PositionCounts,
  BucketRuns,
  BucketBlocks,
  BucketHits,
  BucketCounts
};

/// What an evaluation program reports besides its sums, for the
/// serving-order acceptance (docs/runtime.md, "Serving tau"), which the
/// runtime walks on the host: for each micro-batch, every draft slot's hit
/// ([argmax == label], U8 [B, N*bs]) and loss weight (F32 [B, N*bs],
/// docs/semantics.md section 4). Metric buffers whose index is
/// draftSlotsIndex(which, microBatch): past the forward sums'.
enum class DraftSlots : uint8_t { Hits, Weights };

/// What the evaluation program of a DFlash2 drafter whose selector term
/// divides by sum(w * cov) (docs/semantics.md section 13, "covered") reports
/// last: the batch's global unary sum and sum(w * cov), F32 scalars. Its
/// loss_sum is then the linear unary + alpha * selector, which adds up over
/// batches, and the runtime forms the objective from the totals
/// (kernels/Selector.h, coveredObjectiveNumerator): a ratio of each batch's
/// sums would not add up. Metric buffers whose index is
/// objectivePartIndex(which, microBatches): past the draft slots'.
enum class ObjectivePart : uint8_t { UnarySum, CoveredWeight };

constexpr int kNumBufferRoles = 8;
constexpr int kNumStepInputs = 6;
constexpr int kNumFrozenWeights = 2;
constexpr int kNumStepCounters = 2;
constexpr int kNumStepMetrics = 11;
constexpr int kNumForwardSums = 12;
constexpr int kNumDraftSlots = 2;
constexpr int kNumObjectiveParts = 2;

/// The metric index of micro-batch `microBatch`'s `which` in an evaluation
/// program's buffers.
inline int64_t draftSlotsIndex(DraftSlots which, int64_t microBatch) {
  return kNumForwardSums + microBatch * kNumDraftSlots + int64_t(which);
}

/// The metric index of `which` in the buffers of an evaluation program of
/// `microBatches` micro-batches.
inline int64_t objectivePartIndex(ObjectivePart which, int64_t microBatches) {
  return kNumForwardSums + microBatches * kNumDraftSlots + int64_t(which);
}

/// "input", "frozen", "parameter", ...
const char *nameOf(BufferRole role);
/// The C++ enumerator ("Input"), for generated code.
const char *enumeratorOf(BufferRole role);
/// "input_ids", "loss_mask", "target_hidden", "anchors", "keep",
/// "position_ids".
const char *nameOf(StepInput input);
/// "embed", "lm_head".
const char *nameOf(FrozenWeight weight);
/// "step", "total_steps".
const char *nameOf(StepCounter counter);
/// "loss", "acc", "grad_norm", "lr", "tau", "position_hits",
/// "position_counts", "bucket_runs", "bucket_blocks", "bucket_hits",
/// "bucket_counts".
const char *nameOf(StepMetric metric);
/// "loss_sum", "weight_sum", "correct", "count", "run_sum", "kept_blocks",
/// "position_hits", "position_counts", "bucket_runs", "bucket_blocks",
/// "bucket_hits", "bucket_counts".
const char *nameOf(ForwardSum sum);
/// "draft_hits", "draft_weights".
const char *nameOf(DraftSlots slots);
/// Their dtypes: U8 and F32.
DType dtypeOf(DraftSlots slots);
/// "unary_sum", "covered_weight".
const char *nameOf(ObjectivePart part);
/// Whether the metric or sum is [block_size].
bool isPerPosition(StepMetric metric);
bool isPerPosition(ForwardSum sum);
/// Whether the metric or sum is [numPositionBuckets()].
bool isPerBucket(StepMetric metric);
bool isPerBucket(ForwardSum sum);
/// The shape of the metric or sum for `config`: [block_size],
/// [numPositionBuckets()] or a scalar ({}).
std::vector<int64_t> shapeOf(StepMetric metric, const ModelConfig &config);
std::vector<int64_t> shapeOf(ForwardSum sum, const ModelConfig &config);

std::optional<BufferRole> parseBufferRole(std::string_view name);
std::optional<StepInput> parseStepInput(std::string_view name);
std::optional<FrozenWeight> parseFrozenWeight(std::string_view name);
std::optional<StepCounter> parseStepCounter(std::string_view name);
std::optional<StepMetric> parseStepMetric(std::string_view name);
std::optional<ForwardSum> parseForwardSum(std::string_view name);
std::optional<DraftSlots> parseDraftSlots(std::string_view name);
std::optional<ObjectivePart> parseObjectivePart(std::string_view name);

/// The dtype and shape of an input for `config` (flags are U8).
DType dtypeOf(StepInput input);
std::vector<int64_t> shapeOf(StepInput input, const ModelConfig &config);

/// The name of bucket k's optimizer-state buffers with ZeRO-1 ("bucket.3").
std::string shardBufferName(size_t bucket);

/// One persistent buffer of a step program.
struct BufferSpec {
  std::string
      name; ///< for messages: "input_ids", "layers.0.mlp.up_proj.weight"
  BufferRole role = BufferRole::Input;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  /// Which member of its role: the StepInput, FrozenWeight, StepCounter or
  /// StepMetric value (ForwardSum in an evaluation program); for Parameter,
  /// Master and Moment buffers the index in parameterTable(), or with ZeRO-1
  /// the bucket of Master and Moment buffers; -1 for a metric that the runtime
  /// only reports.
  int64_t index = -1;
  size_t bytes() const { return size_t(shapeNumel(shape)) * dtypeSize(dtype); }
};

} // namespace dflash

#endif // DFLASH_SCHEMA_STEPBUFFERS_H
