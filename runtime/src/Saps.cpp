//===- Saps.cpp - SAPS: sparse updates of the backbone (D12) --------------===//

#include "mtprt/torch/Saps.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>

namespace mtprt {

namespace {
/// Folds a tensor's freshly accumulated gradient into its compact one and
/// drops the dense one (what PyTorch's optimizer-in-backward does with
/// register_post_accumulate_grad_hook).
struct FoldHook : torch::autograd::PostAccumulateGradHook {
  FoldHook(std::shared_ptr<SparseUpdate *> owner, size_t i)
      : owner(std::move(owner)), i(i) {}
  void operator()(const torch::autograd::Variable &p) override {
    SparseUpdate *s = *owner;
    if (!s || !p.grad().defined())
      return;
    s->add(i, p.grad());
    p.mutable_grad() = at::Tensor();
  }
  std::shared_ptr<SparseUpdate *> owner;
  size_t i;
};

at::TensorOptions floatOn(const at::Tensor &p) {
  return p.options().dtype(at::kFloat).requires_grad(false);
}
} // namespace

SparseUpdate::SparseUpdate(std::vector<at::Tensor> params, SapsConfig config,
                           bool hooks)
    : params_(std::move(params)), config_(config),
      self_(std::make_shared<SparseUpdate *>(this)) {
  entries_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor &p = params_[i];
    if (!p.requires_grad() || !p.is_contiguous())
      throw std::invalid_argument(
          "mtprt: saps: a managed parameter must be trainable and contiguous");
    // Allocated up front, as AdamW's moments are: the device holds from the
    // first step what it holds at every step.
    const int64_t k = config_.selected(p.numel());
    Entry &e = entries_[i];
    e.index = at::arange(k, p.options().dtype(at::kLong).requires_grad(false));
    e.grad = at::zeros({k}, floatOn(p));
    e.avg = at::zeros({k}, floatOn(p));
    e.sq = at::zeros({k}, floatOn(p));
    e.steps = at::zeros({k}, floatOn(p));
    if (hooks)
      torch::autograd::impl::set_post_acc_grad_hooks(
          p, std::make_unique<FoldHook>(self_, i));
  }
}

SparseUpdate::~SparseUpdate() {
  *self_ = nullptr;
  for (const at::Tensor &p : params_)
    if (torch::autograd::impl::post_acc_grad_hooks(p))
      torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

void SparseUpdate::beginStep(int64_t step, double lossScale, bool rankable) {
  lossScale_ = lossScale;
  const bool rerank = config_.rerankAt(step) && rankable;
  if (rerank)
    changed_ = ranked_ = 0;
  for (Entry &e : entries_) {
    e.grad.zero_();
    e.rerank = rankable && (rerank || !e.ranked);
    e.skip = !rankable && !e.ranked;
    e.got = false;
  }
}

bool SparseUpdate::wouldRank(int64_t step) const {
  if (config_.rerankAt(step))
    return true;
  for (const Entry &e : entries_)
    if (!e.ranked)
      return true;
  return false;
}

int64_t SparseUpdate::averageGradients(
    const std::function<void(std::vector<at::Tensor> &)> &average) {
  if (entries_.empty())
    return 0;
  at::NoGradGuard noGrad;
  std::vector<at::Tensor> ts;
  at::Tensor got = at::zeros({int64_t(entries_.size())},
                             entries_.front().grad.options());
  int64_t bytes = 4 * got.numel();
  for (size_t i = 0; i < entries_.size(); ++i) {
    ts.push_back(entries_[i].grad);
    bytes += 4 * entries_[i].grad.numel();
    if (entries_[i].got)
      got[int64_t(i)] = 1.0f;
  }
  ts.push_back(got);
  average(ts);
  const at::Tensor any = ts.back().cpu();
  for (size_t i = 0; i < entries_.size(); ++i)
    entries_[i].got = any[int64_t(i)].item<float>() > 0;
  return bytes;
}

void SparseUpdate::rerank(size_t i, const at::Tensor &grad) {
  Entry &e = entries_[i];
  at::NoGradGuard noGrad;
  // Every rank's gradient (its average folds as it would on one process:
  // the exchange's average leaves it as it is).
  if (averageDense)
    averageDense(grad);
  const at::Tensor g = grad.reshape({-1}).to(at::kFloat);
  const at::Tensor theta = params_[i].detach().reshape({-1}).to(at::kFloat);
  // |θ·g| + λ·g², of the unscaled gradient g/s.
  const double s = lossScale_;
  at::Tensor importance = (theta * g).abs_();
  if (config_.lambda > 0)
    importance.addcmul_(g, g, config_.lambda / s);
  if (s != 1.0)
    importance.div_(s);
  const int64_t k = e.index.numel();
  at::Tensor chosen = std::get<1>(importance.topk(k, 0, /*largest=*/true,
                                                  /*sorted=*/false));
  importance = at::Tensor();
  chosen = std::get<0>(chosen.sort());
  // Entries selected before keep their moments and step counts; new ones
  // start from zero (their bias correction from their own first step).
  // The compact gradient so far (this step's, gathered before the ranking
  // where a tensor is used twice) moves with its entries too.
  at::Tensor avg = at::zeros_like(e.avg), sq = at::zeros_like(e.sq),
             steps = at::zeros_like(e.steps), sum = at::zeros_like(e.grad);
  int64_t kept = 0;
  if (e.ranked) {
    at::Tensor at = at::searchsorted(e.index, chosen).clamp_max_(k - 1);
    at::Tensor hit = e.index.index_select(0, at).eq(chosen);
    auto carry = [&](const at::Tensor &from, const at::Tensor &fresh) {
      return at::where(hit, from.index_select(0, at), fresh);
    };
    avg = carry(e.avg, avg);
    sq = carry(e.sq, sq);
    steps = carry(e.steps, steps);
    sum = carry(e.grad, sum);
    kept = hit.sum().item<int64_t>();
  }
  e.index = chosen;
  e.avg = avg;
  e.sq = sq;
  e.steps = steps;
  e.grad = sum;
  e.rerank = false;
  e.ranked = true;
  changed_ += k - kept;
  ranked_ += k;
  turnover_ = ranked_ ? double(changed_) / double(ranked_) : 0.0;
}

void SparseUpdate::add(size_t i, const at::Tensor &grad) {
  if (i >= entries_.size())
    throw std::out_of_range("mtprt: saps: no managed parameter " +
                            std::to_string(i));
  Entry &e = entries_[i];
  if (grad.numel() != params_[i].numel())
    throw std::invalid_argument("mtprt: saps: a gradient of " +
                                std::to_string(grad.numel()) +
                                " entries for a parameter of " +
                                std::to_string(params_[i].numel()));
  at::NoGradGuard noGrad;
  if (e.skip)
    return;
  if (e.rerank)
    rerank(i, grad);
  e.grad.add_(grad.reshape({-1}).index_select(0, e.index).to(at::kFloat));
  e.got = true;
}

void SparseUpdate::unscale(double scale) {
  at::NoGradGuard noGrad;
  for (Entry &e : entries_)
    if (e.got)
      e.grad.div_(scale);
}

bool SparseUpdate::finite() const {
  for (const Entry &e : entries_)
    if (e.got && !at::isfinite(e.grad).all().item<bool>())
      return false;
  return true;
}

void SparseUpdate::step(const SparseAdamW &o) {
  at::NoGradGuard noGrad;
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry &e = entries_[i];
    if (!e.got)
      continue; // no gradient this step: untouched, as AdamW skips it
    at::Tensor flat = params_[i].detach().view({-1});
    // torch.optim.AdamW's update (decoupled decay, bias corrections) with a
    // step count per entry.
    e.steps.add_(1);
    e.avg.lerp_(e.grad, 1.0 - o.beta1);
    e.sq.mul_(o.beta2).addcmul_(e.grad, e.grad, 1.0 - o.beta2);
    at::Tensor bc1 = 1.0 - at::pow(o.beta1, e.steps);
    at::Tensor bc2Sqrt = (1.0 - at::pow(o.beta2, e.steps)).sqrt_();
    at::Tensor denom = (e.sq.sqrt() / bc2Sqrt).add_(o.eps);
    at::Tensor theta = flat.index_select(0, e.index).to(at::kFloat);
    theta.mul_(1.0 - o.lr * o.weightDecay);
    theta.addcmul_(e.avg / denom, bc1.reciprocal_(), -o.lr);
    flat.index_copy_(0, e.index, theta.to(flat.scalar_type()));
  }
}

std::vector<at::Tensor> SparseUpdate::state() const {
  std::vector<at::Tensor> out;
  for (const Entry &e : entries_) {
    out.push_back(e.index);
    out.push_back(e.avg);
    out.push_back(e.sq);
    out.push_back(e.steps);
  }
  return out;
}

void SparseUpdate::loadState(const std::vector<at::Tensor> &state) {
  auto bad = [](size_t i, const std::string &why) {
    return std::runtime_error("saps state of backbone tensor " +
                              std::to_string(i) + ": " + why);
  };
  if (state.size() != 4 * entries_.size())
    throw std::runtime_error(
        "saps state: " + std::to_string(state.size()) + " tensors for " +
        std::to_string(entries_.size()) +
        " backbone tensors (4 each): a checkpoint of another model");
  // Everything checked before anything changes.
  for (size_t i = 0; i < entries_.size(); ++i) {
    const int64_t k = entries_[i].index.numel();
    const int64_t n = params_[i].numel();
    const at::Tensor &index = state[4 * i];
    if (index.scalar_type() != at::kLong || index.dim() != 1 ||
        index.numel() != k)
      throw bad(i, "the selection has " + std::to_string(index.numel()) +
                       " entries where the plan selects " + std::to_string(k) +
                       " (was the checkpoint trained with another saps "
                       "fraction?)");
    at::Tensor ix = index.cpu();
    if (k && (ix.min().item<int64_t>() < 0 || ix.max().item<int64_t>() >= n))
      throw bad(i, "a selected index outside the tensor's " +
                       std::to_string(n) + " entries");
    if (k > 1 && !(ix.slice(0, 1) > ix.slice(0, 0, k - 1)).all().item<bool>())
      throw bad(i, "the selection is not strictly increasing");
    for (int j = 1; j < 4; ++j) {
      const at::Tensor &t = state[4 * i + j];
      if (t.scalar_type() != at::kFloat || t.dim() != 1 || t.numel() != k)
        throw bad(i, "its optimizer state does not match the selection's "
                     "size");
      if (!at::isfinite(t).all().item<bool>() ||
          (j >= 2 && (t < 0).any().item<bool>()))
        throw bad(i, "its optimizer state holds negative or non-finite "
                     "values");
    }
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry &e = entries_[i];
    const at::Device d = params_[i].device();
    e.index = state[4 * i].to(d).clone();
    e.avg = state[4 * i + 1].to(d).clone();
    e.sq = state[4 * i + 2].to(d).clone();
    e.steps = state[4 * i + 3].to(d).clone();
    e.ranked = (e.steps > 0).any().item<bool>();
  }
}

} // namespace mtprt
