//===- LmHeadGpuTest.cu - GEMM wrapper, lm_head + CE ----------------------===//
//
// CublasLtGemm's linear-layer products (bf16 and fp32 outputs, beta = 1
// accumulation, the residual or a bias added in linear's epilogue) against
// ref::linear*, before and after timing picks their
// algorithms (and planners of one process agree on them), and
// lm_head_cross_entropy_bf16 (sums, accuracy, hits, dy) against
// ref::lmHeadCrossEntropy(Grad), over several chunks with a partial last one,
// vector (V % 8 == 0) and scalar vocabularies, every row computed or slot 0 of
// each block left out (the reference computes every row: the skipped rows'
// zeros must come out). With a DFlash2 selector's top-K folded in (topK):
// candidates, values and label values against a double reference of the
// same bf16 logits, exactly where the logits are exact (small integers
// times 1/4: many ties, so the lower-token rule is exercised) and up to the
// logits' rounding otherwise; the loss, hits and dy bit for bit those of the
// same call without the top-K. With a DFlash2 unary transform (a multiplier,
// a softcap, both; docs/semantics.md section 13, "Unary logits"): the sums,
// hits and dy against the reference with that transform, and the top-K's
// values against T of the reference's rounded logits.
//
//===----------------------------------------------------------------------===//

#include "kernels/Gemm.cuh"
#include "kernels/LmHeadCrossEntropy.cuh"
#include "kernels/reference/Reference.h"
#include "test/gpu/GpuTestUtil.h"

#include <algorithm>
#include <cmath>
#include <numeric>

using namespace dflash;
using namespace dflash::gputest;
using bf16 = __nv_bfloat16;

namespace {

struct LtContext {
  cublasLtHandle_t handle;
  DeviceBuffer<char> workspace{32 << 20};
  LtContext() { DFLASH_CUBLAS_CHECK(cublasLtCreate(&handle)); }
  ~LtContext() { cublasLtDestroy(handle); }
};

void gemmCase(int64_t M, int64_t N, int64_t K, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "M=" << M << " N=" << N << " K=" << K);
  std::mt19937_64 rng(seed);
  LtContext lt;
  kernels::CublasLtGemm gemm(lt.handle, lt.workspace.get(),
                             lt.workspace.bytes());
  Bf16Tensor x = randomBf16(M * K, rng), w = randomBf16(N * K, rng);
  Bf16Tensor dy = randomBf16(M * N, rng);

  std::vector<double> refY(M * N), refDx(M * K), refDw(N * K);
  ref::linear(x.values.data(), w.values.data(), refY.data(), M, N, K);
  ref::linearGradInput(dy.values.data(), w.values.data(), refDx.data(), M, N,
                       K);
  ref::linearGradWeight(dy.values.data(), x.values.data(), refDw.data(), M, N,
                        K);

  DeviceBuffer<bf16> y(M * N), dx(M * K), dw(N * K);
  DeviceBuffer<float> dw32(N * K);
  poisonAll(y, dx, dw, dw32);
  gemm.linear(x.ptr(), w.ptr(), y.get(), M, N, K, 0);
  gemm.linearGradInput(dy.ptr(), w.ptr(), dx.get(), M, N, K, 0);
  gemm.linearGradWeight(dy.ptr(), x.ptr(), dw.get(), M, N, K, 0);
  gemm.linearGradWeight(dy.ptr(), x.ptr(), dw32.get(), M, N, K, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_CLOSE(downloadBf16(y), refY, 1e-2, "y");
  EXPECT_CLOSE(downloadBf16(dx), refDx, 1e-2, "dx");
  EXPECT_CLOSE(downloadBf16(dw), refDw, 1e-2, "dw bf16");
  EXPECT_CLOSE(downloadF32(dw32), refDw, 1e-4, "dw fp32");

  // r + x w^T, into another buffer and in place (y = r).
  Bf16Tensor r = randomBf16(M * N, rng);
  std::vector<double> refSum(refY);
  for (size_t i = 0; i < refSum.size(); ++i)
    refSum[i] += r.values[i];
  DeviceBuffer<bf16> sum(M * N);
  poisonAll(sum);
  gemm.linearResidual(x.ptr(), w.ptr(), r.ptr(), sum.get(), M, N, K, 0);
  gemm.linearResidual(x.ptr(), w.ptr(), r.ptr(), r.ptr(), M, N, K, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_CLOSE(downloadBf16(sum), refSum, 1e-2, "r + y");
  EXPECT_CLOSE(bf16ToDoubles(r.dev.download<uint16_t>()), refSum, 1e-2,
               "r + y in place");

  // beta = 1 accumulates a second contribution into the fp32 gradient.
  gemm.linearGradWeight(dy.ptr(), x.ptr(), dw32.get(), M, N, K, 0, 1.f);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> twice(refDw);
  for (auto &v : twice)
    v *= 2;
  EXPECT_CLOSE(downloadF32(dw32), twice, 1e-4, "dw fp32 accumulated");
  // The same shapes again reuse the cached plans (linearResidual shares
  // linear's).
  EXPECT_EQ(gemm.numPlans(), 4u);
  gemm.linear(x.ptr(), w.ptr(), y.get(), M, N, K, 0);
  EXPECT_EQ(gemm.numPlans(), 4u);

  // x w^T + b (the bias epilogue: a plan of its own), twice with different
  // biases through the same plan: the pointer is the call's.
  for (uint64_t round = 0; round < 2; ++round) {
    Bf16Tensor bias = randomBf16(N, rng, 3.0);
    std::vector<double> refBiased(M * N);
    ref::biasedLinear(x.values.data(), w.values.data(), bias.values.data(),
                      refBiased.data(), M, N, K);
    DeviceBuffer<bf16> biased(M * N);
    poisonAll(biased);
    gemm.linearBias(x.ptr(), w.ptr(), bias.ptr(), biased.get(), M, N, K, 0);
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_CLOSE(downloadBf16(biased), refBiased, 1e-2, "y + b");
    // The bias must matter: y alone is well outside the tolerance of y + b.
    EXPECT_GT(relativeError(downloadBf16(y), refBiased), 0.03);
  }
  EXPECT_EQ(gemm.numPlans(), 5u);
}

/// Rows `rows` of y [M, N] = x [M, K] w [N, K]^T in double.
std::vector<double> linearRows(const std::vector<double> &x,
                               const std::vector<double> &w,
                               const std::vector<int64_t> &rows, int64_t N,
                               int64_t K) {
  std::vector<double> out;
  for (int64_t m : rows)
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0;
      for (int64_t k = 0; k < K; ++k)
        sum += x[size_t(m * K + k)] * w[size_t(n * K + k)];
      out.push_back(sum);
    }
  return out;
}

std::vector<double> pickRows(const std::vector<double> &all,
                             const std::vector<int64_t> &rows, int64_t width) {
  std::vector<double> out;
  for (int64_t r : rows)
    out.insert(out.end(), all.begin() + r * width,
               all.begin() + (r + 1) * width);
  return out;
}

/// The kernel's arguments over buffers the caller owns (no top-K, no
/// workspace yet).
kernels::LmHeadCrossEntropyArgs
lmHeadArgs(const Bf16Tensor &y, const Bf16Tensor &w, const int32_t *labels,
           const float *weights, const float *dLossSum, bf16 *dy, uint8_t *hits,
           int64_t rows, int64_t V, int64_t H, int64_t chunkRows,
           int64_t blockSize) {
  kernels::LmHeadCrossEntropyArgs args{};
  args.y = y.ptr();
  args.lmHead = w.ptr();
  args.labels = labels;
  args.weights = weights;
  args.dLossSum = dLossSum;
  args.dy = dy;
  args.hits = hits;
  args.rows = rows;
  args.V = V;
  args.H = H;
  args.chunkRows = chunkRows;
  args.blockSize = blockSize;
  return args;
}

/// A case's labels (the argmax of `logits` [rows, V] on every third row, so
/// that accuracy is tested; random elsewhere) and weights (zeros, the gamma
/// decay's range, and 0 at slot 0 of each block of blockSize >= 2).
struct CaseTargets {
  std::vector<int32_t> labels;
  std::vector<float> weights32;
  std::vector<double> weights; ///< the same, for the reference
};

CaseTargets caseTargets(const std::vector<double> &logits, int64_t rows,
                        int64_t V, int64_t blockSize, std::mt19937_64 &rng) {
  CaseTargets t;
  t.labels.resize(size_t(rows));
  t.weights32.resize(size_t(rows));
  t.weights.resize(size_t(rows));
  std::uniform_int_distribution<int> tok(0, static_cast<int>(V) - 1);
  std::uniform_real_distribution<double> unit(0, 1);
  for (int64_t r = 0; r < rows; ++r) {
    const double *row = logits.data() + r * V;
    t.labels[size_t(r)] =
        r % 3 == 0 ? static_cast<int32_t>(std::max_element(row, row + V) - row)
                   : tok(rng);
    double u = unit(rng);
    t.weights32[size_t(r)] =
        u < 0.25 ? 0.f : static_cast<float>(std::exp(-u * 3));
    if (blockSize >= 2 && r % blockSize == 0) // draft_targets' [k > 0]
      t.weights32[size_t(r)] = 0.f;
    t.weights[size_t(r)] = t.weights32[size_t(r)];
  }
  return t;
}

/// One bf16 ulp at x (the spacing of bf16 values around it).
double bf16Ulp(double x) {
  int e = 0;
  std::frexp(std::max(std::abs(x), 1e-30), &e); // |x| = f 2^e, f in [0.5, 1)
  return std::ldexp(1.0, e - 8);
}

/// What one lm_head_cross_entropy_bf16 call wrote (every output poisoned
/// first).
struct LmHeadOutputs {
  std::vector<float> sums;
  std::vector<uint8_t> hits;
  std::vector<uint16_t> dy;
  std::vector<float> values, labelValues;
  std::vector<int32_t> candidates;
};

LmHeadOutputs runLmHead(kernels::CublasLtGemm &gemm, const Bf16Tensor &y,
                        const Bf16Tensor &w, const std::vector<int32_t> &labels,
                        const std::vector<float> &weights, int64_t rows,
                        int64_t V, int64_t H, int64_t chunkRows,
                        int64_t blockSize, int64_t K, float dLossSum,
                        const ref::UnaryTransform &transform = {}) {
  DeviceBuffer<int32_t> dLabels(rows);
  DeviceBuffer<float> dWeights(rows), dScale(1), sums(4);
  DeviceBuffer<char> workspace(
      kernels::lmHeadCrossEntropyWorkspaceBytes(rows, V, H, blockSize));
  DeviceBuffer<bf16> dy(rows * H);
  DeviceBuffer<uint8_t> hits(rows);
  DeviceBuffer<float> values(std::max<int64_t>(rows * K, 1)), labelValues(rows);
  DeviceBuffer<int32_t> candidates(std::max<int64_t>(rows * K, 1));
  dLabels.upload(labels);
  dWeights.upload(weights);
  dScale.upload(std::vector<float>{dLossSum});
  poisonAll(workspace, dy, hits, values, labelValues);
  // Not 0xFF bytes: -1 is what rows of weight 0 must get.
  candidates.upload(std::vector<int32_t>(candidates.size(), 0x5a5a5a5a));
  kernels::LmHeadCrossEntropyArgs args =
      lmHeadArgs(y, w, dLabels.get(), dWeights.get(), dScale.get(), dy.get(),
                 hits.get(), rows, V, H, chunkRows, blockSize);
  args.multiplier = static_cast<float>(transform.multiplier);
  args.softcap = static_cast<float>(transform.softcap);
  if (K > 0) {
    args.topK = K;
    args.values = values.get();
    args.candidates = candidates.get();
    args.labelValues = labelValues.get();
  }
  kernels::useLmHeadWorkspace(args, workspace.get());
  args.sums = sums.get();
  poisonAll(sums);
  kernels::lm_head_cross_entropy_bf16(gemm, args, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  LmHeadOutputs out;
  out.sums = sums.download();
  out.hits = hits.download();
  out.dy = dy.download<uint16_t>();
  if (K > 0) {
    out.values = values.download();
    out.candidates = candidates.download();
    out.labelValues = labelValues.download();
  }
  return out;
}

/// A call's cross-entropy (sums, hits, dy) against the double reference:
/// bf16 logits (the contract: CE in fp32 from bf16 logits) against exact
/// ones, so the loss agrees to about the logits' rounding, and rounding can
/// flip a near tie.
void expectCrossEntropy(const LmHeadOutputs &got,
                        const ref::CrossEntropySums &ref,
                        const std::vector<uint8_t> &refHits,
                        const std::vector<double> &refDy, int64_t rows,
                        int64_t H, int64_t blockSize) {
  EXPECT_NEAR(got.sums[0], ref.lossSum, 5e-3 * std::abs(ref.lossSum))
      << "loss sum";
  EXPECT_NEAR(got.sums[1], ref.weightSum, 1e-5 * ref.weightSum) << "weight sum";
  EXPECT_EQ(got.sums[3], ref.count) << "count";
  EXPECT_NEAR(got.sums[2], ref.correct, std::max(2.0, 0.02 * ref.count))
      << "correct";
  EXPECT_GT(got.sums[2], 0.2 * ref.count) << "the argmax labels were found";
  // Per row the same: every row written, hits summing to `correct`, and
  // differing from the reference only where the rounding flipped a tie.
  int64_t hitCount = 0, differ = 0;
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_LE(got.hits[size_t(r)], 1) << "row " << r << " not written";
    hitCount += got.hits[size_t(r)];
    differ += got.hits[size_t(r)] != refHits[size_t(r)];
  }
  EXPECT_EQ(double(hitCount), double(got.sums[2])) << "hits and correct";
  EXPECT_LE(double(differ), std::max(2.0, 0.02 * ref.count)) << "hits";
  const std::vector<double> gotDy = bf16ToDoubles(got.dy);
  EXPECT_CLOSE(gotDy, refDy, 2e-2, "dy");
  if (blockSize >= 2) {
    int64_t nonzero = 0;
    for (int64_t r = 0; r < rows; r += blockSize)
      for (int64_t h = 0; h < H; ++h)
        nonzero += gotDy[size_t(r * H + h)] != 0.0;
    EXPECT_EQ(nonzero, 0) << "dy at slot 0 of the blocks";
  }
}

void lmHeadCase(int64_t rows, int64_t V, int64_t H, int64_t chunkRows,
                int64_t blockSize, uint64_t seed) {
  SCOPED_TRACE(testing::Message()
               << "rows=" << rows << " V=" << V << " H=" << H
               << " chunk=" << chunkRows << " blockSize=" << blockSize);
  std::mt19937_64 rng(seed);
  LtContext lt;
  kernels::CublasLtGemm gemm(lt.handle, lt.workspace.get(),
                             lt.workspace.bytes());
  Bf16Tensor y = randomBf16(rows * H, rng, 1.0);
  Bf16Tensor w = randomBf16(V * H, rng, 0.2);
  std::vector<double> logits(rows * V);
  ref::linear(y.values.data(), w.values.data(), logits.data(), rows, V, H);
  const CaseTargets t = caseTargets(logits, rows, V, blockSize, rng);
  const double dLossSum = 0.37;
  std::vector<uint8_t> refHits(rows);
  ref::CrossEntropySums ref =
      ref::lmHeadCrossEntropy(y.values.data(), w.values.data(), t.labels.data(),
                              t.weights.data(), rows, V, H, refHits.data());
  std::vector<double> refDy(rows * H);
  ref::lmHeadCrossEntropyGrad(y.values.data(), w.values.data(), t.labels.data(),
                              t.weights.data(), dLossSum, refDy.data(), rows, V,
                              H);
  expectCrossEntropy(runLmHead(gemm, y, w, t.labels, t.weights32, rows, V, H,
                               chunkRows, blockSize, 0,
                               static_cast<float>(dLossSum)),
                     ref, refHits, refDy, rows, H, blockSize);
}

/// The top K of a DFlash2 selector (selector_candidates with the identity
/// transform) from the kernel's logits. `exact`: y in {-1, 0, 1} and
/// lm_head in {-1/4, 0, 1/4}, so every logit is a multiple of 1/4 the GEMM
/// computes exactly and bf16 holds (H <= 256), with many ties; otherwise
/// normal values, whose bf16 logits may differ by one ulp from the rounded
/// exact ones.
void lmHeadTopKCase(int64_t rows, int64_t V, int64_t H, int64_t chunkRows,
                    int64_t blockSize, int64_t K, bool exact, uint64_t seed) {
  SCOPED_TRACE(testing::Message()
               << "rows=" << rows << " V=" << V << " H=" << H
               << " chunk=" << chunkRows << " blockSize=" << blockSize
               << " K=" << K << (exact ? " exact" : " random"));
  std::mt19937_64 rng(seed);
  LtContext lt;
  kernels::CublasLtGemm gemm(lt.handle, lt.workspace.get(),
                             lt.workspace.bytes());
  auto make = [&](int64_t n, double scale) {
    if (!exact)
      return randomBf16(size_t(n), rng, scale);
    Bf16Tensor t{size_t(n)};
    std::uniform_int_distribution<int> three(-1, 1);
    for (size_t i = 0; i < t.values.size(); ++i)
      t.set(i, static_cast<float>(scale * three(rng)));
    t.upload();
    return t;
  };
  Bf16Tensor y = make(rows * H, 1.0);
  Bf16Tensor w = make(V * H, exact ? 0.25 : 0.2);
  // The bf16 logits the kernel should see, as the reference rounds them.
  std::vector<double> logits(rows * V);
  ref::linear(y.values.data(), w.values.data(), logits.data(), rows, V, H);
  for (double &z : logits)
    z = roundBf16(z);
  const CaseTargets targets = caseTargets(logits, rows, V, blockSize, rng);
  const std::vector<int32_t> &labels = targets.labels;
  const std::vector<float> &weights = targets.weights32;
  const float dLossSum = 0.37f;
  LmHeadOutputs plain = runLmHead(gemm, y, w, labels, weights, rows, V, H,
                                  chunkRows, blockSize, 0, dLossSum);
  LmHeadOutputs top = runLmHead(gemm, y, w, labels, weights, rows, V, H,
                                chunkRows, blockSize, K, dLossSum);
  // The cross-entropy is untouched by the top-K.
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(top.sums[size_t(i)], plain.sums[size_t(i)]) << "sum " << i;
  EXPECT_EQ(top.hits, plain.hits) << "hits";
  EXPECT_TRUE(top.dy == plain.dy) << "dy";

  auto before = [](double v, int64_t i, double u, int64_t j) {
    return v > u || (v == u && i < j);
  };
  int64_t checkedRows = 0;
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int64_t r = 0; r < rows; ++r) {
    SCOPED_TRACE(testing::Message() << "row " << r);
    const float *gotV = top.values.data() + r * K;
    const int32_t *gotC = top.candidates.data() + r * K;
    if (weights[size_t(r)] == 0.f) { // weight 0, slot 0 among them
      for (int64_t j = 0; j < K; ++j) {
        ASSERT_EQ(gotC[j], -1) << "candidate " << j;
        ASSERT_EQ(gotV[j], 0.f) << "value " << j;
      }
      ASSERT_EQ(top.labelValues[size_t(r)], 0.f) << "label value";
      continue;
    }
    ++checkedRows;
    const double *z = logits.data() + r * V;
    // The reference's order of the rounded logits: the top K + 1.
    std::iota(order.begin(), order.end(), 0);
    const int64_t n = std::min(K + 1, V);
    std::partial_sort(
        order.begin(), order.begin() + n, order.end(),
        [&](int32_t a, int32_t b) { return before(z[a], a, z[b], b); });
    // The label's logit, and each candidate's value, to the logits'
    // rounding (exactly when the logits are exact).
    const double tol = exact ? 0.0 : 1.0;
    const double zl = z[labels[size_t(r)]];
    ASSERT_LE(std::abs(top.labelValues[size_t(r)] - zl), tol * bf16Ulp(zl))
        << "label value";
    for (int64_t j = 0; j < K; ++j) {
      ASSERT_GE(gotC[j], 0) << "candidate " << j;
      ASSERT_LT(gotC[j], V) << "candidate " << j;
      const double zc = z[gotC[j]];
      ASSERT_LE(std::abs(gotV[j] - zc), tol * bf16Ulp(zc)) << "value " << j;
      if (j > 0) // descending, ties the lower token first: also distinct
        ASSERT_TRUE(before(gotV[j - 1], gotC[j - 1], gotV[j], gotC[j]))
            << "candidates " << j - 1 << " and " << j << " out of order";
    }
    if (exact) {
      for (int64_t j = 0; j < K; ++j)
        ASSERT_EQ(gotC[j], order[size_t(j)]) << "candidate " << j;
      continue;
    }
    // Rounded differently by one ulp, logits two ulps apart keep their
    // order. Nothing left out stands more than that above the K-th: the
    // first token of the reference's order that the kernel left out.
    const int64_t last = gotC[K - 1];
    std::vector<int32_t> gotSet(gotC, gotC + K);
    std::sort(gotSet.begin(), gotSet.end());
    if (K < V)
      for (int64_t j = 0; j <= K; ++j)
        if (!std::binary_search(gotSet.begin(), gotSet.end(),
                                order[size_t(j)])) {
          const double zo = z[order[size_t(j)]];
          ASSERT_LE(zo, z[last] + 2 * std::max(bf16Ulp(zo), bf16Ulp(z[last])))
              << "token " << order[size_t(j)] << " left out";
          break;
        }
    // Where the K-th and the next stand apart, the set is the reference's,
    // and so is each place whose neighbours stand apart from it.
    auto apart = [&](int64_t a, int64_t b) {
      const double za = z[order[size_t(a)]], zb = z[order[size_t(b)]];
      return za - zb >= 2 * bf16Ulp(za);
    };
    if (K < V && !apart(K - 1, K))
      continue;
    std::vector<int32_t> refSet(order.begin(), order.begin() + K);
    std::sort(refSet.begin(), refSet.end());
    ASSERT_EQ(gotSet, refSet) << "the top-K set";
    for (int64_t j = 0; j < K; ++j)
      if ((j == 0 || apart(j - 1, j)) && (j + 1 == K || apart(j, j + 1)))
        ASSERT_EQ(gotC[j], order[size_t(j)]) << "candidate " << j;
  }
  EXPECT_GT(checkedRows, 0) << "rows with a weight";
}

/// The kernel with a unary transform `t`, without and with a top-K of `K`
/// (0: without only): the sums, hits and dy against the double reference
/// with `t` at lmHeadCase's tolerances; the top-K call's cross-entropy bit
/// for bit the plain call's; its values and label values within T's slope
/// times a bf16 ulp of T of the reference's rounded logits, descending,
/// nothing left out above the K-th. The logits are normal with standard
/// deviation `logitStd`, so that `t` changes the loss well beyond its
/// tolerance (checked against the identity's reference).
void lmHeadUnaryCase(int64_t rows, int64_t V, int64_t H, int64_t chunkRows,
                     int64_t blockSize, int64_t K, ref::UnaryTransform t,
                     double logitStd, uint64_t seed) {
  SCOPED_TRACE(testing::Message()
               << "rows=" << rows << " V=" << V << " H=" << H << " chunk="
               << chunkRows << " blockSize=" << blockSize << " K=" << K
               << " multiplier=" << t.multiplier << " softcap=" << t.softcap);
  std::mt19937_64 rng(seed);
  LtContext lt;
  kernels::CublasLtGemm gemm(lt.handle, lt.workspace.get(),
                             lt.workspace.bytes());
  Bf16Tensor y = randomBf16(rows * H, rng, 1.0);
  Bf16Tensor w = randomBf16(V * H, rng, logitStd / std::sqrt(double(H)));
  // The logits as the kernel's GEMM rounds them, and their transform.
  std::vector<double> z(rows * V), u(rows * V);
  ref::linear(y.values.data(), w.values.data(), z.data(), rows, V, H);
  for (double &v : z)
    v = roundBf16(v);
  ref::unaryTransform(z.data(), u.data(), rows * V, t);
  const CaseTargets targets = caseTargets(z, rows, V, blockSize, rng);
  const std::vector<int32_t> &labels = targets.labels;
  const std::vector<double> &weights = targets.weights;
  const std::vector<float> &weights32 = targets.weights32;
  const double dLossSum = 0.37;
  std::vector<uint8_t> refHits(rows);
  const ref::CrossEntropySums ref =
      ref::lmHeadCrossEntropy(y.values.data(), w.values.data(), labels.data(),
                              weights.data(), rows, V, H, refHits.data(), t);
  std::vector<double> refDy(rows * H);
  ref::lmHeadCrossEntropyGrad(y.values.data(), w.values.data(), labels.data(),
                              weights.data(), dLossSum, refDy.data(), rows, V,
                              H, t);
  // The transform matters here: a kernel that left it out would fail.
  const ref::CrossEntropySums identity =
      ref::lmHeadCrossEntropy(y.values.data(), w.values.data(), labels.data(),
                              weights.data(), rows, V, H);
  ASSERT_GT(std::abs(identity.lossSum - ref.lossSum),
            5 * 5e-3 * std::abs(ref.lossSum))
      << "the transform barely changes the loss";

  LmHeadOutputs plain =
      runLmHead(gemm, y, w, labels, weights32, rows, V, H, chunkRows, blockSize,
                0, static_cast<float>(dLossSum), t);
  expectCrossEntropy(plain, ref, refHits, refDy, rows, H, blockSize);
  if (K == 0)
    return;

  LmHeadOutputs top =
      runLmHead(gemm, y, w, labels, weights32, rows, V, H, chunkRows, blockSize,
                K, static_cast<float>(dLossSum), t);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(top.sums[size_t(i)], plain.sums[size_t(i)]) << "sum " << i;
  EXPECT_EQ(top.hits, plain.hits) << "hits";
  EXPECT_TRUE(top.dy == plain.dy) << "dy";
  // T of a logit one bf16 ulp off, and tanhf's fp32 error.
  auto tol = [&](int64_t at) {
    return t.multiplier * bf16Ulp(z[size_t(at)]) +
           1e-5 * std::max(1.0, std::abs(u[size_t(at)]));
  };
  int64_t checkedRows = 0;
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int64_t r = 0; r < rows; ++r) {
    SCOPED_TRACE(testing::Message() << "row " << r);
    const float *gotV = top.values.data() + r * K;
    const int32_t *gotC = top.candidates.data() + r * K;
    if (weights32[size_t(r)] == 0.f) {
      for (int64_t j = 0; j < K; ++j) {
        ASSERT_EQ(gotC[j], -1) << "candidate " << j;
        ASSERT_EQ(gotV[j], 0.f) << "value " << j;
      }
      ASSERT_EQ(top.labelValues[size_t(r)], 0.f) << "label value";
      continue;
    }
    ++checkedRows;
    const int64_t label = r * V + labels[size_t(r)];
    ASSERT_LE(std::abs(top.labelValues[size_t(r)] - u[size_t(label)]),
              tol(label))
        << "label value";
    for (int64_t j = 0; j < K; ++j) {
      ASSERT_GE(gotC[j], 0) << "candidate " << j;
      ASSERT_LT(gotC[j], V) << "candidate " << j;
      const int64_t at = r * V + gotC[j];
      ASSERT_LE(std::abs(gotV[j] - u[size_t(at)]), tol(at)) << "value " << j;
      if (j > 0) // descending, ties the lower token first: also distinct
        ASSERT_TRUE(gotV[j - 1] > gotV[j] ||
                    (gotV[j - 1] == gotV[j] && gotC[j - 1] < gotC[j]))
            << "candidates " << j - 1 << " and " << j << " out of order";
    }
    // Nothing the kernel left out stands above its K-th by more than the
    // two roundings: the first token of the reference's order missing.
    const double *uRow = u.data() + r * V;
    std::iota(order.begin(), order.end(), 0);
    const int64_t n = std::min(K + 1, V);
    std::partial_sort(order.begin(), order.begin() + n, order.end(),
                      [&](int32_t a, int32_t b) {
                        return uRow[a] > uRow[b] ||
                               (uRow[a] == uRow[b] && a < b);
                      });
    std::vector<int32_t> gotSet(gotC, gotC + K);
    std::sort(gotSet.begin(), gotSet.end());
    for (int64_t j = 0; j < n; ++j)
      if (!std::binary_search(gotSet.begin(), gotSet.end(), order[size_t(j)])) {
        const int64_t at = r * V + order[size_t(j)];
        ASSERT_LE(u[size_t(at)], gotV[K - 1] + 2 * tol(at))
            << "token " << order[size_t(j)] << " left out";
        break;
      }
  }
  EXPECT_GT(checkedRows, 0) << "rows with a weight";
}

} // namespace

TEST(CublasLtGemm, LinearProducts) {
  gemmCase(77, 200, 136, 1);
  gemmCase(256, 512, 1024, 2);
}

// A shape large enough to be timed (over kGemmTimingMinFlops): the products
// are right with the heuristic's first algorithm and with the ones timing
// chose; a second planner adopts the first's choices without timing; with
// timing off, or below the size, nothing is timed.
TEST(CublasLtGemm, TimedAlgorithmsComputeTheSameProducts) {
  const int64_t M = 4096, N = 512, K = 2560; // 1.07e10 FLOPs each
  static_assert(2.0 * 4096 * 512 * 2560 >= kernels::kGemmTimingMinFlops);
  std::mt19937_64 rng(91);
  LtContext lt;
  Bf16Tensor x = randomBf16(M * K, rng), w = randomBf16(N * K, rng);
  Bf16Tensor dy = randomBf16(M * N, rng);
  // Sampled rows of each product (the whole reference would take seconds).
  const std::vector<int64_t> yRows = {0, 1, 777, 2048, 4095};
  const std::vector<int64_t> dwRows = {0, 3, 300, 511};
  std::vector<double> refY = linearRows(x.values, w.values, yRows, N, K);
  // dx [M, K] = dy [M, N] w [N, K]: rows of dy times w^T as a [K, N] matrix.
  std::vector<double> wT(size_t(K * N)), dyT(size_t(N * M)), xT(size_t(K * M));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      wT[size_t(k * N + n)] = w.values[size_t(n * K + k)];
  std::vector<double> refDx = linearRows(dy.values, wT, yRows, K, N);
  // dw [N, K] = dy^T x: rows of dy^T [N, M] times x^T as a [K, M] matrix.
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n)
      dyT[size_t(n * M + m)] = dy.values[size_t(m * N + n)];
    for (int64_t k = 0; k < K; ++k)
      xT[size_t(k * M + m)] = x.values[size_t(m * K + k)];
  }
  std::vector<double> refDw = linearRows(dyT, xT, dwRows, K, M);

  DeviceBuffer<bf16> y(M * N), dx(M * K);
  DeviceBuffer<float> dw(N * K);
  auto runAndCheck = [&](kernels::CublasLtGemm &gemm, const char *when) {
    SCOPED_TRACE(when);
    poisonAll(y, dx, dw);
    gemm.linear(x.ptr(), w.ptr(), y.get(), M, N, K, 0);
    gemm.linearGradInput(dy.ptr(), w.ptr(), dx.get(), M, N, K, 0);
    gemm.linearGradWeight(dy.ptr(), x.ptr(), dw.get(), M, N, K, 0);
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_CLOSE(pickRows(downloadBf16(y), yRows, N), refY, 1e-2, "y");
    EXPECT_CLOSE(pickRows(downloadBf16(dx), yRows, K), refDx, 1e-2, "dx");
    EXPECT_CLOSE(pickRows(downloadF32(dw), dwRows, K), refDw, 1e-4, "dw");
  };

  kernels::CublasLtGemm first(lt.handle, lt.workspace.get(),
                              lt.workspace.bytes());
  runAndCheck(first, "the heuristic's first algorithms");
  EXPECT_EQ(first.untimedPlans(), 3u);
  first.timeCandidates(0);
  EXPECT_EQ(first.untimedPlans(), 0u);
  EXPECT_EQ(first.timingSummary().timed, 3);
  ASSERT_EQ(first.timings().size(), 3u);
  for (const kernels::GemmCandidateTimes &t : first.timings()) {
    SCOPED_TRACE(t.shape);
    ASSERT_GE(t.ms.size(), 2u);
    EXPECT_GT(t.ms[size_t(t.chosen)], 0.f) << "the chosen one ran";
  }
  runAndCheck(first, "the timed algorithms");

  kernels::CublasLtGemm second(lt.handle, lt.workspace.get(),
                               lt.workspace.bytes());
  runAndCheck(second, "a second planner, before it agrees");
  second.timeCandidates(0);
  EXPECT_EQ(second.timingSummary().timed, 0);
  EXPECT_EQ(second.timingSummary().agreed, 3);
  EXPECT_EQ(second.timingSummary().faster, first.timingSummary().faster);
  runAndCheck(second, "the second planner's adopted algorithms");

  kernels::CublasLtGemm untimed(lt.handle, lt.workspace.get(),
                                lt.workspace.bytes());
  untimed.setTiming(false);
  runAndCheck(untimed, "timing off");
  EXPECT_EQ(untimed.untimedPlans(), 0u);
  EXPECT_EQ(untimed.timeCandidates(0), 0);
  EXPECT_EQ(untimed.timingSummary().timed + untimed.timingSummary().agreed, 0);

  // Below the size nothing waits to be timed.
  kernels::CublasLtGemm small(lt.handle, lt.workspace.get(),
                              lt.workspace.bytes());
  small.linear(x.ptr(), w.ptr(), y.get(), 256, 256, 256, 0);
  EXPECT_EQ(small.untimedPlans(), 0u);
}

TEST(LmHeadCrossEntropy, ChunkedVectorVocab) {
  lmHeadCase(300, 4000, 128, 128, 0, 3); // 3 chunks, the last partial
}

TEST(LmHeadCrossEntropy, ScalarVocab) { lmHeadCase(70, 1003, 64, 64, 0, 4); }

// Slot 0 of each block of 16 left out: 300 of 320 rows computed in chunks of
// 128 (the last partial, chunk ends inside blocks); blocks of 2 keep half.
TEST(LmHeadCrossEntropy, SkipsSlotZeroOfBlocks) {
  lmHeadCase(320, 4000, 128, 128, 16, 5);
  lmHeadCase(96, 1003, 64, 32, 2, 6); // 48 computed rows: 32 + 16
}

// A DFlash2 selector's top-K folded into the kernel: exact logits with many
// ties (every candidate checked), then random ones, over chunks, vector and
// scalar vocabularies (1003), with and without skipped slot-0 rows; K 1, 16
// and the most, 64.
TEST(LmHeadCrossEntropy, TopKExactLogits) {
  lmHeadTopKCase(300, 4000, 64, 128, 0, 16, true, 11);
  lmHeadTopKCase(70, 1003, 64, 64, 0, 1, true, 12);
  lmHeadTopKCase(96, 1003, 64, 32, 2, 64, true, 13);
  lmHeadTopKCase(320, 4000, 64, 128, 16, 64, true, 14);
}

TEST(LmHeadCrossEntropy, TopKRandomLogits) {
  lmHeadTopKCase(300, 4000, 128, 128, 0, 16, false, 15);
  lmHeadTopKCase(70, 1003, 64, 64, 0, 1, false, 16);
  lmHeadTopKCase(320, 4000, 128, 128, 16, 64, false, 17);
  lmHeadTopKCase(64, 1003, 64, 32, 4, 16, false, 18);
}

// Qwen3.5's 248320-wide vocabulary at a few rows: two blocks of 4 (six rows
// computed, in chunks of 4).
TEST(LmHeadCrossEntropy, TopKWideVocab) {
  lmHeadTopKCase(8, 248320, 64, 4, 4, 64, true, 19);
  lmHeadTopKCase(8, 248320, 64, 4, 4, 16, false, 20);
  lmHeadTopKCase(6, 248320, 64, 6, 0, 1, false, 21);
}

// A DFlash2 drafter's unary transform (CE_u, docs/semantics.md section 13):
// a multiplier alone, a softcap alone at the published default 30 (logits of
// standard deviation 6: the top ones bend), and both with a small softcap
// that saturates many logits; with and without the folded top-K, vector and
// scalar (1003) vocabularies, every row computed and slot 0 of blocks left
// out.
TEST(LmHeadCrossEntropy, UnaryTransformMultiplier) {
  const ref::UnaryTransform t{1.5, 0.0};
  lmHeadUnaryCase(300, 4000, 128, 128, 0, 16, t, 2.0, 31);
  lmHeadUnaryCase(96, 1003, 64, 32, 2, 64, t, 2.0, 32);
}

TEST(LmHeadCrossEntropy, UnaryTransformSoftcap) {
  const ref::UnaryTransform t{1.0, 30.0};
  lmHeadUnaryCase(320, 4000, 128, 128, 16, 0, t, 6.0, 33);
  lmHeadUnaryCase(70, 1003, 64, 64, 0, 16, t, 6.0, 34);
}

TEST(LmHeadCrossEntropy, UnaryTransformMultiplierAndSoftcap) {
  const ref::UnaryTransform t{2.0, 4.0};
  lmHeadUnaryCase(320, 4000, 128, 128, 16, 64, t, 2.5, 35);
  lmHeadUnaryCase(64, 1003, 64, 32, 4, 1, t, 2.5, 36);
  lmHeadUnaryCase(300, 4000, 128, 128, 0, 0, t, 2.5, 37);
}
