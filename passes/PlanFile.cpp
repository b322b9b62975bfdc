//===- PlanFile.cpp - the plan as a flatbuffer ----------------------------===//

#include "passes/PlanFile.h"
#include "passes/PipelinePlan.h"
#include "passes/Bytes.h"
#include "passes/CostModel.h"
#include "passes/MemoryAnalysis.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include "mtprt/Plan.h"
#include "mtprt/PlanFrame.h"
#include "schema/plan_generated.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace mtp;

namespace {
constexpr unsigned kPlanVersion = unsigned(fb::PlanVersion::Current);
static_assert(kPlanVersion == mtprt::kPlanVersion,
              "plan.fbs's PlanVersion and mtprt/PlanFrame.h's are one number");

// The schema's Decision is the dialect's, value for value.
static_assert(int(fb::Decision::Keep) == int(Decision::Keep) &&
              int(fb::Decision::Recompute) == int(Decision::Recompute) &&
              int(fb::Decision::Offload) == int(Decision::Offload) &&
              int(fb::Decision::MAX) == int(Decision::Offload));
// (Partial is a block's decision; its units carry keep and recompute.)

fb::Decision decisionOf(FwdOp op) {
  return static_cast<fb::Decision>(op.getDecision().value_or(Decision::Keep));
}

// The schema's other enums are the dialect's too, value for value, so one
// cast converts either way and the dialect's stringify names both.
#define MTP_SAME_ENUM(FB, ODS, FIRST, LAST)                                    \
  static_assert(int(fb::FB::MIN) == int(ODS::FIRST) &&                         \
                int(fb::FB::MAX) == int(ODS::LAST) &&                          \
                int(fb::FB::LAST) == int(ODS::LAST) &&                         \
                int(fb::FB::MAX) == int(getMaxEnumValFor##ODS()))
MTP_SAME_ENUM(BackboneKind, BackboneKind, transformer, bert);
MTP_SAME_ENUM(AttentionKind, AttentionKind, math, fused);
MTP_SAME_ENUM(PointwiseKind, PointwiseKind, aten, fused);
MTP_SAME_ENUM(HeadKind, HeadKind, classify, decoder);
MTP_SAME_ENUM(LossKind, LossKind, cross_entropy, mse);
MTP_SAME_ENUM(ScheduleKind, ScheduleKind, constant, cosine);
MTP_SAME_ENUM(Precision, Precision, fp32, fp16);
MTP_SAME_ENUM(UnitKind, UnitKind, embed, final_norm);
MTP_SAME_ENUM(CollectivePolicy, CollectivePolicy, automatic, compressed);
#undef MTP_SAME_ENUM
// GradientScope has one value more: sum (one task, no per-task pipeline).
static_assert(int(fb::GradientScope::features) ==
                  int(GradientScope::features) &&
              int(fb::GradientScope::params) == int(GradientScope::params) &&
              int(fb::GradientScope::sum) ==
                  int(getMaxEnumValForGradientScope()) + 1);

template <typename FbT, typename OdsT> FbT toFb(OdsT v) {
  return static_cast<FbT>(v);
}

llvm::StringRef str(const flatbuffers::String *s) {
  return s ? llvm::StringRef(s->c_str(), s->size()) : llvm::StringRef();
}

/// A path the spec wrote, relative to its folder: the plan (and a binary
/// built from it, which may run from anywhere) records it absolute.
std::string specRelative(StringRef source, StringRef written) {
  llvm::SmallString<256> path(written);
  if (!llvm::sys::path::is_absolute(path)) {
    llvm::SmallString<256> joined(llvm::sys::path::parent_path(source));
    llvm::sys::path::append(joined, path);
    llvm::sys::fs::make_absolute(joined);
    llvm::sys::path::remove_dots(joined, /*remove_dot_dot=*/true);
    path = joined;
  }
  return path.str().str();
}
} // namespace

std::string mtp::serializePlan(ModelOp model, const MemoryReport &report,
                               StringRef source) {
  flatbuffers::FlatBufferBuilder b;
  StepOp step = model.getStep();

  BackboneOp bb = model.getBackbone();
  auto weights = bb.getWeights()
                     ? b.CreateString(specRelative(source, *bb.getWeights()))
                     : flatbuffers::Offset<flatbuffers::String>();
  auto backbone = fb::CreateBackbone(
      b, toFb<fb::BackboneKind>(bb.getKind()),
      bb.getLayers(), bb.getHidden(), bb.getHeads(), bb.getFfn(),
      bb.getVocab(), bb.getSeq(), bb.getDropout().convertToDouble(),
      toFb<fb::AttentionKind>(CostModel(model).attention()),
      toFb<fb::PointwiseKind>(CostModel(model).pointwise()),
      bb.getPositions().value_or(0), bb.getNormEpsilon(), weights,
      bb.getKvHeads().value_or(0),
      bb.getRopeTheta() ? bb.getRopeTheta()->convertToDouble() : 10000.0,
      bb.getRopeScaling() ? b.CreateVector(bb.getRopeScaling()->vec())
                          : flatbuffers::Offset<flatbuffers::Vector<double>>(),
      !bb.hasAttentionBias(), !bb.hasMlpBias(),
      bb.isPostNorm() ? bb.getTypeVocabRows() : 0,
      bb.getPositionPad() ? int64_t(*bb.getPositionPad()) : -1,
      bb.getTokenPad() ? int64_t(*bb.getTokenPad()) : -1,
      bb.getFreeze() ? (*bb.getFreeze())[0] : -1,
      bb.getFreeze() ? (*bb.getFreeze())[1] : -1);

  auto lrOf = [&](LRScheduleAttr lr) -> flatbuffers::Offset<fb::LrSchedule> {
    if (!lr)
      return 0;
    return fb::CreateLrSchedule(
        b, toFb<fb::ScheduleKind>(lr.getKind()),
        lr.getPeak().convertToDouble(), lr.getWarmup());
  };
  std::vector<flatbuffers::Offset<fb::Task>> tasks;
  for (TaskOp t : model.getTasks())
    tasks.push_back(fb::CreateTask(
        b, b.CreateString(t.getSymName().str()),
        toFb<fb::HeadKind>(t.getHead()), t.getTapLayer(),
        t.getPooled(), t.getClasses().value_or(t.getLabels().value_or(0)),
        t.getLayers().value_or(0), t.getVocab().value_or(0),
        t.getTargetSeq().value_or(0), t.getWeight().convertToDouble(),
        toFb<fb::LossKind>(t.getLoss()),
        lrOf(t.getLrAttr())));

  std::vector<flatbuffers::Offset<fb::Unit>> units;
  for (const UnitMemory &unit : report.units) {
    FwdOp op = unit.op;
    StringRef task = op.getTaskAttr() ? op.getTaskAttr().getValue() : "";
    units.push_back(fb::CreateUnit(
        b, b.CreateString(op.getUnitName()),
        toFb<fb::UnitKind>(op.getUnit()), op.getLayer(),
        getBlockNumber(op.getUnit(), op.getLayer()), b.CreateString(task.str()), unit.savedBytes, op.getFlops(),
        decisionOf(op)));
  }

  StepPlanAttr stepPlan = step.getPlanAttr();
  std::vector<fb::Region> regions;
  std::vector<flatbuffers::Offset<fb::Offload>> offloads;
  if (stepPlan) {
    for (const PlanRegion &r : stepPlan.getRegions())
      regions.emplace_back(r.first, r.last);
    for (const PlanOffload &o : stepPlan.getOffloads())
      offloads.push_back(fb::CreateOffload(b, b.CreateString(o.unit.str()),
                                           o.bytes, o.stream, o.exposedWait));
  }

  std::vector<flatbuffers::Offset<fb::Bucket>> buckets;
  for (AllReduceOp op : step.getBody().front().getOps<AllReduceOp>()) {
    bool compressed = op.getCompressed();
    buckets.push_back(fb::CreateBucket(
        b, op.getElements(), compressed,
        compressed ? op.getTopk()->convertToDouble() : 1.0,
        compressed ? int64_t(*op.getBlock()) : 0,
        compressed ? int64_t(*op.getBits()) : 32,
        compressed ? op.getDecay()->convertToDouble() : 0.0));
  }

  flatbuffers::Offset<fb::Target> target;
  if (BudgetOp budget = model.getBudget())
    target = fb::CreateTarget(
        b, b.CreateString(budget.getDevice().str()),
        toFb<fb::Precision>(budget.getPrecision()),
        budget.getMemory(), budget.getUsableBytes(), budget.getGpus(),
        budget.getMicroBatch(), budget.getGlobalBatch(),
        budget.getZeroStage());

  auto batchSchedule = [&](BatchScheduleAttr attr) {
    if (!attr)
      return flatbuffers::Offset<fb::BatchSchedule>();
    const mtprt::BatchSchedule s = attr.getSchedule();
    return fb::CreateBatchSchedule(b, s.start, s.max, s.rate, s.rampSteps,
                                   s.decay, s.every, s.floor);
  };
  auto saps = [&](SapsAttr attr) {
    if (!attr)
      return flatbuffers::Offset<fb::Saps>();
    const mtprt::SapsConfig c = attr.getConfig();
    return fb::CreateSaps(b, c.fraction, c.every, c.lambda);
  };
  // D13: the bottleneck as normalized, each head's adapter owner with share.
  flatbuffers::Offset<fb::Adapters> adapters;
  // npd(regroup): report's peaks hold room for every split; the same
  // analysis with the groups unsplit is the other end the runtime predicts
  // between (Program::groupedPeakBytes).
  std::optional<MemoryReport> grouped;
  int64_t splitsResident = 0; // what every possible split holds throughout
  if (StrategyOp st = model.getStrategy(); st && st.getAdaptersAttr()) {
    const CostModel cost(model);
    std::optional<mtprt::AdapterConfig> c = cost.adapters();
    if (c->regroup) {
      // The step IR's heads hold every task's own adapter (weights and
      // AdamW state, resident); the analysis below sees only when the
      // gradients of the unsplit groups arrive.
      splitsResident = cost.adapterSplitsBytes();
      const AdaptersAttr planned = st.getAdaptersAttr();
      mtprt::AdapterConfig unsplit = planned.getConfig();
      unsplit.regroup = 0;
      st.setAdaptersAttr(AdaptersAttr::get(model.getContext(), unsplit));
      grouped = analyzeMemory(model);
      st.setAdaptersAttr(planned);
    }
    adapters = fb::CreateAdapters(
        b, st.getAdaptersAttr().getBottleneck(), c->separation,
        c->owner.empty() ? flatbuffers::Offset<flatbuffers::Vector<int64_t>>()
                         : b.CreateVector(c->owner),
        c->share.value_or(0.0), c->regroup,
        grouped ? std::max<int64_t>(
                      0, (stepPlan ? stepPlan.getPlannedPeakBytes()
                                   : report.peakBytes) -
                             splitsResident -
                             std::max<int64_t>(0, report.peakBytes -
                                                      grouped->peakBytes))
                : 0);
  }
  flatbuffers::Offset<fb::Strategy> strategy;
  if (StrategyOp st = model.getStrategy())
    strategy = fb::CreateStrategy(
        b, toFb<fb::GradientScope>(st.getGradientScope()),
        st.getScopeLayers(),
        st.getGfmKeep() ? st.getGfmKeep()->convertToDouble() : 1.0,
        st.getClip() == ClipPolicy::none
            ? 0.0
            : st.getClipMaxNorm().convertToDouble(),
        st.getDgfgHidden().value_or(0),
        st.getReuseThreshold().convertToDouble(),
        st.getSimStdThreshold().convertToDouble(),
        toFb<fb::CollectivePolicy>(st.getCollective()),
        st.getTopk().convertToDouble(), st.getQuantBlock(),
        st.getQuantBits(), st.getResidualDecay().convertToDouble(),
        batchSchedule(st.getDynamicBatchAttr()),
        saps(st.getSapsAttr()),
        st.getEwcAttr()
            ? fb::CreateEwc(b, st.getEwcAttr().getConfig().lambda,
                            st.getEwcAttr().getBatches(),
                            st.getEwcAttr().getConfig().threshold)
            : flatbuffers::Offset<fb::Ewc>(),
        adapters,
        st.getOptimizerOffload());
  flatbuffers::Offset<fb::Train> train;
  std::string data = "synthetic";
  if (TrainOp tr = model.getTrain(); tr && tr.getDataPath())
    data = specRelative(source, *tr.getDataPath());
  // Phases name their tasks by index into the plan's tasks.
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::Phase>>>
      phases;
  if (TrainOp tr = model.getTrain(); tr && tr.getPhasesAttr()) {
    SmallVector<StringRef> names;
    for (TaskOp t : model.getTasks())
      names.push_back(t.getSymName());
    std::vector<flatbuffers::Offset<fb::Phase>> list;
    const int64_t planned =
        stepPlan ? stepPlan.getPlannedPeakBytes() : report.peakBytes;
    for (auto [i, p] :
         llvm::enumerate(tr.getPhasesAttr().getAsRange<PhaseAttr>())) {
      std::vector<int64_t> tasks;
      for (FlatSymbolRefAttr t : p.getTasks())
        tasks.push_back(llvm::find(names, t.getValue()) - names.begin());
      const int64_t peak = i < report.phasePeakBytes.size()
                               ? std::min(planned, report.phasePeakBytes[i])
                               : 0;
      const int64_t groupedPeak =
          grouped && i < grouped->phasePeakBytes.size() && peak > 0
              ? std::max<int64_t>(
                    0, peak - splitsResident -
                           std::max<int64_t>(0, report.phasePeakBytes[i] -
                                                    grouped->phasePeakBytes[i]))
              : 0;
      list.push_back(fb::CreatePhase(b, p.getSteps(), b.CreateVector(tasks),
                                     peak, groupedPeak));
    }
    phases = b.CreateVector(list);
  }
  if (TrainOp tr = model.getTrain())
    train = fb::CreateTrain(
        b, tr.getSteps(), tr.getSeed(), b.CreateString(data),
        lrOf(tr.getLr()), tr.getWeightDecay().convertToDouble(),
        tr.getBeta1().convertToDouble(), tr.getBeta2().convertToDouble(),
        tr.getEps().convertToDouble(), tr.getLogEvery(), tr.getSaveEvery(),
        tr.getEvalPath()
            ? b.CreateString(specRelative(source, *tr.getEvalPath()))
            : flatbuffers::Offset<flatbuffers::String>(),
        tr.getEvalEvery().value_or(0), phases);

  // docs/pipeline.md: the stages; the plan's peak is the largest stage's.
  flatbuffers::Offset<fb::Pipeline> pipeline;
  std::optional<PipelinePlanResult> pipe = planPipeline(model);
  if (pipe) {
    std::vector<flatbuffers::Offset<fb::PipelineStage>> stages;
    for (const PipelineStagePlan &st : pipe->stages)
      stages.push_back(fb::CreatePipelineStage(
          b, st.firstUnit, st.lastUnit,
          b.CreateVector(std::vector<int64_t>(st.tasks.begin(),
                                              st.tasks.end())),
          st.parameters, st.peakBytes, st.inFlight, st.forwardSeconds,
          st.backwardSeconds));
    pipeline = fb::CreatePipeline(b, b.CreateVector(stages), pipe->gpipe,
                                  pipe->microBatches, pipe->bubble);
  }

  // Unplanned, the plan is the step as it stands: every activation kept.
  double addedSeconds =
      stepPlan ? stepPlan.getAddedSeconds().convertToDouble() : 0.0;
  auto plan = fb::CreatePlan(
      b, kPlanVersion, b.CreateString(model.getSymName().str()),
      b.CreateString(source.str()), target, backbone, b.CreateVector(tasks),
      b.CreateVector(units), b.CreateVectorOfStructs(regions),
      b.CreateVector(offloads), b.CreateVector(buckets),
      pipe ? pipe->peakBytes()
           : stepPlan ? stepPlan.getPlannedPeakBytes() : report.peakBytes,
      stepPlan ? stepPlan.getKeepPeakBytes() : report.peakBytes,
      stepPlan ? stepPlan.getUniformPeakBytes() : -1, addedSeconds, strategy,
      train, report.evalPeakBytes, report.evalBatch,
      report.steadyPeakBytes
          ? std::min<int64_t>(report.steadyPeakBytes,
                              stepPlan ? stepPlan.getPlannedPeakBytes()
                                       : report.peakBytes)
          : 0,
      pipeline);
  fb::FinishPlanBuffer(b, plan);
  return mtprt::framePlan(b.GetBufferPointer(), b.GetSize());
}

llvm::Error mtp::verifyPlanFile(StringRef bytes) {
  // The runtime's checks, so inspect accepts exactly what a run accepts.
  std::string why = mtprt::checkPlan(bytes.data(), bytes.size(), "plan");
  if (!why.empty())
    return llvm::createStringError(llvm::inconvertibleErrorCode(), why);
  return llvm::Error::success();
}

const fb::Plan *mtp::getPlan(StringRef verified) {
  return fb::GetPlan(reinterpret_cast<const uint8_t *>(verified.data()) +
                     mtprt::kPlanFrameBytes);
}

llvm::Error mtp::printPlanFile(StringRef bytes, llvm::raw_ostream &os) {
  if (llvm::Error err = verifyPlanFile(bytes))
    return err;
  const fb::Plan *plan = getPlan(bytes);

  os << "plan v" << plan->version() << " for model '" << str(plan->model())
     << "' from " << str(plan->source()) << "\n";
  if (const fb::Target *t = plan->target())
    os << "  target   " << str(t->device()) << ", " << planName(t->precision())
       << ", " << t->gpus() << " GPU(s), micro-batch " << t->micro_batch()
       << ", " << formatBytes(t->usable_bytes()) << " usable of "
       << formatBytes(t->memory_bytes())
       << (t->zero() ? ", ZeRO " + std::to_string(t->zero()) : std::string())
       << "\n";
  if (const fb::Backbone *bb = plan->backbone()) {
    os << "  backbone " << planName(bb->kind()) << ": " << bb->layers()
       << " layers, hidden " << bb->hidden() << ", " << bb->heads()
       << " heads, ffn " << bb->ffn() << ", vocab " << bb->vocab() << ", seq "
       << bb->seq() << ", dropout " << llvm::format("%g", bb->dropout())
       << ", attention " << planName(bb->attention()) << ", pointwise "
       << planName(bb->pointwise());
    if (bb->positions())
      os << ", positions " << bb->positions();
    if (bb->norm_eps() != 1e-5)
      os << ", norm eps " << llvm::format("%g", bb->norm_eps());
    if (bb->weights() && bb->weights()->size())
      os << ", weights " << str(bb->weights());
    os << "\n";
  }
  if (plan->tasks())
    for (const fb::Task *t : *plan->tasks())
      os << "  task     " << str(t->name()) << ": " << planName(t->head())
         << " from " << (t->pooled() ? "pooled " : "") << "layer "
         << t->tap_layer() << ", weight " << llvm::format("%g", t->weight())
         << "\n";
  auto lr = [](const fb::LrSchedule *l) {
    return llvm::formatv("{0}({1}, warmup = {2})", planName(l->kind()),
                         llvm::format("%g", l->peak()), l->warmup())
        .str();
  };
  if (const fb::Strategy *st = plan->strategy()) {
    os << "  strategy scope " << planName(st->scope()) << ", GFM keep "
       << llvm::format("%g", st->gfm_keep()) << ", clip "
       << llvm::format("%g", st->clip_max_norm()) << ", DGFG "
       << (st->gate_hidden() ? llvm::Twine(st->gate_hidden()).str()
                             : std::string("off"))
       << ", collective " << planName(st->collective()) << " (top-k "
       << llvm::format("%g", st->topk()) << ", " << st->bits()
       << "-bit blocks of " << st->block() << ")"
       << (st->optimizer_offload() ? ", optimizer on the host" : "") << "\n";
    if (const fb::BatchSchedule *db = st->dynamic_batch())
      os << "  dynamic batch from " << db->start() << " x(1 + "
         << llvm::format("%g", db->rate()) << " step) capped at " << db->max()
         << " for " << db->ramp_steps() << " steps, then x"
         << llvm::format("%g", db->decay()) << " every " << db->every()
         << " steps, floor " << db->floor() << "\n";
    if (const fb::Adapters *ad = st->adapters()) {
      os << "  adapters bottleneck " << ad->bottleneck()
         << " per task at its tap, gate separation "
         << llvm::format("%g", ad->separation());
      // npd(share): which heads read an earlier head's adapter.
      if (const auto *owners = ad->owners())
        for (flatbuffers::uoffset_t i = 0; i < owners->size(); ++i)
          if (owners->Get(i) != int64_t(i))
            os << "; head " << i << " reads head " << owners->Get(i) << "'s";
      if (ad->regroup())
        os << "; split below " << llvm::format("%g", ad->share())
           << " every " << ad->regroup() << " steps";
      os << "\n";
    }
    if (const fb::Ewc *ew = st->ewc())
      os << "  ewc      lambda " << llvm::format("%g", ew->lambda())
         << ", the Fisher on " << ew->fisher_batches()
         << " batches at each phase's end"
         << (ew->threshold() >= -1
                 ? (" where a task similarity to the next phase's exceeds " +
                    llvm::formatv("{0}", ew->threshold()).str())
                 : std::string())
         << "\n";
    if (const fb::Saps *sp = st->saps())
      os << "  saps     top " << llvm::format("%g", 100 * sp->fraction())
         << "% of each backbone tensor by |w*g| + "
         << llvm::format("%g", sp->lambda()) << " g^2, re-ranked every "
         << sp->every() << " steps\n";
  }
  if (const fb::Train *tr = plan->train()) {
    os << "  train    " << tr->steps() << " steps, seed " << tr->seed()
       << ", data " << str(tr->data());
    if (tr->lr())
      os << ", lr " << lr(tr->lr());
    os << ", log every " << tr->log_every() << "\n";
    if (tr->phases()) {
      os << "  phases  ";
      for (const fb::Phase *p : *tr->phases()) {
        os << " " << p->steps() << " steps on";
        if (p->tasks())
          for (int64_t t : *p->tasks())
            os << " " << (plan->tasks() && t >= 0 && t < int64_t(plan->tasks()->size())
                              ? str(plan->tasks()->Get(t)->name()).str()
                              : "#" + std::to_string(t));
        if (p->predicted_peak_bytes())
          os << " (peak " << p->predicted_peak_bytes() << " B)";
        os << ";";
      }
      os << "\n";
    }
  }
  if (plan->units()) {
    os << "  units    (name, saved bytes, decision)\n";
    for (const fb::Unit *u : *plan->units()) {
      std::string name = str(u->name()).str();
      if (u->task() && u->task()->size())
        name += " @" + str(u->task()).str();
      os << llvm::formatv("    {0,-24} {1,12}  {2}\n", name, u->saved_bytes(),
                          planName(u->decision()));
    }
  }
  if (plan->regions() && plan->regions()->size()) {
    os << "  regions ";
    for (const fb::Region *r : *plan->regions())
      os << " [" << r->first_block() << ", " << r->last_block() << "]";
    os << " (runtime block numbers)\n";
  }
  if (plan->offloads())
    for (const fb::Offload *o : *plan->offloads())
      os << "  offload  " << str(o->unit()) << ": " << o->bytes()
         << " B on stream " << o->stream() << ", exposed wait "
         << llvm::formatv("{0:f1} us", o->exposed_wait_s() * 1e6) << "\n";
  if (plan->buckets()) {
    // Runs of equal buckets (one per layer) print as one line.
    auto same = [](const fb::Bucket *a, const fb::Bucket *b) {
      return a->elements() == b->elements() &&
             a->compressed() == b->compressed() && a->topk() == b->topk() &&
             a->block() == b->block() && a->bits() == b->bits() &&
             a->decay() == b->decay();
    };
    const auto &buckets = *plan->buckets();
    for (unsigned i = 0, e = buckets.size(); i < e;) {
      const fb::Bucket *bk = buckets.Get(i);
      unsigned run = 1;
      while (i + run < e && same(bk, buckets.Get(i + run)))
        ++run;
      os << "  bucket   " << bk->elements() << " values";
      if (run > 1)
        os << " x" << run;
      if (bk->compressed())
        os << ", compressed: top-k " << llvm::format("%g", bk->topk()) << ", "
           << bk->bits() << "-bit blocks of " << bk->block() << ", decay "
           << llvm::format("%g", bk->decay());
      os << "\n";
      i += run;
    }
  }
  os << "  peak     " << plan->predicted_peak_bytes() << " B predicted ("
     << formatBytes(plan->predicted_peak_bytes()) << "); keeping everything "
     << formatBytes(plan->keep_peak_bytes());
  if (plan->uniform_peak_bytes() >= 0)
    os << ", uniform checkpointing " << formatBytes(plan->uniform_peak_bytes());
  os << "; added "
     << llvm::formatv("{0:f3} ms", plan->added_seconds() * 1e3) << " per step\n";
  if (const fb::Pipeline *pp = plan->pipeline()) {
    os << "  pipeline " << pp->stages()->size() << " stages, "
       << (pp->gpipe() ? "GPipe" : "1F1B") << ", " << pp->micro_batches()
       << " micro-batches, bubble " << llvm::format("%.3f", pp->bubble())
       << "\n";
    for (auto [s, st] : llvm::enumerate(*pp->stages())) {
      os << "    stage " << s << ": units " << st->first_unit() << ".."
         << st->last_unit() << ", tasks [";
      for (auto [i, t] : llvm::enumerate(*st->tasks()))
        os << (i ? " " : "") << t;
      os << "], " << st->parameters() << " parameters, "
         << st->predicted_peak_bytes() << " B predicted, " << st->in_flight()
         << " in flight\n";
    }
  }
  if (plan->steady_peak_bytes() > 0)
    os << "  steady   " << plan->steady_peak_bytes()
       << " B predicted at steps that do not re-rank (saps)\n";
  if (plan->eval_peak_bytes() > 0)
    os << "  eval     " << plan->eval_peak_bytes() << " B predicted ("
       << formatBytes(plan->eval_peak_bytes())
       << ") for held-out evaluation (forward only) in batches of "
       << plan->eval_batch() << "\n";
  return llvm::Error::success();
}

// A verified plan's enums are in range (mtprt::readPlan checks them), and
// each is its ODS twin's value (the static_asserts above).
#define MTP_PLAN_NAME(E)                                                       \
  llvm::StringRef mtp::planName(fb::E v) {                                     \
    return stringify##E(static_cast<E>(v));                                    \
  }
MTP_PLAN_NAME(Decision)
MTP_PLAN_NAME(BackboneKind)
MTP_PLAN_NAME(AttentionKind)
MTP_PLAN_NAME(PointwiseKind)
MTP_PLAN_NAME(HeadKind)
MTP_PLAN_NAME(LossKind)
MTP_PLAN_NAME(ScheduleKind)
MTP_PLAN_NAME(Precision)
MTP_PLAN_NAME(UnitKind)
MTP_PLAN_NAME(CollectivePolicy)
#undef MTP_PLAN_NAME
llvm::StringRef mtp::planName(fb::GradientScope v) {
  return v == fb::GradientScope::sum
             ? "sum"
             : stringifyGradientScope(static_cast<GradientScope>(v));
}
