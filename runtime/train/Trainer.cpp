//===- Trainer.cpp - One GPU's trainer: its buffers and init --------------===//

#include "runtime/train/Trainer.h"

#include "kernels/Bf16.h"
#include "runtime/device/Collectives.h"
#include "runtime/train/TargetServer.h"

#include <algorithm>
#include <cstdint>

using namespace dflash;
using namespace dflash::rt;

Trainer::Trainer(StepProgram &program, DeviceContext &device,
                 TrainerOptions options, StepProgram *evalProgram)
    : program(program), device(device), options(std::move(options)),
      config(program.config()), evalProgram(evalProgram) {}

Trainer::~Trainer() { releaseDeviceObjects(); }

void Trainer::releaseDeviceObjects() {
  (void)device.makeCurrent();
  // The last step (or one whose collectives were aborted) may still run
  // in the graph about to be destroyed.
  (void)cudaStreamSynchronize(device.stream());
  // A staged batch may still be copying from its pinned slot.
  if (copyStream)
    (void)cudaStreamSynchronize(copyStream);
  if (staged && prefetcher)
    prefetcher->release(staged);
  staged = nullptr;
  // The prefetch thread reads into pinned slots: stop it before anything is
  // freed.
  prefetcher.reset();
  for (void *buffer : staging)
    (void)cudaFree(buffer);
  staging.clear();
  if (copyStream)
    (void)cudaStreamDestroy(copyStream);
  if (stagedReady)
    (void)cudaEventDestroy(stagedReady);
  copyStream = nullptr;
  stagedReady = nullptr;
  if (graphExec)
    (void)cudaGraphExecDestroy(graphExec);
  if (graph)
    (void)cudaGraphDestroy(graph);
  for (cudaEvent_t event : {stepStart, stepEnd, copiesDone, metricsDone})
    if (event)
      (void)cudaEventDestroy(event);
  if (hostCounters)
    (void)cudaFreeHost(hostCounters);
  if (hostMetrics)
    (void)cudaFreeHost(hostMetrics);
  graphExec = nullptr;
  graph = nullptr;
  stepStart = stepEnd = copiesDone = metricsDone = nullptr;
  if (evalArena)
    (void)cudaFree(evalArena);
  if (evalSums)
    (void)cudaFree(evalSums);
  if (evalDone)
    (void)cudaEventDestroy(evalDone);
  if (evalSlots)
    (void)cudaFree(evalSlots);
  evalArena = nullptr;
  evalSums = nullptr;
  evalSlots = nullptr;
  evalDone = nullptr;
  if (targetGraphExec)
    (void)cudaGraphExecDestroy(targetGraphExec);
  if (targetGraph)
    (void)cudaGraphDestroy(targetGraph);
  if (targetDone)
    (void)cudaEventDestroy(targetDone);
  for (void *buffer : targetWeights)
    (void)cudaFree(buffer);
  if (targetArena)
    (void)cudaFree(targetArena);
  targetGraphExec = nullptr;
  targetGraph = nullptr;
  targetDone = nullptr;
  targetWeights.clear();
  targetArena = nullptr;
  hostCounters = nullptr;
  hostMetrics = nullptr;
}

Status Trainer::upload(int index, const void *data, size_t bytes) {
  const BufferSpec &spec = program.buffers()[size_t(index)];
  if (bytes != spec.bytes())
    return Status::error("buffer '" + spec.name + "' needs " +
                         std::to_string(spec.bytes()) + " bytes but " +
                         std::to_string(bytes) + " were given");
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(
      cudaMemcpyAsync(device.buffers()[size_t(index)], data, bytes,
                      cudaMemcpyHostToDevice, device.stream()),
      "copying '" + spec.name + "' to the device"));
  // The sources are often temporaries of the caller: wait until they are
  // read.
  return device.synchronize("copying '" + spec.name + "' to the device");
}

Status Trainer::download(int index, void *data, size_t bytes) {
  const BufferSpec &spec = program.buffers()[size_t(index)];
  if (bytes != spec.bytes())
    return Status::error("buffer '" + spec.name + "' holds " +
                         std::to_string(spec.bytes()) + " bytes but " +
                         std::to_string(bytes) + " were asked for");
  return cudaCallStatus(cudaMemcpyAsync(data, device.buffers()[size_t(index)],
                                        bytes, cudaMemcpyDeviceToHost,
                                        device.stream()),
                        "copying '" + spec.name + "' from the device");
}

Status Trainer::uploadShards(const std::vector<std::vector<uint16_t>> &params,
                             const TrainingState *resume) {
  std::vector<float> master, moment1, moment2;
  for (size_t k = 0; k < shards->buckets.size(); ++k) {
    const ShardedBucket &bucket = shards->buckets[k];
    const size_t count = size_t(bucket.shardElements);
    // The gaps between tensors and the padding stay 0.
    master.assign(count, 0.0f);
    if (resume) {
      moment1.assign(count, 0.0f);
      moment2.assign(count, 0.0f);
    }
    for (const ShardPiece &piece : shardPieces(bucket, options.rank)) {
      const size_t t = map.shardTensors[k][piece.tensor];
      const size_t from = size_t(piece.tensorOffset);
      const size_t to = size_t(piece.shardOffset);
      const size_t length = size_t(piece.length);
      if (resume) {
        std::copy_n(resume->master[t].data() + from, length,
                    master.data() + to);
        std::copy_n(resume->adamM[t].data() + from, length,
                    moment1.data() + to);
        std::copy_n(resume->adamV[t].data() + from, length,
                    moment2.data() + to);
      } else {
        bf16ToFloats(params[t].data() + from, master.data() + to, length);
      }
    }
    DFLASH_RETURN_IF_ERROR(
        upload(map.shardMaster[k], master.data(), count * 4));
    // Fresh moments are the zeros of allocate().
    if (resume) {
      DFLASH_RETURN_IF_ERROR(
          upload(map.shardMoment1[k], moment1.data(), count * 4));
      DFLASH_RETURN_IF_ERROR(
          upload(map.shardMoment2[k], moment2.data(), count * 4));
    }
  }
  return Status::success();
}

Status Trainer::init(const TrainerInputs &inputs) {
  if (initialised)
    return Status::error("the trainer is initialised twice");
  DFLASH_RETURN_IF_ERROR(checkInputs(inputs));
  DFLASH_RETURN_IF_ERROR(uploadWeightsAndState(inputs));
  DFLASH_RETURN_IF_ERROR(createStepScalars(inputs));
  DFLASH_RETURN_IF_ERROR(bindPrograms(inputs));
  DFLASH_RETURN_IF_ERROR(startData(inputs));
  initialised = true;
  return Status::success();
}

/// The inputs against the run, the program and the config; maps the
/// program's buffers by role.
Status Trainer::checkInputs(const TrainerInputs &inputs) {
  if (!inputs.target || !inputs.rows)
    return Status::error("the trainer needs target weights and a row source");
  const int64_t world = options.run.worldSize;
  if (world < 1 || options.rank < 0 || options.rank >= world)
    return Status::error("rank " + std::to_string(options.rank) +
                         " does not fit a world of " + std::to_string(world) +
                         " GPUs");
  // Without a communicator each rank would train on its own.
  if (Collectives *c = device.collectives()) {
    if (c->worldSize() != world || c->rank() != options.rank)
      return Status::error(
          "device " + std::to_string(device.device()) +
          ": its communicator is rank " + std::to_string(c->rank()) + " of " +
          std::to_string(c->worldSize()) + " but the trainer is rank " +
          std::to_string(options.rank) + " of " + std::to_string(world));
  } else if (world > 1) {
    return Status::error("training over " + std::to_string(world) +
                         " GPUs needs a communicator on device " +
                         std::to_string(device.device()));
  }
  if (inputs.resume && inputs.resume->worldSize() != world)
    return Status::error("the resumed state holds the anchor Rng states of " +
                         std::to_string(inputs.resume->worldSize()) +
                         " ranks but the run has " + std::to_string(world));
  if (options.finalStep < 1 || options.run.totalSteps < options.finalStep)
    return Status::error(
        "the run needs 1 <= steps (" + std::to_string(options.finalStep) +
        ") <= total steps (" + std::to_string(options.run.totalSteps) + ")");
  DFLASH_RETURN_IF_ERROR(device.makeCurrent());
  shards = program.optimizerShards();
  DFLASH_RETURN_IF_ERROR(
      mapStepBuffers(program.buffers(), config, shards, map));
  if (shards)
    DFLASH_RETURN_IF_ERROR(checkShardWorld(*shards, world));

  // Host data against the config (the loaders check it too; this guards
  // callers that build inputs themselves).
  std::vector<ParamInfo> table = parameterTable(config);
  if (inputs.params.size() != table.size())
    return Status::error("got " + std::to_string(inputs.params.size()) +
                         " parameter tensors but the model has " +
                         std::to_string(table.size()));
  for (size_t t = 0; t < table.size(); ++t)
    if (int64_t(inputs.params[t].size()) != table[t].numel())
      return Status::error("parameter '" + table[t].name + "' has " +
                           std::to_string(inputs.params[t].size()) +
                           " elements but needs " +
                           std::to_string(table[t].numel()));
  if (inputs.resume) {
    const TrainingState &r = *inputs.resume;
    for (const auto *group : {&r.master, &r.adamM, &r.adamV}) {
      if (group->size() != table.size())
        return Status::error(
            "the resumed optimizer state has " + std::to_string(group->size()) +
            " tensors but the model has " + std::to_string(table.size()));
      for (size_t t = 0; t < table.size(); ++t)
        if (int64_t((*group)[t].size()) != table[t].numel())
          return Status::error("the resumed optimizer state of '" +
                               table[t].name + "' has the wrong size");
    }
  }
  const size_t frozenElements =
      size_t(config.vocabSize) * size_t(config.hiddenSize);
  if (inputs.target->embed.size() != frozenElements ||
      (!inputs.target->tied && inputs.target->lmHead.size() != frozenElements))
    return Status::error("the target's embedding or lm_head does not have " +
                         std::to_string(config.vocabSize) + " x " +
                         std::to_string(config.hiddenSize) + " elements");
  return Status::success();
}

/// Allocates the buffers and the arena and fills the frozen weights, the
/// parameters and the optimizer state (fresh or resumed).
Status Trainer::uploadWeightsAndState(const TrainerInputs &inputs) {
  const size_t frozenElements =
      size_t(config.vocabSize) * size_t(config.hiddenSize);
  const std::vector<ParamInfo> table = parameterTable(config);
  DFLASH_RETURN_IF_ERROR(
      device.allocate(program.buffers(), program.arenaBytes()));
  DFLASH_RETURN_IF_ERROR(device.memory(afterAllocation));

  // Frozen weights; a tied target fills an lm_head buffer with the
  // embedding should the step have one.
  DFLASH_RETURN_IF_ERROR(upload(map.frozenWeight(FrozenWeight::Embed),
                                inputs.target->embed.data(),
                                frozenElements * 2));
  if (map.frozenWeight(FrozenWeight::LmHead) >= 0)
    DFLASH_RETURN_IF_ERROR(upload(map.frozenWeight(FrozenWeight::LmHead),
                                  inputs.target->lmHeadData(),
                                  frozenElements * 2));

  // Parameters, fp32 masters (the bf16 values widened, or the resumed
  // ones), Adam moments (zero from allocate(), or the resumed ones).
  std::vector<float> widened;
  for (size_t t = 0; t < table.size(); ++t) {
    const std::vector<uint16_t> &param = inputs.params[t];
    DFLASH_RETURN_IF_ERROR(
        upload(map.param[t], param.data(), param.size() * 2));
    if (map.sharded)
      continue; // the state goes into this rank's shards below
    const float *master;
    if (inputs.resume) {
      master = inputs.resume->master[t].data();
    } else {
      widened.resize(param.size());
      bf16ToFloats(param.data(), widened.data(), param.size());
      master = widened.data();
    }
    DFLASH_RETURN_IF_ERROR(upload(map.master[t], master, param.size() * 4));
    if (inputs.resume) {
      DFLASH_RETURN_IF_ERROR(upload(
          map.moment1[t], inputs.resume->adamM[t].data(), param.size() * 4));
      DFLASH_RETURN_IF_ERROR(upload(
          map.moment2[t], inputs.resume->adamV[t].data(), param.size() * 4));
    }
  }

  if (map.sharded)
    DFLASH_RETURN_IF_ERROR(
        uploadShards(inputs.params, inputs.resume ? &*inputs.resume : nullptr));
  return Status::success();
}

/// The pinned host counters and metrics, the step counters on the
/// device, and the step's events.
Status Trainer::createStepScalars(const TrainerInputs &inputs) {
  // Pinned host scalars: counters in, metrics out.
  DFLASH_RETURN_IF_ERROR(
      cudaCallStatus(cudaHostAlloc(reinterpret_cast<void **>(&hostCounters),
                                   2 * sizeof(int32_t), cudaHostAllocDefault),
                     "cudaHostAlloc of the step counters"));
  size_t metricFloats = 0;
  for (int index : map.metrics) {
    metricOffsets.push_back(metricFloats);
    metricFloats += size_t(shapeNumel(program.buffers()[size_t(index)].shape));
  }
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(
      cudaHostAlloc(reinterpret_cast<void **>(&hostMetrics),
                    metricFloats * sizeof(float), cudaHostAllocDefault),
      "cudaHostAlloc of the step metrics"));
  if (options.run.totalSteps > INT32_MAX)
    return Status::error("total steps " +
                         std::to_string(options.run.totalSteps) +
                         " do not fit the step's int32 counter");
  completedSteps = inputs.resume ? inputs.resume->step : 0;
  hostCounters[0] = int32_t(completedSteps);
  hostCounters[1] = int32_t(options.run.totalSteps);
  DFLASH_RETURN_IF_ERROR(
      upload(map.counter(StepCounter::TotalSteps), &hostCounters[1], 4));
  DFLASH_RETURN_IF_ERROR(
      upload(map.counter(StepCounter::Step), &hostCounters[0], 4));

  // copiesDone times the step without its input copies, too.
  for (cudaEvent_t *event : {&stepStart, &stepEnd, &copiesDone})
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaEventCreate(event), "cudaEventCreate"));
  for (cudaEvent_t *event : {&metricsDone})
    DFLASH_RETURN_IF_ERROR(
        cudaCallStatus(cudaEventCreateWithFlags(event, cudaEventDisableTiming),
                       "cudaEventCreateWithFlags"));
  return Status::success();
}

/// Binds the step, and the evaluation and the online target where the run
/// has them.
Status Trainer::bindPrograms(const TrainerInputs &inputs) {
  DFLASH_RETURN_IF_ERROR(program.bind(
      device.buffers(), device.arena(), device.resources(),
      stepHyperFor(config, options.run.lr, options.run.warmupRatio)));

  if (inputs.evalRows)
    DFLASH_RETURN_IF_ERROR(bindEvalProgram(*inputs.evalRows));
  if (featureServer) {
    const BufferSpec &features =
        program.buffers()[size_t(map.input(StepInput::TargetHidden))];
    const BufferSpec &ids =
        program.buffers()[size_t(map.input(StepInput::InputIds))];
    const BufferSpec &served = featureServer->featureSpec();
    if (served.dtype != features.dtype || served.shape != features.shape ||
        featureServer->tokenSpec().shape != ids.shape)
      return Status::error("the online target on device " +
                           std::to_string(featureServer->device()) +
                           " computes " + served.name + " " +
                           shapeString(served.shape) + " from tokens " +
                           shapeString(featureServer->tokenSpec().shape) +
                           ", but the step reads " + features.name + " " +
                           shapeString(features.shape) + " and tokens " +
                           shapeString(ids.shape));
  } else if (inputs.targetProgram) {
    DFLASH_RETURN_IF_ERROR(bindTargetProgram(inputs));
  }
  return Status::success();
}

/// This rank's batches, the prefetch thread and the input staging.
Status Trainer::startData(const TrainerInputs &inputs) {
  const int64_t world = options.run.worldSize;
  // Data: this rank's batches in BatchLoader order, from the resumed
  // position when there is one.
  rows = inputs.rows;
  loader = std::make_unique<BatchLoader>(*rows, config, options.run.seed,
                                         options.rank, world);
  loader->setMaxBadRows(options.maxBadRows);
  DFLASH_RETURN_IF_ERROR(loader->validate());
  if (inputs.resume) {
    DFLASH_RETURN_IF_ERROR(loader->seek(
        inputs.resume->data, inputs.resume->anchorRngState(options.rank)));
    for (int64_t row : inputs.resume->badRows)
      if (row >= rows->numRows())
        return Status::error(
            "the resumed state's bad row " + std::to_string(row) +
            " is past the data's " + std::to_string(rows->numRows()) +
            " rows: the checkpoint was written for other data");
    restored = inputs.resume->badRows;
    loader->addKnownBadRows(restored);
  }
  dataPosition = loader->position();
  anchorRng = loader->anchorRngState();
  prefetcher = std::make_unique<BatchPrefetcher>(
      *loader, config, HostMemory::Pinned, options.prefetchSlots);
  DFLASH_RETURN_IF_ERROR(prefetcher->start(options.finalStep - completedSteps));
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(
      cudaStreamCreateWithFlags(&copyStream, cudaStreamNonBlocking),
      "creating the input copy stream"));
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(
      cudaEventCreateWithFlags(&stagedReady, cudaEventDisableTiming),
      "cudaEventCreateWithFlags"));
  for (int index : map.inputs) {
    void *buffer = nullptr;
    // The online target writes target_hidden on the device.
    if (targetProgram && index == map.input(StepInput::TargetHidden)) {
      staging.push_back(nullptr);
      continue;
    }
    size_t bytes = program.buffers()[size_t(index)].bytes();
    DFLASH_RETURN_IF_ERROR(cudaCallStatus(
        cudaMalloc(&buffer, bytes),
        "allocating " + std::to_string(bytes) + " bytes of input staging"));
    staging.push_back(buffer);
  }
  return Status::success();
}
