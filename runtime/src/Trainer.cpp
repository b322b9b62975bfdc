//===- Trainer.cpp - one optimizer step over the units --------------------===//

#include "mtprt/torch/Trainer.h"

#include "mtprt/Memory.h"
#include "mtprt/Runtime.h"
#include "mtprt/torch/Optimizer.h"
#include "mtprt/torch/Ewc.h"
#include "mtprt/torch/Saps.h"
#include "mtprt/torch/Zero.h"
#include "mtprt/torch/Distributed.h"
#include "mtprt/Zero.h"

#include "Precision.h"
#include <c10/util/ScopeExit.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adamw.h>

#ifdef MTPRT_TORCH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <chrono>
#include <cstdio>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>

namespace mtprt {

double scheduledLr(const LrConfig &c, int64_t step) {
  if (c.warmupSteps > 0 && step < c.warmupSteps)
    return c.lr * static_cast<double>(step + 1) /
           static_cast<double>(c.warmupSteps);
  const double span =
      static_cast<double>(std::max<int64_t>(1, c.totalSteps - c.warmupSteps));
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
  if (!(c.lr > 0) || !std::isfinite(c.lr))
    bad(field + ".lr", "must be positive and finite");
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
  if (t.scope == GradScope::Params &&
      (t.paramsTopK <= 0 || t.paramsTopK > model_->config().layers))
    bad("TrainConfig.paramsTopK", "must be in [1, layers]");
  if (t.scope == GradScope::Params)
    for (int64_t l = model_->config().layers - t.paramsTopK + 1;
         l <= model_->config().layers; ++l)
      if (model_->config().frozen(l))
        bad("TrainConfig.paramsTopK",
            "the params scope takes per-task gradients of layer " +
                std::to_string(l) + ", which the model freezes");
  if (t.saps) {
    if (t.scope == GradScope::Params)
      bad("TrainConfig.saps",
          "sparse updates take the backbone's gradients as autograd makes "
          "them; the params scope fuses its top layers' after the backward "
          "(use gradient_scope = features)");
    if (!(t.saps->fraction > 0 && t.saps->fraction <= 1) || t.saps->every < 1 ||
        !(t.saps->lambda >= 0) || !std::isfinite(t.saps->lambda))
      bad("TrainConfig.saps", "fraction in (0, 1], every >= 1, lambda >= 0");
  }
  if (!(t.gfmKeep > 0 && t.gfmKeep <= 1))
    bad("TrainConfig.gfmKeep", "must be in (0, 1]");
  if (t.clipNorm < 0)
    bad("TrainConfig.clipNorm", "must be >= 0 (0 = off)");
  if (t.cosineEvery < 0)
    bad("TrainConfig.cosineEvery", "must be >= 0 (0 = never)");
  if (!(t.weightDecay >= 0) || !std::isfinite(t.weightDecay))
    bad("TrainConfig.weightDecay", "must be >= 0 and finite");
  if (!(t.beta1 >= 0 && t.beta1 < 1))
    bad("TrainConfig.beta1", "must be in [0, 1)");
  if (!(t.beta2 >= 0 && t.beta2 < 1))
    bad("TrainConfig.beta2", "must be in [0, 1)");
  if (!(t.eps >= 0) || !std::isfinite(t.eps))
    bad("TrainConfig.eps", "must be >= 0 and finite");
  validateLr(t.backboneLr, "TrainConfig.backboneLr");
  if (!t.headLr.empty() && static_cast<int64_t>(t.headLr.size()) != nh)
    bad("TrainConfig.headLr", "needs one entry per head (" +
                                  std::to_string(nh) + "), got " +
                                  std::to_string(t.headLr.size()));
  for (size_t i = 0; i < t.headLr.size(); ++i)
    validateLr(t.headLr[i], "TrainConfig.headLr[" + std::to_string(i) + "]");
  if (t.precision == Precision::Fp16 && !model_->device().is_cuda())
    bad("TrainConfig.precision",
        "fp16 (with loss scaling) needs a CUDA device; use bf16 on cpu");
  if (t.precision == Precision::Fp16 && !(t.initialLossScale > 0))
    bad("TrainConfig.initialLossScale", "must be positive");
  lossScale_ = t.precision == Precision::Fp16 ? t.initialLossScale : 1.0;

  offloader_ = std::make_unique<Offloader>(offload);
  gate_ = std::make_unique<Gate>(model_->config().seed, t.gateLr, t.gateEntropy,
                                 t.gateHidden);

  if (t.zeroStage < 0 || t.zeroStage > 3)
    bad("TrainConfig.zeroStage", "must be 0, 1, 2 or 3");
  // ZeRO 3 gathers a unit before the backward that reaches it; the params
  // scope's per-task backwards through the top layers would gather them
  // per task, outside the plan.
  if (t.zeroStage == 3 && t.scope == GradScope::Params)
    bad("TrainConfig.zeroStage", "3 with the params gradient scope is not "
                                 "supported (use the features or sum scope, "
                                 "or zero = 2)");
  if ((t.zeroStage || t.optimizerOffload) && (t.saps || t.ewc))
    bad(t.zeroStage ? "TrainConfig.zeroStage" : "TrainConfig.optimizerOffload",
        "with saps or ewc is not supported");
  buildOptimizer();
}

void TrainerCore::buildOptimizer() {
  const TrainConfig &t = train_;
  const int64_t nh = model_->numHeads();
  // TaskLRAdapter: group 0 the backbone, group 1 + h head h, each with its
  // own schedule (set every step).
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto options = [&](double lr) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(lr)
            .weight_decay(t.weightDecay)
            .betas({t.beta1, t.beta2})
            .eps(t.eps));
  };
  // Frozen layers' parameters: no optimizer state.
  std::vector<at::Tensor> backbone;
  for (const at::Tensor &p : model_->backboneParameters())
    if (p.requires_grad())
      backbone.push_back(p);
  backboneTrains_ = !backbone.empty();
  if (t.ewc) {
    if (t.saps)
      bad("TrainConfig.ewc", "with saps is not supported (the penalty's "
                             "gradient is dense)");
    ewc_ = std::make_unique<ElasticConsolidation>(backbone, *t.ewc);
  }
  // SAPS (D12): the backbone's state is the sparse update's; its group stays
  // (empty) so group g is still head g - 1's.
  if (t.saps) {
    saps_ = std::make_unique<SparseUpdate>(std::move(backbone), *t.saps);
    backbone.clear();
  }
  groups.emplace_back(std::move(backbone), options(t.backboneLr.lr));
  for (int64_t h = 0; h < nh; ++h)
    groups.emplace_back(
        model_->headParameters(h),
        options(t.headLr.empty() ? t.backboneLr.lr : t.headLr[h].lr));
  optimizer_ = std::make_unique<torch::optim::AdamW>(
      std::move(groups), torch::optim::AdamWOptions(t.backboneLr.lr));
  // AdamW's moments up front (what its first step would create: step 0,
  // zeros), so the device holds from the first step what it holds at every
  // step — the plan's peak includes them — and a plan too large for the
  // device fails in its first step, not its second.
  // Under ZeRO each rank makes its run of them (shardOptimizer).
  if (!t.zeroStage && !t.optimizerOffload)
    for (const auto &group : optimizer_->param_groups())
      for (const at::Tensor &p : group.params())
        adamwState(*optimizer_, p);
}

void TrainerCore::shardOptimizer(Communicator *comm) {
  if (!train_.zeroStage && !train_.optimizerOffload)
    throw std::logic_error(
        "mtprt: shardOptimizer without a ZeRO stage or optimizer offload");
  if (state_)
    throw std::logic_error("mtprt: shardOptimizer during a step");
  std::vector<std::vector<at::Tensor>> groups;
  for (const auto &group : optimizer_->param_groups())
    groups.push_back(group.params());
  optimizer_->state().clear();
  // ZeRO-Offload's 16-bit weights (mtprt/Zero.h): the trainable
  // projections cut to the autocast dtype, their masters on the host.
  const bool bf16 = train_.precision == Precision::Bf16;
  const bool fp16 = train_.precision == Precision::Fp16;
  const int64_t world = comm && comm->active() ? comm->worldSize() : 1;
  std::vector<at::Tensor> half;
  if (ZeroLayout::halfProjections(train_.optimizerOffload, bf16, fp16,
                                  train_.zeroStage, world,
                                  train_.scope == GradScope::Params))
    for (const at::Tensor &p : model_->projectionParameters())
      if (p.requires_grad())
        half.push_back(p);
  zero_ = std::make_unique<ZeroOptimizer>(
      comm, train_.zeroStage, std::move(groups),
      AdamWHyper{train_.beta1, train_.beta2, train_.eps, train_.weightDecay},
      train_.optimizerOffload, half, fp16 ? at::kHalf : at::kBFloat16);
  // ZeRO 3: each unit's trainable parameters sharded (heads stay whole).
  if (zero_->stage() == 3) { // more than one rank (else it runs as 1)
    std::vector<std::vector<at::Tensor>> units(model_->numUnits());
    for (int64_t u = 0; u < model_->numUnits(); ++u)
      for (const at::Tensor &p : model_->unitParameters(u))
        if (p.requires_grad())
          units[u].push_back(p);
    zero_->shardParameters(units);
    // An evaluation's units (and a region's first pass) gather and free
    // their own.
    model_->setAroundUnit(zero_->aroundUnit());
  } else if (zero_->worldSize() > 1 || zero_->offloaded()) {
    // ZeRO 1–2: the values other ranks updated arrive while the next
    // forward runs — each unit's before it runs, a head's (and the adapter
    // it shares) after its tap's unit; whatever reads parameters otherwise
    // waits for them all (Model::setBeforeRead, state()). The offload's
    // host update runs in the same order beside that forward.
    const Model &m = *model_;
    const int64_t nu = m.numUnits(), nh = m.numHeads();
    std::vector<std::vector<at::Tensor>> order;
    std::vector<int64_t> groupOf(size_t(nu + nh), -1);
    for (int64_t u = 0; u < nu; ++u) {
      groupOf[size_t(u)] = int64_t(order.size());
      order.push_back(m.unitParameters(u));
      for (int64_t h = 0; h < nh; ++h) {
        if (std::min(Model::tapUnit(m.heads()[h].tap), nu - 1) != u)
          continue;
        std::vector<at::Tensor> read = m.headParameters(h);
        for (const at::Tensor &p : m.sharedAdapterParameters(h))
          read.push_back(p);
        groupOf[size_t(nu + h)] = int64_t(order.size());
        order.push_back(std::move(read));
      }
    }
    zero_->setForwardOrder(order);
    model_->setBeforeRead(zero_->beforeRead(std::move(groupOf)));
  }
}

TrainerCore::WholeParameters::WholeParameters(ZeroOptimizer *zero,
                                              bool masters)
    : zero_(zero && (zero->shardsParameters() ||
                     (masters && zero->holdsValues()))
                ? zero
                : nullptr) {
  if (zero_)
    zero_->gatherAll();
}

TrainerCore::WholeParameters::~WholeParameters() {
  if (zero_)
    zero_->freeAll();
}

TrainerCore::~TrainerCore() = default;

void TrainerCore::validate(const Schedule &s) const {
  validateSchedule(s, model_->config().layers, model_->heads());
}

std::vector<double> TrainerCore::computeAlpha(
    const std::vector<GradList> &processed, const std::vector<GradList> &probe,
    const std::vector<double> &losses, const std::vector<double> &norms,
    const std::vector<bool> &present, StepStats &stats) {
  const size_t nt = present.size();
  int64_t n = 0;
  for (bool p : present)
    n += p;
  const bool measure =
      train_.cosineEvery > 0 && step_ % train_.cosineEvery == 0;
  at::Tensor gram;
  if (measure && !quiet_) {
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
    if (!quiet_)
      gate_->update(losses, norms, lastCosines_, present, gram);
  return alpha;
}

//===----------------------------------------------------------------------===//
// The step, phase by phase
//===----------------------------------------------------------------------===//

/// What one micro-batch carries from its forward to its backward; a pipeline
/// stage holds several (StepState::parked), one at a time current.
struct TrainerCore::MicroState {
  int64_t mb = -1;
  Batch b;
  double weight = 1.0;
  std::vector<at::Tensor> values; ///< ValueId -> activation
  std::vector<at::Tensor> taps;   ///< by tap layer
  std::vector<at::Tensor> loss;   ///< per task, weighted and scaled
  std::vector<GradList> taskGrads;
  std::vector<bool> headForward, headBackward;
  /// D13: each present task's batch-mean gate (Model::gateMean), until the
  /// micro-batch's last head backward takes the separation loss over them.
  std::vector<at::Tensor> gates;
  bool backboneDone = false;
  /// fuseTaskGradients ran: the backbone backward's roots and their
  /// gradients (features: the taps and Σ α_t ĝ_t; sum / params: one loss).
  bool fused = false;
  std::vector<at::Tensor> rootOuts, rootGrads;
  std::vector<std::string> offloadedRegions; ///< bottom to top
  /// Each offloaded group's first and last unit.
  std::vector<std::pair<int64_t, int64_t>> offloadedSpans;
  /// Features scope: GFM and clip ran (processTaskGradients): the tasks
  /// fused, their norms and losses (before their weights) for the gate.
  bool processed = false;
  std::vector<bool> fusing;
  std::vector<double> norms, meanLoss;
  /// A pipeline stage's boundaries: the received activation (a leaf), the
  /// value sent on and the gradient that came back for it.
  at::Tensor boundaryIn, boundaryGrad;
  ValueId boundaryOut = -1;
};

/// Everything one step carries between its phases.
struct TrainerCore::StepState : MicroState {
  Batch batch;
  int64_t bsz = 0;
  std::vector<bool> present;
  int64_t npresent = 0;
  StepStats stats;
  Clock::time_point start;
  double scale = 1.0;
  std::vector<double> losses;
  std::vector<double> gradNorms; ///< per task (StepStats::gradNorm)
  std::vector<double> alpha;
  /// A pipeline stage: α came from the last stage (setAlpha).
  bool alphaGiven = false;
  std::vector<GradList> accum; ///< params scope: Σ over micro-batches
  std::vector<at::Tensor> topk, lower;
  /// The last micro-batch begun; those begun and not yet back-propagated
  /// other than the current one (a pipeline stage's in flight).
  int64_t begun = -1;
  std::map<int64_t, MicroState> parked;
  /// The separation loss (unweighted) summed over micro-batches by their
  /// share of the batch; -1 while none was taken.
  double separation = -1.0;
  /// The step's end phases: gradients final (fused, unscaled, statistics
  /// filled), exchanged with the other ranks, the optimizer stepped.
  bool finalized = false, exchanged = false, updated = false;
  /// Device bytes each backbone unit left live in the forward (a region's
  /// go to its last unit), summed over micro-batches.
  std::vector<int64_t> unitBytes;
};

namespace {
int64_t deviceBytes(const at::Device &d) {
  return d.is_cuda()
             ? cudaMemoryStats(d.index() < 0 ? 0 : d.index()).currentBytes
             : cpuMemoryStats().currentBytes;
}

/// activation_reuse_ratio: of the activation bytes each present task depends
/// on (the units up to its tap, counted once per task), the share that at
/// least one other present task depends on too.
double reuseRatio(const std::vector<int64_t> &unitBytes,
                  const std::vector<int64_t> &tapUnits) {
  double shared = 0, total = 0;
  for (size_t u = 0; u < unitBytes.size(); ++u) {
    int64_t users = 0;
    for (int64_t t : tapUnits)
      users += t >= static_cast<int64_t>(u);
    total += static_cast<double>(unitBytes[u]) * users;
    if (users >= 2)
      shared += static_cast<double>(unitBytes[u]) * users;
  }
  return total > 0 ? shared / total : 0.0;
}

/// Keeps, per task, the largest norm the pipeline computed in the step; a
/// non-finite one wins and stays, so the driver's check sees it.
void recordNorms(std::vector<double> &kept, const std::vector<double> &norms) {
  for (size_t t = 0; t < norms.size() && t < kept.size(); ++t)
    if (std::isfinite(kept[t]) &&
        (!std::isfinite(norms[t]) || norms[t] > kept[t]))
      kept[t] = norms[t];
}
} // namespace

TrainerCore::StepState &
TrainerCore::state(const char *phase, bool needMicroBatch, bool forwardOnly) {
  // ZeRO 1–2's updated values still arriving are waited for as the forward
  // reads them (Model's beforeRead); every other phase up to the update
  // waits for them all (the EWC penalty reads every parameter). Those the
  // update begins arrive beside the next step's forward.
  if (!forwardOnly && zero_ && !(state_ && state_->updated))
    zero_->settleParameters();
  if (!state_)
    throw std::logic_error(std::string("mtprt: ") + phase +
                           ": no step in progress (beginStep first)");
  if (needMicroBatch && state_->mb < 0)
    throw std::logic_error(
        std::string("mtprt: ") + phase +
        ": no micro-batch in progress (beginMicroBatch first)");
  return *state_;
}

void TrainerCore::beginStep(const Batch &fullBatch) {
  Model &m = *model_;
  const int64_t nt = m.numHeads();
  if (static_cast<int64_t>(fullBatch.labels.size()) != nt)
    bad("Batch.labels",
        "needs one entry per head (" + std::to_string(nt) + ")");
  auto st = std::make_unique<StepState>();
  st->batch = fullBatch.to(m.device());
  st->bsz = st->batch.size();
  if (st->bsz < train_.microBatches)
    bad("TrainConfig.microBatches",
        "exceeds the batch size " + std::to_string(st->bsz));
  st->present.resize(nt);
  for (int64_t t = 0; t < nt; ++t)
    st->npresent += (st->present[t] = st->batch.labels[t].defined());
  if (!st->npresent)
    bad("Batch.labels", "the batch has labels for no task");
  st->stats.step = step_;
  for (const HeadConfig &h : m.heads())
    st->stats.tasks.push_back(h.name);
  for (const at::Tensor &p : m.parameters())
    p.mutable_grad() = at::Tensor();
  st->start = Clock::now();
  if (m.device().is_cuda()) {
    const int dev = m.device().index() < 0 ? 0 : m.device().index();
    resetCudaPeak(dev);
    st->stats.measuredStartBytes = cudaMemoryStats(dev).currentBytes;
  } else {
    resetCpuPeak();
    st->stats.measuredStartBytes = cpuMemoryStats().currentBytes;
  }
  offloader_->resetStats();
  st->scale = lossScale_;
  if (saps_) {
    // Data parallelism: a ranking averages each dense gradient over the
    // ranks inside autograd's hooks, so every rank must make the same
    // tensors' gradients — the same tasks present (one small all-reduce
    // says so); where they differ the step keeps its selections.
    bool rankable = true;
    saps_->averageDense = nullptr;
    if (averageOverRanks && saps_->wouldRank(step_)) {
      std::vector<at::Tensor> flags{at::zeros({nt}, at::kFloat)};
      for (int64_t t = 0; t < nt; ++t)
        flags[0][t] = st->present[t] ? 1.0f : 0.0f;
      flags[0] = flags[0].to(m.device());
      averageOverRanks(flags);
      const at::Tensor f = flags[0].cpu();
      for (int64_t t = 0; t < nt; ++t)
        rankable &= f[t].item<float>() == 0.0f || f[t].item<float>() == 1.0f;
      if (rankable)
        saps_->averageDense = [this](const at::Tensor &g) {
          std::vector<at::Tensor> v{g};
          averageOverRanks(v);
        };
    }
    saps_->beginStep(step_, st->scale, rankable);
  }
  // ZeRO 2: the ranks agree whether this step releases its gradients
  // during the backward (collective: every rank, every step).
  if (zero_)
    zero_->beginStep(st->present);
  st->unitBytes.assign(m.numUnits(), 0);
  st->losses.assign(nt, 0.0);
  st->gradNorms.assign(nt, 0.0);
  st->accum.resize(nt);
  if (train_.scope == GradScope::Params) {
    int64_t maxTap = 0;
    for (const HeadConfig &h : m.heads())
      maxTap = std::max(maxTap, h.tap);
    const int64_t L = m.config().layers;
    for (int64_t l = L - train_.paramsTopK + 1; l <= L; ++l)
      for (const at::Tensor &p : m.layerParameters(l))
        st->topk.push_back(p);
    for (int64_t l = 0; l <= std::min(maxTap, L - train_.paramsTopK); ++l)
      for (const at::Tensor &p : m.layerParameters(l))
        if (p.requires_grad()) // not frozen
          st->lower.push_back(p);
  }
  if (keepDebug) {
    lastProcessed.assign(nt, {});
    lastFused.clear();
  }
  state_ = std::move(st);
}

void TrainerCore::beginMicroBatch(int64_t mb) {
  StepState &st = state("beginMicroBatch", false, /*forwardOnly=*/true);
  if (mb != st.begun + 1 || mb >= train_.microBatches)
    throw std::logic_error("mtprt: beginMicroBatch(" + std::to_string(mb) +
                           "): micro-batches run in order 0.." +
                           std::to_string(train_.microBatches - 1));
  if (st.mb >= 0 && !st.backboneDone && backboneTrains_) {
    if (!pipelined())
      throw std::logic_error("mtprt: beginMicroBatch: the previous micro-batch "
                             "has no backbone backward");
    st.parked[st.mb] = std::move(static_cast<MicroState &>(st));
  }
  static_cast<MicroState &>(st) = MicroState();
  st.begun = mb;
  const int64_t nt = model_->numHeads(), micro = train_.microBatches;
  const int64_t begin = st.bsz * mb / micro, end = st.bsz * (mb + 1) / micro;
  st.mb = mb;
  st.b = st.batch.slice(begin, end);
  model_->setInputs(st.b.lengths, st.b.types);
  st.weight = static_cast<double>(end - begin) / static_cast<double>(st.bsz);
  st.values = {st.b.tokens};
  st.taps.assign(model_->config().layers + 1, at::Tensor());
  st.loss.assign(nt, at::Tensor());
  st.taskGrads.assign(nt, {});
  st.headForward.assign(nt, false);
  st.headBackward.assign(nt, false);
  st.gates.assign(nt, at::Tensor());
}

void TrainerCore::resumeMicroBatch(int64_t mb) {
  StepState &st = state("resumeMicroBatch", false);
  if (st.mb == mb)
    return;
  auto it = st.parked.find(mb);
  if (it == st.parked.end())
    throw std::logic_error("mtprt: resumeMicroBatch(" + std::to_string(mb) +
                           "): no such micro-batch in flight");
  if (st.mb >= 0 && !st.backboneDone && backboneTrains_)
    st.parked[st.mb] = std::move(static_cast<MicroState &>(st));
  static_cast<MicroState &>(st) = std::move(it->second);
  st.parked.erase(mb);
  model_->setInputs(st.b.lengths, st.b.types);
}

void TrainerCore::restrictToStage(int64_t first, int64_t last,
                                  const std::vector<bool> &tasks) {
  if (state_)
    throw std::logic_error("mtprt: restrictToStage during a step");
  if (train_.scope == GradScope::Params || saps_ || ewc_ || zero_ ||
      train_.zeroStage || train_.optimizerOffload ||
      model_->config().adapters)
    bad("restrictToStage", "a pipeline stage runs the features or sum scope "
                           "without saps, ewc, adapters or ZeRO "
                           "(docs/pipeline.md)");
  model_->keepStage(first, last, tasks);
  local_ = tasks;
  buildOptimizer();
}

ValueId TrainerCore::inputActivation(const at::Tensor &x) {
  StepState &st = state("inputActivation", true);
  if (!pipelined() || model_->firstUnit() == 0)
    throw std::logic_error("mtprt: inputActivation: only a pipeline stage "
                           "after the first receives an activation");
  st.boundaryIn = x.detach();
  // The unit that made it is outside the frozen run from the embeddings
  // (Model::unit): the sender needs its gradient.
  if (model_->firstUnit() / 2 > model_->config().noGradTop())
    st.boundaryIn.requires_grad_(true);
  st.values.push_back(st.boundaryIn);
  return static_cast<ValueId>(st.values.size()) - 1;
}

void TrainerCore::setBoundaryOutput(ValueId v) {
  StepState &st = state("setBoundaryOutput", true);
  if (v < 0 || v >= static_cast<ValueId>(st.values.size()) ||
      !st.values[v].defined())
    bad("setBoundaryOutput", "unknown or released value " + std::to_string(v));
  st.boundaryOut = v;
}

void TrainerCore::setBoundaryGradient(const at::Tensor &g) {
  StepState &st = state("setBoundaryGradient", true);
  if (st.boundaryOut < 0)
    throw std::logic_error("mtprt: setBoundaryGradient without a boundary "
                           "output (setBoundaryOutput)");
  const at::Tensor &out = st.values[st.boundaryOut];
  if (!g.sizes().equals(out.sizes()))
    bad("setBoundaryGradient", "the gradient's shape differs from the "
                               "activation sent");
  st.boundaryGrad = g.to(out.scalar_type());
}

at::Tensor TrainerCore::inputGradient() {
  StepState &st = state("inputGradient", true);
  if (!st.backboneDone)
    throw std::logic_error("mtprt: inputGradient before backwardBackbone");
  if (!st.boundaryIn.defined() || !st.boundaryIn.requires_grad())
    return {};
  at::Tensor g = st.boundaryIn.grad();
  return g.defined() ? g : at::zeros_like(st.boundaryIn);
}

StepStats &TrainerCore::stepStats() { return state("stepStats", false).stats; }

at::Tensor TrainerCore::value(ValueId v) {
  StepState &st = state("value", true);
  if (v < 0 || v >= static_cast<ValueId>(st.values.size()))
    bad("value", "unknown value " + std::to_string(v));
  return st.values[v];
}

void TrainerCore::setAlpha(std::vector<double> alpha) {
  StepState &st = state("setAlpha", false);
  if (static_cast<int64_t>(alpha.size()) != model_->numHeads())
    bad("setAlpha", "needs one weight per head");
  st.alpha = std::move(alpha);
  st.alphaGiven = true;
}

std::vector<double> TrainerCore::pipelineAlpha(
    const std::vector<GradList> &processed, const std::vector<double> &losses,
    const std::vector<double> &norms, const std::vector<bool> &fusing) {
  StepState &st = state("pipelineAlpha", false);
  // The sum scope weighs its tasks in its own fusion (fuseTaskGradients).
  if (train_.scope != GradScope::Features)
    throw std::logic_error("mtprt: pipelineAlpha: only the features scope "
                           "gathers the gate's inputs across stages");
  return computeAlpha(processed, {}, losses, norms, fusing, st.stats);
}

ValueId TrainerCore::input() {
  return (void)state("input", true, /*forwardOnly=*/true), 0;
}

ValueId TrainerCore::forward(int64_t first, int64_t last, ValueId in,
                             RegionMode mode) {
  StepState &st = state("forward", true, /*forwardOnly=*/true);
  const Model &m = *model_;
  if (first < 0 || last >= m.numUnits() || first > last)
    bad("forward", "unit range [" + std::to_string(first) + ", " +
                       std::to_string(last) + "] is not within [0, " +
                       std::to_string(m.numUnits() - 1) + "]");
  if (in < 0 || in >= static_cast<ValueId>(st.values.size()))
    bad("forward", "unknown value " + std::to_string(in));
  if (!st.values[in].defined())
    bad("forward", "value " + std::to_string(in) + " was released");
  if ((first == 0) != (in == 0))
    bad("forward", "unit 0 (embed) takes the input tokens, and only it does");
  std::vector<bool> isTap(m.numUnits(), false);
  // The forward's last unit (the highest tap: the step runs none above).
  int64_t topUnit = 0;
  for (const HeadConfig &h : m.heads()) {
    isTap[Model::tapUnit(h.tap)] = true;
    topUnit = std::max(topUnit, Model::tapUnit(h.tap));
  }
  topUnit = std::min(topUnit, m.lastUnit());
  PrecisionGuard precision(train_.precision, m.device());
  at::Tensor x = st.values[in];
  ZeroOptimizer *sharded =
      zero_ && zero_->shardsParameters() ? zero_.get() : nullptr;
  // A unit's activation bytes, not ZeRO 3's gathered parameters (a unit's
  // forward gathers the next one ahead and frees its own).
  auto held = [&] {
    return deviceBytes(m.device()) - (sharded ? sharded->gatheredBytes() : 0);
  };
  int64_t before = held();
  auto account = [&](int64_t u) {
    const int64_t now = held();
    if (!st.unitBytes.empty())
      st.unitBytes[u] += now - before;
    before = now;
  };
  // When the backward reaches `out` (the output of the group whose first
  // unit is `first`), bring back `group` when it is offloaded and the
  // offloaded groups right below it, each ending where the one above
  // starts, prefetchAhead in all: one group ahead, as the planners count
  // (one further down would stay on the device through the backward of
  // the units between).
  auto armPrefetch = [&](const at::Tensor &out, const std::string &group,
                         int64_t first) {
    if (st.offloadedRegions.empty() || prefetchAhead_ <= 0 ||
        !out.requires_grad())
      return;
    std::vector<std::string> fetch;
    const bool mine = st.offloadedRegions.back() == group;
    int64_t n = mine ? prefetchAhead_ : prefetchAhead_ - 1;
    int64_t below = first; // the lowest unit fetched so far
    for (size_t k = st.offloadedRegions.size(); k-- > 0 && n > 0; --n) {
      if (!(mine && k + 1 == st.offloadedRegions.size()) &&
          st.offloadedSpans[k].second != below - 1)
        break;
      fetch.push_back(st.offloadedRegions[k]);
      below = st.offloadedSpans[k].first;
    }
    if (fetch.empty())
      return;
    Offloader *off = offloader_.get();
    std::shared_ptr<bool> probing = probing_;
    const_cast<at::Tensor &>(out).register_hook(
        [off, fetch, probing](const at::Tensor &) {
          if (*probing)
            return;
          for (const std::string &g : fetch)
            off->prefetch(g);
        });
  };
  // A lookup's backward needs the indices alone: the embeddings are gathered
  // again only for BERT's LayerNorm (CostModel::backwardReadsParameters).
  auto backwardReadsParameters = [&](int64_t u) {
    return u != 0 || m.config().postNorm();
  };
  if (sharded && (mode == RegionMode::KeepOffload ||
                  mode == RegionMode::CheckpointOffload))
    bad("forward", "ZeRO 3 with offloaded activations (unit " +
                       std::to_string(first) +
                       ") is not supported: plan with zero = 2, or without "
                       "the offload");
  if (mode == RegionMode::KeepOffload) {
    for (int64_t u = first; u <= last; ++u) {
      // Per micro-batch: a pipeline stage holds several in flight.
      const std::string group =
          "unit" + std::to_string(u) + "/" + std::to_string(st.mb);
      {
        // The unit's input is the unit before's output: it stays.
        Offloader::Scope scope(*offloader_, group, {x});
        x = m.unit(u, x);
      }
      offloader_->waitOffloaded(group);
      st.offloadedRegions.push_back(group);
      st.offloadedSpans.push_back({u, u});
      armPrefetch(x, group, u);
      account(u);
      if (isTap[u])
        st.taps[u / 2] = x;
    }
  } else if (mode == RegionMode::Keep || mode == RegionMode::Partial) {
    for (int64_t u = first; u <= last; ++u) {
      // A plan run at another precision or on a device whose attention
      // keeps its own q, k, v (--precision, --device): the unit is kept
      // whole, and said once.
      const bool partial = mode == RegionMode::Partial && m.partialServes(u);
      if (mode == RegionMode::Partial && !partial && !warnedPartial_) {
        warnedPartial_ = true;
        std::fprintf(stderr,
                     "mtprt: the plan's tensor-grain blocks run kept whole "
                     "(unit %lld %s); the measured peak will be above the "
                     "plan's — plan for this precision and device\n",
                     static_cast<long long>(u),
                     m.partialRefusal(u).c_str());
      }
      if (sharded)
        sharded->gatherForward(u, u, u < topUnit ? u + 1 : -1);
      x = partial ? m.unitPartial(u, x) : m.unit(u, x);
      if (sharded)
        sharded->forwardDone(u, u, x, backwardReadsParameters(u));
      armPrefetch(x, std::string(), u);
      account(u);
      if (isTap[u])
        st.taps[u / 2] = x;
    }
  } else {
    for (int64_t u = first; u < last; ++u)
      if (isTap[u])
        bad("forward", "a checkpoint region may not contain a tap (unit " +
                           std::to_string(u) + ") before its end");
    // Only the region's units' parameters: autograd accumulates a
    // parameter's gradient once every node with an edge to it has run, so
    // a layer's MLP region handed its attention's too would hold its new
    // gradients until the attention's region ran (+3% on a pipeline stage).
    std::vector<at::Tensor> params;
    for (int64_t u = first; u <= last; ++u)
      for (const at::Tensor &p : m.unitParameters(u))
        params.push_back(p);
    const Model *mp = &m;
    RegionFn fn = [mp, first, last](const at::Tensor &v) {
      return mp->runUnits(first, last, v);
    };
    const std::string group =
        "region" + std::to_string(first) + "/" + std::to_string(st.mb);
    // The token ids, and a tap (on the device for its head and the backbone
    // backward anyway), are never offloaded.
    if (mode == RegionMode::CheckpointOffload && first > 0 &&
        !isTap[first - 1]) {
      {
        Offloader::Scope scope(*offloader_, group);
        x = checkpoint(fn, x, params);
      }
      offloader_->waitOffloaded(group);
      st.offloadedRegions.push_back(group);
      st.offloadedSpans.push_back({first, last});
    } else {
      // ZeRO 3: the region's units whole for its forward, again before its
      // backward re-runs it.
      if (sharded)
        sharded->gatherForward(first, last, last < topUnit ? last + 1 : -1);
      x = checkpoint(fn, x, params);
      if (sharded)
        sharded->forwardDone(first, last, x);
    }
    // When the backward reaches this region, bring back its boundary and
    // the offloaded groups right below (armPrefetch).
    armPrefetch(x, group, first);
    account(last);
    if (isTap[last])
      st.taps[last / 2] = x;
  }
  st.values.push_back(x);
  return static_cast<ValueId>(st.values.size()) - 1;
}

void TrainerCore::release(ValueId v) {
  StepState &st = state("release", true, /*forwardOnly=*/true);
  if (v < 0 || v >= static_cast<ValueId>(st.values.size()))
    bad("release", "unknown value " + std::to_string(v));
  st.values[v] = at::Tensor();
}

void TrainerCore::forwardHead(int64_t t, bool offload) {
  StepState &st = state("forwardHead", true, /*forwardOnly=*/true);
  Model &m = *model_;
  if (t < 0 || t >= m.numHeads())
    bad("forwardHead", "head " + std::to_string(t) + " out of range");
  if (!st.present[t] || st.headForward[t])
    return; // no labels in this batch, or already run
  const HeadConfig &hc = m.heads()[t];
  const at::Tensor &tap = st.taps[hc.tap];
  if (!tap.defined())
    bad("forwardHead", "head \"" + hc.name + "\" reads tap " +
                           std::to_string(hc.tap) +
                           ", which this micro-batch has not computed");
  PrecisionGuard precision(train_.precision, m.device());
  at::Tensor loss;
  const bool partial = t < int64_t(st.b.partial.size()) && st.b.partial[t];
  const std::string group = "head" + std::to_string(t);
  if (offload) {
    {
      // The tap and the labels stay on the device for other uses anyway.
      Offloader::Scope scope(*offloader_, group, {tap, st.b.labels[t]});
      loss = m.loss(t, m.head(t, tap, st.b.labels[t]), st.b.labels[t],
                    partial);
    }
    offloader_->waitOffloaded(group);
  } else {
    loss = m.loss(t, m.head(t, tap, st.b.labels[t]), st.b.labels[t],
                    partial);
  }
  if (!quiet_ && m.config().adapters && m.config().adapters->separation > 0)
    st.gates[t] = m.gateMean(t, tap);
  st.losses[t] += loss.item<double>() * st.weight;
  // The spec's loss weight scales what the task back-propagates.
  st.loss[t] = loss * (st.weight * st.scale * hc.weight);
  st.headForward[t] = true;
}

void TrainerCore::backwardHead(int64_t t) {
  StepState &st = state("backwardHead", true);
  Model &m = *model_;
  if (t < 0 || t >= m.numHeads())
    bad("backwardHead", "head " + std::to_string(t) + " out of range");
  if (!st.present[t] || st.headBackward[t])
    return;
  if (!st.headForward[t])
    throw std::logic_error("mtprt: backwardHead: head \"" + m.heads()[t].name +
                           "\" has not run forward in this micro-batch");
  st.headBackward[t] = true;
  separateGates();
  if (train_.scope == GradScope::Sum)
    return; // summed into one backward by backwardBackbone
  std::vector<at::Tensor> inputs;
  if (train_.scope == GradScope::Features) {
    // A tap in the frozen run from the embeddings carries no gradient: the
    // head trains alone, and the task takes no part in the fusion.
    if (st.taps[m.heads()[t].tap].requires_grad())
      inputs.push_back(st.taps[m.heads()[t].tap]);
  } else {
    inputs = st.topk;
  }
  const size_t nshared = inputs.size();
  // A shared adapter (npd(share)): this task's part of its gradient too.
  std::vector<at::Tensor> hp = m.headParameters(t);
  for (const at::Tensor &p : m.sharedAdapterParameters(t))
    hp.push_back(p);
  inputs.insert(inputs.end(), hp.begin(), hp.end());
  // Params scope retains the graph: the layers below need Σ α_t loss_t.
  // The head's gradient reaches its tap, whose prefetch hook (armPrefetch)
  // is for the backbone backward: an offloaded block at a tap would
  // otherwise come back here, at the backward's start, ahead of its turn.
  *probing_ = true;
  auto reset = c10::make_scope_exit([this] {
    *probing_ = false;
    if (zero_)
      zero_->setBackwardGathers(true);
  });
  // ZeRO 3: this backward stops at the tap; the units below need nothing.
  if (zero_)
    zero_->setBackwardGathers(false);
  auto grads = torch::autograd::grad({st.loss[t]}, inputs, {},
                                     train_.scope == GradScope::Params, false,
                                     /*allow_unused=*/true);
  for (size_t j = 0; j < hp.size(); ++j)
    accumulateGrad(hp[j], grads[nshared + j]);
  for (size_t j = 0; j < nshared; ++j) {
    at::Tensor g = grads[j];
    if (!g.defined())
      g = at::zeros_like(inputs[j], inputs[j].options().dtype(at::kFloat));
    st.taskGrads[t].push_back(st.scale != 1.0 ? g / st.scale : g);
  }
}

void TrainerCore::separateGates() {
  StepState &st = state("separateGates", true);
  Model &m = *model_;
  std::vector<at::Tensor> gates;
  std::vector<at::Tensor> params;
  for (int64_t t = 0; t < m.numHeads(); ++t) {
    if (st.present[t] && !st.headBackward[t])
      return; // not the micro-batch's last head yet
    if (st.gates[t].defined()) {
      gates.push_back(st.gates[t]);
      for (const at::Tensor &p : m.gateParameters(t))
        params.push_back(p);
    }
  }
  st.gates.assign(m.numHeads(), at::Tensor());
  if (gates.size() < 2)
    return;
  // Its own small graph (the gates' parameters from the tap taken as a
  // constant): its gradient goes to the gates, scaled like a task loss.
  at::Tensor sep = Model::gateSeparation(gates);
  const double w = m.config().adapters->separation;
  auto grads = torch::autograd::grad({sep * (w * st.weight * st.scale)}, params,
                                     {}, false, false, /*allow_unused=*/true);
  for (size_t j = 0; j < params.size(); ++j)
    accumulateGrad(params[j], grads[j]);
  st.separation = std::max(st.separation, 0.0) + sep.item<double>() * st.weight;
}

std::vector<double>
TrainerCore::meanTaskLosses(const std::vector<int64_t> &order) {
  StepState &st = *state_;
  std::vector<double> meanLoss(model_->numHeads(), 0.0);
  for (int64_t t : order) {
    // The gate reads each task's own loss, before its weight.
    const double w = model_->heads()[t].weight;
    meanLoss[t] = w > 0 ? st.loss[t].item<double>() / (st.weight * st.scale * w)
                        : 0.0;
  }
  return meanLoss;
}

TrainerCore::GateInputs TrainerCore::processTaskGradients() {
  StepState &st = state("processTaskGradients", true);
  Model &m = *model_;
  const int64_t nt = m.numHeads();
  if (train_.scope != GradScope::Features)
    throw std::logic_error("mtprt: processTaskGradients: only the features "
                           "scope processes tap gradients ahead of the fusion");
  if (st.processed)
    throw std::logic_error(
        "mtprt: processTaskGradients: already run for this micro-batch");
  std::vector<int64_t> order;
  for (int64_t t = 0; t < nt; ++t) {
    if (st.present[t] && runsHead(t) && !st.headBackward[t])
      throw std::logic_error("mtprt: processTaskGradients: head \"" +
                             m.heads()[t].name +
                             "\" has no backward yet (backwardHead first)");
    if (st.present[t] && runsHead(t))
      order.push_back(t);
  }
  st.meanLoss = meanTaskLosses(order);
  std::vector<GradList> &tg = st.taskGrads;
  // The tasks with a tap gradient: a tap in the frozen run from the
  // embeddings has none (backwardHead), and its task is left out; so is a
  // task whose head runs on another pipeline stage.
  st.fusing = st.present;
  for (int64_t t = 0; t < nt; ++t) {
    if (!runsHead(t) || (st.present[t] && tg[t].empty()))
      st.fusing[t] = false;
    if (!st.fusing[t])
      tg[t] = {at::Tensor()};
  }
  st.norms = processTaskGrads(tg, st.fusing, train_.gfmKeep, train_.clipNorm);
  recordNorms(st.gradNorms, st.norms);
  st.processed = true;
  return {st.meanLoss, st.norms, st.fusing, tg};
}

void TrainerCore::fuseTaskGradients() {
  StepState &st = state("fuseTaskGradients", true);
  Model &m = *model_;
  const int64_t nt = m.numHeads();
  for (int64_t t = 0; t < nt; ++t)
    if (st.present[t] && runsHead(t) && !st.headBackward[t])
      throw std::logic_error("mtprt: fuseTaskGradients: head \"" +
                             m.heads()[t].name +
                             "\" has no backward yet (backwardHead first)");
  if (st.fused)
    throw std::logic_error(
        "mtprt: fuseTaskGradients: already run for this micro-batch");
  st.fused = true;
  std::vector<int64_t> order; // the present tasks whose heads run here
  for (int64_t t = 0; t < nt; ++t)
    if (st.present[t] && runsHead(t))
      order.push_back(t);

  if (train_.scope == GradScope::Sum) {
    at::Tensor total;
    for (int64_t t : order)
      total = total.defined() ? total + st.loss[t] : st.loss[t];
    st.rootOuts.clear();
    if (total.defined())
      st.rootOuts.push_back(total);
    st.alpha.assign(nt, 0.0);
    for (int64_t t = 0; t < nt; ++t)
      if (st.present[t])
        st.alpha[t] = 1.0 / static_cast<double>(st.npresent);
    st.loss.assign(nt, at::Tensor());
    return;
  }

  if (train_.scope == GradScope::Features) {
    std::vector<GradList> &tg = st.taskGrads;
    if (!st.processed)
      processTaskGradients();
    const std::vector<bool> &fusing = st.fusing;
    const std::vector<double> &norms = st.norms;
    const std::vector<double> &meanLoss = st.meanLoss;
    std::vector<int64_t> withGrad;
    for (int64_t t = 0; t < nt; ++t)
      if (fusing[t])
        withGrad.push_back(t);
    if (st.mb == 0 && pipelined()) {
      if (!st.alphaGiven)
        throw std::logic_error("mtprt: fuseTaskGradients: a pipeline stage "
                               "needs the step's α (setAlpha) before "
                               "micro-batch 0's fusion");
    } else if (st.mb == 0) {
      // The cosine matrix and the gate's signals live on the parameters of
      // the topmost layer every fused task back-propagates through; where
      // that layer is frozen, on the tap gradients themselves.
      std::vector<GradList> probe;
      if (train_.cosineEvery > 0 && step_ % train_.cosineEvery == 0 &&
          withGrad.size() > 1) {
        int64_t common = m.config().layers;
        for (int64_t t : withGrad)
          common = std::min(common, m.heads()[t].tap);
        std::vector<at::Tensor> probeParams;
        if (!m.config().frozen(common))
          probeParams = m.layerParameters(common);
        if (!probeParams.empty()) {
          probe.assign(nt, GradList(probeParams.size()));
          *probing_ = true;
          // ZeRO 3: the probe's path a unit at a time (no prefetch below:
          // it stops at the tap).
          auto reset = c10::make_scope_exit([this] {
            *probing_ = false;
            if (zero_)
              zero_->setPrefetch(true);
          });
          if (zero_)
            zero_->setPrefetch(false);
          for (int64_t t : withGrad) {
            probe[t] = torch::autograd::grad(
                {st.taps[m.heads()[t].tap]}, probeParams, {tg[t][0]},
                /*retain_graph=*/true, false, /*allow_unused=*/true);
            // ZeRO 3: the units on the task's path, gathered for it, go
            // until the backbone backward.
            if (zero_)
              zero_->dropGathered();
          }
        }
      }
      st.alpha = computeAlpha(tg, probe, meanLoss, norms, fusing, st.stats);
    }
    // One backbone backward with Σ α_t ĝ_t at each tap as grad_outputs.
    std::vector<at::Tensor> outs, gradOuts;
    for (int64_t layer = 0; layer <= m.config().layers; ++layer) {
      std::vector<GradList> atTap;
      std::vector<double> a;
      for (int64_t t : withGrad)
        if (m.heads()[t].tap == layer) {
          atTap.push_back(tg[t]);
          a.push_back(st.alpha[t]);
        }
      if (atTap.empty())
        continue;
      GradList fused = fuse(atTap, a);
      if (!fused[0].defined())
        continue;
      outs.push_back(st.taps[layer]);
      gradOuts.push_back((st.scale != 1.0 ? fused[0] * st.scale : fused[0])
                             .to(st.taps[layer].scalar_type()));
      if (keepDebug)
        lastFused.push_back(fused[0]);
    }
    if (keepDebug)
      lastProcessed = tg;
    tg.assign(nt, {}); // only the fused grad_outputs live through the backward
    st.loss.assign(nt, at::Tensor());
    st.rootOuts = std::move(outs);
    st.rootGrads = std::move(gradOuts);
    return;
  }

  // Params scope: accumulate per-task top-k gradients; the layers below get
  // Σ α_t loss_t with α from the first micro-batch.
  const std::vector<double> meanLoss = meanTaskLosses(order);
  if (st.mb == 0) {
    std::vector<GradList> probe = st.taskGrads;
    for (int64_t t = 0; t < nt; ++t)
      if (!st.present[t])
        probe[t].assign(st.topk.size(), at::Tensor());
    const std::vector<double> norms =
        processTaskGrads(probe, st.present, train_.gfmKeep, train_.clipNorm);
    st.alpha = computeAlpha(probe, {}, meanLoss, norms, st.present, st.stats);
  }
  for (int64_t t : order) {
    if (st.accum[t].empty())
      st.accum[t] = st.taskGrads[t];
    else
      for (size_t j = 0; j < st.topk.size(); ++j)
        st.accum[t][j] = st.accum[t][j] + st.taskGrads[t][j];
  }
  st.taskGrads.assign(nt, {});
  at::Tensor weighted;
  for (int64_t t : order)
    weighted = weighted.defined() ? weighted + st.alpha[t] * st.loss[t]
                                  : st.alpha[t] * st.loss[t];
  st.loss.assign(nt, at::Tensor());
  if (!st.lower.empty())
    st.rootOuts = {weighted};
}

void TrainerCore::backwardBackbone() {
  StepState &st = state("backwardBackbone", true);
  if (st.backboneDone)
    throw std::logic_error(
        "mtprt: backwardBackbone: already run for this micro-batch");
  if (!st.fused)
    fuseTaskGradients();
  st.backboneDone = true;
  // Moved out so the roots and their gradients die with the backward.
  std::vector<at::Tensor> outs = std::move(st.rootOuts);
  std::vector<at::Tensor> grads = std::move(st.rootGrads);
  // A pipeline stage's output: the next stage's gradient for it is a root.
  if (st.boundaryOut >= 0 && st.values[st.boundaryOut].requires_grad()) {
    if (!st.boundaryGrad.defined())
      throw std::logic_error("mtprt: backwardBackbone: the stage's output has "
                             "no gradient yet (setBoundaryGradient)");
    for (size_t i = grads.size(); i < outs.size(); ++i)
      grads.push_back(at::ones_like(outs[i])); // a loss root
    outs.push_back(st.values[st.boundaryOut]);
    grads.push_back(std::move(st.boundaryGrad));
  }
  if (pipelined())
    st.values.clear(); // only the roots hold the graph now
  if (!outs.empty()) {
    if (train_.scope == GradScope::Params)
      torch::autograd::backward(outs, {}, /*retain_graph=*/false, false,
                                st.lower);
    else
      torch::autograd::backward(outs, grads);
  }
  // ZeRO 2: the micro-batch's last released gradients, before the next
  // micro-batch accumulates into them; 16-bit weights' gradients summed in
  // fp32 on the host when the step accumulates.
  if (zero_) {
    zero_->endBackward();
    if (train_.microBatches > 1)
      zero_->foldHalfGradients();
  }
}

void TrainerCore::finalizeGradients() {
  StepState &st = state(
      "the step's end (exchangeGradients, optimizerStep, endStep)", false);
  if (st.mb != train_.microBatches - 1 || !st.parked.empty() ||
      (!st.backboneDone && backboneTrains_))
    throw std::logic_error("mtprt: the step's end: every micro-batch needs its "
                           "forward and backward first");
  if (st.finalized)
    return;
  st.finalized = true;
  // A pipeline stage's last micro-batch is spent: its received activation,
  // that one's gradient (sent down) and its taps go before the exchange and
  // the update, not at the step's end (the plan counts none of them there).
  if (pipelined()) {
    st.values.clear();
    st.taps.clear();
    st.taskGrads.clear();
    st.boundaryIn = at::Tensor();
    st.boundaryGrad = at::Tensor();
  }
  Model &m = *model_;
  const int64_t nt = m.numHeads();
  if (train_.scope == GradScope::Params) {
    for (int64_t t = 0; t < nt; ++t)
      if (!st.present[t])
        st.accum[t].assign(st.topk.size(), at::Tensor());
    recordNorms(st.gradNorms,
                processTaskGrads(st.accum, st.present, train_.gfmKeep,
                                 train_.clipNorm));
    GradList fused = fuse(st.accum, st.alpha);
    for (size_t j = 0; j < st.topk.size();
         ++j) // rescaled: unscaled below with the rest
      accumulateGrad(st.topk[j], st.scale != 1.0 && fused[j].defined()
                                     ? fused[j] * st.scale
                                     : fused[j]);
    if (keepDebug) {
      lastProcessed = st.accum;
      lastFused = fused;
      lastParamsScopeParams = st.topk;
    }
    st.accum.assign(nt, {});
  }
  // The scale the 16-bit weights' gradients carry to the update (1 but at
  // fp16; set every step, so none is left from a step that did not update).
  if (zero_ && zero_->halfValues())
    zero_->setHalfGradientScale(st.scale);
  // Unscale what autograd accumulated with the fp16 loss scale (and ZeRO
  // 2's run of what the backward released, summed at that scale).
  if (st.scale != 1.0) {
    // A 16-bit weight's (the offload's, one process) stays at the scale:
    // the host's update divides it out in fp32, where it cannot underflow.
    for (const at::Tensor &p : m.parameters())
      if (p.grad().defined() && p.scalar_type() == at::kFloat)
        p.mutable_grad().div_(st.scale);
    if (zero_)
      zero_->unscaleReleased(st.scale);
    if (saps_)
      saps_->unscale(st.scale);
  }
  if (keepDebug)
    lastAlpha = st.alpha;

  StepStats &stats = st.stats;
  std::vector<int64_t> tapUnits;
  for (int64_t t = 0; t < nt; ++t)
    if (st.present[t])
      tapUnits.push_back(Model::tapUnit(m.heads()[t].tap));
  stats.activationReuseRatio = reuseRatio(st.unitBytes, tapUnits);
  for (int64_t t = 0; t < nt; ++t) {
    stats.loss.push_back(st.present[t]
                             ? st.losses[t]
                             : std::numeric_limits<double>::quiet_NaN());
    stats.alpha.push_back(st.alpha.empty() ? 0.0 : st.alpha[t]);
    stats.present.push_back(st.present[t]);
    stats.gradNorm.push_back(st.gradNorms[t]);
  }
  stats.gateSeparation = st.separation;
}

void TrainerCore::exchangeGradients() {
  finalizeGradients();
  StepState &st = *state_;
  if (st.exchanged)
    throw std::logic_error(
        "mtprt: exchangeGradients: already run for this step");
  st.exchanged = true;
  if (beforeUpdate)
    beforeUpdate(st.stats);
}

void TrainerCore::optimizerStep() {
  StepState &st = state("optimizerStep", false);
  if (st.updated)
    throw std::logic_error("mtprt: optimizerStep: already run for this step");
  if (!st.exchanged)
    exchangeGradients();
  st.updated = true;
  // EWC's penalty (D14) on the final gradients, before the update.
  if (ewc_)
    st.stats.ewcPenalty = ewc_->addPenaltyGradient();
  if (saps_ && saps_->config().rerankAt(step_))
    st.stats.sapsTurnover = saps_->lastTurnover();
  Model &m = *model_;
  // TaskLRAdapter: each group's own schedule.
  auto &groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const LrConfig &c = g == 0 || train_.headLr.empty() ? train_.backboneLr
                                                        : train_.headLr[g - 1];
    static_cast<torch::optim::AdamWOptions &>(groups[g].options())
        .lr(scheduledLr(c, step_));
  }
  bool finite = true;
  if (train_.precision == Precision::Fp16) {
    if (zero_) {
      finite = zero_->finite();
    } else {
      for (const at::Tensor &p : m.parameters())
        if (p.grad().defined() && !at::isfinite(p.grad()).all().item<bool>()) {
          finite = false;
          break;
        }
      if (saps_ && !saps_->finite())
        finite = false;
    }
    if (!finite) {
      lossScale_ /= 2.0;
      goodSteps_ = 0;
    } else if (++goodSteps_ % 2000 == 0) {
      lossScale_ *= 2.0;
    }
  }
  st.stats.skipped = !finite;
  if (!finite && zero_)
    zero_->discardGradients();
  if (finite && zero_) {
    std::vector<double> lrs;
    for (auto &group : groups)
      lrs.push_back(
          static_cast<torch::optim::AdamWOptions &>(group.options()).lr());
    st.stats.bytesSentParameters = zero_->step(lrs);
  } else if (finite) {
    adamwStep(*optimizer_);
    if (saps_)
      saps_->step({scheduledLr(train_.backboneLr, step_), train_.beta1,
                   train_.beta2, train_.eps, train_.weightDecay});
  }
  ++step_;
}

StepStats TrainerCore::endStep(bool applyUpdate) {
  StepState &st = state("endStep", false);
  if (applyUpdate && !st.updated)
    optimizerStep();
  else if (!applyUpdate && st.updated)
    throw std::logic_error(
        "mtprt: endStep(applyUpdate = false) after optimizerStep");
  finalizeGradients();
  // Applied: the gradients are spent; free them until the next backward
  // makes new ones (PyTorch's zero_grad(set_to_none=True)), so nothing of
  // their size stays resident between steps.
  if (applyUpdate)
    for (const at::Tensor &p : model_->parameters())
      p.mutable_grad() = at::Tensor();
  Model &m = *model_;
  StepStats stats = std::move(st.stats);

  offloader_->synchronize();
  const OffloadStats os = offloader_->stats();
  stats.offloadHits = os.hits;
  stats.offloadMisses = os.misses;
  stats.offloadWaitS = os.waitS;
  stats.checkpointHitRate = os.hitRate();
  stats.hostPoolBytes = os.hostPeakBytes;
  const MemoryStats ms =
      m.device().is_cuda()
          ? cudaMemoryStats(m.device().index() < 0 ? 0 : m.device().index())
          : cpuMemoryStats();
  stats.measuredPeakBytes = ms.peakBytes;
  stats.measuredCurrentBytes = ms.currentBytes;
  stats.lossScale = st.scale;
  stats.stepTimeS =
      std::chrono::duration<double>(Clock::now() - st.start).count();
  stats.samplesPerS =
      stats.stepTimeS > 0 ? static_cast<double>(st.bsz) / stats.stepTimeS : 0.0;
  state_.reset();
  return stats;
}

void TrainerCore::abortStep() { state_.reset(); }

void TrainerCore::addFisherSample(const Batch &batch, const Schedule &s) {
  if (!ewc_)
    throw std::logic_error("mtprt: addFisherSample: the trainer has no ewc");
  // The step's gradients without its side effects: the gate neither learns
  // nor measures (the training's steps alone do), and the model runs in eval
  // mode — no dropout, so the Fisher is the model's, and the random stream
  // the training's dropout draws from is left as it was.
  quiet_ = true;
  const bool training = model_->training();
  model_->setTraining(false);
  try {
    computeGradients(batch, s);
  } catch (...) {
    quiet_ = false;
    model_->setTraining(training);
    throw;
  }
  quiet_ = false;
  model_->setTraining(training);
  // Every rank's rows: the gradient one process gets from the whole batch.
  if (averageOverRanks) {
    std::vector<at::Tensor> grads;
    for (const at::Tensor &p : ewc_->params()) {
      if (!p.grad().defined())
        p.mutable_grad() = at::zeros_like(p);
      grads.push_back(p.grad());
    }
    averageOverRanks(grads);
  }
  ewc_->addFisherSample();
  for (const at::Tensor &p : model_->parameters())
    p.mutable_grad() = at::Tensor();
}

std::vector<std::vector<double>>
TrainerCore::taskSimilarity(const Batch &batch, const Schedule &s,
                            const std::vector<int64_t> &tasks, int64_t *layer,
                            const std::vector<at::Tensor> *params) {
  Model &m = *model_;
  const int64_t n = static_cast<int64_t>(tasks.size());
  int64_t common = m.config().layers;
  for (int64_t t : tasks) {
    if (t < 0 || t >= m.numHeads())
      bad("taskSimilarity", "head " + std::to_string(t) + " out of range");
    common = std::min(common, m.heads()[t].tap);
  }
  common = std::max<int64_t>(common, 1);
  if (layer)
    *layer = common;
  if (n < 2 || (!params && m.config().frozen(common)))
    return {};
  const std::vector<at::Tensor> probe =
      params ? *params : m.layerParameters(common);
  if (probe.empty())
    return {};
  // Like the Fisher's pass: eval mode (no dropout), quiet, nothing kept.
  const bool training = m.training();
  m.setTraining(false);
  quiet_ = true;
  struct Restore {
    TrainerCore &core;
    Model &m;
    bool training;
    ~Restore() {
      core.quiet_ = false;
      *core.probing_ = false;
      m.setTraining(training);
      core.state_.reset();
      for (const at::Tensor &p : m.parameters())
        p.mutable_grad() = at::Tensor();
    }
  } restore{*this, m, training};
  beginStep(batch);
  beginMicroBatch(0);
  StepState &st = *state_;
  runBackbone(s);
  *probing_ = true; // the backbone's prefetch hooks are for its backward
  PrecisionGuard precision(train_.precision, m.device());
  std::vector<at::Tensor> flat(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = tasks[i];
    if (!st.b.labels[t].defined())
      continue;
    const bool partial = t < int64_t(st.b.partial.size()) && st.b.partial[t];
    const at::Tensor &tap = st.taps[m.heads()[t].tap];
    at::Tensor loss = m.loss(t, m.head(t, tap, st.b.labels[t]), st.b.labels[t],
                             partial);
    std::vector<at::Tensor> g =
        torch::autograd::grad({loss}, probe, {}, /*retain_graph=*/true, false,
                              /*allow_unused=*/true);
    std::vector<at::Tensor> parts;
    for (size_t j = 0; j < g.size(); ++j)
      parts.push_back(g[j].defined() ? g[j].reshape(-1).to(at::kDouble)
                                     : at::zeros({probe[j].numel()},
                                                 probe[j].options().dtype(
                                                     at::kDouble)));
    flat[i] = at::cat(parts);
  }
  // Every rank's rows (the cosines do not depend on the scale: a sum over
  // the ranks that have a task's labels is its whole-batch gradient's
  // direction).
  if (averageOverRanks) {
    int64_t numel = 0;
    for (const at::Tensor &p : probe)
      numel += p.numel();
    const auto f64 = probe.front().options().dtype(at::kDouble);
    at::Tensor present = at::zeros({n}, f64);
    std::vector<at::Tensor> ts;
    for (int64_t i = 0; i < n; ++i) {
      if (flat[i].defined())
        present[i] = 1.0;
      else
        flat[i] = at::zeros({numel}, f64);
      ts.push_back(flat[i]);
    }
    ts.push_back(present);
    averageOverRanks(ts);
    const at::Tensor have = ts.back().cpu();
    for (int64_t i = 0; i < n; ++i)
      if (!(have[i].item<double>() > 0))
        flat[i] = at::Tensor();
  }
  std::vector<std::vector<double>> cos(
      n, std::vector<double>(n, std::numeric_limits<double>::quiet_NaN()));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      if (flat[i].defined() && flat[j].defined()) {
        const double d = (flat[i].norm() * flat[j].norm()).item<double>();
        // A zero gradient has no direction: 0 for the layer's measurement
        // (as before), unmeasured for a regroup's (no split on no evidence).
        cos[i][j] = d > 0    ? (flat[i] * flat[j]).sum().item<double>() / d
                    : params ? std::numeric_limits<double>::quiet_NaN()
                             : 0.0;
      }
  return cos;
}

std::vector<std::vector<double>>
TrainerCore::regroupAdapters(const Batch &batch, const Schedule &s) {
  const std::optional<AdapterConfig> &ad = model_->config().adapters;
  if (!ad || !ad->regroup || !ad->share)
    bad("regroupAdapters", "the plan's adapters are not npd(share, regroup)");
  const int64_t n = model_->numHeads();
  std::vector<std::vector<double>> cos(
      size_t(n), std::vector<double>(size_t(n),
                                     std::numeric_limits<double>::quiet_NaN()));
  // Every rank measures every group alike (taskSimilarity averages the
  // gradients over the ranks), so every rank splits alike.
  for (int64_t o = 0; o < n; ++o) {
    if (ad->ownerOf(o) != o)
      continue;
    std::vector<int64_t> members;
    for (int64_t h = 0; h < n; ++h)
      if (ad->ownerOf(h) == o)
        members.push_back(h);
    if (members.size() < 2)
      continue;
    const std::vector<at::Tensor> shared = model_->adapterParameters(o);
    const std::vector<std::vector<double>> c =
        taskSimilarity(batch, s, members, nullptr, &shared);
    for (size_t i = 0; i < c.size(); ++i)
      for (size_t j = 0; j < c[i].size(); ++j)
        cos[size_t(members[i])][size_t(members[j])] = c[i][j];
  }
  const std::vector<int64_t> owner =
      AdapterConfig::regroupedOwners(ad->owner, cos, *ad->share);
  if (owner != ad->owner)
    splitAdapters(owner);
  return cos;
}

void TrainerCore::splitAdapters(const std::vector<int64_t> &owner) {
  if (state_)
    throw std::logic_error("mtprt: splitAdapters during a step");
  // ZeRO's and the host optimizer's layouts are fixed at the start (mtpc
  // check refuses regroup with them).
  if (zero_ || train_.zeroStage || train_.optimizerOffload)
    bad("splitAdapters", "adapters cannot split under ZeRO or the optimizer "
                         "offload");
  const std::vector<std::pair<at::Tensor, at::Tensor>> made =
      model_->splitAdapters(owner);
  auto &groups = optimizer_->param_groups();
  for (int64_t h = 0; h < model_->numHeads(); ++h)
    groups.at(size_t(1 + h)).params() = model_->headParameters(h);
  auto &state = optimizer_->state();
  for (const auto &[copy, from] : made) {
    auto it = state.find(from.unsafeGetTensorImpl());
    if (it == state.end())
      continue; // no state yet: AdamW makes it at the first update
    const auto &was =
        static_cast<const torch::optim::AdamWParamState &>(*it->second);
    auto now = std::make_unique<torch::optim::AdamWParamState>();
    now->step(was.step());
    now->exp_avg(was.exp_avg().clone());
    now->exp_avg_sq(was.exp_avg_sq().clone());
    if (was.max_exp_avg_sq().defined())
      now->max_exp_avg_sq(was.max_exp_avg_sq().clone());
    state[copy.unsafeGetTensorImpl()] = std::move(now);
  }
}

void TrainerCore::consolidate() {
  if (!ewc_)
    throw std::logic_error("mtprt: consolidate: the trainer has no ewc");
  if (zero_) // θ* is what every rank holds after the update
    zero_->settleParameters();
  ewc_->consolidate();
}

//===----------------------------------------------------------------------===//
// The whole step as a Schedule says
//===----------------------------------------------------------------------===//

std::vector<at::Tensor> TrainerCore::forwardBackbone(const at::Tensor &tokens,
                                                     const Schedule &s) {
  // A standalone forward (tests, probes): a throwaway micro-batch state, so
  // no gradient or statistic of a step is touched.
  if (state_)
    throw std::logic_error("mtprt: forwardBackbone: a step is in progress");
  auto st = std::make_unique<StepState>();
  st->mb = 0;
  st->b.tokens = tokens.to(model_->device());
  st->values = {st->b.tokens};
  st->taps.assign(model_->config().layers + 1, at::Tensor());
  model_->setInputs({}, {});
  state_ = std::move(st);
  try {
    runBackbone(s);
  } catch (...) {
    state_.reset();
    throw;
  }
  std::vector<at::Tensor> taps = state_->taps;
  state_.reset();
  return taps;
}

void TrainerCore::runBackbone(const Schedule &s,
                              const std::function<void(int64_t)> &afterChunk) {
  std::vector<int64_t> regionEnd(model_->numUnits(), -1);
  for (const auto &r : s.regions)
    regionEnd[r.first] = r.second;
  prefetchAhead_ = s.prefetchAhead;
  ValueId x = input();
  std::vector<bool> offloadUnit(model_->numUnits(), false);
  for (int64_t u : s.offloadUnits)
    offloadUnit[u] = true;
  std::vector<bool> partialUnit(model_->numUnits(), false);
  for (int64_t u : s.partialUnits)
    partialUnit[u] = true;
  // Up to the highest layer a head reads: above it nothing would read the
  // output or flow back (mtpc's step IR stops there too).
  int64_t top = 0;
  for (const HeadConfig &h : model_->heads())
    top = std::max(top, h.tap);
  const int64_t end = std::min(Model::tapUnit(top), model_->numUnits() - 1);
  for (int64_t u = 0; u <= end;) {
    const int64_t last = regionEnd[u] < 0 ? u : regionEnd[u];
    const ValueId next =
        forward(u, last, x,
                regionEnd[u] >= 0 ? (s.offloadRegionBoundaries
                                         ? RegionMode::CheckpointOffload
                                         : RegionMode::Checkpoint)
                : offloadUnit[u] ? RegionMode::KeepOffload
                : partialUnit[u] ? RegionMode::Partial
                                 : RegionMode::Keep);
    release(x); // the chain's last use: only what autograd saved keeps it
    x = next;
    u = last + 1;
    if (afterChunk)
      afterChunk(last);
  }
}

StepStats TrainerCore::run(const Batch &batch, const Schedule &s,
                           bool applyUpdate) {
  validate(s);
  beginStep(batch);
  try {
    const int64_t nt = model_->numHeads();
    std::vector<int64_t> order;
    for (int64_t i = 0; i < nt; ++i) {
      const int64_t t = s.headOrder.empty() ? nt - 1 - i : s.headOrder[i];
      if (state_->present[t])
        order.push_back(t);
    }
    for (int64_t mb = 0; mb < train_.microBatches; ++mb) {
      beginMicroBatch(mb);
      std::vector<bool> offloaded(nt, s.offloadHeads);
      for (int64_t t : s.offloadHeadList)
        offloaded[t] = true;
      // Each head as soon as its tap is made, as the step IR orders it
      // (mtpc's timeline counts what the head keeps from there on).
      std::vector<bool> headRun(nt, false);
      runBackbone(s, [&](int64_t last) {
        for (int64_t t = 0; t < nt; ++t)
          if (!headRun[t] && Model::tapUnit(model_->heads()[t].tap) <= last) {
            forwardHead(t, offloaded[t]);
            headRun[t] = true;
          }
      });
      for (int64_t t = 0; t < nt; ++t)
        if (!headRun[t])
          forwardHead(t, offloaded[t]);
      // Before head i's backward, heads up to i + prefetchAhead - 1.
      size_t prefetched = 0;
      for (size_t i = 0; i < order.size(); ++i) {
        if (s.prefetchAhead > 0)
          for (; prefetched < order.size() && prefetched < i + s.prefetchAhead;
               ++prefetched)
            if (offloaded[order[prefetched]])
              offloader_->prefetch("head" + std::to_string(order[prefetched]));
        backwardHead(order[i]);
      }
      backwardBackbone();
    }
  } catch (...) {
    state_.reset();
    throw;
  }
  return endStep(applyUpdate);
}

StepStats TrainerCore::computeGradients(const Batch &batch,
                                        const Schedule &schedule) {
  return run(batch, schedule, /*applyUpdate=*/false);
}

StepStats TrainerCore::step(const Batch &batch, const Schedule &schedule) {
  return run(batch, schedule, /*applyUpdate=*/true);
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
    bad("labels",
        "needs one entry per head (" + std::to_string(m.numHeads()) + ")");
  const int64_t s = m.config().seq;
  Batch b;
  b.tokens =
      at::from_blob(const_cast<int64_t *>(tokens), {batchSize, s}, at::kLong)
          .clone();
  if ((b.tokens < 0).any().item<bool>() ||
      (b.tokens >= m.config().vocab).any().item<bool>())
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
      b.labels.push_back(
          c.loss == LossKind::Mse
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
      b.labels.push_back(
          at::from_blob(p, {batchSize, c.targetSeq}, at::kLong).clone());
      break;
    }
  }
  // Label ranges, checked here so a bad file names the head, not an ATen op.
  for (int64_t h = 0; h < m.numHeads(); ++h) {
    const at::Tensor &l = b.labels[h];
    const HeadConfig &c = m.heads()[h];
    if (!l.defined() ||
        (c.kind == HeadKind::Classify && c.loss == LossKind::Mse))
      continue;
    const int64_t bound = c.kind == HeadKind::Span      ? s
                          : c.kind == HeadKind::Decoder ? c.targetVocab
                                                        : c.classes;
    if ((l < 0).any().item<bool>() || (l >= bound).any().item<bool>())
      bad("labels[" + std::to_string(h) + "]",
          "every label of head \"" + c.name + "\" must be in [0, " +
              std::to_string(bound) + ")");
  }
  batch_->batch = std::move(b);
}

void Trainer::setBatch(const Batch &batch) {
  batch_->batch = batch.to(core_->model().device());
}

StepStats Trainer::step(const Schedule &schedule) {
  if (!batch_->batch.tokens.defined())
    throw std::runtime_error(
        "mtprt: Trainer::step: no batch (call setBatch or useSyntheticBatch)");
  try {
    return core_->step(batch_->batch, schedule);
  } catch (const c10::Error &e) {
    // LibTorch's own failures (e.g. out of memory) leave the runtime with a
    // clear message and no backtrace dump.
    throw std::runtime_error(
        std::string("mtprt: training step failed in LibTorch: ") +
        e.what_without_backtrace());
  }
}

void Trainer::beginStep() {
  if (!batch_->batch.tokens.defined())
    throw std::runtime_error("mtprt: Trainer::beginStep: no batch (call "
                             "setBatch or useSyntheticBatch)");
  core_->beginStep(batch_->batch);
}
int64_t Trainer::microBatches() const { return core_->config().microBatches; }

void TrainerCore::setMicroBatches(int64_t n) {
  if (n <= 0)
    bad("TrainConfig.microBatches", "must be positive");
  if (state_)
    throw std::logic_error("mtprt: setMicroBatches inside a step");
  train_.microBatches = n;
}
void Trainer::beginMicroBatch(int64_t mb) { core_->beginMicroBatch(mb); }
ValueId Trainer::input() { return core_->input(); }
ValueId Trainer::forward(int64_t first, int64_t last, ValueId in,
                         RegionMode mode) {
  return core_->forward(first, last, in, mode);
}
void Trainer::release(ValueId value) { core_->release(value); }
void Trainer::forwardHead(int64_t head, bool offload) {
  core_->forwardHead(head, offload);
}
void Trainer::backwardHead(int64_t head) { core_->backwardHead(head); }
void Trainer::fuseTaskGradients() { core_->fuseTaskGradients(); }
void Trainer::backwardBackbone() { core_->backwardBackbone(); }
void Trainer::exchangeGradients() { core_->exchangeGradients(); }
void Trainer::optimizerStep() { core_->optimizerStep(); }
StepStats Trainer::endStep(bool applyUpdate) {
  return core_->endStep(applyUpdate);
}
void Trainer::prefetch(const std::string &group) {
  core_->offloader().prefetch(group);
}
void Trainer::waitOffloaded(const std::string &group) {
  core_->offloader().waitOffloaded(group);
}
void Trainer::setPrefetchAhead(int64_t n) {
  if (n < 0)
    bad("prefetchAhead", "must be >= 0");
  core_->setPrefetchAhead(n);
}

int64_t Trainer::numParameters() const {
  return core_->model().numParameters();
}
int64_t Trainer::numUnits() const { return core_->model().numUnits(); }
std::string Trainer::unitName(int64_t unit) const {
  return core_->model().unitName(unit);
}
std::vector<std::string> Trainer::taskNames() const {
  std::vector<std::string> names;
  for (const HeadConfig &h : core_->model().heads())
    names.push_back(h.name);
  return names;
}

} // namespace mtprt
