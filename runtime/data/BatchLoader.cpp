//===- BatchLoader.cpp - Rows and anchors of each training step -----------===//

#include "runtime/data/BatchLoader.h"
#include "runtime/data/ParallelFor.h"

#include <algorithm>
#include <numeric>
#include <type_traits>

using namespace dflash;
using namespace dflash::rt;

// A checkpoint stores the anchor Rngs' states as io/'s RngState.
static_assert(std::is_same_v<Rng::State, RngState>,
              "Checkpoint.h's RngState must be Rng::State");

void HostBatch::resize(const ModelConfig &c) {
  // next() writes every element: no fill (a long row's features are
  // gigabytes).
  const size_t B = size_t(c.rowsPerStep()), S = size_t(c.seqLen);
  const size_t N = size_t(c.anchorsPerRow);
  inputIds.resize(B * S);
  lossMask.resize(B * S);
  hiddenStates.resize(B * S * size_t(c.contextWidth()));
  anchors.resize(B * N);
  keep.resize(B * N);
  positionIds.resize(B * S);
  rows.assign(B, 0);
  skippedRows.clear();
}

BatchBuffers HostBatch::buffers() {
  BatchBuffers out;
  out.inputIds = inputIds.data();
  out.lossMask = lossMask.data();
  out.hiddenStates = hiddenStates.data();
  out.anchors = anchors.data();
  out.keep = keep.data();
  out.positionIds = positionIds.data();
  out.rows = &rows;
  out.skippedRows = &skippedRows;
  return out;
}

/// The first element of `h` (bf16) that is NaN or infinite, or -1. Chunks
/// on every core, each scanned whole (a loop with no early exit, which the
/// compiler vectorises): a long row is gigabytes.
static int64_t firstNonFinite(const uint16_t *h, size_t count) {
  const int64_t chunks = parallelChunks(count);
  std::vector<int64_t> firstBad(size_t(chunks), -1);
  parallelFor(chunks, [&](int64_t c) {
    const size_t begin = size_t(c) * kParallelChunk;
    const size_t end = std::min(count, begin + kParallelChunk);
    bool any = false;
    for (size_t i = begin; i < end; ++i)
      any |= (h[i] & 0x7f80u) == 0x7f80u;
    if (!any)
      return;
    for (size_t i = begin; i < end; ++i)
      if ((h[i] & 0x7f80u) == 0x7f80u) {
        firstBad[size_t(c)] = int64_t(i);
        return;
      }
  });
  for (int64_t at : firstBad)
    if (at >= 0)
      return at;
  return -1;
}

BatchLoader::BatchLoader(const RowSource &source, const ModelConfig &config,
                         uint64_t seed, int64_t rank, int64_t worldSize)
    : source(source), config(config), seed(seed), rank(rank),
      worldSize(worldSize),
      anchorRng(Rng::forStream(seed, kAnchorStream + uint64_t(rank))),
      sampler(config.rowsPerStep(), config.seqLen, config.anchorsPerRow) {}

int64_t BatchLoader::batchesPerPass() const {
  const int64_t global = worldSize * config.rowsPerStep();
  return (source.numRows() + global - 1) / global;
}

Status BatchLoader::validate() const {
  int64_t need = evaluation ? 1 : worldSize * config.rowsPerStep();
  if (source.numRows() < need)
    return Status::error("the data has " + std::to_string(source.numRows()) +
                         " rows but one step needs " + std::to_string(need) +
                         " (" + std::to_string(config.rowsPerStep()) +
                         " rows per GPU x " + std::to_string(worldSize) +
                         " GPUs)");
  if (rank < 0 || rank >= worldSize)
    return Status::error("rank " + std::to_string(rank) +
                         " is outside a world of " + std::to_string(worldSize));
  return Status::success();
}

void BatchLoader::shuffleFor(int64_t epoch) {
  order.resize(size_t(source.numRows()));
  std::iota(order.begin(), order.end(), int64_t(0));
  orderEpoch = epoch;
  if (evaluation)
    return; // source order
  Rng rng = Rng::forStream(seed, kEpochStream + uint64_t(epoch));
  for (size_t i = order.size(); i > 1; --i)
    std::swap(order[i - 1], order[size_t(rng.uniform(i))]);
}

Status BatchLoader::seek(const DataPosition &position,
                         const Rng::State &anchorState) {
  if (position.epoch < 0 || position.row < 0 || position.row > source.numRows())
    return Status::error(
        "data position (epoch " + std::to_string(position.epoch) + ", row " +
        std::to_string(position.row) + ") does not fit data of " +
        std::to_string(source.numRows()) + " rows");
  pos = position;
  return anchorRng.restore(anchorState);
}

Status BatchLoader::next(HostBatch &batch) {
  batch.resize(config);
  return next(batch.buffers());
}

Status BatchLoader::next(const BatchBuffers &batch) {
  DFLASH_RETURN_IF_ERROR(validate());
  const int64_t B = config.rowsPerStep(), S = config.seqLen;
  const int64_t N = config.anchorsPerRow, W = config.contextWidth();
  const int64_t global = worldSize * B;
  if (evaluation && pos.row >= source.numRows())
    return Status::error("the evaluation has read every row already");
  if (!evaluation && pos.row + global > source.numRows()) {
    ++pos.epoch;
    pos.row = 0;
  }
  if (orderEpoch != pos.epoch)
    shuffleFor(pos.epoch);
  batch.rows->assign(size_t(B), 0);
  batch.skippedRows->clear();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t at = pos.row + rank * B + b;
    // Past the last row of an evaluation: an empty row.
    const int64_t row = at < source.numRows() ? order[size_t(at)] : -1;
    (*batch.rows)[size_t(b)] = row;
    RowBuffers out;
    out.inputIds = batch.inputIds + b * S;
    out.lossMask = batch.lossMask + b * S;
    out.hiddenStates = batch.hiddenStates + b * S * W;
    out.positionIds = batch.positionIds + b * S;
    if (source.hasPinnedAnchors()) {
      out.anchors = batch.anchors + b * N;
      out.keep = batch.keep + b * N;
    }
    const bool knownBad = row < 0 || knownBadRows.count(row) != 0;
    if (!knownBad) {
      DFLASH_RETURN_IF_ERROR(source.readRow(row, out));
      // A NaN or inf feature would poison every gradient of the step.
      const int64_t bad = source.hasFeatures()
                              ? firstNonFinite(out.hiddenStates, size_t(S * W))
                              : -1;
      if (bad < 0)
        continue;
      std::string what = source.describeRow(row) +
                         ": hidden_states has a non-finite value at position " +
                         std::to_string(bad / W) + ", feature " +
                         std::to_string(bad % W);
      if (++badRows > maxBadRows)
        return Status::error(
            what + " (row " + std::to_string(badRows) +
            " with non-finite features; at most " + std::to_string(maxBadRows) +
            (maxBadRows == 1 ? " is" : " are") +
            " skipped: check the data, or raise --max-bad-rows)");
      knownBadRows.insert(row);
      batch.skippedRows->push_back({row, what});
    }
    // An empty row in its place: nothing supervised, nothing kept.
    std::fill(out.inputIds, out.inputIds + S, 0);
    std::fill(out.lossMask, out.lossMask + S, uint8_t(0));
    if (source.hasFeatures())
      std::fill(out.hiddenStates, out.hiddenStates + S * W, uint16_t(0));
    std::iota(out.positionIds, out.positionIds + S, 0);
    if (source.hasPinnedAnchors()) {
      std::fill(out.anchors, out.anchors + N, 0);
      std::fill(out.keep, out.keep + N, uint8_t(0));
    }
  }
  if (!source.hasPinnedAnchors())
    sampler.sample(batch.lossMask, batch.positionIds, anchorRng, batch.anchors,
                   batch.keep);
  pos.row += global;
  return Status::success();
}
