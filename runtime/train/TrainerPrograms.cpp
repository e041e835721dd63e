//===- TrainerPrograms.cpp - The evaluation and target programs -----------===//

#include "runtime/train/Trainer.h"

#include "runtime/device/Collectives.h"
#include "runtime/train/TargetServer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <optional>
#include <thread>

using namespace dflash;
using namespace dflash::rt;

/// The position of `value` in `values`, if it is there.
template <size_t N>
static std::optional<size_t> positionOf(const std::array<int, N> &values,
                                        int value) {
  for (size_t k = 0; k < N; ++k)
    if (values[k] == value)
      return k;
  return std::nullopt;
}

Status Trainer::bindEvalProgram(const RowSource &rows) {
  if (!evalProgram)
    return Status::error("--eval-data: this trainer was built without an "
                         "evaluation program; rebuild it with dflashc");
  if (evalProgram->config().name != config.name)
    return Status::error("the evaluation program is of '" +
                         evalProgram->config().name + "' but the step of '" +
                         config.name + "'");
  const std::vector<BufferSpec> &specs = evalProgram->buffers();
  DFLASH_RETURN_IF_ERROR(mapEvalBuffers(specs, config, evalMap));
  {
    BatchLoader probe(rows, config, options.run.seed, options.rank,
                      options.run.worldSize);
    probe.setEvaluationOrder();
    if (Status s = probe.validate(); !s.ok())
      return Status::error("--eval-data: " + s.message());
  }
  size_t floats = 0;
  evalSumOffsets.assign(kNumForwardSums, 0);
  for (int k = 0; k < kNumForwardSums; ++k) {
    evalSumOffsets[size_t(k)] = floats;
    floats += size_t(shapeNumel(specs[size_t(evalMap.sums[size_t(k)])].shape));
  }
  for (size_t k = 0; k < evalPartOffsets.size(); ++k)
    evalPartOffsets[k] = floats++;
  evalSumBytes = floats * sizeof(float);
  // The serving walk's draft slots: every row's hits, then their weights.
  const size_t slots =
      size_t(config.rowsPerStep() * config.anchorsPerRow * config.blockSize);
  evalWeightsOffset = (slots + 255) / 256 * 256;
  evalSlotBytes = evalWeightsOffset + slots * sizeof(float);
  evalArenaBytes = std::max<size_t>(evalProgram->arenaBytes(), 256);
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(cudaMalloc(&evalArena, evalArenaBytes),
                                        "allocating the evaluation arena of " +
                                            std::to_string(evalArenaBytes) +
                                            " bytes"));
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(
      cudaMalloc(reinterpret_cast<void **>(&evalSums), evalSumBytes),
      "allocating the evaluation sums"));
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(
      cudaMalloc(reinterpret_cast<void **>(&evalSlots), evalSlotBytes),
      "allocating the evaluation's draft slots"));
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(
      cudaEventCreateWithFlags(&evalDone, cudaEventDisableTiming),
      "cudaEventCreateWithFlags"));
  // Where micro-batch m's DraftSlots go: its rows of the two arrays.
  const size_t microSlots =
      size_t(config.rowsPerGpu * config.anchorsPerRow * config.blockSize);
  auto slotPointer = [&](int64_t index) -> void * {
    const int64_t k = index - kNumForwardSums;
    const size_t m = size_t(k / kNumDraftSlots);
    return DraftSlots(k % kNumDraftSlots) == DraftSlots::Hits
               ? static_cast<void *>(evalSlots + m * microSlots)
               : static_cast<void *>(evalSlots + evalWeightsOffset +
                                     m * microSlots * sizeof(float));
  };
  // The step's own inputs, frozen weights and parameters.
  const std::vector<void *> &stepBuffers = device.buffers();
  std::vector<void *> pointers(specs.size(), nullptr);
  for (size_t i = 0; i < specs.size(); ++i) {
    const BufferSpec &b = specs[i];
    const size_t k = size_t(b.index);
    switch (b.role) {
    case BufferRole::Input:
      pointers[i] = stepBuffers[size_t(map.inputs[k])];
      break;
    case BufferRole::Frozen:
      if (map.frozen[k] < 0)
        return Status::error("evaluation program: frozen buffer '" + b.name +
                             "' has no counterpart in the step");
      pointers[i] = stepBuffers[size_t(map.frozen[k])];
      break;
    case BufferRole::Parameter:
      pointers[i] = stepBuffers[size_t(map.param[k])];
      break;
    default: // a metric: a ForwardSum, DraftSlots or an ObjectivePart
      if (b.index < kNumForwardSums)
        pointers[i] = evalSums + evalSumOffsets[k];
      else if (auto part = positionOf(evalMap.objectiveParts, int(i)))
        pointers[i] = evalSums + evalPartOffsets[*part];
      else
        pointers[i] = slotPointer(b.index);
      break;
    }
  }
  DFLASH_RETURN_IF_ERROR(evalProgram->bind(
      pointers, evalArena, device.resources(),
      stepHyperFor(config, options.run.lr, options.run.warmupRatio)));
  evalRows = &rows;
  return Status::success();
}

Status Trainer::bindTargetProgram(const TrainerInputs &inputs) {
  targetProgram = inputs.targetProgram();
  if (!targetProgram || !inputs.targetProgramWeights)
    return Status::error("the online target: no target program or weights");
  if (targetProgram->config().name != config.name)
    return Status::error("the online target was compiled for '" +
                         targetProgram->config().name + "' but the step for '" +
                         config.name + "'");
  // Its inputs and its output are the step's inputs of the same name; its
  // weights are its own buffers.
  const std::vector<BufferSpec> &specs = targetProgram->buffers();
  const std::vector<BufferSpec> &stepSpecs = program.buffers();
  const std::vector<std::vector<uint16_t>> &weights =
      *inputs.targetProgramWeights;
  std::vector<void *> bound;
  size_t frozen = 0;
  for (const BufferSpec &b : specs) {
    if (b.role == BufferRole::Frozen) {
      if (frozen >= weights.size() || weights[frozen].size() * 2 != b.bytes())
        return Status::error("the online target's weight '" + b.name +
                             "' was not loaded with " +
                             std::to_string(b.bytes()) + " bytes");
      // The token embedding is the drafter's frozen embedding: one copy.
      const int embed = map.frozenWeight(FrozenWeight::Embed);
      if (b.name == "model.embed_tokens.weight" &&
          stepSpecs[size_t(embed)].shape == b.shape) {
        ++frozen;
        bound.push_back(device.buffers()[size_t(embed)]);
        continue;
      }
      void *buffer = nullptr;
      DFLASH_RETURN_IF_ERROR(cudaCallStatus(cudaMalloc(&buffer, b.bytes()),
                                            "allocating the target's '" +
                                                b.name + "' (" +
                                                formatBytes(b.bytes()) + ")"));
      targetWeights.push_back(buffer);
      DFLASH_RETURN_IF_ERROR(
          cudaCallStatus(cudaMemcpy(buffer, weights[frozen].data(), b.bytes(),
                                    cudaMemcpyHostToDevice),
                         "uploading the target's '" + b.name + "'"));
      ++frozen;
      bound.push_back(buffer);
      continue;
    }
    std::optional<StepInput> input =
        b.role == BufferRole::Input ? parseStepInput(b.name) : std::nullopt;
    const int index = input ? map.input(*input) : -1;
    if (index < 0 || stepSpecs[size_t(index)].dtype != b.dtype ||
        stepSpecs[size_t(index)].shape != b.shape)
      return Status::error("the online target's buffer '" + b.name + "' " +
                           shapeString(b.shape) +
                           " is not an input of the step of that shape");
    bound.push_back(device.buffers()[size_t(index)]);
  }
  if (frozen != weights.size())
    return Status::error("the online target has " + std::to_string(frozen) +
                         " weights but " + std::to_string(weights.size()) +
                         " were loaded");
  void *arena = device.arena();
  if (targetProgram->arenaBytes() > device.arenaBytes()) {
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaMalloc(&targetArena, targetProgram->arenaBytes()),
                       "allocating the online target's arena (" +
                           formatBytes(targetProgram->arenaBytes()) + ")"));
    arena = targetArena;
  }
  DFLASH_RETURN_IF_ERROR(
      cudaCallStatus(cudaEventCreate(&targetDone), "cudaEventCreate"));
  return targetProgram->bind(bound, arena, device.resources(), StepHyper{});
}

Status Trainer::evaluate(EvalMetrics &metrics) {
  if (!initialised)
    return Status::error("the trainer is not initialised");
  if (!evalRows)
    return Status::error("the run has no held-out rows to evaluate on");
  if (poisoned || aborted)
    return Status::error("the device state is not usable after step " +
                         std::to_string(completedSteps));
  auto started = std::chrono::steady_clock::now();
  const std::string where =
      "evaluation after step " + std::to_string(completedSteps);
  // The same rows and anchors at every evaluation, so that they compare.
  BatchLoader loader(*evalRows, config, options.run.seed, options.rank,
                     options.run.worldSize);
  loader.setEvaluationOrder();
  loader.setMaxBadRows(options.maxBadRows);
  const std::vector<BufferSpec> &specs = evalProgram->buffers();
  std::vector<float> host(evalSumBytes / sizeof(float));
  std::vector<double> total(host.size(), 0.0);
  cudaStream_t stream = device.stream();
  int64_t rowsRead = 0;
  serving = ServingSums();
  const int64_t servingRows =
      std::min(options.evalServingRows, evalRows->numRows());
  const int64_t batches = loader.batchesPerPass();
  // A thread assembles batch g + 1 in pinned memory while batch g runs.
  BatchPrefetcher prefetch(loader, config, HostMemory::Pinned, 2);
  if (Status s = prefetch.start(batches); !s.ok())
    return Status::error(where + ": " + s.message());
  for (int64_t g = 0; g < batches; ++g) {
    PrefetchedBatch *batch = nullptr;
    if (Status s = prefetch.acquire(batch); !s.ok())
      return Status::error(where + ": " + s.message());
    BatchLease lease(prefetch, batch);
    const auto sources = batch->inputs();
    for (int k = 0; k < kNumStepInputs; ++k) {
      const BufferSpec &spec = specs[size_t(evalMap.inputs[size_t(k)])];
      if ((targetProgram || featureServer) &&
          StepInput(k) == StepInput::TargetHidden)
        continue; // the online target writes it below
      DFLASH_RETURN_IF_ERROR(cudaCallStatus(
          cudaMemcpyAsync(device.buffers()[size_t(map.inputs[size_t(k)])],
                          sources[k], spec.bytes(), cudaMemcpyHostToDevice,
                          stream),
          where + ": copying '" + spec.name + "' to the device"));
    }
    if (targetProgram)
      if (Status s = targetProgram->enqueue(stream); !s.ok())
        return Status::error(where + ": " + s.message());
    if (featureServer) {
      // Into the step's own input: the last step is done with it, and the
      // next one copies its staged features over it.
      int64_t untimed = -1;
      if (Status s = requestFeatures(
              sources,
              device.buffers()[size_t(map.input(StepInput::TargetHidden))],
              nullptr, stream, untimed);
          !s.ok())
        return Status::error(where + ": " + s.message());
    }
    if (Status s = evalProgram->enqueue(stream); !s.ok())
      return Status::error(where + ": " + s.message());
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaGetLastError(), where + ": launching the evaluation"));
    if (Status s = device.timeNewGemmShapes(); !s.ok())
      return Status::error(where + ": " + s.message());
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaMemcpyAsync(host.data(), evalSums, evalSumBytes,
                        cudaMemcpyDeviceToHost, stream),
        where + ": copying the evaluation sums from the device"));
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(cudaEventRecord(evalDone, stream),
                                          where + ": cudaEventRecord"));
    // The slot goes back (to be refilled) once its copies are done.
    DFLASH_RETURN_IF_ERROR(waitForStep(evalDone, where));
    for (size_t i = 0; i < host.size(); ++i)
      total[i] += double(host[i]);
    for (int64_t row : batch->rows)
      rowsRead += row >= 0 ? 1 : 0;
    rowsRead -= int64_t(batch->skippedRows.size());
    // Global batch g holds rows [g W B, (g + 1) W B): every rank walks the
    // same batches.
    if (g * options.run.worldSize * config.rowsPerStep() < servingRows)
      DFLASH_RETURN_IF_ERROR(walkServingOrder(
          static_cast<const uint8_t *>(sources[size_t(StepInput::LossMask)]),
          static_cast<const int32_t *>(sources[size_t(StepInput::PositionIds)]),
          batch->rows, where));
  }
  std::array<const double *, kNumForwardSums> sums{};
  for (int k = 0; k < kNumForwardSums; ++k)
    sums[size_t(k)] = total.data() + evalSumOffsets[size_t(k)];
  metrics = EvalMetrics();
  metrics.step = completedSteps - 1;
  const double parts[kNumObjectiveParts] = {total[evalPartOffsets[0]],
                                            total[evalPartOffsets[1]]};
  setEvalFigures(metrics, sums, config.blockSize, config.numPositionBuckets(),
                 evalMap.objectiveParts[0] >= 0 ? parts : nullptr);
  // The sums are every GPU's; the rows this rank's (TrainerGroup adds them).
  metrics.rows = rowsRead;
  metrics.batches = batches;
  metrics.servingRows = servingRows;
  metrics.servingTau = serving.tau();
  metrics.servingBlocks = int64_t(serving.blocks);
  metrics.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
          .count();
  return Status::success();
}

Status Trainer::walkServingOrder(const uint8_t *lossMask,
                                 const int32_t *positionIds,
                                 const std::vector<int64_t> &rows,
                                 const std::string &where) {
  const int64_t B = config.rowsPerStep(), N = config.anchorsPerRow;
  const size_t slots = size_t(B * N * config.blockSize);
  const int64_t servingRows =
      std::min(options.evalServingRows, evalRows->numRows());
  std::vector<bool> walked(size_t(B), false);
  for (size_t b = 0; b < rows.size() && b < walked.size(); ++b)
    walked[b] = rows[b] >= 0 && rows[b] < servingRows;
  ServingWalk walk(B, config.seqLen, N, config.blockSize);
  walk.start(lossMask, positionIds, walked);
  std::vector<int32_t> anchors(size_t(B * N));
  std::vector<uint8_t> keep(size_t(B * N)), hits(slots);
  std::vector<float> weights(slots), sums(evalSumBytes / sizeof(float));
  cudaStream_t stream = device.stream();
  const int anchorsBuffer = map.input(StepInput::Anchors),
            keepBuffer = map.input(StepInput::Keep);
  const size_t keptBlocks = evalSumOffsets[size_t(ForwardSum::KeptBlocks)];
  // The features, ids and masks of the batch stay in the step's inputs;
  // each pass rewrites only the anchors. The program all-reduces its sums,
  // so with several ranks every rank runs passes until one in which no rank
  // kept a block (its all-reduced kept_blocks is 0): the same count
  // everywhere, one pass more than the longest rank needs.
  const bool alone = options.run.worldSize == 1;
  for (int64_t p = 0; !alone || p < walk.passes(); ++p) {
    walk.anchorsOfPass(p, anchors.data(), keep.data());
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaMemcpyAsync(device.buffers()[size_t(anchorsBuffer)], anchors.data(),
                        anchors.size() * sizeof(int32_t),
                        cudaMemcpyHostToDevice, stream),
        where + ": copying the serving walk's anchors to the device"));
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaMemcpyAsync(device.buffers()[size_t(keepBuffer)], keep.data(),
                        keep.size(), cudaMemcpyHostToDevice, stream),
        where + ": copying the serving walk's keep flags to the device"));
    if (Status s = evalProgram->enqueue(stream); !s.ok())
      return Status::error(where + ": the serving walk: " + s.message());
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaGetLastError(), where + ": launching the serving walk's pass"));
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaMemcpyAsync(hits.data(), evalSlots, slots,
                                       cudaMemcpyDeviceToHost, stream),
                       where + ": copying the draft hits from the device"));
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaMemcpyAsync(weights.data(), evalSlots + evalWeightsOffset,
                        slots * sizeof(float), cudaMemcpyDeviceToHost, stream),
        where + ": copying the draft weights from the device"));
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaMemcpyAsync(sums.data(), evalSums, evalSumBytes,
                        cudaMemcpyDeviceToHost, stream),
        where + ": copying the serving pass's sums from the device"));
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(cudaEventRecord(evalDone, stream),
                                          where + ": cudaEventRecord"));
    DFLASH_RETURN_IF_ERROR(waitForStep(evalDone, where));
    walk.record(p, hits.data(), weights.data());
    if (!alone && !(sums[keptBlocks] > 0))
      break;
  }
  serving += walk.sums();
  return Status::success();
}
