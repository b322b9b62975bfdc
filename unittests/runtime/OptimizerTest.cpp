//===- OptimizerTest.cpp - the fused AdamW step ---------------------------===//

#include "mtprt/torch/Optimizer.h"

#include <gtest/gtest.h>

#include <vector>

using namespace mtprt;

namespace {

/// Two groups (other learning rates), weights and biases of several shapes,
/// with the trainer's AdamW options; `grads` picks which get a gradient.
struct Groups {
  std::vector<at::Tensor> a, b;
  std::unique_ptr<torch::optim::AdamW> opt;
  explicit Groups(int seed) {
    at::manual_seed(seed);
    for (auto shape : {std::vector<int64_t>{8, 4}, {4}, {3, 8}, {3}})
      a.push_back(at::randn(shape).requires_grad_(true));
    for (auto shape : {std::vector<int64_t>{5, 4}, {5}})
      b.push_back(at::randn(shape).requires_grad_(true));
    auto options = [](double lr) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(lr).weight_decay(0.1).betas({0.9, 0.99}).eps(1e-8));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(a, options(1e-2));
    groups.emplace_back(b, options(3e-3));
    opt = std::make_unique<torch::optim::AdamW>(std::move(groups),
                                                torch::optim::AdamWOptions(1e-2));
  }
  void grads(int step, bool skipOne) {
    at::manual_seed(100 + step);
    for (auto *list : {&a, &b})
      for (at::Tensor &p : *list)
        p.mutable_grad() = at::randn(p.sizes());
    if (skipOne) // a parameter without a gradient this step is left alone
      a[1].mutable_grad() = at::Tensor();
  }
};

TEST(Optimizer, FusedAdamWMatchesLibTorchsStep) {
  Groups fused(3), reference(3);
  for (int step = 0; step < 4; ++step) {
    fused.grads(step, step == 2);
    reference.grads(step, step == 2);
    adamwStep(*fused.opt);
    reference.opt->step();
  }
  for (size_t i = 0; i < fused.a.size(); ++i)
    EXPECT_TRUE(at::allclose(fused.a[i], reference.a[i], 1e-5, 1e-6)) << "a" << i;
  for (size_t i = 0; i < fused.b.size(); ++i)
    EXPECT_TRUE(at::allclose(fused.b[i], reference.b[i], 1e-5, 1e-6)) << "b" << i;
  // The state is LibTorch's (what a checkpoint saves): step counts and
  // moments; the parameter without a gradient at step 2 has one step less.
  auto state = [](Groups &s, const at::Tensor &p) -> torch::optim::AdamWParamState & {
    return static_cast<torch::optim::AdamWParamState &>(
        *s.opt->state().at(p.unsafeGetTensorImpl()));
  };
  for (size_t i = 0; i < fused.a.size(); ++i) {
    auto &f = state(fused, fused.a[i]), &r = state(reference, reference.a[i]);
    EXPECT_EQ(f.step(), i == 1 ? 3 : 4);
    EXPECT_EQ(f.step(), r.step());
    EXPECT_TRUE(at::allclose(f.exp_avg(), r.exp_avg(), 1e-5, 1e-7));
    EXPECT_TRUE(at::allclose(f.exp_avg_sq(), r.exp_avg_sq(), 1e-5, 1e-7));
  }
  // And it moved the weights at all.
  Groups untouched(3);
  EXPECT_FALSE(at::allclose(fused.a[0], untouched.a[0]));
}

} // namespace
