//===- DeviceContext.cu - One GPU's stream, cuBLASLt and memory -----------===//

#include "runtime/device/DeviceContext.h"

#include "runtime/device/Collectives.h"

#include "kernels/CudaCheck.cuh"
#include "kernels/Gemm.cuh"

#include <cstdio>

using namespace dflash;
using namespace dflash::rt;

Status dflash::rt::cudaCallStatus(cudaError_t status, const std::string &what) {
  if (status == cudaSuccess)
    return Status::success();
  // Clear the sticky last error so that later checks report their own call.
  (void)cudaGetLastError();
  return Status::error(what + ": " + cudaGetErrorString(status));
}

Status dflash::rt::cublasCallStatus(cublasStatus_t status,
                                    const std::string &what) {
  if (status == CUBLAS_STATUS_SUCCESS)
    return Status::success();
  return Status::error(what + ": " + kernels::detail::cublasStatusName(status));
}

int dflash::rt::visibleCudaDevices(std::string &reason) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0)
    return count;
  (void)cudaGetLastError();
  reason = status == cudaSuccess ? "" : cudaGetErrorString(status);
  return 0;
}

std::string dflash::rt::formatBytes(size_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = double(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  if (unit == 0)
    std::snprintf(text, sizeof(text), "%zu B", bytes);
  else
    std::snprintf(text, sizeof(text), "%.1f %s", value, units[unit]);
  return text;
}

Status DeviceContext::create(int device, size_t gemmWorkspaceBytes,
                             std::unique_ptr<DeviceContext> &context) {
  std::unique_ptr<DeviceContext> made(new DeviceContext());
  made->deviceIndex = device;
  const std::string where = " on device " + std::to_string(device);
  DFLASH_RETURN_IF_ERROR(made->makeCurrent());
  cudaDeviceProp props;
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(cudaGetDeviceProperties(&props, device),
                                        "cudaGetDeviceProperties" + where));
  made->deviceName = props.name;
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(
      cudaStreamCreateWithFlags(&made->mainStream, cudaStreamNonBlocking),
      "cudaStreamCreateWithFlags" + where));
  DFLASH_RETURN_IF_ERROR(cublasCallStatus(cublasLtCreate(&made->cublasLt),
                                          "cublasLtCreate" + where));
  if (gemmWorkspaceBytes > 0) {
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaMalloc(&made->workspace, gemmWorkspaceBytes),
                       "cudaMalloc of the " + formatBytes(gemmWorkspaceBytes) +
                           " cuBLASLt workspace" + where));
    made->workspaceSize = gemmWorkspaceBytes;
  }
  made->gemmPlanner = std::make_unique<kernels::CublasLtGemm>(
      made->cublasLt, made->workspace, made->workspaceSize);
  context = std::move(made);
  return Status::success();
}

DeviceContext::~DeviceContext() {
  // Nothing can be reported from here: free what exists, ignore failures (a
  // device in an error state has already been reported by the caller).
  if (deviceIndex >= 0)
    (void)cudaSetDevice(deviceIndex);
  if (mainStream)
    (void)cudaStreamSynchronize(mainStream);
  gemmPlanner.reset();
  for (void *pointer : bufferPointers)
    if (pointer)
      (void)cudaFree(pointer);
  if (arenaPointer)
    (void)cudaFree(arenaPointer);
  if (workspace)
    (void)cudaFree(workspace);
  if (cublasLt)
    (void)cublasLtDestroy(cublasLt);
  if (mainStream)
    (void)cudaStreamDestroy(mainStream);
  (void)cudaGetLastError();
}

Status DeviceContext::makeCurrent() const {
  return cudaCallStatus(cudaSetDevice(deviceIndex),
                        "cudaSetDevice(" + std::to_string(deviceIndex) + ")");
}

Status DeviceContext::allocate(const std::vector<BufferSpec> &specs,
                               size_t arenaBytes) {
  if (allocated)
    return Status::error("device " + std::to_string(deviceIndex) +
                         ": step buffers allocated twice");
  allocated = true;
  const std::string where = " on device " + std::to_string(deviceIndex);
  bufferPointers.assign(specs.size(), nullptr);
  for (size_t i = 0; i < specs.size(); ++i) {
    // A zero-sized buffer still gets a distinct, valid pointer.
    size_t bytes = specs[i].bytes() ? specs[i].bytes() : 256;
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaMalloc(&bufferPointers[i], bytes),
                       "cudaMalloc of buffer '" + specs[i].name + "' (" +
                           formatBytes(bytes) + ")" + where));
    bufferSize += bytes;
    // Moments start at zero and metrics must not show garbage: zero them all.
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaMemsetAsync(bufferPointers[i], 0, bytes, mainStream),
        "cudaMemsetAsync of buffer '" + specs[i].name + "'" + where));
  }
  arenaSize = arenaBytes;
  DFLASH_RETURN_IF_ERROR(
      cudaCallStatus(cudaMalloc(&arenaPointer, arenaBytes ? arenaBytes : 256),
                     "cudaMalloc of the " + formatBytes(arenaBytes) +
                         " activation arena" + where));
  return synchronize("zeroing the step buffers" + where);
}

DeviceResources DeviceContext::resources() {
  DeviceResources resources;
  resources.gemm = gemmPlanner.get();
  resources.allReduceSum = nullptr;
  resources.reduceScatterSum = nullptr;
  resources.allGather = nullptr;
  resources.collectives = nullptr;
  resources.rank = 0;
  resources.worldSize = 1;
  if (communicator) {
    resources.allReduceSum = &Collectives::allReduceSumHook;
    resources.reduceScatterSum = &Collectives::reduceScatterSumHook;
    resources.allGather = &Collectives::allGatherHook;
    resources.collectives = communicator;
    resources.rank = communicator->rank();
    resources.worldSize = communicator->worldSize();
  }
  return resources;
}

Status DeviceContext::memory(DeviceMemory &info) const {
  DFLASH_RETURN_IF_ERROR(makeCurrent());
  return cudaCallStatus(cudaMemGetInfo(&info.freeBytes, &info.totalBytes),
                        "cudaMemGetInfo on device " +
                            std::to_string(deviceIndex));
}

Status DeviceContext::synchronize(const std::string &what) const {
  return cudaCallStatus(cudaStreamSynchronize(mainStream), what);
}

void DeviceContext::setGemmTiming(bool on) { gemmPlanner->setTiming(on); }

Status DeviceContext::timeNewGemmShapes(bool *changed) {
  if (changed)
    *changed = false;
  if (gemmPlanner->untimedPlans() == 0)
    return Status::success();
  DFLASH_RETURN_IF_ERROR(makeCurrent());
  const int moved = gemmPlanner->timeCandidates(mainStream);
  if (changed)
    *changed = moved > 0;
  return cudaCallStatus(cudaGetLastError(),
                        "timing the GEMM algorithms on device " +
                            std::to_string(deviceIndex));
}

const kernels::GemmTimingSummary &DeviceContext::gemmTimingSummary() const {
  return gemmPlanner->timingSummary();
}

std::vector<kernels::GemmCandidateTimes> DeviceContext::gemmTimings() const {
  return gemmPlanner->timings();
}

Status dflash::rt::launchProgram(StepProgram &program,
                                 cudaGraphExec_t graphExec, cudaStream_t stream,
                                 const std::string &what) {
  if (!graphExec)
    return program.enqueue(stream);
  program.beforeReplay();
  return cudaCallStatus(cudaGraphLaunch(graphExec, stream),
                        "cudaGraphLaunch of " + what);
}

Status
dflash::rt::captureProgramGraph(StepProgram &program, DeviceContext &device,
                                const std::string &what, cudaGraph_t &graph,
                                cudaGraphExec_t &graphExec,
                                const std::function<Status()> &afterCapture) {
  cudaStream_t stream = device.stream();
  auto capture = [&]() -> Status {
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
        "cudaStreamBeginCapture"));
    Status enqueued = program.enqueue(stream);
    cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (!enqueued.ok())
      return enqueued;
    return cudaCallStatus(ended, "capturing " + what +
                                     " as a CUDA graph (try --no-graph to "
                                     "run it eagerly)");
  };
  DFLASH_RETURN_IF_ERROR(capture());
  bool changed = false;
  DFLASH_RETURN_IF_ERROR(device.timeNewGemmShapes(&changed));
  if (changed) { // the graph holds the heuristic's algorithms: once more
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaGraphDestroy(graph), "cudaGraphDestroy"));
    graph = nullptr;
    DFLASH_RETURN_IF_ERROR(capture());
  }
  if (afterCapture)
    DFLASH_RETURN_IF_ERROR(afterCapture());
  return cudaCallStatus(cudaGraphInstantiate(&graphExec, graph, 0),
                        "cudaGraphInstantiate of " + what);
}
