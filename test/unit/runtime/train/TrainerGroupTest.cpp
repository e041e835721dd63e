//===- TrainerGroupTest.cpp - The group's checks, without a GPU -----------===//
//
// What TrainerGroup::init refuses on the host, before any GPU or
// communicator is touched: a sharded step (ZeRO-1) on another world size
// than it was compiled for, or on more than one node.
//
//===----------------------------------------------------------------------===//

#include "runtime/train/TrainerGroup.h"
#include "runtime/device/Collectives.h"
#include "runtime/device/OptimizerShards.h"
#include "runtime/train/TrainerSetup.h"
#include "test/unit/runtime/RuntimeTestSupport.h"
#include "test/unit/runtime/StepProgramTestSupport.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::trainhost;

namespace {
/// Two processes that never talk: enough for what TrainerGroup::init
/// refuses before its first collective.
class SilentProcessGroup : public ProcessGroup {
public:
  int64_t rank() const override { return 0; }
  int64_t size() const override { return 2; }
  Status broadcast(void *, size_t, int64_t) override {
    return Status::error("unexpected broadcast");
  }
  Status allGather(const void *, size_t, void *) override {
    return Status::error("unexpected all-gather");
  }
  [[noreturn]] void abortAll(int exitCode) override { std::_Exit(exitCode); }
};
} // namespace

TEST(TrainDataParallel, AShardedStepRunsOnItsOwnWorldAndOneNode) {
  // Refused on the host, before any GPU or communicator is touched: these
  // run without a GPU.
  ModelConfig c = smallConfig();
  auto group = [&](int64_t compiledWorld, GroupLayout layout,
                   ProcessGroup *processes) {
    layout.processes = processes;
    TrainerOptions options;
    options.run.worldSize = layout.worldSize();
    options.run.totalSteps = options.finalStep = 4;
    OptimizerShardLayout shards = shardLayout(c, compiledWorld, 2);
    return std::make_unique<TrainerGroup>(
        [c, shards] { return std::make_unique<FakeStepProgram>(c, shards); },
        options, layout);
  };
  GroupLayout one;
  one.gpus = {0};
  TrainerInputs inputs;
  Status s = group(4, one, nullptr)->init(inputs);
  EXPECT_EQ(s.message(),
            "this trainer was compiled to shard the optimizer state over 4 "
            "GPUs ([parallel] gpus_per_node x nodes in its spec) but runs on "
            "1; recompile the spec for 1 GPU or drop shard_optimizer_state");
  GroupLayout three;
  three.gpus = {0, 1, 2};
  s = group(1, three, nullptr)->init(inputs);
  EXPECT_NE(s.message().find("over 1 GPU ([parallel]"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("recompile the spec for 3 GPUs"),
            std::string::npos)
      << s.message();

  SilentProcessGroup processes;
  GroupLayout twoNodes;
  twoNodes.gpus = {0};
  twoNodes.nodes = 2;
  s = group(2, twoNodes, &processes)->init(inputs);
  EXPECT_NE(s.message().find("this trainer shards the optimizer state "
                             "(shard_optimizer_state), which runs on one node "
                             "only"),
            std::string::npos)
      << s.message();
}
