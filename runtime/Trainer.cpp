//===- Trainer.cpp - Runs the compiled step on one GPU --------------------===//

#include "runtime/Trainer.h"
#include "schema/Parameters.h"

#include "kernels/Bf16.h"
#include "runtime/AtomicWrite.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

using namespace dflash;
using namespace dflash::rt;
namespace fs = std::filesystem;

//===----------------------------------------------------------------------===//
// Buffers of a step program
//===----------------------------------------------------------------------===//

namespace {
/// Checks buffers one at a time against what the runtime fills or reads.
class BufferChecker {
public:
  explicit BufferChecker(const std::vector<BufferSpec> &buffers)
      : buffers(buffers) {}

  std::string describe(int index) const {
    const BufferSpec &b = buffers[size_t(index)];
    return "step program: " + std::string(nameOf(b.role)) + " buffer '" +
           b.name + "'";
  }

  /// Puts `index` into `slot` after checking its dtype (one of `dtypes`)
  /// and shape.
  Status claim(int index, int &slot, std::initializer_list<DType> dtypes,
               const std::vector<int64_t> &shape) const {
    const BufferSpec &b = buffers[size_t(index)];
    if (slot != -1)
      return Status::error(describe(index) + " appears twice");
    bool dtypeOk = false;
    std::string expected;
    for (DType d : dtypes) {
      dtypeOk |= b.dtype == d;
      expected += std::string(expected.empty() ? "" : " or ") + dtypeName(d);
    }
    if (!dtypeOk)
      return Status::error(describe(index) + " has dtype " +
                           dtypeName(b.dtype) + " but the runtime needs " +
                           expected);
    if (b.shape != shape)
      return Status::error(describe(index) + " has shape " +
                           shapeString(b.shape) + " but the config needs " +
                           shapeString(shape));
    slot = index;
    return Status::success();
  }

  /// A scalar: any shape of one element.
  Status claimScalar(int index, int &slot, DType dtype) const {
    const BufferSpec &b = buffers[size_t(index)];
    if (shapeNumel(b.shape) != 1)
      return Status::error(describe(index) + " has shape " +
                           shapeString(b.shape) + " but must be a scalar");
    return claim(index, slot, {dtype}, b.shape);
  }

  /// The buffer's index within its role, if it is below `count`.
  Status member(int index, int64_t count, const char *what) const {
    int64_t i = buffers[size_t(index)].index;
    if (i < 0 || i >= count)
      return Status::error(describe(index) + " has index " +
                           std::to_string(i) + ", which is not " + what);
    return Status::success();
  }

private:
  const std::vector<BufferSpec> &buffers;
};
} // namespace

/// Checks a shard layout against the trainable tensors and records, per
/// bucket, which tensor of `table` each of its entries is.
static Status mapShardLayout(const OptimizerShardLayout &layout,
                             const std::vector<ParamInfo> &table,
                             StepBufferMap &m) {
  if (Status s = checkShardLayout(layout); !s.ok())
    return Status::error("step program: " + s.message());
  std::vector<int64_t> bucketOf(table.size(), -1);
  m.shardTensors.assign(layout.buckets.size(), {});
  for (size_t k = 0; k < layout.buckets.size(); ++k) {
    const std::string where =
        "step program: optimizer shard layout, bucket " + std::to_string(k);
    for (const ShardedTensor &tensor : layout.buckets[k].tensors) {
      if (tensor.param < 0 || tensor.param >= int64_t(table.size()))
        return Status::error(where + ": '" + tensor.name + "' (index " +
                             std::to_string(tensor.param) +
                             ") is not a trainable tensor of the config");
      size_t t = size_t(tensor.param);
      if (bucketOf[t] >= 0)
        return Status::error(where + ": tensor '" + tensor.name +
                             "' is already in bucket " +
                             std::to_string(bucketOf[t]));
      if (tensor.numel != table[t].numel())
        return Status::error(where + ": tensor '" + tensor.name + "' has " +
                             std::to_string(tensor.numel) +
                             " elements but the config gives it " +
                             std::to_string(table[t].numel()));
      bucketOf[t] = int64_t(k);
      m.shardTensors[k].push_back(t);
    }
  }
  for (size_t t = 0; t < table.size(); ++t)
    if (bucketOf[t] < 0)
      return Status::error("step program: the optimizer shard layout has no "
                           "bucket for '" +
                           table[t].name + "'");
  m.sharded = true;
  for (std::vector<int> *v : {&m.shardMaster, &m.shardMoment1, &m.shardMoment2})
    v->assign(layout.buckets.size(), -1);
  return Status::success();
}

Status dflash::rt::mapStepBuffers(const std::vector<BufferSpec> &buffers,
                                  const ModelConfig &c,
                                  const OptimizerShardLayout *shards,
                                  StepBufferMap &map) {
  StepBufferMap m;
  BufferChecker check(buffers);
  const int64_t V = c.vocabSize, H = c.hiddenSize;
  std::vector<ParamInfo> table = parameterTable(c);
  for (std::vector<int> *v : {&m.param, &m.master, &m.moment1, &m.moment2})
    v->assign(table.size(), -1);
  m.inputs.fill(-1);
  m.frozen.fill(-1);
  m.counters.fill(-1);
  m.namedMetrics.fill(-1);
  if (shards)
    if (Status s = mapShardLayout(*shards, table, m); !s.ok())
      return s;

  for (int i = 0; i < int(buffers.size()); ++i) {
    const BufferSpec &b = buffers[size_t(i)];
    Status status;
    switch (b.role) {
    case BufferRole::Input: {
      status = check.member(i, kNumStepInputs, "a step input");
      if (!status.ok())
        break;
      StepInput input = StepInput(b.index);
      std::initializer_list<DType> flag = {DType::U8, DType::BOOL};
      std::initializer_list<DType> exact = {dtypeOf(input)};
      status = check.claim(i, m.inputs[size_t(b.index)],
                           dtypeOf(input) == DType::U8 ? flag : exact,
                           shapeOf(input, c));
      break;
    }
    case BufferRole::Frozen:
      status = check.member(i, kNumFrozenWeights, "a frozen weight");
      if (status.ok())
        status = check.claim(i, m.frozen[size_t(b.index)], {DType::BF16},
                             {V, H});
      break;
    case BufferRole::Master:
    case BufferRole::Moment1:
    case BufferRole::Moment2:
      if (m.sharded) {
        status = check.member(
            i, int64_t(shards->buckets.size()),
            ("a bucket of the optimizer shard layout: the step shards its "
             "optimizer state into " +
             std::to_string(shards->buckets.size()) +
             " buckets ('bucket.<k>'), with no per-tensor state")
                .c_str());
        if (!status.ok())
          break;
        size_t k = size_t(b.index);
        std::vector<int> &slots = b.role == BufferRole::Master ? m.shardMaster
                                  : b.role == BufferRole::Moment1
                                      ? m.shardMoment1
                                      : m.shardMoment2;
        status = check.claim(i, slots[k], {DType::F32},
                             {shards->buckets[k].shardElements});
        break;
      }
      [[fallthrough]];
    case BufferRole::Parameter: {
      status = check.member(i, int64_t(table.size()),
                            "a trainable tensor of the config");
      if (!status.ok())
        break;
      size_t t = size_t(b.index);
      std::vector<int> &slots = b.role == BufferRole::Parameter ? m.param
                                : b.role == BufferRole::Master  ? m.master
                                : b.role == BufferRole::Moment1 ? m.moment1
                                                                : m.moment2;
      DType dtype = b.role == BufferRole::Parameter ? DType::BF16 : DType::F32;
      status = check.claim(i, slots[t], {dtype}, table[t].shape);
      break;
    }
    case BufferRole::Counter:
      status = check.member(i, kNumStepCounters, "a step counter");
      if (status.ok())
        status = check.claimScalar(i, m.counters[size_t(b.index)], DType::I32);
      break;
    case BufferRole::Metric: {
      if (b.dtype != DType::F32 || shapeNumel(b.shape) < 1) {
        status = Status::error(check.describe(i) + " has dtype " +
                               dtypeName(b.dtype) + " and shape " +
                               shapeString(b.shape) +
                               " but metrics are F32 with at least one "
                               "element");
        break;
      }
      m.metrics.push_back(i);
      // Metrics past the named ones are reported, not interpreted.
      if (b.index >= 0) {
        status = check.member(i, kNumStepMetrics, "a step metric");
        if (status.ok())
          status =
              check.claimScalar(i, m.namedMetrics[size_t(b.index)], DType::F32);
      }
      break;
    }
    }
    if (!status.ok())
      return status;
  }

  for (int k = 0; k < kNumStepInputs; ++k)
    if (m.inputs[size_t(k)] < 0)
      return Status::error("step program: has no input buffer '" +
                           std::string(nameOf(StepInput(k))) + "'");
  if (m.frozen[size_t(FrozenWeight::Embed)] < 0)
    return Status::error("step program: has no frozen buffer 'embed'");
  if (!c.tieWordEmbeddings && m.frozen[size_t(FrozenWeight::LmHead)] < 0)
    return Status::error("step program: has no frozen buffer 'lm_head' but "
                         "the target does not tie it to the embedding");
  for (int k = 0; k < kNumStepCounters; ++k)
    if (m.counters[size_t(k)] < 0)
      return Status::error("step program: has no counter buffer '" +
                           std::string(nameOf(StepCounter(k))) + "'");
  for (int k = 0; k < kNumStepMetrics; ++k)
    if (m.namedMetrics[size_t(k)] < 0)
      return Status::error("step program: has no metric buffer '" +
                           std::string(nameOf(StepMetric(k))) + "'");
  const BufferRole perTensor[] = {BufferRole::Parameter, BufferRole::Master,
                                  BufferRole::Moment1, BufferRole::Moment2};
  // Sharded: the parameters per tensor, the state per bucket.
  const int perTensorRoles = m.sharded ? 1 : 4;
  const std::vector<int> *lists[] = {&m.param, &m.master, &m.moment1,
                                     &m.moment2};
  for (int r = 0; r < perTensorRoles; ++r)
    for (size_t t = 0; t < table.size(); ++t)
      if ((*lists[r])[t] < 0)
        return Status::error("step program: has no " +
                             std::string(nameOf(perTensor[r])) +
                             " buffer for '" + table[t].name + "'");
  if (m.sharded) {
    const std::vector<int> *shardLists[] = {&m.shardMaster, &m.shardMoment1,
                                            &m.shardMoment2};
    for (int r = 0; r < 3; ++r)
      for (size_t k = 0; k < shardLists[r]->size(); ++k)
        if ((*shardLists[r])[k] < 0)
          return Status::error(
              "step program: has no " + std::string(nameOf(perTensor[1 + r])) +
              " buffer '" + shardBufferName(k) + "' for bucket " +
              std::to_string(k) + " of its optimizer shard layout");
    m.master.clear();
    m.moment1.clear();
    m.moment2.clear();
  }
  map = std::move(m);
  return Status::success();
}

StepHyper dflash::rt::stepHyperFor(const ModelConfig &c, double lr,
                                   double warmupRatio) {
  StepHyper hyper;
  hyper.lr = float(lr);
  hyper.warmupRatio = float(warmupRatio);
  hyper.maxGradNorm = float(c.maxGradNorm);
  hyper.beta1 = float(c.beta1);
  hyper.beta2 = float(c.beta2);
  hyper.eps = float(c.adamEps);
  hyper.weightDecay = float(c.weightDecay);
  return hyper;
}

//===----------------------------------------------------------------------===//
// Checkpoint layout
//===----------------------------------------------------------------------===//

static const char *kRunFormat = "dflash-trainer-run";

Status dflash::rt::writeRunSettings(const std::string &path,
                                    const RunSettings &run) {
  nlohmann::ordered_json json;
  json["format"] = kRunFormat;
  json["version"] = 1;
  json["total_steps"] = run.totalSteps;
  json["seed"] = run.seed;
  json["lr"] = run.lr;
  json["warmup_ratio"] = run.warmupRatio;
  json["data"] = run.data;
  json["synthetic_rows"] = run.syntheticRows;
  json["world_size"] = run.worldSize;
  return writeFileAtomically(path, json.dump(2) + "\n");
}

Status dflash::rt::readRunSettings(const std::string &checkpointDir,
                                   RunSettings &run, bool &found) {
  std::string path = checkpointDir + "/" + kRunSettingsFile;
  std::error_code ec;
  found = fs::exists(path, ec);
  if (!found)
    return Status::success();
  std::string text;
  if (Status s = readTextFile(path, text); !s.ok())
    return s;
  nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded() || !json.is_object())
    return Status::error(path + ": not a json object");
  auto format = json.find("format");
  if (format == json.end() || *format != kRunFormat)
    return Status::error(path + ": 'format' is not '" +
                         std::string(kRunFormat) + "'");
  RunSettings read;
  auto field = [&](const char *key, auto &value,
                   bool (nlohmann::json::*is)() const) -> Status {
    auto it = json.find(key);
    if (it == json.end() || !((*it).*is)())
      return Status::error(path + ": '" + key + "' is missing or has the " +
                           "wrong type");
    value = it->get<std::remove_reference_t<decltype(value)>>();
    return Status::success();
  };
  Status status =
      field("total_steps", read.totalSteps, &nlohmann::json::is_number_integer);
  if (status.ok())
    status = field("seed", read.seed, &nlohmann::json::is_number_integer);
  if (status.ok())
    status = field("lr", read.lr, &nlohmann::json::is_number);
  if (status.ok())
    status =
        field("warmup_ratio", read.warmupRatio, &nlohmann::json::is_number);
  if (status.ok())
    status = field("data", read.data, &nlohmann::json::is_string);
  if (status.ok())
    status = field("synthetic_rows", read.syntheticRows,
                   &nlohmann::json::is_number_integer);
  if (status.ok())
    status =
        field("world_size", read.worldSize, &nlohmann::json::is_number_integer);
  if (!status.ok())
    return status;
  if (read.totalSteps < 1)
    return Status::error(path + ": 'total_steps' must be positive");
  run = read;
  return Status::success();
}

std::string dflash::rt::checkpointDirectory(const std::string &outDir,
                                            int64_t steps) {
  return outDir + "/checkpoint-" + std::to_string(steps);
}

bool dflash::rt::checkpointDue(int64_t stepsDone, int64_t finalStep,
                               int64_t saveEvery) {
  if (stepsDone <= 0)
    return false;
  if (stepsDone == finalStep)
    return true;
  return saveEvery > 0 && stepsDone % saveEvery == 0;
}

Status dflash::rt::resolveCheckpoint(const std::string &path,
                                     std::string &checkpointDir) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    return Status::error(path + ": no such directory");
  if (!fs::is_directory(path, ec))
    return Status::error(path + ": not a directory");
  if (fs::exists(path + "/" + kTrainingStateFile, ec)) {
    checkpointDir = path;
    return Status::success();
  }
  std::string latestPath = path + "/" + kLatestFile;
  if (!fs::exists(latestPath, ec))
    return Status::error(
        path + ": neither a training checkpoint (no " + kTrainingStateFile +
        ") nor an output directory with a '" + kLatestFile + "' file");
  std::string name;
  if (Status s = readTextFile(latestPath, name); !s.ok())
    return s;
  while (!name.empty() && std::isspace((unsigned char)name.back()))
    name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos)
    return Status::error(latestPath + ": does not name a checkpoint directory");
  std::string candidate = path + "/" + name;
  if (!fs::exists(candidate + "/" + kTrainingStateFile, ec))
    return Status::error(latestPath + ": names '" + name + "' but " +
                         candidate + " has no " + kTrainingStateFile);
  checkpointDir = candidate;
  return Status::success();
}

//===----------------------------------------------------------------------===//
// Trainer
//===----------------------------------------------------------------------===//

/// The shard size is compiled in: a sharded step runs on its world only.
static Status checkShardWorld(const OptimizerShardLayout &shards,
                              int64_t world) {
  if (shards.worldSize == world)
    return Status::success();
  auto gpus = [](int64_t n) {
    return std::to_string(n) + (n == 1 ? " GPU" : " GPUs");
  };
  return Status::error(
      "this trainer was compiled to shard the optimizer state over " +
      gpus(shards.worldSize) +
      " ([parallel] gpus_per_node x nodes in its spec) but runs on " +
      std::to_string(world) + "; recompile the spec for " + gpus(world) +
      " or drop shard_optimizer_state");
}

Trainer::Trainer(StepProgram &program, DeviceContext &device,
                 TrainerOptions options)
    : program(program), device(device), options(std::move(options)),
      config(program.config()) {}

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
  hostCounters = nullptr;
  hostMetrics = nullptr;
}

Status Trainer::upload(int index, const void *data, size_t bytes) {
  const BufferSpec &spec = program.buffers()[size_t(index)];
  if (bytes != spec.bytes())
    return Status::error("buffer '" + spec.name + "' needs " +
                         std::to_string(spec.bytes()) + " bytes but " +
                         std::to_string(bytes) + " were given");
  if (Status s = cudaCallStatus(
          cudaMemcpyAsync(device.buffers()[size_t(index)], data, bytes,
                          cudaMemcpyHostToDevice, device.stream()),
          "copying '" + spec.name + "' to the device");
      !s.ok())
    return s;
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
    if (Status s =
            download(map.param[t], params[t].data(), params[t].size() * 2);
        !s.ok())
      return s;
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
    if (Status s = upload(map.shardMaster[k], master.data(), count * 4);
        !s.ok())
      return s;
    // Fresh moments are the zeros of allocate().
    if (resume) {
      if (Status s = upload(map.shardMoment1[k], moment1.data(), count * 4);
          !s.ok())
        return s;
      if (Status s = upload(map.shardMoment2[k], moment2.data(), count * 4);
          !s.ok())
        return s;
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
  if (Status s = device.makeCurrent(); !s.ok())
    return s;
  shards = program.optimizerShards();
  if (Status s = mapStepBuffers(program.buffers(), config, shards, map);
      !s.ok())
    return s;
  if (shards)
    if (Status s = checkShardWorld(*shards, world); !s.ok())
      return s;

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

  if (Status s = device.allocate(program.buffers(), program.arenaBytes());
      !s.ok())
    return s;
  if (Status s = device.memory(afterAllocation); !s.ok())
    return s;

  // Frozen weights; a tied target fills an lm_head buffer with the
  // embedding should the step have one.
  if (Status s =
          upload(map.frozenWeight(FrozenWeight::Embed), inputs.target->embed.data(), frozenElements * 2);
      !s.ok())
    return s;
  if (map.frozenWeight(FrozenWeight::LmHead) >= 0)
    if (Status s =
            upload(map.frozenWeight(FrozenWeight::LmHead), inputs.target->lmHeadData(), frozenElements * 2);
        !s.ok())
      return s;

  // Parameters, fp32 masters (the bf16 values widened, or the resumed
  // ones), Adam moments (zero from allocate(), or the resumed ones).
  std::vector<float> widened;
  for (size_t t = 0; t < table.size(); ++t) {
    const std::vector<uint16_t> &param = inputs.params[t];
    if (Status s = upload(map.param[t], param.data(), param.size() * 2);
        !s.ok())
      return s;
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
    if (Status s = upload(map.master[t], master, param.size() * 4); !s.ok())
      return s;
    if (inputs.resume) {
      if (Status s = upload(map.moment1[t], inputs.resume->adamM[t].data(),
                            param.size() * 4);
          !s.ok())
        return s;
      if (Status s = upload(map.moment2[t], inputs.resume->adamV[t].data(),
                            param.size() * 4);
          !s.ok())
        return s;
    }
  }

  if (map.sharded)
    if (Status s = uploadShards(inputs.params,
                                inputs.resume ? &*inputs.resume : nullptr);
        !s.ok())
      return s;

  // Pinned host scalars: counters in, metrics out.
  if (Status s = cudaCallStatus(
          cudaHostAlloc(reinterpret_cast<void **>(&hostCounters),
                        2 * sizeof(int32_t), cudaHostAllocDefault),
          "cudaHostAlloc of the step counters");
      !s.ok())
    return s;
  size_t metricFloats = 0;
  for (int index : map.metrics) {
    metricOffsets.push_back(metricFloats);
    metricFloats += size_t(shapeNumel(program.buffers()[size_t(index)].shape));
  }
  if (Status s = cudaCallStatus(
          cudaHostAlloc(reinterpret_cast<void **>(&hostMetrics),
                        metricFloats * sizeof(float), cudaHostAllocDefault),
          "cudaHostAlloc of the step metrics");
      !s.ok())
    return s;
  if (options.run.totalSteps > INT32_MAX)
    return Status::error("total steps " +
                         std::to_string(options.run.totalSteps) +
                         " do not fit the step's int32 counter");
  completedSteps = inputs.resume ? inputs.resume->step : 0;
  hostCounters[0] = int32_t(completedSteps);
  hostCounters[1] = int32_t(options.run.totalSteps);
  if (Status s = upload(map.counter(StepCounter::TotalSteps), &hostCounters[1], 4); !s.ok())
    return s;
  if (Status s = upload(map.counter(StepCounter::Step), &hostCounters[0], 4); !s.ok())
    return s;

  // copiesDone times the step without its input copies, too.
  for (cudaEvent_t *event : {&stepStart, &stepEnd, &copiesDone})
    if (Status s = cudaCallStatus(cudaEventCreate(event), "cudaEventCreate");
        !s.ok())
      return s;
  for (cudaEvent_t *event : {&metricsDone})
    if (Status s = cudaCallStatus(
            cudaEventCreateWithFlags(event, cudaEventDisableTiming),
            "cudaEventCreateWithFlags");
        !s.ok())
      return s;

  if (Status s = program.bind(
          device.buffers(), device.arena(), device.resources(),
          stepHyperFor(config, options.run.lr, options.run.warmupRatio));
      !s.ok())
    return s;

  // Data: this rank's batches in BatchLoader order, from the resumed
  // position when there is one.
  rows = inputs.rows;
  loader = std::make_unique<BatchLoader>(*rows, config, options.run.seed,
                                         options.rank, world);
  if (Status s = loader->validate(); !s.ok())
    return s;
  if (inputs.resume)
    if (Status s = loader->seek(inputs.resume->data,
                                inputs.resume->anchorRngState(options.rank));
        !s.ok())
      return s;
  dataPosition = loader->position();
  anchorRng = loader->anchorRngState();
  prefetcher = std::make_unique<BatchPrefetcher>(
      *loader, config, HostMemory::Pinned, options.prefetchSlots);
  if (Status s = prefetcher->start(options.finalStep - completedSteps);
      !s.ok())
    return s;
  if (Status s = cudaCallStatus(
          cudaStreamCreateWithFlags(&copyStream, cudaStreamNonBlocking),
          "creating the input copy stream");
      !s.ok())
    return s;
  if (Status s = cudaCallStatus(
          cudaEventCreateWithFlags(&stagedReady, cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
      !s.ok())
    return s;
  for (int index : map.inputs) {
    void *buffer = nullptr;
    size_t bytes = program.buffers()[size_t(index)].bytes();
    if (Status s = cudaCallStatus(cudaMalloc(&buffer, bytes),
                                  "allocating " + std::to_string(bytes) +
                                      " bytes of input staging");
        !s.ok())
      return s;
    staging.push_back(buffer);
  }

  initialised = true;
  return Status::success();
}

Status Trainer::captureGraph() {
  cudaStream_t stream = device.stream();
  // Thread-local: other trainers of this process may make unsafe calls
  // (cudaMalloc, synchronisation) on their own threads meanwhile.
  if (Status s = cudaCallStatus(
          cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
      !s.ok())
    return s;
  Status enqueued = program.enqueue(stream);
  cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!enqueued.ok())
    return enqueued;
  if (Status s = cudaCallStatus(
          ended, "capturing the step as a CUDA graph (try --no-graph to run "
                 "it eagerly)");
      !s.ok())
    return s;
  // An all-reduce the step asked for while capturing and NCCL refused.
  if (Status s = collectivesStatus(); !s.ok())
    return s;
  return cudaCallStatus(cudaGraphInstantiate(&graphExec, graph, 0),
                        "cudaGraphInstantiate of the step");
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

Status Trainer::stageNextBatch() {
  PrefetchedBatch *batch = nullptr;
  if (Status s = prefetcher->acquire(batch); !s.ok())
    return s;
  BatchLease lease(*prefetcher, batch);
  // The staging buffers are free once the last step copied them out (before
  // the first step the event has not been recorded and the wait is a no-op).
  if (Status s = cudaCallStatus(cudaStreamWaitEvent(copyStream, copiesDone, 0),
                                "ordering the input copies");
      !s.ok())
    return s;
  const void *sources[] = {batch->inputIds, batch->lossMask,
                           batch->hiddenStates, batch->anchors, batch->keep};
  const auto &indices = map.inputs; // StepInput order
  for (size_t i = 0; i < staging.size(); ++i) {
    const BufferSpec &spec = program.buffers()[size_t(indices[i])];
    if (Status s = cudaCallStatus(
            cudaMemcpyAsync(staging[i], sources[i], spec.bytes(),
                            cudaMemcpyHostToDevice, copyStream),
            "copying '" + spec.name + "' to the device");
        !s.ok())
      return s;
  }
  if (Status s = cudaCallStatus(cudaEventRecord(stagedReady, copyStream),
                                "cudaEventRecord");
      !s.ok())
    return s;
  staged = batch;
  lease.keep();
  return Status::success();
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
  if (Status s = prepareStep(); !s.ok())
    return s;
  const std::string where = "step " + std::to_string(completedSteps);
  PrefetchedBatch *batch = staged;
  staged = nullptr;
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
  if (Status s = cudaCallStatus(cudaEventRecord(stepStart, stream),
                                where + ": cudaEventRecord");
      !s.ok())
    return s;
  // The batch was staged on the device while the previous step ran.
  if (Status s = cudaCallStatus(cudaStreamWaitEvent(stream, stagedReady, 0),
                                where + ": waiting for the staged batch");
      !s.ok())
    return s;
  const auto &inputIndices = map.inputs; // StepInput order
  for (size_t i = 0; i < staging.size(); ++i)
    if (Status s = cudaCallStatus(
            cudaMemcpyAsync(buffers[size_t(inputIndices[i])], staging[i],
                            specs[size_t(inputIndices[i])].bytes(),
                            cudaMemcpyDeviceToDevice, stream),
            where + ": copying '" + specs[size_t(inputIndices[i])].name +
                "' into place");
        !s.ok())
      return s;
  // The previous step's copy of this pinned scalar has completed: every
  // step ends with a wait for its metrics.
  hostCounters[0] = int32_t(completedSteps);
  if (Status s = cudaCallStatus(
          cudaMemcpyAsync(buffers[size_t(map.counter(StepCounter::Step))], &hostCounters[0],
                          sizeof(int32_t), cudaMemcpyHostToDevice, stream),
          where + ": copying the step counter to the device");
      !s.ok())
    return s;
  if (Status s = cudaCallStatus(cudaEventRecord(copiesDone, stream),
                                where + ": cudaEventRecord");
      !s.ok())
    return s;

  if (useGraph) {
    if (Status s = cudaCallStatus(cudaGraphLaunch(graphExec, stream),
                                  where + ": cudaGraphLaunch");
        !s.ok())
      return s;
  } else {
    if (Status s = program.enqueue(stream); !s.ok())
      return Status::error(where + ": " + s.message());
    if (Status s =
            cudaCallStatus(cudaGetLastError(), where + ": launching the step");
        !s.ok())
      return s;
    if (Status s = collectivesStatus(); !s.ok())
      return Status::error(where + ": " + s.message());
    collectivesWarm = true;
  }
  if (Status s = cudaCallStatus(cudaEventRecord(stepEnd, stream),
                                where + ": cudaEventRecord");
      !s.ok())
    return s;
  for (size_t m = 0; m < map.metrics.size(); ++m) {
    int index = map.metrics[m];
    if (Status s = cudaCallStatus(
            cudaMemcpyAsync(
                hostMetrics + metricOffsets[m], buffers[size_t(index)],
                specs[size_t(index)].bytes(), cudaMemcpyDeviceToHost, stream),
            where + ": copying metric '" + specs[size_t(index)].name +
                "' from the device");
        !s.ok())
      return s;
  }
  if (Status s = cudaCallStatus(cudaEventRecord(metricsDone, stream),
                                where + ": cudaEventRecord");
      !s.ok())
    return s;

  // This batch's pinned slot was copied out before the previous step ended;
  // free it for the prefetch thread, then stage the next batch so that its
  // transfer overlaps this step.
  if (Status s = cudaCallStatus(cudaEventSynchronize(stagedReady),
                                where + ": copying the batch to the device");
      !s.ok())
    return s;
  DataPosition positionAfter = batch->positionAfter;
  Rng::State rngAfter = batch->anchorRngAfter;
  lease.release();
  if (completedSteps + 1 < options.finalStep) // the last step stages nothing
    stagingError = stageNextBatch();
  if (Status s = waitForStep(metricsDone, where + ": running the step");
      !s.ok())
    return s;
  float elapsedMs = 0, computeMs = 0;
  if (Status s =
          cudaCallStatus(cudaEventElapsedTime(&elapsedMs, stepStart, stepEnd),
                         where + ": cudaEventElapsedTime");
      !s.ok())
    return s;
  if (Status s = cudaCallStatus(
          cudaEventElapsedTime(&computeMs, copiesDone, stepEnd),
          where + ": cudaEventElapsedTime");
      !s.ok())
    return s;

  auto metricValue = [&](int index) {
    for (size_t m = 0; m < map.metrics.size(); ++m)
      if (map.metrics[m] == index)
        return double(hostMetrics[metricOffsets[m]]);
    return 0.0;
  };
  metrics = StepMetrics();
  metrics.step = completedSteps;
  metrics.loss = metricValue(map.metric(StepMetric::Loss));
  metrics.acc = metricValue(map.metric(StepMetric::Acc));
  metrics.gradNorm = metricValue(map.metric(StepMetric::GradNorm));
  metrics.lr = metricValue(map.metric(StepMetric::Lr));
  metrics.stepMs = elapsedMs;
  metrics.computeMs = computeMs;
  setThroughput(metrics, config, options.run.worldSize, program.flopsPerStep());
  if (afterFirstStep.totalBytes == 0)
    if (Status s = device.memory(afterFirstStep); !s.ok())
      return s;

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
      if (Status s = download(slots[r][k], values[r].data(), count * 4);
          !s.ok())
        return s;
    }
    if (Status s = device.synchronize("copying optimizer shard '" +
                                      shardBufferName(k) + "' to the host");
        !s.ok())
      return s;
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
  if (Status s = readParams(params); !s.ok())
    return s;
  state = TrainingState();
  for (auto *group : {&state.master, &state.adamM, &state.adamV}) {
    group->assign(table.size(), {});
    for (size_t t = 0; t < table.size(); ++t)
      (*group)[t].assign(size_t(table[t].numel()), 0.0f);
  }
  if (Status s = readOptimizerState(state); !s.ok())
    return s;
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
    if (Status s = readParams(params); !s.ok())
      return s;
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
  // into one staged directory (saveTrainingCheckpoint swaps its own files
  // into the staged one).
  std::string target = checkpointDirectory(options.outDir, completedSteps);
  StagedDirectory staged;
  Status status = staged.begin(target);
  if (status.ok())
    status =
        saveTrainingCheckpoint(staged.path(), config, paramPointers, state);
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

Status Trainer::exportFinal(std::string &dir) {
  if (poisoned)
    return Status::error("the device state is not finite and is not exported");
  if (aborted)
    return Status::error("a step was aborted; the drafter is not exported");
  if (options.outDir.empty())
    return Status::error("no output directory to export the drafter to");
  // Only the parameters: every rank holds all of them, sharded or not.
  std::vector<std::vector<uint16_t>> params;
  if (Status s = readParams(params); !s.ok())
    return s;
  std::vector<const uint16_t *> paramPointers;
  for (const std::vector<uint16_t> &p : params)
    paramPointers.push_back(p.data());
  std::string target = options.outDir + "/" + kFinalDir;
  if (Status s = exportCheckpoint(target, config, paramPointers); !s.ok())
    return s;
  dir = target;
  return Status::success();
}

//===----------------------------------------------------------------------===//
// TrainerGroup
//===----------------------------------------------------------------------===//

struct TrainerGroup::Worker {
  int local = 0;
  int gpu = 0;
  std::unique_ptr<Collectives> collectives;
  std::unique_ptr<StepProgram> program;
  std::unique_ptr<DeviceContext> device;
  std::unique_ptr<Trainer> trainer;
  StepMetrics metrics; ///< the last step's, written by its job
  std::thread thread;
  // Guarded by TrainerGroup::mutex.
  Job job;
  bool posted = false, done = false, quit = false;
  Status result;
};

TrainerGroup::TrainerGroup(StepProgramFactory factory, TrainerOptions options,
                           GroupLayout layout)
    : factory(std::move(factory)), options(std::move(options)),
      layout(std::move(layout)) {}

TrainerGroup::~TrainerGroup() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (std::unique_ptr<Worker> &w : workers)
      w->quit = true;
  }
  changed.notify_all();
  for (std::unique_ptr<Worker> &w : workers)
    if (w->thread.joinable())
      w->thread.join();
}

void TrainerGroup::serve(Worker &w) {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [&] { return w.posted || w.quit; });
      if (!w.posted)
        break;
      job = std::move(w.job);
      w.posted = false;
    }
    Status result;
    try {
      result = job(w);
    } catch (const std::exception &error) {
      // Host allocations of a huge step, mostly; the thread must report,
      // not end the process.
      result = Status::error("device " + std::to_string(w.gpu) + ": " +
                             error.what());
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      w.result = std::move(result);
      w.done = true;
    }
    changed.notify_all();
  }
  // Freed on the thread that used them, with its device current: the
  // trainer first (graph, prefetch thread), the step program, the context,
  // and last the communicator, which every rank destroys at the same time.
  w.trainer.reset();
  w.program.reset();
  w.device.reset();
  if (w.collectives && abortRequested.load())
    w.collectives->abort(); // peers may be gone: do not wait for them
  w.collectives.reset();
}

Status TrainerGroup::runOnWorkers(const Job &job, int only) {
  std::unique_lock<std::mutex> lock(mutex);
  auto selected = [&](const Worker &w) { return only < 0 || w.local == only; };
  for (std::unique_ptr<Worker> &w : workers)
    if (selected(*w)) {
      w->job = job;
      w->posted = true;
      w->done = false;
      w->result = Status::success();
    }
  changed.notify_all();
  while (true) {
    bool allDone = true, anyFailed = false;
    for (std::unique_ptr<Worker> &w : workers)
      if (selected(*w)) {
        allDone &= w->done;
        anyFailed |= w->done && !w->result.ok();
      }
    // The ranks still waiting in a collective for the failed one give up.
    if (anyFailed)
      abortRequested.store(true);
    if (allDone)
      break;
    changed.wait(lock);
  }
  const Status *first = nullptr, *firstOwn = nullptr;
  for (std::unique_ptr<Worker> &w : workers) {
    if (!selected(*w) || w->result.ok())
      continue;
    if (!first)
      first = &w->result;
    if (!firstOwn && !(w->trainer && w->trainer->stoppedByPeer()))
      firstOwn = &w->result;
  }
  return firstOwn ? *firstOwn : first ? *first : Status::success();
}

const DeviceContext &TrainerGroup::device(int local) const {
  return *workers[size_t(local)]->device;
}

const Trainer &TrainerGroup::trainer(int local) const {
  return *workers[size_t(local)]->trainer;
}

Status TrainerGroup::init(const TrainerInputs &inputs) {
  if (initialised || !workers.empty())
    return Status::error("the trainer group is initialised twice");
  if (layout.gpus.empty())
    return Status::error("no GPU to train on");
  if (layout.nodes < 1 || layout.node < 0 || layout.node >= layout.nodes ||
      (layout.nodes > 1 && !layout.processes))
    return Status::error("node " + std::to_string(layout.node) + " of " +
                         std::to_string(layout.nodes) +
                         " has no process group");
  if (options.run.worldSize != layout.worldSize())
    return Status::error(
        "the run settings say " + std::to_string(options.run.worldSize) +
        " GPUs but the group has " + std::to_string(layout.worldSize()));

  for (size_t i = 0; i < layout.gpus.size(); ++i) {
    auto w = std::make_unique<Worker>();
    w->local = int(i);
    w->gpu = layout.gpus[i];
    workers.push_back(std::move(w));
  }
  for (std::unique_ptr<Worker> &w : workers)
    w->thread = std::thread([this, worker = w.get()] { serve(*worker); });

  // The step programs first (no GPU yet): what a program cannot run on is
  // refused before the communicators wait for every rank.
  Status status = runOnWorkers([&](Worker &w) -> Status {
    w.program = factory ? factory() : nullptr;
    if (!w.program)
      return Status::error("device " + std::to_string(w.gpu) +
                           ": no step program");
    const OptimizerShardLayout *shards = w.program->optimizerShards();
    if (!shards)
      return Status::success();
    // Each process would hold only its own ranks' shards, and checkpoints
    // are assembled within one process.
    if (layout.nodes > 1)
      return Status::error(
          "this trainer shards the optimizer state (shard_optimizer_state), "
          "which runs on one node only: its checkpoints would need the "
          "shards of the other nodes' processes; train on one node, or "
          "recompile the spec without shard_optimizer_state");
    if (Status s = checkShardLayout(*shards); !s.ok())
      return Status::error("step program: " + s.message());
    return checkShardWorld(*shards, layout.worldSize());
  });
  if (!status.ok())
    return status;

  // Communicators next, from this thread: their creation waits for every
  // rank of the run, of every process.
  if (layout.usesCollectives()) {
    disableNvlinkMulticastByDefault();
    CollectiveId id;
    if (layout.node == 0)
      if (Status s = createCollectiveId(id); !s.ok())
        return s;
    if (layout.processes)
      if (Status s =
              layout.processes->broadcast(id.bytes.data(), id.bytes.size(), 0);
          !s.ok())
        return Status::error("sending the NCCL id to every node: " +
                             s.message());
    std::vector<std::unique_ptr<Collectives>> comms;
    if (Status s = Collectives::create(layout.gpus, layout.firstRank(),
                                       layout.worldSize(), id, comms);
        !s.ok())
      return s;
    // The workers are idle: the next job's hand-over orders these writes
    // before their reads.
    for (size_t i = 0; i < workers.size(); ++i)
      workers[i]->collectives = std::move(comms[i]);
  }

  status = runOnWorkers([&](Worker &w) -> Status {
    if (Status s = DeviceContext::create(w.gpu, w.program->gemmWorkspaceBytes(),
                                         w.device);
        !s.ok())
      return s;
    w.device->attachCollectives(w.collectives.get());
    TrainerOptions mine = options;
    mine.rank = layout.firstRank() + w.local;
    w.trainer = std::make_unique<Trainer>(*w.program, *w.device, mine);
    w.trainer->watchForAbort(&abortRequested);
    return w.trainer->init(inputs);
  });
  if (!status.ok())
    return status;
  completedSteps = workers.front()->trainer->stepsDone();
  flopsPerStep = workers.front()->program->flopsPerStep();
  partialState = workers.front()->trainer->holdsPartialState();
  rankRngStates.assign(size_t(layout.worldSize()), Rng::State{});
  initialised = true;
  return Status::success();
}

Status TrainerGroup::readState(int local,
                               std::vector<std::vector<uint16_t>> &params,
                               TrainingState &state) {
  if (!initialised || local < 0 || local >= localRanks())
    return Status::error("no trainer of local rank " + std::to_string(local));
  return runOnWorkers(
      [&](Worker &w) { return w.trainer->readState(params, state); }, local);
}

Status TrainerGroup::readFullState(std::vector<std::vector<uint16_t>> &params,
                                   TrainingState &state) {
  if (Status s = readState(0, params, state); !s.ok())
    return s;
  if (!partialState)
    return Status::success();
  TrainingState assembled;
  if (Status s = assembleOptimizerState(assembled); !s.ok())
    return s;
  state.master = std::move(assembled.master);
  state.adamM = std::move(assembled.adamM);
  state.adamV = std::move(assembled.adamV);
  return Status::success();
}

Status TrainerGroup::assembleOptimizerState(TrainingState &state) {
  if (!initialised)
    return Status::error("the trainer group is not initialised");
  std::vector<ParamInfo> table =
      parameterTable(workers.front()->program->config());
  for (auto *group : {&state.master, &state.adamM, &state.adamV}) {
    group->assign(table.size(), {});
    for (size_t t = 0; t < table.size(); ++t)
      (*group)[t].assign(size_t(table[t].numel()), 0.0f);
  }
  // Each local rank writes the elements of its own shards, which no other
  // rank touches: all at once, into the same vectors.
  return runOnWorkers(
      [&](Worker &w) { return w.trainer->readOptimizerState(state); });
}

namespace {
/// The words one process contributes to the per-step exchange: its stop
/// signal, then per local rank its step and compute times and anchor Rng.
constexpr size_t kWordsPerRank = 6;

uint64_t doubleBits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

double bitsDouble(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}
} // namespace

Status TrainerGroup::gatherStep(const TrainerHooks &hooks, bool stepOk,
                                StepMetrics &metrics, int &agreedStop) {
  const size_t world = size_t(layout.worldSize());
  const size_t first = size_t(layout.firstRank());
  // Unknown times (another process's, after a failed step) stay NaN and
  // show as null.
  std::vector<double> stepMs(world, std::nan("")),
      computeMs(world, std::nan(""));
  rankRngStates.resize(world);
  for (std::unique_ptr<Worker> &w : workers) {
    size_t rank = first + size_t(w->local);
    stepMs[rank] = w->metrics.stepMs;
    computeMs[rank] = w->metrics.computeMs;
    rankRngStates[rank] = w->trainer->anchorRngState();
  }
  // Over several processes, only after a step that went well everywhere:
  // a process whose step failed ends the whole run instead.
  if (layout.processes && layout.nodes > 1 && stepOk) {
    const size_t local = workers.size();
    const size_t perProcess = 1 + kWordsPerRank * local;
    std::vector<uint64_t> mine(perProcess),
        all(perProcess * size_t(layout.nodes));
    mine[0] = uint64_t(hooks.stopSignal ? hooks.stopSignal->load() : 0);
    for (size_t i = 0; i < local; ++i) {
      uint64_t *words = &mine[1 + kWordsPerRank * i];
      words[0] = doubleBits(stepMs[first + i]);
      words[1] = doubleBits(computeMs[first + i]);
      for (size_t k = 0; k < 4; ++k)
        words[2 + k] = rankRngStates[first + i][k];
    }
    if (Status s = layout.processes->allGather(
            mine.data(), mine.size() * sizeof(uint64_t), all.data());
        !s.ok())
      return Status::error("exchanging step " +
                           std::to_string(workers.front()->metrics.step) +
                           " with the other nodes: " + s.message());
    for (size_t node = 0; node < size_t(layout.nodes); ++node) {
      const uint64_t *words = &all[node * perProcess];
      if (words[0] != 0 && agreedStop == 0)
        agreedStop = int(words[0]);
      for (size_t i = 0; i < local; ++i) {
        const uint64_t *rankWords = words + 1 + kWordsPerRank * i;
        size_t rank = node * local + i;
        stepMs[rank] = bitsDouble(rankWords[0]);
        computeMs[rank] = bitsDouble(rankWords[1]);
        for (size_t k = 0; k < 4; ++k)
          rankRngStates[rank][k] = rankWords[2 + k];
      }
    }
  }
  // Loss, acc, grad_norm and lr are sums over every rank inside the step:
  // rank 0's (here the first local rank's) are the run's.
  metrics = workers.front()->metrics;
  auto slowest = [](const std::vector<double> &times) {
    double most = 0;
    for (double t : times)
      if (std::isfinite(t))
        most = std::max(most, t);
    return most;
  };
  metrics.stepMs = slowest(stepMs);
  metrics.computeMs = slowest(computeMs);
  metrics.rankStepMs = stepMs;
  setThroughput(metrics, workers.front()->program->config(), layout.worldSize(),
                flopsPerStep);
  return Status::success();
}

Status TrainerGroup::saveCheckpoint(std::string &dir) {
  std::vector<Rng::State> states = rankRngStates;
  std::string saved;
  // Sharded: the state of every rank, assembled, so that the checkpoint is
  // the one an unsharded run would write.
  TrainingState assembled;
  if (partialState)
    if (Status s = assembleOptimizerState(assembled); !s.ok())
      return s;
  if (Status s = runOnWorkers(
          [&](Worker &w) {
            return w.trainer->saveCheckpoint(
                saved, states, partialState ? &assembled : nullptr);
          },
          /*only=*/0);
      !s.ok())
    return s;
  lastCheckpoint = dir = saved;
  return Status::success();
}

Status TrainerGroup::run(const TrainerHooks &hooks, TrainerOutcome &outcome) {
  outcome = TrainerOutcome();
  if (!initialised)
    return Status::error("the trainer group is not initialised");
  // Rank 0 (the first GPU of node 0) writes every file of the run.
  const bool writesFiles = layout.node == 0 && !options.outDir.empty();
  const bool severalProcesses = layout.processes && layout.nodes > 1;
  const int64_t firstStep = completedSteps;
  int64_t lastSaved = -1;
  int agreedStop = 0;
  auto finish = [&](Status status) {
    outcome.stepsDone = completedSteps;
    outcome.stepsThisRun = completedSteps - firstStep;
    outcome.lastCheckpoint = lastCheckpoint;
    return status;
  };
  auto save = [&]() -> Status {
    lastSaved = completedSteps;
    if (!writesFiles)
      return Status::success();
    std::string dir;
    if (Status s = saveCheckpoint(dir); !s.ok())
      return s;
    if (hooks.onNote)
      hooks.onNote("saved checkpoint " + dir);
    return Status::success();
  };

  while (completedSteps < options.finalStep) {
    // Every process must run the same steps: over several, only a stop that
    // all of them agreed on after the last step counts.
    int signal = severalProcesses   ? agreedStop
                 : hooks.stopSignal ? hooks.stopSignal->load()
                                    : 0;
    if (signal) {
      outcome.stoppedBySignal = signal;
      break;
    }
    // Every rank has its batch before any starts the step: a rank that
    // cannot read its rows must fail before the others wait for it in a
    // collective (the first one also connects NCCL, on the host).
    Status status =
        runOnWorkers([](Worker &w) { return w.trainer->prepareStep(); });
    if (status.ok())
      status =
          runOnWorkers([](Worker &w) { return w.trainer->step(w.metrics); });
    // A non-finite step still reports its metrics, so that the log shows
    // it; other failures have none.
    bool reported = true;
    for (std::unique_ptr<Worker> &w : workers)
      reported &= w->result.ok() || w->trainer->nonFinite();
    if (reported) {
      StepMetrics metrics;
      Status gathered = gatherStep(hooks, status.ok(), metrics, agreedStop);
      if (gathered.ok() && hooks.onStep) {
        Status logged = hooks.onStep(metrics);
        if (status.ok())
          status = logged;
      }
      if (status.ok())
        status = gathered;
    }
    if (!status.ok())
      return finish(status);
    completedSteps = workers.front()->trainer->stepsDone();
    if (!options.outDir.empty() &&
        checkpointDue(completedSteps, options.finalStep, options.saveEvery))
      if (Status s = save(); !s.ok())
        return finish(s);
  }
  if (outcome.stoppedBySignal) {
    if (!options.outDir.empty() && completedSteps > firstStep &&
        lastSaved != completedSteps)
      if (Status s = save(); !s.ok())
        return finish(s);
    return finish(Status::success());
  }
  if (writesFiles && options.exportFinal) {
    std::string dir;
    if (Status s = runOnWorkers(
            [&](Worker &w) { return w.trainer->exportFinal(dir); }, 0);
        !s.ok())
      return finish(s);
    outcome.finalExport = dir;
    if (hooks.onNote)
      hooks.onNote("exported the drafter to " + dir);
  }
  return finish(Status::success());
}
