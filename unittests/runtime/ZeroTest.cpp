//===- ZeroTest.cpp - the sharded and offloaded AdamW (docs/zero.md) ------===//
//
// One process (two and four: test/tools/zero.test): the layout's arithmetic,
// the update against LibTorch's AdamW, parameters without a gradient, the
// offloaded state in the host pool, and the checkpoint state's checks. Two
// processes: stage 2's gradients released during the backward.

#include "mtprt/Zero.h"
#include "mtprt/torch/Optimizer.h"
#include "mtprt/torch/Regions.h"
#include "mtprt/torch/Zero.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <limits>
#include <mutex>
#include <thread>

#include "MultiProcess.h"

using namespace mtprt;

namespace {
std::vector<std::vector<at::Tensor>> groups(int seed) {
  at::manual_seed(seed);
  return {{at::randn({7, 5}).requires_grad_(true),
           at::randn({3}).requires_grad_(true)},
          {at::randn({4, 4}).requires_grad_(true)}};
}

void setGrads(std::vector<std::vector<at::Tensor>> &gs, int seed,
              bool skipLast = false) {
  at::manual_seed(seed);
  for (auto &g : gs)
    for (at::Tensor &p : g)
      p.mutable_grad() = at::randn(p.sizes());
  if (skipLast)
    gs.back().back().mutable_grad() = at::Tensor();
}
} // namespace

TEST(ZeroLayout, RunsBucketsAndTransients) {
  EXPECT_EQ(ZeroLayout::shardValues(10, 1), 10);
  EXPECT_EQ(ZeroLayout::shardValues(10, 3), 4);
  EXPECT_EQ(ZeroLayout::shardValues(12, 4), 3);
  // An eighth of the run, within [16 Ki, 4 Mi], never more than the run.
  EXPECT_EQ(ZeroLayout::bucketValues(1000, 2), 500);
  EXPECT_EQ(ZeroLayout::bucketValues(int64_t(1) << 24, 2), int64_t(1) << 20);
  EXPECT_EQ(ZeroLayout::bucketValues(int64_t(1) << 40, 8),
            ZeroLayout::kMaxBucketValues);
  EXPECT_EQ(ZeroLayout::bucketValues(200000, 2), ZeroLayout::kMinBucketValues);
  EXPECT_EQ(ZeroLayout::stateBytes(10, 3), 32);
  // 16-bit weights: the offload at bf16 (fp16 at one process), below stage
  // 3 as it runs, not the params scope; the masters 4 B a value of the run.
  //                                      offload bf16  fp16  stage world params
  EXPECT_TRUE(ZeroLayout::halfProjections(true, true, false, 0, 4, false));
  EXPECT_TRUE(ZeroLayout::halfProjections(true, true, false, 1, 4, false));
  EXPECT_TRUE(ZeroLayout::halfProjections(true, true, false, 3, 1, false));
  EXPECT_TRUE(ZeroLayout::halfProjections(true, true, false, 2, 2, false));
  EXPECT_FALSE(ZeroLayout::halfProjections(true, true, false, 3, 2, false));
  EXPECT_FALSE(ZeroLayout::halfProjections(false, true, false, 0, 1, false));
  EXPECT_FALSE(ZeroLayout::halfProjections(true, false, false, 0, 1, false));
  EXPECT_FALSE(ZeroLayout::halfProjections(true, true, false, 0, 1, true));
  EXPECT_TRUE(ZeroLayout::halfProjections(true, false, true, 0, 1, false));
  EXPECT_TRUE(ZeroLayout::halfProjections(true, false, true, 3, 1, false));
  EXPECT_FALSE(ZeroLayout::halfProjections(true, false, true, 0, 2, false));
  EXPECT_FALSE(ZeroLayout::halfProjections(true, false, true, 1, 2, false));
  EXPECT_EQ(ZeroLayout::masterBytes(10, 3), 16);
}

// At one process every run is the whole parameter: the same fused kernel on
// the same tensors as LibTorch's state, so the same bits; a parameter
// without a gradient keeps its value and its step count.
TEST(ZeroOptimizer, OneProcessIsAdamWBitForBit) {
  auto mine = groups(1), ref = groups(1);
  ZeroOptimizer zero(nullptr, 1, mine, AdamWHyper{0.9, 0.999, 1e-8, 0.01});
  EXPECT_EQ(zero.totalValues(), 35 + 3 + 16);
  EXPECT_EQ(zero.shardValues(), zero.totalValues());
  std::vector<torch::optim::OptimizerParamGroup> pg;
  for (auto &g : ref)
    pg.emplace_back(g, std::make_unique<torch::optim::AdamWOptions>(
                           torch::optim::AdamWOptions(1e-2).weight_decay(0.01)));
  torch::optim::AdamW adamw(std::move(pg), torch::optim::AdamWOptions(1e-2));
  const at::Tensor before = ref.back().back().detach().clone();
  for (int step = 0; step < 3; ++step) {
    setGrads(mine, 10 + step, /*skipLast=*/true);
    setGrads(ref, 10 + step, /*skipLast=*/true);
    static_cast<torch::optim::AdamWOptions &>(adamw.param_groups()[1].options())
        .lr(3e-2);
    zero.step({1e-2, 3e-2});
    adamwStep(adamw);
    for (size_t g = 0; g < mine.size(); ++g)
      for (size_t i = 0; i < mine[g].size(); ++i) {
        EXPECT_TRUE(at::equal(mine[g][i], ref[g][i])) << g << "," << i;
        EXPECT_FALSE(mine[g][i].grad().defined()); // spent by the update
      }
  }
  EXPECT_TRUE(at::equal(mine.back().back(), before));
  const std::vector<at::Tensor> s = zero.state();
  EXPECT_EQ(s[1][0].item<int64_t>(), 3);
  EXPECT_EQ(s[1][2].item<int64_t>(), 0);
}

// Offloaded: the moments in the host pool (8 B per value), the update on
// host copies of each bucket; the values those of the update on the device.
TEST(ZeroOptimizer, OffloadKeepsTheStateInTheHostPool) {
  auto dev = groups(2), host = groups(2);
  const int64_t pool = hostPoolBytes();
  ZeroOptimizer onDevice(nullptr, 1, dev, AdamWHyper{});
  ZeroOptimizer offloaded(nullptr, 0, host, AdamWHyper{}, /*offload=*/true);
  EXPECT_TRUE(offloaded.offloaded());
  EXPECT_EQ(hostPoolBytes() - pool, 8 * offloaded.totalValues());
  for (int step = 0; step < 3; ++step) {
    setGrads(dev, 20 + step);
    setGrads(host, 20 + step);
    onDevice.step({1e-2, 1e-2});
    offloaded.step({1e-2, 1e-2});
  }
  for (size_t g = 0; g < dev.size(); ++g)
    for (size_t i = 0; i < dev[g].size(); ++i)
      EXPECT_TRUE(at::allclose(dev[g][i], host[g][i], 1e-6, 1e-7));
  EXPECT_EQ(hostPoolBytes() - pool, 8 * offloaded.totalValues());
}

// The offload beside the next forward: with the forward's order the host
// update runs on a thread of its own, the parameters no group reads first,
// then each group's; awaitGroup (the model's hook) waits for one group's
// values only. Held before A's update, the forward still reads C's updated
// values; the results are the update's in place, bit for bit.
TEST(ZeroOptimizer, OffloadUpdatesBesideTheNextForward) {
  auto async = groups(3), ref = groups(3);
  // What the update's thread writes outlives the optimizer that joins it.
  std::mutex m;
  std::vector<int64_t> order;
  std::vector<std::thread::id> threads;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  ZeroOptimizer sync(nullptr, 0, ref, AdamWHyper{}, /*offload=*/true);
  ZeroOptimizer beside(nullptr, 0, async, AdamWHyper{}, /*offload=*/true);
  at::Tensor a = async[0][0], b = async[0][1], c = async[1][0];
  // The forward reads C, then A; B no group lists.
  beside.setForwardOrder({{c}, {a}});
  beside.setUpdateBeside(true); // whatever this machine's cores
  std::function<void(int64_t)> read = beside.beforeRead({0, 1});
  beside.setBeforeHostUpdate([&](int64_t i) {
    {
      std::lock_guard<std::mutex> lock(m);
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    }
    if (i == 0) // A: held until the test has read C (never for long)
      released.wait_for(std::chrono::seconds(30));
  });
  setGrads(async, 30);
  setGrads(ref, 30);
  const at::Tensor aBefore = a.detach().clone();
  sync.step({1e-2, 3e-2});
  beside.step({1e-2, 3e-2});
  EXPECT_FALSE(a.grad().defined()); // the jobs hold what they read
  EXPECT_GE(beside.hostUpdatesInFlight(), 1);
  read(0); // C's unit
  EXPECT_TRUE(at::equal(c, ref[1][0]));
  EXPECT_TRUE(at::equal(b, ref[0][1]));
  EXPECT_TRUE(at::equal(a, aBefore)); // still held
  EXPECT_EQ(beside.hostUpdatesInFlight(), 1);
  release.set_value();
  read(1);
  EXPECT_TRUE(at::equal(a, ref[0][0]));
  EXPECT_EQ(beside.hostUpdatesInFlight(), 0);
  {
    std::lock_guard<std::mutex> lock(m);
    EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 0}));
    for (std::thread::id t : threads)
      EXPECT_NE(t, std::this_thread::get_id());
  }
  // A second step, nobody held: settled by whatever reads every value.
  beside.setBeforeHostUpdate(nullptr);
  setGrads(async, 31, /*skipLast=*/true);
  setGrads(ref, 31, /*skipLast=*/true);
  sync.step({1e-2, 3e-2});
  beside.step({1e-2, 3e-2});
  const std::vector<at::Tensor> s = beside.state(), r = sync.state();
  EXPECT_EQ(beside.hostUpdatesInFlight(), 0);
  for (size_t k = 1; k < s.size(); ++k)
    EXPECT_TRUE(at::equal(s[k], r[k])) << k;
  for (size_t g = 0; g < async.size(); ++g)
    for (size_t i = 0; i < async[g].size(); ++i)
      EXPECT_TRUE(at::equal(async[g][i], ref[g][i])) << g << "," << i;
}

// ZeRO-Offload's 16-bit weights: the chosen parameters are bf16 on the
// device, the update runs on fp32 masters in the host pool (4 B beside the
// moments' 8), and the device's values are the masters cut to bf16 — the
// masters being what an fp32 update makes. hostValues gives the masters,
// setValues writes both, gatherAll holds them in the parameters for a time.
TEST(ZeroOptimizer, SixteenBitWeightsUpdateFp32Masters) {
  auto half = groups(4), ref = groups(4);
  const at::Tensor weight = half[0][0], bias = half[0][1];
  const int64_t pool = hostPoolBytes();
  ZeroOptimizer refOpt(nullptr, 0, ref, AdamWHyper{}, /*offload=*/true);
  ZeroOptimizer opt(nullptr, 0, half, AdamWHyper{}, /*offload=*/true,
                    {weight, half[1][0]}, at::kBFloat16);
  EXPECT_TRUE(opt.holdsValues());
  EXPECT_FALSE(refOpt.holdsValues());
  EXPECT_EQ(opt.halfValues(), 35 + 16);
  EXPECT_EQ(weight.scalar_type(), at::kBFloat16);
  EXPECT_EQ(bias.scalar_type(), at::kFloat);
  EXPECT_TRUE(weight.requires_grad());
  // The reference's moments (8 B a value) and these moments and masters.
  EXPECT_EQ(hostPoolBytes() - pool, (8 + 8 + 4) * opt.totalValues());
  for (int step = 0; step < 3; ++step) {
    setGrads(ref, 30 + step);
    setGrads(half, 30 + step);
    // The 16-bit parameters' gradients are 16-bit, as autograd makes them;
    // the reference sees the same (rounded) values in fp32.
    for (size_t g = 0; g < half.size(); ++g)
      for (size_t i = 0; i < half[g].size(); ++i)
        if (half[g][i].scalar_type() == at::kBFloat16) {
          half[g][i].mutable_grad() =
              half[g][i].grad().to(at::kBFloat16);
          ref[g][i].mutable_grad() = half[g][i].grad().to(at::kFloat);
        }
    refOpt.step({1e-2, 1e-2});
    opt.step({1e-2, 1e-2});
  }
  for (size_t g = 0; g < half.size(); ++g)
    for (size_t i = 0; i < half[g].size(); ++i) {
      const at::Tensor &p = half[g][i];
      EXPECT_TRUE(at::equal(opt.hostValues(p), ref[g][i])) << g << "," << i;
      EXPECT_TRUE(at::equal(p, ref[g][i].to(p.scalar_type())))
          << g << "," << i;
    }
  // The masters whole in the parameters for a time, then bf16 again.
  opt.gatherAll();
  EXPECT_EQ(weight.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(weight, ref[0][0]));
  opt.freeAll();
  EXPECT_EQ(weight.scalar_type(), at::kBFloat16);
  // A load sets the master and the device's value.
  const at::Tensor loaded = at::full({7, 5}, 1.0f / 3.0f);
  opt.setValues(weight, loaded);
  EXPECT_TRUE(at::equal(opt.hostValues(weight), loaded));
  EXPECT_TRUE(at::equal(weight, loaded.to(at::kBFloat16)));
  // Not without the offload.
  auto other = groups(5);
  EXPECT_THROW(ZeroOptimizer(nullptr, 1, other, AdamWHyper{}, false,
                             {other[0][0]}),
               std::invalid_argument);
  // A parameter the layout lacks.
  EXPECT_THROW(ZeroOptimizer(nullptr, 0, other, AdamWHyper{}, true,
                             {at::zeros({2}, at::kFloat)}),
               std::invalid_argument);
}

// fp16 16-bit weights: their gradients arrive at the loss scale (the
// trainer unscales only the fp32 ones); the host's update divides it out in
// fp32 — exactly, a power of two — where fp16 would flush the small ones to
// zero. The reference: fp32 weights whose gradients are the fp16 values,
// unscaled in fp32 (autocast's fp16 training with the update on the device).
TEST(ZeroOptimizer, Fp16WeightsDivideTheLossScaleOutOnTheHost) {
  auto half = groups(6), ref = groups(6);
  const at::Tensor weight = half[0][0];
  ZeroOptimizer refOpt(nullptr, 0, ref, AdamWHyper{}, /*offload=*/true);
  ZeroOptimizer opt(nullptr, 0, half, AdamWHyper{}, /*offload=*/true,
                    {weight, half[1][0]}, at::kHalf);
  EXPECT_EQ(weight.scalar_type(), at::kHalf);
  const double scale = 65536.0;
  int64_t underflowing = 0;
  for (int step = 0; step < 3; ++step) {
    setGrads(ref, 40 + step);
    setGrads(half, 40 + step);
    for (size_t g = 0; g < half.size(); ++g)
      for (size_t i = 0; i < half[g].size(); ++i) {
        // Small gradients, as a mean loss's are: scaled they fit fp16.
        at::Tensor small = half[g][i].grad() * 1e-6;
        if (half[g][i].scalar_type() == at::kHalf) {
          at::Tensor scaled = (small * scale).to(at::kHalf);
          half[g][i].mutable_grad() = scaled;
          ref[g][i].mutable_grad() = scaled.to(at::kFloat) / scale;
          // What unscaling in fp16 would have lost.
          underflowing += (scaled.div(scale).to(at::kFloat) != ref[g][i].grad())
                              .sum()
                              .item<int64_t>();
        } else {
          half[g][i].mutable_grad() = small;
          ref[g][i].mutable_grad() = small.clone();
        }
      }
    opt.setHalfGradientScale(scale);
    refOpt.step({1e-2, 1e-2});
    opt.step({1e-2, 1e-2});
  }
  EXPECT_GT(underflowing, 0); // the case this is for
  // An overflow in a micro-batch folded into the host's fp32 sum (one
  // process, accumulation) is still found: the step is skipped.
  EXPECT_TRUE(opt.foldsHalfGradients());
  weight.mutable_grad() =
      at::full(weight.sizes(), std::numeric_limits<float>::infinity())
          .to(at::kHalf);
  opt.foldHalfGradients();
  EXPECT_FALSE(weight.grad().defined()); // folded: in the host's sum now
  EXPECT_FALSE(opt.finite());
  opt.discardGradients();
  EXPECT_TRUE(opt.finite());
  for (size_t g = 0; g < half.size(); ++g)
    for (size_t i = 0; i < half[g].size(); ++i) {
      const at::Tensor &p = half[g][i];
      EXPECT_TRUE(at::equal(opt.hostValues(p), ref[g][i])) << g << "," << i;
      EXPECT_TRUE(at::equal(p, ref[g][i].to(p.scalar_type()))) << g << "," << i;
    }
}

// At one process there is nothing to scatter: stages 2 and 3 run as stage 1.
TEST(ZeroOptimizer, StageTwoAtOneProcessRunsAsOne) {
  auto gs = groups(3);
  ZeroOptimizer zero(nullptr, 2, gs, AdamWHyper{});
  EXPECT_EQ(zero.stage(), 1);
  EXPECT_EQ(ZeroOptimizer(nullptr, 3, gs, AdamWHyper{}).stage(), 1);
  EXPECT_THROW(ZeroOptimizer(nullptr, 0, gs, AdamWHyper{}),
               std::invalid_argument);
  EXPECT_THROW(ZeroOptimizer(nullptr, 4, gs, AdamWHyper{}),
               std::invalid_argument);
  EXPECT_THROW(zero.shardParameters({}), std::logic_error);
}

// A checkpoint's state resumes only into the same layout, checked before
// anything changes.
TEST(ZeroOptimizer, StateRoundTripsAndRefusesAnotherLayout) {
  auto a = groups(4), b = groups(4);
  ZeroOptimizer za(nullptr, 1, a, AdamWHyper{});
  setGrads(a, 5);
  za.step({1e-2, 1e-2});
  ZeroOptimizer zb(nullptr, 1, b, AdamWHyper{});
  zb.loadState(za.state());
  for (size_t i = 0; i < 4; ++i)
    EXPECT_TRUE(at::equal(za.state()[i], zb.state()[i])) << i;

  auto small = groups(4);
  small.pop_back();
  ZeroOptimizer zs(nullptr, 1, small, AdamWHyper{});
  try {
    zs.loadState(za.state());
    FAIL() << "loaded another layout";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("sharded as ZeRO stage 1 over 1 "
                                         "rank(s), 54 values, this run as "
                                         "ZeRO stage 1 over 1 rank(s), 38"),
              std::string::npos)
        << e.what();
  }
  std::vector<at::Tensor> bad = za.state();
  bad[1] = -bad[1];
  EXPECT_THROW(zb.loadState(bad), std::runtime_error);
  EXPECT_THROW(zb.loadState({bad[0]}), std::runtime_error);
}

//===----------------------------------------------------------------------===//
// Stage 2 at two processes: gradients released during the backward
//===----------------------------------------------------------------------===//

namespace {
/// One parameter of a bucket's values or more (summed in place) and two
/// small ones (summed together), over two groups.
std::vector<std::vector<at::Tensor>> releaseGroups() {
  at::manual_seed(11);
  return {{at::randn({200, 100}).requires_grad_(true),
           at::randn({30}).requires_grad_(true)},
          {at::randn({5, 5}).requires_grad_(true)}};
}

/// Rank r's loss Σ_i (r + 1)(i + 1)·Σ p_i²: its gradient 2(r + 1)(i + 1)·p_i,
/// averaged over two ranks 3(i + 1)·p_i. Built last to first, so autograd
/// makes the large one's gradient first.
at::Tensor releaseLoss(const std::vector<at::Tensor> &ps, int rank) {
  at::Tensor l = at::zeros({});
  for (size_t i = ps.size(); i-- > 0;)
    l = l + double((rank + 1) * (i + 1)) * ps[i].pow(2).sum();
  return l;
}

at::Tensor flags(std::vector<int64_t> v) { return at::tensor(v); }

at::Tensor definedGrads(const std::vector<at::Tensor> &ps) {
  std::vector<int64_t> d;
  for (const at::Tensor &p : ps)
    d.push_back(p.grad().defined());
  return at::tensor(d);
}
} // namespace

TEST(ZeroWorker, DISABLED_Release) {
  const int rank = std::atoi(std::getenv("RANK"));
  Communicator comm(distOptionsFromEnv({}), /*serveStore=*/false);
  auto gs = releaseGroups();
  std::vector<at::Tensor> ps{gs[0][0], gs[0][1], gs[1][0]};
  ZeroOptimizer z(&comm, 2, gs, AdamWHyper{});
  auto save = [&](const std::string &name, const at::Tensor &t) {
    mp::saveTensor(name, rank, t);
  };

  // The same tasks on both ranks: released as autograd makes them — the
  // large one summed in place, the small ones copied into the release's
  // bucket (summed when it fills, or at the micro-batch's end) — and every
  // gradient freed at once.
  z.beginStep({true, true});
  save("releasing1", at::tensor({int64_t(z.releasing())}));
  releaseLoss(ps, rank).backward();
  save("during1", definedGrads(ps));
  z.endBackward();
  save("after1", definedGrads(ps));
  z.sumGradients();
  save("shard1", z.gradientShard());

  // The ranks' tasks differ: nothing released, the exchange sums them.
  z.beginStep({true, rank == 0});
  save("releasing2", at::tensor({int64_t(z.releasing())}));
  releaseLoss(ps, rank).backward();
  z.endBackward();
  save("after2", definedGrads(ps));
  z.sumGradients();
  save("shard2", z.gradientShard());

  // Two micro-batches: each released, their sums added.
  z.beginStep({true, true});
  for (int mb = 0; mb < 2; ++mb) {
    releaseLoss(ps, rank).backward();
    z.endBackward();
  }
  z.sumGradients();
  save("shard3", z.gradientShard());

  // fp16's loss scale: what was released carries it until the trainer
  // divides it out (before sumGradients, which sums unscaled ones).
  z.beginStep({true, true});
  (1024.0 * releaseLoss(ps, rank)).backward();
  z.endBackward();
  z.unscaleReleased(1024.0);
  z.sumGradients();
  save("shard4", z.gradientShard());

  // The ranks release in another order: an error on both, not a silent mix.
  z.beginStep({true, true});
  for (at::Tensor &p : ps)
    p.mutable_grad() = at::ones_like(p);
  z.release(rank == 0 ? 1 : 2);
  z.release(rank == 0 ? 2 : 1);
  int64_t refused = 0;
  try {
    z.endBackward();
  } catch (const std::runtime_error &e) {
    refused = std::string(e.what()).find("different order") !=
              std::string::npos;
  }
  save("refused", at::tensor({refused}));
}

TEST(ZeroOptimizer, StageTwoReleasesGradientsDuringTheBackward) {
  mp::Launch launch("ZeroWorker.DISABLED_Release", 2);
  ASSERT_TRUE(launch.run(60)) << launch.log();
  auto gs = releaseGroups();
  std::vector<at::Tensor> ps{gs[0][0], gs[0][1], gs[1][0]};
  std::vector<at::Tensor> avg;
  for (size_t i = 0; i < ps.size(); ++i)
    avg.push_back(3.0 * double(i + 1) * ps[i].detach().reshape({-1}));
  const at::Tensor flat = at::cat(avg);
  const int64_t shard = ZeroLayout::shardValues(flat.numel(), 2);
  for (int r = 0; r < 2; ++r) {
    at::Tensor want = at::zeros({shard});
    const int64_t n = std::min(shard, flat.numel() - r * shard);
    want.narrow(0, 0, n).copy_(flat.narrow(0, r * shard, n));
    EXPECT_EQ(launch.load("releasing1", r).item<int64_t>(), 1);
    // Every gradient is gone once the backward ends (the small ones' sums
    // wait in the bucket).
    EXPECT_TRUE(at::equal(launch.load("during1", r), flags({0, 0, 0})))
        << launch.load("during1", r);
    EXPECT_TRUE(at::equal(launch.load("after1", r), flags({0, 0, 0})));
    EXPECT_TRUE(at::allclose(launch.load("shard1", r), want, 1e-6, 1e-6));
    EXPECT_EQ(launch.load("releasing2", r).item<int64_t>(), 0);
    EXPECT_TRUE(at::equal(launch.load("after2", r), flags({1, 1, 1})));
    EXPECT_TRUE(at::allclose(launch.load("shard2", r), want, 1e-6, 1e-6));
    EXPECT_TRUE(at::allclose(launch.load("shard3", r), 2 * want, 1e-6, 1e-6));
    EXPECT_TRUE(at::allclose(launch.load("shard4", r), want, 1e-6, 1e-6));
    EXPECT_EQ(launch.load("refused", r).item<int64_t>(), 1);
  }
}

namespace {
/// Twelve small parameters of 3000 values around a large one of 20000: the
/// layout's 56000 values make runs of 28000 and buckets of 16384, so the
/// small gradients fill the release's bucket (five to a bucket) and its sums
/// start while others fill the other one, the large one's sum alone among
/// them.
std::vector<std::vector<at::Tensor>> bucketGroups() {
  at::manual_seed(12);
  std::vector<at::Tensor> g;
  for (int i = 0; i < 13; ++i)
    g.push_back(at::randn({i == 6 ? 20000 : 3000}).requires_grad_(true));
  return {g};
}
} // namespace

TEST(ZeroWorker, DISABLED_ReleaseBuckets) {
  const int rank = std::atoi(std::getenv("RANK"));
  Communicator comm(distOptionsFromEnv({}), /*serveStore=*/false);
  auto gs = bucketGroups();
  const std::vector<at::Tensor> &ps = gs[0];
  ZeroOptimizer z(&comm, 2, gs, AdamWHyper{});
  // Two micro-batches, each released and summed as it goes.
  z.beginStep({true});
  for (int mb = 0; mb < 2; ++mb) {
    releaseLoss(ps, rank).backward();
    mp::saveTensor("during" + std::to_string(mb), rank, definedGrads(ps));
    z.endBackward();
  }
  z.sumGradients();
  mp::saveTensor("shard", rank, z.gradientShard());
}

TEST(ZeroOptimizer, ReleaseBucketsOverflowAndOverlap) {
  mp::Launch launch("ZeroWorker.DISABLED_ReleaseBuckets", 2);
  ASSERT_TRUE(launch.run(60)) << launch.log();
  auto gs = bucketGroups();
  std::vector<at::Tensor> avg;
  for (size_t i = 0; i < gs[0].size(); ++i)
    avg.push_back(2 * 3.0 * double(i + 1) * gs[0][i].detach().reshape({-1}));
  const at::Tensor flat = at::cat(avg);
  ASSERT_EQ(flat.numel(), 56000);
  for (int r = 0; r < 2; ++r) {
    // Every gradient freed as the backward made it.
    for (int mb = 0; mb < 2; ++mb)
      EXPECT_EQ(launch.load("during" + std::to_string(mb), r).sum().item<int64_t>(), 0);
    EXPECT_TRUE(at::allclose(launch.load("shard", r),
                             flat.narrow(0, r * 28000, 28000), 1e-5, 1e-5))
        << r;
  }
}

//===----------------------------------------------------------------------===//
// Stage 3 at two processes: the parameters sharded, gathered per unit
//===----------------------------------------------------------------------===//

namespace {
/// Unit 0 (the large parameter) makes a = p0·x, unit 1 b = a[:30] ⊙ p1,
/// the whole head p2 adds Σ p2²; rank r's loss is (r + 1)·(Σ b² + Σ p2²).
at::Tensor unitLoss(const std::vector<at::Tensor> &ps, int rank,
                    ZeroOptimizer *z, std::vector<int64_t> *whole) {
  const at::Tensor x = at::linspace(-1, 1, 100);
  auto unit = [&](int64_t u, auto f) {
    // As the trainer does: unit 0's forward begins unit 1's gather.
    if (z)
      z->gatherForward(u, u, u == 0 ? 1 : -1);
    at::Tensor out = f();
    if (z) {
      z->forwardDone(u, u, out);
      whole->push_back(z->gatheredBytes());
    }
    return out;
  };
  at::Tensor a = unit(0, [&] { return at::mv(ps[0], x); });
  at::Tensor b = unit(1, [&] { return a.narrow(0, 0, 30) * ps[1]; });
  return double(rank + 1) * (b.pow(2).sum() + ps[2].pow(2).sum());
}
} // namespace

TEST(ZeroWorker, DISABLED_ShardedParameters) {
  const int rank = std::atoi(std::getenv("RANK"));
  Communicator comm(distOptionsFromEnv({}), /*serveStore=*/false);
  auto save = [&](const std::string &name, const at::Tensor &t) {
    mp::saveTensor(name, rank, t);
  };
  auto gs3 = releaseGroups(), gs2 = releaseGroups();
  std::vector<at::Tensor> p3{gs3[0][0], gs3[0][1], gs3[1][0]};
  std::vector<at::Tensor> p2{gs2[0][0], gs2[0][1], gs2[1][0]};
  ZeroOptimizer z3(&comm, 3, gs3, AdamWHyper{});
  ZeroOptimizer z2(&comm, 2, gs2, AdamWHyper{});
  z3.shardParameters({{p3[0]}, {p3[1]}});
  save("afterShard", at::tensor({z3.gatheredBytes(),
                                 int64_t(p3[0].storage().nbytes())}));
  std::vector<int64_t> whole, duringBackward, unitOneBackward;
  // The backward gathers unit 1, then unit 0, each freed once its gradient
  // is made: the large one's hook sees unit 1 gone. With the prefetch, unit
  // 1's backward holds unit 0 too (its gather begun by unit 1's hook).
  p3[0].register_hook([&](const at::Tensor &) {
    duringBackward.push_back(z3.gatheredBytes());
  });
  p3[1].register_hook([&](const at::Tensor &) {
    unitOneBackward.push_back(z3.gatheredBytes());
  });
  for (int step = 0; step < 3; ++step) {
    // The first step without the prefetch, the others with it: the same
    // values either way.
    z3.setPrefetch(step > 0);
    z3.beginStep({true});
    z2.beginStep({true});
    // Each unit is freed as its forward ends (whole: 0 after each).
    at::Tensor l3 = unitLoss(p3, rank, &z3, &whole);
    l3.backward();
    z3.endBackward();
    z3.sumGradients();
    z3.step({1e-2, 2e-2});
    unitLoss(p2, rank, nullptr, nullptr).backward();
    z2.endBackward();
    z2.sumGradients();
    z2.step({1e-2, 2e-2});
  }
  save("whole", at::tensor(whole));
  save("duringBackward", at::tensor(duringBackward));
  save("unitOneBackward", at::tensor(unitOneBackward));
  save("afterSteps", at::tensor({z3.gatheredBytes()}));
  {
    z3.gatherAll();
    int64_t same = 1;
    for (size_t i = 0; i < p3.size(); ++i)
      same &= at::equal(p3[i], p2[i]);
    save("sameAsStageTwo", at::tensor({same}));
    z3.freeAll();
  }
  // A load writes each rank's run; a gather puts the parameter together
  // from them.
  z3.setValues(p3[0], 2 * p2[0].detach());
  z3.gatherAll();
  save("written", at::tensor({int64_t(
                      at::equal(p3[0], 2 * p2[0].detach()))}));
  z3.freeAll();
}

TEST(ZeroOptimizer, StageThreeShardsAndGathersTheParameters) {
  mp::Launch launch("ZeroWorker.DISABLED_ShardedParameters", 2);
  ASSERT_TRUE(launch.run(60)) << launch.log();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(at::equal(launch.load("afterShard", r), flags({0, 0})))
        << launch.load("afterShard", r);
    // After each unit's forward: nothing whole without the prefetch; with
    // it, unit 1 (30 values) arriving while unit 0 computes.
    EXPECT_TRUE(
        at::equal(launch.load("whole", r), flags({0, 0, 120, 0, 120, 0})))
        << launch.load("whole", r);
    EXPECT_TRUE(at::equal(launch.load("unitOneBackward", r),
                          flags({120, 80120, 80120})))
        << launch.load("unitOneBackward", r);
    // p0's gradient hook runs before its release: unit 0 whole (80000 B),
    // unit 1 already freed.
    EXPECT_TRUE(at::equal(launch.load("duringBackward", r),
                          flags({80000, 80000, 80000})))
        << launch.load("duringBackward", r);
    EXPECT_EQ(launch.load("afterSteps", r).item<int64_t>(), 0);
    EXPECT_EQ(launch.load("sameAsStageTwo", r).item<int64_t>(), 1);
    EXPECT_EQ(launch.load("written", r).item<int64_t>(), 1);
  }
}

//===----------------------------------------------------------------------===//
// Stage 1 at two processes: the updated values arrive beside the next forward
//===----------------------------------------------------------------------===//

TEST(ZeroWorker, DISABLED_DeferredGather) {
  const int rank = std::atoi(std::getenv("RANK"));
  Communicator comm(distOptionsFromEnv({}), /*serveStore=*/false);
  auto save = [&](const std::string &name, const at::Tensor &t) {
    mp::saveTensor(name, rank, t);
  };
  // p0 (20000 values) spans both ranks' runs; p1 and p2 lie in rank 1's.
  auto gd = releaseGroups(), gs = releaseGroups();
  ZeroOptimizer deferred(&comm, 1, gd, AdamWHyper{});
  ZeroOptimizer blocking(&comm, 1, gs, AdamWHyper{});
  // The forward reads p1 and p2 (a run of the layout: made views of one
  // buffer, broadcast at once), then p0 (alone: one broadcast per owner).
  deferred.setForwardOrder({{gd[0][1], gd[1][0]}, {gd[0][0]}});
  save("oneBuffer", at::tensor({int64_t(gd[0][1].storage().is_alias_of(
                                    gd[1][0].storage())),
                                int64_t(gd[0][0].storage().is_alias_of(
                                    gd[0][1].storage()))}));
  std::vector<int64_t> inFlight, sent;
  for (int step = 0; step < 3; ++step) {
    // Stage 1's ranks update from the same (exchanged) gradients.
    setGrads(gd, 40 + step);
    setGrads(gs, 40 + step);
    sent.push_back(deferred.step({1e-2, 2e-2}));
    sent.push_back(blocking.step({1e-2, 2e-2}));
    inFlight.push_back(deferred.parametersInFlight());
    inFlight.push_back(blocking.parametersInFlight());
    if (step == 2)
      continue; // the next update waits for these itself
    // Group 0 waits for p1 and p2's broadcast, not p0's two parts.
    deferred.awaitGroup(0);
    inFlight.push_back(deferred.parametersInFlight());
    deferred.awaitGroup(1);
    inFlight.push_back(deferred.parametersInFlight());
  }
  // A fourth update settles the third's broadcasts before it writes.
  setGrads(gd, 50);
  setGrads(gs, 50);
  deferred.step({1e-2, 2e-2});
  blocking.step({1e-2, 2e-2});
  deferred.settleParameters();
  int64_t same = 1;
  for (size_t g = 0; g < gd.size(); ++g)
    for (size_t i = 0; i < gd[g].size(); ++i)
      same &= at::equal(gd[g][i], gs[g][i]);
  save("same", at::tensor({same}));
  save("inFlight", at::tensor(inFlight));
  save("sent", at::tensor(sent));
}

TEST(ZeroOptimizer, StageOneBroadcastsBesideTheNextForward) {
  mp::Launch launch("ZeroWorker.DISABLED_DeferredGather", 2);
  ASSERT_TRUE(launch.run(60)) << launch.log();
  for (int r = 0; r < 2; ++r) {
    // The same bits as the blocking exchange, on both ranks.
    EXPECT_EQ(launch.load("same", r).item<int64_t>(), 1) << r;
    EXPECT_TRUE(at::equal(launch.load("oneBuffer", r), flags({1, 0})))
        << launch.load("oneBuffer", r);
    // After each step: 3 broadcasts (p1 and p2 together, p0's two parts) in
    // flight against none; 2 after group 0, none after group 1.
    EXPECT_TRUE(at::equal(launch.load("inFlight", r),
                          flags({3, 0, 2, 0, 3, 0, 2, 0, 3, 0})))
        << launch.load("inFlight", r);
    // What each rank's run holds, to the other rank: rank 0 10028 values
    // of p0, rank 1 the rest of p0, p1 and p2 (20055 - 10028).
    const int64_t mine = r == 0 ? 10028 : 20055 - 10028;
    EXPECT_TRUE(at::equal(launch.load("sent", r),
                          flags({4 * mine, 4 * mine, 4 * mine, 4 * mine,
                                 4 * mine, 4 * mine})))
        << launch.load("sent", r);
  }
}
