//===- TargetServer.cpp - The online target on a GPU of its own -----------===//

#include "runtime/train/TargetServer.h"

#include <algorithm>
#include <exception>

using namespace dflash;
using namespace dflash::rt;

Status TargetServer::create(
    int gpu, const std::function<std::unique_ptr<StepProgram>()> &factory,
    const std::vector<std::vector<uint16_t>> &weights,
    const std::vector<int> &clientDevices, TargetServerOptions options,
    std::unique_ptr<TargetServer> &server) {
  if (clientDevices.empty())
    return Status::error("the online target on device " + std::to_string(gpu) +
                         " serves no drafter GPU");
  std::unique_ptr<TargetServer> made(new TargetServer());
  made->gpu = gpu;
  made->clientDevices = clientDevices;
  made->thread = std::thread([raw = made.get()] { raw->serve(); });
  TargetServer *raw = made.get();
  if (Status s = made->call(
          [&, raw] { return raw->setUp(factory, weights, options); });
      !s.ok())
    return Status::error("the online target on device " + std::to_string(gpu) +
                         ": " + s.message());
  server = std::move(made);
  return Status::success();
}

TargetServer::~TargetServer() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    quit = true;
  }
  changed.notify_all();
  if (thread.joinable())
    thread.join();
}

Status TargetServer::call(Job job) {
  Call call;
  call.job = std::move(job);
  std::unique_lock<std::mutex> lock(mutex);
  if (quit)
    return Status::error("the online target on device " + std::to_string(gpu) +
                         " has stopped");
  calls.push_back(&call);
  changed.notify_all();
  changed.wait(lock, [&] { return call.done; });
  return call.result;
}

void TargetServer::serve() {
  while (true) {
    Call *next = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [&] { return !calls.empty() || quit; });
      if (calls.empty())
        break;
      next = calls.front();
      calls.pop_front();
    }
    Status result;
    try {
      result = next->job();
    } catch (const std::exception &error) {
      result = Status::error(error.what()); // a host allocation, mostly
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      next->result = std::move(result);
      next->done = true;
    }
    changed.notify_all();
  }
  release();
}

void TargetServer::release() {
  // On the server's thread, its device current: the stream first, since
  // pending copies write into the drafters' buffers.
  if (context)
    (void)context->synchronize("the online target");
  for (Client &c : slots) {
    for (cudaEvent_t e :
         {c.delivered, c.start[0], c.start[1], c.end[0], c.end[1]})
      if (e)
        (void)cudaEventDestroy(e);
  }
  slots.clear();
  if (graphExec)
    (void)cudaGraphExecDestroy(graphExec);
  if (graph)
    (void)cudaGraphDestroy(graph);
  graphExec = nullptr;
  graph = nullptr;
  program.reset();
  context.reset();
}

Status TargetServer::setUp(
    const std::function<std::unique_ptr<StepProgram>()> &factory,
    const std::vector<std::vector<uint16_t>> &weights,
    TargetServerOptions options) {
  program = factory ? factory() : nullptr;
  if (!program)
    return Status::error("this trainer was compiled without an online target");
  const std::vector<BufferSpec> &specs = program->buffers();
  DFLASH_RETURN_IF_ERROR(mapTargetBuffers(specs, map));
  featureBuffer = specs[size_t(map.features)];
  tokenBuffer = specs[size_t(map.inputIds)];
  // Checked before the GPU is touched; uploadTargetWeights checks again.
  DFLASH_RETURN_IF_ERROR(checkTargetWeights(specs, map, weights));

  DFLASH_RETURN_IF_ERROR(
      DeviceContext::create(gpu, program->gemmWorkspaceBytes(), context));
  context->setGemmTiming(options.timeGemms);
  name = context->name();
  // Copy engines write into the drafters' memory directly where the GPUs
  // are peers (NVLink); elsewhere CUDA stages the copy through the host.
  for (int peer : clientDevices) {
    if (peer == gpu)
      continue;
    int canAccess = 0;
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaDeviceCanAccessPeer(&canAccess, gpu, peer),
                       "cudaDeviceCanAccessPeer"));
    if (!canAccess)
      continue;
    cudaError_t enabled = cudaDeviceEnablePeerAccess(peer, 0);
    if (enabled == cudaErrorPeerAccessAlreadyEnabled)
      (void)cudaGetLastError();
    else
      DFLASH_RETURN_IF_ERROR(cudaCallStatus(enabled, "enabling peer access to "
                                                     "device " +
                                                         std::to_string(peer)));
  }
  DFLASH_RETURN_IF_ERROR(context->allocate(specs, program->arenaBytes()));
  const std::vector<void *> &buffers = context->buffers();
  DFLASH_RETURN_IF_ERROR(uploadTargetWeights(specs, map, buffers, weights));
  DFLASH_RETURN_IF_ERROR(program->bind(buffers, context->arena(),
                                       context->resources(), StepHyper{}));

  slots.assign(clientDevices.size(), Client());
  for (Client &c : slots) {
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaEventCreateWithFlags(&c.delivered, cudaEventDisableTiming),
        "cudaEventCreateWithFlags"));
    for (cudaEvent_t *e : {&c.start[0], &c.start[1], &c.end[0], &c.end[1]})
      DFLASH_RETURN_IF_ERROR(
          cudaCallStatus(cudaEventCreate(e), "cudaEventCreate"));
  }

  if (options.useGraph)
    DFLASH_RETURN_IF_ERROR(captureProgramGraph(
        *program, *context, "the online target", graph, graphExec));
  return context->memory(memoryAfterSetUp);
}

Status TargetServer::submit(const FeatureRequest &request,
                            cudaEvent_t &delivered, int64_t &ticket) {
  return call([&] { return enqueue(request, delivered, ticket); });
}

Status TargetServer::enqueue(const FeatureRequest &request,
                             cudaEvent_t &delivered, int64_t &ticket) {
  if (!failure.ok())
    return failure;
  if (request.client < 0 || request.client >= int(slots.size()))
    return Status::error("the online target on device " + std::to_string(gpu) +
                         " has no drafter " + std::to_string(request.client));
  if (!request.inputIds || !request.positionIds || !request.destination)
    return Status::error("a feature request without tokens or destination");
  Client &c = slots[size_t(request.client)];
  cudaStream_t stream = context->stream();
  const std::vector<void *> &buffers = context->buffers();
  const std::string where =
      "the online target on device " + std::to_string(gpu);
  // A failure leaves the stream in an unknown state: every later request
  // fails with the same message.
  auto check = [&](cudaError_t status, const std::string &what) {
    Status s = cudaCallStatus(status, where + ": " + what);
    if (!s.ok() && failure.ok())
      failure = s;
    return s;
  };
  DFLASH_RETURN_IF_ERROR(check(
      cudaMemcpyAsync(buffers[size_t(map.inputIds)], request.inputIds,
                      tokenBuffer.bytes(), cudaMemcpyHostToDevice, stream),
      "copying input_ids"));
  DFLASH_RETURN_IF_ERROR(check(
      cudaMemcpyAsync(buffers[size_t(map.positionIds)], request.positionIds,
                      tokenBuffer.bytes(), cudaMemcpyHostToDevice, stream),
      "copying position_ids"));
  int slot = -1;
  ticket = -1;
  if (request.timed) {
    ticket = c.nextTicket++;
    slot = int(ticket % 2);
    c.ticketOf[slot] = ticket;
    DFLASH_RETURN_IF_ERROR(
        check(cudaEventRecord(c.start[slot], stream), "event"));
  }
  // Eager launches plan their GEMMs as they go: time the new shapes after.
  Status launched = launchProgram(*program, graphExec, stream, "the target");
  if (launched.ok() && !graphExec)
    launched = context->timeNewGemmShapes();
  if (!launched.ok()) {
    failure = Status::error(where + ": " + launched.message());
    return failure;
  }
  DFLASH_RETURN_IF_ERROR(check(cudaGetLastError(), "launching the target"));
  if (slot >= 0)
    DFLASH_RETURN_IF_ERROR(
        check(cudaEventRecord(c.end[slot], stream), "event"));
  // The drafter's buffer may still hold the features its running step
  // reads: the copy waits for the drafter to be done with them.
  if (request.destinationFree)
    DFLASH_RETURN_IF_ERROR(
        check(cudaStreamWaitEvent(stream, request.destinationFree, 0),
              "waiting for the drafter's buffer"));
  DFLASH_RETURN_IF_ERROR(
      check(cudaMemcpyPeerAsync(request.destination, request.destinationDevice,
                                buffers[size_t(map.features)], gpu,
                                featureBuffer.bytes(), stream),
            "copying the features to device " +
                std::to_string(request.destinationDevice)));
  DFLASH_RETURN_IF_ERROR(check(cudaEventRecord(c.delivered, stream), "event"));
  delivered = c.delivered;
  return Status::success();
}

Status TargetServer::busyMs(int client, int64_t ticket, float &ms) {
  return call([&]() -> Status {
    if (client < 0 || client >= int(slots.size()) || ticket < 0)
      return Status::error("no timed feature request " +
                           std::to_string(ticket) + " of drafter " +
                           std::to_string(client));
    const Client &c = slots[size_t(client)];
    const int slot = int(ticket % 2);
    if (c.ticketOf[slot] != ticket)
      return Status::error("the online target's time of request " +
                           std::to_string(ticket) + " is gone");
    return cudaCallStatus(cudaEventElapsedTime(&ms, c.start[slot], c.end[slot]),
                          "the online target on device " + std::to_string(gpu) +
                              ": cudaEventElapsedTime");
  });
}

Status dflash::rt::checkTargetWeights(
    const std::vector<BufferSpec> &specs, const TargetBufferMap &map,
    const std::vector<std::vector<uint16_t>> &weights) {
  if (weights.size() != map.frozen.size())
    return Status::error("the target program has " +
                         std::to_string(map.frozen.size()) + " weights but " +
                         std::to_string(weights.size()) + " were loaded");
  for (size_t k = 0; k < weights.size(); ++k) {
    const BufferSpec &b = specs[size_t(map.frozen[k])];
    if (weights[k].size() * 2 != b.bytes())
      return Status::error("the target's weight '" + b.name + "' was not " +
                           "loaded with " + std::to_string(b.bytes()) +
                           " bytes");
  }
  return Status::success();
}

Status dflash::rt::uploadTargetWeights(
    const std::vector<BufferSpec> &specs, const TargetBufferMap &map,
    const std::vector<void *> &buffers,
    const std::vector<std::vector<uint16_t>> &weights) {
  DFLASH_RETURN_IF_ERROR(checkTargetWeights(specs, map, weights));
  for (size_t k = 0; k < weights.size(); ++k)
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaMemcpy(buffers[size_t(map.frozen[k])], weights[k].data(),
                   weights[k].size() * 2, cudaMemcpyHostToDevice),
        "uploading '" + specs[size_t(map.frozen[k])].name + "'"));
  return Status::success();
}
