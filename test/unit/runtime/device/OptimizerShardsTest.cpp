//===- OptimizerShardsTest.cpp - Each GPU's share of the state ------------===//
//
// runtime/OptimizerShards on random layouts: random tensor sizes, random
// alignment gaps, 1 to 8 ranks, shards of the smallest size rounded up to
// 64 elements or larger. Over all ranks every element of every tensor is in
// exactly one piece, at the flat position both sides agree on, and the
// shard elements in no piece are exactly those of the flat range that no
// tensor covers. checkShardLayout accepts every such layout and rejects
// broken ones with a message that names the bucket and tensor.
//
// The seed is fresh on every run and printed with any failure;
// DFLASH_TEST_SEED=<n> repeats a run.
//
//===----------------------------------------------------------------------===//

#include "runtime/device/OptimizerShards.h"
#include "schema/StepBuffers.h"
#include "test/unit/runtime/RuntimeTestSupport.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using dflash::runtimetest::testSeed;

namespace {

int64_t uniform(std::mt19937_64 &rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

/// A random layout over `world` ranks: 1 to 4 buckets of 1 to 7 tensors,
/// sizes from one element to a few thousand, gaps from alignment to 1, 8, 64
/// or 256 elements or random ones. `slack`: shards larger than needed.
OptimizerShardLayout randomLayout(std::mt19937_64 &rng, int64_t world,
                                  bool slack) {
  OptimizerShardLayout layout;
  layout.worldSize = world;
  int64_t buckets = uniform(rng, 1, 4);
  int tensorId = 0;
  for (int64_t k = 0; k < buckets; ++k) {
    ShardedBucket bucket;
    int64_t end = uniform(rng, 0, 2) == 0 ? uniform(rng, 0, 100) : 0;
    int64_t tensors = uniform(rng, 1, 7);
    for (int64_t t = 0; t < tensors; ++t) {
      int64_t offset = end;
      switch (uniform(rng, 0, 3)) {
      case 0: // packed
        break;
      case 1: { // aligned
        const int64_t aligns[] = {8, 64, 256};
        int64_t align = aligns[uniform(rng, 0, 2)];
        offset = (end + align - 1) / align * align;
        break;
      }
      default:
        offset += uniform(rng, 0, 300);
      }
      int64_t numel =
          uniform(rng, 0, 3) == 0 ? uniform(rng, 1, 5) : uniform(rng, 1, 4000);
      bucket.tensors.push_back(
          {"tensor." + std::to_string(tensorId++), offset, numel});
      end = offset + numel;
    }
    // Sometimes an exact fit (no padding on the last rank), usually rounded
    // up to 64 as the compiler does, and with `slack` larger still (ranks
    // with nothing but padding).
    int64_t shard = (end + world - 1) / world;
    if (uniform(rng, 0, 3) != 0)
      shard = (shard + 63) / 64 * 64;
    if (slack)
      shard += uniform(rng, 1, 3) * uniform(rng, 1, 2000);
    bucket.shardElements = shard;
    layout.buckets.push_back(bucket);
  }
  return layout;
}

/// Checks shardPieces() for every rank of `bucket` against the flat range.
void expectPiecesPartitionTheBucket(const ShardedBucket &bucket,
                                    int64_t world) {
  const int64_t S = bucket.shardElements;
  // Which tensor covers each flat position (-1: a gap or padding).
  std::vector<int64_t> owner(size_t(world * S), -1);
  for (size_t t = 0; t < bucket.tensors.size(); ++t)
    for (int64_t i = 0; i < bucket.tensors[t].numel; ++i)
      owner[size_t(bucket.tensors[t].offset + i)] = int64_t(t);
  std::vector<std::vector<int>> seen(bucket.tensors.size());
  for (size_t t = 0; t < bucket.tensors.size(); ++t)
    seen[t].assign(size_t(bucket.tensors[t].numel), 0);

  for (int64_t rank = 0; rank < world; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    std::vector<ShardPiece> pieces = shardPieces(bucket, rank);
    std::vector<bool> inPiece(size_t(S), false);
    int64_t previousEnd = 0;
    for (size_t p = 0; p < pieces.size(); ++p) {
      const ShardPiece &piece = pieces[p];
      ASSERT_LT(piece.tensor, bucket.tensors.size());
      const ShardedTensor &tensor = bucket.tensors[piece.tensor];
      ASSERT_GT(piece.length, 0);
      ASSERT_GE(piece.shardOffset, previousEnd) << "pieces not ascending";
      if (p > 0) {
        EXPECT_GT(piece.tensor, pieces[p - 1].tensor);
      }
      ASSERT_GE(piece.tensorOffset, 0);
      ASSERT_LE(piece.tensorOffset + piece.length, tensor.numel);
      ASSERT_LE(piece.shardOffset + piece.length, S);
      // Both sides name the same flat element.
      EXPECT_EQ(rank * S + piece.shardOffset,
                tensor.offset + piece.tensorOffset)
          << "tensor '" << tensor.name << "'";
      for (int64_t i = 0; i < piece.length; ++i) {
        ++seen[piece.tensor][size_t(piece.tensorOffset + i)];
        inPiece[size_t(piece.shardOffset + i)] = true;
      }
      previousEnd = piece.shardOffset + piece.length;
    }
    // What no piece holds is exactly what no tensor covers.
    for (int64_t j = 0; j < S; ++j)
      ASSERT_EQ(inPiece[size_t(j)], owner[size_t(rank * S + j)] >= 0)
          << "shard element " << j;
  }
  for (size_t t = 0; t < bucket.tensors.size(); ++t)
    for (int64_t i = 0; i < bucket.tensors[t].numel; ++i)
      ASSERT_EQ(seen[t][size_t(i)], 1)
          << "element " << i << " of tensor '" << bucket.tensors[t].name
          << "' is in " << seen[t][size_t(i)] << " pieces";
}

void expectErrorNames(const OptimizerShardLayout &layout,
                      const std::vector<std::string> &parts) {
  Status s = checkShardLayout(layout);
  ASSERT_FALSE(s.ok()) << "accepted a broken layout";
  for (const std::string &part : parts)
    EXPECT_NE(s.message().find(part), std::string::npos)
        << s.message() << "\nexpected: " << part;
}

} // namespace

TEST(RuntimeOptimizerShards, BufferNames) {
  EXPECT_EQ(shardBufferName(0), "bucket.0");
  EXPECT_EQ(shardBufferName(12), "bucket.12");
}

TEST(RuntimeOptimizerShards, PiecesPartitionRandomLayouts) {
  const uint64_t seed = testSeed();
  SCOPED_TRACE("DFLASH_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    int64_t world = uniform(rng, 1, 8);
    bool slack = trial % 3 == 2;
    OptimizerShardLayout layout = randomLayout(rng, world, slack);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", world " +
                 std::to_string(world));
    Status s = checkShardLayout(layout);
    ASSERT_TRUE(s.ok()) << s.message();
    for (size_t k = 0; k < layout.buckets.size(); ++k) {
      SCOPED_TRACE("bucket " + std::to_string(k));
      expectPiecesPartitionTheBucket(layout.buckets[k], world);
      if (HasFatalFailure())
        return;
    }
  }
}

// What a rank's sharded update reads and writes, as the runtime binds it:
// over the ranks, every element of every tensor is updated once, at its own
// position in the bucket's flat gradients, from the rank's own shard of the
// state, and staged for the gather at that rank's part of the bucket, where
// no other rank writes.
TEST(RuntimeOptimizerShards, RankPiecesCoverTheUpdateAndTheGather) {
  const uint64_t seed = testSeed();
  SCOPED_TRACE("DFLASH_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 100; ++trial) {
    const int64_t world = uniform(rng, 1, 8);
    OptimizerShardLayout layout = randomLayout(rng, world, trial % 2 == 1);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", world " +
                 std::to_string(world));
    ASSERT_TRUE(checkShardLayout(layout).ok());
    for (size_t k = 0; k < layout.buckets.size(); ++k) {
      const ShardedBucket &bucket = layout.buckets[k];
      std::vector<int> updated(size_t(world * bucket.shardElements), 0);
      std::vector<int> staged(updated.size(), 0);
      for (int64_t rank = 0; rank < world; ++rank)
        for (const RankPiece &p : rankPieces(layout, rank)) {
          if (p.bucket != k)
            continue;
          const ShardedTensor &t = bucket.tensors[p.tensor];
          ASSERT_GE(p.tensorOffset, 0);
          ASSERT_LE(p.tensorOffset + p.length, t.numel);
          EXPECT_EQ(p.gradOffset, t.offset + p.tensorOffset);
          ASSERT_GE(p.shardOffset, 0);
          ASSERT_LE(p.shardOffset + p.length, bucket.shardElements);
          // The rank's shard holds exactly the flat range it updates.
          EXPECT_EQ(rank * bucket.shardElements + p.shardOffset, p.gradOffset);
          EXPECT_EQ(p.stagingOffset,
                    rank * bucket.shardElements + p.shardOffset);
          for (int64_t i = 0; i < p.length; ++i) {
            ++updated[size_t(p.gradOffset + i)];
            ++staged[size_t(p.stagingOffset + i)];
          }
        }
      for (const ShardedTensor &t : bucket.tensors)
        for (int64_t i = 0; i < t.numel; ++i)
          ASSERT_EQ(updated[size_t(t.offset + i)], 1)
              << "bucket " << k << " tensor " << t.name << " element " << i;
      for (int count : staged)
        ASSERT_LE(count, 1) << "bucket " << k;
    }
  }
}

TEST(RuntimeOptimizerShards, RanksBeyondTheLayoutHoldNothing) {
  const uint64_t seed = testSeed();
  SCOPED_TRACE("DFLASH_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  OptimizerShardLayout layout = randomLayout(rng, uniform(rng, 1, 8), false);
  for (const ShardedBucket &bucket : layout.buckets)
    EXPECT_TRUE(shardPieces(bucket, layout.worldSize).empty());
}

TEST(RuntimeOptimizerShards, BrokenLayoutsAreRefused) {
  const uint64_t seed = testSeed();
  SCOPED_TRACE("DFLASH_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    OptimizerShardLayout good = randomLayout(rng, uniform(rng, 1, 8), false);
    ASSERT_TRUE(checkShardLayout(good).ok());
    size_t k = size_t(uniform(rng, 0, int64_t(good.buckets.size()) - 1));
    const std::string bucketName = "bucket " + std::to_string(k);
    const ShardedBucket &bucket = good.buckets[k];
    size_t last = bucket.tensors.size() - 1;
    const int64_t flat = good.worldSize * bucket.shardElements;

    OptimizerShardLayout noWorld = good;
    noWorld.worldSize = 0;
    expectErrorNames(noWorld, {"world size 0"});

    OptimizerShardLayout emptyShards = good;
    emptyShards.buckets[k].shardElements = 0;
    expectErrorNames(emptyShards, {bucketName, "shards of 0 elements"});

    // The last tensor one element past the end of the bucket.
    OptimizerShardLayout outside = good;
    ShardedTensor &tail = outside.buckets[k].tensors[last];
    tail.numel = flat - tail.offset + 1;
    expectErrorNames(outside, {bucketName, "'" + tail.name + "'",
                               std::to_string(flat) + " elements"});

    OptimizerShardLayout negative = good;
    negative.buckets[k].tensors[0].offset = -uniform(rng, 1, 10);
    expectErrorNames(negative,
                     {bucketName, "'" + bucket.tensors[0].name + "'"});

    OptimizerShardLayout empty = good;
    empty.buckets[k].tensors[last].numel = 0;
    expectErrorNames(empty,
                     {bucketName, "'" + bucket.tensors[last].name + "'"});

    if (bucket.tensors.size() >= 2) {
      // A tensor that starts inside the one before it.
      size_t t = size_t(uniform(rng, 1, int64_t(last)));
      OptimizerShardLayout overlap = good;
      const ShardedTensor &before = overlap.buckets[k].tensors[t - 1];
      overlap.buckets[k].tensors[t].offset =
          before.offset + uniform(rng, 0, before.numel - 1);
      expectErrorNames(overlap, {bucketName, "'" + bucket.tensors[t].name + "'",
                                 "overlaps"});
      // Out of order.
      OptimizerShardLayout swapped = good;
      std::swap(swapped.buckets[k].tensors[t - 1],
                swapped.buckets[k].tensors[t]);
      expectErrorNames(swapped, {bucketName});
    }
  }
}
