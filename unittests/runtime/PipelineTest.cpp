//===- PipelineTest.cpp - pipeline stages (docs/pipeline.md) --------------===//
//
// The schedules' orders, and two stages in one process with the boundary
// handed over by hand: their gradients are the whole model's (processes:
// test/tools/pipeline.test).

#include "Fixtures.h"

#include "mtprt/Pipeline.h"
#include "mtprt/torch/Trainer.h"

#include <gtest/gtest.h>

#include <map>

using namespace mtprt;

TEST(PipelineActions, GPipeRunsEveryForwardFirst) {
  EXPECT_EQ(describeActions(pipelineActions(2, 0, 3, true)),
            "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(describeActions(pipelineActions(2, 1, 3, true)),
            "F0 F1 F2 B0 B1 B2");
}

TEST(PipelineActions, OneForwardOneBackwardFillsThenAlternates) {
  EXPECT_EQ(describeActions(pipelineActions(4, 0, 6, false)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(describeActions(pipelineActions(4, 3, 6, false)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer micro-batches than stages: the pipe never fills.
  EXPECT_EQ(describeActions(pipelineActions(4, 0, 2, false)),
            "F0 F1 B0 B1");
  // Every micro-batch once each way, backwards in order, at most S − s in
  // flight.
  for (int64_t s = 0; s < 5; ++s) {
    const auto a = pipelineActions(5, s, 7, false);
    int64_t inFlight = 0, most = 0, nextF = 0, nextB = 0;
    for (const PipeAction &x : a) {
      if (x.forward) {
        EXPECT_EQ(x.micro, nextF++);
        most = std::max(most, ++inFlight);
      } else {
        EXPECT_EQ(x.micro, nextB++);
        --inFlight;
      }
    }
    EXPECT_EQ(nextF, 7);
    EXPECT_EQ(nextB, 7);
    EXPECT_EQ(most, std::min<int64_t>(7, 5 - s));
  }
  EXPECT_THROW(pipelineActions(2, 2, 3, false), std::invalid_argument);
}

namespace {
std::map<std::string, at::Tensor> grads(const Model &m) {
  std::map<std::string, at::Tensor> out;
  for (const auto &[name, p] : m.namedParameters())
    if (p.grad().defined())
      out[name] = p.grad().clone();
  return out;
}

/// Two stages of the tiny model (units 0–2 with the tag head on tap 1, units
/// 3–4 with the classify head on tap 2), micro-batches passed by hand in
/// GPipe order, against one trainer of the whole model.
void twoStagesMatchTheWholeModel(GradScope scope) {
  ModelConfig m = fixtures::tinyModel();
  std::vector<HeadConfig> heads = {fixtures::classifyHead("cls", 2, 4),
                                   fixtures::tagHead("tag", 1, 6)};
  TrainConfig t;
  t.microBatches = 2;
  t.gate = false;
  t.scope = scope;
  t.gfmKeep = 0.5;
  t.clipNorm = 0.1; // clips: the per-task pipeline runs on each stage
  TrainerCore whole(m, heads, t);
  const Batch b = whole.model().syntheticBatch(8, 3);
  whole.computeGradients(b, Schedule{});
  const auto want = grads(whole.model());

  TrainerCore s0(m, heads, t), s1(m, heads, t);
  s0.restrictToStage(0, 2, {false, true});
  s1.restrictToStage(3, 4, {true, false});
  EXPECT_EQ(s0.model().numParameters() + s1.model().numParameters(),
            whole.model().numParameters());
  s0.beginStep(b);
  s1.beginStep(b);
  const bool features = scope == GradScope::Features;
  for (int64_t mb = 0; mb < 2; ++mb) {
    s0.beginMicroBatch(mb);
    const ValueId out = s0.forward(0, 2, s0.input(), RegionMode::Keep);
    s0.setBoundaryOutput(out);
    s0.forwardHead(1, false);
    s0.backwardHead(1);
    s1.beginMicroBatch(mb);
    const ValueId in = s1.inputActivation(s0.value(out).detach().clone());
    s1.forward(3, 4, in, RegionMode::Keep);
    s1.forwardHead(0, false);
    s1.backwardHead(0);
    if (!features)
      continue;
    const auto g0 = s0.processTaskGradients(), g1 = s1.processTaskGradients();
    if (mb == 0) {
      const std::vector<double> losses = {g1.losses[0], g0.losses[1]},
                                norms = {g1.norms[0], g0.norms[1]};
      const std::vector<double> alpha =
          s1.pipelineAlpha({g1.processed[0], g0.processed[1]}, losses, norms,
                           {g1.fusing[0], g0.fusing[1]});
      EXPECT_EQ(alpha, (std::vector<double>{0.5, 0.5}));
      s1.setAlpha(alpha);
      s0.setAlpha(alpha);
    }
  }
  for (int64_t mb = 0; mb < 2; ++mb) {
    s1.resumeMicroBatch(mb);
    s1.backwardBackbone();
    const at::Tensor g = s1.inputGradient();
    ASSERT_TRUE(g.defined());
    s0.resumeMicroBatch(mb);
    s0.setBoundaryGradient(g);
    s0.backwardBackbone();
  }
  s0.endStep(false);
  s1.endStep(false);
  auto got = grads(s0.model());
  for (auto &[name, g] : grads(s1.model()))
    got[name] = g;
  ASSERT_EQ(got.size(), want.size());
  for (const auto &[name, g] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(at::allclose(got[name], g, 1e-5, 1e-7)) << name;
  }
}
} // namespace

TEST(PipelineStages, FeaturesScopeMatchesTheWholeModel) {
  twoStagesMatchTheWholeModel(GradScope::Features);
}

TEST(PipelineStages, SumScopeMatchesTheWholeModel) {
  twoStagesMatchTheWholeModel(GradScope::Sum);
}

TEST(PipelineStages, RefusesWhatAStageCannotRun) {
  TrainerCore s(fixtures::tinyModel(), {fixtures::classifyHead("cls", 2, 4)},
                TrainConfig{});
  s.restrictToStage(3, 4, {true});
  // A unit of the other stage, and micro-batch 0's fusion without α.
  const Batch b = s.model().syntheticBatch(4, 1);
  s.beginStep(b);
  s.beginMicroBatch(0);
  EXPECT_THROW(s.forward(0, 2, s.input(), RegionMode::Keep),
               std::logic_error);
  s.abortStep();
  s.beginStep(b);
  s.beginMicroBatch(0);
  const ValueId in = s.inputActivation(at::zeros({4, 8, 16}));
  s.forward(3, 4, in, RegionMode::Keep);
  s.forwardHead(0, false);
  s.backwardHead(0);
  EXPECT_THROW(s.backwardBackbone(), std::logic_error);
}
