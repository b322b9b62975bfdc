//===- GradPipelineTest.cpp - GFM, clip, DGFG, fusion, masking ------------===//

#include "mtprt/torch/GradPipeline.h"
#include "mtprt/Memory.h"
#include "mtprt/kernels/GradFuse.h"
#include "mtprt/torch/Trainer.h"

#include "Fixtures.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/serialize/archive.h>

#include <cmath>
#include <sstream>

using namespace mtprt;
using namespace fixtures;

namespace {

/// GFM composed independently: complex rfft, a keep mask built from the
/// contract's bin count, irfft.
at::Tensor referenceGfm(const at::Tensor &g, double keep) {
  const int64_t n = g.size(-1), bins = n / 2 + 1;
  const auto kept =
      static_cast<int64_t>(std::ceil(keep * static_cast<double>(bins)));
  at::Tensor spec = at::fft_rfft(g.to(at::kDouble), n, -1);
  at::Tensor mask = (at::arange(bins, at::kLong) < kept).to(at::kDouble);
  return at::fft_irfft(spec * mask, n, -1).to(at::kFloat);
}

TEST(Gfm, MatchesAnIndependentReference) {
  at::manual_seed(0);
  for (int64_t n : {16, 17, 64, 33}) {
    at::Tensor g = at::randn({3, 5, n});
    for (double keep : {0.3, 0.5, 0.05, 0.99}) {
      at::Tensor got = gfm(g, keep), want = referenceGfm(g, keep);
      EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-5))
          << "n=" << n << " keep=" << keep;
    }
    EXPECT_TRUE(at::equal(gfm(g, 1.0), g));
  }
  // n = 64: 33 bins, keep 0.3 -> ceil(9.9) = 10 bins.
  EXPECT_EQ(kernels::gfmKeptBins(64, 0.3), 10);
  EXPECT_EQ(kernels::gfmKeptBins(64, 1.0), 33);
  // A pure high-frequency signal is removed; a constant survives.
  at::Tensor alt = at::tensor({1.f, -1.f, 1.f, -1.f, 1.f, -1.f, 1.f, -1.f});
  EXPECT_LT(gfm(alt, 0.3).abs().max().item<float>(), 1e-6);
  at::Tensor flat = at::full({8}, 2.f);
  EXPECT_TRUE(at::allclose(gfm(flat, 0.3), flat, 1e-5, 1e-6));
  EXPECT_THROW(gfm(alt, 0.0), std::invalid_argument);
}

TEST(Kernels, CpuTwinsMatchAten) {
  at::manual_seed(1);
  at::Tensor g = at::randn({1000}), acc = at::randn({1000});
  at::Tensor want = acc + 0.25f * g;
  kernels::scaleAccumulateCpu(g.data_ptr<float>(), 1000, 0.25f,
                              acc.data_ptr<float>());
  EXPECT_TRUE(at::allclose(acc, want, 1e-6, 1e-6));
  EXPECT_NEAR(kernels::sumSquaresCpu(g.data_ptr<float>(), 1000),
              g.pow(2).sum().item<double>(), 1e-3);
  EXPECT_FLOAT_EQ(kernels::clipWeightScale(4.0, 2.0, 0.5), 0.25f);
  EXPECT_FLOAT_EQ(kernels::clipWeightScale(1.0, 2.0, 0.5), 0.5f);
  EXPECT_FLOAT_EQ(kernels::clipWeightScale(4.0, 0.0, 0.5), 0.5f);
}

TEST(Kernels, CudaMatchesCpuTwin) {
#ifdef MTPRT_HAVE_CUDA_KERNELS
  if (!cudaMemoryStatsAvailable())
    GTEST_SKIP() << "no CUDA device (or built without the LibTorch-CUDA parts)";
  at::manual_seed(5);
  at::Tensor g = at::randn({4099}), acc = at::randn({4099});
  at::Tensor gd = g.cuda(), accd = acc.cuda(),
             sum = at::zeros({1}, gd.options());
  kernels::scaleAccumulateCpu(g.data_ptr<float>(), g.numel(), 0.3f,
                              acc.data_ptr<float>());
  ASSERT_EQ(kernels::scaleAccumulateCuda(gd.data_ptr<float>(), gd.numel(), 0.3f,
                                         accd.data_ptr<float>(), nullptr),
            0);
  ASSERT_EQ(kernels::sumSquaresCuda(gd.data_ptr<float>(), gd.numel(),
                                    sum.data_ptr<float>(), nullptr),
            0);
  EXPECT_TRUE(at::allclose(accd.cpu(), acc, 1e-6, 1e-6));
  EXPECT_NEAR(sum.item<double>(),
              kernels::sumSquaresCpu(g.data_ptr<float>(), g.numel()), 1e-2);
  // GFM on the device (CUDA mask kernel + cuFFT) against the CPU path.
  at::Tensor x = at::randn({6, 64});
  EXPECT_TRUE(at::allclose(gfm(x.cuda(), 0.3).cpu(), gfm(x, 0.3), 1e-4, 1e-5));
#else
  GTEST_SKIP() << "built without the CUDA kernels";
#endif
}

TEST(Pipeline, PerTaskClipBoundsEachTasksNorm) {
  at::manual_seed(2);
  std::vector<GradList> g = {{at::randn({4, 8}) * 10, at::randn({8})},
                             {at::randn({4, 8}) * 0.01, at::randn({8}) * 0.01},
                             {at::randn({4, 8})}};
  const double small = globalNorm(g[1]);
  std::vector<GradList> copy = g;
  auto norms = processTaskGrads(g, {true, true, false}, 1.0, 1.0);
  EXPECT_NEAR(globalNorm(g[0]), 1.0, 1e-5);
  EXPECT_GT(norms[0], 10.0);
  EXPECT_NEAR(globalNorm(g[1]), small, 1e-9); // under the bound: untouched
  EXPECT_EQ(norms[2], 0.0);                   // absent: untouched, no norm
  EXPECT_TRUE(at::equal(g[2][0], copy[2][0]));
  // Direction is kept.
  EXPECT_NEAR(
      at::cosine_similarity(g[0][0].reshape(-1), copy[0][0].reshape(-1), 0)
          .item<double>(),
      1.0, 1e-5);
}

TEST(Pipeline, FusedIsTheAlphaWeightedSum) {
  at::manual_seed(3);
  std::vector<GradList> g = {{at::randn({5, 6}), at::randn({6})},
                             {at::randn({5, 6}), at::Tensor()},
                             {at::randn({5, 6}), at::randn({6})}};
  std::vector<double> alpha = {0.2, 0.5, 0.3};
  GradList f = fuse(g, alpha);
  EXPECT_TRUE(at::allclose(f[0], 0.2 * g[0][0] + 0.5 * g[1][0] + 0.3 * g[2][0],
                           1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(f[1], 0.2 * g[0][1] + 0.3 * g[2][1], 1e-6, 1e-6));
  at::Tensor gram = gramMatrix(g);
  auto cos = cosineMatrix(gram);
  EXPECT_NEAR(cos[0][0], 1.0, 1e-12);
  EXPECT_NEAR(cos[0][2],
              at::cosine_similarity(at::cat({g[0][0].reshape(-1), g[0][1]}),
                                    at::cat({g[2][0].reshape(-1), g[2][1]}), 0)
                  .item<double>(),
              1e-5);
}

TEST(Gate, ProbabilityVectorAndSmall) {
  Gate gate(0, 1e-2, 0.05);
  EXPECT_LT(gate.numParameters(), 100000);
  EXPECT_EQ(gate.numParameters(), 4 * 32 + 32 + 32 + 1);
  std::vector<std::vector<double>> cos = {{1, 0.5, -0.2, 0.1},
                                          {0.5, 1, 0.3, 0},
                                          {-0.2, 0.3, 1, 0.4},
                                          {0.1, 0, 0.4, 1}};
  auto a = gate.alpha({1.0, 2.0, 0.5, 3.0}, {1.0, 0.1, 10.0, 2.0}, cos,
                      {true, true, true, true});
  double sum = 0;
  for (double v : a) {
    EXPECT_GE(v, 0.0);
    EXPECT_LE(v, 1.0);
    sum += v;
  }
  EXPECT_NEAR(sum, 1.0, 1e-6);
  // A task without labels gets 0 and α renormalizes over the rest.
  a = gate.alpha({1.0, 2.0, 0.5, 3.0}, {1.0, 0.1, 10.0, 2.0}, cos,
                 {true, false, true, true});
  EXPECT_EQ(a[1], 0.0);
  EXPECT_NEAR(a[0] + a[2] + a[3], 1.0, 1e-6);
}

TEST(Gate, ItsWidthIsTheDgfgHidden) {
  // dgfg = { hidden = H }: 4 -> H -> 1, 6H + 1 parameters; the default 32
  // draws the same initial weights as before the width was a knob.
  Gate g32(5, 1e-2, 0.2), g64(5, 1e-2, 0.2, 64);
  EXPECT_EQ(g32.numParameters(), 193);
  EXPECT_EQ(g64.numParameters(), 6 * 64 + 1);
  const std::vector<double> losses{1.0, 2.0, 0.5}, norms{1.0, 0.3, 4.0};
  const std::vector<std::vector<double>> cos{
      {1, 0.5, -0.2}, {0.5, 1, 0.3}, {-0.2, 0.3, 1}};
  const std::vector<bool> present{true, true, true};
  EXPECT_NE(g32.alpha(losses, norms, cos, present),
            g64.alpha(losses, norms, cos, present));
  EXPECT_THROW(Gate(5, 1e-2, 0.2, 0), std::invalid_argument);
  // A checkpoint's gate of another width is refused by name, not copied.
  torch::serialize::OutputArchive out;
  g32.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  const std::string b = bytes.str();
  in.load_from(b.data(), b.size());
  try {
    g64.load(in);
    ADD_FAILURE() << "a 32-wide gate loaded into a 64-wide one";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("the DGFG gate's w1 has shape [32, "
                                         "4], this program's gate [64, 4] "
                                         "(another dgfg width: hidden = 32 vs "
                                         "64)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Gate, ConflictingTaskLosesWeightWithinTwentySteps) {
  // Tasks 0 and 1 agree; task 2 opposes them (cos ≈ -0.9).
  at::manual_seed(4);
  at::Tensor e1 = at::randn({64}), e2 = at::randn({64});
  std::vector<GradList> g = {{e1}, {e1 + 0.3 * e2}, {-e1 + 0.4 * e2}};
  at::Tensor gram = gramMatrix(g);
  auto cos = cosineMatrix(gram);
  ASSERT_LT(cos[0][2], -0.8);
  std::vector<double> losses = {1.0, 1.0, 1.0}, norms(3);
  for (int t = 0; t < 3; ++t)
    norms[t] = globalNorm(g[t]);
  const std::vector<bool> all = {true, true, true};
  Gate gate(0, 5e-2, 0.2); // the default τ
  const auto before = gate.alpha(losses, norms, cos, all);
  double firstObjective = gate.update(losses, norms, cos, all, gram),
         lastObjective = 0;
  for (int step = 1; step < 20; ++step)
    lastObjective = gate.update(losses, norms, cos, all, gram);
  const auto after = gate.alpha(losses, norms, cos, all);
  EXPECT_LT(after[2], before[2]);
  EXPECT_LT(after[2], 0.5 / 3.0) << "α of the conflicting task after 20 steps";
  EXPECT_LT(after[2], std::min(after[0], after[1]));
  EXPECT_GT(lastObjective, firstObjective);
}

//===--- Through the trainer ----------------------------------------------===//

ModelConfig smallModel() {
  ModelConfig c = tinyModel();
  c.vocab = 40;
  c.seq = 10;
  c.layers = 3;
  c.seed = 3;
  return c;
}

std::vector<HeadConfig> threeHeads() {
  return {classifyHead("cls", 2, 4), tagHead("tag", 3, 5), spanHead("span", 3)};
}

TEST(Pipeline, FeaturesScopeFusesAlphaWeightedProcessedTapGradients) {
  TrainConfig tc;
  tc.scope = GradScope::Features;
  tc.gfmKeep = 0.5;
  tc.clipNorm = 0.05;
  TrainerCore core(smallModel(), threeHeads(), tc);
  core.keepDebug = true;
  Batch b = core.model().syntheticBatch(6, 1);
  core.computeGradients(b, {});
  const auto &a = core.lastAlpha;
  EXPECT_NEAR(a[0] + a[1] + a[2], 1.0, 1e-6);
  // Tap 2: cls alone; tap 3: tag and span fused.
  ASSERT_EQ(core.lastFused.size(), 2u);
  const auto &g = core.lastProcessed;
  for (int t = 0; t < 3; ++t)
    EXPECT_LE(globalNorm(g[t]), 0.05 + 1e-6);
  EXPECT_TRUE(at::allclose(core.lastFused[0], a[0] * g[0][0], 1e-6, 1e-8));
  EXPECT_TRUE(at::allclose(core.lastFused[1], a[1] * g[1][0] + a[2] * g[2][0],
                           1e-6, 1e-8));
  // The processed tap gradient has no energy above the kept bins.
  at::Tensor spec = at::fft_rfft(g[1][0], 16, -1);
  EXPECT_LT(spec.narrow(-1, kernels::gfmKeptBins(16, 0.5),
                        9 - kernels::gfmKeptBins(16, 0.5))
                .abs()
                .max()
                .item<float>(),
            1e-6);
  // And the backbone gradient is the backward of exactly those grad_outputs.
  TrainerCore ref(smallModel(), threeHeads(), tc);
  std::vector<at::Tensor> taps = ref.forwardBackbone(b.tokens, {});
  auto params = ref.model().backboneParameters();
  auto want = torch::autograd::grad({taps[2], taps[3]}, params,
                                    {core.lastFused[0], core.lastFused[1]},
                                    false, false, true);
  auto have = core.model().backboneParameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(at::allclose(have[i].grad(), want[i], 1e-5, 1e-7)) << i;
}

TEST(Pipeline, FeaturesScopeCosinesLiveOnTheTopmostCommonLayer) {
  // cls taps layer 2, tag and span layer 3: every task back-propagates
  // through layer 2, so the cosines are those of each task's processed tap
  // gradient pushed down to layer 2's parameters.
  TrainConfig tc;
  tc.scope = GradScope::Features;
  tc.gfmKeep = 0.7;
  TrainerCore core(smallModel(), threeHeads(), tc);
  core.keepDebug = true;
  Batch b = core.model().syntheticBatch(6, 5);
  StepStats s = core.computeGradients(b, {});
  ASSERT_EQ(s.gradientCosineSimMatrix.size(), 3u);
  TrainerCore ref(smallModel(), threeHeads(), tc);
  std::vector<at::Tensor> taps = ref.forwardBackbone(b.tokens, {});
  const auto probe = ref.model().layerParameters(2);
  std::vector<GradList> g(3);
  for (int t = 0; t < 3; ++t)
    g[t] = torch::autograd::grad({taps[ref.model().heads()[t].tap]}, probe,
                                 {core.lastProcessed[t][0]}, true, false, true);
  auto want = cosineMatrix(gramMatrix(g));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      EXPECT_NEAR(s.gradientCosineSimMatrix[i][j], want[i][j], 1e-5)
          << i << "," << j;
  EXPECT_NEAR(want[0][0], 1.0, 1e-9);
}

TEST(Pipeline, ParamsScopeWritesTheFusedGradientToTheTopLayers) {
  TrainConfig tc;
  tc.scope = GradScope::Params;
  tc.paramsTopK = 1;
  tc.gfmKeep = 0.3;
  tc.clipNorm = 0.5;
  TrainerCore core(smallModel(), threeHeads(), tc);
  core.keepDebug = true;
  core.computeGradients(core.model().syntheticBatch(6, 2), {});
  const auto &a = core.lastAlpha;
  const auto &g = core.lastProcessed;
  EXPECT_NEAR(a[0] + a[1] + a[2], 1.0, 1e-6);
  // cls taps layer 2: no gradient on layer 3's parameters.
  EXPECT_EQ(globalNorm(g[0]), 0.0);
  for (int t = 1; t < 3; ++t)
    EXPECT_LE(globalNorm(g[t]), 0.5 + 1e-6);
  const auto &p = core.lastParamsScopeParams;
  ASSERT_EQ(p.size(), 12u);
  for (size_t j = 0; j < p.size(); ++j)
    EXPECT_TRUE(
        at::allclose(p[j].grad(), a[1] * g[1][j] + a[2] * g[2][j], 1e-5, 1e-8))
        << j;
  // Lower layers and heads got gradients too.
  EXPECT_TRUE(core.model().layerParameters(1)[2].grad().defined());
  EXPECT_TRUE(core.model().headParameters(0)[0].grad().defined());
}

TEST(Pipeline, MaskedTaskContributesNothing) {
  for (GradScope scope :
       {GradScope::Features, GradScope::Params, GradScope::Sum}) {
    TrainConfig tc;
    tc.scope = scope;
    tc.gate = false; // uniform over present tasks: 1/2 each
    TrainerCore core(smallModel(), threeHeads(), tc);
    Batch b = core.model().syntheticBatch(6, 3);
    b.labels[1] = at::Tensor(); // no tag labels in this batch
    StepStats s = core.computeGradients(b, {});
    EXPECT_TRUE(std::isnan(s.loss[1]));
    EXPECT_EQ(s.alpha[1], 0.0);
    EXPECT_NEAR(s.alpha[0], 0.5, 1e-12);
    for (const at::Tensor &p : core.model().headParameters(1))
      EXPECT_FALSE(p.grad().defined()) << toString(scope);
    std::vector<at::Tensor> first;
    for (const at::Tensor &p : core.model().backboneParameters())
      first.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    // Whatever the masked head's parameters are, nothing else changes.
    {
      at::AutoGradMode ng(false);
      for (const at::Tensor &p : core.model().headParameters(1))
        p.add_(at::randn_like(p));
    }
    core.computeGradients(b, {});
    auto now = core.model().backboneParameters();
    for (size_t i = 0; i < now.size(); ++i) {
      ASSERT_EQ(first[i].defined(), now[i].grad().defined());
      if (first[i].defined())
        EXPECT_TRUE(at::equal(first[i], now[i].grad()))
            << toString(scope) << " " << i;
    }
  }
}

} // namespace
