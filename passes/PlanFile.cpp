//===- PlanFile.cpp - the plan as a flatbuffer ----------------------------===//

#include "passes/PlanFile.h"
#include "passes/Bytes.h"

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

int64_t stepInt(StepOp step, StringRef name, int64_t otherwise) {
  auto attr = step->getAttrOfType<IntegerAttr>(name);
  return attr ? attr.getInt() : otherwise;
}

fb::Decision decisionOf(FwdOp op) {
  auto d = op->getAttrOfType<StringAttr>("mtp.decision");
  if (!d)
    return fb::Decision::Keep;
  if (d.getValue() == "recompute")
    return fb::Decision::Recompute;
  if (d.getValue() == "offload")
    return fb::Decision::Offload;
  return fb::Decision::Keep;
}

llvm::StringRef str(const flatbuffers::String *s) {
  return s ? llvm::StringRef(s->c_str(), s->size()) : llvm::StringRef();
}
} // namespace

std::string mtp::serializePlan(ModelOp model, const MemoryReport &report,
                               StringRef source) {
  flatbuffers::FlatBufferBuilder b;
  StepOp step = model.getStep();

  BackboneOp bb = model.getBackbone();
  auto backbone = fb::CreateBackbone(
      b, b.CreateString(stringifyBackboneKind(bb.getKind()).str()),
      bb.getLayers(), bb.getHidden(), bb.getHeads(), bb.getFfn(),
      bb.getVocab(), bb.getSeq(), bb.getDropout().convertToDouble());

  auto lrOf = [&](LRScheduleAttr lr) -> flatbuffers::Offset<fb::LrSchedule> {
    if (!lr)
      return 0;
    return fb::CreateLrSchedule(
        b, b.CreateString(stringifyScheduleKind(lr.getKind()).str()),
        lr.getPeak().convertToDouble(), lr.getWarmup());
  };
  std::vector<flatbuffers::Offset<fb::Task>> tasks;
  for (TaskOp t : model.getTasks())
    tasks.push_back(fb::CreateTask(
        b, b.CreateString(t.getSymName().str()),
        b.CreateString(stringifyHeadKind(t.getHead()).str()), t.getTapLayer(),
        t.getPooled(), t.getClasses().value_or(t.getLabels().value_or(0)),
        t.getLayers().value_or(0), t.getVocab().value_or(0),
        t.getTargetSeq().value_or(0), t.getWeight().convertToDouble(),
        b.CreateString(stringifyLossKind(t.getLoss()).str()),
        lrOf(t.getLrAttr())));

  std::vector<flatbuffers::Offset<fb::Unit>> units;
  for (const UnitMemory &unit : report.units) {
    FwdOp op = unit.op;
    StringRef task = op.getTaskAttr() ? op.getTaskAttr().getValue() : "";
    units.push_back(fb::CreateUnit(
        b, b.CreateString(op.getUnitName()),
        b.CreateString(stringifyUnitKind(op.getUnit()).str()), op.getLayer(),
        getBlockNumber(op.getUnit(), op.getLayer()), b.CreateString(task.str()), unit.savedBytes, op.getFlops(),
        decisionOf(op)));
  }

  std::vector<fb::Region> regions;
  if (auto attr = step->getAttrOfType<ArrayAttr>("mtp.regions"))
    for (Attribute r : attr) {
      auto range = cast<DenseI64ArrayAttr>(r).asArrayRef();
      regions.emplace_back(range[0], range[1]);
    }

  std::vector<flatbuffers::Offset<fb::Offload>> offloads;
  if (auto schedule = step->getAttrOfType<ArrayAttr>("mtp.offload_schedule"))
    for (Attribute a : schedule) {
      auto entry = cast<DictionaryAttr>(a);
      offloads.push_back(fb::CreateOffload(
          b, b.CreateString(cast<StringAttr>(entry.get("unit")).str()),
          cast<IntegerAttr>(entry.get("bytes")).getInt(),
          cast<IntegerAttr>(entry.get("stream")).getInt(),
          cast<FloatAttr>(entry.get("exposed_wait_s")).getValueAsDouble()));
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
        b.CreateString(stringifyPrecision(budget.getPrecision()).str()),
        budget.getMemory(), budget.getUsableBytes(), budget.getGpus(),
        budget.getMicroBatch(), budget.getGlobalBatch());

  flatbuffers::Offset<fb::Strategy> strategy;
  if (StrategyOp st = model.getStrategy())
    strategy = fb::CreateStrategy(
        b, b.CreateString(stringifyGradientScope(st.getGradientScope()).str()),
        st.getScopeLayers(),
        st.getGfmKeep() ? st.getGfmKeep()->convertToDouble() : 1.0,
        st.getClip() == ClipPolicy::none
            ? 0.0
            : st.getClipMaxNorm().convertToDouble(),
        st.getDgfgHidden().value_or(0),
        st.getReuseThreshold().convertToDouble(),
        st.getSimStdThreshold().convertToDouble(),
        b.CreateString(stringifyCollectivePolicy(st.getCollective()).str()),
        st.getTopk().convertToDouble(), st.getQuantBlock(),
        st.getQuantBits(), st.getResidualDecay().convertToDouble());
  flatbuffers::Offset<fb::Train> train;
  // A relative data path is the spec's: the plan (and a binary built from
  // it, which may run from anywhere) records it absolute.
  std::string data = "synthetic";
  if (TrainOp tr = model.getTrain(); tr && tr.getDataPath()) {
    llvm::SmallString<256> path(*tr.getDataPath());
    if (!llvm::sys::path::is_absolute(path)) {
      llvm::SmallString<256> joined(llvm::sys::path::parent_path(source));
      llvm::sys::path::append(joined, path);
      llvm::sys::fs::make_absolute(joined);
      llvm::sys::path::remove_dots(joined, /*remove_dot_dot=*/true);
      path = joined;
    }
    data = path.str().str();
  }
  if (TrainOp tr = model.getTrain())
    train = fb::CreateTrain(
        b, tr.getSteps(), tr.getSeed(), b.CreateString(data),
        lrOf(tr.getLr()), tr.getWeightDecay().convertToDouble(),
        tr.getBeta1().convertToDouble(), tr.getBeta2().convertToDouble(),
        tr.getEps().convertToDouble(), tr.getLogEvery(), tr.getSaveEvery());

  auto added = step->getAttrOfType<FloatAttr>("mtp.added_seconds");
  double addedSeconds = added ? added.getValueAsDouble() : 0.0;
  auto plan = fb::CreatePlan(
      b, kPlanVersion, b.CreateString(model.getSymName().str()),
      b.CreateString(source.str()), target, backbone, b.CreateVector(tasks),
      b.CreateVector(units), b.CreateVectorOfStructs(regions),
      b.CreateVector(offloads), b.CreateVector(buckets),
      stepInt(step, "mtp.planned_peak_bytes", report.peakBytes),
      stepInt(step, "mtp.keep_peak_bytes", report.peakBytes),
      stepInt(step, "mtp.uniform_peak_bytes", -1), addedSeconds, strategy,
      train);
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
    os << "  target   " << str(t->device()) << ", " << str(t->precision())
       << ", " << t->gpus() << " GPU(s), micro-batch " << t->micro_batch()
       << ", " << formatBytes(t->usable_bytes()) << " usable of "
       << formatBytes(t->memory_bytes()) << "\n";
  if (const fb::Backbone *bb = plan->backbone())
    os << "  backbone " << str(bb->kind()) << ": " << bb->layers()
       << " layers, hidden " << bb->hidden() << ", " << bb->heads()
       << " heads, ffn " << bb->ffn() << ", vocab " << bb->vocab() << ", seq "
       << bb->seq() << ", dropout " << llvm::format("%g", bb->dropout())
       << "\n";
  if (plan->tasks())
    for (const fb::Task *t : *plan->tasks())
      os << "  task     " << str(t->name()) << ": " << str(t->head())
         << " from " << (t->pooled() ? "pooled " : "") << "layer "
         << t->tap_layer() << ", weight " << llvm::format("%g", t->weight())
         << "\n";
  auto lr = [](const fb::LrSchedule *l) {
    return llvm::formatv("{0}({1}, warmup = {2})", str(l->kind()),
                         llvm::format("%g", l->peak()), l->warmup())
        .str();
  };
  if (const fb::Strategy *st = plan->strategy()) {
    os << "  strategy scope " << str(st->scope()) << ", GFM keep "
       << llvm::format("%g", st->gfm_keep()) << ", clip "
       << llvm::format("%g", st->clip_max_norm()) << ", DGFG "
       << (st->gate_hidden() ? llvm::Twine(st->gate_hidden()).str()
                             : std::string("off"))
       << ", collective " << str(st->collective()) << " (top-k "
       << llvm::format("%g", st->topk()) << ", " << st->bits()
       << "-bit blocks of " << st->block() << ")\n";
  }
  if (const fb::Train *tr = plan->train()) {
    os << "  train    " << tr->steps() << " steps, seed " << tr->seed()
       << ", data " << str(tr->data());
    if (tr->lr())
      os << ", lr " << lr(tr->lr());
    os << ", log every " << tr->log_every() << "\n";
  }
  if (plan->units()) {
    os << "  units    (name, saved bytes, decision)\n";
    for (const fb::Unit *u : *plan->units()) {
      std::string name = str(u->name()).str();
      if (u->task() && u->task()->size())
        name += " @" + str(u->task()).str();
      os << llvm::formatv("    {0,-24} {1,12}  {2}\n", name, u->saved_bytes(),
                          fb::EnumNameDecision(u->decision()));
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
  return llvm::Error::success();
}
