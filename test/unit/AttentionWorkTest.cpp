//===- AttentionWorkTest.cpp - Block attention at the drawn anchors -------===//
//
// schema/AttentionWork.h against the compiler's count: anchors spread as
// the count assumes give the count back (through the importer's real graph
// of specs/tiny.toml, a sliding and a full layer), and anchors placed by
// hand give the pairs docs/semantics.md section 1 says a block sees,
// packed rows and unkept blocks included.
//
//===----------------------------------------------------------------------===//

#include "schema/AttentionWork.h"
#include "compiler/Analysis/FlopCount.h"
#include "compiler/Import/ImportSpec.h"
#include "compiler/Spec/Spec.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

using namespace mlir;
using namespace ::dflash;

namespace {

/// One step's anchor inputs, every row one conversation unless packed.
struct Anchors {
  int64_t rows, S, N, bs;
  std::vector<int32_t> anchors, positionIds;
  std::vector<uint8_t> keep;

  Anchors(int64_t rows, int64_t S, int64_t N, int64_t bs)
      : rows(rows), S(S), N(N), bs(bs), anchors(size_t(rows * N), 0),
        positionIds(size_t(rows * S)), keep(size_t(rows * N), 1) {
    for (int64_t r = 0; r < rows; ++r)
      std::iota(positionIds.begin() + r * S, positionIds.begin() + (r + 1) * S,
                0);
  }
  DrawnAnchors drawn() const {
    return {rows, S, N, bs, anchors.data(), keep.data(), positionIds.data()};
  }
};

// The count assumes every block kept and its anchor uniform over [0, S-2]:
// with N = S - 1 anchors, one at each position, the drawn count is the
// count. specs/tiny.toml has a sliding layer (window 32, causal) and a full
// one; its rows are 128 tokens.
TEST(AttentionWork, AnchorsSpreadAsAssumedGiveTheCount) {
  SpecError error;
  std::optional<DrafterSpec> spec =
      loadSpec(std::string(DFLASH_SPECS_DIR) + "/tiny.toml", error);
  ASSERT_TRUE(spec) << error.str();
  spec->anchorsPerRow = spec->seqLen - 1;
  MLIRContext context;
  OwningOpRef<ModuleOp> module = importSpec(context, *spec);
  ASSERT_TRUE(module);
  auto step = module->lookupSymbol<func::FuncOp>("step");
  ASSERT_TRUE(step);
  const int64_t rows = spec->rowsPerStep();
  std::vector<AttentionKindFlops> kinds = attentionByKind(step, rows);
  ASSERT_EQ(kinds.size(), 2u);
  EXPECT_EQ(kinds[0].window, 32);
  EXPECT_TRUE(kinds[0].causal);
  EXPECT_EQ(kinds[1].window, 0);
  EXPECT_FALSE(kinds[1].causal);
  // d 64, 4 query heads: QK^T and PV, 2 d each, one forward per layer.
  EXPECT_DOUBLE_EQ(kinds[0].perPair, 4.0 * 64 * 4);

  Anchors a(rows, spec->seqLen, spec->anchorsPerRow, spec->blockSize);
  for (int64_t r = 0; r < rows; ++r)
    std::iota(a.anchors.begin() + r * a.N, a.anchors.begin() + (r + 1) * a.N,
              0);
  const double flops = double(FlopCount::of(step).step());
  const double drawn = drawnStepFlops(flops, kinds, a.drawn());
  for (const AttentionKindFlops &kind : kinds)
    EXPECT_NEAR(kind.perPair *
                    visiblePairs(a.drawn(), kind.window, kind.causal),
                kind.counted, 1.0)
        << "window " << kind.window;
  EXPECT_NEAR(drawn, flops, 2.0);
}

// By hand: slot k of a kept block sees its anchor's position's worth of
// context keys (at most W - 1 - k in a sliding layer) and its own block's
// first k + 1 slots (causal) or all bs.
TEST(AttentionWork, PairsOfBlocksPlacedByHand) {
  Anchors a(/*rows=*/1, /*S=*/100, /*N=*/3, /*bs=*/4);
  a.anchors = {0, 10, 90};
  a.keep = {1, 1, 0}; // the last slot holds no block
  // Full, bidirectional in the block: (0 + 10) keys for each of 4 slots,
  // and 4 slots of its own block for each.
  EXPECT_DOUBLE_EQ(visiblePairs(a.drawn(), 0, false), 4.0 * 10 + 2 * 4 * 4);
  // Window 6, causal: anchor 10's slot k sees min(10, 5 - k) keys: 5, 4,
  // 3, 2; anchor 0 none; own block 1 + 2 + 3 + 4 each.
  EXPECT_DOUBLE_EQ(visiblePairs(a.drawn(), 6, true), 14.0 + 2 * 10);
  // A window shorter than the block: slots past it see no context.
  EXPECT_DOUBLE_EQ(visiblePairs(a.drawn(), 2, true), 1.0 + 2 * 10);

  // Packed: a second conversation from token 8, so anchor 10 sees 2 keys.
  std::iota(a.positionIds.begin() + 8, a.positionIds.end(), 0);
  EXPECT_DOUBLE_EQ(visiblePairs(a.drawn(), 0, false), 4.0 * 2 + 2 * 4 * 4);

  // Nothing kept: the step's count without its attention.
  a.keep = {0, 0, 0};
  std::vector<AttentionKindFlops> kinds = {{0, false, 1000.0, 3.0},
                                           {6, true, 500.0, 2.0}};
  EXPECT_DOUBLE_EQ(drawnStepFlops(5000.0, kinds, a.drawn()), 3500.0);
  // An anchor out of the row is no block (the loader refuses such rows).
  a.keep = {1, 0, 0};
  a.anchors = {100, 0, 0};
  EXPECT_DOUBLE_EQ(visiblePairs(a.drawn(), 0, false), 0.0);
}

} // namespace
