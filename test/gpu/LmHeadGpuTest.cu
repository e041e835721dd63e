//===- LmHeadGpuTest.cu - GEMM wrapper, lm_head + CE ----------------------===//
//
// CublasLtGemm's three linear-layer products (bf16 and fp32 outputs, beta = 1
// accumulation) against ref::linear*, and lm_head_cross_entropy_bf16 (sums,
// accuracy, hits, dy) against ref::lmHeadCrossEntropy(Grad), over several
// chunks with a partial last one, vector (V % 8 == 0) and scalar
// vocabularies, every row computed or slot 0 of each block left out (the
// reference computes every row: the skipped rows' zeros must come out).
//
//===----------------------------------------------------------------------===//

#include "kernels/Gemm.cuh"
#include "kernels/LmHeadCrossEntropy.cuh"
#include "kernels/reference/Reference.h"
#include "test/gpu/GpuTestUtil.h"

#include <algorithm>

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

  // beta = 1 accumulates a second contribution into the fp32 gradient.
  gemm.linearGradWeight(dy.ptr(), x.ptr(), dw32.get(), M, N, K, 0, 1.f);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> twice(refDw);
  for (auto &v : twice)
    v *= 2;
  EXPECT_CLOSE(downloadF32(dw32), twice, 1e-4, "dw fp32 accumulated");
  // The same shapes again reuse the cached plans.
  EXPECT_EQ(gemm.numPlans(), 4u);
  gemm.linear(x.ptr(), w.ptr(), y.get(), M, N, K, 0);
  EXPECT_EQ(gemm.numPlans(), 4u);
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

  // Labels: the true argmax on every third row (so accuracy is tested),
  // random elsewhere; weights with zeros and the gamma decay's range.
  std::vector<double> logits(rows * V);
  ref::linear(y.values.data(), w.values.data(), logits.data(), rows, V, H);
  std::vector<int32_t> labels(rows);
  std::vector<double> weights(rows);
  std::vector<float> weights32(rows);
  std::uniform_int_distribution<int> tok(0, static_cast<int>(V) - 1);
  std::uniform_real_distribution<double> unit(0, 1);
  for (int64_t r = 0; r < rows; ++r) {
    const double *row = logits.data() + r * V;
    labels[r] = r % 3 == 0
                    ? static_cast<int32_t>(std::max_element(row, row + V) - row)
                    : tok(rng);
    double u = unit(rng);
    weights32[r] = u < 0.25 ? 0.f : static_cast<float>(std::exp(-u * 3));
    if (blockSize >= 2 && r % blockSize == 0) // draft_targets' [k > 0]
      weights32[r] = 0.f;
    weights[r] = weights32[r];
  }
  const double dLossSum = 0.37;
  std::vector<uint8_t> refHits(rows);
  ref::CrossEntropySums ref =
      ref::lmHeadCrossEntropy(y.values.data(), w.values.data(), labels.data(),
                              weights.data(), rows, V, H, refHits.data());
  std::vector<double> refDy(rows * H);
  ref::lmHeadCrossEntropyGrad(y.values.data(), w.values.data(), labels.data(),
                              weights.data(), dLossSum, refDy.data(), rows, V,
                              H);

  DeviceBuffer<int32_t> dLabels(rows);
  DeviceBuffer<float> dWeights(rows), dScale(1);
  DeviceBuffer<char> workspace(
      kernels::lmHeadCrossEntropyWorkspaceBytes(rows, V, H, blockSize));
  DeviceBuffer<bf16> dy(rows * H);
  DeviceBuffer<uint8_t> hits(rows);
  std::vector<uint8_t> poison(rows, 0x5a);
  hits.upload(poison);
  dLabels.upload(labels);
  dWeights.upload(weights32);
  std::vector<float> scale{static_cast<float>(dLossSum)};
  dScale.upload(scale);
  poisonAll(workspace, dy);
  kernels::LmHeadCrossEntropyArgs args{};
  args.y = y.ptr();
  args.lmHead = w.ptr();
  args.labels = dLabels.get();
  args.weights = dWeights.get();
  args.dLossSum = dScale.get();
  args.dy = dy.get();
  args.hits = hits.get();
  args.rows = rows;
  args.V = V;
  args.H = H;
  args.chunkRows = chunkRows;
  args.blockSize = blockSize;
  kernels::useLmHeadWorkspace(args, workspace.get());
  DeviceBuffer<float> sums(4);
  args.sums = sums.get(); // poisoned on its own: read back below
  poisonAll(sums);
  kernels::lm_head_cross_entropy_bf16(gemm, args, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got = sums.download();
  // bf16 logits (the contract: CE in fp32 from bf16 logits) against exact
  // ones: the loss agrees to about the logits' rounding.
  EXPECT_NEAR(got[0], ref.lossSum, 5e-3 * std::abs(ref.lossSum)) << "loss sum";
  EXPECT_NEAR(got[1], ref.weightSum, 1e-5 * ref.weightSum) << "weight sum";
  EXPECT_EQ(got[3], ref.count) << "count";
  // Rounding the logits can flip a near tie.
  EXPECT_NEAR(got[2], ref.correct, std::max(2.0, 0.02 * ref.count))
      << "correct";
  EXPECT_GT(got[2], 0.2 * ref.count) << "the argmax labels were found";
  // Per row the same: every row written, hits summing to `correct`, and
  // differing from the reference only where the rounding flipped a tie.
  std::vector<uint8_t> gotHits = hits.download();
  int64_t hitCount = 0, differ = 0;
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_LE(gotHits[size_t(r)], 1) << "row " << r << " not written";
    hitCount += gotHits[size_t(r)];
    differ += gotHits[size_t(r)] != refHits[size_t(r)];
  }
  EXPECT_EQ(double(hitCount), double(got[2])) << "hits and correct";
  EXPECT_LE(double(differ), std::max(2.0, 0.02 * ref.count)) << "hits";
  std::vector<double> gotDy = downloadBf16(dy);
  EXPECT_CLOSE(gotDy, refDy, 2e-2, "dy");
  if (blockSize >= 2) {
    int64_t nonzero = 0;
    for (int64_t r = 0; r < rows; r += blockSize)
      for (int64_t h = 0; h < H; ++h)
        nonzero += gotDy[size_t(r * H + h)] != 0.0;
    EXPECT_EQ(nonzero, 0) << "dy at slot 0 of the blocks";
  }
}

} // namespace

TEST(CublasLtGemm, LinearProducts) {
  gemmCase(77, 200, 136, 1);
  gemmCase(256, 512, 1024, 2);
}

TEST(LmHeadCrossEntropy, ChunkedVectorVocab) {
  lmHeadCase(300, 4000, 128, 128, 0, 3); // 3 chunks, the last partial
}

TEST(LmHeadCrossEntropy, ScalarVocab) { lmHeadCase(70, 1003, 64, 64, 0, 4); }

// Slot 0 of each block of 16 left out: 300 of 320 rows computed in chunks of
// 128 (the last partial, chunk ends inside blocks); blocks of 2 keep half.
TEST(LmHeadCrossEntropy, SkipsSlotZeroOfBlocks) {
  lmHeadCase(320, 4000, 128, 128, 16, 5);
  lmHeadCase(96, 1003, 64, 64, 2, 6);
}
