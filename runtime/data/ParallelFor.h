//===- ParallelFor.h - Independent work items on every core -----*- C++ -*-===//
//
// The host side of a step touches gigabytes per row at long context (one row
// of 131072 tokens of qwen3-8b-b16 is 5.4 GB of features): one thread's pass
// over them takes longer than the GPU step it is prepared behind.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_DATA_PARALLELFOR_H
#define DFLASH_RUNTIME_DATA_PARALLELFOR_H

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace dflash::rt {

/// Runs body(i) for i in [0, n) on all cores; each i must be independent.
template <typename Body> void parallelFor(int64_t n, const Body &body) {
  const int64_t threads = std::max<int64_t>(
      1, std::min<int64_t>(n, std::thread::hardware_concurrency()));
  if (threads == 1) {
    for (int64_t i = 0; i < n; ++i)
      body(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (int64_t i = next++; i < n; i = next++)
        body(i);
    });
  for (std::thread &t : pool)
    t.join();
}

/// Elements a chunk of parallelFor over a large array (16 Mi).
constexpr size_t kParallelChunk = size_t(1) << 24;

/// Number of kParallelChunk chunks of `count` elements.
inline int64_t parallelChunks(size_t count) {
  return int64_t((count + kParallelChunk - 1) / kParallelChunk);
}

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_DATA_PARALLELFOR_H
