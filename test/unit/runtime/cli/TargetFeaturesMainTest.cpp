//===- TargetFeaturesMainTest.cpp - target-features, without a GPU --------===//
//
// targetFeaturesMain with fake online targets (their buffers, no kernels):
// bad inputs are refused on the host, before a GPU is looked for.
//
//===----------------------------------------------------------------------===//

#include "runtime/cli/TargetFeaturesMain.h"
#include "runtime/data/Synthetic.h"
#include "runtime/io/Safetensors.h"
#include "schema/StepBuffers.h"
#include "test/unit/runtime/RuntimeTestSupport.h"
#include "test/unit/runtime/StepProgramTestSupport.h"
#include "tools/dflash-synth/SyntheticFiles.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;
using namespace dflash::runtimetest::trainhost;

namespace {

/// An online target program's buffers (createTargetProgram's kind): tokens
/// in, the checkpoint's embedding (and `extraTensor`, when given) frozen,
/// target_hidden out.
std::unique_ptr<StepProgram> fakeTarget(const std::string &extraTensor) {
  const ModelConfig c = smallConfig();
  const int64_t B = c.rowsPerGpu, S = c.seqLen;
  std::vector<BufferSpec> specs = {
      {"input_ids", BufferRole::Input, DType::I32, {B, S}, 0},
      {"position_ids", BufferRole::Input, DType::I32, {B, S}, 5},
      {"model.embed_tokens.weight",
       BufferRole::Frozen,
       DType::BF16,
       {c.vocabSize, c.hiddenSize},
       -1}};
  if (!extraTensor.empty())
    specs.push_back(
        {extraTensor, BufferRole::Frozen, DType::BF16, {c.hiddenSize}, -1});
  specs.push_back({"target_hidden",
                   BufferRole::Input,
                   DType::BF16,
                   {B, S, c.contextWidth()},
                   2});
  return std::make_unique<FakeProgram>(c, std::move(specs));
}

std::unique_ptr<StepProgram> fakeTargetFactory() { return fakeTarget(""); }
std::unique_ptr<StepProgram> fakeTargetNeedingMore() {
  return fakeTarget("model.norm.weight");
}
std::unique_ptr<StepProgram> noTarget() { return nullptr; }

/// Runs targetFeaturesMain, capturing stderr.
int runTargetFeatures(Args args, std::unique_ptr<StepProgram> (*factory)(),
                      std::string &err) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  int code = targetFeaturesMain(args.argc(), args.argv(), factory);
  (void)testing::internal::GetCapturedStdout();
  err = testing::internal::GetCapturedStderr();
  return code;
}

} // namespace

// target-features refuses bad inputs on the host, naming the file, tensor,
// row and token, before it looks for a GPU.
TEST(TargetFeaturesMain, BadInputsAreRefusedBeforeTheGpu) {
  TrainMainTempDir dir;
  ModelConfig c = smallConfig();
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(c, 7).ok());
  ASSERT_TRUE(writeSyntheticTarget(dir.path + "/target", problem).ok());
  auto writeRows = [&](const std::string &path, int64_t S, int32_t badId) {
    std::vector<int32_t> ids(size_t(3 * S), 1);
    ids[size_t(S + 4)] = badId; // row 1, token 4
    return writeSafetensors(path,
                            {{"input_ids", DType::I32, {3, S}, ids.data()}});
  };
  ASSERT_TRUE(writeRows(dir.path + "/bad-id.safetensors", c.seqLen,
                        int32_t(c.vocabSize))
                  .ok());
  ASSERT_TRUE(writeRows(dir.path + "/short.safetensors", c.seqLen - 1, 1).ok());
  const Args good = {"--target", dir.path + "/target",
                     "--rows",   dir.path + "/bad-id.safetensors",
                     "-o",       dir.path + "/out.safetensors"};
  std::string err;

  EXPECT_EQ(runTargetFeatures(good, &noTarget, err), 1);
  EXPECT_NE(err.find("compiled without an online target"), std::string::npos)
      << err;
  EXPECT_NE(runTargetFeatures({"--target", dir.path + "/target"},
                              &fakeTargetFactory, err),
            0);
  EXPECT_NE(err.find("--target, --rows and -o are needed"), std::string::npos)
      << err;
  EXPECT_EQ(runTargetFeatures(good, &fakeTargetFactory, err), 1);
  EXPECT_NE(err.find(dir.path + "/bad-id.safetensors: input_ids holds " +
                     std::to_string(c.vocabSize) +
                     " at row 1, token 4, outside the vocabulary"),
            std::string::npos)
      << err;
  EXPECT_EQ(runTargetFeatures({"--target", dir.path + "/target", "--rows",
                               dir.path + "/short.safetensors", "-o",
                               dir.path + "/out.safetensors"},
                              &fakeTargetFactory, err),
            1);
  EXPECT_NE(err.find("tensor 'input_ids' must be I32 [rows, " +
                     std::to_string(c.seqLen) + "]"),
            std::string::npos)
      << err;
  EXPECT_EQ(runTargetFeatures(good, &fakeTargetNeedingMore, err), 1);
  EXPECT_NE(err.find("model.norm.weight"), std::string::npos) << err;
  // --experts needs sparse layers, and rows (not --bench).
  ASSERT_TRUE(writeRows(dir.path + "/good.safetensors", c.seqLen, 1).ok());
  EXPECT_EQ(runTargetFeatures({"--target", dir.path + "/target", "--rows",
                               dir.path + "/good.safetensors", "-o",
                               dir.path + "/out.safetensors", "--experts",
                               dir.path + "/experts.safetensors"},
                              &fakeTargetFactory, err),
            1);
  EXPECT_NE(err.find("--experts: the target program has no sparse layers"),
            std::string::npos)
      << err;
  EXPECT_NE(runTargetFeatures({"--bench", "3", "--experts",
                               dir.path + "/experts.safetensors"},
                              &fakeTargetFactory, err),
            0);
  EXPECT_NE(err.find("--bench has none"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/out.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/experts.safetensors"));
}
