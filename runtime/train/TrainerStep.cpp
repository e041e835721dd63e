//===- TrainerStep.cpp - One training step on one GPU ---------------------===//

#include "runtime/train/Trainer.h"

#include "runtime/device/Collectives.h"
#include "runtime/train/TargetServer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <thread>

using namespace dflash;
using namespace dflash::rt;

static std::string numberText(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

Status Trainer::captureGraph() {
  if (targetProgram)
    DFLASH_RETURN_IF_ERROR(captureProgramGraph(*targetProgram, device,
                                               "the online target", targetGraph,
                                               targetGraphExec));
  // An all-reduce the step asked for while capturing and NCCL refused.
  return captureProgramGraph(program, device, "the step", graph, graphExec,
                             [this] { return collectivesStatus(); });
}

Status Trainer::collectivesStatus() {
  Collectives *c = device.collectives();
  return c ? c->check() : Status::success();
}

Status Trainer::waitForStep(cudaEvent_t event, const std::string &what) {
  Collectives *c = device.collectives();
  if (!c)
    return cudaCallStatus(cudaEventSynchronize(event), what);
  // A blocking wait would never return if a peer failed before its part of
  // an all-reduce: poll, and watch the communicator and the other ranks.
  while (true) {
    cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess)
      return Status::success();
    if (status != cudaErrorNotReady)
      return cudaCallStatus(status, what);
    // "Not ready" is no error: keep it from the next cudaGetLastError check.
    (void)cudaGetLastError();
    if (Status s = c->check(); !s.ok()) {
      aborted = true;
      c->abort();
      return Status::error(what + ": " + s.message());
    }
    if (abortFlag && abortFlag->load()) {
      aborted = abortedByPeer = true;
      c->abort();
      return Status::error(what + ": stopped because another GPU of the run "
                                  "failed");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Status Trainer::stageNextBatch() {
  PrefetchedBatch *batch = nullptr;
  DFLASH_RETURN_IF_ERROR(prefetcher->acquire(batch));
  BatchLease lease(*prefetcher, batch);
  // The staging buffers are free once the last step copied them out (before
  // the first step the event has not been recorded and the wait is a no-op).
  DFLASH_RETURN_IF_ERROR(
      cudaCallStatus(cudaStreamWaitEvent(copyStream, copiesDone, 0),
                     "ordering the input copies"));
  const auto sources = batch->inputs();
  const auto &indices = map.inputs; // StepInput order
  for (size_t i = 0; i < staging.size(); ++i) {
    const BufferSpec &spec = program.buffers()[size_t(indices[i])];
    if (!staging[i]) // made on the device (the online target's features)
      continue;
    if (featureServer && StepInput(i) == StepInput::TargetHidden) {
      // The target computes them from this batch's tokens while the step
      // runs, and copies them in once the step has its own copy.
      DFLASH_RETURN_IF_ERROR(requestFeatures(sources, staging[i], copiesDone,
                                             copyStream, stagedTicket));
      continue;
    }
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaMemcpyAsync(staging[i], sources[i], spec.bytes(),
                                       cudaMemcpyHostToDevice, copyStream),
                       "copying '" + spec.name + "' to the device"));
  }
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(
      cudaEventRecord(stagedReady, copyStream), "cudaEventRecord"));
  staged = batch;
  lease.keep();
  return Status::success();
}

Status Trainer::requestFeatures(
    const std::array<const void *, kNumStepInputs> &sources, void *destination,
    cudaEvent_t destinationFree, cudaStream_t waiter, int64_t &ticket) {
  FeatureRequest request;
  request.client = featureClient;
  request.inputIds =
      static_cast<const int32_t *>(sources[size_t(StepInput::InputIds)]);
  request.positionIds =
      static_cast<const int32_t *>(sources[size_t(StepInput::PositionIds)]);
  request.destination = destination;
  request.destinationDevice = device.device();
  request.destinationFree = destinationFree;
  request.timed = destinationFree != nullptr;
  cudaEvent_t delivered = nullptr;
  DFLASH_RETURN_IF_ERROR(featureServer->submit(request, delivered, ticket));
  return cudaCallStatus(cudaStreamWaitEvent(waiter, delivered, 0),
                        "waiting for the online target's features");
}

Status Trainer::prepareStep() {
  if (!initialised)
    return Status::error("the trainer is not initialised");
  if (poisoned)
    return Status::error("step " + std::to_string(completedSteps) +
                         ": an earlier step left non-finite values on the "
                         "device");
  if (aborted)
    return Status::error("step " + std::to_string(completedSteps) +
                         ": an earlier step was aborted");
  const std::string where = "step " + std::to_string(completedSteps);
  if (!stagingError.ok())
    return Status::error(where + ": " + stagingError.message());
  if (!staged)
    if (Status s = stageNextBatch(); !s.ok()) {
      stagingError = s;
      return Status::error(where + ": " + s.message());
    }
  return Status::success();
}

Status Trainer::step(StepMetrics &metrics) {
  DFLASH_RETURN_IF_ERROR(prepareStep());
  const std::string where = "step " + std::to_string(completedSteps);
  PrefetchedBatch *batch = staged;
  staged = nullptr;
  const int64_t featureTicket = stagedTicket;
  BatchLease lease(*prefetcher, batch);

  // NCCL connects its ranks lazily, in a communicator's first collectives,
  // with calls that a capture forbids: the first step with collectives
  // runs eagerly (it computes what the graph computes), the graph is
  // captured at the next one.
  const bool useGraph =
      options.useGraph && (!device.collectives() || collectivesWarm);
  if (useGraph && !graphExec)
    if (Status s = captureGraph(); !s.ok())
      return Status::error(where + ": " + s.message());

  cudaStream_t stream = device.stream();
  const std::vector<void *> &buffers = device.buffers();
  const std::vector<BufferSpec> &specs = program.buffers();
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(cudaEventRecord(stepStart, stream),
                                        where + ": cudaEventRecord"));
  // The batch was staged on the device while the previous step ran.
  DFLASH_RETURN_IF_ERROR(
      cudaCallStatus(cudaStreamWaitEvent(stream, stagedReady, 0),
                     where + ": waiting for the staged batch"));
  const auto &inputIndices = map.inputs; // StepInput order
  for (size_t i = 0; i < staging.size(); ++i)
    DFLASH_RETURN_IF_ERROR(
        !staging[i]
            ? Status::success()
            : cudaCallStatus(
                  cudaMemcpyAsync(buffers[size_t(inputIndices[i])], staging[i],
                                  specs[size_t(inputIndices[i])].bytes(),
                                  cudaMemcpyDeviceToDevice, stream),
                  where + ": copying '" + specs[size_t(inputIndices[i])].name +
                      "' into place"));
  // The previous step's copy of this pinned scalar has completed: every
  // step ends with a wait for its metrics.
  hostCounters[0] = int32_t(completedSteps);
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(
      cudaMemcpyAsync(buffers[size_t(map.counter(StepCounter::Step))],
                      &hostCounters[0], sizeof(int32_t), cudaMemcpyHostToDevice,
                      stream),
      where + ": copying the step counter to the device"));
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(cudaEventRecord(copiesDone, stream),
                                        where + ": cudaEventRecord"));

  // The online target's features, then the step that reads them.
  if (targetProgram) {
    if (Status s =
            launchProgram(*targetProgram, useGraph ? targetGraphExec : nullptr,
                          stream, "the target");
        !s.ok())
      return Status::error(where + ": " + s.message());
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaGetLastError(), where + ": launching the target"));
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(cudaEventRecord(targetDone, stream),
                                          where + ": cudaEventRecord"));
  }
  if (useGraph) {
    if (Status s = launchProgram(program, graphExec, stream, "the step");
        !s.ok())
      return Status::error(where + ": " + s.message());
  } else {
    if (Status s = program.enqueue(stream); !s.ok())
      return Status::error(where + ": " + s.message());
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaGetLastError(), where + ": launching the step"));
    if (Status s = collectivesStatus(); !s.ok())
      return Status::error(where + ": " + s.message());
    collectivesWarm = true;
    // Eager launches plan their GEMMs as they go: time the new shapes now,
    // for the next launches (and the graph captured after this step).
    if (Status s = device.timeNewGemmShapes(); !s.ok())
      return Status::error(where + ": " + s.message());
  }
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(cudaEventRecord(stepEnd, stream),
                                        where + ": cudaEventRecord"));
  for (size_t m = 0; m < map.metrics.size(); ++m) {
    int index = map.metrics[m];
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaMemcpyAsync(hostMetrics + metricOffsets[m], buffers[size_t(index)],
                        specs[size_t(index)].bytes(), cudaMemcpyDeviceToHost,
                        stream),
        where + ": copying metric '" + specs[size_t(index)].name +
            "' from the device"));
  }
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(cudaEventRecord(metricsDone, stream),
                                        where + ": cudaEventRecord"));

  // This batch's pinned slot was copied out before the previous step ended;
  // free it for the prefetch thread, then stage the next batch so that its
  // transfer overlaps this step.
  DFLASH_RETURN_IF_ERROR(
      cudaCallStatus(cudaEventSynchronize(stagedReady),
                     where + ": copying the batch to the device"));
  DataPosition positionAfter = batch->positionAfter;
  Rng::State rngAfter = batch->anchorRngAfter;
  const double drawnFlops = drawnStepFlops(
      program.flopsPerStep(), program.attentionKinds(),
      DrawnAnchors{config.rowsPerStep(), config.seqLen, config.anchorsPerRow,
                   config.blockSize, batch->anchors, batch->keep,
                   batch->positionIds});
  std::vector<SkippedRow> skippedNow = batch->skippedRows;
  lease.release();
  if (completedSteps + 1 < options.finalStep) // the last step stages nothing
    stagingError = stageNextBatch();
  DFLASH_RETURN_IF_ERROR(
      waitForStep(metricsDone, where + ": running the step"));
  float elapsedMs = 0, computeMs = 0;
  DFLASH_RETURN_IF_ERROR(
      cudaCallStatus(cudaEventElapsedTime(&elapsedMs, stepStart, stepEnd),
                     where + ": cudaEventElapsedTime"));
  DFLASH_RETURN_IF_ERROR(
      cudaCallStatus(cudaEventElapsedTime(&computeMs, copiesDone, stepEnd),
                     where + ": cudaEventElapsedTime"));

  // Metric buffers as doubles: their first value, or all of them.
  std::vector<std::vector<double>> values(program.buffers().size());
  for (size_t m = 0; m < map.metrics.size(); ++m) {
    const int index = map.metrics[m];
    const float *first = hostMetrics + metricOffsets[m];
    values[size_t(index)].assign(
        first, first + shapeNumel(specs[size_t(index)].shape));
  }
  auto metricValues = [&](int index) { return values[size_t(index)].data(); };
  auto metricValue = [&](int index) { return values[size_t(index)][0]; };
  metrics = StepMetrics();
  metrics.step = completedSteps;
  metrics.loss = metricValue(map.metric(StepMetric::Loss));
  metrics.acc = metricValue(map.metric(StepMetric::Acc));
  metrics.tau = metricValue(map.metric(StepMetric::Tau));
  metrics.gradNorm = metricValue(map.metric(StepMetric::GradNorm));
  metrics.lr = metricValue(map.metric(StepMetric::Lr));
  metrics.accByPosition = accuracyByPosition(
      metricValues(map.metric(StepMetric::PositionHits)),
      metricValues(map.metric(StepMetric::PositionCounts)), config.blockSize);
  metrics.buckets =
      figuresByBucket(metricValues(map.metric(StepMetric::BucketRuns)),
                      metricValues(map.metric(StepMetric::BucketBlocks)),
                      metricValues(map.metric(StepMetric::BucketHits)),
                      metricValues(map.metric(StepMetric::BucketCounts)),
                      config.numPositionBuckets());
  metrics.stepMs = elapsedMs;
  metrics.computeMs = computeMs;
  if (targetProgram) {
    float targetMs = 0;
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaEventElapsedTime(&targetMs, copiesDone, targetDone),
                       where + ": cudaEventElapsedTime"));
    metrics.targetMs = targetMs;
  } else if (featureServer) {
    // Delivered before this step started, so timed by now.
    float targetMs = 0;
    if (Status s =
            featureServer->busyMs(featureClient, featureTicket, targetMs);
        !s.ok())
      return Status::error(where + ": " + s.message());
    metrics.targetMs = targetMs;
    metrics.targetApart = true;
    metrics.featureWaitMs = std::max(0.0, metrics.stepMs - metrics.computeMs);
  }
  metrics.drawnFlops = drawnFlops;
  setThroughput(metrics, config, options.run.worldSize, program.flopsPerStep());
  if (afterFirstStep.totalBytes == 0)
    DFLASH_RETURN_IF_ERROR(device.memory(afterFirstStep));

  if (!metrics.finite()) {
    // The optimizer has applied the bad update in place: nothing on the
    // device may be saved any more.
    poisoned = true;
    return Status::error(where + ": the loss is " + numberText(metrics.loss) +
                         " and grad_norm is " + numberText(metrics.gradNorm) +
                         "; stopped without saving this state (" +
                         (lastCheckpoint.empty()
                              ? std::string("no checkpoint was saved")
                              : "the last checkpoint is " + lastCheckpoint) +
                         ")");
  }
  ++completedSteps;
  dataPosition = positionAfter;
  anchorRng = rngAfter;
  skipped.insert(skipped.end(), skippedNow.begin(), skippedNow.end());
  metrics.skippedRows = int64_t(restored.size() + skipped.size());
  for (const SkippedRow &row : skippedNow)
    metrics.badRowsNow.push_back(row.row);
  return Status::success();
}
