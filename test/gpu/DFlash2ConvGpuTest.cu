//===- DFlash2ConvGpuTest.cu - The DFlash2 convolution on the GPU ---------===//
//
// kernels/DFlash2Conv.cuh against kernels/reference/DFlash2.cpp (double) on
// the same bf16-rounded random inputs: the forward and all three gradients
// at the published drafter's per-layer shape, every tap count, groups of 8
// to 32 (and H not a whole CTA of vectors), blocks of 2 to 16, more draft
// blocks than the gradient has partials, both halves of D, a [kc, H] and a
// [2, kc, H] base. The half of delta_grad (and the row of a whole base_grad)
// that the convolution does not read must be exactly 0; base_grad must be
// the same bits run after run; both timed at the published shape and a
// training step's rows (GroupedConv.PublishedShapeThroughput prints the
// bandwidth). Then the embedding kernels with a DFlash2 drafter's
// input_embedding_scale, and without one an exact copy. Outputs are poisoned
// (NaN) before each launch.
//
//===----------------------------------------------------------------------===//

#include "kernels/DFlash2Conv.cuh"
#include "kernels/DraftBlocks.cuh"
#include "kernels/Embedding.cuh"
#include "kernels/reference/DFlash2.h"
#include "kernels/reference/Reference.h"
#include "test/gpu/GpuTestUtil.h"

#include <algorithm>

using namespace dflash;
using namespace dflash::gputest;
using bf16 = __nv_bfloat16;

namespace {

struct ConvCase {
  int64_t B, N, bs, H, kc, gs, half;
  bool wholeBase;
  uint64_t seed;
};

/// The worst ||got - want|| / ||want|| over rows of `width`: an error
/// confined to some slots (a tap read across a block boundary, a slot
/// whose dx was never flushed) shows there even when the whole is close.
double worstRow(const std::vector<double> &got, const std::vector<double> &want,
                int64_t width) {
  double worst = 0;
  for (size_t r = 0; r + size_t(width) <= want.size(); r += size_t(width))
    worst = std::max(
        worst,
        relativeError(std::vector<double>(got.begin() + r,
                                          got.begin() + r + size_t(width)),
                      std::vector<double>(want.begin() + r,
                                          want.begin() + r + size_t(width))));
  return worst;
}

/// The outputs of both kernels for one case, downloaded.
struct ConvOutputs {
  std::vector<double> y, dx, dDelta, dBase;
};

void convCase(const ConvCase &c) {
  SCOPED_TRACE(testing::Message()
               << "B=" << c.B << " N=" << c.N << " bs=" << c.bs << " H=" << c.H
               << " kc=" << c.kc << " gs=" << c.gs << " half=" << c.half
               << (c.wholeBase ? " base [2, kc, H]" : " base [kc, H]"));
  const int64_t Q = c.N * c.bs, G = c.H / c.gs, D = 2 * c.kc * G;
  const int64_t rows = c.B * Q, baseRow = c.kc * c.H;
  const int64_t baseSize = (c.wholeBase ? 2 : 1) * baseRow;
  std::mt19937_64 rng(c.seed);
  Bf16Tensor x = randomBf16(size_t(rows * c.H), rng),
             delta = randomBf16(size_t(rows * D), rng, 0.5),
             base = randomBf16(size_t(baseSize), rng, 0.5, 0.25),
             dy = randomBf16(size_t(rows * c.H), rng);
  DeviceBuffer<bf16> y(static_cast<size_t>(rows * c.H)),
      dx(static_cast<size_t>(rows * c.H)),
      dDelta(static_cast<size_t>(rows * D)),
      dBase(static_cast<size_t>(baseSize));
  const kernels::GroupedConvShape shape{c.B,  Q,    c.H,    c.bs,
                                        c.kc, c.gs, c.half, c.wholeBase};
  DeviceBuffer<float> workspace(
      kernels::groupedConvGradWorkspaceBytes(shape.blocks(), c.kc, c.H) /
      sizeof(float));
  poisonAll(y, dx, dDelta, dBase, workspace);
  kernels::grouped_conv_bf16(x.ptr(), delta.ptr(), base.ptr(), y.get(), shape,
                             0);
  kernels::grouped_conv_grad_bf16(dy.ptr(), x.ptr(), delta.ptr(), base.ptr(),
                                  dx.get(), dDelta.get(), dBase.get(),
                                  workspace.get(), shape, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  ConvOutputs got{downloadBf16(y), downloadBf16(dx), downloadBf16(dDelta),
                  downloadBf16(dBase)};

  // The reference reads one half of D at its slot stride and one row of a
  // whole base, as the interpreter calls it.
  ref::GroupedConvShape rs{c.B, c.N, c.bs, c.H, c.kc, c.gs, D};
  const int64_t deltaAt = c.half * c.kc * G;
  const int64_t baseAt = c.wholeBase ? c.half * baseRow : 0;
  ConvOutputs want{std::vector<double>(size_t(rows * c.H)),
                   std::vector<double>(size_t(rows * c.H)),
                   std::vector<double>(size_t(rows * D), 0.0),
                   std::vector<double>(size_t(baseSize), 0.0)};
  ref::groupedConv<double>(x.values.data(), delta.values.data() + deltaAt,
                           base.values.data() + baseAt, want.y.data(), rs);
  ref::groupedConvGrad<double>(
      dy.values.data(), x.values.data(), delta.values.data() + deltaAt,
      base.values.data() + baseAt, want.dx.data(), want.dDelta.data() + deltaAt,
      want.dBase.data() + baseAt, rs);

  EXPECT_CLOSE(got.y, want.y, 1e-2, "result");
  EXPECT_CLOSE(got.dx, want.dx, 1e-2, "input_grad");
  EXPECT_CLOSE(got.dDelta, want.dDelta, 1e-2, "delta_grad");
  EXPECT_CLOSE(got.dBase, want.dBase, 1e-2, "base_grad");
  EXPECT_LE(worstRow(got.y, want.y, c.H), 2e-2) << "worst slot of result";
  EXPECT_LE(worstRow(got.dx, want.dx, c.H), 2e-2) << "worst slot of input_grad";
  EXPECT_LE(worstRow(got.dDelta, want.dDelta, D), 2e-2)
      << "worst slot of delta_grad";
  // The other half of delta_grad is exactly 0 (not NaN: it was poisoned),
  // and so is the other row of a whole base_grad.
  int64_t nonzero = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < c.kc * G; ++i)
      nonzero += got.dDelta[size_t(r * D + (1 - c.half) * c.kc * G + i)] != 0.0;
  EXPECT_EQ(nonzero, 0) << "entries of the other half of delta_grad not 0";
  if (c.wholeBase) {
    nonzero = 0;
    for (int64_t i = 0; i < baseRow; ++i)
      nonzero += got.dBase[size_t((1 - c.half) * baseRow + i)] != 0.0;
    EXPECT_EQ(nonzero, 0) << "entries of the other row of base_grad not 0";
  }
  std::printf("  kc=%lld gs=%lld bs=%lld H=%lld: y %.2e dx %.2e dDelta %.2e "
              "dBase %.2e\n",
              (long long)c.kc, (long long)c.gs, (long long)c.bs, (long long)c.H,
              relativeError(got.y, want.y), relativeError(got.dx, want.dx),
              relativeError(got.dDelta, want.dDelta),
              relativeError(got.dBase, want.dBase));
}

// The published drafter's per-layer convolution (H 5120, kc 2, groups of
// 16, blocks of 8, the checkpoint's whole [2, kc, H] base) on a few rows,
// both halves, and its [kc, H] form.
TEST(GroupedConv, PublishedDrafterShape) {
  convCase({2, 3, 8, 5120, 2, 16, 0, true, 1});
  convCase({2, 3, 8, 5120, 2, 16, 1, true, 2});
  convCase({1, 2, 8, 5120, 2, 16, 1, false, 3});
}

// Every tap count, groups of 8 and 32 (1 and 4 lanes a group), H not a
// whole CTA of vectors (264 and 288 channels: 33 and 36 lanes, a partial
// warp), and taps longer than a block (kc 3, bs 2: slot 1 reads only 2).
TEST(GroupedConv, TapsAndGroups) {
  convCase({2, 4, 8, 256, 1, 8, 0, false, 4});
  convCase({2, 4, 8, 512, 3, 32, 1, true, 5});
  convCase({1, 5, 8, 264, 4, 8, 0, true, 6});
  convCase({3, 2, 8, 288, 4, 32, 1, false, 7});
  convCase({2, 6, 2, 256, 3, 16, 0, true, 8});
  convCase({1, 3, 4, 1024, 4, 16, 1, true, 9});
}

// Blocks of 16 with B > 1 rows, and more draft blocks (300) than the
// gradient has partials (264), so CTAs walk several blocks each.
TEST(GroupedConv, BlocksOf16AndManyBlocks) {
  convCase({3, 4, 16, 512, 2, 16, 0, true, 10});
  convCase({3, 4, 16, 512, 4, 32, 1, false, 11});
  convCase({2, 150, 8, 256, 2, 16, 1, true, 12});
}

// base_grad is summed in a fixed order: the same inputs give the same bits.
TEST(GroupedConv, BaseGradientIsDeterministic) {
  const int64_t B = 2, N = 200, bs = 8, H = 1024, kc = 2, gs = 16;
  const int64_t Q = N * bs, D = 2 * kc * (H / gs);
  std::mt19937_64 rng(13);
  Bf16Tensor x = randomBf16(size_t(B * Q * H), rng),
             delta = randomBf16(size_t(B * Q * D), rng, 0.5),
             base = randomBf16(size_t(2 * kc * H), rng, 0.5),
             dy = randomBf16(size_t(B * Q * H), rng);
  const kernels::GroupedConvShape shape{B, Q, H, bs, kc, gs, 0, true};
  DeviceBuffer<float> workspace(
      kernels::groupedConvGradWorkspaceBytes(shape.blocks(), kc, H) /
      sizeof(float));
  std::vector<std::vector<uint16_t>> runs;
  for (int run = 0; run < 3; ++run) {
    DeviceBuffer<bf16> dx(static_cast<size_t>(B * Q * H)),
        dDelta(static_cast<size_t>(B * Q * D)),
        dBase(static_cast<size_t>(2 * kc * H));
    poisonAll(dx, dDelta, dBase, workspace);
    kernels::grouped_conv_grad_bf16(dy.ptr(), x.ptr(), delta.ptr(), base.ptr(),
                                    dx.get(), dDelta.get(), dBase.get(),
                                    workspace.get(), shape, 0);
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
    runs.push_back(dBase.download<uint16_t>());
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

// The published shape at a training step's rows (2 x 8192 slots): the time
// of each kernel and the bandwidth it reaches on what it must move (input,
// this half of D and the result; the gradient also dy, dx and both halves of
// delta_grad), printed for docs/kernels.md. The outputs are checked for
// being written (finite after the NaN fill); the values are the cases above.
TEST(GroupedConv, PublishedShapeThroughput) {
  const int64_t B = 2, Q = 8192, H = 5120, bs = 8, kc = 2, gs = 16;
  const int64_t G = H / gs, D = 2 * kc * G, rows = B * Q;
  std::mt19937_64 rng(15);
  Bf16Tensor x = randomBf16(static_cast<size_t>(rows * H), rng),
             delta = randomBf16(static_cast<size_t>(rows * D), rng, 0.5),
             base = randomBf16(static_cast<size_t>(2 * kc * H), rng, 0.5),
             dy = randomBf16(static_cast<size_t>(rows * H), rng);
  const kernels::GroupedConvShape shape{B, Q, H, bs, kc, gs, 1, true};
  DeviceBuffer<bf16> y(static_cast<size_t>(rows * H)),
      dx(static_cast<size_t>(rows * H)), dDelta(static_cast<size_t>(rows * D)),
      dBase(static_cast<size_t>(2 * kc * H));
  DeviceBuffer<float> workspace(
      kernels::groupedConvGradWorkspaceBytes(shape.blocks(), kc, H) /
      sizeof(float));
  poisonAll(y, dx, dDelta, dBase, workspace);
  cudaEvent_t start, mid, stop;
  DFLASH_CUDA_CHECK(cudaEventCreate(&start));
  DFLASH_CUDA_CHECK(cudaEventCreate(&mid));
  DFLASH_CUDA_CHECK(cudaEventCreate(&stop));
  const int iterations = 20;
  auto forward = [&] {
    kernels::grouped_conv_bf16(x.ptr(), delta.ptr(), base.ptr(), y.get(), shape,
                               0);
  };
  auto backward = [&] {
    kernels::grouped_conv_grad_bf16(dy.ptr(), x.ptr(), delta.ptr(), base.ptr(),
                                    dx.get(), dDelta.get(), dBase.get(),
                                    workspace.get(), shape, 0);
  };
  forward(); // warm-up
  backward();
  DFLASH_CUDA_CHECK(cudaEventRecord(start, 0));
  for (int i = 0; i < iterations; ++i)
    forward();
  DFLASH_CUDA_CHECK(cudaEventRecord(mid, 0));
  for (int i = 0; i < iterations; ++i)
    backward();
  DFLASH_CUDA_CHECK(cudaEventRecord(stop, 0));
  DFLASH_CUDA_CHECK(cudaEventSynchronize(stop));
  float fwdMs = 0, bwdMs = 0;
  DFLASH_CUDA_CHECK(cudaEventElapsedTime(&fwdMs, start, mid));
  DFLASH_CUDA_CHECK(cudaEventElapsedTime(&bwdMs, mid, stop));
  fwdMs /= iterations;
  bwdMs /= iterations;
  const double act = double(rows * H) * 2, half = double(rows * kc * G) * 2;
  const double fwdBytes = 2 * act + half;
  const double bwdBytes = 3 * act + half + double(rows * D) * 2;
  std::printf("  B=%lld Q=%lld H=%lld kc=%lld gs=%lld bs=%lld: forward %.1f us "
              "(%.0f GB/s), gradient %.1f us (%.0f GB/s)\n",
              (long long)B, (long long)Q, (long long)H, (long long)kc,
              (long long)gs, (long long)bs, fwdMs * 1e3,
              fwdBytes / (fwdMs * 1e-3) / 1e9, bwdMs * 1e3,
              bwdBytes / (bwdMs * 1e-3) / 1e9);
  for (cudaEvent_t e : {start, mid, stop})
    DFLASH_CUDA_CHECK(cudaEventDestroy(e));
  auto finite = [](const std::vector<double> &v) {
    return std::all_of(v.begin(), v.end(),
                       [](double e) { return std::isfinite(e); });
  };
  EXPECT_TRUE(finite(downloadBf16(y))) << "result";
  EXPECT_TRUE(finite(downloadBf16(dx))) << "input_grad";
  EXPECT_TRUE(finite(downloadBf16(dDelta))) << "delta_grad";
  EXPECT_TRUE(finite(downloadBf16(dBase))) << "base_grad";
}

// A DFlash2 drafter's scaled embedding (dflash.embed / draft_embed with
// input_embedding_scale): the rows times the scale in fp32, rounded once;
// with a scale of 1, the table's bits.
TEST(ScaledEmbedding, RowsAndDraftBlocks) {
  std::mt19937_64 rng(14);
  const int B = 2, S = 40, N = 3, bs = 8, V = 300, mask = 299;
  constexpr int H = 264;
  const int64_t Q = int64_t(N) * bs, rows = B * Q;
  const float scale = 0.3125f * 7.f; // not a power of two: the product rounds
  Bf16Tensor table = randomBf16(size_t(V) * H, rng);
  std::vector<int32_t> ids(static_cast<size_t>(B * S)),
      anchors(static_cast<size_t>(B * N));
  std::vector<uint8_t> keep(static_cast<size_t>(B * N));
  std::uniform_int_distribution<int> tok(0, V - 2), pos(0, S - 1);
  for (auto &t : ids)
    t = tok(rng);
  for (int i = 0; i < B * N; ++i) {
    anchors[size_t(i)] = pos(rng);
    keep[size_t(i)] = i % 3 != 1;
  }
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  ref::draftTokens(ids.data(), anchors.data(), keep.data(), tokens.data(), B, S,
                   N, bs, mask);
  DeviceBuffer<int32_t> dIds(ids.size()), dAnchors(anchors.size()),
      dTokens(tokens.size());
  DeviceBuffer<uint8_t> dKeep(keep.size());
  dIds.upload(ids);
  dAnchors.upload(anchors);
  dKeep.upload(keep);
  dTokens.upload(tokens);

  // The reference in double: rows times the scale, rounded to bf16.
  std::vector<double> copy(static_cast<size_t>(rows * H)), want(copy.size());
  ref::embed(table.values.data(), tokens.data(), copy.data(), rows, H);
  for (size_t i = 0; i < copy.size(); ++i)
    want[i] = roundBf16(copy[i] * double(scale));

  DeviceBuffer<bf16> rowsOut(static_cast<size_t>(rows * H)),
      draftOut(static_cast<size_t>(rows * H)),
      plainRows(static_cast<size_t>(rows * H)),
      plainDraft(static_cast<size_t>(rows * H));
  poisonAll(rowsOut, draftOut, plainRows, plainDraft);
  const kernels::DraftBlocksShape shape{B, S, N, bs};
  kernels::embed_rows_bf16(table.ptr(), dTokens.get(), rowsOut.get(), rows, H,
                           scale, 0);
  kernels::draft_embed_bf16<H>(table.ptr(), dIds.get(), dAnchors.get(),
                               dKeep.get(), draftOut.get(), nullptr, shape,
                               mask, scale, 0);
  kernels::embed_rows_bf16(table.ptr(), dTokens.get(), plainRows.get(), rows, H,
                           1.f, 0);
  kernels::draft_embed_bf16<H>(table.ptr(), dIds.get(), dAnchors.get(),
                               dKeep.get(), plainDraft.get(), nullptr, shape,
                               mask, 1.f, 0);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  // fp32 then bf16 against double then bf16: a tie rounds apart at most.
  EXPECT_CLOSE(downloadBf16(rowsOut), want, 1e-3, "embed_rows_bf16 scaled");
  EXPECT_CLOSE(downloadBf16(draftOut), want, 1e-3, "draft_embed_bf16 scaled");
  // The control: unscaled rows are far from the scaled ones.
  EXPECT_GT(relativeError(copy, want), 0.3) << "the scale matters";
  // Scale 1: the table's bits, as before the scale existed.
  std::vector<uint16_t> bits(static_cast<size_t>(rows * H));
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(table.bits.begin() + int64_t(tokens[size_t(r)]) * H, H,
                bits.begin() + r * H);
  EXPECT_EQ(plainRows.download<uint16_t>(), bits);
  EXPECT_EQ(plainDraft.download<uint16_t>(), bits);
}

} // namespace
