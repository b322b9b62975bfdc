//===- Trainer.cpp - one optimizer step over the units --------------------===//

#include "mtprt/torch/Trainer.h"

#include "mtprt/Memory.h"
#include "mtprt/Runtime.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adamw.h>

#ifdef MTPRT_TORCH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <chrono>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>

namespace mtprt {

double scheduledLr(const LrConfig &c, int64_t step) {
  if (c.warmupSteps > 0 && step < c.warmupSteps)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmupSteps);
  const double span = static_cast<double>(std::max<int64_t>(1, c.totalSteps - c.warmupSteps));
  const double progress =
      std::clamp(static_cast<double>(step - c.warmupSteps) / span, 0.0, 1.0);
  switch (c.schedule) {
  case LrSchedule::Constant:
    return c.lr;
  case LrSchedule::Linear:
    return c.lr * (1.0 - progress);
  case LrSchedule::Cosine:
    return c.lr * 0.5 * (1.0 + std::cos(M_PI * progress));
  }
  return c.lr;
}

namespace {

[[noreturn]] void bad(const std::string &field, const std::string &why) {
  throw std::invalid_argument("mtprt: " + field + ": " + why);
}

void validateLr(const LrConfig &c, const std::string &field) {
  if (!(c.lr > 0))
    bad(field + ".lr", "must be positive");
  if (c.warmupSteps < 0)
    bad(field + ".warmupSteps", "must be >= 0");
  if (c.totalSteps <= 0)
    bad(field + ".totalSteps", "must be positive");
}

/// Adds g into p's .grad (creating it).
void accumulateGrad(const at::Tensor &p, const at::Tensor &g) {
  if (!g.defined())
    return;
  at::Tensor &grad = p.mutable_grad();
  if (grad.defined())
    grad.add_(g);
  else
    grad = g.detach().clone();
}

/// Autocast on the model's device for bf16 / fp16; restores on exit.
class PrecisionGuard {
public:
  PrecisionGuard(Precision p, const at::Device &d) {
    if (p == Precision::Fp32)
      return;
    type_ = d.type();
    was_ = at::autocast::is_autocast_enabled(type_);
    dtype_ = at::autocast::get_autocast_dtype(type_);
    at::autocast::set_autocast_enabled(type_, true);
    at::autocast::set_autocast_dtype(type_, p == Precision::Bf16 ? at::kBFloat16 : at::kHalf);
    active_ = true;
  }
  ~PrecisionGuard() {
    if (!active_)
      return;
    at::autocast::set_autocast_enabled(type_, was_);
    at::autocast::set_autocast_dtype(type_, dtype_);
    if (!was_)
      at::autocast::clear_cache();
  }

private:
  bool active_ = false, was_ = false;
  at::DeviceType type_ = at::kCPU;
  at::ScalarType dtype_ = at::kBFloat16;
};

using Clock = std::chrono::steady_clock;

} // namespace

TrainerCore::TrainerCore(ModelConfig model, std::vector<HeadConfig> heads,
                         TrainConfig train, OffloadOptions offload)
    : model_(std::make_unique<Model>(std::move(model), std::move(heads))),
      train_(std::move(train)) {
  const TrainConfig &t = train_;
  const int64_t nh = model_->numHeads();
  if (t.microBatches <= 0)
    bad("TrainConfig.microBatches", "must be positive");
  if (t.scope == GradScope::Params && (t.paramsTopK <= 0 || t.paramsTopK > model_->config().layers))
    bad("TrainConfig.paramsTopK", "must be in [1, layers]");
  if (!(t.gfmKeep > 0 && t.gfmKeep <= 1))
    bad("TrainConfig.gfmKeep", "must be in (0, 1]");
  if (t.clipNorm < 0)
    bad("TrainConfig.clipNorm", "must be >= 0 (0 = off)");
  if (t.cosineEvery < 0)
    bad("TrainConfig.cosineEvery", "must be >= 0 (0 = never)");
  if (t.weightDecay < 0)
    bad("TrainConfig.weightDecay", "must be >= 0");
  validateLr(t.backboneLr, "TrainConfig.backboneLr");
  if (!t.headLr.empty() && static_cast<int64_t>(t.headLr.size()) != nh)
    bad("TrainConfig.headLr", "needs one entry per head (" + std::to_string(nh) +
                                  "), got " + std::to_string(t.headLr.size()));
  for (size_t i = 0; i < t.headLr.size(); ++i)
    validateLr(t.headLr[i], "TrainConfig.headLr[" + std::to_string(i) + "]");
  if (t.precision == Precision::Fp16 && !model_->device().is_cuda())
    bad("TrainConfig.precision", "fp16 (with loss scaling) needs a CUDA device; use bf16 on cpu");
  if (t.precision == Precision::Fp16 && !(t.initialLossScale > 0))
    bad("TrainConfig.initialLossScale", "must be positive");
  lossScale_ = t.precision == Precision::Fp16 ? t.initialLossScale : 1.0;

  offloader_ = std::make_unique<Offloader>(offload);
  gate_ = std::make_unique<Gate>(model_->config().seed, t.gateLr, t.gateEntropy);

  // TaskLRAdapter: group 0 the backbone, group 1 + h head h, each with its
  // own schedule (set every step).
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto options = [&](double lr) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(lr).weight_decay(t.weightDecay));
  };
  groups.emplace_back(model_->backboneParameters(), options(t.backboneLr.lr));
  for (int64_t h = 0; h < nh; ++h)
    groups.emplace_back(model_->headParameters(h),
                        options(t.headLr.empty() ? t.backboneLr.lr : t.headLr[h].lr));
  optimizer_ = std::make_unique<torch::optim::AdamW>(std::move(groups),
                                                     torch::optim::AdamWOptions(t.backboneLr.lr));
}

TrainerCore::~TrainerCore() = default;

void TrainerCore::validate(const Schedule &s) const {
  const int64_t units = model_->numUnits();
  std::set<int64_t> taps;
  for (const HeadConfig &h : model_->heads())
    taps.insert(Model::tapUnit(h.tap));
  std::vector<bool> used(units, false);
  for (size_t i = 0; i < s.regions.size(); ++i) {
    const auto &r = s.regions[i];
    const std::string f = "Schedule.regions[" + std::to_string(i) + "]";
    if (r.first < 0 || r.second >= units || r.first > r.second)
      bad(f, "must be a unit range [first, last] within [0, " + std::to_string(units - 1) + "]");
    for (int64_t u = r.first; u <= r.second; ++u) {
      if (used[u])
        bad(f, "overlaps another region at unit " + std::to_string(u));
      used[u] = true;
      if (u < r.second && taps.count(u))
        bad(f, "contains a head's tap (unit " + std::to_string(u) +
                   ") before its end; end the region at the tap");
    }
  }
  if (s.prefetchAhead < 0)
    bad("Schedule.prefetchAhead", "must be >= 0");
  std::vector<bool> seen(model_->numHeads(), false);
  for (size_t i = 0; i < s.headOrder.size(); ++i) {
    const int64_t h = s.headOrder[i];
    if (h < 0 || h >= model_->numHeads() || seen[h])
      bad("Schedule.headOrder[" + std::to_string(i) + "]",
          "must be a permutation of the head indices");
    seen[h] = true;
  }
  if (!s.headOrder.empty() && static_cast<int64_t>(s.headOrder.size()) != model_->numHeads())
    bad("Schedule.headOrder", "must list every head once (or be empty)");
}

std::vector<at::Tensor> TrainerCore::forwardBackbone(const at::Tensor &tokens,
                                                     const Schedule &s) {
  const Model &m = *model_;
  std::vector<at::Tensor> taps(m.config().layers + 1);
  std::vector<bool> isTap(m.numUnits(), false);
  for (const HeadConfig &h : m.heads())
    isTap[Model::tapUnit(h.tap)] = true;
  std::vector<int64_t> regionEnd(m.numUnits(), -1);
  for (const auto &r : s.regions)
    regionEnd[r.first] = r.second;

  // Offloaded region boundaries, bottom to top; a hook on each region's output
  // prefetches, when the backward reaches it, that region's boundary and the
  // prefetchAhead - 1 below it.
  std::vector<std::string> offloaded;
  at::Tensor x = tokens;
  for (int64_t u = 0; u < m.numUnits();) {
    int64_t last = regionEnd[u];
    if (last < 0) {
      x = m.unit(u, x);
      last = u;
    } else {
      std::vector<at::Tensor> params;
      for (int64_t l = (u + 1) / 2; l <= (last + 1) / 2; ++l)
        for (const at::Tensor &p : m.layerParameters(l))
          params.push_back(p);
      RegionFn fn = [&m, u, last](const at::Tensor &in) { return m.runUnits(u, last, in); };
      const std::string group = "region" + std::to_string(u);
      // The embeddings' input is the token ids, and a tap stays on the device
      // for its head and the backbone backward anyway: neither is offloaded.
      if (s.offloadRegionBoundaries && u > 0 && !isTap[u - 1]) {
        {
          Offloader::Scope scope(*offloader_, group);
          x = checkpoint(fn, x, params);
        }
        offloader_->waitOffloaded(group);
        offloaded.push_back(group);
      } else {
        x = checkpoint(fn, x, params);
      }
      if (!offloaded.empty() && s.prefetchAhead > 0 && x.requires_grad()) {
        std::vector<std::string> fetch;
        const int64_t top = static_cast<int64_t>(offloaded.size()) - 1;
        const bool mine = offloaded.back() == group;
        // Own boundary (if offloaded) counts as the first of prefetchAhead.
        for (int64_t i = top, n = mine ? s.prefetchAhead : s.prefetchAhead - 1; i >= 0 && n > 0;
             --i, --n)
          fetch.push_back(offloaded[i]);
        if (!fetch.empty()) {
          Offloader *off = offloader_.get();
          x.register_hook([off, fetch](const at::Tensor &) {
            for (const std::string &g : fetch)
              off->prefetch(g);
          });
        }
      }
    }
    if (isTap[last])
      taps[last / 2] = x;
    u = last + 1;
  }
  return taps;
}

std::vector<double> TrainerCore::computeAlpha(const std::vector<GradList> &processed,
                                              const std::vector<GradList> &probe,
                                              const std::vector<double> &losses,
                                              const std::vector<double> &norms,
                                              const std::vector<bool> &present,
                                              StepStats &stats) {
  const size_t nt = present.size();
  int64_t n = 0;
  for (bool p : present)
    n += p;
  const bool measure = train_.cosineEvery > 0 && step_ % train_.cosineEvery == 0;
  at::Tensor gram;
  if (measure) {
    gram = gramMatrix(probe.empty() ? processed : probe);
    lastCosines_ = cosineMatrix(gram);
    stats.gradientCosineSimMatrix = lastCosines_;
  }
  std::vector<double> alpha(nt, 0.0);
  if (!train_.gate || n == 1 || lastCosines_.empty()) {
    for (size_t t = 0; t < nt; ++t)
      alpha[t] = present[t] ? 1.0 / static_cast<double>(n) : 0.0;
  } else {
    alpha = gate_->alpha(losses, norms, lastCosines_, present);
  }
  if (train_.gate && measure)
    gate_->update(losses, norms, lastCosines_, present, gram);
  return alpha;
}

StepStats TrainerCore::computeGradients(const Batch &fullBatch, const Schedule &s) {
  validate(s);
  Model &m = *model_;
  const int64_t nt = m.numHeads();
  if (static_cast<int64_t>(fullBatch.labels.size()) != nt)
    bad("Batch.labels", "needs one entry per head (" + std::to_string(nt) + ")");
  const Batch batch = fullBatch.to(m.device());
  const int64_t bsz = batch.size();
  const int64_t micro = train_.microBatches;
  if (bsz < micro)
    bad("TrainConfig.microBatches", "exceeds the batch size " + std::to_string(bsz));
  std::vector<bool> present(nt);
  int64_t npresent = 0;
  for (int64_t t = 0; t < nt; ++t)
    npresent += (present[t] = batch.labels[t].defined());
  if (!npresent)
    bad("Batch.labels", "the batch has labels for no task");

  StepStats stats;
  stats.step = step_;
  for (const HeadConfig &h : m.heads())
    stats.tasks.push_back(h.name);
  for (const at::Tensor &p : m.parameters())
    p.mutable_grad() = at::Tensor();
  const bool cuda = m.device().is_cuda();
  const auto start = Clock::now();
  if (cuda) {
    resetCudaPeak(m.device().index() < 0 ? 0 : m.device().index());
    stats.measuredStartBytes = cudaMemoryStats(m.device().index() < 0 ? 0 : m.device().index()).currentBytes;
  } else {
    resetCpuPeak();
    stats.measuredStartBytes = cpuMemoryStats().currentBytes;
  }
  offloader_->resetStats();

  const double scale = lossScale_;
  std::vector<double> losses(nt, 0.0);
  std::vector<double> alpha;
  std::vector<GradList> accum(nt); // params scope: Σ over micro-batches
  std::vector<at::Tensor> topk;    // params scope: the top k layers' parameters
  std::vector<at::Tensor> lower;   // params scope: backbone parameters below
  if (train_.scope == GradScope::Params) {
    int64_t maxTap = 0;
    for (const HeadConfig &h : m.heads())
      maxTap = std::max(maxTap, h.tap);
    const int64_t L = m.config().layers;
    for (int64_t l = L - train_.paramsTopK + 1; l <= L; ++l)
      for (const at::Tensor &p : m.layerParameters(l))
        topk.push_back(p);
    for (int64_t l = 0; l <= std::min(maxTap, L - train_.paramsTopK); ++l)
      for (const at::Tensor &p : m.layerParameters(l))
        lower.push_back(p);
  }
  if (keepDebug) {
    lastProcessed.assign(nt, {});
    lastFused.clear();
  }

  for (int64_t mb = 0; mb < micro; ++mb) {
    const int64_t begin = bsz * mb / micro, end = bsz * (mb + 1) / micro;
    const Batch b = batch.slice(begin, end);
    const double weight = static_cast<double>(end - begin) / static_cast<double>(bsz);

    // Forward: backbone, then every present head and its loss.
    std::vector<at::Tensor> taps, loss(nt);
    {
      PrecisionGuard precision(train_.precision, m.device());
      taps = forwardBackbone(b.tokens, s);
      for (int64_t t = 0; t < nt; ++t) {
        if (!present[t])
          continue;
        const HeadConfig &hc = m.heads()[t];
        const std::string group = "head" + std::to_string(t);
        if (s.offloadHeads) {
          {
            Offloader::Scope scope(*offloader_, group, {taps[hc.tap]});
            loss[t] = m.loss(t, m.head(t, taps[hc.tap], b.labels[t]), b.labels[t]);
          }
          offloader_->waitOffloaded(group);
        } else {
          loss[t] = m.loss(t, m.head(t, taps[hc.tap], b.labels[t]), b.labels[t]);
        }
        losses[t] += loss[t].item<double>() * weight;
        loss[t] = loss[t] * (weight * scale);
      }
    }

    // Prefetch policy: before task i's backward, heads up to i + ahead.
    std::vector<int64_t> order;
    for (int64_t i = 0; i < nt; ++i) {
      const int64_t t = s.headOrder.empty() ? nt - 1 - i : s.headOrder[i];
      if (present[t])
        order.push_back(t);
    }
    size_t prefetched = 0;
    auto prefetchThrough = [&](size_t i) {
      if (!s.offloadHeads || s.prefetchAhead == 0)
        return;
      for (; prefetched < order.size() && prefetched <= i + s.prefetchAhead - 1; ++prefetched)
        offloader_->prefetch("head" + std::to_string(order[prefetched]));
    };
    if (train_.scope == GradScope::Sum) {
      prefetchThrough(order.size());
      at::Tensor total;
      for (int64_t t : order)
        total = total.defined() ? total + loss[t] : loss[t];
      total.backward();
      alpha.assign(nt, 0.0);
      for (int64_t t : order)
        alpha[t] = 1.0 / static_cast<double>(npresent);
      continue;
    }

    // Per-task head backward: gradients of the tap (features) or the top-k
    // layers (params), and of the head's own parameters.
    std::vector<GradList> taskGrads(nt);
    for (size_t i = 0; i < order.size(); ++i) {
      const int64_t t = order[i];
      prefetchThrough(i);
      std::vector<at::Tensor> inputs;
      if (train_.scope == GradScope::Features)
        inputs.push_back(taps[m.heads()[t].tap]);
      else
        inputs = topk;
      const size_t nshared = inputs.size();
      for (const at::Tensor &p : m.headParameters(t))
        inputs.push_back(p);
      const bool retain = train_.scope == GradScope::Params;
      auto grads = torch::autograd::grad({loss[t]}, inputs, {}, retain, false,
                                         /*allow_unused=*/true);
      auto hp = m.headParameters(t);
      for (size_t j = 0; j < hp.size(); ++j)
        accumulateGrad(hp[j], grads[nshared + j]);
      for (size_t j = 0; j < nshared; ++j) {
        at::Tensor g = grads[j];
        if (!g.defined())
          g = at::zeros_like(inputs[j], inputs[j].options().dtype(at::kFloat));
        taskGrads[t].push_back(scale != 1.0 ? g / scale : g);
      }
    }

    if (train_.scope == GradScope::Features) {
      for (int64_t t = 0; t < nt; ++t)
        if (!present[t])
          taskGrads[t] = {at::Tensor()};
      const std::vector<double> norms =
          processTaskGrads(taskGrads, present, train_.gfmKeep, train_.clipNorm);
      if (mb == 0) {
        // The cosine matrix and the gate's signals live on the parameters of
        // the topmost layer every present task back-propagates through.
        std::vector<GradList> probe;
        if (train_.cosineEvery > 0 && step_ % train_.cosineEvery == 0 && npresent > 1) {
          int64_t common = m.config().layers;
          for (int64_t t : order)
            common = std::min(common, m.heads()[t].tap);
          const std::vector<at::Tensor> probeParams = m.layerParameters(common);
          probe.assign(nt, {});
          for (int64_t t : order) {
            auto g = torch::autograd::grad({taps[m.heads()[t].tap]}, probeParams,
                                           {taskGrads[t][0]}, /*retain_graph=*/true,
                                           false, /*allow_unused=*/true);
            probe[t] = g;
          }
          for (int64_t t = 0; t < nt; ++t)
            if (!present[t])
              probe[t].assign(probeParams.size(), at::Tensor());
        }
        std::vector<double> meanLoss(nt);
        for (int64_t t = 0; t < nt; ++t)
          meanLoss[t] = present[t] ? loss[t].item<double>() / (weight * scale) : 0.0;
        alpha = computeAlpha(taskGrads, probe, meanLoss, norms, present, stats);
      }
      // One backbone backward with Σ α_t ĝ_t at each tap as grad_outputs.
      std::vector<at::Tensor> outs, gradOuts;
      for (int64_t layer = 0; layer <= m.config().layers; ++layer) {
        std::vector<GradList> atTap;
        std::vector<double> a;
        for (int64_t t : order)
          if (m.heads()[t].tap == layer) {
            atTap.push_back(taskGrads[t]);
            a.push_back(alpha[t]);
          }
        if (atTap.empty())
          continue;
        GradList fused = fuse(atTap, a);
        if (!fused[0].defined())
          continue;
        outs.push_back(taps[layer]);
        gradOuts.push_back((scale != 1.0 ? fused[0] * scale : fused[0]).to(taps[layer].scalar_type()));
        if (keepDebug)
          lastFused.push_back(fused[0]);
      }
      if (keepDebug)
        for (int64_t t = 0; t < nt; ++t)
          lastProcessed[t] = taskGrads[t];
      taskGrads.clear(); // only the fused grad_outputs live through the backward
      if (!outs.empty())
        torch::autograd::backward(outs, gradOuts);
      continue;
    }

    // Params scope: accumulate per-task top-k gradients; the layers below get
    // Σ α_t loss_t with α from the first micro-batch.
    if (mb == 0) {
      std::vector<GradList> probe = taskGrads;
      for (int64_t t = 0; t < nt; ++t)
        if (!present[t])
          probe[t].assign(topk.size(), at::Tensor());
      const std::vector<double> norms =
          processTaskGrads(probe, present, train_.gfmKeep, train_.clipNorm);
      std::vector<double> meanLoss(nt);
      for (int64_t t = 0; t < nt; ++t)
        meanLoss[t] = present[t] ? loss[t].item<double>() / (weight * scale) : 0.0;
      alpha = computeAlpha(probe, {}, meanLoss, norms, present, stats);
    }
    for (int64_t t : order) {
      if (accum[t].empty())
        accum[t] = taskGrads[t];
      else
        for (size_t j = 0; j < topk.size(); ++j)
          accum[t][j] = accum[t][j] + taskGrads[t][j];
    }
    at::Tensor weighted;
    for (int64_t t : order)
      weighted = weighted.defined() ? weighted + alpha[t] * loss[t] : alpha[t] * loss[t];
    if (!lower.empty())
      torch::autograd::backward({weighted}, {}, /*retain_graph=*/false, false, lower);
  }

  if (train_.scope == GradScope::Params) {
    for (int64_t t = 0; t < nt; ++t)
      if (!present[t])
        accum[t].assign(topk.size(), at::Tensor());
    processTaskGrads(accum, present, train_.gfmKeep, train_.clipNorm);
    GradList fused = fuse(accum, alpha);
    for (size_t j = 0; j < topk.size(); ++j) // rescaled: unscaled below with the rest
      accumulateGrad(topk[j], scale != 1.0 && fused[j].defined() ? fused[j] * scale : fused[j]);
    if (keepDebug) {
      lastProcessed = accum;
      lastFused = fused;
      lastParamsScopeParams = topk;
    }
  }

  // Unscale what autograd accumulated with the fp16 loss scale.
  if (scale != 1.0)
    for (const at::Tensor &p : m.parameters())
      if (p.grad().defined())
        p.mutable_grad().div_(scale);

  if (keepDebug)
    lastAlpha = alpha;
  for (int64_t t = 0; t < nt; ++t) {
    stats.loss.push_back(present[t] ? losses[t] : std::numeric_limits<double>::quiet_NaN());
    stats.alpha.push_back(alpha.empty() ? 0.0 : alpha[t]);
  }
  offloader_->synchronize();
  const OffloadStats os = offloader_->stats();
  stats.offloadHits = os.hits;
  stats.offloadMisses = os.misses;
  stats.offloadWaitS = os.waitS;
  stats.checkpointHitRate = os.hitRate();
  stats.hostPoolBytes = os.hostPeakBytes;
  if (cuda) {
    const MemoryStats ms = cudaMemoryStats(m.device().index() < 0 ? 0 : m.device().index());
    stats.measuredPeakBytes = ms.peakBytes;
    stats.measuredCurrentBytes = ms.currentBytes;
  } else {
    const MemoryStats ms = cpuMemoryStats();
    stats.measuredPeakBytes = ms.peakBytes;
    stats.measuredCurrentBytes = ms.currentBytes;
  }
  stats.lossScale = lossScale_;
  stats.stepTimeS = std::chrono::duration<double>(Clock::now() - start).count();
  stats.samplesPerS = stats.stepTimeS > 0 ? static_cast<double>(bsz) / stats.stepTimeS : 0.0;
  return stats;
}

StepStats TrainerCore::step(const Batch &batch, const Schedule &schedule) {
  const auto start = Clock::now();
  StepStats stats = computeGradients(batch, schedule);
  // TaskLRAdapter: each group's own schedule.
  auto &groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const LrConfig &c =
        g == 0 || train_.headLr.empty() ? train_.backboneLr : train_.headLr[g - 1];
    static_cast<torch::optim::AdamWOptions &>(groups[g].options()).lr(scheduledLr(c, step_));
  }
  bool finite = true;
  if (train_.precision == Precision::Fp16) {
    for (const at::Tensor &p : model_->parameters())
      if (p.grad().defined() && !at::isfinite(p.grad()).all().item<bool>()) {
        finite = false;
        break;
      }
    if (!finite) {
      lossScale_ /= 2.0;
      goodSteps_ = 0;
    } else if (++goodSteps_ % 2000 == 0) {
      lossScale_ *= 2.0;
    }
  }
  stats.skipped = !finite;
  if (finite)
    optimizer_->step();
  ++step_;
  stats.stepTimeS = std::chrono::duration<double>(Clock::now() - start).count();
  stats.samplesPerS = stats.stepTimeS > 0 ? static_cast<double>(batch.size()) / stats.stepTimeS : 0.0;
  return stats;
}

//===----------------------------------------------------------------------===//
// The torch-free facade
//===----------------------------------------------------------------------===//

struct Trainer::BatchHolder {
  Batch batch;
};

namespace {
/// Device memory is measured from before the parameters exist.
const ModelConfig &withTracking(const ModelConfig &model) {
  if (model.device == "cpu")
    installCpuMemoryTracking();
  return model;
}
} // namespace

Trainer::Trainer(const ModelConfig &model, const std::vector<HeadConfig> &heads,
                 const TrainConfig &train)
    : core_(std::make_unique<TrainerCore>(withTracking(model), heads, train)),
      batch_(std::make_unique<BatchHolder>()) {}

Trainer::~Trainer() = default;

void Trainer::useSyntheticBatch(int64_t batchSize, uint64_t seed) {
  if (batchSize <= 0)
    bad("batchSize", "must be positive");
  batch_->batch = core_->model().syntheticBatch(batchSize, seed);
}

void Trainer::setBatch(int64_t batchSize, const int64_t *tokens,
                       const std::vector<const void *> &labels) {
  const Model &m = core_->model();
  if (batchSize <= 0)
    bad("batchSize", "must be positive");
  if (!tokens)
    bad("tokens", "must not be null");
  if (static_cast<int64_t>(labels.size()) != m.numHeads())
    bad("labels", "needs one entry per head (" + std::to_string(m.numHeads()) + ")");
  const int64_t s = m.config().seq;
  Batch b;
  b.tokens = at::from_blob(const_cast<int64_t *>(tokens), {batchSize, s}, at::kLong).clone();
  if ((b.tokens < 0).any().item<bool>() || (b.tokens >= m.config().vocab).any().item<bool>())
    bad("tokens", "every token must be in [0, vocab)");
  for (int64_t h = 0; h < m.numHeads(); ++h) {
    const HeadConfig &c = m.heads()[h];
    if (!labels[h]) {
      b.labels.emplace_back();
      continue;
    }
    void *p = const_cast<void *>(labels[h]);
    switch (c.kind) {
    case HeadKind::Classify:
      b.labels.push_back(c.loss == LossKind::Mse
                             ? at::from_blob(p, {batchSize, c.classes}, at::kFloat).clone()
                             : at::from_blob(p, {batchSize}, at::kLong).clone());
      break;
    case HeadKind::Tag:
      b.labels.push_back(at::from_blob(p, {batchSize, s}, at::kLong).clone());
      break;
    case HeadKind::Span:
      b.labels.push_back(at::from_blob(p, {batchSize, 2}, at::kLong).clone());
      break;
    case HeadKind::Decoder:
      b.labels.push_back(at::from_blob(p, {batchSize, c.targetSeq}, at::kLong).clone());
      break;
    }
  }
  batch_->batch = std::move(b);
}

StepStats Trainer::step(const Schedule &schedule) {
  if (!batch_->batch.tokens.defined())
    throw std::runtime_error("mtprt: Trainer::step: no batch (call setBatch or useSyntheticBatch)");
  return core_->step(batch_->batch, schedule);
}

int64_t Trainer::numParameters() const { return core_->model().numParameters(); }
int64_t Trainer::numUnits() const { return core_->model().numUnits(); }
std::string Trainer::unitName(int64_t unit) const { return core_->model().unitName(unit); }
std::vector<std::string> Trainer::taskNames() const {
  std::vector<std::string> names;
  for (const HeadConfig &h : core_->model().heads())
    names.push_back(h.name);
  return names;
}

} // namespace mtprt
