//===- Ewc.cpp - elastic weight consolidation (D14) -----------------------===//

#include "mtprt/torch/Ewc.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <stdexcept>
#include <string>

namespace mtprt {

ElasticConsolidation::ElasticConsolidation(std::vector<at::Tensor> params,
                                           EwcConfig config)
    : params_(std::move(params)), config_(config) {
  at::NoGradGuard noGrad;
  for (const at::Tensor &p : params_) {
    fisher_.push_back(at::zeros_like(p, p.options().requires_grad(false)));
    anchor_.push_back(p.detach().clone());
  }
}

void ElasticConsolidation::addFisherSample() {
  at::NoGradGuard noGrad;
  // Straight into F, in place (no running sum beside it): the samples of a
  // phase's end are `fisherBatches`, each weighing 1/fisherBatches. F is
  // not read until consolidate().
  const double w = 1.0 / double(config_.fisherBatches);
  for (size_t i = 0; i < params_.size(); ++i)
    if (const at::Tensor &g = params_[i].grad(); g.defined())
      fisher_[i].addcmul_(g, g, w);
  ++samples_;
}

void ElasticConsolidation::consolidate() {
  at::NoGradGuard noGrad;
  for (size_t i = 0; i < params_.size(); ++i)
    anchor_[i].copy_(params_[i].detach());
  samples_ = 0;
  ++consolidations_;
}

double ElasticConsolidation::addPenaltyGradient() {
  if (!active())
    return 0.0;
  at::NoGradGuard noGrad;
  // Summed on the device, read once (one synchronization a step, not one
  // per tensor).
  at::Tensor penalty;
  for (size_t i = 0; i < params_.size(); ++i) {
    // A tensor the phase's tasks do not reach has no gradient and AdamW
    // leaves it where it was: at θ*, since the phase began (nothing to add,
    // and no gradient of its size to make).
    at::Tensor &grad = params_[i].mutable_grad();
    if (!grad.defined())
      continue;
    at::Tensor d = params_[i].detach() - anchor_[i];
    at::Tensor fd = d.mul(fisher_[i]);
    at::Tensor term = at::dot(fd.reshape({-1}), d.reshape({-1}));
    penalty = penalty.defined() ? penalty.add_(term) : term;
    grad.add_(fd, 2.0 * config_.lambda);
  }
  return penalty.defined() ? config_.lambda * penalty.item<double>() : 0.0;
}

std::vector<at::Tensor> ElasticConsolidation::state() const {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back(fisher_[i]);
    out.push_back(anchor_[i]);
  }
  out.push_back(at::tensor({consolidations_}, at::kLong));
  return out;
}

void ElasticConsolidation::loadState(const std::vector<at::Tensor> &state) {
  if (state.size() != 2 * params_.size() + 1)
    throw std::runtime_error(
        "ewc state: " + std::to_string(state.size()) + " tensors for " +
        std::to_string(params_.size()) +
        " backbone tensors (2 each and a count): a checkpoint of another "
        "model");
  for (size_t i = 0; i < params_.size(); ++i)
    for (int j = 0; j < 2; ++j) {
      const at::Tensor &t = state[2 * i + j];
      const std::string what = std::string(j ? "remembered weights" : "Fisher") +
                               " of backbone tensor " + std::to_string(i);
      if (!t.sizes().equals(params_[i].sizes()) ||
          t.scalar_type() != params_[i].scalar_type())
        throw std::runtime_error("ewc state: the " + what +
                                 " has another shape or type than the model's");
      if (!at::isfinite(t).all().item<bool>() ||
          (j == 0 && (t < 0).any().item<bool>()))
        throw std::runtime_error("ewc state: the " + what +
                                 " holds negative or non-finite values");
    }
  const at::Tensor &count = state.back();
  if (count.numel() != 1 || count.scalar_type() != at::kLong ||
      count.item<int64_t>() < 0)
    throw std::runtime_error("ewc state: the consolidation count is not a "
                             "count");
  at::NoGradGuard noGrad;
  for (size_t i = 0; i < params_.size(); ++i) {
    fisher_[i].copy_(state[2 * i]);
    anchor_[i].copy_(state[2 * i + 1]);
  }
  consolidations_ = count.item<int64_t>();
  samples_ = 0;
}

} // namespace mtprt
