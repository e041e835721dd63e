//===- Prefetch.cpp - Reading batches ahead on a thread -------------------===//

#include "runtime/data/Prefetch.h"

#include "runtime/device/DeviceContext.h"

#include <cstdlib>
#include <new>

using namespace dflash;
using namespace dflash::rt;

namespace {
/// Byte sizes of the six arrays of one slot, each rounded up to 256 bytes
/// so that every array starts aligned for DMA and vector loads.
struct SlotLayout {
  size_t inputIds, lossMask, hiddenStates, anchors, keep, positionIds;
  static size_t round(size_t bytes) { return (bytes + 255) / 256 * 256; }
  explicit SlotLayout(const ModelConfig &c) {
    size_t rowsTimesSeq = size_t(c.rowsPerStep()) * size_t(c.seqLen);
    size_t anchorSlots = size_t(c.rowsPerStep()) * size_t(c.anchorsPerRow);
    inputIds = round(rowsTimesSeq * sizeof(int32_t));
    lossMask = round(rowsTimesSeq);
    hiddenStates =
        round(rowsTimesSeq * size_t(c.contextWidth()) * sizeof(uint16_t));
    anchors = round(anchorSlots * sizeof(int32_t));
    keep = round(anchorSlots);
    positionIds = round(rowsTimesSeq * sizeof(int32_t));
  }
  size_t total() const {
    return inputIds + lossMask + hiddenStates + anchors + keep + positionIds;
  }
};
} // namespace

BatchPrefetcher::BatchPrefetcher(BatchLoader &loader, const ModelConfig &config,
                                 HostMemory memory, int numSlots)
    : loader(loader), config(config), memoryKind(memory),
      slots(size_t(numSlots > 1 ? numSlots : 1)) {}

BatchPrefetcher::~BatchPrefetcher() {
  stop();
  for (Slot &slot : slots)
    freeSlot(slot);
}

size_t BatchPrefetcher::slotBytes() const { return SlotLayout(config).total(); }

Status BatchPrefetcher::allocateSlot(Slot &slot) {
  SlotLayout layout(config);
  size_t bytes = layout.total();
  if (memoryKind == HostMemory::Pinned) {
    // Portable: any device of the process may copy from it.
    if (Status s = cudaCallStatus(
            cudaHostAlloc(&slot.memory, bytes, cudaHostAllocPortable),
            "cudaHostAlloc of a " + formatBytes(bytes) + " batch buffer");
        !s.ok()) {
      slot.memory = nullptr;
      return s;
    }
  } else {
    slot.memory = ::operator new(bytes, std::align_val_t(256), std::nothrow);
    if (!slot.memory)
      return Status::error("cannot allocate a " + formatBytes(bytes) +
                           " batch buffer");
  }
  auto *base = static_cast<uint8_t *>(slot.memory);
  PrefetchedBatch &b = slot.batch;
  b.inputIds = reinterpret_cast<int32_t *>(base);
  base += layout.inputIds;
  b.lossMask = base;
  base += layout.lossMask;
  b.hiddenStates = reinterpret_cast<uint16_t *>(base);
  base += layout.hiddenStates;
  b.anchors = reinterpret_cast<int32_t *>(base);
  base += layout.anchors;
  b.keep = base;
  base += layout.keep;
  b.positionIds = reinterpret_cast<int32_t *>(base);
  return Status::success();
}

void BatchPrefetcher::freeSlot(Slot &slot) {
  if (!slot.memory)
    return;
  if (memoryKind == HostMemory::Pinned)
    (void)cudaFreeHost(slot.memory);
  else
    ::operator delete(slot.memory, std::align_val_t(256));
  slot.memory = nullptr;
}

Status BatchPrefetcher::start(int64_t batchLimit) {
  if (worker.joinable())
    return Status::error("the batch prefetcher is started twice");
  for (Slot &slot : slots)
    DFLASH_RETURN_IF_ERROR(allocateSlot(slot));
  {
    std::lock_guard<std::mutex> lock(mutex);
    freeSlots.clear();
    readySlots.clear();
    for (size_t i = 0; i < slots.size(); ++i)
      freeSlots.push_back(i);
    stopping = failed = false;
    produced = 0;
    limit = batchLimit;
  }
  worker = std::thread([this] { produce(); });
  return Status::success();
}

void BatchPrefetcher::produce() {
  for (int64_t started = 0;; ++started) {
    if (limit >= 0 && started == limit) {
      std::lock_guard<std::mutex> lock(mutex);
      failure =
          Status::error("the batch prefetcher was asked for more than its " +
                        std::to_string(limit) + " batches");
      failed = true; // reported only to a consumer that asks for more
      changed.notify_all();
      return;
    }
    size_t index;
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [&] { return stopping || !freeSlots.empty(); });
      if (stopping)
        return;
      index = freeSlots.front();
      freeSlots.pop_front();
    }
    // The loader writes into the slot itself: a long row's features are
    // gigabytes, and a second copy would outlast the step.
    PrefetchedBatch &b = slots[index].batch;
    BatchBuffers out;
    static_cast<BatchArrays &>(out) = b;
    out.rows = &b.rows;
    out.skippedRows = &b.skippedRows;
    Status status = loader.next(out);
    if (!status.ok()) {
      std::lock_guard<std::mutex> lock(mutex);
      failure = status;
      failed = true;
      changed.notify_all();
      return;
    }
    b.positionAfter = loader.position();
    b.anchorRngAfter = loader.anchorRngState();
    std::lock_guard<std::mutex> lock(mutex);
    b.sequence = produced++;
    readySlots.push_back(index);
    changed.notify_all();
  }
}

Status BatchPrefetcher::acquire(PrefetchedBatch *&batch) {
  std::unique_lock<std::mutex> lock(mutex);
  if (!worker.joinable())
    return Status::error("the batch prefetcher is not running");
  changed.wait(lock, [&] { return !readySlots.empty() || failed; });
  if (readySlots.empty())
    return failure;
  batch = &slots[readySlots.front()].batch;
  readySlots.pop_front();
  return Status::success();
}

void BatchPrefetcher::release(PrefetchedBatch *batch) {
  std::lock_guard<std::mutex> lock(mutex);
  for (size_t i = 0; i < slots.size(); ++i)
    if (&slots[i].batch == batch) {
      freeSlots.push_back(i);
      changed.notify_all();
      return;
    }
}

void BatchPrefetcher::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    stopping = true;
    changed.notify_all();
  }
  if (worker.joinable())
    worker.join();
}
