//===- RuntimeSynthOutputTest.cpp - dflash-synth output reads back --------===//
//
// Run by ctest after `dflash-synth SPEC OUT --pin-anchors` (arguments: SPEC
// OUT): every file the tool wrote must load through the runtime readers and
// agree with the in-memory synthetic problem of the same seed.
//
//===----------------------------------------------------------------------===//

#include "compiler/Spec/Spec.h"
#include "runtime/Checkpoint.h"
#include "runtime/FeatureShard.h"
#include "runtime/Synthetic.h"
#include "runtime/TargetWeights.h"
#include "tools/common/SpecToModelConfig.h"

#include <gtest/gtest.h>

using namespace dflash::rt;

namespace {

std::string specPath, outDir;

TEST(RuntimeSynthOutput, ReadsBack) {
  dflash::SpecError error;
  auto spec = dflash::loadSpec(specPath, error);
  ASSERT_TRUE(spec) << error.str();
  ModelConfig config = dflash::modelConfigFromSpec(*spec);
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
  int64_t S = config.seqLen, N = config.anchorsPerRow,
          LH = config.contextWidth();
  for (int64_t r = 0; r < reader.numRows(); ++r) {
    std::vector<int32_t> ids(static_cast<size_t>(S)),
        ids2(static_cast<size_t>(S)), anchors(static_cast<size_t>(N)),
        anchors2(static_cast<size_t>(N));
    std::vector<uint8_t> mask(static_cast<size_t>(S)),
        mask2(static_cast<size_t>(S)), keep(static_cast<size_t>(N)),
        keep2(static_cast<size_t>(N));
    std::vector<uint16_t> hidden(size_t(S * LH)), hidden2(size_t(S * LH));
    ASSERT_TRUE(reader
                    .readRow(r, {ids.data(), mask.data(), hidden.data(),
                                 anchors.data(), keep.data()})
                    .ok());
    ASSERT_TRUE(memory
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
