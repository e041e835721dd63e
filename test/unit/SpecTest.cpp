//===- SpecTest.cpp - Spec parsing, defaults and errors -------------------===//

#include "compiler/Spec/Spec.h"
#include "schema/Parameters.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

using namespace dflash;

namespace {

// A small valid spec, one key per line, so that each error case can replace
// one line and expect the error on it.
const char *kBase = R"(name = "t"
[target]
num_layers = 8
hidden_size = 64
vocab_size = 1000
[drafter]
num_layers = 2
intermediate_size = 128
num_heads = 4
num_kv_heads = 2
head_dim = 16
block_size = 4
mask_token_id = 999
[attention]
layers = ["sliding", "full"]
sliding_window = 8
[training]
seq_len = 64
anchors_per_row = 8
gamma = 0
rows_per_gpu = 2
)";

std::string replaced(const std::string &from, const std::string &to) {
  std::string text = kBase;
  size_t pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << "base spec lacks '" << from << "'";
  if (pos != std::string::npos)
    text.replace(pos, from.size(), to);
  return text;
}

uint32_t lineOf(const std::string &text, const std::string &needle) {
  size_t pos = text.find(needle);
  if (pos == std::string::npos)
    return 0;
  return uint32_t(std::count(text.begin(), text.begin() + pos, '\n') + 1);
}

TEST(Spec, BaseIsValid) {
  SpecError error;
  auto spec = parseSpec(kBase, "base.toml", error);
  ASSERT_TRUE(spec) << error.str();
  EXPECT_EQ(spec->targetLayerIds, (std::vector<int64_t>{1, 5}));
  EXPECT_TRUE(spec->targetLayerIdsDefaulted);
  EXPECT_EQ(spec->hiddenSize, 64);
  EXPECT_EQ(spec->layerWindows, (std::vector<int64_t>{8, 0})); // sliding, full
  EXPECT_EQ(spec->gamma, 0.0); // given: block size 4 has no default decay
  EXPECT_FALSE(spec->gammaDefaulted);
  EXPECT_TRUE(spec->warnings.empty());
  EXPECT_EQ(spec->draftLength(), 32);
}

TEST(Spec, DefaultTapsFollowSpreadRule) {
  EXPECT_EQ(defaultTargetLayerIds(36, 5),
            (std::vector<int64_t>{1, 9, 17, 25, 33}));
  EXPECT_EQ(defaultTargetLayerIds(32, 5),
            (std::vector<int64_t>{1, 8, 15, 22, 29}));
  EXPECT_EQ(defaultTargetLayerIds(64, 5),
            (std::vector<int64_t>{1, 16, 31, 46, 61}));
  EXPECT_EQ(defaultTargetLayerIds(48, 8),
            (std::vector<int64_t>{1, 7, 14, 20, 26, 32, 39, 45}));
  // 1 + i * 6/4 = 1, 2.5, 4, 5.5, 7: halves go to the even neighbour.
  EXPECT_EQ(defaultTargetLayerIds(10, 5),
            (std::vector<int64_t>{1, 2, 4, 6, 7}));
  EXPECT_EQ(defaultTargetLayerIds(36, 1), (std::vector<int64_t>{18}));
}

TEST(Spec, DefaultGammaByBlockSize) {
  EXPECT_EQ(defaultGamma(16), 7.0);
  EXPECT_EQ(defaultGamma(10), 5.0);
  EXPECT_EQ(defaultGamma(8), 4.0);
  EXPECT_EQ(defaultGamma(4), std::nullopt);
}

// A sliding window past the sequence is valid, with a warning at the window.
TEST(Spec, WindowLongerThanSequenceWarns) {
  SpecError error;
  std::string text = replaced("sliding_window = 8", "sliding_window = 100");
  auto spec = parseSpec(text, "base.toml", error);
  ASSERT_TRUE(spec) << error.str();
  ASSERT_EQ(spec->warnings.size(), 1u);
  EXPECT_EQ(spec->warnings[0].loc.line, lineOf(text, "sliding_window"));
  EXPECT_EQ(spec->warnings[0].str().rfind(
                "base.toml:" + std::to_string(lineOf(text, "sliding_window")) +
                    ":18: warning: "
                    "'attention.sliding_window' "
                    "(100) is longer than "
                    "'training.seq_len' (64)",
                0),
            0u)
      << spec->warnings[0].str();
  // As long as the sequence: no warning.
  spec = parseSpec(replaced("sliding_window = 8", "sliding_window = 64"),
                   "base.toml", error);
  ASSERT_TRUE(spec) << error.str();
  EXPECT_TRUE(spec->warnings.empty());
}

TEST(Spec, ShippedSpecsParseAndMatchSemantics) {
  struct Expect {
    const char *file;
    int64_t layers, H, I, nh, nkv, d, bs, V;
    std::vector<int64_t> taps;
    int slidingLayers;
    double gamma;
    int64_t mask;
    double theta;
  };
  const Expect expected[] = {
      {"qwen3-8b-b16",
       5,
       4096,
       12288,
       32,
       8,
       128,
       16,
       151936,
       {1, 9, 17, 25, 33},
       0,
       7,
       151669,
       1e6},
      {"qwen3-4b-b16",
       5,
       2560,
       9728,
       32,
       8,
       128,
       16,
       151936,
       {1, 9, 17, 25, 33},
       0,
       7,
       151669,
       1e6},
      {"llama3.1-8b-b10",
       5,
       4096,
       12288,
       32,
       8,
       128,
       10,
       128256,
       {1, 8, 15, 22, 29},
       0,
       5,
       128002,
       5e5},
      {"gpt-oss-20b-b8",
       8,
       2880,
       7680,
       64,
       8,
       64,
       8,
       201088,
       {1, 6, 11, 16, 21},
       0,
       4,
       200017,
       1.5e5},
      {"qwen3-coder-30b-a3b-b16",
       8,
       2048,
       6144,
       32,
       4,
       128,
       16,
       151936,
       {1, 7, 14, 20, 26, 32, 39, 45},
       0,
       7,
       151669,
       1e7},
      {"qwen3.6-27b-b16",
       5,
       5120,
       17408,
       32,
       8,
       128,
       16,
       248320,
       {1, 16, 31, 46, 61},
       4,
       7,
       248070,
       1e7},
  };
  for (const Expect &e : expected) {
    SCOPED_TRACE(e.file);
    SpecError error;
    auto spec =
        loadSpec(std::string(DFLASH_SPECS_DIR) + "/" + e.file + ".toml", error);
    ASSERT_TRUE(spec) << error.str();
    EXPECT_EQ(spec->name, e.file);
    EXPECT_EQ(spec->numLayers, e.layers);
    EXPECT_EQ(spec->hiddenSize, e.H);
    EXPECT_EQ(spec->intermediateSize, e.I);
    EXPECT_EQ(spec->numHeads, e.nh);
    EXPECT_EQ(spec->numKvHeads, e.nkv);
    EXPECT_EQ(spec->headDim, e.d);
    EXPECT_EQ(spec->blockSize, e.bs);
    EXPECT_EQ(spec->vocabSize, e.V);
    EXPECT_EQ(spec->targetLayerIds, e.taps);
    EXPECT_EQ(spec->gamma, e.gamma);
    // docs/semantics.md section 7: the Qwen3 vocabularies' mask token, the
    // Qwen3.5/3.6 one's (248320 rows) 248070.
    EXPECT_EQ(spec->maskTokenId, e.mask);
    EXPECT_EQ(spec->ropeTheta, e.theta);
    EXPECT_EQ(spec->seqLen, 3072);
    EXPECT_EQ(spec->anchorsPerRow, 512);
    EXPECT_EQ(spec->rowsPerGpu, 4);
    int sliding = 0;
    for (int64_t window : spec->layerWindows)
      if (window > 0) {
        ++sliding;
        EXPECT_EQ(window, 2048);
      }
    EXPECT_EQ(sliding, e.slidingLayers);
  }
}

// The canonical form with comments removed: they say which values were
// defaulted, which a reparse cannot know.
std::string withoutComments(const std::string &text) {
  std::string out, line;
  std::istringstream in(text);
  while (std::getline(in, line)) {
    size_t hash = line.find('#');
    if (hash != std::string::npos)
      line = line.substr(0, hash);
    while (!line.empty() && line.back() == ' ')
      line.pop_back();
    if (!line.empty())
      out += line + "\n";
  }
  return out;
}

TEST(Spec, CanonicalFormRoundTrips) {
  for (const char *name :
       {"tiny", "qwen3-8b-b16", "qwen3.6-27b-b16", "qwen3-coder-30b-a3b-b16",
        "tiny-dflash2", "qwen3.8-27b-dflash2-b8"}) {
    SCOPED_TRACE(name);
    SpecError error;
    auto spec =
        loadSpec(std::string(DFLASH_SPECS_DIR) + "/" + name + ".toml", error);
    ASSERT_TRUE(spec) << error.str();
    std::string canonical = printCanonicalSpec(*spec);
    auto again = parseSpec(canonical, "canonical.toml", error);
    ASSERT_TRUE(again) << error.str() << "\n" << canonical;
    EXPECT_EQ(withoutComments(printCanonicalSpec(*again)),
              withoutComments(canonical));
    EXPECT_EQ(again->targetLayerIds, spec->targetLayerIds);
    EXPECT_EQ(again->gamma, spec->gamma);
    EXPECT_EQ(again->rmsNormEps, spec->rmsNormEps);
    EXPECT_EQ(again->ropeTheta, spec->ropeTheta);
    EXPECT_EQ(again->layerWindows, spec->layerWindows);
  }
}

// [training] position_buckets (docs/semantics.md section 14): 4K, 16K,
// 64K, ... below seq_len by default; given edges at or past seq_len are
// dropped (no anchor reaches them); the canonical form keeps what was
// resolved.
TEST(Spec, PositionBuckets) {
  SpecError error;
  auto plain = parseSpec(kBase, "base.toml", error);
  ASSERT_TRUE(plain) << error.str();
  EXPECT_TRUE(plain->positionBuckets.empty()); // seq_len 64: one bucket
  EXPECT_EQ(printCanonicalSpec(*plain).find("position_buckets"),
            std::string::npos);

  std::string longRows =
      replaced("mask_token_id = 999",
               "mask_token_id = 999\nmax_position_embeddings = 262144");
  longRows.replace(longRows.find("seq_len = 64"), 12, "seq_len = 131072");
  auto longSpec = parseSpec(longRows, "long.toml", error);
  ASSERT_TRUE(longSpec) << error.str();
  EXPECT_EQ(longSpec->positionBuckets,
            (std::vector<int64_t>{4096, 16384, 65536}));
  EXPECT_EQ(longSpec->numPositionBuckets(), 4);
  std::string canonical = printCanonicalSpec(*longSpec);
  EXPECT_NE(canonical.find("position_buckets = [4096, 16384, 65536]  # "
                           "default for this seq_len"),
            std::string::npos)
      << canonical;
  auto again = parseSpec(canonical, "canonical.toml", error);
  ASSERT_TRUE(again) << error.str();
  EXPECT_EQ(again->positionBuckets, longSpec->positionBuckets);

  auto given = parseSpec(replaced("rows_per_gpu = 2",
                                  "rows_per_gpu = 2\nposition_buckets = "
                                  "[16, 32, 64, 100]"),
                         "given.toml", error);
  ASSERT_TRUE(given) << error.str();
  EXPECT_EQ(given->positionBuckets, (std::vector<int64_t>{16, 32}));
  canonical = printCanonicalSpec(*given);
  EXPECT_NE(canonical.find("position_buckets = [16, 32]\n"), std::string::npos)
      << canonical;
  again = parseSpec(canonical, "canonical.toml", error);
  ASSERT_TRUE(again) << error.str();
  EXPECT_EQ(again->positionBuckets, given->positionBuckets);

  // An empty list: one bucket even where the default has several.
  auto none = parseSpec(
      replaced("rows_per_gpu = 2", "rows_per_gpu = 2\nposition_buckets = []"),
      "none.toml", error);
  ASSERT_TRUE(none) << error.str();
  EXPECT_TRUE(none->positionBuckets.empty());
  EXPECT_NE(printCanonicalSpec(*none).find("position_buckets = []\n"),
            std::string::npos);
}

// [drafter.dflash2] (docs/semantics.md section 13): an empty table makes a
// DFlash2 drafter with the published drafters' shapes; [training.dflash2]
// defaults to SpecForge's objective. Without the table nothing changes.
TEST(Spec, DFlash2Defaults) {
  SpecError error;
  auto plain = parseSpec(kBase, "base.toml", error);
  ASSERT_TRUE(plain) << error.str();
  EXPECT_FALSE(plain->dflash2);
  EXPECT_TRUE(plain->blockCausal(0)); // the sliding layer, causal in-block
  EXPECT_EQ(printCanonicalSpec(*plain).find("dflash2"), std::string::npos);

  auto spec =
      parseSpec(std::string(kBase) + "[drafter.dflash2]\n", "d2.toml", error);
  ASSERT_TRUE(spec) << error.str();
  EXPECT_TRUE(spec->dflash2);
  EXPECT_EQ(spec->convKernelSize, 2);
  EXPECT_EQ(spec->convGroupSize, 16);
  EXPECT_EQ(spec->convGroups(), 4); // 64 / 16
  EXPECT_EQ(spec->selectorRank, 256);
  EXPECT_EQ(spec->selectorTopK, 16);
  EXPECT_EQ(spec->outputMultiplier, 1.0);
  EXPECT_EQ(spec->finalLogitSoftcapping, 0.0); // none
  EXPECT_EQ(spec->inputEmbeddingScale, 1.0);
  EXPECT_EQ(spec->selectorAlpha, 1.0);
  EXPECT_EQ(spec->selectorWarmupRatio, 0.0);
  EXPECT_EQ(spec->selectorRampRatio, 0.0);
  EXPECT_FALSE(spec->selectorStopGradient);
  EXPECT_FALSE(spec->selectorGoldInject);
  EXPECT_FALSE(spec->selectorDenominatorCovered);
  // The sliding layer keeps its window but sees its whole block.
  EXPECT_EQ(spec->layerWindows, (std::vector<int64_t>{8, 0}));
  EXPECT_FALSE(spec->blockCausal(0));
  EXPECT_FALSE(spec->blockCausal(1));
  EXPECT_TRUE(spec->warnings.empty());

  // Every key given, the canonical form keeps each.
  auto given = parseSpec(std::string(kBase) +
                             "[drafter.dflash2]\nconv_kernel_size = 3\n"
                             "conv_group_size = 8\nselector_rank = 32\n"
                             "selector_top_k = 64\noutput_multiplier = 0.5\n"
                             "final_logit_softcapping = 30\n"
                             "input_embedding_scale = 8.0\n"
                             "[training.dflash2]\nselector_alpha = 0.25\n"
                             "selector_warmup_ratio = 0.1\n"
                             "selector_ramp_ratio = 0.9\n"
                             "selector_stop_gradient = true\n"
                             "selector_gold = \"inject\"\n"
                             "selector_denominator = \"all\"\n",
                         "given.toml", error);
  ASSERT_TRUE(given) << error.str();
  EXPECT_EQ(given->convKernelSize, 3);
  EXPECT_EQ(given->convGroups(), 8);
  EXPECT_EQ(given->selectorRank, 32);
  EXPECT_EQ(given->selectorTopK, 64);
  EXPECT_EQ(given->outputMultiplier, 0.5);
  EXPECT_EQ(given->finalLogitSoftcapping, 30.0);
  EXPECT_EQ(given->inputEmbeddingScale, 8.0);
  EXPECT_EQ(given->selectorAlpha, 0.25);
  EXPECT_EQ(given->selectorWarmupRatio, 0.1);
  EXPECT_EQ(given->selectorRampRatio, 0.9);
  EXPECT_TRUE(given->selectorStopGradient);
  EXPECT_TRUE(given->selectorGoldInject);
  EXPECT_FALSE(given->selectorDenominatorCovered);
  for (const DrafterSpec *s : {&*spec, &*given}) {
    std::string canonical = printCanonicalSpec(*s);
    auto again = parseSpec(canonical, "canonical.toml", error);
    ASSERT_TRUE(again) << error.str() << "\n" << canonical;
    EXPECT_EQ(withoutComments(printCanonicalSpec(*again)),
              withoutComments(canonical));
    EXPECT_TRUE(again->dflash2);
    EXPECT_EQ(again->convKernelSize, s->convKernelSize);
    EXPECT_EQ(again->convGroupSize, s->convGroupSize);
    EXPECT_EQ(again->selectorRank, s->selectorRank);
    EXPECT_EQ(again->selectorTopK, s->selectorTopK);
    EXPECT_EQ(again->outputMultiplier, s->outputMultiplier);
    EXPECT_EQ(again->finalLogitSoftcapping, s->finalLogitSoftcapping);
    EXPECT_EQ(again->inputEmbeddingScale, s->inputEmbeddingScale);
    EXPECT_EQ(again->selectorAlpha, s->selectorAlpha);
    EXPECT_EQ(again->selectorWarmupRatio, s->selectorWarmupRatio);
    EXPECT_EQ(again->selectorRampRatio, s->selectorRampRatio);
    EXPECT_EQ(again->selectorStopGradient, s->selectorStopGradient);
    EXPECT_EQ(again->selectorGoldInject, s->selectorGoldInject);
    EXPECT_EQ(again->selectorDenominatorCovered, s->selectorDenominatorCovered);
  }
  // "covered" alone (NeMo's denominator) is valid.
  auto covered =
      parseSpec(std::string(kBase) + "[drafter.dflash2]\n[training.dflash2]\n"
                                     "selector_denominator = \"covered\"\n",
                "covered.toml", error);
  ASSERT_TRUE(covered) << error.str();
  EXPECT_TRUE(covered->selectorDenominatorCovered);
  EXPECT_FALSE(covered->selectorGoldInject);
}

// A vocabulary smaller than the kernels' limit bounds the selector's K.
TEST(Spec, DFlash2TopKPastSmallVocabulary) {
  std::string text = kBase;
  text.replace(text.find("vocab_size = 1000"), 17, "vocab_size = 48");
  text.replace(text.find("mask_token_id = 999"), 19, "mask_token_id = 47");
  SpecError error;
  ASSERT_TRUE(parseSpec(text + "[drafter.dflash2]\nselector_top_k = 48\n",
                        "ok.toml", error))
      << error.str();
  text += "[drafter.dflash2]\nselector_top_k = 49\n";
  EXPECT_FALSE(parseSpec(text, "bad.toml", error));
  EXPECT_EQ(error.str(),
            "bad.toml:" + std::to_string(lineOf(text, "selector_top_k")) +
                ":18: error: 'drafter.dflash2.selector_top_k' "
                "(49) is above 'target.vocab_size' (48): the "
                "selector re-ranks the top K tokens");
}

// Valid but likely not meant: a selector weight of 0 with options that
// shape its term; a window past the sequence says nothing of causal blocks
// in a DFlash2 drafter.
TEST(Spec, DFlash2Warnings) {
  SpecError error;
  std::string text = std::string(kBase) +
                     "[drafter.dflash2]\n[training.dflash2]\n"
                     "selector_alpha = 0\nselector_ramp_ratio = 0.5\n";
  auto spec = parseSpec(text, "zero.toml", error);
  ASSERT_TRUE(spec) << error.str();
  ASSERT_EQ(spec->warnings.size(), 1u);
  EXPECT_EQ(spec->warnings[0].str(),
            "zero.toml:" + std::to_string(lineOf(text, "selector_alpha")) +
                ":18: warning: 'training.dflash2.selector_alpha' is 0, so the "
                "selector is never trained and the other keys of "
                "[training.dflash2] do nothing");
  // Alone, a weight of 0 is an ablation: no warning.
  spec = parseSpec(std::string(kBase) + "[drafter.dflash2]\n"
                                        "[training.dflash2]\nselector_alpha = "
                                        "0\n",
                   "ablation.toml", error);
  ASSERT_TRUE(spec) << error.str();
  EXPECT_TRUE(spec->warnings.empty());

  text = replaced("sliding_window = 8", "sliding_window = 100") +
         "[drafter.dflash2]\n";
  spec = parseSpec(text, "window.toml", error);
  ASSERT_TRUE(spec) << error.str();
  ASSERT_EQ(spec->warnings.size(), 1u);
  EXPECT_EQ(spec->warnings[0].message.find("causal"), std::string::npos)
      << spec->warnings[0].str();
}

// The shipped DFlash2 specs: the published Qwen3.8-27B drafter and SpecForge's
// recipe (docs/semantics.md section 13), and the tiny one for tests.
TEST(Spec, ShippedDFlash2Specs) {
  SpecError error;
  auto qwen = loadSpec(
      std::string(DFLASH_SPECS_DIR) + "/qwen3.8-27b-dflash2-b8.toml", error);
  ASSERT_TRUE(qwen) << error.str();
  EXPECT_TRUE(qwen->dflash2);
  EXPECT_EQ(qwen->targetModel, "Qwen/Qwen3.8-27B");
  EXPECT_EQ(qwen->targetNumLayers, 64);
  EXPECT_EQ(qwen->numLayers, 5);
  EXPECT_EQ(qwen->hiddenSize, 5120);
  EXPECT_EQ(qwen->intermediateSize, 17408);
  EXPECT_EQ(qwen->numHeads, 32);
  EXPECT_EQ(qwen->numKvHeads, 8);
  EXPECT_EQ(qwen->headDim, 128);
  EXPECT_EQ(qwen->targetLayerIds, (std::vector<int64_t>{5, 19, 33, 47, 61}));
  EXPECT_EQ(qwen->blockSize, 8);
  EXPECT_EQ(qwen->vocabSize, 248320);
  EXPECT_EQ(qwen->maskTokenId, 248070);
  EXPECT_EQ(qwen->ropeTheta, 1e7);
  EXPECT_EQ(qwen->layerWindows, (std::vector<int64_t>(5, 2048)));
  for (int64_t layer = 0; layer < 5; ++layer)
    EXPECT_FALSE(qwen->blockCausal(layer));
  EXPECT_EQ(qwen->convKernelSize, 2);
  EXPECT_EQ(qwen->convGroupSize, 16);
  EXPECT_EQ(qwen->selectorRank, 256);
  EXPECT_EQ(qwen->selectorTopK, 16);
  EXPECT_EQ(qwen->outputMultiplier, 1.0);
  EXPECT_EQ(qwen->finalLogitSoftcapping, 0.0);
  EXPECT_EQ(qwen->inputEmbeddingScale, 1.0);
  EXPECT_EQ(qwen->gamma, 7.0);
  EXPECT_FALSE(qwen->gammaDefaulted); // 4 is block 8's default
  EXPECT_EQ(qwen->anchorsPerRow, 512);
  EXPECT_EQ(qwen->seqLen, 8192);
  EXPECT_EQ(qwen->lr, 5e-4);
  EXPECT_EQ(qwen->selectorAlpha, 1.0);
  EXPECT_FALSE(qwen->selectorGoldInject);
  EXPECT_FALSE(qwen->selectorDenominatorCovered);
  EXPECT_TRUE(qwen->warnings.empty());

  // tiny's shapes, with K > 1 candidates and G > 1 groups.
  auto tiny = loadSpec(std::string(DFLASH_SPECS_DIR) + "/tiny.toml", error);
  auto tiny2 =
      loadSpec(std::string(DFLASH_SPECS_DIR) + "/tiny-dflash2.toml", error);
  ASSERT_TRUE(tiny && tiny2) << error.str();
  EXPECT_TRUE(tiny2->dflash2);
  DrafterSpec same = *tiny2;
  same.name = tiny->name;
  same.dflash2 = false;
  std::string v1 = printCanonicalSpec(*tiny);
  std::string asV1 = printCanonicalSpec(same);
  EXPECT_EQ(asV1.substr(asV1.find('\n')), v1.substr(v1.find('\n')));
  EXPECT_GT(tiny2->selectorTopK, 1);
  EXPECT_GT(tiny2->convGroups(), 1);
  EXPECT_LT(tiny2->selectorRank, 256);
}

TEST(Spec, MissingFileIsAnError) {
  SpecError error;
  EXPECT_FALSE(loadSpec("/nonexistent/spec.toml", error));
  EXPECT_EQ(error.str(),
            "/nonexistent/spec.toml: error: cannot open spec file");
}

// One invalid spec per rule: the replaced text, the message expected, and the
// text whose line the error must point at (the replacement by default).
struct ErrorCase {
  const char *name;
  const char *from;
  const char *to;
  const char *message;
  const char *at = nullptr;
};

class SpecErrors : public ::testing::TestWithParam<ErrorCase> {};

// [memory] recompute_activations: off by default, read as a bool, kept by
// the canonical form, refused when it is not a bool.
TEST(Spec, RecomputeActivations) {
  SpecError error;
  auto plain = parseSpec(kBase, "base.toml", error);
  ASSERT_TRUE(plain) << error.str();
  EXPECT_FALSE(plain->recomputeActivations);
  auto on =
      parseSpec(std::string(kBase) + "[memory]\nrecompute_activations = true\n",
                "on.toml", error);
  ASSERT_TRUE(on) << error.str();
  EXPECT_TRUE(on->recomputeActivations);
  auto again = parseSpec(printCanonicalSpec(*on), "canonical.toml", error);
  ASSERT_TRUE(again) << error.str();
  EXPECT_TRUE(again->recomputeActivations);
  EXPECT_FALSE(
      parseSpec(std::string(kBase) + "[memory]\nrecompute_activations = 1\n",
                "bad.toml", error));
  EXPECT_NE(error.message.find("memory.recompute_activations"),
            std::string::npos)
      << error.str();
}

// [memory] fuse_target_mlp: off by default, kept by the canonical print,
// a non-bool named with its key.
TEST(Spec, FuseTargetMlp) {
  SpecError error;
  auto plain = parseSpec(kBase, "base.toml", error);
  ASSERT_TRUE(plain) << error.str();
  EXPECT_FALSE(plain->fuseTargetMlp);
  auto on = parseSpec(std::string(kBase) + "[memory]\nfuse_target_mlp = true\n",
                      "on.toml", error);
  ASSERT_TRUE(on) << error.str();
  EXPECT_TRUE(on->fuseTargetMlp);
  EXPECT_FALSE(on->recomputeMlpProducts);
  auto again = parseSpec(printCanonicalSpec(*on), "canonical.toml", error);
  ASSERT_TRUE(again) << error.str();
  EXPECT_TRUE(again->fuseTargetMlp);
  EXPECT_FALSE(parseSpec(std::string(kBase) + "[memory]\nfuse_target_mlp = 1\n",
                         "bad.toml", error));
  EXPECT_NE(error.message.find("memory.fuse_target_mlp"), std::string::npos)
      << error.str();
}

// [memory] recompute_mlp_products: the same, on its own switch.
TEST(Spec, RecomputeMlpProducts) {
  SpecError error;
  auto plain = parseSpec(kBase, "base.toml", error);
  ASSERT_TRUE(plain) << error.str();
  EXPECT_FALSE(plain->recomputeMlpProducts);
  auto on = parseSpec(std::string(kBase) +
                          "[memory]\nrecompute_mlp_products = true\n",
                      "on.toml", error);
  ASSERT_TRUE(on) << error.str();
  EXPECT_TRUE(on->recomputeMlpProducts);
  EXPECT_FALSE(on->recomputeActivations);
  auto again = parseSpec(printCanonicalSpec(*on), "canonical.toml", error);
  ASSERT_TRUE(again) << error.str();
  EXPECT_TRUE(again->recomputeMlpProducts);
  EXPECT_FALSE(again->recomputeActivations);
  EXPECT_FALSE(parseSpec(std::string(kBase) +
                             "[memory]\nrecompute_mlp_products = \"yes\"\n",
                         "bad.toml", error));
  EXPECT_NE(error.message.find("memory.recompute_mlp_products"),
            std::string::npos)
      << error.str();
}

TEST_P(SpecErrors, PointsAtTheOffendingEntry) {
  const ErrorCase &c = GetParam();
  std::string text = replaced(c.from, c.to);
  SpecError error;
  auto spec = parseSpec(text, "bad.toml", error);
  ASSERT_FALSE(spec) << "accepted:\n" << text;
  EXPECT_NE(error.message.find(c.message), std::string::npos)
      << "message: " << error.message << "\nexpected: " << c.message;
  std::string at = c.at ? c.at : c.to;
  uint32_t line = lineOf(text, at);
  ASSERT_NE(line, 0u);
  EXPECT_EQ(error.loc.line, line) << error.str();
  EXPECT_GT(error.loc.column, 0u) << error.str();
  EXPECT_EQ(error.str().rfind("bad.toml:" + std::to_string(line) + ":", 0), 0u)
      << error.str();
}

const ErrorCase kErrorCases[] = {
    {"SyntaxError", "num_heads = 4", "num_heads = = 4", "invalid TOML"},
    {"UnknownTopLevelKey", "name = \"t\"", "name = \"t\"\ncolour = 1",
     "unknown key 'colour' at the top level", "colour"},
    {"UnknownKeySuggestsSpelling", "num_heads = 4", "num_head = 4",
     "unknown key 'drafter.num_head' in [drafter]; did you mean 'num_heads'?"},
    {"WrongTypeString", "num_heads = 4", "num_heads = \"4\"",
     "'drafter.num_heads' must be an integer, not a string"},
    {"WrongTypeFloat", "num_heads = 4", "num_heads = 4.0",
     "'drafter.num_heads' must be an integer, not a float"},
    {"TableIsNotATable",
     "[target]\nnum_layers = 8\nhidden_size = 64\nvocab_size = 1000\n",
     "target = 5\n", "'target' must be a table, not an integer"},
    {"MissingKey", "vocab_size = 1000\n", "",
     "missing required key 'target.vocab_size'", "[target]"},
    {"MissingName", "name = \"t\"\n", "# no name\n",
     "missing required key 'name'", "# no name"},
    {"HiddenNotDivisibleByHeads", "num_heads = 4\nnum_kv_heads = 2",
     "num_heads = 3\nnum_kv_heads = 1",
     "'drafter.hidden_size' (64) is not divisible by 'drafter.num_heads' (3)",
     "num_heads = 3"},
    {"HeadsNotDivisibleByKvHeads", "num_kv_heads = 2", "num_kv_heads = 3",
     "'drafter.num_heads' (4) is not divisible by 'drafter.num_kv_heads' (3)"},
    {"HeadDimOdd", "head_dim = 16", "head_dim = 15", "must be even"},
    {"HiddenSizeDiffersFromTarget", "num_layers = 2",
     "num_layers = 2\nhidden_size = 32",
     "'drafter.hidden_size' (32) must equal 'target.hidden_size' (64)",
     "hidden_size = 32"},
    {"WindowZero", "sliding_window = 8", "sliding_window = 0",
     "a window must be positive"},
    {"WindowNegative", "sliding_window = 8", "sliding_window = -5",
     "'attention.sliding_window' is -5; a window must be positive"},
    {"SlidingWithoutWindow", "sliding_window = 8\n", "",
     "a layer is \"sliding\" but 'attention.sliding_window' is not given",
     "[attention]"},
    {"WindowWithoutSlidingLayer", "layers = [\"sliding\", \"full\"]",
     "layers = [\"full\", \"full\"]",
     "'attention.sliding_window' is given but no layer is \"sliding\"",
     "sliding_window"},
    {"UnknownAttentionKind", "layers = [\"sliding\", \"full\"]",
     "layers = [\"slidin\", \"full\"]",
     "'attention.layers.0' is \"slidin\"; it must be \"full\" or \"sliding\""},
    {"LayerCountMismatch", "layers = [\"sliding\", \"full\"]",
     "layers = [\"sliding\"]",
     "'attention.layers' has 1 entries but 'drafter.num_layers' is 2"},
    {"TapOutsideTarget", "vocab_size = 1000",
     "vocab_size = 1000\nlayer_ids = [1, 8]",
     "'target.layer_ids.1' is 8, outside the target's layers 0..7",
     "layer_ids"},
    {"TapsNotAscending", "vocab_size = 1000",
     "vocab_size = 1000\nlayer_ids = [5, 1]",
     "'target.layer_ids' must be strictly ascending", "layer_ids"},
    {"TapWrongType", "vocab_size = 1000",
     "vocab_size = 1000\nlayer_ids = [1, \"5\"]",
     "'target.layer_ids.1' must be an integer, not a string", "layer_ids"},
    {"NoTaps", "vocab_size = 1000", "vocab_size = 1000\nlayer_ids = []",
     "'target.layer_ids' must name at least one layer", "layer_ids"},
    {"DefaultTapsCollide", "num_layers = 8", "num_layers = 4",
     "are not distinct layers of the target; give 'target.layer_ids'"},
    {"BlockSizeBelowTwo", "block_size = 4", "block_size = 1",
     "'drafter.block_size' is 1; it must be at least 2"},
    {"MaskTokenOutsideVocab", "mask_token_id = 999", "mask_token_id = 1000",
     "'drafter.mask_token_id' (1000) is outside the vocabulary"},
    {"AnchorsDoNotFit", "anchors_per_row = 8", "anchors_per_row = 64",
     "'training.anchors_per_row' (64) does not fit the sequence"},
    {"SeqLenTooShort", "seq_len = 64", "seq_len = 1",
     "'training.seq_len' is 1; it must be at least 2"},
    {"ValueTooLarge", "num_heads = 4", "num_heads = 99999999999",
     "it must be at most 1024"},
    {"NegativeEps", "mask_token_id = 999",
     "mask_token_id = 999\nrms_norm_eps = -1e-6",
     "'drafter.rms_norm_eps' must be positive", "rms_norm_eps"},
    {"ZeroRopeTheta", "mask_token_id = 999",
     "mask_token_id = 999\nrope_theta = 0",
     "'drafter.rope_theta' must be "
     "positive",
     "rope_theta"},
    {"NegativeGamma", "gamma = 0", "gamma = -1.0",
     "'training.gamma' must be zero or positive", "gamma"},
    {"GammaWithoutDefault", "gamma = 0\n", "",
     "'drafter.block_size' is 4, which has no default loss decay (7 for 16, "
     "5 for 10, 4 for 8): give 'training.gamma' (0 turns the decay off)",
     "block_size"},
    {"BudgetPastEveryGpu", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[memory]\ngpu_memory_gib = 80000",
     "'memory.gpu_memory_gib' is 80000; no GPU has more than 1024 GiB",
     "gpu_memory_gib"},
    {"InfiniteBudget", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[memory]\ngpu_memory_gib = inf",
     "'memory.gpu_memory_gib' must be a finite number", "gpu_memory_gib"},
    {"MaxPositionsTooSmall", "mask_token_id = 999",
     "mask_token_id = 999\nmax_position_embeddings = 32",
     "'drafter.max_position_embeddings' (32) is below seq_len + block_size",
     "max_position_embeddings"},
    {"WarmupRatioTooLarge", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[optimizer]\nwarmup_ratio = 1.5",
     "'optimizer.warmup_ratio' must be below 1", "warmup_ratio"},
    {"ZeroAccumulation", "rows_per_gpu = 2",
     "rows_per_gpu = 2\ngradient_accumulation = 0",
     "'training.gradient_accumulation' is 0; it must be at least 1",
     "gradient_accumulation"},
    {"ZeroGpus", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[parallel]\ngpus_per_node = 0",
     "'parallel.gpus_per_node' is 0; it must be at least 1", "gpus_per_node"},
    {"NonFiniteLr", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[optimizer]\nlr = nan",
     "'optimizer.lr' must be a finite number", "lr = nan"},
    {"BucketsNotAnArray", "rows_per_gpu = 2",
     "rows_per_gpu = 2\nposition_buckets = 16",
     "'training.position_buckets' must be an array of integers, not an "
     "integer",
     "position_buckets"},
    {"BucketEdgeWrongType", "rows_per_gpu = 2",
     "rows_per_gpu = 2\nposition_buckets = [16, \"32\"]",
     "'training.position_buckets.1' must be an integer, not a string",
     "position_buckets"},
    {"BucketEdgeNotPositive", "rows_per_gpu = 2",
     "rows_per_gpu = 2\nposition_buckets = [\n0]",
     "'training.position_buckets.0' is 0; an edge must be positive", "0]"},
    {"BucketsNotIncreasing", "rows_per_gpu = 2",
     "rows_per_gpu = 2\nposition_buckets = [16,\n16]",
     "'training.position_buckets' must be strictly increasing, but entry 1 "
     "(16) follows 16",
     "16]"},
    {"BucketEdgePastPositions", "rows_per_gpu = 2",
     "rows_per_gpu = 2\nposition_buckets = [16,\n50000]",
     "'training.position_buckets.1' is 50000; it must be below "
     "'drafter.max_position_embeddings' (40960)",
     "50000]"},
    {"TooManyBuckets", "rows_per_gpu = 2",
     "rows_per_gpu = 2\nposition_buckets = [1, 2, 3, 4, 5, 6, 7, 8]",
     "'training.position_buckets' has 8 edges; at most 7 (8 buckets) are "
     "supported",
     "position_buckets"},
    // [drafter.dflash2] and [training.dflash2] (docs/semantics.md section
    // 13), appended after [training]: hidden_size 64, vocab 1000, block 4.
    {"DFlash2NotATable", "mask_token_id = 999",
     "mask_token_id = 999\ndflash2 = true",
     "'drafter.dflash2' must be a table, not a boolean", "dflash2 = true"},
    {"DFlash2UnknownKey", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\nconv_kernal_size = 2",
     "unknown key 'drafter.dflash2.conv_kernal_size' in [drafter.dflash2]; "
     "did you mean 'conv_kernel_size'?",
     "conv_kernal_size"},
    {"GroupSizeDoesNotDivideHidden", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\nconv_group_size = 24",
     "'drafter.dflash2.conv_group_size' (24) does not divide "
     "'drafter.hidden_size' (64)",
     "conv_group_size"},
    {"GroupSizeZero", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\nconv_group_size = 0",
     "'drafter.dflash2.conv_group_size' is 0; it must be at least 1",
     "conv_group_size"},
    {"ConvKernelZero", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\nconv_kernel_size = 0",
     "'drafter.dflash2.conv_kernel_size' is 0; it must be at least 1",
     "conv_kernel_size"},
    {"ConvKernelPastKernelLimit", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\nconv_kernel_size = 5",
     "'drafter.dflash2.conv_kernel_size' is 5; the DFlash2 convolution "
     "kernels take at most 4 taps",
     "conv_kernel_size"},
    {"ConvKernelPastBlock", "block_size = 4\nmask_token_id = 999",
     "block_size = 2\nmask_token_id = 999\n[drafter.dflash2]\n"
     "conv_kernel_size = 3",
     "'drafter.dflash2.conv_kernel_size' (3) is above 'drafter.block_size' "
     "(2): the convolution stays inside one block",
     "conv_kernel_size"},
    {"ConvKernelFloat", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\nconv_kernel_size = 2.0",
     "'drafter.dflash2.conv_kernel_size' must be an integer, not a float",
     "conv_kernel_size"},
    {"SelectorRankZero", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\nselector_rank = 0",
     "'drafter.dflash2.selector_rank' is 0; it must be at least 1",
     "selector_rank"},
    {"SelectorRankNegative", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\nselector_rank = -8",
     "'drafter.dflash2.selector_rank' is -8; it must be at least 1",
     "selector_rank"},
    {"TopKZero", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\nselector_top_k = 0",
     "'drafter.dflash2.selector_top_k' is 0; it must be at least 1",
     "selector_top_k"},
    {"TopKPastKernelLimit", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\nselector_top_k = 65",
     "'drafter.dflash2.selector_top_k' is 65; the DFlash2 selector kernels "
     "take at most 64 candidates",
     "selector_top_k"},
    {"TopKPastVocabulary", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\nselector_top_k = 1001",
     "'drafter.dflash2.selector_top_k' (1001) is above 'target.vocab_size' "
     "(1000): the selector re-ranks the top K tokens",
     "selector_top_k"},
    {"OutputMultiplierNotPositive", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\noutput_multiplier = -1.0",
     "'drafter.dflash2.output_multiplier' must be positive",
     "output_multiplier"},
    {"SoftcappingZero", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\nfinal_logit_softcapping = 0",
     "'drafter.dflash2.final_logit_softcapping' must be positive",
     "final_logit_softcapping"},
    {"EmbeddingScaleZero", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\ninput_embedding_scale = 0.0",
     "'drafter.dflash2.input_embedding_scale' must be positive",
     "input_embedding_scale"},
    {"SelectorWithoutDFlash2", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[training.dflash2]\nselector_alpha = 0.5",
     "[training.dflash2] sets the loss of a selector, but the drafter has no "
     "selector: only a DFlash2 drafter (a [drafter.dflash2] table) has one",
     "[training.dflash2]"},
    {"TrainingDFlash2UnknownKey", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\n[training.dflash2]\n"
     "selector_aplha = 1.0",
     "unknown key 'training.dflash2.selector_aplha' in [training.dflash2]; "
     "did you mean 'selector_alpha'?",
     "selector_aplha"},
    {"NegativeAlpha", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\n[training.dflash2]\n"
     "selector_alpha = -1.0",
     "'training.dflash2.selector_alpha' must be zero or positive",
     "selector_alpha"},
    {"NegativeRampRatio", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\n[training.dflash2]\n"
     "selector_ramp_ratio = -0.1",
     "'training.dflash2.selector_ramp_ratio' must be zero or positive",
     "selector_ramp_ratio"},
    {"WarmupRatioOne", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\n[training.dflash2]\n"
     "selector_warmup_ratio = 1.0",
     "'training.dflash2.selector_warmup_ratio' must be below 1: the "
     "selector would never be trained",
     "selector_warmup_ratio"},
    {"RampRatioAboveOne", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\n[training.dflash2]\n"
     "selector_ramp_ratio = 1.5",
     "'training.dflash2.selector_ramp_ratio' must be at most 1",
     "selector_ramp_ratio"},
    {"RatiosPastTheRun", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\n[training.dflash2]\n"
     "selector_warmup_ratio = 0.5\nselector_ramp_ratio = 0.75",
     "'training.dflash2.selector_warmup_ratio' + "
     "'training.dflash2.selector_ramp_ratio' must be at most 1",
     "selector_ramp_ratio"},
    {"StopGradientNotBool", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\n[training.dflash2]\n"
     "selector_stop_gradient = 1",
     "'training.dflash2.selector_stop_gradient' must be a boolean, not an "
     "integer",
     "selector_stop_gradient"},
    {"UnknownSelectorGold", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\n[training.dflash2]\n"
     "selector_gold = \"label\"",
     "'training.dflash2.selector_gold' is \"label\"; it must be \"topk\" or "
     "\"inject\"",
     "selector_gold"},
    {"UnknownSelectorDenominator", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\n[training.dflash2]\n"
     "selector_denominator = \"kept\"",
     "'training.dflash2.selector_denominator' is \"kept\"; it must be "
     "\"all\" or \"covered\"",
     "selector_denominator"},
    {"CoveredWithInjectedGold", "rows_per_gpu = 2",
     "rows_per_gpu = 2\n[drafter.dflash2]\n[training.dflash2]\n"
     "selector_gold = \"inject\"\nselector_denominator = \"covered\"",
     "'training.dflash2.selector_denominator' = \"covered\" contradicts "
     "'training.dflash2.selector_gold' = \"inject\": an injected label "
     "covers every slot (cov = 1)",
     "selector_denominator"},
};

INSTANTIATE_TEST_SUITE_P(AllRules, SpecErrors, ::testing::ValuesIn(kErrorCases),
                         [](const ::testing::TestParamInfo<ErrorCase> &info) {
                           return std::string(info.param.name);
                         });

} // namespace
