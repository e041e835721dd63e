//===- AdamWGpuTest.cu - Multi-tensor AdamW vs reference ------------------===//
//
// Three steps of adamw_multi_tensor_step over tensors that span several
// chunks, end in partial ones or defeat the vector path, with a gradient
// large enough to be clipped, against ref::sumOfSquares, ref::clipCoefficient
// and ref::adamw (fp32 masters, as torch keeps them). The ZeRO-1 stages
// (square sum, clip from the summed squares, update) answer to the same
// reference with every tensor cut between two emulated ranks.
//
//===----------------------------------------------------------------------===//

#include "kernels/AdamW.cuh"
#include "kernels/reference/Reference.h"
#include "test/gpu/GpuTestUtil.h"

#include <cmath>
#include <memory>

using namespace dflash;
using namespace dflash::gputest;
using bf16 = __nv_bfloat16;

namespace {

/// With `sharded`, each tensor is cut in two at an unaligned point and the
/// pieces go to two tables, as two ranks hold them; their squared norms are
/// summed on the host between the stages, as the all-reduce sums them.
template <typename GradT>
void adamwCase(double weightDecay, uint64_t seed, bool sharded = false) {
  SCOPED_TRACE(testing::Message() << "grad bytes=" << sizeof(GradT) << " wd="
                                  << weightDecay << " sharded=" << sharded);
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> sizes = {1000, 40000, 17, 16384};
  const size_t T = sizes.size();
  std::vector<std::vector<float>> master(T), m(T), v(T);
  std::vector<std::unique_ptr<DeviceBuffer<float>>> dMaster, dM, dV;
  std::vector<std::unique_ptr<DeviceBuffer<bf16>>> dParam;
  std::vector<std::unique_ptr<DeviceBuffer<GradT>>> dGrad;
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<kernels::AdamWTensor> tensors;
  for (size_t t = 0; t < T; ++t) {
    master[t].resize(sizes[t]);
    for (auto &x : master[t])
      x = 0.02f * dist(rng);
    m[t].assign(sizes[t], 0.f);
    v[t].assign(sizes[t], 0.f);
    dMaster.push_back(std::make_unique<DeviceBuffer<float>>(sizes[t]));
    dM.push_back(std::make_unique<DeviceBuffer<float>>(sizes[t]));
    dV.push_back(std::make_unique<DeviceBuffer<float>>(sizes[t]));
    dParam.push_back(std::make_unique<DeviceBuffer<bf16>>(sizes[t]));
    dGrad.push_back(std::make_unique<DeviceBuffer<GradT>>(sizes[t]));
    dMaster[t]->upload(master[t]);
    dM[t]->upload(m[t]);
    dV[t]->upload(v[t]);
    tensors.push_back({dParam[t]->get(), dMaster[t]->get(), dGrad[t]->get(),
                       dM[t]->get(), dV[t]->get(), sizes[t]});
  }
  std::vector<kernels::AdamWChunk> chunks = kernels::buildAdamWChunks(sizes);
  DeviceBuffer<kernels::AdamWTensor> dTensors(T);
  DeviceBuffer<kernels::AdamWChunk> dChunks(chunks.size());
  DeviceBuffer<double> partials(chunks.size());
  DeviceBuffer<float> normAndClip(2);
  DeviceBuffer<kernels::AdamWStepState> state(1);
  dTensors.upload(tensors);
  dChunks.upload(chunks);
  kernels::AdamWTables tables{dTensors.get(), dChunks.get(),
                              static_cast<int>(chunks.size()), partials.get(),
                              normAndClip.get()};
  // Two ranks' tables: rank 0 holds [0, cut) of each tensor, rank 1 the
  // rest.
  std::vector<kernels::AdamWTensor> pieces[2];
  std::vector<int64_t> lengths[2];
  for (size_t t = 0; t < T; ++t) {
    const int64_t cut = sizes[t] * 2 / 5 + 1;
    const kernels::AdamWTensor &w = tensors[t];
    const int64_t from[2] = {0, cut}, to[2] = {cut, sizes[t]};
    for (int r = 0; r < 2; ++r) {
      if (to[r] <= from[r])
        continue;
      const int64_t o = from[r];
      pieces[r].push_back({w.param + o, w.master + o,
                           static_cast<const GradT *>(w.grad) + o, w.m + o,
                           w.v + o, to[r] - from[r]});
      lengths[r].push_back(to[r] - from[r]);
    }
  }
  std::unique_ptr<DeviceBuffer<kernels::AdamWTensor>> rankTensors[2];
  std::unique_ptr<DeviceBuffer<kernels::AdamWChunk>> rankChunks[2];
  std::unique_ptr<DeviceBuffer<double>> rankPartials[2];
  std::unique_ptr<DeviceBuffer<float>> rankNormAndClip[2];
  kernels::AdamWTables rankTables[2];
  DeviceBuffer<float> squares(2);
  for (int r = 0; r < 2; ++r) {
    std::vector<kernels::AdamWChunk> c = kernels::buildAdamWChunks(lengths[r]);
    rankTensors[r] =
        std::make_unique<DeviceBuffer<kernels::AdamWTensor>>(pieces[r].size());
    rankChunks[r] =
        std::make_unique<DeviceBuffer<kernels::AdamWChunk>>(c.size());
    rankPartials[r] = std::make_unique<DeviceBuffer<double>>(c.size());
    rankNormAndClip[r] = std::make_unique<DeviceBuffer<float>>(2);
    rankTensors[r]->upload(pieces[r]);
    rankChunks[r]->upload(c);
    rankTables[r] = {rankTensors[r]->get(), rankChunks[r]->get(),
                     static_cast<int>(c.size()), rankPartials[r]->get(),
                     rankNormAndClip[r]->get()};
  }

  kernels::AdamWHyper hyper;
  hyper.weightDecay = weightDecay;
  hyper.maxNorm = 1.0;

  const float gradScales[3] = {0.001f, 0.05f, 0.0005f}; // step 2 clips
  for (int step = 1; step <= 3; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    std::vector<std::vector<float>> grads(T);
    double sumSq = 0;
    for (size_t t = 0; t < T; ++t) {
      grads[t].resize(sizes[t]);
      std::vector<GradT> raw(sizes[t]);
      for (int64_t i = 0; i < sizes[t]; ++i) {
        float g = gradScales[step - 1] * dist(rng);
        if constexpr (sizeof(GradT) == 2) {
          uint16_t bits = floatToBf16(g);
          g = bf16ToFloat(bits);
          __nv_bfloat16_raw r;
          r.x = bits;
          raw[i] = bf16(r);
        } else {
          raw[i] = g;
        }
        grads[t][i] = g;
      }
      dGrad[t]->upload(raw);
      sumSq += ref::sumOfSquares(grads[t].data(), sizes[t]);
    }
    const double norm = std::sqrt(sumSq);
    const double clip = ref::clipCoefficient(norm, hyper.maxNorm);
    ref::AdamWConfig config{};
    config.lr = 6e-4 * step;
    config.weightDecay = weightDecay;
    for (size_t t = 0; t < T; ++t)
      ref::adamw(master[t].data(), grads[t].data(), m[t].data(), v[t].data(),
                 sizes[t], step, clip, config);

    std::vector<kernels::AdamWStepState> s{
        {static_cast<float>(config.lr), step}};
    state.upload(s);
    normAndClip.poison();
    for (auto &p : dParam)
      p->poison();
    if (!sharded) {
      kernels::adamw_multi_tensor_step<GradT>(tables, state.get(), hyper, 0);
    } else {
      squares.poison();
      for (int r = 0; r < 2; ++r) {
        rankNormAndClip[r]->poison();
        kernels::adamw_grad_square_sum<GradT>(rankTables[r], squares.get() + r,
                                              0);
      }
      std::vector<float> sq = squares.download();
      ASSERT_TRUE(std::isfinite(sq[0]) && std::isfinite(sq[1]));
      float total = sq[0] + sq[1];
      squares.upload(std::vector<float>{total, total});
      for (int r = 0; r < 2; ++r) {
        kernels::adamw_clip_from_square_sum(rankTables[r], squares.get() + r,
                                            hyper, 0);
        kernels::adamw_update<GradT>(rankTables[r], state.get(), hyper, 0);
      }
      DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(rankNormAndClip[0]->download(), rankNormAndClip[1]->download());
      normAndClip.upload(rankNormAndClip[0]->download());
    }
    DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> nc = normAndClip.download();
    EXPECT_NEAR(nc[0], norm, 1e-5 * norm) << "norm";
    EXPECT_NEAR(nc[1], clip, 1e-6) << "clip";
    if (step == 2)
      EXPECT_LT(clip, 1.0) << "this step is meant to clip";
    for (size_t t = 0; t < T; ++t) {
      SCOPED_TRACE(testing::Message() << "tensor " << t);
      auto toD = [](const std::vector<float> &f) {
        return std::vector<double>(f.begin(), f.end());
      };
      EXPECT_CLOSE(downloadF32(*dMaster[t]), toD(master[t]), 1e-6, "master");
      EXPECT_CLOSE(downloadF32(*dM[t]), toD(m[t]), 1e-5, "m");
      EXPECT_CLOSE(downloadF32(*dV[t]), toD(v[t]), 1e-5, "v");
      std::vector<double> rounded(sizes[t]);
      std::vector<float> gotMaster = dMaster[t]->download();
      for (int64_t i = 0; i < sizes[t]; ++i)
        rounded[i] = roundBf16(gotMaster[i]);
      EXPECT_CLOSE(downloadBf16(*dParam[t]), rounded, 0.0, "bf16 param");
    }
  }
}

} // namespace

TEST(AdamW, Bf16Gradients) { adamwCase<bf16>(0.0, 1); }
TEST(AdamW, Fp32GradientsWeightDecay) { adamwCase<float>(0.1, 2); }
TEST(AdamW, ShardedStagesBf16Gradients) { adamwCase<bf16>(0.0, 3, true); }
TEST(AdamW, ShardedStagesFp32GradientsWeightDecay) {
  adamwCase<float>(0.1, 4, true);
}
