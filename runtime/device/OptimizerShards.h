//===- OptimizerShards.h - Each GPU's optimizer state -----------*- C++ -*-===//
//
// ZeRO-1 (spec `[parallel] shard_optimizer_state`): the fp32 masters and
// Adam moments are split over the data-parallel ranks instead of being held
// whole by every GPU. The compiler already groups the fp32 gradients into
// buckets, each one contiguous range of memory reduced by one collective.
// With sharding, bucket k's flat element range [0, worldSize * S_k) is cut
// into worldSize shards of S_k elements: the collective becomes a
// reduce-scatter, rank r owns [r * S_k, (r + 1) * S_k), keeps master and
// moments for that range only, updates it, and the bf16 parameters are
// all-gathered so that every GPU ends the step with all of them.
//
// A tensor of a bucket occupies [offset, offset + numel) of the flat range.
// The gaps between tensors (alignment) and the padding at the end belong to
// no tensor; their values are never read.
//
// The compiler decides the layout and the generated step reports it
// (StepProgram::optimizerShards); the runtime uses it to fill, save and
// resume the shards; both cut the shards into pieces with shardPieces().
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_OPTIMIZERSHARDS_H
#define DFLASH_RUNTIME_OPTIMIZERSHARDS_H

#include "schema/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::rt {

/// One trainable tensor inside a bucket's flat range.
struct ShardedTensor {
  std::string name;   ///< as in parameterTable(): "layers.0.mlp.up_proj.weight"
  int64_t offset = 0; ///< first element in the bucket's flat range
  int64_t numel = 0;
  int64_t param = -1; ///< its index in parameterTable()
};

/// One bucket: its tensors in ascending, non-overlapping order.
struct ShardedBucket {
  std::vector<ShardedTensor> tensors;
  int64_t shardElements = 0; ///< S: elements of each rank's shard
};

/// How the optimizer state of a step is split over `worldSize` ranks. Its
/// Master, Moment1 and Moment2 buffers are then named "bucket.<k>", one per
/// bucket, each of `shardElements` fp32 values.
struct OptimizerShardLayout {
  int64_t worldSize = 1;
  std::vector<ShardedBucket> buckets;
};

/// A contiguous part of one tensor that falls inside one rank's shard.
struct ShardPiece {
  size_t tensor = 0;        ///< index into ShardedBucket::tensors
  int64_t tensorOffset = 0; ///< first element, within the tensor
  int64_t shardOffset = 0;  ///< the same element, within the shard
  int64_t length = 0;
};

/// The pieces of rank `rank`'s shard of `bucket`, in ascending order. Over
/// all ranks, every element of every tensor is in exactly one piece.
std::vector<ShardPiece> shardPieces(const ShardedBucket &bucket, int64_t rank);

/// One piece of one rank's sharded update, as element offsets: what the
/// optimizer reads and writes and what the parameter gather copies. The
/// runtime turns these into pointers (device/CompiledStep.cu).
struct RankPiece {
  size_t bucket = 0, tensor = 0; ///< the tensor, by bucket and position
  int64_t tensorOffset = 0;      ///< first element, within the tensor
  int64_t shardOffset = 0;       ///< within the rank's master and moments
  /// Within the bucket's flat fp32 gradients (the reduce-scattered range).
  int64_t gradOffset = 0;
  /// Within the bucket's slot read as bf16, where the gather stages it:
  /// rank * shardElements + shardOffset.
  int64_t stagingOffset = 0;
  int64_t length = 0;
};

/// Every piece of `rank`'s update, bucket by bucket in ascending order.
std::vector<RankPiece> rankPieces(const OptimizerShardLayout &layout,
                                  int64_t rank);

/// Checks that the layout is one shardPieces() can use: a positive world
/// size; every bucket with a positive shard size and tensors in ascending,
/// non-overlapping order inside [0, worldSize * shardElements).
Status checkShardLayout(const OptimizerShardLayout &layout);

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_OPTIMIZERSHARDS_H
