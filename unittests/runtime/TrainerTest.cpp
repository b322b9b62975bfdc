//===- TrainerTest.cpp - steps, precision, training, measured peaks -------===//

#include "mtprt/torch/Trainer.h"
#include "mtprt/Memory.h"
#include "mtprt/Runtime.h"
#include "mtprt/torch/Zero.h"

#include "Fixtures.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <limits>
#include <torch/optim/adamw.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <thread>

using namespace mtprt;
using namespace fixtures;

namespace {

//===--- Measured peaks ---------------------------------------------------===//

// B=8, S=64, H=64, 4 heads of 16, F=256, dropout 0.1; heads: cls (tap 2,
// 8 classes), pos (tag, tap 3, 192 tags), ner (tag, tap 4, 256 tags).
// ATen's pointwise ops: the arithmetic below is theirs (the fused rows are
// checked against it at the end).
constexpr int64_t kB = 8, kS = 64, kH = 64, kNh = 4, kF = 256, kL = 4;
constexpr int64_t kPos = 192, kNer = 256, kCls = 8;

ModelConfig memModel() {
  ModelConfig c;
  c.vocab = 512;
  c.seq = kS;
  c.layers = kL;
  c.hidden = kH;
  c.heads = kNh;
  c.ffn = kF;
  c.dropout = 0.1;
  c.seed = 1;
  c.pointwise = PointwiseKind::Aten;
  return c;
}

std::vector<HeadConfig> memHeads() {
  return {classifyHead("cls", 2, kCls), tagHead("pos", 3, kPos),
          tagHead("ner", 4, kNer)};
}

/// What LibTorch keeps for backward, from tensor sizes (docs/runtime.md,
/// "Saved bytes"). fp32 = 4 bytes; dropout masks and bools 1 byte.
struct SavedBytes {
  static constexpr int64_t f = 4;
  static constexpr int64_t act = kB * kS * kH * f;  // one B×S×H activation
  static constexpr int64_t stats = 2 * kB * kS * f; // layer-norm mean + rstd
  // norm (stats, normalized output) + q·scale, k, v + softmax output, its
  // dropout mask, the dropped probabilities + merged context + residual mask.
  static constexpr int64_t attention = stats + act + 3 * act +
                                       kB * kNh * kS * kS * (f + 1 + f) + act +
                                       kB * kS * kH;
  // norm + up output (GELU input) + GELU output + residual dropout mask.
  static constexpr int64_t mlp =
      stats + act + 2 * kB * kS * kF * f + kB * kS * kH;
  static constexpr int64_t embed = kB * kS * kH; // its dropout mask
  static constexpr int64_t lossScalars = 2 * f;  // loss + nll total_weight
  // tag: norm + log_softmax output (the logits themselves are not kept).
  static constexpr int64_t tag(int64_t c) {
    return stats + act + kB * kS * c * f + lossScalars;
  }
  // classify (pooled before its norm): norm of [B,H] + tanh output +
  // log_softmax.
  static constexpr int64_t cls =
      2 * kB * f + kB * kH * f + kB * kH * f + kB * kCls * f + lossScalars;
  // Start of a tag head's backward: the nll and log_softmax input gradients.
  static constexpr int64_t tagBackward(int64_t c) {
    return 2 * kB * kS * c * f;
  }
  // The residual stream: h0..h4 (block inputs / taps) and a1..a4 (MLP inputs).
  static constexpr int64_t stream = (kL + 1) * act + kL * act;
  static constexpr int64_t backbone = embed + stream + kL * (attention + mlp);
};

TEST(MeasuredPeak, NoneRegionsAndOffloadMatchTheSavedTensorArithmetic) {
  installCpuMemoryTracking();
  using SB = SavedBytes;
  // The three schedules; the heads run their backward largest first (ner,
  // pos, cls: the default reverse order).
  std::vector<Schedule> schedules(4);
  schedules[1].regions = {{1, 2}, {3, 4}, {5, 6}, {7, 8}};
  schedules[2].offloadHeads = true;
  schedules[2].prefetchAhead = 1;
  // Regions with their boundaries offloaded: h0 and h1 go to the host (h2
  // and h3 are taps and stay); each comes back when the backward reaches
  // its region.
  schedules[3] = schedules[1];
  schedules[3].offloadRegionBoundaries = true;
  schedules[3].prefetchAhead = 1;
  std::vector<StepStats> stats;
  for (const Schedule &s : schedules) {
    TrainConfig tc;
    tc.scope = GradScope::Features;
    tc.cosineEvery = 0; // the cosine probe is measured separately
    TrainerCore core(memModel(), memHeads(), tc);
    Batch b = core.model().syntheticBatch(kB, 1);
    core.computeGradients(b, s); // first-touch allocations out of the way
    stats.push_back(core.computeGradients(b, s));
  }
  auto peak = [&](int i) {
    return stats[i].measuredPeakBytes - stats[i].measuredStartBytes;
  };

  // None: at the ner head's backward every saved tensor is live.
  const int64_t none = SB::backbone + SB::cls + SB::tag(kPos) + SB::tag(kNer) +
                       SB::tagBackward(kNer);
  // Regions: the peak is in layer 1's backward (the last region: the
  // backbone parameter gradients of layers 2..4 have accumulated by then).
  // Live: the embedding mask, h0 (layer 1's boundary) and the taps h2..h4
  // (held for the backbone backward), two CPU RNG states (the region's and
  // the caller's, saved around the replay), the three fused tap gradients
  // and the gradient arriving at h1, the head and upper-layer parameter
  // gradients, layer 1's recomputed interior (its rows + the attention output
  // + the recomputed h1), and the MLP backward's transient (dropout grad,
  // one B×S×F gradient, the down-projection's weight and bias gradients).
  const int64_t rngState =
      at::detail::getDefaultCPUGenerator().get_state().nbytes();
  int64_t headParamGrads = 0, layerParamGrads = 0;
  {
    Model m(memModel(), memHeads());
    for (int64_t h = 0; h < 3; ++h)
      for (const at::Tensor &p : m.headParameters(h))
        headParamGrads += p.nbytes();
    for (const at::Tensor &p : m.layerParameters(1))
      layerParamGrads += p.nbytes();
  }
  const int64_t regions = SB::embed + SB::act + 3 * SB::act + 2 * rngState +
                          3 * SB::act + SB::act + headParamGrads +
                          (kL - 1) * layerParamGrads +
                          (SB::attention + SB::mlp + 2 * SB::act) + SB::act +
                          kB * kS * kF * 4 + (kF * kH + kH) * 4;
  // Offload: at the ner head's backward only ner's tensors are back; cls's
  // tensors are under the 4 KiB offload threshold and stayed.
  const int64_t offload =
      SB::backbone + SB::tag(kNer) + SB::tagBackward(kNer) + SB::cls;

  std::printf("[ measured ] none %lld (model %lld), regions %lld (model %lld), "
              "offload %lld "
              "(model %lld), host pool %lld, rng state %lld\n",
              (long long)peak(0), (long long)none, (long long)peak(1),
              (long long)regions, (long long)peak(2), (long long)offload,
              (long long)stats[2].hostPoolBytes, (long long)rngState);
  EXPECT_NEAR(peak(0), none, 0.05 * none);
  EXPECT_NEAR(peak(1), regions, 0.05 * regions);
  EXPECT_NEAR(peak(2), offload, 0.05 * offload);
  EXPECT_GT(peak(0), peak(2));
  EXPECT_GT(peak(2), peak(1));
  // Regions + offloaded boundaries: h0 and h1 sit on the host until their
  // regions' backward, but the peak is at layer 1's backward, where h0 is
  // back and h1 already consumed: the same peak (offloading boundaries pays
  // only where the peak lies above them).
  std::printf(
      "[ measured ] regions with offloaded boundaries %lld (model %lld), host "
      "pool %lld, "
      "hits %lld misses %lld\n",
      (long long)peak(3), (long long)regions, (long long)stats[3].hostPoolBytes,
      (long long)stats[3].offloadHits, (long long)stats[3].offloadMisses);
  EXPECT_NEAR(peak(3), regions, 0.05 * regions);
  EXPECT_LE(peak(3), peak(1));
  EXPECT_EQ(stats[3].hostPoolBytes, 2 * SB::act);
  EXPECT_EQ(stats[3].offloadHits + stats[3].offloadMisses, 2);
  EXPECT_EQ(stats[0].hostPoolBytes, 0);
  EXPECT_GT(stats[2].hostPoolBytes,
            SB::tag(kPos) - SB::act); // pos went to the host
  // Per tag head: the norm output and the log-probabilities (saved by both
  // log_softmax and nll_loss, one shared copy: two uses).
  EXPECT_EQ(stats[2].offloadHits + stats[2].offloadMisses, 6);

  // The fused pointwise kernels, nothing checkpointed: every layer keeps
  // neither norm output nor the GELU output, and neither tag head its norm
  // output (both still saved at the ner head's backward); the classify
  // head's [B, H] norm output is gone too.
  {
    ModelConfig fc = memModel();
    fc.pointwise = PointwiseKind::Fused;
    TrainConfig tc;
    tc.scope = GradScope::Features;
    tc.cosineEvery = 0;
    TrainerCore core(fc, memHeads(), tc);
    Batch b = core.model().syntheticBatch(kB, 1);
    core.computeGradients(b, schedules[0]);
    StepStats fused = core.computeGradients(b, schedules[0]);
    const int64_t fusedPeak = fused.measuredPeakBytes - fused.measuredStartBytes;
    const int64_t model = none - kL * (2 * SB::act + kB * kS * kF * 4) -
                          2 * SB::act - kB * kH * 4;
    std::printf("[ measured ] fused pointwise, none %lld (model %lld)\n",
                (long long)fusedPeak, (long long)model);
    EXPECT_NEAR(fusedPeak, model, 0.05 * model);
  }
}

//===--- Gradients through the schedules ----------------------------------===//

ModelConfig small(double dropout) {
  ModelConfig c = tinyModel();
  c.vocab = 40;
  c.seq = 12;
  c.layers = 3;
  c.dropout = dropout;
  c.seed = 5;
  return c;
}

std::vector<HeadConfig> threeTasks() {
  return {classifyHead("cls", 1, 4), tagHead("tag", 3, 6),
          decoderHead("gen", 2, 12, 5)};
}

std::vector<at::Tensor> gradsAfter(const Schedule &s, GradScope scope) {
  TrainConfig tc;
  tc.scope = scope;
  tc.gfmKeep = 0.5;
  tc.clipNorm = 1.0;
  TrainerCore core(small(0.2), threeTasks(), tc, OffloadOptions{0.0, 256});
  Batch b = core.model().syntheticBatch(4, 2);
  at::manual_seed(42);
  StepStats st = core.computeGradients(b, s);
  if (s.offloadHeads || s.offloadRegionBoundaries) {
    EXPECT_GT(st.offloadHits + st.offloadMisses, 0);
  }
  std::vector<at::Tensor> g;
  for (const at::Tensor &p : core.model().parameters())
    g.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
  return g;
}

TEST(Schedules, CheckpointedAndOffloadedStepsGiveThePlainGradients) {
  for (GradScope scope :
       {GradScope::Features, GradScope::Params, GradScope::Sum}) {
    const auto plain = gradsAfter({}, scope);
    Schedule regions;
    regions.regions = {{1, 2}, {3, 4}, {5, 6}};
    Schedule offload;
    offload.offloadHeads = true;
    Schedule both = regions;
    both.offloadHeads = true;
    both.offloadRegionBoundaries = true;
    both.headOrder = {1, 0, 2};
    // The compiler's per-block offload, alone and beside a region.
    Schedule units;
    units.offloadUnits = {1, 2, 3};
    Schedule unitsAndRegion;
    unitsAndRegion.regions = {{3, 4}};
    unitsAndRegion.offloadUnits = {1, 2, 5};
    unitsAndRegion.offloadHeadList = {1}; // one head of three
    const auto names = Model(small(0.2), threeTasks()).namedParameters();
    int which = 0;
    for (const Schedule *s : {&regions, &offload, &both, &units, &unitsAndRegion}) {
      const auto g = gradsAfter(*s, scope);
      ++which;
      for (size_t i = 0; i < g.size(); ++i)
        EXPECT_TRUE(at::allclose(g[i], plain[i], 1e-5, 1e-7))
            << toString(scope) << " schedule " << which << " " << names[i].first
            << " max diff " << (g[i] - plain[i]).abs().max().item<float>();
    }
  }
}

TEST(Schedules, OffloadedUnitsLowerThePeakAndUseTheHostPool) {
  installCpuMemoryTracking();
  std::vector<Schedule> schedules(2);
  // Every block below the lowest tap (cls reads layer 2: units 1..4) but the
  // first keeps its saved tensors on the host until its backward.
  schedules[1].offloadUnits = {1, 2, 3};
  std::vector<StepStats> stats;
  for (const Schedule &s : schedules) {
    TrainConfig tc;
    tc.scope = GradScope::Features;
    tc.cosineEvery = 0;
    TrainerCore core(memModel(), memHeads(), tc);
    Batch b = core.model().syntheticBatch(kB, 1);
    core.computeGradients(b, s);
    stats.push_back(core.computeGradients(b, s));
  }
  auto peak = [&](int i) {
    return stats[i].measuredPeakBytes - stats[i].measuredStartBytes;
  };
  std::printf("[ measured ] kept %lld, units 1-3 offloaded %lld, host pool "
              "%lld\n",
              (long long)peak(0), (long long)peak(1),
              (long long)stats[1].hostPoolBytes);
  EXPECT_LT(peak(1), peak(0));
  EXPECT_GT(stats[1].hostPoolBytes, 0);
  EXPECT_EQ(stats[0].hostPoolBytes, 0);
  EXPECT_GT(stats[1].offloadHits + stats[1].offloadMisses, 0);
}

TEST(Schedules, OffloadUnitsAreChecked) {
  TrainerCore core(memModel(), memHeads(), TrainConfig());
  Batch b = core.model().syntheticBatch(2, 1);
  Schedule s;
  s.offloadUnits = {0};
  try {
    core.computeGradients(b, s);
    ADD_FAILURE() << "unit 0 accepted";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("Schedule.offloadUnits[0]"),
              std::string::npos)
        << e.what();
  }
  s.offloadUnits = {3};
  s.regions = {{3, 4}};
  EXPECT_THROW(core.computeGradients(b, s), std::invalid_argument);
  Schedule h;
  h.offloadHeadList = {7};
  EXPECT_THROW(core.computeGradients(b, h), std::invalid_argument);
}

TEST(Schedules, OneOffloadedHeadUsesTheHostPoolForItAlone) {
  installCpuMemoryTracking();
  int64_t pool[2] = {0, 0};
  for (int run = 0; run < 2; ++run) {
    TrainConfig tc;
    tc.cosineEvery = 0;
    TrainerCore core(memModel(), memHeads(), tc);
    Batch b = core.model().syntheticBatch(kB, 1);
    Schedule s;
    if (run == 0)
      s.offloadHeadList = {1}; // pos
    else
      s.offloadHeads = true;
    core.computeGradients(b, s);
    pool[run] = core.computeGradients(b, s).hostPoolBytes;
  }
  // pos alone moves its norm output and log-probabilities; all heads move
  // ner's too (cls's tensors are under the 4 KiB threshold).
  EXPECT_GT(pool[0], 0);
  EXPECT_LT(pool[0], pool[1]);
}

TEST(Schedules, CheckpointReplaysBf16Autocast) {
  // Under bf16 autocast the recompute must run in bf16 too: a recompute in
  // fp32 would differ from the forward by bf16 rounding (~1e-2 relative).
  std::vector<at::Tensor> g[2];
  for (int run = 0; run < 2; ++run) {
    TrainConfig tc;
    tc.precision = Precision::Bf16;
    TrainerCore core(small(0.2), threeTasks(), tc);
    Schedule s;
    if (run)
      s.regions = {{1, 2}, {3, 4}, {5, 6}};
    at::manual_seed(4);
    core.computeGradients(core.model().syntheticBatch(4, 3), s);
    for (const at::Tensor &p : core.model().backboneParameters())
      g[run].push_back(p.grad().clone());
  }
  for (size_t i = 0; i < g[0].size(); ++i)
    EXPECT_TRUE(at::allclose(g[0][i], g[1][i], 1e-5, 1e-7))
        << i << " max diff " << (g[0][i] - g[1][i]).abs().max().item<float>();
}

TEST(Schedules, InvalidSchedulesNameTheField) {
  TrainerCore core(small(0.0), threeTasks(), {});
  Batch b = core.model().syntheticBatch(2, 1);
  auto expectError = [&](const Schedule &s, const std::string &field) {
    try {
      core.computeGradients(b, s);
      ADD_FAILURE() << "no error for " << field;
    } catch (const std::invalid_argument &e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos)
          << e.what();
    }
  };
  Schedule s;
  s.regions = {{1, 4}}; // layer 1's output (unit 2) is cls's tap
  expectError(s, "Schedule.regions[0]");
  s.regions = {{3, 4}, {4, 6}};
  expectError(s, "Schedule.regions[1]");
  s.regions = {{5, 9}};
  expectError(s, "Schedule.regions[0]");
  s = {};
  s.headOrder = {0, 0, 1};
  expectError(s, "Schedule.headOrder[1]");
}

//===--- Training ---------------------------------------------------------===//

TEST(Training, ThreeTasksHalveTheirLossesIn200Steps) {
  ModelConfig mc = small(0.0);
  mc.layers = 2;
  std::vector<HeadConfig> heads = threeTasks();
  heads[1].tap = 2;
  TrainConfig tc;
  tc.scope = GradScope::Features;
  tc.gfmKeep = 0.6;
  tc.clipNorm = 1.0;
  tc.backboneLr = {3e-3, LrSchedule::Cosine, 10, 200};
  tc.headLr = {{3e-3, LrSchedule::Constant, 0, 200},
               {3e-3, LrSchedule::Linear, 5, 200},
               {5e-3, LrSchedule::Cosine, 10, 200}};
  Trainer trainer(mc, heads, tc);
  trainer.useSyntheticBatch(8, 7);
  Schedule s;
  s.regions = {{1, 2}};
  StepStats first = trainer.step(s), last;
  for (int i = 1; i < 200; ++i)
    last = trainer.step(s);
  for (size_t t = 0; t < 3; ++t) {
    std::printf("[ training ] %s: %.4f -> %.4f (alpha %.3f)\n",
                last.tasks[t].c_str(), first.loss[t], last.loss[t],
                last.alpha[t]);
    EXPECT_LT(last.loss[t], 0.5 * first.loss[t]) << last.tasks[t];
  }
  ASSERT_EQ(last.gradientCosineSimMatrix.size(), 3u);
  const auto &c = last.gradientCosineSimMatrix;
  std::printf("[ training ] cosines cls-tag %.3f cls-gen %.3f tag-gen %.3f\n",
              c[0][1], c[0][2], c[1][2]);
}

TEST(Training, Bf16TracksFp32) {
  std::vector<double> losses[2];
  for (int p = 0; p < 2; ++p) {
    TrainConfig tc;
    tc.precision = p ? Precision::Bf16 : Precision::Fp32;
    tc.scope = GradScope::Features;
    tc.backboneLr = {2e-3};
    Trainer trainer(small(0.0), threeTasks(), tc);
    trainer.useSyntheticBatch(8, 3);
    for (int i = 0; i < 15; ++i) {
      StepStats s = trainer.step({});
      double sum = 0;
      for (double l : s.loss)
        sum += l;
      losses[p].push_back(sum);
    }
  }
  // Stated tolerance: every step's summed loss within 3% of fp32's, and
  // both fall by the same amount within 0.05 absolute.
  for (size_t i = 0; i < losses[0].size(); ++i)
    EXPECT_NEAR(losses[1][i], losses[0][i], 0.03 * losses[0][i])
        << "step " << i;
  EXPECT_NEAR(losses[0].front() - losses[0].back(),
              losses[1].front() - losses[1].back(), 0.05);
  EXPECT_LT(losses[1].back(), losses[1].front());
}

TEST(Training, MicroBatchesAccumulateToTheFullBatchGradient) {
  for (GradScope scope : {GradScope::Sum, GradScope::Features}) {
    std::vector<at::Tensor> grads[2];
    for (int m = 0; m < 2; ++m) {
      TrainConfig tc;
      tc.scope = scope;
      tc.gate = false;
      tc.microBatches = m ? 4 : 1;
      TrainerCore core(small(0.0), threeTasks(), tc);
      core.computeGradients(core.model().syntheticBatch(8, 4), {});
      for (const at::Tensor &p : core.model().parameters())
        grads[m].push_back(p.grad().clone());
    }
    for (size_t i = 0; i < grads[0].size(); ++i)
      EXPECT_TRUE(at::allclose(grads[0][i], grads[1][i], 1e-4, 1e-6))
          << toString(scope) << i;
  }
}

TEST(Training, TaskLrAdapterGivesEachHeadItsSchedule) {
  EXPECT_DOUBLE_EQ(scheduledLr({1.0, LrSchedule::Constant, 0, 100}, 50), 1.0);
  EXPECT_DOUBLE_EQ(scheduledLr({1.0, LrSchedule::Linear, 10, 110}, 4), 0.5);
  EXPECT_DOUBLE_EQ(scheduledLr({1.0, LrSchedule::Linear, 10, 110}, 60), 0.5);
  EXPECT_NEAR(scheduledLr({1.0, LrSchedule::Cosine, 0, 100}, 50), 0.5, 1e-12);
  EXPECT_NEAR(scheduledLr({1.0, LrSchedule::Cosine, 0, 100}, 100), 0.0, 1e-12);
  TrainConfig tc;
  tc.backboneLr = {1e-3};
  tc.headLr = {{2e-3},
               {3e-3, LrSchedule::Linear, 0, 10},
               {4e-3, LrSchedule::Cosine, 2, 10}};
  TrainerCore core(small(0.0), threeTasks(), tc);
  Batch b = core.model().syntheticBatch(4, 1);
  core.step(b, {});
  auto &groups = core.optimizer().param_groups();
  ASSERT_EQ(groups.size(), 4u); // backbone + one per head
  auto lr = [&](size_t g) {
    return static_cast<torch::optim::AdamWOptions &>(groups[g].options()).lr();
  };
  EXPECT_DOUBLE_EQ(lr(0), 1e-3);
  EXPECT_DOUBLE_EQ(lr(1), 2e-3);
  EXPECT_DOUBLE_EQ(lr(2), 3e-3);
  EXPECT_DOUBLE_EQ(lr(3), 2e-3); // warmup step 1 of 2
  EXPECT_EQ(groups[1].params().size(), core.model().headParameters(0).size());
  core.step(b, {});
  EXPECT_NEAR(lr(2), 3e-3 * 0.9, 1e-12);
}

TEST(Training, ActivationReuseRatio) {
  installCpuMemoryTracking();
  auto ratio = [](std::vector<int64_t> taps, std::vector<bool> present) {
    std::vector<HeadConfig> heads = threeTasks();
    for (size_t t = 0; t < 3; ++t)
      heads[t].tap = taps[t];
    TrainerCore core(small(0.0), heads, {});
    Batch b = core.model().syntheticBatch(4, 1);
    for (size_t t = 0; t < 3; ++t)
      if (!present[t])
        b.labels[t] = at::Tensor();
    return core.computeGradients(b, {}).activationReuseRatio;
  };
  EXPECT_NEAR(ratio({3, 3, 3}, {true, true, true}), 1.0,
              1e-12); // all share everything
  EXPECT_EQ(ratio({3, 3, 3}, {true, false, false}),
            0.0); // one task shares nothing
  const double split = ratio({1, 3, 2}, {true, true, true});
  const double low = ratio({0, 3, 0}, {true, true, true});
  EXPECT_GT(split, low); // tapping lower shares less of the deep task's stack
  EXPECT_GT(low, 0.0);
  EXPECT_LT(split, 1.0);
}

//===--- The torch-free facade and metrics --------------------------------===//

TEST(Facade, RawBatchesStepsAndJson) {
  ModelConfig mc = small(0.1);
  std::vector<HeadConfig> heads = threeTasks();
  TrainConfig tc;
  Trainer trainer(mc, heads, tc);
  EXPECT_EQ(trainer.numUnits(), 7);
  EXPECT_EQ(trainer.unitName(5), "layer3.attn");
  const int64_t b = 2;
  std::vector<int64_t> tokens(b * mc.seq, 3), cls = {1, 2}, gen(b * 5, 4);
  trainer.setBatch(b, tokens.data(), {cls.data(), nullptr, gen.data()});
  StepStats s = trainer.step({});
  EXPECT_TRUE(std::isnan(s.loss[1]));
  EXPECT_EQ(s.alpha[1], 0.0);
  EXPECT_GT(s.measuredPeakBytes, s.measuredStartBytes);
  EXPECT_GT(s.stepTimeS, 0.0);
  const std::string json = toJsonLine(s);
  for (const char *key :
       {"\"step\":0", "\"loss\":{\"cls\":", "\"tag\":null", "\"alpha\":{",
        "\"gradient_cosine_sim_matrix\":[[", "\"checkpoint_hit_rate\":1",
        "\"activation_reuse_ratio\":", "\"measured_peak_bytes\":",
        "\"host_pool_bytes\":0", "\"step_time_s\":", "\"samples_per_s\":"})
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  tokens[0] = 99; // out of the vocabulary
  EXPECT_THROW(
      trainer.setBatch(b, tokens.data(), {cls.data(), nullptr, gen.data()}),
      std::invalid_argument);
  EXPECT_THROW(trainer.setBatch(b, tokens.data(), {cls.data()}),
               std::invalid_argument);
  tokens[0] = 3;
  std::vector<int64_t> badCls = {1, 4}; // cls has 4 classes
  try {
    trainer.setBatch(b, tokens.data(), {badCls.data(), nullptr, gen.data()});
    ADD_FAILURE() << "no error for an out-of-range label";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("labels[0]"), std::string::npos)
        << e.what();
  }
  TrainConfig fp16;
  fp16.precision = Precision::Fp16;
  EXPECT_THROW(Trainer(mc, heads, fp16), std::invalid_argument); // needs CUDA
}

TEST(Facade, StepStatsCarryPresenceAndTheTasksGradientNorms) {
  // What the driver's non-finite check reads, already on the host: each
  // task's loss and its processed gradient's norm (no extra sync).
  ModelConfig mc = small(0.0);
  HeadConfig reg = classifyHead("reg", 3, 1); // the top layer: params scope too
  reg.loss = LossKind::Mse;
  const std::vector<HeadConfig> heads = {classifyHead("cls", 1, 4), reg};
  const int64_t b = 2;
  std::vector<int64_t> tokens(b * mc.seq, 3), cls = {1, 2};
  for (GradScope scope :
       {GradScope::Features, GradScope::Params, GradScope::Sum}) {
    TrainConfig tc;
    tc.scope = scope;
    tc.clipNorm = 1.0;
    Trainer trainer(mc, heads, tc);
    std::vector<float> reg = {0.5f, -0.5f};
    trainer.setBatch(b, tokens.data(), {cls.data(), reg.data()});
    StepStats s = trainer.step({});
    ASSERT_EQ(s.present, std::vector<bool>({true, true}));
    ASSERT_EQ(s.gradNorm.size(), 2u);
    for (double n : s.gradNorm)
      if (scope == GradScope::Sum)
        EXPECT_EQ(n, 0.0); // no per-task gradients at scope sum
      else
        EXPECT_TRUE(std::isfinite(n)) << n;
    if (scope != GradScope::Sum)
      EXPECT_GT(s.gradNorm[1], 0.0);
    // A label no float can square: the loss overflows (its gradient,
    // 2 (pred - y) / n, need not).
    reg = {1e30f, 0.5f};
    trainer.setBatch(b, tokens.data(), {cls.data(), reg.data()});
    s = trainer.step({});
    EXPECT_TRUE(std::isfinite(s.loss[0]));
    EXPECT_FALSE(std::isfinite(s.loss[1])) << s.loss[1];
    // An infinite label (JSON's 1e999): the gradient too.
    reg = {std::numeric_limits<float>::infinity(), 0.5f};
    trainer.setBatch(b, tokens.data(), {cls.data(), reg.data()});
    s = trainer.step({});
    EXPECT_FALSE(std::isfinite(s.loss[1])) << s.loss[1];
    if (scope != GradScope::Sum)
      EXPECT_FALSE(std::isfinite(s.gradNorm[1])) << toString(scope);
    // Without labels: absent, not non-finite.
    trainer.setBatch(b, tokens.data(), {cls.data(), nullptr});
    s = trainer.step({});
    EXPECT_EQ(s.present, std::vector<bool>({true, false}));
    EXPECT_TRUE(std::isnan(s.loss[1]));
  }
}

TEST(Facade, UnitGrainStepEqualsTheScheduledStep) {
  ModelConfig mc = small(0.2);
  TrainConfig tc;
  tc.microBatches = 2;
  tc.gfmKeep = 0.5;
  tc.clipNorm = 1.0;
  Schedule s;
  s.regions = {{3, 4}};
  s.offloadHeads = true;
  s.offloadRegionBoundaries = true;
  Trainer scheduled(mc, threeTasks(), tc), manual(mc, threeTasks(), tc);
  scheduled.useSyntheticBatch(4, 8);
  manual.useSyntheticBatch(4, 8);
  at::manual_seed(9);
  StepStats a = scheduled.step(s);

  // The same plan, written out the way an emitted step program would.
  at::manual_seed(9);
  manual.beginStep();
  EXPECT_THROW(manual.backwardBackbone(),
               std::logic_error); // no micro-batch yet
  for (int64_t mb = 0; mb < manual.microBatches(); ++mb) {
    manual.beginMicroBatch(mb);
    ValueId v = manual.input();
    ValueId h0 = manual.forward(0, 0, v, RegionMode::Keep);
    manual.release(v);
    // Each head as soon as its tap is made (the dropout masks come in
    // this order).
    ValueId h1 = manual.forward(1, 2, h0, RegionMode::Keep);
    manual.release(h0);
    manual.forwardHead(0, /*offload=*/true); // cls taps layer 1
    ValueId h2 = manual.forward(3, 4, h1, RegionMode::CheckpointOffload);
    manual.release(h1);
    manual.forwardHead(2, /*offload=*/true); // gen taps 2
    ValueId h3 = manual.forward(5, 6, h2, RegionMode::Keep);
    manual.release(h2);
    manual.release(h3);
    manual.forwardHead(1, /*offload=*/true); // tag taps 3
    EXPECT_THROW(manual.backwardBackbone(), std::logic_error); // heads first
    for (int64_t h = 2; h >= 0; --h) {
      manual.prefetch("head" + std::to_string(h));
      if (h > 0)
        manual.prefetch("head" + std::to_string(h - 1));
      manual.backwardHead(h);
    }
    // The fused op as its own call (micro-batch 1 leaves it to the backward).
    if (mb == 0) {
      manual.fuseTaskGradients();
      EXPECT_THROW(manual.fuseTaskGradients(), std::logic_error);
    }
    manual.backwardBackbone();
  }
  // The step's end phase by phase, as an emitted program calls them.
  manual.exchangeGradients();
  EXPECT_THROW(manual.exchangeGradients(), std::logic_error);
  manual.optimizerStep();
  EXPECT_THROW(manual.optimizerStep(), std::logic_error);
  StepStats b = manual.endStep();
  for (size_t t = 0; t < 3; ++t) {
    EXPECT_NEAR(a.loss[t], b.loss[t], 1e-6);
    EXPECT_NEAR(a.alpha[t], b.alpha[t], 1e-6);
  }
  auto pa = scheduled.core().model().parameters(),
       pb = manual.core().model().parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(at::allclose(pa[i], pb[i], 1e-6, 1e-7)) << i;
  EXPECT_THROW(manual.endStep(), std::logic_error); // no step in progress
}

/// Three steps with the optimizer offload, its host update beside the next
/// forward or inline; the parameters' values after them, and (beside) how
/// many parameters the update's own thread updated.
std::vector<at::Tensor> offloadedSteps(const std::string &device, bool beside,
                                       int64_t *onItsThread = nullptr) {
  std::atomic<int64_t> others{0};
  const std::thread::id main = std::this_thread::get_id();
  ModelConfig mc = small(0.0);
  mc.device = device;
  TrainConfig tc;
  tc.optimizerOffload = true;
  TrainerCore core(mc, threeTasks(), tc);
  core.shardOptimizer(nullptr);
  EXPECT_TRUE(core.zero() && core.zero()->offloaded());
  core.zero()->setUpdateBeside(beside);
  core.zero()->setBeforeHostUpdate(
      [&](int64_t) { others += std::this_thread::get_id() != main; });
  Batch b = core.model().syntheticBatch(4, 2);
  for (int step = 0; step < 3; ++step)
    core.step(b, {});
  std::vector<at::Tensor> values;
  for (const auto &[name, p] : core.model().namedParameters())
    values.push_back(p.detach().cpu());
  if (onItsThread)
    *onItsThread = others;
  return values;
}

// The trainer hands the offload its forward order at one process
// (shardOptimizer): the update beside the forward gives the bits of the
// update inline in the step.
TEST(Training, OffloadUpdateBesideTheForwardIsTheInlineUpdate) {
  int64_t inlineOnThread = -1, besideOnThread = -1;
  const std::vector<at::Tensor> inl = offloadedSteps("cpu", false,
                                                     &inlineOnThread),
                                bes = offloadedSteps("cpu", true,
                                                     &besideOnThread);
  EXPECT_EQ(inlineOnThread, 0);
  EXPECT_GT(besideOnThread, 0); // every parameter of 3 steps, in fact
  ASSERT_EQ(inl.size(), bes.size());
  for (size_t i = 0; i < inl.size(); ++i)
    EXPECT_TRUE(at::equal(inl[i], bes[i])) << i;
}

//===--- CUDA only (the device check runs these) --------------------------===//

bool haveCuda() { return cudaMemoryStatsAvailable(); }

TEST(Cuda, OffloadUsesPinnedMemoryAndSideStreams) {
  if (!haveCuda())
    GTEST_SKIP() << "no CUDA device (or built without the LibTorch-CUDA parts)";
  ModelConfig mc = small(0.2);
  mc.device = "cuda";
  std::vector<at::Tensor> g[2];
  for (int run = 0; run < 2; ++run) {
    TrainConfig tc;
    TrainerCore core(mc, threeTasks(), tc, OffloadOptions{0.0, 256});
    Schedule s;
    s.regions = {{1, 2}, {3, 4}, {5, 6}};
    s.offloadHeads = run == 1;
    s.offloadRegionBoundaries = run == 1;
    at::manual_seed(1);
    StepStats st = core.computeGradients(core.model().syntheticBatch(4, 2), s);
    if (run == 1) {
      EXPECT_GT(st.offloadHits + st.offloadMisses, 0);
      EXPECT_GT(st.hostPoolBytes, 0);
    }
    for (const at::Tensor &p : core.model().parameters())
      g[run].push_back(p.grad().defined() ? p.grad().cpu()
                                          : at::zeros_like(p).cpu());
  }
  for (size_t i = 0; i < g[0].size(); ++i)
    EXPECT_TRUE(at::allclose(g[0][i], g[1][i], 1e-5, 1e-7)) << i;
}

// On CUDA: the host update's copies on a side stream behind an event on the
// compute stream (ZeroOptimizer::step).
TEST(Cuda, OffloadUpdateBesideTheForwardOnASideStream) {
  if (!haveCuda())
    GTEST_SKIP() << "no CUDA device (or built without the LibTorch-CUDA parts)";
  const std::vector<at::Tensor> inl = offloadedSteps("cuda", false),
                                bes = offloadedSteps("cuda", true);
  ASSERT_EQ(inl.size(), bes.size());
  for (size_t i = 0; i < inl.size(); ++i)
    EXPECT_TRUE(at::equal(inl[i], bes[i])) << i;
}

// fp16 with the offload's 16-bit weights (one process): the projections
// fp16 on the device, their gradients left at the loss scale for the host's
// update to divide out in fp32. Against fp16 training with fp32 weights and
// the update on the device (autocast casts them to the same fp16 values):
// the same parameters to the two updates' kernels' rounding.
TEST(Cuda, Fp16WeightsWithTheOffloadTrainAsFp16) {
  if (!haveCuda())
    GTEST_SKIP() << "no CUDA device (or built without the LibTorch-CUDA parts)";
  ModelConfig mc = small(0.0);
  mc.device = "cuda";
  std::vector<at::Tensor> values[2];
  for (int run = 0; run < 2; ++run) {
    TrainConfig tc;
    tc.precision = Precision::Fp16;
    tc.optimizerOffload = run == 1;
    TrainerCore core(mc, threeTasks(), tc);
    if (run == 1) {
      core.shardOptimizer(nullptr);
      ASSERT_GT(core.zero()->halfValues(), 0);
      for (const at::Tensor &p : core.model().projectionParameters())
        EXPECT_EQ(p.scalar_type(), at::kHalf);
    }
    Batch b = core.model().syntheticBatch(4, 2);
    for (int step = 0; step < 3; ++step)
      core.step(b, {});
    for (const auto &[name, p] : core.model().namedParameters())
      values[run].push_back(run == 1 ? core.zero()->hostValues(p)
                                     : p.detach().cpu());
  }
  ASSERT_EQ(values[0].size(), values[1].size());
  for (size_t i = 0; i < values[0].size(); ++i)
    EXPECT_TRUE(at::allclose(values[0][i], values[1][i], 1e-5, 1e-6)) << i;
}

TEST(Cuda, CachingAllocatorPeakAndFp16LossScaling) {
  if (!haveCuda())
    GTEST_SKIP() << "no CUDA device (or built without the LibTorch-CUDA parts)";
  ModelConfig mc = small(0.0);
  mc.device = "cuda";
  TrainConfig tc;
  tc.precision = Precision::Fp16;
  Trainer trainer(mc, threeTasks(), tc);
  trainer.useSyntheticBatch(8, 1);
  StepStats first = trainer.step({}), last;
  EXPECT_GT(first.measuredPeakBytes, first.measuredStartBytes);
  EXPECT_EQ(first.lossScale, 65536.0);
  for (int i = 0; i < 30; ++i)
    last = trainer.step({});
  double a = 0, b = 0;
  for (size_t t = 0; t < 3; ++t) {
    a += first.loss[t];
    b += last.loss[t];
  }
  EXPECT_LT(b, a);
}

} // namespace
