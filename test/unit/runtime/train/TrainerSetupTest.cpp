//===- TrainerSetupTest.cpp - The group's layout --------------------------===//
//
// GroupLayout: global ranks node by node, the world size, and when the
// group needs collectives.
//
//===----------------------------------------------------------------------===//

#include "runtime/train/TrainerSetup.h"

#include <gtest/gtest.h>

using namespace dflash;
using namespace dflash::rt;

TEST(TrainDataParallel, RanksAreNumberedNodeByNode) {
  GroupLayout layout;
  layout.gpus = {4, 5, 6, 7};
  layout.node = 2;
  layout.nodes = 3;
  EXPECT_EQ(layout.worldSize(), 12);
  EXPECT_EQ(layout.firstRank(), 8);
  EXPECT_TRUE(layout.usesCollectives());
  GroupLayout one;
  EXPECT_EQ(one.worldSize(), 1);
  EXPECT_EQ(one.firstRank(), 0);
  EXPECT_FALSE(one.usesCollectives());
  one.forceCollectives = true;
  EXPECT_TRUE(one.usesCollectives());
}
