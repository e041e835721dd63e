//===- Trainer.cpp - Runs the compiled step on one GPU --------------------===//

#include "runtime/train/Trainer.h"

#include "kernels/Bf16.h"
#include "runtime/device/Collectives.h"
#include "runtime/io/AtomicWrite.h"
#include "runtime/train/TargetServer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>

using namespace dflash;
using namespace dflash::rt;
namespace fs = std::filesystem;

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
  evalArena = nullptr;
  evalSums = nullptr;
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

Status Trainer::readParams(std::vector<std::vector<uint16_t>> &params) {
  std::vector<ParamInfo> table = parameterTable(config);
  params.assign(table.size(), {});
  for (size_t t = 0; t < table.size(); ++t) {
    params[t].resize(size_t(table[t].numel()));
    DFLASH_RETURN_IF_ERROR(
        download(map.param[t], params[t].data(), params[t].size() * 2));
  }
  return device.synchronize("copying the parameters to the host");
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

  // Data: this rank's batches in BatchLoader order, from the resumed
  // position when there is one.
  rows = inputs.rows;
  loader = std::make_unique<BatchLoader>(*rows, config, options.run.seed,
                                         options.rank, world);
  loader->setMaxBadRows(options.maxBadRows);
  DFLASH_RETURN_IF_ERROR(loader->validate());
  if (inputs.resume)
    DFLASH_RETURN_IF_ERROR(loader->seek(
        inputs.resume->data, inputs.resume->anchorRngState(options.rank)));
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

  initialised = true;
  return Status::success();
}

namespace {
/// Hands a prefetched batch back on every path out of a step.
class BatchLease {
public:
  BatchLease(BatchPrefetcher &prefetcher, PrefetchedBatch *batch)
      : prefetcher(prefetcher), batch(batch) {}
  BatchLease(const BatchLease &) = delete;
  BatchLease &operator=(const BatchLease &) = delete;
  ~BatchLease() { release(); }
  void release() {
    if (batch)
      prefetcher.release(batch);
    batch = nullptr;
  }
  /// The batch outlives this lease (its owner releases it later).
  void keep() { batch = nullptr; }

private:
  BatchPrefetcher &prefetcher;
  PrefetchedBatch *batch;
};

std::string numberText(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}
} // namespace

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
  evalSumBytes = floats * sizeof(float);
  evalArenaBytes = std::max<size_t>(evalProgram->arenaBytes(), 256);
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(cudaMalloc(&evalArena, evalArenaBytes),
                                        "allocating the evaluation arena of " +
                                            std::to_string(evalArenaBytes) +
                                            " bytes"));
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(
      cudaMalloc(reinterpret_cast<void **>(&evalSums), evalSumBytes),
      "allocating the evaluation sums"));
  DFLASH_RETURN_IF_ERROR(cudaCallStatus(
      cudaEventCreateWithFlags(&evalDone, cudaEventDisableTiming),
      "cudaEventCreateWithFlags"));
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
    default: // a ForwardSum (mapEvalBuffers allows nothing else)
      pointers[i] = evalSums + evalSumOffsets[k];
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
  }
  std::array<const double *, kNumForwardSums> sums{};
  for (int k = 0; k < kNumForwardSums; ++k)
    sums[size_t(k)] = total.data() + evalSumOffsets[size_t(k)];
  metrics = EvalMetrics();
  metrics.step = completedSteps - 1;
  setEvalFigures(metrics, sums, config.blockSize);
  // The sums are every GPU's; the rows this rank's (TrainerGroup adds them).
  metrics.rows = rowsRead;
  metrics.batches = batches;
  metrics.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
          .count();
  return Status::success();
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
  std::vector<std::string> skippedNow = batch->skippedRows;
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
  metrics.skippedRows = int64_t(skipped.size());
  return Status::success();
}

/// Empty when `state` holds every trainable tensor of `table` in full, else
/// what is wrong with it.
static std::string fullStateProblem(const TrainingState &state,
                                    const std::vector<ParamInfo> &table) {
  const char *names[] = {"master", "adam_m", "adam_v"};
  const std::vector<std::vector<float>> *groups[] = {
      &state.master, &state.adamM, &state.adamV};
  for (int g = 0; g < 3; ++g) {
    if (groups[g]->size() != table.size())
      return std::string(names[g]) + " has " +
             std::to_string(groups[g]->size()) + " tensors but the model has " +
             std::to_string(table.size());
    for (size_t t = 0; t < table.size(); ++t)
      if (int64_t((*groups[g])[t].size()) != table[t].numel())
        return std::string(names[g]) + " of '" + table[t].name + "' has " +
               std::to_string((*groups[g])[t].size()) + " elements but needs " +
               std::to_string(table[t].numel());
  }
  return "";
}

Status Trainer::readOptimizerState(TrainingState &state) {
  if (!initialised)
    return Status::error("the trainer is not initialised");
  std::vector<ParamInfo> table = parameterTable(config);
  if (std::string problem = fullStateProblem(state, table); !problem.empty())
    return Status::error("reading the optimizer state of rank " +
                         std::to_string(options.rank) + ": " + problem);
  if (!map.sharded) {
    for (size_t t = 0; t < table.size(); ++t) {
      size_t n = size_t(table[t].numel());
      Status status = download(map.master[t], state.master[t].data(), n * 4);
      if (status.ok())
        status = download(map.moment1[t], state.adamM[t].data(), n * 4);
      if (status.ok())
        status = download(map.moment2[t], state.adamV[t].data(), n * 4);
      if (!status.ok())
        return status;
    }
    return device.synchronize("copying the optimizer state to the host");
  }
  // This rank's shards, scattered into the tensors they cut: only its own
  // pieces are written, so the other ranks may fill the same state at once.
  std::vector<float> values[3];
  const int *slots[] = {map.shardMaster.data(), map.shardMoment1.data(),
                        map.shardMoment2.data()};
  std::vector<std::vector<float>> *targets[] = {&state.master, &state.adamM,
                                                &state.adamV};
  for (size_t k = 0; k < shards->buckets.size(); ++k) {
    const ShardedBucket &bucket = shards->buckets[k];
    const size_t count = size_t(bucket.shardElements);
    for (int r = 0; r < 3; ++r) {
      values[r].resize(count);
      DFLASH_RETURN_IF_ERROR(
          download(slots[r][k], values[r].data(), count * 4));
    }
    DFLASH_RETURN_IF_ERROR(device.synchronize(
        "copying optimizer shard '" + shardBufferName(k) + "' to the host"));
    for (const ShardPiece &piece : shardPieces(bucket, options.rank)) {
      const size_t t = map.shardTensors[k][piece.tensor];
      for (int r = 0; r < 3; ++r)
        std::copy_n(values[r].data() + piece.shardOffset, size_t(piece.length),
                    (*targets[r])[t].data() + piece.tensorOffset);
    }
  }
  return Status::success();
}

Status Trainer::readState(std::vector<std::vector<uint16_t>> &params,
                          TrainingState &state) {
  if (!initialised)
    return Status::error("the trainer is not initialised");
  std::vector<ParamInfo> table = parameterTable(config);
  DFLASH_RETURN_IF_ERROR(readParams(params));
  state = TrainingState();
  for (auto *group : {&state.master, &state.adamM, &state.adamV}) {
    group->assign(table.size(), {});
    for (size_t t = 0; t < table.size(); ++t)
      (*group)[t].assign(size_t(table[t].numel()), 0.0f);
  }
  DFLASH_RETURN_IF_ERROR(readOptimizerState(state));
  state.step = completedSteps;
  state.data = dataPosition;
  state.rngState = anchorRng;
  return Status::success();
}

Status Trainer::saveCheckpoint(std::string &dir,
                               const std::vector<Rng::State> &rankRngStates,
                               const TrainingState *assembled) {
  if (poisoned)
    return Status::error("the device state is not finite and is not saved");
  if (aborted)
    return Status::error("a step was aborted; the device state is not saved");
  if (options.outDir.empty())
    return Status::error("no output directory to save a checkpoint in");
  const int64_t world = options.run.worldSize;
  if (world > 1 && (int64_t(rankRngStates.size()) != world ||
                    rankRngStates[size_t(options.rank)] != anchorRng))
    return Status::error("a checkpoint of " + std::to_string(world) +
                         " ranks needs each rank's anchor Rng state");
  if (!assembled && holdsPartialState())
    return Status::error(
        "rank " + std::to_string(options.rank) +
        " holds only its shards of the optimizer state; a checkpoint needs "
        "the state of every rank, assembled");
  std::vector<std::vector<uint16_t>> params;
  TrainingState own;
  if (assembled) {
    if (std::string problem =
            fullStateProblem(*assembled, parameterTable(config));
        !problem.empty())
      return Status::error("the assembled optimizer state to save: " + problem);
    DFLASH_RETURN_IF_ERROR(readParams(params));
  } else if (Status s = readState(params, own); !s.ok()) {
    return s;
  }
  // Masters and moments from `assembled` when given; step, data position
  // and Rng states are this trainer's.
  TrainingStateRef state = (assembled ? *assembled : own).ref();
  state.step = completedSteps;
  state.data = dataPosition;
  state.rngState = anchorRng;
  state.otherRankRngStates.clear();
  if (world > 1) {
    state.rngState = rankRngStates.front();
    state.otherRankRngStates.assign(rankRngStates.begin() + 1,
                                    rankRngStates.end());
  }
  std::vector<const uint16_t *> paramPointers;
  for (const std::vector<uint16_t> &p : params)
    paramPointers.push_back(p.data());

  // The checkpoint and its run settings appear together: both are written
  // into one staged directory, swapped in as one.
  std::string target = checkpointDirectory(options.outDir, completedSteps);
  StagedDirectory staged;
  Status status = staged.begin(target);
  if (status.ok())
    status = writeTrainingCheckpointFiles(staged.path(), target, config,
                                          paramPointers, state);
  if (status.ok())
    status =
        writeRunSettings(staged.path() + "/" + kRunSettingsFile, options.run);
  if (status.ok())
    status = staged.commit();
  if (status.ok())
    status = writeFileAtomically(options.outDir + "/" + kLatestFile,
                                 "checkpoint-" +
                                     std::to_string(completedSteps) + "\n");
  if (!status.ok())
    return status;
  lastCheckpoint = target;
  dir = target;
  return Status::success();
}

Status Trainer::exportDrafter(
    const char *name,
    const std::vector<std::pair<std::string, std::string>> &extraFiles,
    std::string &dir) {
  if (poisoned)
    return Status::error("the device state is not finite and is not exported");
  if (aborted)
    return Status::error("a step was aborted; the drafter is not exported");
  if (options.outDir.empty())
    return Status::error("no output directory to export the drafter to");
  // Only the parameters: every rank holds all of them, sharded or not.
  std::vector<std::vector<uint16_t>> params;
  DFLASH_RETURN_IF_ERROR(readParams(params));
  std::vector<const uint16_t *> paramPointers;
  for (const std::vector<uint16_t> &p : params)
    paramPointers.push_back(p.data());
  std::string target = options.outDir + "/" + name;
  DFLASH_RETURN_IF_ERROR(
      exportCheckpoint(target, config, paramPointers, extraFiles));
  dir = target;
  return Status::success();
}

Status Trainer::exportBest(const EvalMetrics &metrics, std::string &dir) {
  return exportDrafter(kBestDir, {{kBestEvalFile, evalJsonLine(metrics)}}, dir);
}

Status Trainer::exportFinal(std::string &dir) {
  return exportDrafter(kFinalDir, {}, dir);
}
