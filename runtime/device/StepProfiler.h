//===- StepProfiler.h - Per-kernel times of eager steps ---------*- C++ -*-===//
//
// With DFLASH_PROFILE=1 in the environment and `train --no-graph`, the
// generated step brackets each of its ops with CUDA events and, when the
// program ends, prints the median time of every op over the profiled steps
// and a total by op kind, to stderr. Without the variable begin()/end() are a
// branch each. Graph replays are not profiled: events inside a capture do
// not time the replay.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_STEPPROFILER_H
#define DFLASH_RUNTIME_STEPPROFILER_H

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace dflash::rt {

class StepProfiler {
public:
  /// `names[i]` describes op i ("dflash.linear layers.0.self_attn").
  explicit StepProfiler(std::vector<std::string> names)
      : names(std::move(names)) {
    const char *env = std::getenv("DFLASH_PROFILE");
    enabled = env && *env && std::string(env) != "0";
  }
  StepProfiler(const StepProfiler &) = delete;
  StepProfiler &operator=(const StepProfiler &) = delete;

  ~StepProfiler() {
    if (!enabled || events.empty())
      return;
    collect();
    std::map<std::string, double> byKind;
    double total = 0;
    std::fprintf(stderr, "profile: median ms per op over %zu eager steps\n",
                 samples.empty() ? size_t(0) : samples[0].size());
    for (size_t i = 0; i < names.size(); ++i) {
      std::vector<float> &t = samples[i];
      if (t.empty())
        continue;
      std::sort(t.begin(), t.end());
      double ms = t[t.size() / 2];
      total += ms;
      byKind[names[i].substr(0, names[i].find(' '))] += ms;
      std::fprintf(stderr, "profile: %8.3f ms  %s\n", ms, names[i].c_str());
    }
    std::vector<std::pair<double, std::string>> kinds;
    for (auto &[kind, ms] : byKind)
      kinds.push_back({ms, kind});
    std::sort(kinds.rbegin(), kinds.rend());
    for (auto &[ms, kind] : kinds)
      std::fprintf(stderr, "profile: %8.3f ms %5.1f%%  total of %s\n", ms,
                   100 * ms / total, kind.c_str());
    std::fprintf(stderr, "profile: %8.3f ms  all ops\n", total);
  }

  /// Collects the previous step's times (it has finished: the runtime waits
  /// for each step's metrics) and starts a new step.
  void beginStep(cudaStream_t stream) {
    if (!enabled)
      return;
    if (events.empty()) {
      events.resize(2 * names.size());
      samples.resize(names.size());
      for (cudaEvent_t &e : events)
        cudaEventCreate(&e);
    } else {
      collect();
    }
    recorded = true;
  }
  void begin(size_t op, cudaStream_t stream) {
    if (enabled)
      cudaEventRecord(events[2 * op], stream);
  }
  void end(size_t op, cudaStream_t stream) {
    if (enabled)
      cudaEventRecord(events[2 * op + 1], stream);
  }

private:
  std::vector<std::string> names;
  std::vector<cudaEvent_t> events;
  std::vector<std::vector<float>> samples;
  bool enabled = false, recorded = false;

  void collect() {
    if (!recorded)
      return;
    for (size_t i = 0; i < names.size(); ++i) {
      float ms = 0;
      if (cudaEventSynchronize(events[2 * i + 1]) == cudaSuccess &&
          cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]) ==
              cudaSuccess)
        samples[i].push_back(ms);
    }
    recorded = false;
  }
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_STEPPROFILER_H
