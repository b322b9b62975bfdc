//===- GradPipeline.cpp - GFM, per-task clip, DGFG gate, fusion -----------===//

#include "mtprt/torch/GradPipeline.h"

#include "mtprt/kernels/GradFuse.h"
#include "mtprt/kernels/Specialized.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adam.h>
#include <torch/serialize/archive.h>

#ifdef MTPRT_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace mtprt {

namespace {

#if defined(MTPRT_TORCH_CUDA) && defined(MTPRT_HAVE_CUDA_KERNELS)
void checkCuda(int err, const char *what) {
  if (err != 0)
    throw std::runtime_error(std::string("mtprt: CUDA kernel ") + what +
                             " failed with error " + std::to_string(err));
}
#endif

} // namespace

at::Tensor gfm(const at::Tensor &g, double keep) {
  if (!(keep > 0.0))
    throw std::invalid_argument(
        "mtprt: TrainConfig.gfmKeep must be in (0, 1], got " +
        std::to_string(keep));
  if (keep >= 1.0 || !g.defined())
    return g;
  const int64_t n = g.size(-1);
  const int64_t bins = n / 2 + 1;
  const int64_t kept = kernels::gfmKeptBins(n, keep);
  at::Tensor spec = at::fft_rfft(g.to(at::kFloat), n, -1).contiguous();
  float *data = reinterpret_cast<float *>(spec.data_ptr());
  const int64_t rows = spec.numel() / bins;
  // The program's kernel, specialized with its spec's hidden size and keep.
  const kernels::Specialized &sk = kernels::specialized();
  const bool mine = sk.gfmBins == bins && sk.gfmKeep == kept;
#if defined(MTPRT_TORCH_CUDA) && defined(MTPRT_HAVE_CUDA_KERNELS)
  if (spec.is_cuda()) {
    void *stream = at::cuda::getCurrentCUDAStream().stream();
    if (mine && sk.maskBinsCuda) {
      kernels::countSpecializedLaunch();
      checkCuda(sk.maskBinsCuda(data, rows, stream), "maskBins (specialized)");
    } else {
      checkCuda(kernels::maskBinsCuda(data, rows, bins, kept, stream),
                "maskBins");
    }
    return at::fft_irfft(spec, n, -1).to(g.scalar_type());
  }
#endif
  if (!spec.is_cpu())
    throw std::runtime_error("mtprt: gfm: no kernel for device " +
                             spec.device().str());
  if (mine && sk.maskBinsCpu) {
    kernels::countSpecializedLaunch();
    sk.maskBinsCpu(data, rows);
  } else {
    kernels::maskBinsCpu(data, rows, bins, kept);
  }
  return at::fft_irfft(spec, n, -1).to(g.scalar_type());
}

double globalNorm(const GradList &g) {
  double s = 0;
  for (const at::Tensor &t : g) {
    if (!t.defined())
      continue;
    at::Tensor x = t.to(at::kFloat).contiguous();
#if defined(MTPRT_TORCH_CUDA) && defined(MTPRT_HAVE_CUDA_KERNELS)
    if (x.is_cuda()) {
      at::Tensor out = at::empty({1}, x.options());
      checkCuda(kernels::sumSquaresCuda(
                    x.data_ptr<float>(), x.numel(), out.data_ptr<float>(),
                    at::cuda::getCurrentCUDAStream().stream()),
                "sumSquares");
      s += out.item<double>();
      continue;
    }
#endif
    s += kernels::sumSquaresCpu(x.data_ptr<float>(), x.numel());
  }
  return std::sqrt(s);
}

std::vector<double> processTaskGrads(std::vector<GradList> &grads,
                                     const std::vector<bool> &present,
                                     double keep, double clipNorm) {
  std::vector<double> norms(grads.size(), 0.0);
  for (size_t t = 0; t < grads.size(); ++t) {
    if (!present[t])
      continue;
    for (at::Tensor &g : grads[t])
      g = gfm(g, keep);
    norms[t] = globalNorm(grads[t]);
    const float scale = kernels::clipWeightScale(norms[t], clipNorm, 1.0);
    if (scale != 1.0f)
      for (at::Tensor &g : grads[t])
        if (g.defined())
          g = g * scale;
  }
  return norms;
}

GradList fuse(const std::vector<GradList> &grads,
              const std::vector<double> &alpha) {
  if (grads.empty())
    return {};
  const size_t k = grads[0].size();
  GradList out(k);
  for (size_t i = 0; i < k; ++i) {
    for (size_t t = 0; t < grads.size(); ++t) {
      const at::Tensor &g = grads[t][i];
      if (!g.defined() || alpha[t] == 0.0)
        continue;
      if (!out[i].defined())
        out[i] = at::zeros(g.sizes(), g.options().dtype(at::kFloat));
      at::Tensor src = g.to(at::kFloat).contiguous();
      const auto scale = static_cast<float>(alpha[t]);
#if defined(MTPRT_TORCH_CUDA) && defined(MTPRT_HAVE_CUDA_KERNELS)
      if (src.is_cuda()) {
        checkCuda(kernels::scaleAccumulateCuda(
                      src.data_ptr<float>(), src.numel(), scale,
                      out[i].data_ptr<float>(),
                      at::cuda::getCurrentCUDAStream().stream()),
                  "scaleAccumulate");
        continue;
      }
#endif
      kernels::scaleAccumulateCpu(src.data_ptr<float>(), src.numel(), scale,
                                  out[i].data_ptr<float>());
    }
  }
  return out;
}

at::Tensor gramMatrix(const std::vector<GradList> &grads) {
  // Tensor by tensor: only the k-th tensor of every task is widened to
  // double at a time, so the transient is the largest tensor times the task
  // count, not a flattened double copy of every gradient (the step's peak
  // falls here when the cosine probe runs: docs/cost-model.md).
  const int64_t t = static_cast<int64_t>(grads.size());
  std::vector<int64_t> numel(t, 0);
  size_t k = 0;
  for (int64_t i = 0; i < t; ++i) {
    k = std::max(k, grads[i].size());
    for (const at::Tensor &g : grads[i])
      if (g.defined())
        numel[i] += g.numel();
  }
  std::vector<double> acc(static_cast<size_t>(t * t), 0.0);
  for (size_t j = 0; j < k; ++j) {
    std::vector<at::Tensor> wide(t);
    for (int64_t i = 0; i < t; ++i)
      if (j < grads[i].size() && grads[i][j].defined() && numel[i])
        wide[i] = grads[i][j].to(at::kDouble).reshape({-1});
    for (int64_t a = 0; a < t; ++a)
      for (int64_t b = a; b < t; ++b)
        if (wide[a].defined() && wide[b].defined() &&
            numel[a] == numel[b] && wide[a].numel() == wide[b].numel())
          acc[a * t + b] += at::dot(wide[a], wide[b]).item<double>();
  }
  at::Tensor gram = at::zeros({t, t}, at::kDouble);
  for (int64_t a = 0; a < t; ++a)
    for (int64_t b = a; b < t; ++b) {
      gram[a][b] = acc[a * t + b];
      gram[b][a] = acc[a * t + b];
    }
  return gram;
}

std::vector<std::vector<double>> cosineMatrix(const at::Tensor &gram) {
  const int64_t t = gram.size(0);
  auto g = gram.accessor<double, 2>();
  std::vector<std::vector<double>> c(t, std::vector<double>(t, 0.0));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < t; ++j) {
      const double d = std::sqrt(g[i][i] * g[j][j]);
      c[i][j] = d > 0 ? g[i][j] / d : 0.0;
    }
  return c;
}

//===----------------------------------------------------------------------===//
// DGFG gate
//===----------------------------------------------------------------------===//

struct Gate::Impl {
  at::Tensor w1, b1, w2, b2;
  std::unique_ptr<torch::optim::Adam> opt;
  double entropy;
  uint64_t seed;
  double lr;
  int64_t hidden = 32;

  void init() {
    at::NoGradGuard noGrad;
    at::Generator gen =
        at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x9a7e5eedULL);
    w1 = at::empty({hidden, 4}).normal_(0, 0.5, gen).requires_grad_(true);
    b1 = at::zeros({hidden}).requires_grad_(true);
    w2 = at::empty({1, hidden}).normal_(0, 0.1, gen).requires_grad_(true);
    b2 = at::zeros({1}).requires_grad_(true);
    opt = std::make_unique<torch::optim::Adam>(
        std::vector<at::Tensor>{w1, b1, w2, b2}, torch::optim::AdamOptions(lr));
  }

  at::Tensor features(const std::vector<double> &losses,
                      const std::vector<double> &norms,
                      const std::vector<std::vector<double>> &cos,
                      const std::vector<bool> &present) const {
    const int64_t t = static_cast<int64_t>(losses.size());
    at::Tensor f = at::zeros({t, 4}, at::kFloat);
    for (int64_t i = 0; i < t; ++i) {
      if (!present[i])
        continue;
      double sum = 0, mn = 1;
      int64_t others = 0;
      for (int64_t j = 0; j < t; ++j)
        if (j != i && present[j] && !cos.empty()) {
          sum += cos[i][j];
          mn = std::min(mn, cos[i][j]);
          ++others;
        }
      f[i][0] = std::log1p(std::max(0.0, losses[i]));
      f[i][1] = std::log(norms[i] + 1e-12) / 10.0;
      f[i][2] = others ? sum / others : 1.0;
      f[i][3] = others ? mn : 1.0;
    }
    return f;
  }

  at::Tensor alpha(const at::Tensor &f,
                   const std::vector<bool> &present) const {
    at::Tensor logits =
        at::linear(at::tanh(at::linear(f, w1, b1)), w2, b2).reshape({-1});
    at::Tensor mask = at::zeros_like(logits, at::kBool);
    for (size_t i = 0; i < present.size(); ++i)
      mask[i] = !present[i];
    return at::softmax(logits.masked_fill(mask, -1e30), 0)
        .masked_fill(mask, 0.0);
  }
};

Gate::Gate(uint64_t seed, double lr, double entropyWeight, int64_t hidden)
    : impl_(std::make_unique<Impl>()) {
  if (!(lr > 0))
    throw std::invalid_argument("mtprt: TrainConfig.gateLr must be positive");
  if (entropyWeight < 0)
    throw std::invalid_argument("mtprt: TrainConfig.gateEntropy must be >= 0");
  // docs/contracts.md: the gate stays under 100 000 parameters (6H + 1).
  if (hidden < 1 || hidden > 16000)
    throw std::invalid_argument("mtprt: TrainConfig.gateHidden must be in "
                                "[1, 16000] (the gate stays under 100 000 "
                                "parameters), got " +
                                std::to_string(hidden));
  impl_->seed = seed;
  impl_->lr = lr;
  impl_->entropy = entropyWeight;
  impl_->hidden = hidden;
  impl_->init();
}

void Gate::reset() { impl_->init(); }

void Gate::save(torch::serialize::OutputArchive &archive) const {
  archive.write("w1", impl_->w1);
  archive.write("b1", impl_->b1);
  archive.write("w2", impl_->w2);
  archive.write("b2", impl_->b2);
  torch::serialize::OutputArchive opt;
  impl_->opt->save(opt);
  archive.write("adam", opt);
}

void Gate::load(torch::serialize::InputArchive &archive) {
  at::NoGradGuard noGrad;
  for (auto [name, t] : {std::pair<const char *, at::Tensor *>{"w1", &impl_->w1},
                         {"b1", &impl_->b1},
                         {"w2", &impl_->w2},
                         {"b2", &impl_->b2}}) {
    at::Tensor v;
    archive.read(name, v);
    if (!v.sizes().equals(t->sizes()))
      throw std::runtime_error(std::string("the DGFG gate's ") + name +
                               " has shape " + c10::str(v.sizes()) +
                               ", this program's gate " + c10::str(t->sizes()) +
                               " (another dgfg width: hidden = " +
                               std::to_string(v.dim() ? v.size(0) : 0) +
                               " vs " + std::to_string(impl_->hidden) + ")");
    t->copy_(v);
  }
  torch::serialize::InputArchive opt;
  archive.read("adam", opt);
  impl_->opt->load(opt);
}

Gate::~Gate() = default;

std::vector<double> Gate::alpha(const std::vector<double> &losses,
                                const std::vector<double> &norms,
                                const std::vector<std::vector<double>> &cosines,
                                const std::vector<bool> &present) const {
  at::NoGradGuard noGrad;
  at::Tensor a =
      impl_->alpha(impl_->features(losses, norms, cosines, present), present);
  return std::vector<double>(a.data_ptr<float>(),
                             a.data_ptr<float>() + a.numel());
}

double Gate::update(const std::vector<double> &losses,
                    const std::vector<double> &norms,
                    const std::vector<std::vector<double>> &cosines,
                    const std::vector<bool> &present, const at::Tensor &gram) {
  int64_t n = 0;
  for (bool p : present)
    n += p;
  if (n < 2)
    return 0.0; // one task: α = 1 whatever the gate says
  at::AutoGradMode grad(true);
  at::Tensor a =
      impl_->alpha(impl_->features(losses, norms, cosines, present), present);
  // Leave-one-out agreement: task t's weight is rewarded by the cosine of ĝ_t
  // with the others' fused direction d_{-t} = Σ_{s≠t} α_s ĝ_s (from G alone).
  at::Tensor g = gram.to(at::kDouble);
  at::Tensor ad = a.to(at::kDouble);
  at::Tensor diag = at::diagonal(g);
  at::Tensor ga = at::mv(g, ad);
  at::Tensor dot = ga - ad * diag; // ĝ_t · d_{-t}
  at::Tensor dnorm2 =
      at::dot(ad, ga) - 2 * ad * ga + ad * ad * diag; // |d_{-t}|²
  at::Tensor cos = dot / (at::sqrt(diag.clamp_min(1e-30)) *
                          at::sqrt(dnorm2.clamp_min(1e-30)));
  at::Tensor entropy = -(ad * at::log(ad.clamp_min(1e-12))).sum();
  at::Tensor objective = (ad * cos).sum() + impl_->entropy * entropy;
  impl_->opt->zero_grad();
  (-objective).backward();
  impl_->opt->step();
  return objective.item<double>();
}

int64_t Gate::numParameters() const {
  return impl_->w1.numel() + impl_->b1.numel() + impl_->w2.numel() +
         impl_->b2.numel();
}

} // namespace mtprt
