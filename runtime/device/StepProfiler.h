//===- StepProfiler.h - Per-kernel times of eager steps ---------*- C++ -*-===//
//
// With DFLASH_PROFILE=1 in the environment, the generated programs bracket
// each of their ops with CUDA events and, when a program ends, print the
// median time of every op over the profiled steps and a total by op kind, to
// stderr. Eager steps record the events as they launch; a captured graph
// holds them as event-record nodes (cudaEventRecordExternal), so its replays
// time the ops as train runs them, and each replay's times are collected
// before the next (beforeReplay). Without the variable begin()/end() are a
// branch each.
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
    if (enabled && cudaGetDevice(&device) != cudaSuccess) {
      (void)cudaGetLastError(); // the runtime's own checks report it
      device = -1;
    }
  }
  StepProfiler(const StepProfiler &) = delete;
  StepProfiler &operator=(const StepProfiler &) = delete;

  ~StepProfiler() {
    if (enabled && !events.empty())
      report();
    for (cudaEvent_t e : events)
      if (e)
        cudaEventDestroy(e); // at exit: nothing to report a failure to
  }

  /// Collects the previous step's times (it has finished: the runtime waits
  /// for each step's metrics) and starts a new step: launched now, or
  /// captured into a graph when `stream` is capturing (its replays record).
  void beginStep(cudaStream_t stream) {
    if (!enabled)
      return;
    if (events.empty()) {
      events.resize(2 * names.size(), nullptr);
      samples.resize(names.size());
      for (cudaEvent_t &e : events)
        if (!ok(cudaEventCreate(&e), "cudaEventCreate"))
          return;
    } else {
      collect();
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (!ok(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing"))
      return;
    capturing = capture == cudaStreamCaptureStatusActive;
    graph = graph || capturing;
    recorded = !capturing; // a capture runs nothing until replayed
  }
  /// Before each replay of a graph captured from this program: collects the
  /// previous replay's times (waiting for it) and counts on the next.
  void beforeReplay() {
    if (!enabled || events.empty())
      return;
    collect();
    recorded = true;
  }
  void begin(size_t op, cudaStream_t stream) {
    if (enabled)
      record(events[2 * op], stream);
  }
  void end(size_t op, cudaStream_t stream) {
    if (enabled)
      record(events[2 * op + 1], stream);
  }

private:
  /// Prints the medians (stderr), each op and each op kind.
  /// One report per program, written at once: the workers of a multi-GPU
  /// run report from their own threads, each headed by its GPU's number.
  void report() {
    collect();
    std::map<std::string, double> byKind;
    double total = 0;
    const std::string gpu =
        device >= 0 ? "GPU " + std::to_string(device) + ": " : std::string();
    std::string text;
    char line[512];
    std::snprintf(line, sizeof(line),
                  "profile: %smedian ms per op over %zu %s\n", gpu.c_str(),
                  samples.empty() ? size_t(0) : samples[0].size(),
                  graph ? "graph replays" : "eager steps");
    text += line;
    for (size_t i = 0; i < names.size(); ++i) {
      std::vector<float> &t = samples[i];
      if (t.empty())
        continue;
      std::sort(t.begin(), t.end());
      double ms = t[t.size() / 2];
      total += ms;
      byKind[names[i].substr(0, names[i].find(' '))] += ms;
      // The name whole, however long: only the number goes through line.
      std::snprintf(line, sizeof(line), "profile: %8.3f ms  ", ms);
      text += line + names[i] + "\n";
    }
    std::vector<std::pair<double, std::string>> kinds;
    for (auto &[kind, ms] : byKind)
      kinds.push_back({ms, kind});
    std::sort(kinds.rbegin(), kinds.rend());
    for (auto &[ms, kind] : kinds) {
      std::snprintf(line, sizeof(line), "profile: %8.3f ms %5.1f%%  total of ",
                    ms, 100 * ms / total);
      text += line + kind + "\n";
    }
    std::snprintf(line, sizeof(line), "profile: %8.3f ms  all ops\n", total);
    text += line;
    std::fputs(text.c_str(), stderr);
  }

  std::vector<std::string> names;
  std::vector<cudaEvent_t> events;
  std::vector<std::vector<float>> samples;
  int device = -1; ///< the GPU the program runs on, for the report
  bool enabled = false, recorded = false;
  bool capturing = false; ///< the step being issued is a graph's capture
  bool graph = false;     ///< some step was captured: samples are replays

  void record(cudaEvent_t event, cudaStream_t stream) {
    // Inside a capture a plain record only orders streams; External makes
    // it a node that records (with its time) at every replay.
    ok(capturing
           ? cudaEventRecordWithFlags(event, stream, cudaEventRecordExternal)
           : cudaEventRecord(event, stream),
       "cudaEventRecord");
  }

  /// A failed call stops the profile (with a message), never the run: its
  /// error is cleared so that the runtime's own checks do not see it.
  bool ok(cudaError_t status, const char *what) {
    if (status == cudaSuccess)
      return true;
    (void)cudaGetLastError();
    std::fprintf(stderr, "profile: %s failed (%s); DFLASH_PROFILE stops\n",
                 what, cudaGetErrorString(status));
    enabled = false;
    return false;
  }

  void collect() {
    if (!recorded)
      return;
    for (size_t i = 0; i < names.size(); ++i) {
      float ms = 0;
      // An op whose events this step did not record has no sample; the
      // failed query's error is cleared for the runtime's own checks.
      if (cudaEventSynchronize(events[2 * i + 1]) == cudaSuccess &&
          cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]) ==
              cudaSuccess)
        samples[i].push_back(ms);
      else
        (void)cudaGetLastError();
    }
    recorded = false;
  }
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_STEPPROFILER_H
