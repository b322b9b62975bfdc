//===- EwcTest.cpp - EWC's Fisher, penalty and state (D14) ----------------===//

#include "Fixtures.h"

#include "mtprt/torch/Ewc.h"
#include "mtprt/torch/Trainer.h"

#include <gtest/gtest.h>

using namespace mtprt;

namespace {
std::vector<at::Tensor> params(int seed) {
  at::manual_seed(seed);
  return {at::randn({6, 4}).requires_grad_(true),
          at::randn({5}).requires_grad_(true)};
}
} // namespace

// F is the mean of the samples' squared gradients, added to the earlier F;
// θ* the weights at consolidation; the penalty λ·Σ F·(θ − θ*)² and its
// gradient 2λ·F·(θ − θ*) as computed directly.
TEST(Ewc, FisherPenaltyAndGradientAgainstADirectComputation) {
  std::vector<at::Tensor> ps = params(1);
  EwcConfig c{50.0, 3};
  ElasticConsolidation e(ps, c);
  EXPECT_FALSE(e.active());
  EXPECT_EQ(e.addPenaltyGradient(), 0.0);
  std::vector<at::Tensor> want(ps.size());
  for (size_t i = 0; i < ps.size(); ++i)
    want[i] = at::zeros_like(ps[i]);
  for (int s = 0; s < 3; ++s) {
    for (size_t i = 0; i < ps.size(); ++i) {
      ps[i].mutable_grad() = at::randn(ps[i].sizes());
      want[i] += ps[i].grad() * ps[i].grad() / 3.0;
    }
    e.addFisherSample();
  }
  e.consolidate();
  ASSERT_TRUE(e.active());
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(at::allclose(e.fisher()[i], want[i], 1e-6, 1e-7));
    EXPECT_TRUE(at::equal(e.anchor()[i], ps[i].detach()));
  }
  // Move the weights; the penalty and its gradient.
  std::vector<at::Tensor> theta0;
  for (at::Tensor &p : ps) {
    theta0.push_back(p.detach().clone());
    p.detach().add_(at::randn(p.sizes()) * 0.1);
    p.mutable_grad() = at::ones(p.sizes());
  }
  const double penalty = e.addPenaltyGradient();
  double direct = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    at::Tensor d = ps[i].detach() - theta0[i];
    direct += (want[i] * d * d).sum().item<double>();
    EXPECT_TRUE(at::allclose(ps[i].grad(), 1.0 + 2.0 * 50.0 * want[i] * d,
                             1e-5, 1e-6));
  }
  EXPECT_NEAR(penalty, 50.0 * direct, 1e-6 * std::abs(50.0 * direct) + 1e-9);
  // A second phase adds to F (online EWC) and moves θ*.
  for (at::Tensor &p : ps)
    p.mutable_grad() = at::ones(p.sizes());
  for (int s = 0; s < 3; ++s)
    e.addFisherSample();
  e.consolidate();
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(at::allclose(e.fisher()[i], want[i] + 1.0, 1e-6, 1e-7));
    EXPECT_TRUE(at::equal(e.anchor()[i], ps[i].detach()));
  }
  EXPECT_EQ(e.consolidations(), 2);
}

// A tensor without a gradient (the phase's tasks do not reach it) is left
// alone: no gradient is made for it.
TEST(Ewc, NoGradientMadeWhereThePhaseHasNone) {
  std::vector<at::Tensor> ps = params(2);
  ElasticConsolidation e(ps, EwcConfig{1.0, 1});
  ps[0].mutable_grad() = at::ones(ps[0].sizes());
  e.addFisherSample();
  e.consolidate();
  ps[0].detach().add_(1.0);
  ps[1].mutable_grad() = at::Tensor();
  e.addPenaltyGradient();
  EXPECT_FALSE(ps[1].grad().defined());
  EXPECT_TRUE(at::allclose(ps[0].grad(), at::ones(ps[0].sizes()) * 3.0));
}

TEST(Ewc, LoadStateChecksBeforeChangingAnything) {
  std::vector<at::Tensor> ps = params(3);
  ElasticConsolidation e(ps, EwcConfig{});
  for (at::Tensor &p : ps)
    p.mutable_grad() = at::randn(p.sizes());
  e.addFisherSample();
  e.consolidate();
  const std::vector<at::Tensor> good = e.state();
  ElasticConsolidation f(ps, EwcConfig{});
  f.loadState(good);
  EXPECT_EQ(f.consolidations(), 1);
  for (size_t i = 0; i < ps.size(); ++i)
    EXPECT_TRUE(at::equal(f.fisher()[i], e.fisher()[i]));
  auto refused = [&](std::vector<at::Tensor> bad, const char *what) {
    ElasticConsolidation g(ps, EwcConfig{});
    try {
      g.loadState(bad);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::runtime_error &err) {
      EXPECT_NE(std::string(err.what()).find(what), std::string::npos)
          << err.what();
    }
    EXPECT_FALSE(g.active());
  };
  refused({good.begin(), good.begin() + 2}, "a checkpoint of another model");
  std::vector<at::Tensor> b = good;
  b[0] = -b[0] - 1;
  refused(b, "negative or non-finite");
  b = good;
  b[1] = at::zeros({3});
  refused(b, "another shape");
  b = good;
  b.back() = at::tensor({-1}, at::kLong);
  refused(b, "not a count");
}

// In the trainer: a Fisher pass does not update; the penalty holds the
// backbone near θ*: 20 steps on other data move it less the larger λ is.
TEST(Ewc, TrainerPenaltyPullsTowardTheRememberedWeights) {
  using namespace fixtures;
  auto run = [](double lambda) {
    at::manual_seed(0);
    TrainConfig tc;
    tc.ewc = EwcConfig{lambda, 2};
    tc.cosineEvery = 0;
    TrainerCore core(tinyModel(), {classifyHead("cls", 2, 3), tagHead("pos", 1, 5)},
                     tc);
    Batch b = core.model().syntheticBatch(8, 1);
    for (int i = 0; i < 3; ++i)
      core.step(b, Schedule{});
    std::vector<at::Tensor> before;
    for (const at::Tensor &p : core.model().backboneParameters())
      before.push_back(p.detach().clone());
    const int64_t steps = core.stepsTaken();
    core.addFisherSample(b, Schedule{});
    core.addFisherSample(b, Schedule{});
    core.consolidate();
    EXPECT_EQ(core.stepsTaken(), steps);
    for (size_t i = 0; i < before.size(); ++i)
      EXPECT_TRUE(at::equal(core.model().backboneParameters()[i].detach(),
                            before[i]));
    Batch other = core.model().syntheticBatch(8, 7);
    double moved = 0;
    for (int i = 0; i < 20; ++i) {
      StepStats s = core.step(other, Schedule{});
      EXPECT_GE(s.ewcPenalty, 0.0);
    }
    for (size_t i = 0; i < before.size(); ++i)
      moved += (core.model().backboneParameters()[i].detach() - before[i])
                   .pow(2)
                   .sum()
                   .item<double>();
    return moved;
  };
  // The tiny model's Fisher is small (~g² of 1e-2 gradients): the pull
  // shows at a large λ, and grows with it.
  const double free = run(0.0), mild = run(1e5), strong = run(1e8);
  EXPECT_LT(mild, free);
  EXPECT_LT(strong, 0.5 * free);
}
