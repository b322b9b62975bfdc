//===- PointwiseTest.cpp - the fused pointwise kernels against ATen -------===//
//
// Each kernel of mtprt/kernels/Pointwise.h against the ATen composition it
// replaces (forward and backward), for every CPU instruction set this build
// and this CPU have, at widths with and without a vector tail; the CUDA twins
// where a GPU is present. Then the two autograd functions of
// mtprt/torch/Fused.h against the composition's gradients.
//
//===----------------------------------------------------------------------===//

#include "mtprt/kernels/Pointwise.h"
#include "mtprt/torch/Fused.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>

using namespace mtprt;

namespace {

at::Tensor randn(at::IntArrayRef shape, uint64_t seed, double scale = 1.0) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, g, at::kFloat) * scale;
}

double maxDiff(const at::Tensor &a, const at::Tensor &b) {
  return (a.to(at::kCPU) - b.to(at::kCPU)).abs().max().item<double>();
}

struct NormCase {
  at::Tensor x, w, b, dy;
};

NormCase normCase(int64_t rows, int64_t width, uint64_t seed) {
  // An offset mean and a non-unit scale, as the residual stream has.
  return {randn({rows, width}, seed) * 3.0 + 1.5, randn({width}, seed + 1),
          randn({width}, seed + 2), randn({rows, width}, seed + 3)};
}

const int64_t kWidths[] = {64, 67, 256};
const char *kIsas[] = {"default", "avx2", "avx512"};

} // namespace

/// LayerNorm forward: y, mean and rstd as at::native_layer_norm's (fp32,
/// 1e-5 absolute on y of unit scale); the recompute reproduces y exactly.
TEST(Pointwise, NormForwardAndRecomputeMatchAten) {
  for (const char *isa : kIsas) {
    const kernels::PointwiseCpu *k = kernels::pointwiseCpuFor(isa);
    if (!k)
      continue;
    for (int64_t width : kWidths) {
      SCOPED_TRACE(std::string(isa) + " width " + std::to_string(width));
      NormCase c = normCase(37, width, 11);
      auto [ry, rmean, rrstd] =
          at::native_layer_norm(c.x, {width}, c.w, c.b, 1e-5);
      at::Tensor y = at::empty_like(c.x), mean = at::empty({37}),
                 rstd = at::empty({37}), y2 = at::empty_like(c.x);
      k->normForward(c.x.data_ptr<float>(), c.w.data_ptr<float>(),
                     c.b.data_ptr<float>(), y.data_ptr<float>(),
                     mean.data_ptr<float>(), rstd.data_ptr<float>(), 37, width,
                     1e-5f);
      EXPECT_LE(maxDiff(y, ry), 1e-5);
      EXPECT_LE(maxDiff(mean, rmean.view({37})), 1e-6);
      EXPECT_LE(maxDiff(rstd, rrstd.view({37})), 1e-5);
      k->normRecompute(c.x.data_ptr<float>(), mean.data_ptr<float>(),
                       rstd.data_ptr<float>(), c.w.data_ptr<float>(),
                       c.b.data_ptr<float>(), y2.data_ptr<float>(), 37, width);
      EXPECT_TRUE(at::equal(y, y2));
    }
  }
}

/// LayerNorm backward: dx, dw, db as at::native_layer_norm_backward's; dw
/// and db accumulate onto what the buffers held.
TEST(Pointwise, NormBackwardMatchesAten) {
  for (const char *isa : kIsas) {
    const kernels::PointwiseCpu *k = kernels::pointwiseCpuFor(isa);
    if (!k)
      continue;
    for (int64_t width : kWidths) {
      SCOPED_TRACE(std::string(isa) + " width " + std::to_string(width));
      NormCase c = normCase(41, width, 23);
      auto [ry, mean, rstd] =
          at::native_layer_norm(c.x, {width}, c.w, c.b, 1e-5);
      auto [rdx, rdw, rdb] = at::native_layer_norm_backward(
          c.dy, c.x, {width}, mean, rstd, c.w, c.b, {true, true, true});
      at::Tensor dx = at::empty_like(c.x), dw = at::full({width}, 2.f),
                 db = at::full({width}, -1.f);
      k->normBackward(c.x.data_ptr<float>(), mean.data_ptr<float>(),
                      rstd.data_ptr<float>(), c.w.data_ptr<float>(),
                      c.dy.data_ptr<float>(), dx.data_ptr<float>(),
                      dw.data_ptr<float>(), db.data_ptr<float>(), 41, width);
      EXPECT_LE(maxDiff(dx, rdx), 1e-4);
      EXPECT_LE(maxDiff(dw, rdw + 2.f), 1e-4);
      EXPECT_LE(maxDiff(db, rdb - 1.f), 1e-4);
    }
  }
}

/// GELU (exact, erf) and its backward as at::gelu / at::gelu_backward's,
/// over [-8, 8] and beyond, at lengths with a tail; du may alias dg.
TEST(Pointwise, GeluForwardAndBackwardMatchAten) {
  for (const char *isa : kIsas) {
    const kernels::PointwiseCpu *k = kernels::pointwiseCpuFor(isa);
    if (!k)
      continue;
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(4099)}) {
      SCOPED_TRACE(std::string(isa) + " n " + std::to_string(n));
      at::Tensor u = randn({n}, 5, 3.0), dg = randn({n}, 6);
      if (n > 4)
        u.narrow(0, 0, 4).copy_(at::tensor({-12.f, -8.f, 8.f, 12.f}));
      at::Tensor g = at::empty_like(u);
      k->geluForward(u.data_ptr<float>(), g.data_ptr<float>(), n);
      EXPECT_LE(maxDiff(g, at::gelu(u)), 2e-6 * 12);
      at::Tensor ref = at::gelu_backward(dg, u);
      at::Tensor du = dg.clone();
      k->geluBackward(u.data_ptr<float>(), du.data_ptr<float>(),
                      du.data_ptr<float>(), n);
      EXPECT_LE(maxDiff(du, ref), 1e-5);
    }
  }
}

/// The CUDA twins against the same ATen ops on the GPU.
TEST(Pointwise, CudaTwinsMatchAten) {
  if (!torch::cuda::is_available() || !fused::cudaTwins())
    GTEST_SKIP() << "no GPU (or a runtime built without the CUDA twins)";
  for (int64_t width : kWidths) {
    SCOPED_TRACE("width " + std::to_string(width));
    NormCase c = normCase(53, width, 31);
    at::Tensor x = c.x.cuda(), w = c.w.cuda(), b = c.b.cuda(),
               dy = c.dy.cuda();
    auto [ry, rmean, rrstd] = at::native_layer_norm(x, {width}, w, b, 1e-5);
    auto [y, mean, rstd] = fused::normForward(x, w, b, 1e-5);
    EXPECT_LE(maxDiff(y, ry), 1e-5);
    EXPECT_TRUE(at::equal(fused::normRecompute(x, mean, rstd, w, b), y));
    auto [rdx, rdw, rdb] = at::native_layer_norm_backward(
        dy, x, {width}, rmean, rrstd, w, b, {true, true, true});
    auto [dx, dw, db] = fused::normBackward(dy, x, mean, rstd, w);
    EXPECT_LE(maxDiff(dx, rdx), 1e-4);
    EXPECT_LE(maxDiff(dw, rdw), 1e-3);
    EXPECT_LE(maxDiff(db, rdb), 1e-3);
  }
  at::Tensor u = randn({5000}, 8, 3.0).cuda(), dg = randn({5000}, 9).cuda();
  EXPECT_LE(maxDiff(fused::geluForward(u), at::gelu(u)), 1e-5);
  EXPECT_LE(maxDiff(fused::geluBackward(dg, u), at::gelu_backward(dg, u)),
            1e-5);
}

/// The tensor-level kernels (threaded over rows) equal ATen's too, on a
/// non-contiguous input (a view, as a classify head's first token).
TEST(Pointwise, TensorOpsMatchAtenOnViews) {
  at::Tensor base = randn({6, 9, 64}, 41) * 2.0 + 0.5;
  at::Tensor x = base.select(1, 0); // [6, 64], stride 9*64
  at::Tensor w = randn({64}, 42), b = randn({64}, 43), dy = randn({6, 64}, 44);
  auto [ry, rmean, rrstd] = at::native_layer_norm(x.contiguous(), {64}, w, b, 1e-5);
  auto [y, mean, rstd] = fused::normForward(x, w, b, 1e-5);
  EXPECT_LE(maxDiff(y, ry), 1e-5);
  EXPECT_EQ(mean.sizes(), rmean.sizes());
  auto [rdx, rdw, rdb] = at::native_layer_norm_backward(
      dy, x.contiguous(), {64}, rmean, rrstd, w, b, {true, true, true});
  auto [dx, dw, db] = fused::normBackward(dy, x, mean, rstd, w);
  EXPECT_LE(maxDiff(dx, rdx), 1e-4);
  EXPECT_LE(maxDiff(dw, rdw), 1e-4);
  EXPECT_LE(maxDiff(db, rdb), 1e-4);
}

/// normLinear and geluLinear: outputs and every gradient as the ATen
/// composition's (fp32, 1e-5), chained as an MLP block is.
TEST(Pointwise, FusedLinearsGradientsMatchTheComposition) {
  const int64_t B = 3, S = 5, H = 24, F = 40;
  auto leaf = [](at::Tensor t) { return t.detach().requires_grad_(true); };
  at::Tensor x = leaf(randn({B, S, H}, 1) + 1.0);
  at::Tensor nw = leaf(randn({H}, 2)), nb = leaf(randn({H}, 3));
  at::Tensor w1 = leaf(randn({F, H}, 4, 0.2)), b1 = leaf(randn({F}, 5));
  at::Tensor w2 = leaf(randn({H, F}, 6, 0.2)), b2 = leaf(randn({H}, 7));
  std::vector<at::Tensor> params = {x, nw, nb, w1, b1, w2, b2};
  at::Tensor target = randn({B, S, H}, 8);

  at::Tensor ref = at::linear(
      at::gelu(at::linear(at::layer_norm(x, {H}, nw, nb, 1e-5), w1, b1)), w2,
      b2);
  at::Tensor out = fused::geluLinear(
      fused::normLinear(x, nw, nb, w1, b1, 1e-5), w2, b2);
  EXPECT_LE(maxDiff(out, ref), 1e-5);
  auto gr = torch::autograd::grad({(ref * target).sum()}, params);
  auto gf = torch::autograd::grad({(out * target).sum()}, params);
  const char *names[] = {"x", "norm.w", "norm.b", "up.w", "up.b", "down.w",
                         "down.b"};
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LE(maxDiff(gf[i], gr[i]), 1e-5 * std::max(1.0, gr[i].abs().max().item<double>()))
        << names[i];
}

TEST(Pointwise, SplitHeadsIsTheNarrowViewsWithOneGradientBuffer) {
  // q, k, v of a fused projection: the same values as narrow + view +
  // transpose, and the same gradient, bit for bit (copies only), also when
  // one of them gets no gradient.
  const int64_t b = 2, s = 5, heads = 4, d = 3, n = 3;
  at::Tensor x = randn({b, s, n * heads * d}, 61).requires_grad_();
  std::vector<at::Tensor> split = fused::splitHeads(x, n, heads);
  ASSERT_EQ(split.size(), size_t(n));
  std::vector<at::Tensor> upstream;
  for (int64_t i = 0; i < n; ++i)
    upstream.push_back(randn({b, heads, s, d}, 70 + i));
  at::Tensor ref = x.detach().clone().requires_grad_();
  std::vector<at::Tensor> views;
  for (int64_t i = 0; i < n; ++i) {
    views.push_back(ref.narrow(-1, i * heads * d, heads * d)
                        .view({b, s, heads, d})
                        .transpose(1, 2));
    EXPECT_TRUE(at::equal(split[i], views[i]));
  }
  at::Tensor loss = (split[0] * upstream[0]).sum() + (split[2] * upstream[2]).sum();
  at::Tensor refLoss = (views[0] * upstream[0]).sum() + (views[2] * upstream[2]).sum();
  auto got = torch::autograd::grad({loss}, {x});
  auto want = torch::autograd::grad({refLoss}, {ref});
  EXPECT_TRUE(at::equal(got[0], want[0]));
  EXPECT_TRUE(at::equal(got[0].narrow(-1, heads * d, heads * d),
                        at::zeros({b, s, heads * d})));
  EXPECT_THROW(fused::splitHeads(x, 5, heads), std::invalid_argument);
}
