//===- Plan.cpp - the compiler's plan, read by the runtime ----------------===//
//
// Torch-free: the runtime's loader, `mtpc inspect` (through checkPlan; the
// compiler builds this file with exceptions on) and the fuzz target read
// plans here, one set of checks for all three. Nothing the plan says is used
// before it is checked: the frame (version, length, CRC-32:
// mtprt/PlanFrame.h), the flatbuffers verifier, the version, then every
// field the runtime uses against mtprt/Limits.h and the schedule rule.
//
//===----------------------------------------------------------------------===//

#include "mtprt/Plan.h"
#include "mtprt/Driver.h"
#include "mtprt/Errors.h"
#include "mtprt/Limits.h"
#include "mtprt/PlanFrame.h"

#include "schema/plan_generated.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <stdexcept>
#include <sys/stat.h>

namespace mtprt {
namespace {

static_assert(unsigned(mtp::fb::PlanVersion::Current) == kPlanVersion,
              "plan.fbs's PlanVersion and mtprt/PlanFrame.h's kPlanVersion "
              "are one number");

const char *const kAgain =
    "; write it again with `mtpc plan SPEC --format=fb -o PLAN` (a plan "
    "that mtpc wrote never has this: it was damaged after its checksum was "
    "computed, or forged)";

std::string shortest(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

/// Checks fields as it reads them; every failure names the field.
class Checker {
public:
  explicit Checker(const std::string &name) : name_(name) {}

  [[noreturn]] void fail(const std::string &why) const {
    throw PlanError(name_, why);
  }
  [[noreturn]] void field(const std::string &f, const std::string &why) const {
    fail("field " + f + ": " + why + kAgain);
  }

  int64_t range(const std::string &f, int64_t v, limits::Range r) const {
    if (!r.contains(v))
      field(f, std::to_string(v) + " is out of [" + std::to_string(r.lo) +
                   ", " + std::to_string(r.hi) + "]");
    return v;
  }
  double real(const std::string &f, double v, limits::RealRange r) const {
    if (!r.contains(v))
      field(f, shortest(v) + " is out of " + (r.openLo ? "(" : "[") +
                   shortest(r.lo) + ", " + shortest(r.hi) +
                   (r.openHi ? ")" : "]"));
    return v;
  }
  /// A string of at most `max` bytes; `required`: not empty either.
  std::string text(const std::string &f, const flatbuffers::String *s,
                   bool required, int64_t max = limits::kMaxNameBytes) const {
    const std::string v = s ? s->str() : std::string();
    if (required && v.empty())
      field(f, "missing or empty");
    if (static_cast<int64_t>(v.size()) > max)
      field(f, std::to_string(v.size()) + " bytes, more than " +
                   std::to_string(max));
    return v;
  }
  /// A schema enum in its range (the flatbuffers verifier does not check
  /// enums); `names` is flatc's null-terminated name table.
  template <typename E>
  E oneOf(const std::string &f, E v, const char *const *names) const {
    if (int(v) < int(E::MIN) || int(v) > int(E::MAX)) {
      std::string all;
      for (const char *const *n = names; *n; ++n)
        all += std::string(all.empty() ? "" : ", ") + *n;
      field(f, std::to_string(int(v)) + " is none of " + all +
                   " (a plan from another mtpc?)");
    }
    return v;
  }

private:
  const std::string &name_;
};

// The schema's enums and the runtime's, value for value.
static_assert(int(HeadKind::Classify) == int(mtp::fb::HeadKind::classify) &&
              int(HeadKind::Tag) == int(mtp::fb::HeadKind::tag) &&
              int(HeadKind::Span) == int(mtp::fb::HeadKind::span) &&
              int(HeadKind::Decoder) == int(mtp::fb::HeadKind::decoder));
static_assert(int(LossKind::CrossEntropy) ==
                  int(mtp::fb::LossKind::cross_entropy) &&
              int(LossKind::Mse) == int(mtp::fb::LossKind::mse));
static_assert(int(LrSchedule::Constant) ==
                  int(mtp::fb::ScheduleKind::constant) &&
              int(LrSchedule::Linear) == int(mtp::fb::ScheduleKind::linear) &&
              int(LrSchedule::Cosine) == int(mtp::fb::ScheduleKind::cosine));
static_assert(int(AttentionKind::Math) == int(mtp::fb::AttentionKind::math) &&
              int(AttentionKind::Fused) == int(mtp::fb::AttentionKind::fused));
static_assert(int(PointwiseKind::Aten) == int(mtp::fb::PointwiseKind::aten) &&
              int(PointwiseKind::Fused) == int(mtp::fb::PointwiseKind::fused));
static_assert(int(Precision::Fp32) == int(mtp::fb::Precision::fp32) &&
              int(Precision::Bf16) == int(mtp::fb::Precision::bf16) &&
              int(Precision::Fp16) == int(mtp::fb::Precision::fp16));
static_assert(int(Collective::Auto) ==
                  int(mtp::fb::CollectivePolicy::automatic) &&
              int(Collective::None) == int(mtp::fb::CollectivePolicy::none) &&
              int(Collective::Compressed) ==
                  int(mtp::fb::CollectivePolicy::compressed));

} // namespace

const char *toString(HeadKind kind) {
  return mtp::fb::EnumNameHeadKind(static_cast<mtp::fb::HeadKind>(kind));
}
const char *toString(LossKind loss) {
  return mtp::fb::EnumNameLossKind(static_cast<mtp::fb::LossKind>(loss));
}
const char *toString(AttentionKind kind) {
  return mtp::fb::EnumNameAttentionKind(
      static_cast<mtp::fb::AttentionKind>(kind));
}
const char *toString(PointwiseKind kind) {
  return mtp::fb::EnumNamePointwiseKind(
      static_cast<mtp::fb::PointwiseKind>(kind));
}
const char *toString(LrSchedule schedule) {
  return mtp::fb::EnumNameScheduleKind(
      static_cast<mtp::fb::ScheduleKind>(schedule));
}
const char *toString(Precision precision) {
  return mtp::fb::EnumNamePrecision(static_cast<mtp::fb::Precision>(precision));
}

namespace {

GradScope gradScope(mtp::fb::GradientScope s) {
  switch (s) {
  case mtp::fb::GradientScope::sum:
    return GradScope::Sum;
  case mtp::fb::GradientScope::params:
    return GradScope::Params;
  case mtp::fb::GradientScope::features:
    break;
  }
  return GradScope::Features;
}

LrConfig lrOf(const Checker &c, const std::string &f,
              const mtp::fb::LrSchedule *l, int64_t steps) {
  LrConfig out;
  out.schedule = static_cast<LrSchedule>(
      c.oneOf(f + ".kind", l->kind(), mtp::fb::EnumNamesScheduleKind()));
  out.lr = c.real(f + ".peak", l->peak(), limits::kLearningRate);
  out.warmupSteps = c.range(f + ".warmup", l->warmup(), limits::kWarmup);
  if (out.warmupSteps > steps)
    c.field(f + ".warmup", std::to_string(out.warmupSteps) +
                               " exceeds the " + std::to_string(steps) +
                               " training steps");
  out.totalSteps = steps;
  return out;
}

} // namespace

Plan readPlan(const void *data, size_t size, const std::string &name) {
  const Checker c(name);
  const uint8_t *bytes = nullptr;
  size_t n = 0;
  if (std::string why = checkPlanFrame(data, size, &bytes, &n); !why.empty())
    c.fail(why);
  if (n < 8 || !mtp::fb::PlanBufferHasIdentifier(bytes))
    c.fail(std::string("the frame holds no flatbuffer plan (no 'MTPP' "
                       "identifier)") +
           kAgain);
  flatbuffers::Verifier verifier(bytes, n);
  if (!mtp::fb::VerifyPlanBuffer(verifier))
    c.fail(std::string("the plan is corrupt (the flatbuffers verifier "
                       "rejects it)") +
           kAgain);
  const mtp::fb::Plan *fb = mtp::fb::GetPlan(bytes);
  if (fb->version() != kPlanVersion)
    c.fail("the flatbuffer says plan version " +
           std::to_string(fb->version()) + ", its frame version " +
           std::to_string(kPlanVersion) + kAgain);
  if (!fb->backbone() || !fb->tasks() || !fb->units())
    c.fail(std::string("the plan has no backbone, tasks or units") + kAgain);

  Plan plan;
  plan.modelName = c.text("model", fb->model(), false);
  plan.source = c.text("source", fb->source(), false, limits::kMaxPathBytes);
  if (const auto *t = fb->target()) {
    plan.device = c.text("target.device", t->device(), true);
    plan.precision = static_cast<Precision>(c.oneOf(
        "target.precision", t->precision(), mtp::fb::EnumNamesPrecision()));
    plan.gpus = c.range("target.gpus", t->gpus(), limits::kGpus);
    plan.microBatch =
        c.range("target.micro_batch", t->micro_batch(), limits::kMicroBatch);
    plan.globalBatch = c.range("target.global_batch", t->global_batch(),
                               limits::kGlobalBatch);
    // A pipeline's batch splits over its replicas (docs/pipeline.md); the
    // stages' count is checked with the pipeline below.
    const int64_t stages = fb->pipeline() && fb->pipeline()->stages() &&
                                   fb->pipeline()->stages()->size() > 1
                               ? int64_t(fb->pipeline()->stages()->size())
                               : 1;
    const int64_t replicas =
        plan.gpus % stages == 0 ? plan.gpus / stages : plan.gpus;
    if (plan.globalBatch % (plan.microBatch * replicas) != 0)
      c.field("target.global_batch",
              std::to_string(plan.globalBatch) + " is not a multiple of " +
                  (stages > 1 ? "micro_batch x replicas = "
                              : "micro_batch x gpus = ") +
                  std::to_string(plan.microBatch * replicas));
    plan.zero = c.range("target.zero", t->zero(), {0, 3});
    plan.memoryBytes = c.range("target.memory_bytes", t->memory_bytes(),
                               {0, INT64_MAX});
    plan.usableBytes = c.range("target.usable_bytes", t->usable_bytes(),
                               {0, plan.memoryBytes});
  }

  const auto *bb = fb->backbone();
  plan.backboneKind = mtp::fb::EnumNameBackboneKind(c.oneOf(
      "backbone.kind", bb->kind(), mtp::fb::EnumNamesBackboneKind()));
  ModelConfig &m = plan.model;
  m.layers = c.range("backbone.layers", bb->layers(), limits::kLayers);
  m.hidden = c.range("backbone.hidden", bb->hidden(), limits::kHidden);
  m.heads = c.range("backbone.heads", bb->heads(), limits::kHeads);
  m.ffn = c.range("backbone.ffn", bb->ffn(), limits::kFfn);
  m.vocab = c.range("backbone.vocab", bb->vocab(), limits::kVocab);
  m.seq = c.range("backbone.seq", bb->seq(), limits::kSeq);
  m.dropout = c.real("backbone.dropout", bb->dropout(), limits::kDropout);
  m.attention = static_cast<AttentionKind>(
      c.oneOf("backbone.attention", bb->attention(),
              mtp::fb::EnumNamesAttentionKind()));
  m.pointwise = static_cast<PointwiseKind>(
      c.oneOf("backbone.pointwise", bb->pointwise(),
              mtp::fb::EnumNamesPointwiseKind()));
  m.kind = static_cast<BackboneKind>(c.oneOf(
      "backbone.kind", bb->kind(), mtp::fb::EnumNamesBackboneKind()));
  m.positions = c.range("backbone.positions", bb->positions(),
                        limits::kPositions);
  if (m.positions != 0 && m.positions < m.seq)
    c.field("backbone.positions",
            std::to_string(m.positions) + " position rows for seq " +
                std::to_string(m.seq));
  m.normEps = c.real("backbone.norm_eps", bb->norm_eps(), limits::kNormEps);
  m.weights = c.text("backbone.weights", bb->weights(), false,
                     limits::kMaxPathBytes);
  m.kvHeads = c.range("backbone.kv_heads", bb->kv_heads(), {0, m.heads});
  if (m.kvHeads && m.heads % m.kvHeads)
    c.field("backbone.kv_heads", std::to_string(m.kvHeads) +
                                     " key/value heads do not divide " +
                                     std::to_string(m.heads) + " heads");
  m.ropeTheta =
      c.real("backbone.rope_theta", bb->rope_theta(), {0.0, 1e12, true});
  if (const auto *r = bb->rope_scaling()) {
    if (r->size() != 4)
      c.field("backbone.rope_scaling",
              std::to_string(r->size()) + " values, not 4");
    m.ropeScaling.factor =
        c.real("backbone.rope_scaling[0]", r->Get(0), {0.0, 1e6, true});
    m.ropeScaling.lowFreqFactor =
        c.real("backbone.rope_scaling[1]", r->Get(1), {0.0, 1e6, true});
    m.ropeScaling.highFreqFactor =
        c.real("backbone.rope_scaling[2]", r->Get(2), {0.0, 1e6, true});
    m.ropeScaling.originalPositions = static_cast<int64_t>(
        c.real("backbone.rope_scaling[3]", r->Get(3), {1.0, 1e9}));
  }
  m.typeVocab = c.range("backbone.type_vocab", bb->type_vocab(), {0, 1 << 20});
  m.positionPad = c.range("backbone.position_pad", bb->position_pad(),
                          {-1, m.vocab - 1});
  m.tokenPad =
      c.range("backbone.token_pad", bb->token_pad(), {-1, m.vocab - 1});
  m.freezeFirst =
      c.range("backbone.freeze_first", bb->freeze_first(), {-1, m.layers});
  m.freezeLast =
      c.range("backbone.freeze_last", bb->freeze_last(), {-1, m.layers});
  if ((m.freezeFirst < 0) != (m.freezeLast < 0) ||
      m.freezeFirst > m.freezeLast)
    c.field("backbone.freeze_last",
            "freeze_first " + std::to_string(m.freezeFirst) +
                " and freeze_last " + std::to_string(m.freezeLast) +
                " are no range of layers (both -1, or first <= last)");
  if (m.ropeScaling.factor > 0 &&
      !(m.ropeScaling.highFreqFactor > m.ropeScaling.lowFreqFactor))
    c.field("backbone.rope_scaling",
            "high_freq_factor must exceed low_freq_factor");
  if (m.positionPad >= 0 && m.positionPad + 1 + m.seq > m.positionRows())
    c.field("backbone.position_pad",
            "positions from the padding id + 1 run past the " +
                std::to_string(m.positionRows()) + " position rows");
  if (m.kind == BackboneKind::Llama && m.attention != AttentionKind::Fused)
    c.field("backbone.attention", "llama runs the fused attention only");
  m.attentionBias = !bb->no_attention_bias();
  m.mlpBias = !bb->no_mlp_bias();
  if (m.kind != BackboneKind::Transformer && m.pointwise == PointwiseKind::Fused)
    c.field("backbone.pointwise",
            "fused, but a " + plan.backboneKind +
                " backbone runs on ATen's pointwise ops");
  if (m.hidden % m.heads)
    c.field("backbone.heads", std::to_string(m.heads) +
                                  " attention heads do not divide hidden " +
                                  std::to_string(m.hidden));

  const auto &tasks = *fb->tasks();
  if (tasks.size() < 1 || tasks.size() > size_t(limits::kMaxTasks))
    c.field("tasks", std::to_string(tasks.size()) + " tasks, not in [1, " +
                         std::to_string(limits::kMaxTasks) + "]");
  std::map<std::string, int64_t> taskIndex;
  for (unsigned i = 0; i < tasks.size(); ++i) {
    const mtp::fb::Task *t = tasks.Get(i);
    const std::string f = "tasks[" + std::to_string(i) + "]";
    HeadConfig h;
    h.name = c.text(f + ".name", t->name(), true);
    if (!taskIndex.emplace(h.name, int64_t(i)).second)
      c.field(f + ".name", "'" + h.name + "' names two tasks");
    const std::string ft = "task '" + h.name + "' (" + f + ")";
    h.kind = static_cast<HeadKind>(
        c.oneOf(ft + ".head", t->head(), mtp::fb::EnumNamesHeadKind()));
    h.tap = c.range(ft + ".tap_layer", t->tap_layer(), {0, m.layers});
    h.loss = static_cast<LossKind>(
        c.oneOf(ft + ".loss", t->loss(), mtp::fb::EnumNamesLossKind()));
    if (h.loss == LossKind::Mse && h.kind != HeadKind::Classify)
      c.field(ft + ".loss", "mse needs a classify head");
    switch (h.kind) {
    case HeadKind::Classify:
      h.classes = c.range(ft + ".classes", t->classes(), limits::kClasses);
      break;
    case HeadKind::Tag:
      h.classes = c.range(ft + ".classes", t->classes(), limits::kLabels);
      break;
    case HeadKind::Span:
      break;
    case HeadKind::Decoder:
      h.decoderLayers = c.range(ft + ".decoder_layers", t->decoder_layers(),
                                limits::kDecoderLayers);
      // 0: the backbone's vocabulary.
      h.targetVocab = t->target_vocab() == 0
                          ? 0
                          : c.range(ft + ".target_vocab", t->target_vocab(),
                                    limits::kVocab);
      h.targetSeq = c.range(ft + ".target_seq", t->target_seq(), {1, m.seq});
      break;
    }
    h.weight = c.real(ft + ".weight", t->weight(), limits::kLossWeight);
    plan.heads.push_back(h);
  }

  // Decisions: offloaded backbone blocks and heads; recompute comes as the
  // regions.
  const auto &units = *fb->units();
  std::vector<int64_t> recomputedBlocks;
  for (unsigned i = 0; i < units.size(); ++i) {
    const mtp::fb::Unit *u = units.Get(i);
    const std::string f = "units[" + std::to_string(i) + "]";
    c.text(f + ".name", u->name(), false);
    c.range(f + ".saved_bytes", u->saved_bytes(), {0, INT64_MAX});
    c.range(f + ".fwd_flops", u->fwd_flops(), {0, INT64_MAX});
    c.oneOf(f + ".kind", u->kind(), mtp::fb::EnumNamesUnitKind());
    c.oneOf(f + ".decision", u->decision(), mtp::fb::EnumNamesDecision());
    const std::string task = c.text(f + ".task", u->task(), false);
    if (task.empty()) {
      const int64_t block =
          c.range(f + ".block", u->block(), {0, 2 * m.layers});
      if (u->decision() == mtp::fb::Decision::Offload) {
        auto &offloaded = plan.schedule.offloadUnits;
        if (offloaded.empty() || offloaded.back() != block)
          offloaded.push_back(block);
      }
      // Recompute outside a region (the regions come below): tensor grain.
      if (u->decision() == mtp::fb::Decision::Recompute)
        recomputedBlocks.push_back(block);
      continue;
    }
    const auto it = taskIndex.find(task);
    if (it == taskIndex.end())
      c.field(f + ".task", "'" + task.substr(0, 64) + "' is no task");
    if (u->decision() == mtp::fb::Decision::Offload) {
      auto &heads = plan.schedule.offloadHeadList;
      if (heads.empty() || heads.back() != it->second)
        heads.push_back(it->second);
    }
  }
  if (const auto *regions = fb->regions()) {
    // The verifier checks a struct vector's length word, not its elements'
    // 8-byte alignment: mtpc never writes elements misaligned, a forged file
    // may (an empty vector is not aligned: flatbuffers pads for elements).
    if (regions->size() > 0 &&
        reinterpret_cast<uintptr_t>(regions->Data()) %
                alignof(mtp::fb::Region) !=
            0)
      c.field("regions", "are misaligned (the plan is damaged)");
    for (const mtp::fb::Region *r : *regions)
      plan.schedule.regions.emplace_back(r->first_block(), r->last_block());
  }
  for (int64_t block : recomputedBlocks) {
    bool inRegion = false;
    for (const auto &[first, last] : plan.schedule.regions)
      inRegion |= block >= first && block <= last;
    auto &partial = plan.schedule.partialUnits;
    if (!inRegion && (partial.empty() || partial.back() != block))
      partial.push_back(block);
  }

  // The strategy and training settings the step runs with.
  if (const auto *tr = fb->train()) {
    plan.steps = c.range("train.steps", tr->steps(), limits::kSteps);
    plan.seed = tr->seed();
    plan.data = c.text("train.data", tr->data(), true, limits::kMaxPathBytes);
    if (tr->eval_data())
      plan.evalData =
          c.text("train.eval_data", tr->eval_data(), true, limits::kMaxPathBytes);
    plan.evalEvery =
        c.range("train.eval_every", tr->eval_every(), {0, INT64_MAX});
    plan.logEvery = c.range("train.log_every", tr->log_every(), {1, INT64_MAX});
    plan.saveEvery =
        c.range("train.save_every", tr->save_every(), {0, INT64_MAX});
    if (tr->lr())
      plan.train.backboneLr = lrOf(c, "train.lr", tr->lr(), plan.steps);
    if (const auto *phases = tr->phases()) {
      int64_t total = 0;
      for (flatbuffers::uoffset_t i = 0; i < phases->size(); ++i) {
        const std::string at = "train.phases[" + std::to_string(i) + "]";
        const auto *p = phases->Get(i);
        Phase phase;
        phase.steps = c.range(at + ".steps", p->steps(), limits::kSteps);
        phase.predictedPeakBytes =
            c.range(at + ".predicted_peak_bytes", p->predicted_peak_bytes(),
                    {0, INT64_MAX});
        phase.groupedPeakBytes =
            c.range(at + ".grouped_peak_bytes", p->grouped_peak_bytes(),
                    {0, INT64_MAX});
        if (!p->tasks() || p->tasks()->size() == 0)
          c.field(at + ".tasks", "a phase trains at least one task");
        else
          for (int64_t t : *p->tasks()) {
            if (t < 0 || t >= int64_t(plan.heads.size()))
              c.field(at + ".tasks", std::to_string(t) +
                                         " is not a task index (the plan has " +
                                         std::to_string(plan.heads.size()) +
                                         " tasks)");
            if (std::count(phase.tasks.begin(), phase.tasks.end(), t))
              c.field(at + ".tasks", "task " + std::to_string(t) + " twice");
            phase.tasks.push_back(t);
          }
        total += phase.steps;
        plan.phases.push_back(std::move(phase));
      }
      if (total != plan.steps)
        c.field("train.phases", "take " + std::to_string(total) +
                                    " steps, but train.steps is " +
                                    std::to_string(plan.steps));
    }
    plan.train.weightDecay =
        c.real("train.weight_decay", tr->weight_decay(), limits::kWeightDecay);
    plan.train.beta1 = c.real("train.beta1", tr->beta1(), limits::kBeta);
    plan.train.beta2 = c.real("train.beta2", tr->beta2(), limits::kBeta);
    plan.train.eps = c.real("train.eps", tr->eps(), limits::kEps);
    for (unsigned i = 0; i < tasks.size(); ++i) {
      const mtp::fb::Task *t = tasks.Get(i);
      plan.train.headLr.push_back(
          t->lr() ? lrOf(c, "task '" + plan.heads[i].name + "' (tasks[" +
                                std::to_string(i) + "]).lr",
                         t->lr(), plan.steps)
                  : plan.train.backboneLr);
    }
  }
  if (const auto *st = fb->strategy()) {
    plan.train.scope = gradScope(c.oneOf("strategy.scope", st->scope(),
                                         mtp::fb::EnumNamesGradientScope()));
    plan.train.paramsTopK =
        c.range("strategy.scope_layers", st->scope_layers(), {1, m.layers});
    plan.train.gfmKeep =
        c.real("strategy.gfm_keep", st->gfm_keep(), limits::kGfmKeep);
    plan.train.clipNorm = st->clip_max_norm() == 0.0
                              ? 0.0
                              : c.real("strategy.clip_max_norm",
                                       st->clip_max_norm(), limits::kClipNorm);
    if (st->gate_hidden() != 0)
      c.range("strategy.gate_hidden", st->gate_hidden(), limits::kDgfgHidden);
    plan.train.gate = st->gate_hidden() > 0;
    if (plan.train.gate)
      plan.train.gateHidden = st->gate_hidden();
    plan.train.recalibrateReuse = st->recalibrate_reuse();
    plan.train.recalibrateStd = st->recalibrate_std();
    // The cosine matrix feeds the gate and its recalibration; without the
    // gate the probe would only cost time (and memory the plan did not count).
    plan.train.cosineEvery = plan.train.gate ? 1 : 0;
    c.real("strategy.recalibrate_reuse", st->recalibrate_reuse(),
           limits::kRecalibration);
    c.real("strategy.recalibrate_std", st->recalibrate_std(),
           limits::kRecalibration);
    plan.collective = static_cast<Collective>(
        c.oneOf("strategy.collective", st->collective(),
                mtp::fb::EnumNamesCollectivePolicy()));
    plan.compressTopK = c.real("strategy.topk", st->topk(), limits::kTopK);
    plan.compressDecay =
        c.real("strategy.decay", st->decay(), limits::kResidualDecay);
    plan.compressBlock =
        c.range("strategy.block", st->block(), limits::kQuantBlock);
    const int64_t bits = c.range("strategy.bits", st->bits(), limits::kQuantBits);
    if (bits & (bits - 1))
      c.field("strategy.bits", std::to_string(bits) + " is not a power of two");
    plan.compressBits = bits;
    if (const auto *db = st->dynamic_batch()) {
      BatchSchedule s;
      s.start = c.range("strategy.dynamic_batch.start", db->start(),
                        limits::kGlobalBatch);
      s.max = c.range("strategy.dynamic_batch.max", db->max(),
                      limits::kGlobalBatch);
      s.rate = c.real("strategy.dynamic_batch.rate", db->rate(),
                      limits::kBatchRate);
      s.rampSteps = c.range("strategy.dynamic_batch.ramp_steps",
                            db->ramp_steps(), limits::kBatchSteps);
      s.decay = c.real("strategy.dynamic_batch.decay", db->decay(),
                       limits::kBatchDecay);
      s.every = c.range("strategy.dynamic_batch.every", db->every(),
                        limits::kBatchEvery);
      s.floor = c.range("strategy.dynamic_batch.floor", db->floor(),
                        limits::kGlobalBatch);
      if (const char *why = s.inconsistency())
        c.field("strategy.dynamic_batch", why);
      const int64_t largest =
          s.largestBatch(std::max<int64_t>(1, plan.microBatch * plan.gpus));
      if (largest != plan.globalBatch)
        c.field("strategy.dynamic_batch",
                "reaches a global batch of " + std::to_string(largest) +
                    ", but target.global_batch is " +
                    std::to_string(plan.globalBatch) +
                    " (the plan must be for the largest)");
      plan.dynamicBatch = s;
    }
    if (const auto *sp = st->saps()) {
      SapsConfig s;
      s.fraction = c.real("strategy.saps.fraction", sp->fraction(),
                          limits::kSapsFraction);
      s.every = c.range("strategy.saps.every", sp->every(), limits::kSapsEvery);
      s.lambda =
          c.real("strategy.saps.lambda", sp->lambda(), limits::kSapsLambda);
      if (plan.train.scope == GradScope::Params)
        c.field("strategy.saps", "sparse updates need the features or sum "
                                 "scope, not params");
      plan.train.saps = s;
    }
    plan.train.optimizerOffload = st->optimizer_offload();
    if (const auto *ad = st->adapters()) {
      AdapterConfig a;
      a.bottleneck = c.range("strategy.adapters.bottleneck", ad->bottleneck(),
                             {1, plan.model.hidden});
      a.separation = c.real("strategy.adapters.separation", ad->separation(),
                            limits::kAdapterSeparation);
      if (const auto *owners = ad->owners()) {
        // The length before the copy: a forged one may be large.
        if (owners->size() != plan.heads.size())
          c.field("strategy.adapters.owners",
                  "has " + std::to_string(owners->size()) + " entries for " +
                      std::to_string(plan.heads.size()) + " heads");
        a.owner.assign(owners->begin(), owners->end());
        if (std::string why = a.ownerProblem(plan.heads.size()); !why.empty())
          c.field("strategy.adapters.owners", why);
      }
      plan.groupedPeakBytes = c.range("strategy.adapters.grouped_peak_bytes",
                                      ad->grouped_peak_bytes(), {0, INT64_MAX});
      if (ad->regroup() != 0) {
        a.regroup = c.range("strategy.adapters.regroup", ad->regroup(),
                            limits::kAdapterRegroup);
        a.share = c.real("strategy.adapters.share", ad->share(),
                         limits::kAdapterShare);
        if (a.owner.empty())
          c.field("strategy.adapters.regroup",
                  "splits groups, and the plan forms none (no owners)");
        // A split adds parameters, which a sharded or host optimizer's
        // layout fixed at the start cannot take (mtpc check refuses it).
        if (plan.zero > 0 || plan.train.optimizerOffload)
          c.field("strategy.adapters.regroup",
                  "is not supported with ZeRO or the optimizer offload");
      }
      plan.model.adapters = a;
    }
    if (const auto *ew = st->ewc()) {
      EwcConfig e;
      e.lambda = c.real("strategy.ewc.lambda", ew->lambda(), limits::kEwcLambda);
      e.fisherBatches = c.range("strategy.ewc.fisher_batches",
                                ew->fisher_batches(), limits::kEwcBatches);
      if (ew->threshold() != EwcConfig::kAlways)
        e.threshold = c.real("strategy.ewc.threshold", ew->threshold(),
                             limits::kEwcThreshold);
      plan.train.ewc = e;
      if (plan.phases.size() < 2)
        c.field("strategy.ewc", "protects earlier phases' learning: it needs "
                                "two train.phases or more");
    }
  }

  plan.predictedPeakBytes = c.range("predicted_peak_bytes",
                                    fb->predicted_peak_bytes(), {0, INT64_MAX});
  plan.keepPeakBytes =
      c.range("keep_peak_bytes", fb->keep_peak_bytes(), {0, INT64_MAX});
  plan.uniformPeakBytes =
      c.range("uniform_peak_bytes", fb->uniform_peak_bytes(), {-1, INT64_MAX});
  plan.evalPeakBytes =
      c.range("eval_peak_bytes", fb->eval_peak_bytes(), {0, INT64_MAX});
  plan.evalBatch = fb->eval_batch() == 0
                       ? 0
                       : c.range("eval_batch", fb->eval_batch(),
                                 {plan.microBatch, 8 * plan.microBatch});
  if (plan.evalBatch % plan.microBatch != 0)
    c.field("eval_batch", std::to_string(plan.evalBatch) +
                              " is not a multiple of the micro batch " +
                              std::to_string(plan.microBatch));
  plan.steadyPeakBytes = c.range("steady_peak_bytes", fb->steady_peak_bytes(),
                                 {0, plan.predictedPeakBytes});
  if (plan.steadyPeakBytes && !plan.train.saps)
    c.field("steady_peak_bytes", "is for steps that do not re-rank, but the "
                                 "plan has no strategy.saps");
  plan.addedSeconds = c.real("added_seconds", fb->added_seconds(),
                             {0.0, 1e300});

  // docs/pipeline.md: stages that cover the backbone's units in order, each
  // head on the stage of its tap, and gpus a multiple of the stages.
  if (const auto *pp = fb->pipeline()) {
    const int64_t units = 2 * m.layers + 1;
    const int64_t n = pp->stages() ? int64_t(pp->stages()->size()) : 0;
    if (n < 2 || n > units)
      c.field("pipeline.stages", std::to_string(n) + " stages for " +
                                     std::to_string(units) +
                                     " units (2 to one per unit)");
    if (plan.gpus % n != 0)
      c.field("pipeline.stages", std::to_string(n) +
                                     " stages do not divide target.gpus " +
                                     std::to_string(plan.gpus));
    std::vector<int> owner(plan.heads.size(), -1);
    int64_t next = 0;
    for (int64_t s = 0; s < n; ++s) {
      const auto *st = pp->stages()->Get(s);
      const std::string at = "pipeline.stages[" + std::to_string(s) + "]";
      PipelineStageConfig cfg;
      cfg.firstUnit = c.range(at + ".first_unit", st->first_unit(),
                              {next, next});
      cfg.lastUnit = c.range(at + ".last_unit", st->last_unit(),
                             {cfg.firstUnit, s + 1 == n ? units - 1
                                                        : units - 2});
      if (s + 1 == n && cfg.lastUnit != units - 1)
        c.field(at + ".last_unit", "the last stage must end at unit " +
                                       std::to_string(units - 1));
      next = cfg.lastUnit + 1;
      if (st->tasks())
        for (int64_t t : *st->tasks()) {
          t = c.range(at + ".tasks", t,
                      {0, int64_t(plan.heads.size()) - 1});
          const int64_t tap = 2 * plan.heads[t].tap;
          if (tap < cfg.firstUnit || tap > cfg.lastUnit || owner[t] >= 0)
            c.field(at + ".tasks", "head " + std::to_string(t) +
                                       " is not this stage's (its tap is "
                                       "unit " + std::to_string(tap) + ")");
          owner[t] = int(s);
          cfg.tasks.push_back(t);
        }
      cfg.predictedPeakBytes = c.range(at + ".predicted_peak_bytes",
                                       st->predicted_peak_bytes(),
                                       {0, INT64_MAX});
      cfg.inFlight = c.range(at + ".in_flight", st->in_flight(),
                             {1, limits::kAccumulation.hi});
      plan.pipeline.stages.push_back(std::move(cfg));
    }
    for (size_t t = 0; t < owner.size(); ++t)
      if (owner[t] < 0)
        c.field("pipeline.stages", "no stage runs head " + std::to_string(t));
    // Each checkpoint region runs inside one stage's process; a stage
    // offloads its own blocks (no head) and runs none at tensor grain.
    for (const auto &[first, last] : plan.schedule.regions) {
      bool inside = false;
      for (PipelineStageConfig &st : plan.pipeline.stages)
        if (first >= st.firstUnit && last <= st.lastUnit) {
          st.regions.emplace_back(first, last);
          inside = true;
        }
      if (!inside)
        c.field("regions", "region " + std::to_string(first) + ".." +
                               std::to_string(last) +
                               " crosses a pipeline stage's boundary");
    }
    for (int64_t u : plan.schedule.offloadUnits)
      for (PipelineStageConfig &st : plan.pipeline.stages)
        if (u >= st.firstUnit && u <= st.lastUnit)
          st.offloadUnits.push_back(u);
    if (!plan.schedule.offloadHeadList.empty() ||
        !plan.schedule.partialUnits.empty())
      c.field("units", "a pipeline stage offloads no head and recomputes "
                       "whole blocks only (docs/pipeline.md)");
    plan.pipeline.gpipe = pp->gpipe();
    plan.pipeline.microBatches = c.range("pipeline.micro_batches",
                                         pp->micro_batches(),
                                         limits::kAccumulation);
    plan.pipeline.bubble = c.real("pipeline.bubble", pp->bubble(), {0.0, 1.0});
  }

  // The decisions must be a schedule the trainer runs (the trainer's own
  // rule), so a bad one is refused here, naming the plan.
  try {
    validateSchedule(plan.schedule, m.layers, plan.heads);
  } catch (const std::invalid_argument &e) {
    std::string why = e.what();
    if (why.rfind("mtprt: ", 0) == 0)
      why = why.substr(7);
    c.fail("its decisions are not a schedule this runtime runs (" + why +
           ")" + kAgain);
  }
  return plan;
}

std::string checkPlan(const void *data, size_t size, const std::string &name) {
  try {
    readPlan(data, size, name);
  } catch (const PlanError &e) {
    return e.reason();
  } catch (const std::exception &e) {
    return std::string("cannot be read: ") + e.what();
  }
  return "";
}

Program programFromPlan(const Plan &plan) {
  if (plan.backboneKind != "transformer" && plan.backboneKind != "gpt2" &&
      plan.backboneKind != "llama" && plan.backboneKind != "bert")
    throw std::runtime_error(
        "mtprt: the plan of model '" + plan.modelName + "' (from " +
        plan.source + ") has backbone kind '" + plan.backboneKind +
        "': this runtime builds 'transformer', 'gpt2', 'llama' and 'bert' backbones; re-plan the "
        "spec with the mtpc that matches this runtime");
  Program p;
  p.name = plan.modelName;
  p.model = plan.model;
  p.heads = plan.heads;
  p.schedule = plan.schedule;
  p.predictedPeakBytes = plan.predictedPeakBytes;
  p.predictedSteadyPeakBytes = plan.steadyPeakBytes;
  p.groupedPeakBytes = plan.groupedPeakBytes;
  p.predictedEvalPeakBytes = plan.evalPeakBytes > 0 ? plan.evalPeakBytes : -1;
  p.evalBatch = plan.evalBatch;
  p.dynamicBatch = plan.dynamicBatch;
  p.plannedProcesses = std::max<int64_t>(1, plan.gpus);
  p.model.device = plan.device == "cpu" || plan.device.empty() ? "cpu" : "cuda";
  p.model.seed = plan.seed;
  p.train = plan.train;
  p.steps = plan.steps;
  p.seed = plan.seed;
  p.logEvery = plan.logEvery;
  p.data = plan.data;
  p.evalData = plan.evalData;
  p.evalEvery = plan.evalEvery;
  p.phases = plan.phases;
  // GSC by default where the spec asks for it (auto: when processes share
  // the gradients; one process exchanges nothing).
  p.compress = plan.collective != Collective::None;
  // ZeRO 2 sums plain gradients during the backward (the compiler refuses it with
  // collective = compressed).
  p.train.zeroStage = int(plan.zero);
  if (plan.zero >= 2 && plan.collective == Collective::Auto)
    p.compress = false;
  // So does SAPS's exchange of the selected entries (docs/techniques.md
  // D12).
  if (plan.train.saps && plan.collective == Collective::Auto)
    p.compress = false;
  p.compressTopK = plan.compressTopK;
  p.compressDecay = plan.compressDecay;
  p.compressBlock = plan.compressBlock;
  p.compressBits = plan.compressBits;
  // train.save_every: the default of --checkpoint-every (checkpoints need
  // --checkpoint-dir).
  p.checkpointEvery = plan.saveEvery;
  p.train.precision = plan.precision;
  p.pipeline = plan.pipeline;
  // A pipeline's batch splits over its replicas, not its stages.
  const int64_t replicas =
      plan.pipeline.active()
          ? std::max<int64_t>(1, plan.gpus / plan.pipeline.size())
          : plan.gpus;
  int64_t perStep = std::max<int64_t>(1, plan.microBatch * replicas);
  p.batchSize = std::max(plan.globalBatch, perStep);
  p.train.microBatches = std::max<int64_t>(1, p.batchSize / perStep);
  return p;
}

Plan loadPlan(const std::string &path) {
  const std::string what =
      "; write one with `mtpc plan SPEC --format=fb -o " + path + "`";
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw PlanError(path, "cannot open it" + what);
  if (!S_ISREG(st.st_mode))
    throw PlanError(path, "not a regular file" + what);
  // The flatbuffer is at most 2 GiB (flatbuffers' own bound): a larger file
  // is not a plan, and is not read into memory.
  if (uint64_t(st.st_size) > kPlanFrameBytes + FLATBUFFERS_MAX_BUFFER_SIZE)
    throw PlanError(path, std::to_string(st.st_size) +
                              " bytes, more than any plan" + what);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw PlanError(path, "cannot open it" + what);
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  return readPlan(bytes.data(), bytes.size(), path);
}

} // namespace mtprt
