//===- DFlash2SelectorGpuTest.cu - The DFlash2 selector's kernels ---------===//
//
// kernels/DFlash2Selector.cuh against kernels/reference/DFlash2.h (double),
// on fresh random inputs with every output poisoned before its launch:
// - selector_candidates_bf16 at the published drafter's H = 5120 over a
//   vocabulary that is no multiple of the chunk, streamed in one chunk and in
//   many, K = 1, 16, 64, with and without a softcap and multiplier, rows of
//   weight 0 among the others; and the top-K merge on its own on logits
//   with many exact ties (the lower token first);
// - selector_candidates_grad_bf16 (either gradient absent, softcap or not);
// - selector_loss(_grad)_bf16 (H 5120, r 256; K = 1, 16, 64; gold "topk"
//   and "inject"; stop_gradient; labels inside and outside the top-K;
//   predecessors and candidates drawn from few tokens so that the codebook
//   rows' atomics collide);
// - draft_predecessors, selector_alpha_f32, selector_objective(_grad)_f32.
// Candidates are compared token for token; where the GPU's fp32 logits
// order two tokens whose reference logits lie within kTieMargin the other
// way round, the swap is allowed and counted (and must stay rare). Hits are
// compared where the two best reference scores are apart by more than
// kTieMargin (the rows left out are counted and must stay rare).
//
//===----------------------------------------------------------------------===//

#include "kernels/DFlash2Selector.cuh"
#include "kernels/reference/DFlash2.h"
#include "kernels/reference/Reference.h"
#include "test/gpu/GpuTestUtil.h"

#include <algorithm>
#include <climits>
#include <numeric>
#include <set>

using namespace dflash;
using namespace dflash::gputest;
using bf16 = __nv_bfloat16;

namespace {

/// fp32 GEMMs over H = 5120 against double: logits this close may come out
/// in either order (the GPU's logits are within kValueTolerance of the
/// reference's, rounding and accumulation order included).
constexpr double kTieMargin = 3e-4;
double valueTolerance(double u) { return 1e-4 + 1e-5 * std::fabs(u); }

struct LtContext {
  cublasLtHandle_t handle;
  DeviceBuffer<char> workspace{32 << 20};
  LtContext() { DFLASH_CUBLAS_CHECK(cublasLtCreate(&handle)); }
  ~LtContext() { cublasLtDestroy(handle); }
};

/// Loss weights in (0.25, 1], 0 at every 8th row (a block's slot 0).
std::vector<float> rowWeights(int64_t rows, std::mt19937_64 &rng) {
  std::uniform_real_distribution<float> dist(0.25f, 1.f);
  std::vector<float> w(rows);
  for (int64_t i = 0; i < rows; ++i)
    w[i] = i % 8 == 0 ? 0.f : dist(rng);
  return w;
}

std::vector<int32_t> randomTokens(int64_t n, int64_t V, std::mt19937_64 &rng) {
  std::uniform_int_distribution<int32_t> dist(0, int32_t(V - 1));
  std::vector<int32_t> t(n);
  for (auto &x : t)
    x = dist(rng);
  return t;
}

/// Checks one row's candidates against the reference top-K of uRow: token
/// for token, but for swaps within kTieMargin (counted in `swaps`).
void expectTopK(const double *uRow, int64_t V, int64_t K,
                const int32_t *gotTokens, const float *gotValues, int64_t row,
                int64_t &swaps) {
  std::vector<int32_t> want(K);
  ref::topK(uRow, V, K, want.data());
  std::set<int32_t> seen;
  for (int64_t j = 0; j < K; ++j) {
    const int32_t c = gotTokens[j];
    ASSERT_TRUE(c >= 0 && c < V) << "row " << row << " slot " << j << ": " << c;
    EXPECT_TRUE(seen.insert(c).second)
        << "row " << row << ": " << c << " twice";
    EXPECT_NEAR(gotValues[j], uRow[c], valueTolerance(uRow[c]))
        << "row " << row << " slot " << j;
    if (c != want[j]) {
      ++swaps;
      EXPECT_NEAR(uRow[c], uRow[want[j]], kTieMargin)
          << "row " << row << " slot " << j << ": token " << c
          << " where the reference has " << want[j];
    }
  }
}

//===----------------------------------------------------------------------===//
// selector_candidates
//===----------------------------------------------------------------------===//

struct CandidatesCase {
  int64_t rows, V, H, K;
  double multiplier, softcap;
  int64_t chunk; ///< 0: selectorVocabChunk's
};

void candidatesCase(const CandidatesCase &c, uint64_t seed) {
  SCOPED_TRACE(testing::Message()
               << "rows=" << c.rows << " V=" << c.V << " H=" << c.H
               << " K=" << c.K << " m=" << c.multiplier << " cap=" << c.softcap
               << " chunk=" << c.chunk);
  std::mt19937_64 rng(seed);
  LtContext lt;
  kernels::CublasLtGemm gemm(lt.handle, lt.workspace.get(),
                             lt.workspace.bytes());
  // Logits of about unit scale (so the softcap's tanh bends them).
  Bf16Tensor y = randomBf16(c.rows * c.H, rng);
  Bf16Tensor head = randomBf16(c.V * c.H, rng, 3.0 / std::sqrt(double(c.H)));
  std::vector<int32_t> labels = randomTokens(c.rows, c.V, rng);
  std::vector<float> weights = rowWeights(c.rows, rng);

  std::vector<double> u(c.rows * c.V);
  ref::linear(y.values.data(), head.values.data(), u.data(), c.rows, c.V, c.H);
  ref::unaryTransform(u.data(), u.data(), c.rows * c.V,
                      ref::UnaryTransform{c.multiplier, c.softcap});

  DeviceBuffer<int32_t> dLabels(c.rows);
  DeviceBuffer<float> dWeights(c.rows), values(c.rows * c.K),
      labelValues(c.rows);
  DeviceBuffer<int32_t> candidates(c.rows * c.K);
  dLabels.upload(labels);
  dWeights.upload(weights);
  const int64_t chunk =
      c.chunk ? c.chunk : kernels::selectorVocabChunk(c.rows, c.V);
  DeviceBuffer<float> workspace(c.rows * chunk);
  poisonAll(values, labelValues, candidates, workspace);

  kernels::SelectorCandidatesArgs a{};
  a.y = y.ptr();
  a.lmHead = head.ptr();
  a.labels = dLabels.get();
  a.weights = dWeights.get();
  a.values = values.get();
  a.candidates = candidates.get();
  a.labelValues = labelValues.get();
  a.logitsChunk = workspace.get();
  a.rows = c.rows;
  a.V = c.V;
  a.H = c.H;
  a.K = c.K;
  a.chunk = chunk;
  a.multiplier = float(c.multiplier);
  a.softcap = float(c.softcap);
  kernels::selector_candidates_bf16(gemm, a, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<float> gotValues = values.download();
  const std::vector<int32_t> gotTokens = candidates.download();
  const std::vector<float> gotLabel = labelValues.download();
  int64_t swaps = 0;
  for (int64_t row = 0; row < c.rows; ++row) {
    const int32_t *tokens = gotTokens.data() + row * c.K;
    const float *vals = gotValues.data() + row * c.K;
    if (weights[row] == 0.f) {
      for (int64_t j = 0; j < c.K; ++j) {
        EXPECT_EQ(tokens[j], -1) << "skipped row " << row;
        EXPECT_EQ(vals[j], 0.f) << "skipped row " << row;
      }
      EXPECT_EQ(gotLabel[row], 0.f) << "skipped row " << row;
      continue;
    }
    const double *uRow = u.data() + row * c.V;
    expectTopK(uRow, c.V, c.K, tokens, vals, row, swaps);
    EXPECT_NEAR(gotLabel[row], uRow[labels[row]],
                valueTolerance(uRow[labels[row]]))
        << "label value of row " << row;
    if (testing::Test::HasFatalFailure())
      return;
  }
  // A broken order would swap far more than near-ties do.
  EXPECT_LE(swaps, std::max<int64_t>(2, c.rows * c.K / 100))
      << "candidates out of the reference's order";
  std::printf("  near-tie swaps: %lld of %lld candidates\n", (long long)swaps,
              (long long)(c.rows * c.K));
}

TEST(DFlash2Selector, CandidatesPublishedShapeOneChunk) {
  candidatesCase({256, 7001, 5120, 16, 1.0, 0.0, 0}, 1);
}

TEST(DFlash2Selector, CandidatesPublishedShapeManyChunks) {
  // 7001 = 6 * 1024 + 857: a partial last chunk.
  candidatesCase({256, 7001, 5120, 16, 1.0, 0.0, 1024}, 2);
}

TEST(DFlash2Selector, CandidatesSoftcapAndMultiplier) {
  candidatesCase({200, 5003, 5120, 16, 1.7, 8.0, 768}, 3);
}

TEST(DFlash2Selector, CandidatesTopOne) {
  candidatesCase({160, 5003, 1024, 1, 0.8, 0.0, 512}, 4);
}

TEST(DFlash2Selector, CandidatesTopSixtyFour) {
  candidatesCase({160, 6007, 1024, 64, 1.0, 3.0, 1280}, 5);
}

TEST(DFlash2Selector, CandidatesWholeVocabularyIsTheTopK) {
  // K = V: every token, in order.
  candidatesCase({24, 40, 256, 40, 1.0, 0.0, 0}, 6);
}

/// The merge alone on logits with many exact ties: the lower token first,
/// across chunks too (an earlier chunk's token wins a tie).
TEST(DFlash2Selector, TopKMergeBreaksTiesByToken) {
  const int64_t rows = 9, V = 3001, K = 64, chunk = 512;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> level(0, 11);
  std::vector<float> z(rows * V);
  for (auto &x : z)
    x = float(level(rng)) * 0.25f;
  std::vector<float> weights(rows, 1.f);
  weights[4] = 0.f;
  std::vector<int32_t> labels = randomTokens(rows, V, rng);
  DeviceBuffer<float> dWeights(rows), values(rows * K), labelValues(rows),
      chunkBuf(rows * chunk);
  DeviceBuffer<int32_t> dLabels(rows), candidates(rows * K);
  dWeights.upload(weights);
  dLabels.upload(labels);
  poisonAll(values, labelValues, candidates);
  kernels::detail::selector_candidates_init_kernel<<<4, 256>>>(
      dWeights.get(), rows, K, values.get(), candidates.get(),
      labelValues.get());
  for (int64_t v0 = 0; v0 < V; v0 += chunk) {
    const int64_t n = std::min(chunk, V - v0);
    std::vector<float> part(rows * n);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(z.begin() + r * V + v0, n, part.begin() + r * n);
    DFLASH_CUDA_CHECK(cudaMemcpy(chunkBuf.get(), part.data(),
                                 part.size() * sizeof(float),
                                 cudaMemcpyHostToDevice));
    kernels::detail::selector_topk_merge_kernel<256><<<rows, 256>>>(
        chunkBuf.get(), n, v0, dLabels.get(), dWeights.get(), 1.f, 0.f, K,
        values.get(), candidates.get(), labelValues.get());
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  }
  const std::vector<int32_t> got = candidates.download();
  const std::vector<float> gotValues = values.download();
  const std::vector<float> gotLabel = labelValues.download();
  for (int64_t r = 0; r < rows; ++r) {
    if (weights[r] == 0.f) {
      EXPECT_EQ(got[r * K], -1);
      continue;
    }
    std::vector<double> uRow(z.begin() + r * V, z.begin() + (r + 1) * V);
    std::vector<int32_t> want(K);
    ref::topK(uRow.data(), V, K, want.data());
    for (int64_t j = 0; j < K; ++j) {
      EXPECT_EQ(got[r * K + j], want[j]) << "row " << r << " slot " << j;
      EXPECT_EQ(gotValues[r * K + j], z[r * V + want[j]]);
    }
    EXPECT_EQ(gotLabel[r], z[r * V + labels[r]]);
  }
}

//===----------------------------------------------------------------------===//
// selector_candidates_grad
//===----------------------------------------------------------------------===//

void candidatesGradCase(int64_t rows, int64_t V, int64_t H, int64_t K,
                        double multiplier, double softcap, bool withValues,
                        bool withLabel, uint64_t seed) {
  SCOPED_TRACE(testing::Message()
               << "rows=" << rows << " V=" << V << " H=" << H << " K=" << K
               << " cap=" << softcap << " values_grad=" << withValues
               << " label_values_grad=" << withLabel);
  std::mt19937_64 rng(seed);
  Bf16Tensor y = randomBf16(rows * H, rng);
  Bf16Tensor head = randomBf16(V * H, rng, 3.0 / std::sqrt(double(H)));
  std::vector<float> weights = rowWeights(rows, rng);
  std::vector<int32_t> labels = randomTokens(rows, V, rng);
  // Distinct candidates a row; a third of the labels among them.
  std::vector<int32_t> candidates(rows * K);
  std::vector<int32_t> order(V);
  for (int64_t r = 0; r < rows; ++r) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::copy_n(order.begin(), K, candidates.begin() + r * K);
    if (r % 3 == 0)
      labels[r] = candidates[r * K + r % K];
  }
  std::normal_distribution<double> gd(0.0, 1.0);
  std::vector<float> dValues(rows * K), dLabel(rows);
  for (auto &x : dValues)
    x = float(gd(rng));
  for (auto &x : dLabel)
    x = float(gd(rng));

  // The reference: du at the K + 1 tokens, times T'(z) (ref's), times
  // lm_head's rows; z in double.
  const ref::UnaryTransform transform{multiplier, softcap};
  std::vector<double> want(rows * H, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (weights[r] == 0.f)
      continue;
    auto add = [&](int32_t tok, double g) {
      const double *w = head.values.data() + int64_t(tok) * H;
      const double *x = y.values.data() + r * H;
      double z = 0;
      for (int64_t h = 0; h < H; ++h)
        z += x[h] * w[h];
      double dz = 0;
      ref::unaryTransformGrad(&g, &z, &dz, 1, transform);
      for (int64_t h = 0; h < H; ++h)
        want[r * H + h] += dz * w[h];
    };
    for (int64_t j = 0; withValues && j < K; ++j)
      add(candidates[r * K + j], dValues[r * K + j]);
    if (withLabel)
      add(labels[r], dLabel[r]);
  }

  DeviceBuffer<int32_t> dCandidates(rows * K), dLabels(rows);
  DeviceBuffer<float> dWeights(rows), dv(rows * K), dl(rows);
  DeviceBuffer<bf16> dy(rows * H);
  dCandidates.upload(candidates);
  dLabels.upload(labels);
  dWeights.upload(weights);
  dv.upload(dValues);
  dl.upload(dLabel);
  poisonAll(dy);
  kernels::SelectorCandidatesGradArgs a{};
  a.y = y.ptr();
  a.lmHead = head.ptr();
  a.candidates = dCandidates.get();
  a.labels = dLabels.get();
  a.weights = dWeights.get();
  a.valuesGrad = withValues ? dv.get() : nullptr;
  a.labelValuesGrad = withLabel ? dl.get() : nullptr;
  a.dy = dy.get();
  a.rows = rows;
  a.V = V;
  a.H = H;
  a.K = K;
  a.multiplier = float(multiplier);
  a.softcap = float(softcap);
  kernels::selector_candidates_grad_bf16(a, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> got = downloadBf16(dy);
  EXPECT_CLOSE(got, want, 1e-2, "input_grad");
  for (int64_t r = 0; r < rows; r += 8) // weight 0: zeros
    for (int64_t h = 0; h < H; ++h)
      ASSERT_EQ(got[r * H + h], 0.0) << "skipped row " << r;
}

TEST(DFlash2Selector, CandidatesGradPublishedShape) {
  candidatesGradCase(192, 6007, 5120, 16, 1.0, 0.0, true, false, 11);
}

TEST(DFlash2Selector, CandidatesGradSoftcapBothGradients) {
  candidatesGradCase(192, 6007, 5120, 16, 1.7, 2.5, true, true, 12);
}

TEST(DFlash2Selector, CandidatesGradLabelOnlyTopSixtyFour) {
  candidatesGradCase(96, 3001, 1024, 64, 0.6, 2.0, false, true, 13);
  candidatesGradCase(96, 3001, 1024, 64, 0.6, 2.0, true, true, 14);
  candidatesGradCase(96, 3001, 1024, 1, 0.6, 0.0, true, true, 15);
}

//===----------------------------------------------------------------------===//
// selector_loss and selector_loss_grad
//===----------------------------------------------------------------------===//

struct LossCase {
  int64_t rows, V, H, r, K;
  bool inject, stopGradient;
};

/// What a selector_loss(_grad) gets: candidates in descending value (as
/// selector_candidates gives them), labels outside the top-K valued below
/// the K-th, few distinct predecessors and candidate tokens.
struct LossInputs {
  std::vector<float> values, labelValues, weights;
  std::vector<int32_t> candidates, predecessors, labels;
};

LossInputs lossInputs(const LossCase &c, std::mt19937_64 &rng) {
  LossInputs in;
  in.weights = rowWeights(c.rows, rng);
  in.values.resize(c.rows * c.K);
  in.candidates.resize(c.rows * c.K);
  in.labelValues.resize(c.rows);
  in.labels.resize(c.rows);
  // Tokens from a pool of 2K + 40 (rows share codebook rows), predecessors
  // from 13 tokens.
  const int64_t pool = std::min<int64_t>(c.V, 2 * c.K + 40);
  in.predecessors = randomTokens(c.rows, 13, rng);
  std::uniform_real_distribution<double> gap(0.05, 0.6);
  std::normal_distribution<double> top(3.0, 1.0);
  std::vector<int32_t> order(pool);
  for (int64_t r = 0; r < c.rows; ++r) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    double v = top(rng);
    for (int64_t j = 0; j < c.K; ++j) {
      in.candidates[r * c.K + j] = order[j] * int32_t(c.V / pool);
      in.values[r * c.K + j] = float(v);
      v -= gap(rng);
    }
    if (r % 2 == 0) { // among the candidates
      const int64_t j = (r / 2) % c.K;
      in.labels[r] = in.candidates[r * c.K + j];
      in.labelValues[r] = in.values[r * c.K + j];
    } else { // outside: a token no candidate is, valued below the K-th
      in.labels[r] = order[c.K] * int32_t(c.V / pool) + 1;
      in.labelValues[r] = float(v - gap(rng));
    }
  }
  return in;
}

/// The CPU reference of one selector_loss(_grad), row by row as the
/// interpreter runs it: each row a vocabulary of K + 1 entries (the
/// candidates, then the label, -inf when among them) whose top-K are the
/// candidates again, so that ref::selectorForward's injection is the op's.
struct LossReference {
  double lossSum = 0, coveredWeight = 0;
  std::vector<uint8_t> hits;
  std::vector<uint8_t> nearTie; ///< the two best scores within kTieMargin
  std::vector<double> valuesGrad, labelValuesGrad, projectedGrad, dP, dS;
};

LossReference lossReference(const LossCase &c, const LossInputs &in,
                            const std::vector<double> &t, const double *P,
                            const double *S, double seed) {
  const int64_t K = c.K, r = c.r;
  LossReference out;
  out.hits.assign(c.rows, 0);
  out.nearTie.assign(c.rows, 0);
  out.valuesGrad.assign(c.rows * K, 0.0);
  out.labelValuesGrad.assign(c.rows, 0.0);
  out.projectedGrad.assign(c.rows * r, 0.0);
  out.dP.assign(c.V * r, 0.0);
  out.dS.assign(c.V * r, 0.0);
  for (int64_t row = 0; row < c.rows; ++row) {
    const double w = in.weights[row];
    if (w == 0)
      continue;
    const int32_t *cand = in.candidates.data() + row * K;
    std::vector<int32_t> tokens(cand, cand + K);
    tokens.push_back(in.labels[row]);
    std::vector<double> u(K + 1, -INFINITY), rowS((K + 1) * r);
    int32_t label = int32_t(K), predecessor = 0;
    for (int64_t j = 0; j < K; ++j) {
      u[j] = in.values[row * K + j];
      if (cand[j] == in.labels[row])
        label = int32_t(j);
    }
    if (label == K)
      u[K] = in.labelValues[row];
    for (int64_t e = 0; e <= K; ++e)
      std::copy_n(S + int64_t(tokens[e]) * r, r, rowS.begin() + e * r);
    ref::SelectorInputs<double> sel;
    sel.u = u.data();
    sel.t = t.data() + row * r;
    sel.predecessors = &predecessor;
    sel.labels = &label;
    sel.weights = &w;
    sel.P = P + int64_t(in.predecessors[row]) * r;
    sel.S = rowS.data();
    sel.rows = 1;
    sel.V = K + 1;
    sel.r = r;
    sel.K = K;
    sel.gold = c.inject ? ref::SelectorGold::Inject : ref::SelectorGold::Skip;
    const ref::SelectorForward<double> f = ref::selectorForward(sel);
    out.lossSum += f.lossSum;
    out.coveredWeight += f.coveredWeight;
    out.hits[row] = f.hits[0];
    // The true scores (before any injection): z . S[c_j] + v_j.
    std::vector<double> scores(K);
    for (int64_t j = 0; j < K; ++j) {
      double acc = u[j];
      for (int64_t i = 0; i < r; ++i)
        acc += sel.P[i] * sel.t[i] * rowS[j * r + i];
      scores[j] = acc;
    }
    std::vector<double> sorted(scores);
    std::sort(sorted.rbegin(), sorted.rend());
    out.nearTie[row] = K > 1 && sorted[0] - sorted[1] < kTieMargin;
    std::vector<double> du(K + 1), dt(r);
    ref::RowGradients<double> dP, dS;
    ref::selectorBackward(sel, f, seed, c.stopGradient, du.data(), dt.data(),
                          dP, dS);
    std::copy_n(du.begin(), K, out.valuesGrad.begin() + row * K);
    out.labelValuesGrad[row] = du[K];
    std::copy_n(dt.begin(), r, out.projectedGrad.begin() + row * r);
    for (int32_t &e : dP.rows)
      e = in.predecessors[row];
    for (int32_t &e : dS.rows)
      e = tokens[e];
    EXPECT_TRUE(ref::scatterAddRows(dP, out.dP.data(), c.V));
    EXPECT_TRUE(ref::scatterAddRows(dS, out.dS.data(), c.V));
  }
  return out;
}

void lossCase(const LossCase &c, uint64_t seed) {
  SCOPED_TRACE(testing::Message()
               << "rows=" << c.rows << " V=" << c.V << " H=" << c.H
               << " r=" << c.r << " K=" << c.K << " inject=" << c.inject
               << " stop_gradient=" << c.stopGradient);
  std::mt19937_64 rng(seed);
  LtContext lt;
  kernels::CublasLtGemm gemm(lt.handle, lt.workspace.get(),
                             lt.workspace.bytes());
  const LossInputs in = lossInputs(c, rng);
  Bf16Tensor y = randomBf16(c.rows * c.H, rng);
  Bf16Tensor wh = randomBf16(c.r * c.H, rng, 1.0 / std::sqrt(double(c.H)));
  Bf16Tensor P = randomBf16(c.V * c.r, rng, 1.0, 0.3);
  Bf16Tensor S = randomBf16(c.V * c.r, rng, 0.2);
  const double seedValue = 0.37;

  std::vector<double> t(c.rows * c.r);
  ref::linear(y.values.data(), wh.values.data(), t.data(), c.rows, c.r, c.H);
  const LossReference want =
      lossReference(c, in, t, P.values.data(), S.values.data(), seedValue);

  DeviceBuffer<float> values(c.rows * c.K), labelValues(c.rows),
      weights(c.rows), seedBuf(1);
  DeviceBuffer<int32_t> candidates(c.rows * c.K), predecessors(c.rows),
      labels(c.rows);
  values.upload(in.values);
  labelValues.upload(in.labelValues);
  weights.upload(in.weights);
  seedBuf.upload(std::vector<float>{float(seedValue)});
  candidates.upload(in.candidates);
  predecessors.upload(in.predecessors);
  labels.upload(in.labels);
  DeviceBuffer<float> sums(2), valuesGrad(c.rows * c.K),
      labelValuesGrad(c.rows);
  DeviceBuffer<uint8_t> hits(c.rows);
  DeviceBuffer<bf16> projectedGrad(c.rows * c.r), dP(c.V * c.r), dS(c.V * c.r);
  DeviceBuffer<char> forwardWs(
      kernels::selectorLossWorkspaceBytes(c.rows, c.r)),
      backwardWs(kernels::selectorLossGradWorkspaceBytes(c.rows, c.r, c.V));
  poisonAll(sums, valuesGrad, labelValuesGrad, hits, projectedGrad, dP, dS,
            forwardWs, backwardWs);

  kernels::SelectorLossArgs a{};
  a.values = values.get();
  a.candidates = candidates.get();
  a.labelValues = labelValues.get();
  a.y = y.ptr();
  a.projection = wh.ptr();
  a.predecessors = predecessors.get();
  a.labels = labels.get();
  a.weights = weights.get();
  a.predecessorCodebook = P.ptr();
  a.successorCodebook = S.ptr();
  a.inject = c.inject;
  a.stopGradient = c.stopGradient;
  a.lossSum = sums.get();
  a.coveredWeight = sums.get() + 1;
  a.hits = hits.get();
  a.lossSumGrad = seedBuf.get();
  a.valuesGrad = valuesGrad.get();
  a.labelValuesGrad = labelValuesGrad.get();
  a.projectedGrad = projectedGrad.get();
  a.predecessorCodebookGrad = dP.get();
  a.successorCodebookGrad = dS.get();
  a.rows = c.rows;
  a.V = c.V;
  a.H = c.H;
  a.r = c.r;
  a.K = c.K;
  kernels::SelectorLossArgs forward = a, backward = a;
  kernels::useSelectorLossWorkspace(forward, forwardWs.get(), false);
  kernels::useSelectorLossWorkspace(backward, backwardWs.get(), true);
  kernels::selector_loss_bf16(gemm, forward, 0);
  kernels::selector_loss_grad_bf16(gemm, backward, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<float> gotSums = sums.download();
  EXPECT_NEAR(gotSums[0], want.lossSum, 1e-4 * std::fabs(want.lossSum))
      << "loss_sum";
  EXPECT_NEAR(gotSums[1], want.coveredWeight, 1e-5 * want.coveredWeight)
      << "covered_weight";
  EXPECT_GT(want.coveredWeight, 0.0);
  const std::vector<uint8_t> gotHits = hits.download();
  int64_t nearTies = 0, hitCount = 0;
  for (int64_t row = 0; row < c.rows; ++row) {
    hitCount += want.hits[row];
    if (want.nearTie[row]) {
      ++nearTies;
      continue;
    }
    EXPECT_EQ(int(gotHits[row]), int(want.hits[row])) << "hits of row " << row;
  }
  EXPECT_LE(nearTies, std::max<int64_t>(2, c.rows / 50));
  std::printf("  hits %lld of %lld rows; %lld near-tie rows not compared\n",
              (long long)hitCount, (long long)c.rows, (long long)nearTies);

  const std::vector<double> gotValuesGrad = downloadF32(valuesGrad);
  const std::vector<double> gotLabelGrad = downloadF32(labelValuesGrad);
  if (c.stopGradient) {
    for (double g : gotValuesGrad)
      ASSERT_EQ(g, 0.0) << "values_grad under stop_gradient";
    for (double g : gotLabelGrad)
      ASSERT_EQ(g, 0.0) << "label_values_grad under stop_gradient";
  } else {
    EXPECT_CLOSE(gotValuesGrad, want.valuesGrad, 1e-4, "values_grad");
    EXPECT_CLOSE(gotLabelGrad, want.labelValuesGrad, 1e-4, "label_values_grad");
  }
  if (c.inject && !c.stopGradient && c.K > 1) { // K = 1: CE_s is 0
    double sum = 0;
    for (double g : want.labelValuesGrad)
      sum += std::fabs(g);
    EXPECT_GT(sum, 0.0) << "no injected label got a gradient";
  }
  EXPECT_CLOSE(downloadBf16(projectedGrad), want.projectedGrad, 1e-2,
               "projected_grad");
  EXPECT_CLOSE(downloadBf16(dP), want.dP, 1e-2, "predecessor_codebook_grad");
  EXPECT_CLOSE(downloadBf16(dS), want.dS, 1e-2, "successor_codebook_grad");
}

TEST(DFlash2Selector, LossPublishedShapeTopK) {
  lossCase({320, 5003, 5120, 256, 16, false, false}, 21);
}

TEST(DFlash2Selector, LossPublishedShapeInject) {
  lossCase({320, 5003, 5120, 256, 16, true, false}, 22);
}

TEST(DFlash2Selector, LossStopGradient) {
  lossCase({320, 5003, 5120, 256, 16, true, true}, 23);
  lossCase({320, 5003, 5120, 256, 16, false, true}, 24);
}

TEST(DFlash2Selector, LossTopOneAndSixtyFour) {
  lossCase({200, 3001, 1024, 256, 1, true, false}, 25);
  lossCase({200, 3001, 1024, 256, 1, false, false}, 26);
  lossCase({200, 3001, 1024, 200, 64, true, false}, 27);
  lossCase({200, 3001, 1024, 96, 64, false, false}, 28);
}

//===----------------------------------------------------------------------===//
// The small ops
//===----------------------------------------------------------------------===//

TEST(DFlash2Selector, DraftPredecessors) {
  const int B = 3, S = 97, N = 7, bs = 8;
  std::mt19937_64 rng(31);
  std::vector<int32_t> ids = randomTokens(B * S, 50000, rng);
  std::vector<int32_t> anchors(B * N);
  std::vector<uint8_t> keep(B * N);
  std::uniform_int_distribution<int> at(0, S - 1), coin(0, 3);
  for (int i = 0; i < B * N; ++i) {
    anchors[i] = i % N == N - 1 ? S - 3 : at(rng); // one block past the row
    keep[i] = coin(rng) != 0;
  }
  std::vector<int32_t> want(B * N * bs);
  ref::draftPredecessors(ids.data(), anchors.data(), keep.data(), want.data(),
                         B, S, N, bs);
  DeviceBuffer<int32_t> dIds(B * S), dAnchors(B * N), out(B * N * bs);
  DeviceBuffer<uint8_t> dKeep(B * N);
  dIds.upload(ids);
  dAnchors.upload(anchors);
  dKeep.upload(keep);
  poisonAll(out);
  kernels::draft_predecessors(dIds.get(), dAnchors.get(), dKeep.get(),
                              out.get(), kernels::DraftBlocksShape{B, S, N, bs},
                              0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(out.download(), want);
}

TEST(DFlash2Selector, AlphaScheduleAndObjective) {
  DeviceBuffer<int32_t> step(1), total(1);
  DeviceBuffer<float> out(1);
  const int32_t steps = 97;
  total.upload(std::vector<int32_t>{steps});
  for (int32_t s = 0; s < steps; s += 3) {
    step.upload(std::vector<int32_t>{s});
    poisonAll(out);
    kernels::selector_alpha_f32(step.get(), total.get(), 0.7, 0.1, 0.25,
                                out.get(), 0);
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(out.download()[0],
              float(ref::selectorAlphaAt(s, steps, 0.7, 0.1, 0.25)))
        << "step " << s;
  }
  // unary, selector, alpha, weight sum, covered weight (0 in the last).
  const float cases[][5] = {{3.5f, 2.25f, 0.6f, 40.f, 12.f},
                            {1.25f, 0.75f, 0.3f, 10.f, 0.f}};
  DeviceBuffer<float> in(5);
  for (const auto &v : cases)
    for (bool covered : {false, true}) {
      in.upload(std::vector<float>(v, v + 5));
      const float *p = in.get();
      const double scale = ref::selectorTermScale(v[2], v[3], v[4], covered);
      poisonAll(out);
      kernels::selector_objective_f32(p, p + 1, p + 2, p + 3, p + 4, covered,
                                      out.get(), 0);
      DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
      // FLOAT_EQ: the device may fuse the multiply-add.
      EXPECT_FLOAT_EQ(out.download()[0],
                      float(double(v[0]) + double(v[1]) * scale))
          << "objective, covered " << covered;
      poisonAll(out);
      kernels::selector_objective_grad_f32(p + 1, p + 2, p + 3, p + 4, covered,
                                           out.get(), 0);
      DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(out.download()[0], float(double(v[1]) * scale))
          << "objective grad, covered " << covered;
    }
}

} // namespace
