//===- Pipeline.cpp - one pipeline stage's step ---------------------------===//
//
// docs/pipeline.md. Sends return at once (their tensors held until the
// step's end), so a stage blocks only where it needs a neighbour's tensor:
// with the schedules below no stage waits on one that waits on it.
//
//===----------------------------------------------------------------------===//

#include "mtprt/torch/Pipeline.h"

#include "mtprt/torch/Distributed.h"
#include "mtprt/torch/Trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace mtprt {

std::vector<PipeAction> pipelineActions(int64_t stages, int64_t stage,
                                        int64_t micro, bool gpipe) {
  if (stages < 1 || stage < 0 || stage >= stages || micro < 1)
    throw std::invalid_argument(
        "mtprt: pipelineActions: stage " + std::to_string(stage) + " of " +
        std::to_string(stages) + " over " + std::to_string(micro) +
        " micro-batches");
  std::vector<PipeAction> out;
  if (gpipe) {
    for (int64_t m = 0; m < micro; ++m)
      out.push_back({true, m});
    for (int64_t m = 0; m < micro; ++m)
      out.push_back({false, m});
    return out;
  }
  const int64_t warm = std::min(stages - 1 - stage, micro);
  int64_t f = 0, b = 0;
  for (; f < warm; ++f)
    out.push_back({true, f});
  while (f < micro) {
    out.push_back({true, f++});
    out.push_back({false, b++});
  }
  while (b < micro)
    out.push_back({false, b++});
  return out;
}

std::string describeActions(const std::vector<PipeAction> &actions) {
  std::string out;
  for (const PipeAction &a : actions)
    out += (out.empty() ? "" : " ") + std::string(a.forward ? "F" : "B") +
           std::to_string(a.micro);
  return out;
}

namespace {
/// The last unit of the region that starts at `u`; −1 when none does.
int64_t regionEnd(const std::vector<std::pair<int64_t, int64_t>> &regions,
                  int64_t u) {
  for (const auto &[first, last] : regions)
    if (first == u)
      return last;
  return -1;
}

/// Tags: a micro-batch's activation and gradient; micro-batch 0's gate
/// messages above every micro-batch's.
int activationTag(int64_t m) { return static_cast<int>(4 * m); }
int gradientTag(int64_t m) { return static_cast<int>(4 * m + 1); }
constexpr int kGateInfoTag = 1 << 24, kGateGradsTag = (1 << 24) + 1,
              kAlphaTag = (1 << 24) + 2;
} // namespace

PipelineRunner::PipelineRunner(TrainerCore &core, Communicator &world,
                               const PipelineConfig &config, int64_t stage)
    : core_(core), world_(world), config_(config), stage_(stage),
      stages_(config.size()) {
  if (!config.active() || stage < 0 || stage >= stages_)
    throw std::invalid_argument("mtprt: PipelineRunner: stage " +
                                std::to_string(stage) + " of " +
                                std::to_string(stages_));
  prev_ = stage_ > 0 ? world.rank() - 1 : -1;
  next_ = stage_ + 1 < stages_ ? world.rank() + 1 : -1;
  const int64_t nt = core.model().numHeads();
  local_.assign(nt, false);
  for (int64_t t : config.stages[stage].tasks) {
    if (t < 0 || t >= nt)
      throw std::invalid_argument("mtprt: pipeline stage " +
                                  std::to_string(stage) + " names head " +
                                  std::to_string(t) + " of " +
                                  std::to_string(nt));
    local_[t] = true;
  }
}

StepStats PipelineRunner::step(const Batch &batch, bool applyUpdate) {
  using Clock = std::chrono::steady_clock;
  waitS_ = 0;
  const PipelineStageConfig &stage = config_.stages[stage_];
  const TrainConfig &tc = core_.config();
  const Model &model = core_.model();
  const int64_t nt = model.numHeads(), M = tc.microBatches;
  const bool features = tc.scope == GradScope::Features;
  const bool last = stage_ + 1 == stages_;
  const bool measure =
      tc.cosineEvery > 0 && core_.stepsTaken() % tc.cosineEvery == 0;
  const int64_t rows = batch.size(), seq = batch.tokens.size(1),
                hidden = model.config().hidden;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(model.device());
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  auto recv = [&](at::Tensor &t, int peer, int tag) {
    const auto t0 = Clock::now();
    world_.recv(t, peer, tag);
    waitS_ += std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // The gate's small messages: built and read on the host, sent from where
  // the process group takes tensors (NCCL: the device).
  auto recvHost = [&](int64_t n, int peer, int tag) {
    at::Tensor t = at::empty({n}, f64.device(world_.device()));
    recv(t, peer, tag);
    return t.cpu();
  };
  auto sendHost = [&](const at::Tensor &t, int peer, int tag) {
    world_.send(t.to(world_.device()), peer, tag);
  };
  auto microRows = [&](int64_t m) {
    return rows * (m + 1) / M - rows * m / M;
  };

  core_.beginStep(batch);
  std::vector<ValueId> outs(M, -1);
  std::vector<bool> outGrad(M, false);
  // Micro-batch 0's α and cosine matrix (the last stage's), passed down.
  at::Tensor alphaMsg;
  bool sentGrad = false;
  for (const PipeAction &a : pipelineActions(stages_, stage_, M, config_.gpipe)) {
    const int64_t m = a.micro;
    world_.reapSends();
    if (a.forward) {
      core_.beginMicroBatch(m);
      ValueId v;
      if (stage_ == 0) {
        v = core_.input();
      } else {
        at::Tensor x = at::empty({microRows(m), seq, hidden}, fp32);
        recv(x, prev_, activationTag(m));
        v = core_.inputActivation(x);
      }
      // The stage's units, each checkpoint region as one call (the
      // region keeps only its input and re-runs before its backward).
      ValueId out = v;
      auto offloaded = [&](int64_t u) {
        return std::find(stage.offloadUnits.begin(), stage.offloadUnits.end(),
                         u) != stage.offloadUnits.end();
      };
      for (int64_t u = stage.firstUnit; u <= stage.lastUnit;) {
        int64_t end = regionEnd(stage.regions, u);
        const bool region = end >= 0, offload = !region && offloaded(u);
        // A run of kept units in one call; an offloaded unit alone (its
        // saved tensors one group of this micro-batch's, brought back when
        // its backward reaches it).
        if (!region && !offload)
          for (end = u; end < stage.lastUnit &&
                        regionEnd(stage.regions, end + 1) < 0 &&
                        !offloaded(end + 1);)
            ++end;
        if (offload)
          end = u;
        const ValueId next = core_.forward(
            u, end, out,
            region    ? RegionMode::Checkpoint
            : offload ? RegionMode::KeepOffload
                      : RegionMode::Keep);
        if (out != v)
          core_.release(out);
        out = next;
        u = end + 1;
      }
      if (!last) {
        const at::Tensor y = core_.value(out);
        world_.send(y.detach(), next_, activationTag(m));
        core_.setBoundaryOutput(out);
        outs[m] = out;
        outGrad[m] = y.requires_grad();
      }
      for (int64_t t : stage.tasks) {
        core_.forwardHead(t, false);
        core_.backwardHead(t);
      }
      if (!features)
        continue;
      const TrainerCore::GateInputs gi = core_.processTaskGradients();
      if (m != 0)
        continue;
      // The gate's inputs travel up the pipe with micro-batch 0.
      at::Tensor info = at::zeros({3 * nt}, f64);
      const int64_t numel = microRows(0) * seq * hidden;
      at::Tensor grads;
      if (measure)
        grads = at::zeros({nt, numel}, fp32);
      if (stage_ > 0) {
        info = recvHost(3 * nt, prev_, kGateInfoTag);
        if (measure)
          recv(grads, prev_, kGateGradsTag);
      }
      for (int64_t t = 0; t < nt; ++t) {
        if (!local_[t])
          continue;
        info[t] = gi.losses[t];
        info[nt + t] = gi.norms[t];
        info[2 * nt + t] = gi.fusing[t] ? 1.0 : 0.0;
        if (measure && gi.fusing[t])
          grads[t].copy_(gi.processed[t][0].reshape({-1}));
      }
      if (!last) {
        sendHost(info, next_, kGateInfoTag);
        if (measure)
          world_.send(grads, next_, kGateGradsTag);
        continue;
      }
      std::vector<double> losses(nt), norms(nt);
      std::vector<bool> fusing(nt);
      std::vector<GradList> processed(nt);
      for (int64_t t = 0; t < nt; ++t) {
        losses[t] = info[t].item<double>();
        norms[t] = info[nt + t].item<double>();
        fusing[t] = info[2 * nt + t].item<double>() > 0;
        processed[t] = {fusing[t] && measure
                            ? grads[t].view({microRows(0), seq, hidden})
                            : at::Tensor()};
      }
      std::vector<double> alpha =
          core_.pipelineAlpha(processed, losses, norms, fusing);
      const auto &cos = core_.stepStats().gradientCosineSimMatrix;
      alphaMsg = at::full({nt + 1 + nt * nt}, std::nan(""), f64);
      for (int64_t t = 0; t < nt; ++t)
        alphaMsg[t] = alpha[t];
      alphaMsg[nt] = cos.empty() ? 0.0 : 1.0;
      for (size_t i = 0; i < cos.size(); ++i)
        for (size_t j = 0; j < cos[i].size(); ++j)
          alphaMsg[nt + 1 + int64_t(i) * nt + int64_t(j)] = cos[i][j];
      core_.setAlpha(std::move(alpha));
    } else {
      core_.resumeMicroBatch(m);
      if (m == 0 && features && !last) {
        alphaMsg = recvHost(nt + 1 + nt * nt, next_, kAlphaTag);
        // The gate's inputs went up before α came down: those sends are
        // done (gloo's finish only in wait), and their buffers — the
        // processed tap gradients when the cosines are measured — go now,
        // not at the step's end.
        world_.waitSend(next_, kGateInfoTag);
        world_.waitSend(next_, kGateGradsTag);
        std::vector<double> alpha(nt);
        for (int64_t t = 0; t < nt; ++t)
          alpha[t] = alphaMsg[t].item<double>();
        core_.setAlpha(std::move(alpha));
        if (alphaMsg[nt].item<double>() > 0) {
          auto &cos = core_.stepStats().gradientCosineSimMatrix;
          cos.assign(nt, std::vector<double>(nt));
          for (int64_t i = 0; i < nt; ++i)
            for (int64_t j = 0; j < nt; ++j)
              cos[i][j] = alphaMsg[nt + 1 + i * nt + j].item<double>();
        }
      }
      if (!last && outGrad[m]) {
        at::Tensor g = at::empty(core_.value(outs[m]).sizes(), fp32);
        recv(g, next_, gradientTag(m));
        core_.setBoundaryGradient(g);
      }
      // The next stage has taken this micro-batch's activation (its
      // gradient came back): the send lets go of it.
      if (!last)
        world_.waitSend(next_, activationTag(m));
      core_.backwardBackbone();
      if (stage_ > 0) {
        if (m == 0 && features)
          sendHost(alphaMsg, prev_, kAlphaTag);
        at::Tensor g = core_.inputGradient();
        // At most one gradient on its way down (the plan counts one): the
        // previous stage has taken the last before this one goes.
        if (m > 0 && sentGrad) {
          const auto t0 = Clock::now();
          world_.waitSend(prev_, gradientTag(m - 1));
          waitS_ += std::chrono::duration<double>(Clock::now() - t0).count();
        }
        sentGrad = g.defined();
        if (g.defined())
          world_.send(g.to(at::kFloat), prev_, gradientTag(m));
      }
    }
  }
  world_.waitSends();
  StepStats s = core_.endStep(applyUpdate);
  // This stage's tasks only: the driver's step-end all-reduce joins them.
  for (int64_t t = 0; t < nt && t < int64_t(s.loss.size()); ++t)
    if (!local_[t]) {
      if (t < int64_t(s.present.size()))
        s.present[t] = false;
      s.loss[t] = std::numeric_limits<double>::quiet_NaN();
      if (t < int64_t(s.gradNorm.size()))
        s.gradNorm[t] = 0.0;
    }
  return s;
}

} // namespace mtprt
