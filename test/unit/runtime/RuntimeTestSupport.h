//===- RuntimeTestSupport.h - Configs, files, rows, buffers -----*- C++ -*-===//
//
// What the runtime tests (test/unit/runtime, test/gpu's runtime tests) share:
// the small drafters they run, a temporary directory per test, whole files
// read back, the row-by-row comparison of two row sources, a child process
// holding an output directory's lock, a seed per run, the buffer list of a
// compiled step (per tensor or sharded per bucket, ZeRO-1), and, in
// `trainhost`, what the tests of train's host side (command line,
// preparation, metrics, checkpoints) share. Host code only, so that the
// runtime tests built without CUDA can include it.
//
//===----------------------------------------------------------------------===//

#ifndef DFLASH_TEST_UNIT_RUNTIMETESTSUPPORT_H
#define DFLASH_TEST_UNIT_RUNTIMETESTSUPPORT_H

#include "runtime/cli/TrainOptions.h"
#include "runtime/data/InitialParameters.h"
#include "runtime/data/Rng.h"
#include "runtime/data/RowSource.h"
#include "runtime/device/OptimizerShards.h"
#include "runtime/io/Checkpoint.h"
#include "runtime/io/DirectoryLock.h"
#include "runtime/train/RunLayout.h"
#include "schema/ModelConfig.h"
#include "schema/Parameters.h"
#include "schema/StepBuffers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <random>
#include <string>
#include <sys/wait.h>
#include <system_error>
#include <unistd.h>
#include <vector>

namespace dflash::runtimetest {

/// One full-attention draft layer, 16 wide (2 query heads, 1 KV head of 8),
/// over a 4-layer target tapped at layers 1 and 2; rows of 32 tokens with 3
/// anchors of 4-token blocks, 2 rows per GPU. Named "unit"; seed, schedule
/// and optimizer keep ModelConfig's defaults: each test sets those it relies
/// on.
inline ModelConfig oneLayerDrafterConfig() {
  ModelConfig c;
  c.name = "unit";
  c.targetModel = "test/target";
  c.targetNumLayers = 4;
  c.targetHiddenSize = c.hiddenSize = 16;
  c.vocabSize = 64;
  c.targetLayerIds = {1, 2};
  c.numLayers = 1;
  c.intermediateSize = 32;
  c.numHeads = 2;
  c.numKvHeads = 1;
  c.headDim = 8;
  c.blockSize = 4;
  c.maskTokenId = 63;
  c.maxPositionEmbeddings = 128;
  c.layerWindows = {0};
  c.seqLen = 32;
  c.anchorsPerRow = 3;
  c.rowsPerGpu = 2;
  return c;
}

/// Two draft layers, a sliding one (window 8) then a full one, 32 wide (4
/// query heads, 2 KV heads of 8), over a 6-layer target tapped at layers 1
/// and 3; rows of 32 tokens with 6 anchors of 4-token blocks, 2 rows per GPU.
/// Named "unit"; everything else keeps ModelConfig's defaults.
inline ModelConfig twoLayerDrafterConfig() {
  ModelConfig c;
  c.name = "unit";
  c.targetModel = "test/target";
  c.targetNumLayers = 6;
  c.targetHiddenSize = 32;
  c.vocabSize = 64;
  c.targetLayerIds = {1, 3};
  c.numLayers = 2;
  c.hiddenSize = 32;
  c.intermediateSize = 48;
  c.numHeads = 4;
  c.numKvHeads = 2;
  c.headDim = 8;
  c.blockSize = 4;
  c.maskTokenId = 63;
  c.maxPositionEmbeddings = 256;
  c.layerWindows = {8, 0};
  c.seqLen = 32;
  c.anchorsPerRow = 6;
  c.rowsPerGpu = 2;
  return c;
}

/// A fresh directory under the system's temporary directory, removed with
/// everything in it when the test ends; `path` is empty if it could not be
/// made. The prefix may name the test binary, so that a directory left behind
/// by a crash says where it came from. Not copyable: a copy would remove the
/// directory under the original.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string &prefix = "dflash-rt") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX"))
            .string();
    path = ::mkdtemp(pattern.data()) ? pattern : std::string();
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string &name) const {
    return path + "/" + name;
  }
};

/// The bytes of the file at `path`; empty if it cannot be read.
inline std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Expects rows [0, rows) of `actual` to equal those of `expected` in every
/// input, pinned anchors and keep flags included; both are shaped by
/// `config`. A row either source cannot read ends the comparison as a fatal
/// failure.
inline void expectSameRows(const rt::RowSource &actual,
                           const rt::RowSource &expected, int64_t rows,
                           const ModelConfig &config) {
  const int64_t S = config.seqLen, N = config.anchorsPerRow,
                LH = config.contextWidth();
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> ids(static_cast<size_t>(S)),
        ids2(static_cast<size_t>(S)), anchors(static_cast<size_t>(N)),
        anchors2(static_cast<size_t>(N));
    std::vector<uint8_t> mask(static_cast<size_t>(S)),
        mask2(static_cast<size_t>(S)), keep(static_cast<size_t>(N)),
        keep2(static_cast<size_t>(N));
    std::vector<uint16_t> hidden(size_t(S * LH)), hidden2(size_t(S * LH));
    ASSERT_TRUE(actual
                    .readRow(r, {ids.data(), mask.data(), hidden.data(),
                                 anchors.data(), keep.data()})
                    .ok());
    ASSERT_TRUE(expected
                    .readRow(r, {ids2.data(), mask2.data(), hidden2.data(),
                                 anchors2.data(), keep2.data()})
                    .ok());
    EXPECT_EQ(ids, ids2) << "row " << r;
    EXPECT_EQ(mask, mask2) << "row " << r;
    EXPECT_EQ(hidden, hidden2) << "row " << r;
    EXPECT_EQ(anchors, anchors2) << "row " << r;
    EXPECT_EQ(keep, keep2) << "row " << r;
  }
}

/// A child process holding `dir`'s output lock, as a live `train` would,
/// until killAndReap(); -1 when it could not take the lock.
inline pid_t holdDirectoryLockInChild(const std::string &dir) {
  int ready[2];
  if (::pipe(ready) != 0)
    return -1;
  pid_t child = ::fork();
  if (child == 0) {
    rt::DirectoryLock lock;
    char ok = rt::DirectoryLock::acquire(dir, lock).ok() ? 'y' : 'n';
    (void)!::write(ready[1], &ok, 1);
    while (true)
      ::pause();
  }
  char ok = 'n';
  (void)!::read(ready[0], &ok, 1);
  ::close(ready[0]);
  ::close(ready[1]);
  if (ok == 'y')
    return child;
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  return -1;
}

/// Ends a child at once, as a crash would (no destructor runs), and reaps it.
inline void killAndReap(pid_t child) {
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

/// A fresh seed per run (DFLASH_TEST_SEED=<n> repeats one), printed with
/// any failure.
inline uint64_t testSeed() {
  if (const char *given = std::getenv("DFLASH_TEST_SEED"))
    return std::strtoull(given, nullptr, 10);
  return std::random_device{}();
}

/// Every buffer a compiled step of `c` has, in the compiler's order: inputs,
/// frozen weights (no lm_head when tied), parameters, their fp32 masters and
/// Adam moments, counters, metrics.
inline std::vector<BufferSpec> stepBuffers(const ModelConfig &c) {
  std::vector<BufferSpec> buffers;
  for (int k = 0; k < kNumStepInputs; ++k) {
    StepInput input = StepInput(k);
    buffers.push_back({nameOf(input), BufferRole::Input, dtypeOf(input),
                       shapeOf(input, c), k});
  }
  for (int k = 0; k < kNumFrozenWeights; ++k)
    if (!(FrozenWeight(k) == FrozenWeight::LmHead && c.tieWordEmbeddings))
      buffers.push_back({nameOf(FrozenWeight(k)),
                         BufferRole::Frozen,
                         DType::BF16,
                         {c.vocabSize, c.hiddenSize},
                         k});
  std::vector<ParamInfo> table = parameterTable(c);
  for (size_t t = 0; t < table.size(); ++t)
    buffers.push_back({table[t].name, BufferRole::Parameter, DType::BF16,
                       table[t].shape, int64_t(t)});
  for (size_t t = 0; t < table.size(); ++t)
    for (BufferRole role :
         {BufferRole::Master, BufferRole::Moment1, BufferRole::Moment2})
      buffers.push_back(
          {table[t].name, role, DType::F32, table[t].shape, int64_t(t)});
  for (int k = 0; k < kNumStepCounters; ++k)
    buffers.push_back(
        {nameOf(StepCounter(k)), BufferRole::Counter, DType::I32, {}, k});
  for (int k = 0; k < kNumStepMetrics; ++k)
    buffers.push_back({nameOf(StepMetric(k)), BufferRole::Metric, DType::F32,
                       shapeOf(StepMetric(k), c), k});
  return buffers;
}

/// A shard layout of `c`'s optimizer state over `worldSize` ranks: the
/// trainable tensors in parameterTable order, cut into `buckets` buckets of
/// consecutive tensors (at least one each); every tensor starts at a
/// multiple of `alignElements` of its bucket (gaps between them), and every
/// shard has ceil(flat / worldSize) elements rounded up to 64, plus
/// `extraShard` (padding at the end).
inline rt::OptimizerShardLayout shardLayout(const ModelConfig &c,
                                            int64_t worldSize, size_t buckets,
                                            int64_t alignElements = 64,
                                            int64_t extraShard = 0) {
  std::vector<ParamInfo> table = parameterTable(c);
  rt::OptimizerShardLayout layout;
  layout.worldSize = worldSize;
  buckets = std::max<size_t>(1, std::min(buckets, table.size()));
  layout.buckets.resize(buckets);
  for (size_t t = 0; t < table.size(); ++t) {
    rt::ShardedBucket &bucket = layout.buckets[t * buckets / table.size()];
    int64_t end = bucket.tensors.empty() ? 0
                                         : bucket.tensors.back().offset +
                                               bucket.tensors.back().numel;
    int64_t offset = (end + alignElements - 1) / alignElements * alignElements;
    bucket.tensors.push_back(
        {table[t].name, offset, table[t].numel(), int64_t(t)});
  }
  for (rt::ShardedBucket &bucket : layout.buckets) {
    int64_t flat = bucket.tensors.back().offset + bucket.tensors.back().numel;
    int64_t shard = (flat + worldSize - 1) / worldSize;
    bucket.shardElements = (shard + 63) / 64 * 64 + extraShard;
  }
  return layout;
}

/// The buffers of a compiled step of `c` whose optimizer state is sharded
/// as `layout`: stepBuffers(c) with the per-tensor master and moments
/// replaced by one F32 [S_k] master, moment1 and moment2 buffer per bucket,
/// named "bucket.<k>".
inline std::vector<BufferSpec>
shardedStepBuffers(const ModelConfig &c,
                   const rt::OptimizerShardLayout &layout) {
  std::vector<BufferSpec> buffers;
  for (BufferSpec &b : stepBuffers(c)) {
    if (b.role == BufferRole::Master || b.role == BufferRole::Moment1 ||
        b.role == BufferRole::Moment2)
      continue;
    if (b.role == BufferRole::Counter && b.index == int64_t(StepCounter::Step))
      for (size_t k = 0; k < layout.buckets.size(); ++k)
        for (BufferRole role :
             {BufferRole::Master, BufferRole::Moment1, BufferRole::Moment2})
          buffers.push_back({shardBufferName(k),
                             role,
                             DType::F32,
                             {layout.buckets[k].shardElements},
                             int64_t(k)});
    buffers.push_back(std::move(b));
  }
  return buffers;
}

/// The tests of train's host side, split by unit from what was one test of
/// `train` without a GPU: their drafter, their directories, their command
/// lines and the checkpoints their resumes start from. A namespace of its
/// own: other runtime tests have a smallConfig() of their own.
namespace trainhost {

/// The one-layer drafter, named "trainmain" (the help text shows the
/// name), with the defaults the command line reads: seed 7, lr 3e-3,
/// warmup ratio 0.04, 50 steps.
inline ModelConfig smallConfig() {
  ModelConfig c = oneLayerDrafterConfig();
  c.name = "trainmain";
  c.seed = 7;
  c.lr = 3e-3;
  c.warmupRatio = 0.04;
  c.totalSteps = 50;
  return c;
}

/// Named after these tests, like the run directories it holds.
struct TrainMainTempDir : TempDir {
  TrainMainTempDir() : TempDir("dflash-trainmain") {}
};

/// argv for the parser; the strings live in the vector.
class Args {
public:
  Args(std::initializer_list<std::string> items) : strings(items) {
    strings.insert(strings.begin(), "train");
    for (std::string &s : strings)
      pointers.push_back(s.data());
    pointers.push_back(nullptr);
  }
  int argc() const { return int(strings.size()); }
  char **argv() { return pointers.data(); }

private:
  std::vector<std::string> strings;
  std::vector<char *> pointers;
};

inline rt::CommandLineAction parse(Args args, rt::TrainOptions &options,
                                   std::string &text,
                                   const ModelConfig &config = smallConfig()) {
  return rt::parseTrainCommandLine(args.argc(), args.argv(), config, options,
                                   text);
}

/// Saves a small training checkpoint of `config` at `step` the way the
/// trainer does (model, state, run settings), for resume tests; the state
/// holds the anchor Rng of `ranks` ranks.
inline void writeTrainingCheckpoint(const std::string &dir,
                                    const ModelConfig &config, int64_t step,
                                    const rt::RunSettings *run,
                                    int64_t ranks = 1) {
  std::vector<std::vector<uint16_t>> params = rt::initialParameters(config, 1);
  rt::TrainingState state;
  std::vector<const uint16_t *> pointers;
  for (const auto &p : params) {
    pointers.push_back(p.data());
    state.master.emplace_back(p.size(), 0.5f);
    state.adamM.emplace_back(p.size(), 0.0f);
    state.adamV.emplace_back(p.size(), 0.0f);
  }
  state.step = step;
  state.rngState = rt::Rng(3).state();
  for (int64_t r = 1; r < ranks; ++r)
    state.otherRankRngStates.push_back(rt::Rng(uint64_t(3 + r)).state());
  state.data = {0, 4};
  ASSERT_TRUE(
      rt::saveTrainingCheckpoint(dir, config, pointers, state.ref()).ok());
  if (run) {
    ASSERT_TRUE(
        rt::writeRunSettings(dir + "/" + rt::kRunSettingsFile, *run).ok());
  }
}

} // namespace trainhost

} // namespace dflash::runtimetest

#endif // DFLASH_TEST_UNIT_RUNTIMETESTSUPPORT_H
