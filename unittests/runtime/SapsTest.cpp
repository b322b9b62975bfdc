//===- SapsTest.cpp - SAPS's selection and sparse AdamW (D12) -------------===//

#include "Fixtures.h"

#include "mtprt/torch/Saps.h"
#include "mtprt/torch/Trainer.h"

#include <torch/optim/adamw.h>

#include <gtest/gtest.h>

using namespace mtprt;

namespace {

/// The importance, ranked by hand: the top k flat indices, sorted.
at::Tensor referenceSelection(const at::Tensor &theta, const at::Tensor &g,
                              double lambda, int64_t k) {
  at::Tensor imp = (theta.reshape(-1) * g.reshape(-1)).abs() +
                   lambda * g.reshape(-1) * g.reshape(-1);
  return std::get<0>(std::get<1>(imp.topk(k)).sort());
}

std::vector<at::Tensor> params(int seed) {
  at::manual_seed(seed);
  return {at::randn({20, 10}).requires_grad_(true),
          at::randn({37}).requires_grad_(true)};
}

} // namespace

TEST(SapsConfig, SelectsTheFractionRoundedAtLeastOne) {
  SapsConfig c; // 3%
  EXPECT_EQ(c.selected(1000), 30);
  EXPECT_EQ(c.selected(10), 1);  // 0.3 rounds to 0: at least one
  EXPECT_EQ(c.selected(50), 2);  // 1.5 rounds to even
  EXPECT_EQ(c.selected(0), 0);
  c.fraction = 1.0;
  EXPECT_EQ(c.selected(7), 7);
  EXPECT_TRUE(c.rerankAt(0));
  EXPECT_FALSE(c.rerankAt(999));
  EXPECT_TRUE(c.rerankAt(2000));
}

TEST(Saps, SelectsTheTopImportancePerTensor) {
  for (double lambda : {0.0, 1.0, 50.0}) {
    std::vector<at::Tensor> ps = params(1);
    SapsConfig c{0.1, 1000, lambda};
    SparseUpdate s(ps, c, /*hooks=*/false);
    s.beginStep(0);
    at::manual_seed(2);
    for (size_t i = 0; i < ps.size(); ++i) {
      at::Tensor g = at::randn(ps[i].sizes());
      s.add(i, g);
      at::Tensor want = referenceSelection(ps[i].detach(), g, lambda,
                                           c.selected(ps[i].numel()));
      EXPECT_TRUE(at::equal(s.selection(i), want)) << "lambda " << lambda;
      EXPECT_TRUE(at::equal(s.gradient(i), g.reshape(-1).index_select(0, want)));
    }
    EXPECT_DOUBLE_EQ(s.lastTurnover(), 1.0);
  }
}

// Data parallelism (docs/techniques.md D12): a ranking reads the dense
// gradient averaged over the ranks (here a stand-in that halves it: two
// ranks, the other's zero); a step whose ranks cannot rank alike keeps the
// selections and folds nothing into a tensor never ranked; the exchange
// averages the compact gradients and which tensors got one.
TEST(Saps, RanksTogetherOrKeepsTheSelection) {
  std::vector<at::Tensor> ps = params(1);
  SapsConfig c{0.1, 2, 0.0};
  SparseUpdate s(ps, c, /*hooks=*/false);
  int averaged = 0;
  s.averageDense = [&](const at::Tensor &g) {
    ++averaged;
    g.mul_(0.5);
  };
  s.beginStep(0, 1.0, /*rankable=*/false);
  EXPECT_TRUE(s.wouldRank(0));
  at::manual_seed(2);
  at::Tensor g0 = at::randn(ps[0].sizes());
  s.add(0, g0.clone());
  EXPECT_EQ(averaged, 0);
  EXPECT_EQ(s.gradient(0).abs().sum().item<float>(), 0.0f); // nothing folded

  s.beginStep(0, 1.0, /*rankable=*/true);
  at::Tensor g = g0.clone();
  s.add(0, g);
  EXPECT_EQ(averaged, 1);
  const at::Tensor want =
      referenceSelection(ps[0].detach(), g0, 0.0, c.selected(ps[0].numel()));
  EXPECT_TRUE(at::equal(s.selection(0), want));
  EXPECT_TRUE(at::allclose(s.gradient(0),
                           0.5 * g0.reshape(-1).index_select(0, want)));
  s.add(1, at::randn(ps[1].sizes()));
  EXPECT_EQ(averaged, 2);
  EXPECT_FALSE(s.wouldRank(1)); // both ranked, step 1 is not a re-rank step
  EXPECT_TRUE(s.wouldRank(2));

  // A re-rank step the ranks cannot rank alike: the selection stays.
  s.beginStep(2, 1.0, /*rankable=*/false);
  s.add(0, at::randn(ps[0].sizes()));
  EXPECT_TRUE(at::equal(s.selection(0), want));
  EXPECT_EQ(averaged, 2);

  // The exchange: the compact gradients and the got flags, in one list.
  std::vector<int64_t> sizes;
  const int64_t bytes = s.averageGradients([&](std::vector<at::Tensor> &ts) {
    for (at::Tensor &t : ts)
      sizes.push_back(t.numel());
  });
  EXPECT_EQ(sizes, (std::vector<int64_t>{c.selected(ps[0].numel()),
                                         c.selected(ps[1].numel()), 2}));
  EXPECT_EQ(bytes, 4 * (sizes[0] + sizes[1] + sizes[2]));
}

TEST(Saps, TheLossScaleDoesNotChangeTheRanking) {
  std::vector<at::Tensor> ps = params(3);
  SapsConfig c{0.2, 1000, 10.0};
  SparseUpdate a(ps, c, false), b(ps, c, false);
  at::manual_seed(4);
  at::Tensor g = at::randn(ps[0].sizes());
  a.beginStep(0, 1.0);
  a.add(0, g);
  b.beginStep(0, 1024.0);
  b.add(0, g * 1024.0);
  EXPECT_TRUE(at::equal(a.selection(0), b.selection(0)));
}

// The update equals a dense AdamW step restricted to the selection: selected
// entries as torch::optim::AdamW leaves them, the others untouched.
TEST(Saps, UpdateIsDenseAdamWRestrictedToTheSelection) {
  std::vector<at::Tensor> ps = params(5);
  std::vector<at::Tensor> dense;
  for (const at::Tensor &p : ps)
    dense.push_back(p.detach().clone().requires_grad_(true));
  const std::vector<at::Tensor> initial = {ps[0].detach().clone(),
                                           ps[1].detach().clone()};
  SapsConfig c{0.05, 1000, 1.0};
  SparseUpdate s(ps, c, false);
  torch::optim::AdamW ref(dense, torch::optim::AdamWOptions(1e-2)
                                     .weight_decay(0.1)
                                     .betas({0.9, 0.99})
                                     .eps(1e-8));
  SparseAdamW o{1e-2, 0.9, 0.99, 1e-8, 0.1};
  for (int step = 0; step < 4; ++step) {
    at::manual_seed(10 + step);
    s.beginStep(step);
    for (size_t i = 0; i < ps.size(); ++i) {
      at::Tensor g = at::randn(ps[i].sizes());
      // Two micro-batches: their sum is the step's gradient.
      s.add(i, g * 0.25);
      s.add(i, g * 0.75);
      dense[i].mutable_grad() = g.clone();
    }
    s.step(o);
    ref.step();
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    at::Tensor flat = ps[i].detach().reshape(-1);
    at::Tensor sel = s.selection(i);
    EXPECT_TRUE(at::allclose(flat.index_select(0, sel),
                             dense[i].detach().reshape(-1).index_select(0, sel),
                             1e-6, 1e-7));
    at::Tensor other = at::ones({flat.numel()}, at::kBool).index_fill_(0, sel, false);
    EXPECT_TRUE(at::equal(flat.masked_select(other),
                          initial[i].reshape(-1).masked_select(other)));
    EXPECT_GT((flat.index_select(0, sel) -
               initial[i].reshape(-1).index_select(0, sel))
                  .abs()
                  .min()
                  .item<double>(),
              0.0);
  }
}

// At a re-rank, entries selected before keep their moments and step counts;
// new ones start afresh (their first update is AdamW's first: about lr in
// size, whatever the step).
TEST(Saps, ReRankingCarriesTheStateOfKeptEntries) {
  std::vector<at::Tensor> ps = {at::randn({400}).requires_grad_(true)};
  SapsConfig c{0.1, 2, 0.0};
  SparseUpdate s(ps, c, false);
  SparseAdamW o{1e-3, 0.9, 0.999, 1e-8, 0.0};
  at::Tensor g = at::randn({400});
  for (int step = 0; step < 2; ++step) {
    s.beginStep(step);
    s.add(0, g);
    s.step(o);
  }
  const at::Tensor before = s.selection(0).clone();
  const std::vector<at::Tensor> stateBefore = s.state();
  // A gradient that keeps half the old selection's entries on top.
  at::Tensor g2 = at::zeros({400});
  g2.index_fill_(0, before.slice(0, 0, 20), 10.0);
  at::Tensor fresh = at::arange(0, 400, 2).masked_select(
      at::isin(at::arange(0, 400, 2), before).logical_not()).slice(0, 0, 20);
  g2.index_fill_(0, fresh, 10.0);
  const at::Tensor theta = ps[0].detach().clone();
  s.beginStep(2);
  s.add(0, g2);
  EXPECT_NEAR(s.lastTurnover(), 0.5, 1e-12);
  std::vector<at::Tensor> st = s.state();
  at::Tensor sel = st[0], steps = st[3];
  for (int64_t j = 0; j < sel.numel(); ++j) {
    const bool kept = at::isin(sel[j], before).item<bool>();
    EXPECT_EQ(steps[j].item<float>(), kept ? 2.0f : 0.0f);
    if (kept) {
      const int64_t at = at::searchsorted(before, sel[j]).item<int64_t>();
      EXPECT_EQ(st[1][j].item<float>(), stateBefore[1][at].item<float>());
    }
  }
  s.step(o);
  for (int64_t j = 0; j < sel.numel(); ++j)
    if (!at::isin(sel[j], before).item<bool>()) {
      const int64_t e = sel[j].item<int64_t>();
      EXPECT_NEAR(ps[0].detach()[e].item<double>(),
                  theta[e].item<double>() - 1e-3, 1e-6);
    }
}

TEST(Saps, HooksFoldTheGradientAndDropTheDenseOne) {
  at::manual_seed(7);
  at::Tensor w = at::randn({16, 8}).requires_grad_(true);
  at::Tensor x = at::randn({4, 16});
  SparseUpdate s({w}, SapsConfig{0.1, 1000, 1.0});
  s.beginStep(0);
  at::matmul(x, w).pow(2).sum().backward();
  EXPECT_FALSE(w.grad().defined());
  at::matmul(x, w).pow(2).sum().backward(); // a second micro-batch
  EXPECT_FALSE(w.grad().defined());
  at::Tensor g = 2 * at::matmul(x.t(), 2 * at::matmul(x, w.detach()));
  EXPECT_TRUE(at::allclose(s.gradient(0),
                           g.reshape(-1).index_select(0, s.selection(0)),
                           1e-5, 1e-5));
}

TEST(Saps, LoadStateChecksBeforeChangingAnything) {
  std::vector<at::Tensor> ps = params(8);
  SapsConfig c{0.1, 1000, 1.0};
  SparseUpdate s(ps, c, false);
  s.beginStep(0);
  for (size_t i = 0; i < ps.size(); ++i)
    s.add(i, at::randn(ps[i].sizes()));
  s.step({});
  const std::vector<at::Tensor> good = s.state();
  SparseUpdate t(ps, c, false);
  t.loadState(good);
  for (size_t i = 0; i < good.size(); ++i)
    EXPECT_TRUE(at::equal(t.state()[i], good[i]));

  auto expectRefused = [&](std::vector<at::Tensor> bad, const char *what) {
    SparseUpdate u(ps, c, false);
    const std::vector<at::Tensor> before = u.state();
    try {
      u.loadState(bad);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::runtime_error &e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos)
          << e.what();
    }
    for (size_t i = 0; i < before.size(); ++i)
      EXPECT_TRUE(at::equal(u.state()[i], before[i]));
  };
  expectRefused({good.begin(), good.begin() + 4}, "4 tensors for 2");
  std::vector<at::Tensor> b = good;
  b[0] = b[0].clone();
  b[0][0] = 1000;
  expectRefused(b, "outside");
  b = good;
  b[0] = b[0].flip(0);
  expectRefused(b, "strictly increasing");
  b = good;
  b[6] = -b[6].abs() - 1;
  expectRefused(b, "negative");
  b = good;
  b[4] = at::arange(2, at::kLong);
  expectRefused(b, "another saps fraction");
  SparseUpdate other(ps, SapsConfig{0.2, 1000, 1.0}, false);
  EXPECT_THROW(other.loadState(good), std::runtime_error);
}

// In the trainer: no dense gradient or AdamW state for the backbone, its
// unselected entries unchanged after steps; the heads update densely.
TEST(Saps, TrainerUpdatesOnlyTheSelectedBackboneEntries) {
  using namespace fixtures;
  TrainConfig tc;
  tc.saps = SapsConfig{0.05, 1000, 1.0};
  tc.cosineEvery = 0;
  TrainerCore core(tinyModel(), {classifyHead("cls", 2, 3), tagHead("pos", 1, 5)},
                   tc);
  std::vector<at::Tensor> bb;
  for (const at::Tensor &p : core.model().backboneParameters())
    bb.push_back(p.detach().clone());
  std::vector<at::Tensor> head;
  for (const at::Tensor &p : core.model().headParameters(0))
    head.push_back(p.detach().clone());
  Batch b = core.model().syntheticBatch(8, 1);
  for (int i = 0; i < 3; ++i)
    core.step(b, Schedule{});
  EXPECT_TRUE(core.optimizer().param_groups()[0].params().empty());
  SparseUpdate *s = core.sparseUpdate();
  ASSERT_NE(s, nullptr);
  int64_t changed = 0, selected = 0;
  std::vector<at::Tensor> now = core.model().backboneParameters();
  ASSERT_EQ(s->params().size(), now.size());
  for (size_t i = 0; i < now.size(); ++i) {
    EXPECT_FALSE(now[i].grad().defined());
    at::Tensor diff = (now[i].detach() != bb[i]).reshape(-1);
    at::Tensor mask = at::zeros_like(diff).index_fill_(0, s->selection(i), true);
    EXPECT_FALSE(diff.logical_and(mask.logical_not()).any().item<bool>());
    changed += diff.sum().item<int64_t>();
    selected += s->selection(i).numel();
  }
  EXPECT_GT(changed, selected / 2); // most selected entries moved
  const std::vector<at::Tensor> h = core.model().headParameters(0);
  for (size_t i = 0; i < h.size(); ++i)
    EXPECT_FALSE(at::equal(h[i].detach(), head[i]));
}

TEST(Saps, TrainerRefusesTheParamsScope) {
  using namespace fixtures;
  TrainConfig tc;
  tc.saps = SapsConfig{};
  tc.scope = GradScope::Params;
  EXPECT_THROW(TrainerCore(tinyModel(), {classifyHead("cls", 2, 3)}, tc),
               std::invalid_argument);
}
