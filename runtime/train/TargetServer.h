//===- TargetServer.h - The online target on a GPU of its own ---*- C++ -*-===//
//
// TargetServer: the online target (the generated target program) on one
// GPU, driven by a thread of its own, computing the features of the
// batches of one or more drafter GPUs (`train --target-gpus`). A drafter's
// Trainer submits the tokens of its next batch while its current step
// runs; the server's thread enqueues, on its stream: the tokens' copy, the
// target (a CUDA graph), a wait until the drafter's staging buffer is free,
// and a copy of the features into it; the drafter's copy stream then waits
// for the delivery. Nothing waits on the host, so the target computes the
// batch of step k + 1 while the drafter runs step k (the drafter's staging
// buffer and its step input are the two buffers): a drafter waits only
// when its target is slower than it.
//
// The features move by a peer copy (copy engines, over NVLink), not over
// NCCL: one process drives every GPU of a node, so no communicator is
// needed; the copy takes no SMs from the step; and the path runs unchanged
// with target and drafter on one GPU (two threads), where NCCL refuses two
// ranks. Target and drafters are therefore GPUs of one node; each node of
// a multi-node run has its own target GPUs.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_RUNTIME_TRAIN_TARGETSERVER_H
#define DFLASH_RUNTIME_TRAIN_TARGETSERVER_H

#include "runtime/device/DeviceContext.h"
#include "runtime/device/StepBuffers.h"
#include "runtime/device/StepProgram.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dflash::rt {

/// Whether `weights` (loadFrozenTensors' order) fill the target program's
/// Frozen buffers: one per buffer, each of its size. Messages name it.
Status checkTargetWeights(const std::vector<BufferSpec> &specs,
                          const TargetBufferMap &map,
                          const std::vector<std::vector<uint16_t>> &weights);
/// checkTargetWeights, then copies them into `buffers` (one per spec, on
/// the current device), waiting for each copy.
Status uploadTargetWeights(const std::vector<BufferSpec> &specs,
                           const TargetBufferMap &map,
                           const std::vector<void *> &buffers,
                           const std::vector<std::vector<uint16_t>> &weights);

/// One batch whose features a drafter wants.
struct FeatureRequest {
  int client = 0; ///< which of the server's drafters (0 .. clients - 1)
  /// [B, S] int32 each, in host memory that stays valid until the delivery
  /// event has completed (pinned, so that the copy is asynchronous).
  const int32_t *inputIds = nullptr, *positionIds = nullptr;
  /// target_hidden's bytes are copied here, on `destinationDevice`, once
  /// `destinationFree` (an event of that device; null: at once) is done.
  void *destination = nullptr;
  int destinationDevice = 0;
  cudaEvent_t destinationFree = nullptr;
  /// Timed requests are numbered per client (see busyMs); an evaluation's
  /// are not.
  bool timed = true;
};

/// How a TargetServer runs its program.
struct TargetServerOptions {
  bool useGraph = true;  ///< capture it as a CUDA graph (train --no-graph)
  bool timeGemms = true; ///< time the GEMM algorithms (--no-gemm-timing)
};

class TargetServer {
public:
  /// Starts the thread, then on it: the device context of `gpu`, the target
  /// program from `factory`, its buffers and arena, `weights` (in the order
  /// of its Frozen buffers, as loadFrozenTensors gives them) uploaded, the
  /// program bound and, with `options.useGraph`, captured as a CUDA graph.
  /// Serves
  /// `clients` drafters, on devices `clientDevices` (peer access is enabled
  /// to each where the hardware allows it). Returns once that is done.
  static Status
  create(int gpu, const std::function<std::unique_ptr<StepProgram>()> &factory,
         const std::vector<std::vector<uint16_t>> &weights,
         const std::vector<int> &clientDevices, TargetServerOptions options,
         std::unique_ptr<TargetServer> &server);
  TargetServer(const TargetServer &) = delete;
  TargetServer &operator=(const TargetServer &) = delete;
  /// Waits for the work it has enqueued, then frees its GPU's objects on
  /// its thread and ends it. A drafter whose staging buffer is the
  /// destination of a pending copy must be freed after its server.
  ~TargetServer();

  int device() const { return gpu; }
  const std::string &deviceName() const { return name; }
  int clients() const { return int(clientDevices.size()); }
  /// The target program's target_hidden: what a drafter's step input of
  /// that name must be.
  const BufferSpec &featureSpec() const { return featureBuffer; }
  /// The tokens of one batch: input_ids' shape.
  const BufferSpec &tokenSpec() const { return tokenBuffer; }
  /// Device memory in use after set-up (weights, buffers, arena).
  const DeviceMemory &memoryInUse() const { return memoryAfterSetUp; }

  /// From a drafter's thread: enqueues `request` on the target's stream
  /// and returns once it is enqueued (the GPU work is not waited for) with
  /// the event that marks the features' arrival, on the server's device.
  /// `ticket` is the request's number among its client's timed ones
  /// (-1 untimed). Fails once the server has failed.
  Status submit(const FeatureRequest &request, cudaEvent_t &delivered,
                int64_t &ticket);
  /// The target's GPU time for `client`'s timed request `ticket`, which
  /// must be delivered (its consumer waited for it), and must be one of the
  /// client's last two.
  Status busyMs(int client, int64_t ticket, float &ms);

private:
  using Job = std::function<Status()>;
  TargetServer() = default;
  /// Runs `job` on the server's thread and waits for its result.
  Status call(Job job);
  void serve();
  Status setUp(const std::function<std::unique_ptr<StepProgram>()> &factory,
               const std::vector<std::vector<uint16_t>> &weights,
               TargetServerOptions options);
  Status enqueue(const FeatureRequest &request, cudaEvent_t &delivered,
                 int64_t &ticket);
  void release();

  int gpu = 0;
  std::string name;
  std::vector<int> clientDevices;
  BufferSpec featureBuffer, tokenBuffer;
  DeviceMemory memoryAfterSetUp;

  // Owned by the server's thread.
  std::unique_ptr<DeviceContext> context;
  std::unique_ptr<StepProgram> program;
  TargetBufferMap map;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t graphExec = nullptr;
  /// Per client: its delivery event, and for its last two timed requests
  /// (by ticket parity) the events around the target and the ticket.
  struct Client {
    cudaEvent_t delivered = nullptr;
    cudaEvent_t start[2] = {nullptr, nullptr}, end[2] = {nullptr, nullptr};
    int64_t ticketOf[2] = {-1, -1};
    int64_t nextTicket = 0;
  };
  std::vector<Client> slots;
  Status failure; ///< the first failed enqueue: every later one fails too

  std::thread thread;
  std::mutex mutex;
  std::condition_variable changed;
  struct Call {
    Job job;
    Status result;
    bool done = false;
  };
  std::deque<Call *> calls; ///< guarded by mutex, as Call::done is
  bool quit = false;        ///< guarded by mutex
};

} // namespace dflash::rt

#endif // DFLASH_RUNTIME_TRAIN_TARGETSERVER_H
