//===- TrainMainTest.cpp - train from its command line, without a GPU -----===//
//
// trainMain with a fake StepProgram (a config and buffers, no kernels):
// usage errors and help, a live run's output directory refused, a
// multi-node launch without MPI, a broken checkpoint that stops the run
// before anything is written, and the missing device reported after the
// host checks (those tests are skipped where a device exists).
//
//===----------------------------------------------------------------------===//

#include "runtime/cli/TrainMain.h"
#include "runtime/device/DeviceContext.h"
#include "runtime/io/Checkpoint.h"
#include "runtime/train/RunLayout.h"
#include "runtime/train/TrainerSetup.h"
#include "test/unit/runtime/RuntimeTestSupport.h"
#include "test/unit/runtime/StepProgramTestSupport.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::trainhost;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<StepProgram> fakeFactory() {
  return std::make_unique<FakeStepProgram>(smallConfig());
}

/// Runs trainMain, capturing stdout and stderr.
int runTrainMain(Args args, std::string &out, std::string &err) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  int code = trainMain(args.argc(), args.argv(), &fakeFactory);
  out = testing::internal::GetCapturedStdout();
  err = testing::internal::GetCapturedStderr();
  return code;
}

} // namespace

//===----------------------------------------------------------------------===//
// trainMain
//===----------------------------------------------------------------------===//

TEST(TrainMain, UnknownOptionFails) {
  std::string out, err;
  EXPECT_EQ(runTrainMain({"--data", "synthetic", "--bogus"}, out, err), 1);
  EXPECT_EQ(err.rfind("train: error: ", 0), 0u) << err;
  EXPECT_NE(err.find("--bogus"), std::string::npos) << err;
}

TEST(TrainMain, HelpGoesToStdout) {
  std::string out, err;
  EXPECT_EQ(runTrainMain({"--help"}, out, err), 0);
  EXPECT_NE(out.find("--total-steps"), std::string::npos) << out;
  EXPECT_EQ(err, "");
}

TEST(TrainMain, MissingTargetDirectory) {
  TrainMainTempDir dir;
  std::string out, err;
  EXPECT_EQ(runTrainMain({"--data", "synthetic", "--target", dir.path + "/nope",
                          "--out", dir.path},
                         out, err),
            1);
  EXPECT_EQ(err, "train: error: --target " + dir.path +
                     "/nope: no such directory\n");
}

TEST(TrainMain, NoDeviceIsReportedAfterTheHostChecksOfSeveralGpus) {
  std::string reason;
  if (visibleCudaDevices(reason) > 0)
    GTEST_SKIP() << "a CUDA device is visible";
  if (!collectivesAvailable())
    GTEST_SKIP() << "built without NCCL: one GPU only";
  TrainMainTempDir dir;
  std::string out, err;
  EXPECT_EQ(runTrainMain({"--data", "synthetic", "--steps", "3", "--gpus",
                          "0,1", "--out", dir.path},
                         out, err),
            1);
  EXPECT_EQ(err.rfind("train: error: no CUDA device is visible", 0), 0u) << err;
  // The host checks of a data-parallel run come first.
  EXPECT_EQ(runTrainMain({"--data", "synthetic", "--steps", "3", "--rows", "3",
                          "--gpus", "0,1", "--out", dir.path + "/few"},
                         out, err),
            1);
  EXPECT_NE(err.find("one step needs 4 (2 rows per GPU x 2 GPUs)"),
            std::string::npos)
      << err;
}

// Two trainers on one output directory: the second is refused before it
// writes anything, naming the first, whose files stay as they are; once the
// first is gone (killed: no clean-up runs), the directory is free again.
TEST(TrainMain, ASecondRunIntoALiveRunsDirectoryIsRefused) {
  TrainMainTempDir dir;
  const std::string metrics = dir.path + "/metrics.jsonl";
  {
    std::ofstream(metrics) << "{\"step\": 0}\n{\"step\": 1}\n";
  }
  pid_t first = holdDirectoryLockInChild(dir.path);
  ASSERT_GT(first, 0);
  std::string out, err;
  int code = runTrainMain(
      {"--data", "synthetic", "--steps", "3", "--out", dir.path}, out, err);
  EXPECT_EQ(code, 1);
  EXPECT_EQ(err.rfind("train: error: output directory '" + dir.path +
                          "' is in use by another train run (process " +
                          std::to_string(first) + " on ",
                      0),
            0u)
      << err;
  EXPECT_EQ(readFile(metrics), "{\"step\": 0}\n{\"step\": 1}\n");
  killAndReap(first);
  code = runTrainMain(
      {"--data", "synthetic", "--steps", "3", "--out", dir.path}, out, err);
  // Past the lock now: without a GPU it stops at the device check.
  std::string reason;
  if (visibleCudaDevices(reason) == 0) {
    EXPECT_EQ(code, 1);
    EXPECT_EQ(err.find("is in use by another train run"), std::string::npos)
        << err;
  }
}

TEST(TrainMain, MultiNodeLaunchWithoutMpiIsRefused) {
  if (multiNodeAvailable())
    GTEST_SKIP() << "built with MPI (the error applies to builds without)";
  const char *previous = std::getenv("OMPI_COMM_WORLD_SIZE");
  std::string saved = previous ? previous : "";
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  TrainMainTempDir dir;
  std::string out, err;
  int code = runTrainMain({"--data", "synthetic", "--out", dir.path + "/out"},
                          out, err);
  if (previous)
    ::setenv("OMPI_COMM_WORLD_SIZE", saved.c_str(), 1);
  else
    ::unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(code, 1);
  EXPECT_EQ(err, "train: error: this trainer was built without MPI; "
                 "multi-node runs need it (install libopenmpi-dev and "
                 "rebuild)\n");
  // Refused before anything was written.
  EXPECT_FALSE(fs::exists(dir.path + "/out"));
}

TEST(TrainMain, NoDeviceIsReportedAfterTheHostChecks) {
  std::string reason;
  if (visibleCudaDevices(reason) > 0)
    GTEST_SKIP() << "a CUDA device is visible";
  TrainMainTempDir dir;
  std::string out, err;
  EXPECT_EQ(
      runTrainMain({"--data", "synthetic", "--steps", "3", "--out", dir.path},
                   out, err),
      1);
  EXPECT_EQ(err.rfind("train: error: no CUDA device is visible", 0), 0u) << err;
}

//===----------------------------------------------------------------------===//
// Host-side preparation, through trainMain
//===----------------------------------------------------------------------===//

TEST(TrainPrepare, CorruptCheckpointIsAClearError) {
  TrainMainTempDir dir;
  ModelConfig c = smallConfig();
  RunSettings stored;
  stored.totalSteps = 40;
  stored.data = "synthetic";
  stored.syntheticRows = 12;
  std::string ckpt = dir.path + "/checkpoint-10";
  writeTrainingCheckpoint(ckpt, c, 10, &stored);
  std::string state = ckpt + "/" + kTrainingStateFile;
  fs::resize_file(state, fs::file_size(state) / 2);
  std::string before = readFile(state);

  std::string out, err;
  int code = runTrainMain({"--data", "synthetic", "--steps", "20", "--resume",
                           ckpt, "--out", dir.path},
                          out, err);
  EXPECT_EQ(code, 1);
  EXPECT_EQ(err.rfind("train: error: " + state, 0), 0u) << err;
  // Nothing was written over the broken checkpoint.
  EXPECT_EQ(readFile(state), before);
  EXPECT_FALSE(fs::exists(dir.path + "/metrics.jsonl"));
}
