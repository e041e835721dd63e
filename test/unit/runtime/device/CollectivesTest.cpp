//===- CollectivesTest.cpp - Collectives and launch, without a GPU --------===//
//
// What runtime/Collectives decides on the host: the launcher's process
// count, the missing-MPI error of a multi-process launch, the NVLink
// multicast default, and rank checks made before NCCL is called. The NCCL
// and MPI calls themselves need GPUs and a launcher: they are covered by
// test/gpu/runtime/device/CollectivesGpuTest.cpp and docs/runtime.md.
//
//===----------------------------------------------------------------------===//

#include "runtime/device/Collectives.h"
#include "runtime/train/TrainerSetup.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

using namespace dflash;
using namespace dflash::rt;

namespace {

/// Sets an environment variable for the lifetime of the object and puts
/// back what was there.
class ScopedEnv {
public:
  ScopedEnv(const char *name, const char *value) : name(name) {
    if (const char *old = std::getenv(name))
      previous = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (previous)
      ::setenv(name.c_str(), previous->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }

private:
  std::string name;
  std::optional<std::string> previous;
};

} // namespace

TEST(RuntimeCollectives, LauncherProcessCount) {
  std::map<std::string, std::string> env;
  auto lookup = [&](const char *name) -> const char * {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  EXPECT_EQ(launcherProcessCount(lookup), 1);
  env["OMPI_COMM_WORLD_SIZE"] = "4";
  EXPECT_EQ(launcherProcessCount(lookup), 4);
  env.clear();
  env["PMI_SIZE"] = "2";
  EXPECT_EQ(launcherProcessCount(lookup), 2);
  // Open MPI's own variable wins over the generic one.
  env["OMPI_COMM_WORLD_SIZE"] = "3";
  EXPECT_EQ(launcherProcessCount(lookup), 3);
  env.clear();
  env["OMPI_COMM_WORLD_SIZE"] = "many";
  EXPECT_EQ(launcherProcessCount(lookup), 1);
  env["OMPI_COMM_WORLD_SIZE"] = "0";
  EXPECT_EQ(launcherProcessCount(lookup), 1);
}

TEST(RuntimeCollectives, OneProcessJoinsNoGroup) {
  ScopedEnv ompi("OMPI_COMM_WORLD_SIZE", nullptr);
  ScopedEnv pmi("PMI_SIZE", "1");
  std::unique_ptr<ProcessGroup> group;
  Status s = joinProcessGroup(group);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(group, nullptr);
}

TEST(RuntimeCollectives, SeveralProcessesNeedMpi) {
  if (multiNodeAvailable())
    GTEST_SKIP() << "built with MPI (the error applies to builds without)";
  ScopedEnv ompi("OMPI_COMM_WORLD_SIZE", "2");
  std::unique_ptr<ProcessGroup> group;
  Status s = joinProcessGroup(group);
  EXPECT_EQ(s.message(), "this trainer was built without MPI; multi-node runs "
                         "need it (install libopenmpi-dev and rebuild)");
}

TEST(RuntimeCollectives, NvlinkMulticastIsOffUnlessTheUserSetIt) {
  {
    ScopedEnv unset("NCCL_NVLS_ENABLE", nullptr);
    disableNvlinkMulticastByDefault();
    ASSERT_NE(std::getenv("NCCL_NVLS_ENABLE"), nullptr);
    EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
  }
  ScopedEnv given("NCCL_NVLS_ENABLE", "1");
  disableNvlinkMulticastByDefault();
  EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "1");
}

TEST(RuntimeCollectives, RanksMustFitTheWorld) {
  CollectiveId id;
  std::vector<std::unique_ptr<Collectives>> created;
  Status s = Collectives::create({{0, 1}, 1, 2}, id, created);
  EXPECT_EQ(s.message(), "ranks 1..2 do not fit a world of 2");
  EXPECT_TRUE(created.empty());
  s = Collectives::create({{}, 0, 1}, id, created);
  EXPECT_FALSE(s.ok());
}
