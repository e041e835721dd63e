//===- SynthOutputTest.cpp - dflash-synth output reads back ---------------===//
//
// Run by ctest after `dflash-synth SPEC OUT --pin-anchors` (arguments: SPEC
// OUT): every file the tool wrote must load through the runtime readers and
// agree with the in-memory synthetic problem of the same seed.
//
//===----------------------------------------------------------------------===//

#include "compiler/Spec/Spec.h"
#include "runtime/data/FeatureShard.h"
#include "runtime/data/InitialParameters.h"
#include "runtime/data/Synthetic.h"
#include "runtime/io/Checkpoint.h"
#include "runtime/io/TargetWeights.h"
#include "test/unit/runtime/RuntimeTestSupport.h"

#include <gtest/gtest.h>

using namespace dflash;
using namespace dflash::rt;
using namespace dflash::runtimetest;

namespace {

std::string specPath, outDir;

TEST(RuntimeSynthOutput, ReadsBack) {
  dflash::SpecError error;
  auto spec = dflash::loadSpec(specPath, error);
  ASSERT_TRUE(spec) << error.str();
  ModelConfig config = *spec;
  SyntheticProblem problem;
  ASSERT_TRUE(problem.init(config, uint64_t(config.seed)).ok());

  TargetWeights target;
  Status status = loadTargetWeights(outDir + "/target", config, target);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(target.embed, problem.target().embed);
  EXPECT_EQ(target.lmHead, problem.target().lmHead);

  std::vector<std::vector<uint16_t>> params;
  status = loadCheckpoint(outDir + "/init", config, params);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(params, problem.initialParameters());

  FeatureShardReader reader;
  status = reader.open(outDir + "/data", config);
  ASSERT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(reader.numRows(), 10);
  EXPECT_TRUE(reader.hasPinnedAnchors());
  SyntheticRowSource memory(problem, 10, true);
  expectSameRows(reader, memory, reader.numRows(), config);
}

} // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: RuntimeSynthOutputTest SPEC OUT\n");
    return 1;
  }
  specPath = argv[1];
  outDir = argv[2];
  return RUN_ALL_TESTS();
}
