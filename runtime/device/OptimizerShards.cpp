//===- OptimizerShards.cpp - Each GPU's share of the optimizer state ------===//

#include "runtime/device/OptimizerShards.h"

#include <algorithm>

using namespace dflash;
using namespace dflash::rt;

std::vector<ShardPiece> dflash::rt::shardPieces(const ShardedBucket &bucket,
                                                int64_t rank) {
  std::vector<ShardPiece> pieces;
  const int64_t begin = rank * bucket.shardElements;
  const int64_t end = begin + bucket.shardElements;
  for (size_t t = 0; t < bucket.tensors.size(); ++t) {
    const ShardedTensor &tensor = bucket.tensors[t];
    int64_t lo = std::max(begin, tensor.offset);
    int64_t hi = std::min(end, tensor.offset + tensor.numel);
    if (lo >= hi)
      continue;
    ShardPiece piece;
    piece.tensor = t;
    piece.tensorOffset = lo - tensor.offset;
    piece.shardOffset = lo - begin;
    piece.length = hi - lo;
    pieces.push_back(piece);
  }
  return pieces;
}

Status dflash::rt::checkShardLayout(const OptimizerShardLayout &layout) {
  if (layout.worldSize < 1)
    return Status::error("the optimizer shard layout has world size " +
                         std::to_string(layout.worldSize));
  for (size_t k = 0; k < layout.buckets.size(); ++k) {
    const ShardedBucket &bucket = layout.buckets[k];
    const std::string where =
        "optimizer shard layout, bucket " + std::to_string(k);
    if (bucket.shardElements < 1)
      return Status::error(where + ": shards of " +
                           std::to_string(bucket.shardElements) + " elements");
    const int64_t flat = layout.worldSize * bucket.shardElements;
    int64_t end = 0;
    for (const ShardedTensor &tensor : bucket.tensors) {
      if (tensor.numel < 1 || tensor.offset < end ||
          tensor.offset + tensor.numel > flat)
        return Status::error(
            where + ": tensor '" + tensor.name + "' at [" +
            std::to_string(tensor.offset) + ", " +
            std::to_string(tensor.offset + tensor.numel) +
            ") overlaps the one before it or leaves the bucket's " +
            std::to_string(flat) + " elements");
      end = tensor.offset + tensor.numel;
    }
  }
  return Status::success();
}

std::vector<RankPiece>
dflash::rt::rankPieces(const OptimizerShardLayout &layout, int64_t rank) {
  std::vector<RankPiece> pieces;
  for (size_t k = 0; k < layout.buckets.size(); ++k) {
    const ShardedBucket &bucket = layout.buckets[k];
    for (const ShardPiece &p : shardPieces(bucket, rank)) {
      RankPiece r;
      r.bucket = k;
      r.tensor = p.tensor;
      r.tensorOffset = p.tensorOffset;
      r.shardOffset = p.shardOffset;
      r.gradOffset = bucket.tensors[p.tensor].offset + p.tensorOffset;
      r.stagingOffset = rank * bucket.shardElements + p.shardOffset;
      r.length = p.length;
      pieces.push_back(r);
    }
  }
  return pieces;
}
