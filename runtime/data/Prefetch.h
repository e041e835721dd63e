//===- Prefetch.h - Reading batches ahead on a thread -----------*- C++ -*-===//
//
// A thread that runs a BatchLoader ahead of the GPU: it fills a few host
// slots (pinned memory, so that the trainer's copies to the device are
// asynchronous DMA) while the device runs the step before. Batches come out
// in exactly the loader's order, each with the loader's position and anchor
// Rng state right after it, which is what a checkpoint taken after that
// batch's step must store: the loader itself runs ahead and cannot be asked.
//
// The consumer takes a filled slot with acquire(), copies from it and hands
// it back with release() once its copies have completed.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_PREFETCH_H
#define DFLASH_RUNTIME_PREFETCH_H

#include "runtime/data/BatchLoader.h"
#include "schema/Status.h"
#include "schema/StepBuffers.h"

#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dflash::rt {

/// Where the slots live: page-locked memory for copies to a GPU, or ordinary
/// memory where no GPU is involved (tests).
enum class HostMemory { Pinned, Pageable };

/// One prefetched batch; the arrays hold the inputs of docs/semantics.md
/// section 1 for this rank's B rows, row-major.
struct PrefetchedBatch : BatchArrays {
  std::vector<int64_t> rows; ///< source row of each batch row
  /// Rows skipped for non-finite features (HostBatch::skippedRows).
  std::vector<SkippedRow> skippedRows;
  /// The loader's state after this batch.
  DataPosition positionAfter;
  Rng::State anchorRngAfter{};
  /// 0 for the first batch since start(), then 1, 2, ...
  int64_t sequence = 0;

  /// The six input arrays, in StepInput order (what a step copies in).
  std::array<const void *, kNumStepInputs> inputs() const {
    return {inputIds, lossMask, hiddenStates, anchors, keep, positionIds};
  }
};

class BatchPrefetcher {
public:
  /// `loader` is used only by the prefetch thread from start() to stop().
  BatchPrefetcher(BatchLoader &loader, const ModelConfig &config,
                  HostMemory memory, int slots = 2);
  BatchPrefetcher(const BatchPrefetcher &) = delete;
  BatchPrefetcher &operator=(const BatchPrefetcher &) = delete;
  /// Stops the thread and frees the slots.
  ~BatchPrefetcher();

  /// Allocates the slots and starts the thread, which reads at most `limit`
  /// batches (the steps the run has left; negative: no limit), so that it
  /// neither reads data nobody will use nor keeps the last step waiting on
  /// exit for a batch being built.
  Status start(int64_t limit = -1);
  /// Waits for the next batch in order. A read error of the loader is
  /// returned here, when the consumer reaches the batch that failed.
  Status acquire(PrefetchedBatch *&batch);
  /// Gives a slot back for refilling; its data must no longer be in use.
  void release(PrefetchedBatch *batch);
  /// Stops the thread; batches not yet consumed are dropped.
  void stop();

  /// Host bytes of one slot.
  size_t slotBytes() const;

private:
  struct Slot {
    PrefetchedBatch batch;
    void *memory = nullptr;
  };

  void produce();
  Status allocateSlot(Slot &slot);
  void freeSlot(Slot &slot);

  BatchLoader &loader;
  const ModelConfig &config;
  HostMemory memoryKind;
  std::vector<Slot> slots;

  std::mutex mutex;
  std::condition_variable changed;
  std::deque<size_t> freeSlots, readySlots;
  Status failure; ///< the loader's error, after the last good batch
  bool failed = false, stopping = false;
  int64_t produced = 0;
  int64_t limit = -1;
  std::thread worker;
};

/// Hands a prefetched batch back on every path out of a step.
class BatchLease {
public:
  BatchLease(BatchPrefetcher &prefetcher, PrefetchedBatch *batch)
      : prefetcher(prefetcher), batch(batch) {}
  BatchLease(const BatchLease &) = delete;
  BatchLease &operator=(const BatchLease &) = delete;
  ~BatchLease() { release(); }
  void release() {
    if (batch)
      prefetcher.release(batch);
    batch = nullptr;
  }
  /// The batch outlives this lease (its owner releases it later).
  void keep() { batch = nullptr; }

private:
  BatchPrefetcher &prefetcher;
  PrefetchedBatch *batch;
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_PREFETCH_H
