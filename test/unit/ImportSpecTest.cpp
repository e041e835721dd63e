//===- ImportSpecTest.cpp - What the importer takes from a spec -----------===//
//
// The in-block causality of each layer's dflash.block_attention
// (docs/semantics.md section 3: a sliding layer of a DFlash drafter is
// causal inside its block, a full one bidirectional), and a DFlash2
// drafter's graph (section 13): every layer bidirectional, its ops, and its
// unary transform on the cross-entropy.
//
//===----------------------------------------------------------------------===//

#include "compiler/Import/ImportSpec.h"
#include "compiler/Spec/Spec.h"
#include "dialect/DFlashOps.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace mlir;
using namespace mlir::dflash;
using namespace ::dflash;

namespace {

std::optional<DrafterSpec> load(const char *name) {
  SpecError error;
  auto spec =
      loadSpec(std::string(DFLASH_SPECS_DIR) + "/" + name + ".toml", error);
  EXPECT_TRUE(spec) << error.str();
  return spec;
}

TEST(ImportSpec, SlidingLayersOfADFlashDrafterAreCausalInTheirBlock) {
  std::optional<DrafterSpec> spec = load("tiny"); // sliding, full
  ASSERT_TRUE(spec);
  MLIRContext context;
  OwningOpRef<ModuleOp> module = importSpec(context, *spec);
  ASSERT_TRUE(module);
  std::vector<BlockAttentionOp> layers;
  module->walk([&](BlockAttentionOp op) { layers.push_back(op); });
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_TRUE(layers[0].getCausal());
  EXPECT_EQ(layers[0].getWindow(), std::optional<uint64_t>(32));
  EXPECT_FALSE(layers[1].getCausal());
  EXPECT_FALSE(layers[1].getWindow());
}

// docs/semantics.md section 13: two convolutions a sublayer, every layer
// bidirectional in its block, the selector's ops and its loss.
TEST(ImportSpec, DFlash2Drafter) {
  std::optional<DrafterSpec> spec = load("tiny-dflash2"); // sliding, full
  ASSERT_TRUE(spec);
  MLIRContext context;
  OwningOpRef<ModuleOp> module = importSpec(context, *spec);
  ASSERT_TRUE(module);
  int convs[2] = {0, 0}, selectors = 0, objectives = 0;
  module->walk([&](GroupedConvOp op) { ++convs[op.getHalf()]; });
  module->walk([&](SelectorLossOp) { ++selectors; });
  module->walk([&](SelectorObjectiveOp) { ++objectives; });
  EXPECT_EQ(convs[0], 2 * spec->numLayers);
  EXPECT_EQ(convs[1], 2 * spec->numLayers);
  EXPECT_EQ(selectors, 1);
  EXPECT_EQ(objectives, 1);
  std::vector<BlockAttentionOp> layers;
  module->walk([&](BlockAttentionOp op) { layers.push_back(op); });
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_FALSE(layers[0].getCausal());
  EXPECT_EQ(layers[0].getWindow(), std::optional<uint64_t>(32));
  EXPECT_FALSE(layers[1].getCausal());
}

// CE_u and the selector's candidates take the spec's unary transform (the
// same one, so that dflash-fuse-kernels can fold them); a v1 drafter's
// cross-entropy has none whatever the fields say.
TEST(ImportSpec, DFlash2UnaryTransformReachesTheCrossEntropy) {
  for (const char *name : {"tiny-dflash2", "tiny"}) {
    std::optional<DrafterSpec> spec = load(name);
    ASSERT_TRUE(spec);
    const bool dflash2 = spec->dflash2;
    spec->outputMultiplier = 1.5;
    spec->finalLogitSoftcapping = 30;
    MLIRContext context;
    OwningOpRef<ModuleOp> module = importSpec(context, *spec);
    ASSERT_TRUE(module) << name;
    std::vector<LmHeadCeOp> losses;
    module->walk([&](LmHeadCeOp op) { losses.push_back(op); });
    ASSERT_EQ(losses.size(), 1u) << name;
    EXPECT_EQ(losses[0].getMultiplier().convertToDouble(), dflash2 ? 1.5 : 1.0)
        << name;
    EXPECT_EQ(losses[0].getSoftcap().convertToDouble(), dflash2 ? 30.0 : 0.0)
        << name;
    module->walk([&](SelectorCandidatesOp op) {
      EXPECT_EQ(op.getMultiplier(), losses[0].getMultiplier());
      EXPECT_EQ(op.getSoftcap(), losses[0].getSoftcap());
    });
  }
}

} // namespace
