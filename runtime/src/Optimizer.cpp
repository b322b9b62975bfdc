//===- Optimizer.cpp - AdamW's update in one fused call per group ---------===//

#include "mtprt/torch/Optimizer.h"

#include <ATen/ops/_fused_adamw.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>
#include <tuple>
#include <vector>

namespace mtprt {

void adamwStep(torch::optim::AdamW &optimizer) {
  using torch::optim::AdamWOptions;
  using torch::optim::AdamWParamState;
  // What the fused kernel does not take goes through LibTorch's loop.
  for (auto &group : optimizer.param_groups()) {
    if (static_cast<AdamWOptions &>(group.options()).amsgrad())
      return optimizer.step(), void();
    for (const at::Tensor &p : group.params())
      if (p.grad().defined() &&
          (p.grad().is_sparse() || p.grad().scalar_type() != p.scalar_type() ||
           p.grad().device() != p.device()))
        return optimizer.step(), void();
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
      auto &slot = optimizer.state()[p.unsafeGetTensorImpl()];
      if (!slot) { // as LibTorch's first step creates it
        auto s = std::make_unique<AdamWParamState>();
        s->step(0);
        s->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        s->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(s);
      }
      auto &s = static_cast<AdamWParamState &>(*slot);
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
