//===- DeviceContext.h - One GPU's stream, cuBLASLt and memory --*- C++ -*-===//
//
// Everything a training step needs on one GPU besides the step itself: the
// device made current on the calling thread, a non-blocking stream, a
// cuBLASLt handle with its workspace and the GEMM planner of kernels/Gemm.cuh,
// the persistent buffers of a StepProgram and its activation arena, and the
// rank's NCCL communicator in a data-parallel run (owned by the caller). One
// context per GPU worker thread; a context is used from one thread at a time.
//
// Every CUDA and cuBLASLt call here is checked and turned into a Status
// ("cudaMalloc of buffer 'fc.weight' (2.0 MiB) on device 0: out of memory"),
// so that a failure reaches the user as "train: error: ..." and never as an
// abort.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_DEVICECONTEXT_H
#define DFLASH_RUNTIME_DEVICECONTEXT_H

#include "kernels/GemmTiming.h"
#include "runtime/device/StepProgram.h"
#include "schema/Status.h"

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime.h>

namespace dflash::rt {

class Collectives;

/// Success, or an error "<what>: <CUDA's description>".
Status cudaCallStatus(cudaError_t status, const std::string &what);
/// Success, or an error "<what>: <cuBLAS status name>".
Status cublasCallStatus(cublasStatus_t status, const std::string &what);

/// The number of visible CUDA devices. A machine without a usable driver
/// gives 0 and `reason` says why (empty when there is simply no device).
int visibleCudaDevices(std::string &reason);

/// "1.5 GiB", "256.0 MiB", "512 B".
std::string formatBytes(size_t bytes);

/// Device memory as cudaMemGetInfo sees it (every process on the device).
struct DeviceMemory {
  size_t freeBytes = 0;
  size_t totalBytes = 0;
  size_t usedBytes() const { return totalBytes - freeBytes; }
};

class DeviceContext;

/// Captures `program`'s enqueue() on `device`'s stream as a CUDA graph and
/// instantiates it. Thread-local capture: the other GPU threads of the
/// process may make calls a capture forbids (cudaMalloc, synchronisation)
/// meanwhile. GEMM shapes first planned during the capture are timed after
/// it (DeviceContext::timeNewGemmShapes), and the program is captured again
/// when that changed an algorithm. `what` names the program in errors ("the
/// step"); `afterCapture`, when given, is checked between the capture and
/// the instantiation (a communicator's refusal during the capture).
Status captureProgramGraph(StepProgram &program, DeviceContext &device,
                           const std::string &what, cudaGraph_t &graph,
                           cudaGraphExec_t &graphExec,
                           const std::function<Status()> &afterCapture = {});

/// Runs `program` once on `stream`: a replay of `graphExec` (made by
/// captureProgramGraph), or, when it is null, its ops launched eagerly.
/// Launch errors are the caller's to check with cudaGetLastError.
Status launchProgram(StepProgram &program, cudaGraphExec_t graphExec,
                     cudaStream_t stream, const std::string &what);

class DeviceContext {
public:
  /// Makes `device` current on the calling thread, then creates the stream,
  /// the cuBLASLt handle, `gemmWorkspaceBytes` of workspace and the GEMM
  /// planner.
  static Status create(int device, size_t gemmWorkspaceBytes,
                       std::unique_ptr<DeviceContext> &context);

  DeviceContext(const DeviceContext &) = delete;
  DeviceContext &operator=(const DeviceContext &) = delete;
  /// Waits for the stream, then frees everything it allocated.
  ~DeviceContext();

  /// Makes this context's device current on the calling thread; every worker
  /// thread calls it before its first CUDA call.
  Status makeCurrent() const;

  /// Allocates one zeroed device buffer per entry of `specs` (cudaMalloc, at
  /// least 256-byte aligned) and the arena. Once only.
  Status allocate(const std::vector<BufferSpec> &specs, size_t arenaBytes);

  int device() const { return deviceIndex; }
  /// "NVIDIA H200".
  const std::string &name() const { return deviceName; }
  cudaStream_t stream() const { return mainStream; }
  kernels::CublasLtGemm &gemm() { return *gemmPlanner; }
  /// One pointer per BufferSpec given to allocate(), in that order.
  const std::vector<void *> &buffers() const { return bufferPointers; }
  void *arena() const { return arenaPointer; }
  size_t arenaBytes() const { return arenaSize; }
  size_t workspaceBytes() const { return workspaceSize; }
  /// Bytes of the persistent buffers.
  size_t bufferBytes() const { return bufferSize; }

  /// Makes `collectives` (which must outlive the context's step) the
  /// communicator of this GPU's rank; null: no collectives.
  void attachCollectives(Collectives *collectives) {
    communicator = collectives;
  }
  Collectives *collectives() const { return communicator; }

  /// What the generated step uses: the GEMM planner, and with a
  /// communicator its all-reduce, reduce-scatter and all-gather hooks, rank
  /// and world size; without one no collectives, rank 0 of a world of 1.
  DeviceResources resources();

  /// The device's free and total memory now.
  Status memory(DeviceMemory &info) const;

  /// Waits for every operation issued on the stream.
  Status synchronize(const std::string &what) const;

  /// Off: every GEMM keeps cuBLASLt's first heuristic choice (`train
  /// --no-gemm-timing`). Set before the first launch.
  void setGemmTiming(bool on);
  /// Times the candidates of the GEMM shapes planned since the last call
  /// (kernels/Gemm.cuh) on the stream, which must not be capturing; waits
  /// for the stream. `changed`: whether an algorithm changed (a graph
  /// captured before then runs the old ones). Cheap when nothing is new:
  /// call it after every eager launch of a program.
  Status timeNewGemmShapes(bool *changed = nullptr);
  const kernels::GemmTimingSummary &gemmTimingSummary() const;
  /// Every shape this device's planner timed: candidates' medians, choice.
  std::vector<kernels::GemmCandidateTimes> gemmTimings() const;

private:
  DeviceContext() = default;

  int deviceIndex = -1;
  std::string deviceName;
  cudaStream_t mainStream = nullptr;
  cublasLtHandle_t cublasLt = nullptr;
  void *workspace = nullptr;
  size_t workspaceSize = 0;
  std::unique_ptr<kernels::CublasLtGemm> gemmPlanner;
  std::vector<void *> bufferPointers;
  size_t bufferSize = 0;
  void *arenaPointer = nullptr;
  size_t arenaSize = 0;
  bool allocated = false;
  Collectives *communicator = nullptr;
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_DEVICECONTEXT_H
