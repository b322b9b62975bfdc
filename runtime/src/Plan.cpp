//===- Plan.cpp - the compiler's plan, read by the runtime ----------------===//

#include "mtprt/Plan.h"
#include "mtprt/Driver.h"

#include "schema/plan_generated.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace mtprt {
namespace {

/// The version this runtime reads: the schema's, as mtpc writes it.
constexpr unsigned kPlanVersion = unsigned(mtp::fb::PlanVersion::Current);

[[noreturn]] void fail(const std::string &name, const std::string &why) {
  throw std::runtime_error("mtprt: plan " + name + ": " + why);
}

std::string str(const flatbuffers::String *s) {
  return s ? s->str() : std::string();
}

HeadKind headKind(const std::string &name, const std::string &head,
                  const std::string &task) {
  if (head == "classify")
    return HeadKind::Classify;
  if (head == "tag")
    return HeadKind::Tag;
  if (head == "span")
    return HeadKind::Span;
  if (head == "decoder")
    return HeadKind::Decoder;
  fail(name, "task '" + task + "' has head kind '" + head +
                 "', which this runtime does not know; re-plan the spec "
                 "with the mtpc that matches this runtime");
}

} // namespace

Plan readPlan(const void *data, size_t size, const std::string &name) {
  const auto *bytes = static_cast<const uint8_t *>(data);
  const std::string again =
      "; write it again with `mtpc plan SPEC --format=fb -o PLAN`";
  if (size < 8 || !mtp::fb::PlanBufferHasIdentifier(bytes))
    fail(name, "not an mtpc plan (no 'MTPP' identifier)" + again);
  flatbuffers::Verifier verifier(bytes, size);
  if (!mtp::fb::VerifyPlanBuffer(verifier))
    fail(name, "the plan is corrupt (the flatbuffers verifier rejects it)" +
                   again);
  const mtp::fb::Plan *fb = mtp::fb::GetPlan(bytes);
  if (fb->version() != kPlanVersion)
    fail(name, "plan version " + std::to_string(fb->version()) +
                   ", this runtime reads version " +
                   std::to_string(kPlanVersion) +
                   "; re-plan the spec with the matching mtpc");
  if (!fb->backbone() || !fb->tasks() || !fb->units())
    fail(name, "the plan has no backbone, tasks or units" + again);

  Plan plan;
  plan.modelName = str(fb->model());
  plan.source = str(fb->source());
  if (const auto *t = fb->target()) {
    plan.device = str(t->device());
    plan.precision = str(t->precision());
    plan.gpus = t->gpus();
    plan.microBatch = t->micro_batch();
    plan.globalBatch = t->global_batch();
    plan.memoryBytes = t->memory_bytes();
    plan.usableBytes = t->usable_bytes();
  }
  const auto *bb = fb->backbone();
  if (bb->kind())
    plan.backboneKind = bb->kind()->str();
  plan.model.vocab = bb->vocab();
  plan.model.seq = bb->seq();
  plan.model.layers = bb->layers();
  plan.model.hidden = bb->hidden();
  plan.model.heads = bb->heads();
  plan.model.ffn = bb->ffn();
  plan.model.dropout = bb->dropout();
  if (plan.model.layers < 1 || plan.model.hidden < 1 || plan.model.heads < 1 ||
      plan.model.hidden % plan.model.heads || plan.model.vocab < 1 ||
      plan.model.seq < 1 || plan.model.ffn < 1)
    fail(name, "backbone dimensions are not a valid transformer" + again);

  for (const mtp::fb::Task *t : *fb->tasks()) {
    HeadConfig h;
    h.name = str(t->name());
    h.kind = headKind(name, str(t->head()), h.name);
    h.tap = t->tap_layer();
    if (h.tap < 0 || h.tap > plan.model.layers)
      fail(name, "task '" + h.name + "' reads layer " + std::to_string(h.tap) +
                     " of " + std::to_string(plan.model.layers) + again);
    h.loss = str(t->loss()) == "mse" ? LossKind::Mse : LossKind::CrossEntropy;
    if (t->classes() > 0)
      h.classes = t->classes();
    if (h.kind == HeadKind::Decoder) {
      h.decoderLayers = t->decoder_layers();
      h.targetVocab = t->target_vocab();
      h.targetSeq = t->target_seq();
    }
    h.weight = t->weight();
    if (!(h.weight >= 0.0))
      fail(name, "task '" + h.name + "' has loss weight " +
                     std::to_string(h.weight) + again);
    plan.heads.push_back(h);
  }

  // Decisions: offloaded backbone blocks and heads; recompute comes as the
  // regions.
  for (const mtp::fb::Unit *u : *fb->units()) {
    if (u->decision() != mtp::fb::Decision::Offload)
      continue;
    std::string task = str(u->task());
    if (task.empty()) {
      int64_t block = u->block();
      if (block < 0 || block > 2 * plan.model.layers)
        fail(name, "unit '" + str(u->name()) + "' has block " +
                       std::to_string(block) + again);
      auto &units = plan.schedule.offloadUnits;
      if (units.empty() || units.back() != block)
        units.push_back(block);
      continue;
    }
    int64_t index = -1;
    for (size_t i = 0; i < plan.heads.size(); ++i)
      if (plan.heads[i].name == task)
        index = int64_t(i);
    if (index < 0)
      fail(name, "unit '" + str(u->name()) + "' belongs to no task '" + task +
                     "'" + again);
    auto &heads = plan.schedule.offloadHeadList;
    if (heads.empty() || heads.back() != index)
      heads.push_back(index);
  }
  if (fb->regions())
    for (const mtp::fb::Region *r : *fb->regions())
      plan.schedule.regions.emplace_back(r->first_block(), r->last_block());

  // The strategy and training settings the step runs with.
  auto lrOf = [&](const mtp::fb::LrSchedule *l, int64_t steps) {
    LrConfig c;
    c.lr = l->peak();
    const std::string kind = str(l->kind());
    c.schedule = kind == "cosine"   ? LrSchedule::Cosine
                 : kind == "linear" ? LrSchedule::Linear
                                    : LrSchedule::Constant;
    if (kind != "cosine" && kind != "linear" && kind != "constant")
      fail(name, "learning-rate schedule '" + kind + "' is unknown" + again);
    if (!(c.lr >= 0.0) || l->warmup() < 0)
      fail(name, "a learning-rate schedule is out of range" + again);
    c.warmupSteps = l->warmup();
    c.totalSteps = steps;
    return c;
  };
  if (const auto *tr = fb->train()) {
    plan.steps = tr->steps();
    plan.seed = tr->seed();
    plan.data = str(tr->data());
    plan.logEvery = tr->log_every();
    plan.saveEvery = tr->save_every();
    if (plan.steps < 1 || plan.logEvery < 1 || plan.saveEvery < 0)
      fail(name, "train has steps " + std::to_string(plan.steps) +
                     ", log_every " + std::to_string(plan.logEvery) + again);
    if (tr->lr())
      plan.train.backboneLr = lrOf(tr->lr(), plan.steps);
    plan.train.weightDecay = tr->weight_decay();
    plan.train.beta1 = tr->beta1();
    plan.train.beta2 = tr->beta2();
    plan.train.eps = tr->eps();
    for (const mtp::fb::Task *t : *fb->tasks()) {
      plan.train.headLr.push_back(t->lr() ? lrOf(t->lr(), plan.steps)
                                          : plan.train.backboneLr);
    }
  }
  if (const auto *st = fb->strategy()) {
    const std::string scope = str(st->scope());
    if (scope == "sum")
      plan.train.scope = GradScope::Sum;
    else if (scope == "params")
      plan.train.scope = GradScope::Params;
    else if (scope == "features")
      plan.train.scope = GradScope::Features;
    else
      fail(name, "gradient scope '" + scope + "' is unknown" + again);
    plan.train.paramsTopK = st->scope_layers();
    plan.train.gfmKeep = st->gfm_keep();
    plan.train.clipNorm = st->clip_max_norm();
    plan.train.gate = st->gate_hidden() > 0;
    if (plan.train.gate)
      plan.train.gateHidden = st->gate_hidden();
    plan.train.recalibrateReuse = st->recalibrate_reuse();
    plan.train.recalibrateStd = st->recalibrate_std();
    // The cosine matrix feeds the gate and its recalibration; without the
    // gate the probe would only cost time (and memory the plan did not count).
    plan.train.cosineEvery = plan.train.gate ? 1 : 0;
    if (!(plan.train.gfmKeep > 0.0 && plan.train.gfmKeep <= 1.0) ||
        !(plan.train.clipNorm >= 0.0) || plan.train.paramsTopK < 1 ||
        plan.train.paramsTopK > plan.model.layers)
      fail(name, "the strategy is out of range (gfm keep " +
                     std::to_string(plan.train.gfmKeep) + ", clip " +
                     std::to_string(plan.train.clipNorm) + ", scope layers " +
                     std::to_string(plan.train.paramsTopK) + ")" + again);
    plan.collective = str(st->collective());
    plan.compressTopK = st->topk();
    plan.compressDecay = st->decay();
    plan.compressBlock = st->block();
    plan.compressBits = st->bits();
    if (!(plan.compressTopK > 0.0 && plan.compressTopK <= 1.0) ||
        plan.compressBlock < 1)
      fail(name, "the compression settings are out of range" + again);
  }

  plan.predictedPeakBytes = fb->predicted_peak_bytes();
  plan.keepPeakBytes = fb->keep_peak_bytes();
  plan.uniformPeakBytes = fb->uniform_peak_bytes();
  plan.addedSeconds = fb->added_seconds();
  return plan;
}

Program programFromPlan(const Plan &plan) {
  if (plan.backboneKind != "transformer")
    throw std::runtime_error(
        "mtprt: the plan of model '" + plan.modelName + "' (from " +
        plan.source + ") has backbone kind '" + plan.backboneKind +
        "': this runtime builds 'transformer' backbones only; re-plan the "
        "spec with the mtpc that matches this runtime");
  Program p;
  p.name = plan.modelName;
  p.model = plan.model;
  p.heads = plan.heads;
  p.schedule = plan.schedule;
  p.predictedPeakBytes = plan.predictedPeakBytes;
  p.plannedProcesses = std::max<int64_t>(1, plan.gpus);
  p.model.device = plan.device == "cpu" || plan.device.empty() ? "cpu" : "cuda";
  p.model.seed = plan.seed;
  p.train = plan.train;
  p.steps = plan.steps;
  p.seed = plan.seed;
  p.logEvery = plan.logEvery;
  p.data = plan.data;
  // GSC by default where the spec asks for it (auto: when processes share
  // the gradients; one process exchanges nothing).
  p.compress = plan.collective == "compressed" || plan.collective == "auto";
  p.compressTopK = plan.compressTopK;
  p.compressDecay = plan.compressDecay;
  p.compressBlock = plan.compressBlock;
  p.compressBits = plan.compressBits;
  // train.save_every: the default of --checkpoint-every (checkpoints need
  // --checkpoint-dir).
  p.checkpointEvery = plan.saveEvery;
  p.train.precision = plan.precision == "bf16"   ? Precision::Bf16
                      : plan.precision == "fp16" ? Precision::Fp16
                                                 : Precision::Fp32;
  int64_t perStep = std::max<int64_t>(1, plan.microBatch * plan.gpus);
  p.batchSize = std::max(plan.globalBatch, perStep);
  p.train.microBatches = std::max<int64_t>(1, p.batchSize / perStep);
  return p;
}

Plan loadPlan(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail(path, "cannot open it; write one with `mtpc plan SPEC --format=fb -o " +
                   path + "`");
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  return readPlan(bytes.data(), bytes.size(), path);
}

} // namespace mtprt
