//===- Optimizer.cpp - AdamW's update in one fused call per group ---------===//

#include "mtprt/torch/Optimizer.h"

#include <ATen/ops/_fused_adamw.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>
#include <tuple>
#include <vector>

namespace mtprt {

torch::optim::AdamWParamState &adamwState(torch::optim::AdamW &optimizer,
                                          const at::Tensor &p) {
  auto &slot = optimizer.state()[p.unsafeGetTensorImpl()];
  if (!slot) {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(0);
    s->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
    s->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    slot = std::move(s);
  }
  return static_cast<torch::optim::AdamWParamState &>(*slot);
}

namespace {
/// Whether every group and gradient is one the fused kernel takes.
bool fusable(torch::optim::AdamW &optimizer) {
  for (auto &group : optimizer.param_groups()) {
    if (static_cast<torch::optim::AdamWOptions &>(group.options()).amsgrad())
      return false;
    for (const at::Tensor &p : group.params())
      if (p.grad().defined() &&
          (p.grad().is_sparse() || p.grad().scalar_type() != p.scalar_type() ||
           p.grad().device() != p.device()))
        return false;
  }
  return true;
}
} // namespace

void adamwStep(torch::optim::AdamW &optimizer) {
  using torch::optim::AdamWOptions;
  using torch::optim::AdamWParamState;
  if (!fusable(optimizer)) {
    optimizer.step();
    return;
  }
  torch::NoGradGuard noGrad;
  for (auto &group : optimizer.param_groups()) {
    const auto &o = static_cast<AdamWOptions &>(group.options());
    struct Lists {
      std::vector<at::Tensor> params, grads, avgs, sqs;
      std::vector<double> steps;
    };
    // The kernel takes one device and dtype per call.
    std::map<std::tuple<std::string, int>, Lists> by;
    for (at::Tensor &p : group.params()) {
      if (!p.grad().defined())
        continue;
      AdamWParamState &s = adamwState(optimizer, p);
      s.step(s.step() + 1);
      Lists &l = by[{p.device().str(), int(p.scalar_type())}];
      l.params.push_back(p);
      l.grads.push_back(p.grad());
      l.avgs.push_back(s.exp_avg());
      l.sqs.push_back(s.exp_avg_sq());
      l.steps.push_back(double(s.step()));
    }
    for (auto &[key, l] : by) {
      // The steps as fp32 scalars on the device, one allocation for all.
      at::Tensor steps =
          at::tensor(l.steps, at::TensorOptions().dtype(at::kFloat))
              .to(l.params.front().device());
      std::vector<at::Tensor> stepList = steps.unbind(0);
      at::_fused_adamw_(l.params, l.grads, l.avgs, l.sqs, /*max_exp_avg_sqs=*/{},
                        stepList, o.lr(), std::get<0>(o.betas()),
                        std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                        /*amsgrad=*/false, /*maximize=*/false);
    }
  }
}

} // namespace mtprt
