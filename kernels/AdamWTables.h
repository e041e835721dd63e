//===- AdamWTables.h - Layout of the optimizer's device tables --*- C++ -*-===//
//
// Plain C++ (no CUDA): the multi-tensor AdamW reads one table of tensors and
// one of chunks (kernels/AdamW.cuh). dflash-plan-memory reserves their bytes
// in the arena with adamwTableLayout, and the runtime writes the tables into
// that slot with the same layout, so both agree on every offset.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_KERNELS_ADAMWTABLES_H
#define DFLASH_KERNELS_ADAMWTABLES_H

#include <cstdint>

namespace dflash::kernels {

/// Elements per chunk: one CTA's share.
constexpr int64_t kAdamWChunkElems = 16384;
/// sizeof(AdamWTensor) and sizeof(AdamWChunk) (AdamW.cuh asserts both).
constexpr int64_t kAdamWTensorBytes = 48;
constexpr int64_t kAdamWChunkBytes = 16;
/// Each table starts on this boundary.
constexpr int64_t kAdamWTableAlignment = 256;

constexpr int64_t adamwAlign(int64_t bytes) {
  return (bytes + kAdamWTableAlignment - 1) / kAdamWTableAlignment *
         kAdamWTableAlignment;
}

/// Chunks of a tensor (or shard piece) of `elements` elements.
constexpr int64_t adamwChunkCount(int64_t elements) {
  return (elements + kAdamWChunkElems - 1) / kAdamWChunkElems;
}

/// Byte offsets of the optimizer's tables inside their arena slot: two
/// tensor tables (the update reading bf16 gradients, then the one reading
/// the all-reduced fp32 buckets), the chunks, one fp64 partial sum per
/// chunk, the global norm and clip coefficient (and with ZeRO-1 the square
/// sum) in one block, then the step state (lr, step).
struct AdamWTableLayout {
  int64_t tensors = 0, chunks = 0, partials = 0, normAndClip = 0, state = 0;
  int64_t bytes = 0;
};

constexpr AdamWTableLayout adamwTableLayout(int64_t numTensors,
                                            int64_t maxChunks) {
  AdamWTableLayout l;
  l.tensors = 0;
  l.chunks = l.tensors + adamwAlign(2 * numTensors * kAdamWTensorBytes);
  l.partials = l.chunks + adamwAlign(maxChunks * kAdamWChunkBytes);
  l.normAndClip = l.partials + adamwAlign(maxChunks * 8);
  l.state = l.normAndClip + kAdamWTableAlignment;
  l.bytes = l.state + kAdamWTableAlignment;
  return l;
}

} // namespace dflash::kernels

#endif // DFLASH_KERNELS_ADAMWTABLES_H
