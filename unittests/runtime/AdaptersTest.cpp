//===- AdaptersTest.cpp - NPD gated adapters and their gates (D13) ---------===//

#include "Fixtures.h"

#include "mtprt/torch/Model.h"
#include "mtprt/torch/Trainer.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adamw.h>

#include <gtest/gtest.h>

#include <limits>

using namespace mtprt;
using namespace fixtures;

namespace {
ModelConfig adapted(int64_t bottleneck) {
  ModelConfig c = tinyModel();
  c.adapters = AdapterConfig{bottleneck, 0.5};
  return c;
}

at::Tensor named(const Model &m, const std::string &name) {
  for (const auto &[n, p] : m.namedParameters())
    if (n == name)
      return p;
  ADD_FAILURE() << "no parameter " << name;
  return {};
}
} // namespace

TEST(Adapters, BottleneckAndParameterCount) {
  AdapterConfig c;
  c.bottleneck = 7;
  EXPECT_EQ(c.bottleneckFor(64, 1000000), 7);
  EXPECT_EQ(AdapterConfig::parameters(64, 7), 64 * 7 + 7 + 7 * 64 + 64 + 128);
  c.bottleneck = 0; // about 0.1% of the backbone per task, at least 1
  const int64_t r = c.bottleneckFor(768, 85000000);
  EXPECT_NEAR(double(AdapterConfig::parameters(768, r)), 85000.0, 768.0 * 2);
  EXPECT_EQ(c.bottleneckFor(64, 1000), 1);
  EXPECT_EQ(c.bottleneckFor(8, int64_t(1) << 40), 8);
}

// A fresh adapter is the identity (up starts at zero), drawn after every
// head's own parameters: the plain model's initialization and outputs.
TEST(Adapters, FreshAdapterIsTheIdentityAndLeavesTheInitialization) {
  Model plain(tinyModel(), twoHeads()), with(adapted(4), twoHeads());
  for (const auto &[n, p] : plain.namedParameters())
    EXPECT_TRUE(at::equal(p, named(with, n))) << n;
  EXPECT_EQ(with.numParameters() - plain.numParameters(),
            2 * AdapterConfig::parameters(16, 4));
  plain.setTraining(false);
  with.setTraining(false);
  Batch b = plain.syntheticBatch(3, 5);
  at::Tensor tap1 = plain.runUnits(0, Model::tapUnit(1), b.tokens);
  at::Tensor tap2 = plain.runUnits(0, Model::tapUnit(2), b.tokens);
  EXPECT_TRUE(at::equal(plain.head(0, tap1)[0], with.head(0, tap1)[0]));
  EXPECT_TRUE(at::equal(plain.head(1, tap2)[0], with.head(1, tap2)[0]));
}

// y = x + (1 − g)·up(relu(down(x))), g = σ(a + w ⊙ mean_seq(x)), against
// the formula written out, for a tag head (x = the tap) and a classify head
// (x = the first token, its own mean).
TEST(Adapters, GateFormulaAgainstADirectComputation) {
  Model m(adapted(3), twoHeads());
  m.setTraining(false);
  at::manual_seed(7);
  {
    torch::autograd::AutoGradMode g(false);
    for (const auto &[n, p] : m.namedParameters())
      if (n.find(".adapter.") != std::string::npos)
        p.copy_(at::randn(p.sizes()) * 0.5);
  }
  at::Tensor x = at::randn({2, 8, 16});
  for (int64_t h : {0, 1}) {
    const std::string n = "head." + m.heads()[h].name + ".adapter.";
    at::Tensor xin = h == 0 ? x.select(1, 0) : x;
    at::Tensor mean = h == 0 ? xin : xin.mean(1);
    at::Tensor g = at::sigmoid(named(m, n + "gate.bias") +
                               named(m, n + "gate.weight") * mean);
    at::Tensor u = at::linear(
        at::relu(at::linear(xin, named(m, n + "down.weight"),
                            named(m, n + "down.bias"))),
        named(m, n + "up.weight"), named(m, n + "up.bias"));
    at::Tensor y = xin + (1 - (h == 0 ? g : g.unsqueeze(1))) * u;
    // The plain head on y: a model without adapters, same head weights.
    Model plain(tinyModel(), twoHeads());
    {
      torch::autograd::AutoGradMode guard(false);
      for (const auto &[pn, p] : plain.namedParameters())
        p.copy_(named(m, pn));
    }
    plain.setTraining(false);
    at::Tensor want =
        h == 0 ? plain.head(0, at::cat({y.unsqueeze(1), x.narrow(1, 1, 7)}, 1))[0]
               : plain.head(1, y)[0];
    EXPECT_TRUE(at::allclose(m.head(h, x)[0], want, 1e-5, 1e-6)) << h;
    // gateMean: the batch mean of g, its gradient on the gate only.
    at::Tensor gm = m.gateMean(h, x);
    EXPECT_TRUE(at::allclose(gm, g.mean(0), 1e-6, 1e-7));
    EXPECT_FALSE(x.requires_grad());
    EXPECT_TRUE(gm.requires_grad());
  }
}

// The separation loss: the mean of the upper triangle's cosines, as the
// source's gate_loss but over the T(T−1)/2 pairs.
TEST(Adapters, SeparationAgainstADirectComputation) {
  at::manual_seed(3);
  std::vector<at::Tensor> gates = {at::rand({5}), at::rand({5}), at::rand({5})};
  double sum = 0;
  for (int i = 0; i < 3; ++i)
    for (int j = i + 1; j < 3; ++j)
      sum += at::cosine_similarity(gates[i], gates[j], 0).item<double>();
  EXPECT_NEAR(Model::gateSeparation(gates).item<double>(), sum / 3, 1e-6);
  EXPECT_NEAR(Model::gateSeparation({gates[0], gates[0]}).item<double>(), 1.0,
              1e-6);
  EXPECT_THROW(Model::gateSeparation({gates[0]}), std::invalid_argument);
}

// In the trainer: the step records the separation; its gradient reaches
// only the gates, and with the backbone frozen only heads and adapters move.
TEST(Adapters, TrainerSeparatesTheGatesOnly) {
  auto gates = [](double separation, bool frozen) {
    ModelConfig c = adapted(4);
    c.adapters->separation = separation;
    if (frozen)
      c.freezeFirst = 0, c.freezeLast = c.layers;
    TrainConfig tc;
    tc.cosineEvery = 0;
    TrainerCore core(c, twoHeads(), tc);
    Batch b = core.model().syntheticBatch(8, 1);
    std::vector<at::Tensor> before;
    for (const at::Tensor &p : core.model().backboneParameters())
      before.push_back(p.detach().clone());
    std::vector<double> sep;
    for (int i = 0; i < 4; ++i)
      sep.push_back(core.step(b, Schedule{}).gateSeparation);
    bool backboneMoved = false;
    const std::vector<at::Tensor> now = core.model().backboneParameters();
    for (size_t i = 0; i < now.size(); ++i)
      backboneMoved |= !at::equal(now[i], before[i]);
    return std::make_tuple(sep, backboneMoved,
                           core.model().gateParameters(0)[0].detach().clone());
  };
  auto [sep0, moved0, bias0] = gates(0.0, false);
  auto [sep, moved, bias] = gates(50.0, false);
  EXPECT_EQ(sep0[0], -1.0); // weight 0: no gate means, nothing recorded
  ASSERT_GT(sep[0], 0.0);
  EXPECT_LT(sep.back(), sep[0]); // the gates part
  EXPECT_TRUE(moved);
  EXPECT_FALSE(at::equal(bias0, bias));
  auto [sepF, movedF, biasF] = gates(50.0, true);
  EXPECT_FALSE(movedF);
  EXPECT_LT(sepF.back(), sepF[0]);
}

// One rule for a group's owners, asked by the plan reader and the model:
// each task reads its own adapter or an earlier task's own.
TEST(Adapters, OwnersFormGroupsOrTheModelRefusesThem) {
  AdapterConfig a;
  EXPECT_EQ(a.ownerProblem(3), "");
  a.owner = {0, 0, 2};
  EXPECT_EQ(a.ownerProblem(3), "");
  EXPECT_EQ(a.ownerProblem(2), "has 3 entries for 2 heads");
  a.owner = {0, 0, 1};
  EXPECT_EQ(a.ownerProblem(3),
            "head 2 reads head 1's adapter, which is not an earlier head's own");
  a.owner = {0, 2, 2};
  EXPECT_NE(a.ownerProblem(3).find("head 1 reads head 2's"), std::string::npos);
  a.owner = {-1, 1};
  EXPECT_NE(a.ownerProblem(2).find("head 0 reads head -1's"), std::string::npos);
  ModelConfig c = adapted(4);
  c.adapters->owner = {1, 1};
  try {
    Model m(c, twoHeads());
    ADD_FAILURE() << "owners {1, 1} accepted";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("ModelConfig.adapters.owner"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("head 0 reads head 1's"),
              std::string::npos)
        << e.what();
  }
}

// npd(share): a task reading its group's adapter holds only its gate; the
// adapter is one set of leaves (the owner's, listed once: one optimizer
// state, one checkpoint name), and each member's head backward adds its part
// to the one gradient: with both tasks' labels it is the sum of each alone.
TEST(Adapters, SharedAdapterSumsItsMembersGradients) {
  ModelConfig c = adapted(4);
  c.dropout = 0.0;
  c.adapters->separation = 0.0;
  c.adapters->owner = {0, 0};
  const std::vector<HeadConfig> heads = twoHeads();
  {
    Model m(c, heads);
    Model isolated(adapted(4), heads);
    EXPECT_EQ(isolated.numParameters() - m.numParameters(),
              AdapterConfig::adapterParameters(16, 4));
    for (const auto &[n, p] : m.namedParameters())
      EXPECT_EQ(n.find("head.tag.adapter.down"), std::string::npos) << n;
    const std::vector<at::Tensor> shared = m.sharedAdapterParameters(1);
    ASSERT_EQ(shared.size(), 4u);
    EXPECT_EQ(shared[0].unsafeGetTensorImpl(),
              named(m, "head.cls.adapter.down.weight").unsafeGetTensorImpl());
    EXPECT_TRUE(m.sharedAdapterParameters(0).empty());
    EXPECT_EQ(m.gateParameters(1)[0].unsafeGetTensorImpl(),
              named(m, "head.tag.adapter.gate.bias").unsafeGetTensorImpl());
  }
  // The adapter's gradient with these tasks' labels (the others dropped).
  auto gradient = [&](std::vector<bool> tasks) {
    TrainConfig tc;
    tc.cosineEvery = 0;
    TrainerCore core(c, heads, tc);
    at::manual_seed(11);
    {
      torch::autograd::AutoGradMode g(false);
      for (const auto &[n, p] : core.model().namedParameters())
        if (n.find(".adapter.") != std::string::npos)
          p.copy_(at::randn(p.sizes()) * 0.5);
    }
    Batch b = core.model().syntheticBatch(4, 2);
    for (size_t t = 0; t < tasks.size(); ++t)
      if (!tasks[t])
        b.labels[t] = at::Tensor();
    core.computeGradients(b, Schedule{});
    std::vector<at::Tensor> g;
    for (const at::Tensor &p : core.model().sharedAdapterParameters(1))
      g.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
    return g;
  };
  const std::vector<at::Tensor> both = gradient({true, true}),
                                first = gradient({true, false}),
                                second = gradient({false, true});
  for (size_t i = 0; i < both.size(); ++i) {
    EXPECT_GT(second[i].abs().sum().item<double>(), 0.0) << i;
    EXPECT_TRUE(at::allclose(both[i], first[i] + second[i], 1e-5, 1e-6)) << i;
  }
}

// npd(regroup): members stay together where a chain of measured cosines at
// the threshold joins them, within their old group only; a member measured
// against nobody stays; each new group's first member holds it.
TEST(Adapters, RegroupSplitsOnlyWhereTheCosinesFallBelowTheThreshold) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Group {0, 1, 2, 3}, and 4 alone.
  const std::vector<int64_t> owner = {0, 0, 0, 0, 4};
  auto cosines = [&](double c01, double c02, double c12, double c13,
                     double c23) {
    std::vector<std::vector<double>> m(5, std::vector<double>(5, nan));
    auto set = [&](int i, int j, double v) { m[i][j] = m[j][i] = v; };
    for (int i = 0; i < 4; ++i)
      m[i][i] = 1.0;
    set(0, 1, c01), set(0, 2, c02), set(1, 2, c12), set(1, 3, c13),
        set(2, 3, c23);
    set(0, 3, -1.0);
    set(3, 4, 0.99); // across groups: never joins
    return m;
  };
  using V = std::vector<int64_t>;
  // Every pair related: nothing splits.
  EXPECT_EQ(AdapterConfig::regroupedOwners(owner, cosines(.9, .9, .9, .9, .9), .5),
            owner);
  // 3 conflicts with 0 but reaches 0 through 1: transitively together.
  EXPECT_EQ(AdapterConfig::regroupedOwners(owner, cosines(.9, .9, .1, .8, .1), .5),
            owner);
  // {0, 1} and {2, 3}: 2 holds the copy, 3 reads it.
  EXPECT_EQ(AdapterConfig::regroupedOwners(owner, cosines(.9, .1, .1, .1, .7), .5),
            (V{0, 0, 2, 2, 4}));
  // Every pair below: each its own.
  EXPECT_EQ(AdapterConfig::regroupedOwners(owner, cosines(0, 0, 0, 0, 0), .5),
            (V{0, 1, 2, 3, 4}));
  // The threshold is inclusive, as the spec's share.
  EXPECT_EQ(AdapterConfig::regroupedOwners(owner, cosines(.5, 0, 0, 0, .5), .5),
            (V{0, 0, 2, 2, 4}));
  // 3 unmeasured (no labels in the batch): it stays with the owner, though
  // 1 and 2 leave.
  std::vector<std::vector<double>> m = cosines(0, 0, 0, 0, 0);
  for (int j = 0; j < 5; ++j)
    m[3][j] = m[j][3] = nan;
  EXPECT_EQ(AdapterConfig::regroupedOwners(owner, m, .5), (V{0, 1, 2, 0, 4}));
  // The holder without labels: nothing measured against it, so its group
  // stays, though its other members conflict with each other.
  m = cosines(0, 0, 0, 0, 0);
  for (int j = 0; j < 5; ++j)
    m[0][j] = m[j][0] = nan;
  EXPECT_EQ(AdapterConfig::regroupedOwners(owner, m, .5), (V{0, 0, 0, 0, 4}));
  // 1 measured below the holder leaves; 2 and 3, measured only against 1
  // (and each other, below), have no evidence against the holder: they stay.
  m = cosines(0.1, nan, 0.1, 0.1, 0.1);
  m[0][3] = m[3][0] = nan;
  EXPECT_EQ(AdapterConfig::regroupedOwners(owner, m, .5), (V{0, 1, 0, 0, 4}));
  // A split of the old groups every time: what Model::splitAdapters takes.
  for (const V &o : {V{0, 0, 2, 2, 4}, V{0, 1, 2, 0, 4}, V{0, 1, 0, 0, 4}}) {
    AdapterConfig c;
    c.owner = o;
    EXPECT_EQ(c.ownerProblem(5), "");
  }
}

// A split changes no function: the copy holds the shared adapter's values and
// AdamW state, so the next step's losses equal those of a run that never
// split; from its update on the split tasks' adapters move apart. The model
// refuses a regrouping that joins groups.
TEST(Adapters, SplitCopiesTheAdapterAndItsOptimizerState) {
  ModelConfig c = adapted(4);
  c.dropout = 0.0;
  c.adapters->owner = {0, 0};
  c.adapters->share = 0.5;
  c.adapters->regroup = 1;
  const std::vector<HeadConfig> heads = twoHeads();
  TrainConfig tc;
  tc.cosineEvery = 0;
  auto run = [&](bool split, std::vector<double> *losses)
      -> std::unique_ptr<TrainerCore> {
    auto core = std::make_unique<TrainerCore>(c, heads, tc);
    Batch b = core->model().syntheticBatch(8, 3);
    for (int i = 0; i < 2; ++i)
      core->step(b, Schedule{});
    if (split) {
      const int64_t before = core->model().numParameters();
      core->splitAdapters({0, 1});
      EXPECT_EQ(core->model().numParameters() - before,
                AdapterConfig::adapterParameters(16, 4));
      EXPECT_TRUE(core->model().sharedAdapterParameters(1).empty());
      const at::Tensor mine = named(core->model(), "head.tag.adapter.up.weight");
      const at::Tensor was = named(core->model(), "head.cls.adapter.up.weight");
      EXPECT_NE(mine.unsafeGetTensorImpl(), was.unsafeGetTensorImpl());
      EXPECT_TRUE(at::equal(mine, was));
      auto &state = core->optimizer().state();
      if (!state.count(mine.unsafeGetTensorImpl())) {
        ADD_FAILURE() << "the copy has no AdamW state";
        return core;
      }
      const auto &m = static_cast<const torch::optim::AdamWParamState &>(
          *state.at(mine.unsafeGetTensorImpl()));
      const auto &w = static_cast<const torch::optim::AdamWParamState &>(
          *state.at(was.unsafeGetTensorImpl()));
      EXPECT_EQ(m.step(), w.step());
      EXPECT_TRUE(at::equal(m.exp_avg(), w.exp_avg()));
      EXPECT_NE(m.exp_avg().data_ptr(), w.exp_avg().data_ptr());
      // The copy sits where a model built with its own adapter has it.
      std::vector<std::string> names;
      for (const auto &[n, p] : core->model().namedParameters())
        if (n.rfind("head.tag.adapter", 0) == 0)
          names.push_back(n);
      EXPECT_EQ(names, (std::vector<std::string>{
                           "head.tag.adapter.down.weight",
                           "head.tag.adapter.down.bias",
                           "head.tag.adapter.up.weight",
                           "head.tag.adapter.up.bias",
                           "head.tag.adapter.gate.bias",
                           "head.tag.adapter.gate.weight"}));
      try {
        core->splitAdapters({0, 0});
        ADD_FAILURE() << "a regrouping that joins groups was accepted";
      } catch (const std::exception &e) {
        EXPECT_NE(std::string(e.what()).find("groups only split"),
                  std::string::npos)
            << e.what();
      }
    }
    // The first step after: the same losses whether or not it split.
    losses->push_back(core->step(b, Schedule{}).loss[0]);
    losses->push_back(core->step(b, Schedule{}).loss[1]);
    return core;
  };
  std::vector<double> kept, split;
  auto a = run(false, &kept);
  auto b = run(true, &split);
  EXPECT_EQ(kept[0], split[0]);
  EXPECT_NE(kept[1], split[1]); // then each task's adapter its own way
  EXPECT_FALSE(at::equal(named(b->model(), "head.tag.adapter.up.weight"),
                         named(b->model(), "head.cls.adapter.up.weight")));
}
