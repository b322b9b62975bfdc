//===- MemoryAnalysis.cpp - peak memory of a step, by liveness ------------===//
//
// The step is straight-line SSA, so liveness is exact: a value is allocated
// by its defining op and freed after its last user. Parameters and optimizer
// state are resident; a group's gradients appear at its first backward unit
// and stay until the optimizer step. While a unit runs, its workspace comes
// on top. Tasks: a backbone unit of layer l serves every task reading layer
// l or above (their gradients flow through it); a head or loss serves its
// task.
//
//===----------------------------------------------------------------------===//

#include "passes/MemoryAnalysis.h"
#include "mtprt/Zero.h"
#include "passes/Bytes.h"
#include "passes/CostModel.h"
#include "passes/StepTimeline.h"

#include "llvm/ADT/DenseSet.h"
#include "passes/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Format.h"

namespace mtp {
#define GEN_PASS_DEF_MEMORYANALYSIS
#include "passes/Passes.h.inc"
} // namespace mtp

using namespace mlir;
using namespace mtp;

std::string MemoryReport::describe(Operation *op) {
  if (!op)
    return "-";
  std::string text;
  llvm::raw_string_ostream os(text);
  if (std::optional<UnitRef> unit = getUnitRef(op)) {
    os << (isa<FwdOp>(op) ? "fwd " : "bwd ") << stringifyUnitKind(unit->kind);
    if (unit->task)
      os << " @" << unit->task.getValue();
    else
      os << '[' << unit->layer << ']';
  } else {
    os << op->getName().getStringRef();
  }
  return text;
}

ParameterGroups mtp::parameterGroups(StepOp step) {
  ParameterGroups groups;
  std::optional<mtprt::SapsConfig> saps;
  bool ewc = false;
  if (auto model = step->getParentOfType<ModelOp>())
    if (StrategyOp s = model.getStrategy()) {
      if (s.getSapsAttr())
        saps = s.getSapsAttr().getConfig();
      ewc = bool(s.getEwcAttr());
    }
  for (WeightsOp w : step.getBody().front().getOps<WeightsOp>()) {
    groups.total += w.getParams();
    if (w.getFrozen())
      continue;
    groups.trainable += w.getParams();
    // SAPS manages the backbone's groups (embeddings, layers); the runtime
    // rounds per tensor, this per group: a byte or two per tensor apart.
    if (w.getTask() || w.getGroup() == "head" || w.getGroup() == "gate")
      continue;
    if (saps) {
      groups.sparse += w.getParams();
      groups.selected += saps->selected(w.getParams());
    }
    if (ewc)
      groups.protectedByEwc += w.getParams();
  }
  return groups;
}

int64_t mtp::fuseWorkspaceBeyondResults(
    FuseTaskGradsOp fuse, const CostModel &cost,
    ArrayRef<std::pair<int64_t, int64_t>> regions, bool laterMicroBatch,
    std::optional<int64_t> workspaceOverride, ArrayRef<int64_t> partials) {
  int64_t results = 0;
  for (Value v : fuse.getFused())
    results += CostModel::bytes(v.getType());
  int64_t workspace = workspaceOverride.value_or(fuse.getWorkspace());
  if (fuse.getScope() == GradientScope::features) {
    if (laterMicroBatch) {
      // GFM's spectrum beside the processed copy of the widest gradient
      // (FuseTaskGradients' elementwise part); no probe.
      workspace = CostModel::gfmWorkspace(
          llvm::to_vector(fuse.getGrads().getTypes()));
    } else {
      workspace =
          std::max(workspace, cost.cosineProbeWorkspace(regions, partials));
    }
  }
  return std::max<int64_t>(0, workspace - results);
}

int64_t mtp::zeroValues(StepOp step) {
  int64_t values = 0;
  for (AllReduceOp op : step.getBody().front().getOps<AllReduceOp>())
    values += op.getElements();
  return values;
}

int64_t mtp::adamwStateBytes(ModelOp model) {
  BudgetOp budget = model.getBudget();
  const int64_t world =
      budget && budget.getZeroStage() ? int64_t(budget.getGpus()) : 1;
  return mtprt::ZeroLayout::stateBytes(zeroValues(model.getStep()), world);
}

MemoryBreakdown mtp::residentState(ModelOp model, const CostModel &cost,
                                   int64_t heldMicroBatches) {
  StepOp step = model.getStep();
  const ParameterGroups groups = parameterGroups(step);
  MemoryBreakdown resident;
  // 16-bit projections take 2 of the 4 bytes (their masters are the
  // host's).
  resident.parameters = CostModel::kWeightBytes * groups.total -
                        2 * cost.halfProjectionValues();
  resident.optimizer =
      CostModel::kOptimizerBytes * (groups.trainable - groups.sparse) +
      mtprt::SapsConfig::kBytesPerSelected * groups.selected +
      mtprt::EwcConfig::kBytesPerParameter * groups.protectedByEwc;
  // ZeRO: each rank holds AdamW's moments of its run of the exchanged
  // values only (the gate's own Adam stays whole).
  // Offloaded, that state is the host's.
  if (cost.zeroStage() >= 1 || cost.optimizerOffload()) {
    resident.optimizer -= CostModel::kOptimizerBytes * zeroValues(step);
    if (!cost.optimizerOffload())
      resident.optimizer += adamwStateBytes(model);
  }
  // ZeRO 3: this rank's run of every value instead of the backbone's
  // trainable blocks (StepTimeline gathers a block where it runs).
  if (cost.zeroStage() >= 3) {
    resident.parameters -= cost.shardedBlocks().total;
    resident.parameters +=
        CostModel::kWeightBytes *
        mtprt::ZeroLayout::shardValues(zeroValues(step), cost.processes());
  }
  resident.exchange =
      cost.gradientExchange(
              llvm::to_vector(step.getBody().front().getOps<AllReduceOp>()))
          .resident;
  for (InputOp in : step.getBody().front().getOps<InputOp>())
    resident.activations += heldMicroBatches * CostModel::bytes(in.getType());
  return resident;
}

std::vector<std::pair<int64_t, int64_t>> mtp::checkpointRegions(StepOp step) {
  std::vector<std::pair<int64_t, int64_t>> regions;
  for (CheckpointOp region : step.getBody().front().getOps<CheckpointOp>()) {
    int64_t first = INT64_MAX, last = -1;
    region.getBody().walk([&](FwdOp fwd) {
      int64_t b = getBlockNumber(fwd.getUnit(), fwd.getLayer());
      if (b > 0)
        first = std::min(first, b), last = std::max(last, b);
    });
    if (last > 0)
      regions.push_back({first, last});
  }
  return regions;
}

SmallVector<int64_t> mtp::tensorGrainBlocks(StepOp step) {
  SmallVector<int64_t> blocks;
  for (FwdOp fwd : step.getBody().front().getOps<FwdOp>())
    if (fwd.getDecision() == Decision::Recompute && !fwd.getRegion() &&
        !fwd.getTaskAttr()) {
      const int64_t b = getBlockNumber(fwd.getUnit(), fwd.getLayer());
      if (blocks.empty() || blocks.back() != b)
        blocks.push_back(b);
    }
  return blocks;
}

MemoryReport mtp::analyzeMemory(ModelOp model) {
  StepOp step = model.getStep();
  CostModel cost(model);
  MemoryReport report;
  const std::vector<std::pair<int64_t, int64_t>> regions =
      checkpointRegions(step);
  const SmallVector<int64_t> partials = tensorGrainBlocks(step);

  // Which tasks each backbone layer serves.
  SmallVector<TaskOp> tasks(model.getTasks());
  auto servedBy = [&](Operation *op) {
    SmallVector<StringRef> served;
    std::optional<UnitRef> unit = getUnitRef(op);
    if (!unit)
      return served;
    if (unit->task) {
      served.push_back(unit->task.getValue());
      return served;
    }
    for (TaskOp t : tasks)
      if (unit->kind == UnitKind::embed || t.getTapLayer() >= unit->layer)
        served.push_back(t.getSymName());
    return served;
  };

  // The step in execution order, checkpoint and recompute bodies inline
  // (a region op, then its units, then its yield).
  SmallVector<Operation *> order;
  step.getBody().walk<WalkOrder::PreOrder>([&](Operation *op) {
    if (op != step)
      order.push_back(op);
  });
  llvm::DenseMap<Operation *, unsigned> position;
  for (auto [i, op] : llvm::enumerate(order))
    position[op] = i;
  // A region op's results are its yielded values handed out: no new
  // allocation, but the yielded value lives until the result's last use.
  llvm::DenseMap<Value, Value> aliasOf; // result -> yielded value
  for (Operation *op : order) {
    if (auto yield = dyn_cast<YieldOp>(op))
      for (auto [v, r] :
           llvm::zip(yield.getValues(), yield->getParentOp()->getResults()))
        aliasOf[r] = v;
    // A backward's aliased gradients are its incoming one.
    if (auto bwd = dyn_cast<BwdOp>(op))
      for (Value g : bwd.getInputGrads().take_front(bwd.getAliases()))
        aliasOf[g] = bwd.getGrads().front();
  }
  auto isForwardValue = [](Value v) {
    return isa_and_nonnull<FwdOp, InputOp, PrefetchOp>(v.getDefiningOp());
  };
  // Each device value lives from its op to its last use; host copies
  // (mtp.offload) are not device memory. Ops in `skipped` do not run (a
  // phase's other tasks): they neither make values nor use them; a use by
  // one in `held` (a backward above a phase's top tap) holds the value to
  // the step's end.
  using OpSet = llvm::DenseSet<Operation *>;
  auto liveOn = [&](const StepTimeline &timeline, const OpSet &skipped,
                    const OpSet &held) {
    auto lastUse = [&](Value v, auto &self) -> unsigned {
      unsigned last = position[v.getDefiningOp()];
      for (Operation *user : v.getUsers()) {
        if (held.contains(user))
          last = unsigned(order.size() - 1);
        if (skipped.contains(user))
          continue;
        last = std::max(last, position[user]);
        if (auto yield = dyn_cast<YieldOp>(user))
          for (auto [yv, r] : llvm::zip(yield.getValues(),
                                        yield->getParentOp()->getResults()))
            if (yv == v)
              last = std::max(last, self(r, self));
        // An aliased input gradient is this incoming one (not a saved
        // operand).
        if (auto bwd = dyn_cast<BwdOp>(user);
            bwd && bwd.getAliases() && bwd.getGrads().front() == v)
          for (Value g : bwd.getInputGrads().take_front(bwd.getAliases()))
            last = std::max(last, self(g, self));
      }
      return last;
    };
    StepTimeline::Live live = timeline.live();
    for (Operation *op : order)
      if (!skipped.contains(op))
        for (Value result : op->getResults()) {
          if (aliasOf.count(result) || isa<OffloadOp>(op))
            continue;
          // A gradient only skipped ops read (an absent task's fused one)
          // is never made.
          if (!isForwardValue(result) && !result.use_empty() &&
              llvm::all_of(result.getUsers(), [&](Operation *u) {
                return skipped.contains(u);
              }))
            continue;
          live.add(position[op], lastUse(result, lastUse),
                   CostModel::bytes(result.getType()), isForwardValue(result));
        }
    return live;
  };
  StepTimeline timeline(model, cost, order);
  StepTimeline::Live live = liveOn(timeline, OpSet(), OpSet());
  StepTimeline::Peak peak = timeline.peak(live, regions, partials);
  report.peakBytes = peak.bytes;
  report.peakOp = peak.position >= 0 ? timeline.at(peak.position) : nullptr;
  report.atPeak = peak.at;
  if (cost.saps())
    report.steadyPeakBytes =
        StepTimeline(model, cost, order, /*sapsRerank=*/false)
            .peak(live, regions, partials)
            .bytes;
  // train { phases }: a phase's step runs without the other tasks' heads,
  // losses and their gradients — the same step with their ops left out
  // (their positions kept, empty), values living to their last kept use.
  if (TrainOp train = model.getTrain(); train && train.getPhasesAttr())
    for (PhaseAttr phase : train.getPhasesAttr().getAsRange<PhaseAttr>()) {
      // The backward stops at the phase's top tap: the backbone's backward
      // units and re-runs above it do not run, and what they would read
      // stays held to the step's end (the forward still runs up to every
      // task's tap; the trainer holds the taps, so their graphs, until the
      // micro-batch ends).
      int64_t top = 0;
      for (TaskOp t : tasks)
        if (llvm::any_of(phase.getTasks(), [&](FlatSymbolRefAttr n) {
              return n.getValue() == t.getSymName();
            }))
          top = std::max<int64_t>(top, t.getTapLayer());
      auto aboveTop = [&](Operation *op) {
        if (auto bwd = dyn_cast<BwdOp>(op))
          return !bwd.getTaskAttr() && int64_t(bwd.getLayer()) > top &&
                 bwd.getUnit() != UnitKind::final_norm;
        if (auto re = op->getParentOfType<RecomputeOp>())
          op = re;
        if (auto re = dyn_cast<RecomputeOp>(op)) {
          bool above = true;
          re.getBody().walk([&](FwdOp fwd) {
            above = above && int64_t(fwd.getLayer()) > top;
          });
          return above;
        }
        return false;
      };
      OpSet dropped, held;
      for (Operation *op : order) {
        std::optional<UnitRef> unit = getUnitRef(op);
        bool drop = unit && unit->task &&
                    !llvm::is_contained(phase.getTasks(), unit->task);
        if (!drop && aboveTop(op)) {
          drop = true;
          held.insert(op);
        }
        if (isa<OffloadOp, PrefetchOp>(op))
          drop = drop || llvm::any_of(op->getOperands(), [&](Value v) {
            return dropped.contains(v.getDefiningOp());
          });
        if (drop)
          dropped.insert(op);
      }
      // A gradient sum only dropped units read (the residual stream above
      // the top tap) is never made either.
      for (Operation *op : llvm::reverse(order))
        if (isa_and_nonnull<AddGradsOp>(op) && !op->use_empty() &&
            llvm::all_of(op->getUsers(), [&](Operation *u) {
              return dropped.contains(u);
            }))
          dropped.insert(op);
      SmallVector<Operation *> kept(order.begin(), order.end());
      for (Operation *&op : kept)
        if (dropped.contains(op))
          op = nullptr;
      // The probe compares the phase's tasks alone; the pipeline's
      // workspace is over their gradients.
      CostModel phaseCost(model);
      phaseCost.onlyTasks(phase.getTasks());
      StepTimeline phaseTimeline(model, phaseCost, kept);
      // Later micro-batches hold the gradients the phase makes, not every
      // parameter's (the gate's own too).
      int64_t gate = 0;
      for (WeightsOp w : step.getBody().front().getOps<WeightsOp>())
        if (w.getGroup() == "gate")
          gate += CostModel::kGradientBytes * w.getParams();
      phaseTimeline.onlyArrivingGradients(gate);
      for (Operation *op : order)
        if (auto fuse = dyn_cast<FuseTaskGradsOp>(op);
            fuse && model.getStrategy()) {
          StrategyOp s = model.getStrategy();
          SmallVector<Type> present;
          for (Value g : fuse.getGrads())
            if (!dropped.contains(g.getDefiningOp()))
              present.push_back(g.getType());
          phaseTimeline.fuseWorkspace =
              present.empty()
                  ? 0
                  : phaseCost
                        .gradientPipeline(present, bool(s.getGfmKeep()),
                                          s.getGradientScope(),
                                          s.getScopeLayers(),
                                          s.getClip() == ClipPolicy::per_task)
                        .workspace;
        }
      report.phasePeakBytes.push_back(std::min(
          peak.bytes,
          phaseTimeline
              .peak(liveOn(phaseTimeline, dropped, held), regions, partials)
              .bytes));
    }
  analyzeEvaluation(model, order, report);

  // Saved activations and the tasks that need them.
  for (TaskOp t : tasks)
    report.taskOnlyBytes[t.getSymName()] = 0;
  // activation_reuse_ratio as the runtime measures it (docs/runtime.md §7):
  // over every task, the backbone bytes it depends on, counted once per
  // task; the share some other task depends on too.
  double dependent = 0, reused = 0;
  llvm::DenseMap<Operation *, UnitMemory *> unitOf;
  for (Operation *op : order) {
    auto fwd = dyn_cast<FwdOp>(op);
    // Recomputed units are the same units again: report each once.
    if (!fwd || isa<RecomputeOp>(fwd->getParentOp()))
      continue;
    UnitMemory unit;
    unit.op = fwd;
    unit.tasks = servedBy(fwd);
    report.units.push_back(unit);
  }
  for (UnitMemory &unit : report.units)
    unitOf[unit.op] = &unit;
  // Backward users of a value, through the region results it is handed out
  // as.
  auto backwardUsers = [&](Value v, auto &self,
                           SmallVectorImpl<Operation *> &users) -> void {
    for (Operation *user : v.getUsers()) {
      if (isa<BwdOp>(user))
        users.push_back(user);
      if (auto yield = dyn_cast<YieldOp>(user))
        for (auto [yv, r] : llvm::zip(yield.getValues(),
                                      yield->getParentOp()->getResults()))
          if (yv == v)
            self(r, self, users);
    }
  };
  for (Operation *opPtr : order) {
    Operation &op = *opPtr;
    for (Value result : op.getResults()) {
      if (!isForwardValue(result))
        continue;
      llvm::SetVector<StringRef> needing;
      SmallVector<Operation *> users;
      backwardUsers(result, backwardUsers, users);
      for (Operation *user : users)
        for (StringRef t : servedBy(user))
          needing.insert(t);
      if (needing.empty())
        continue;
      int64_t bytes = CostModel::bytes(result.getType());
      report.savedBytes += bytes;
      if (needing.size() == 1)
        report.taskOnlyBytes[needing.front()] += bytes;
      auto fwd = dyn_cast<FwdOp>(&op);
      if (fwd && !fwd.getTaskAttr()) {
        dependent += double(bytes) * needing.size();
        if (needing.size() >= 2)
          reused += double(bytes) * needing.size();
      }
      if (UnitMemory *unit = unitOf.lookup(&op))
        unit->savedBytes += bytes;
    }
  }
  report.activationReuseRatio = dependent > 0 ? reused / dependent : 0.0;
  return report;
}

namespace {
struct EvalPeak {
  int64_t bytes = 0;
  Operation *op = nullptr;
  MemoryBreakdown at;
};

/// The evaluation's peak at `cost`'s micro batch (`inputScale`: that batch
/// over the step's, for the step's input types).
EvalPeak evaluationPeak(ModelOp model, const CostModel &cost,
                        ArrayRef<Operation *> forward, int64_t inputScale) {
  llvm::DenseMap<Operation *, int> position;
  for (auto [i, op] : llvm::enumerate(forward))
    position[op] = int(i);
  const int end = int(forward.size()) - 1;
  // A value's last forward reader, through the checkpoint results it is
  // handed out as.
  auto lastRead = [&](Value v, auto &self) -> int {
    int last = position.lookup(v.getDefiningOp());
    for (Operation *user : v.getUsers()) {
      if (auto it = position.find(user); it != position.end())
        last = std::max(last, it->second);
      if (auto yield = dyn_cast<YieldOp>(user);
          yield && isa<CheckpointOp>(yield->getParentOp()))
        for (auto [yv, r] : llvm::zip(yield.getValues(),
                                      yield->getParentOp()->getResults()))
          if (yv == v)
            last = std::max(last, self(r, self));
    }
    return last;
  };
  std::vector<int64_t> delta(forward.size() + 1, 0), workspace(forward.size());
  for (auto [i, op] : llvm::enumerate(forward)) {
    int64_t bytes = 0;
    int last = end; // the batch's inputs: held through the batch
    if (auto fwd = dyn_cast<FwdOp>(op)) {
      TaskOp task = fwd.getTaskAttr()
                        ? model.lookupSymbol<TaskOp>(fwd.getTaskAttr())
                        : TaskOp();
      const UnitCost unit = cost.evalUnit(fwd.getUnit(), task);
      bytes = CostModel::bytes(unit.output);
      workspace[i] = unit.fwdWorkspace;
      last = lastRead(fwd.getOutput(), lastRead);
    } else {
      // Every input's leading dimension is the batch.
      bytes = CostModel::bytes(op->getResult(0).getType()) * inputScale;
    }
    delta[i] += bytes;
    delta[last + 1] -= bytes;
  }
  // The last step's whole batch is held through an evaluation between steps.
  BudgetOp budget = model.getBudget();
  MemoryBreakdown now =
      residentState(model, cost, budget ? budget.getAccumulationSteps() : 1);
  EvalPeak peak{now.total(), nullptr, now};
  const int64_t residentParameters = now.parameters;
  // ZeRO 3: the block running is gathered whole (Model::setAroundUnit), and
  // the next backbone block the evaluation runs is being gathered beside it.
  auto blockOf = [&](size_t i) -> int64_t {
    std::optional<UnitRef> unit = getUnitRef(forward[i]);
    if (!unit || unit->task)
      return -1;
    return int64_t(getBlockNumber(unit->kind, unit->layer));
  };
  // The next block after op i's own (a block is several ops): the nearest
  // block after i and the nearest one after that other than it.
  std::vector<int64_t> nextBlock(forward.size(), -1);
  for (int64_t i = int64_t(forward.size()) - 1, b1 = -1, b2 = -1; i >= 0; --i) {
    const int64_t b = blockOf(size_t(i));
    nextBlock[size_t(i)] = b >= 0 && b == b1 ? b2 : b1;
    if (b >= 0 && b != b1) {
      b2 = b1;
      b1 = b;
    }
  }
  bool begun = false; // a block has run: the next one is being gathered
  for (size_t i = 0; i < forward.size(); ++i) {
    now.activations += delta[i];
    now.workspace = workspace[i];
    now.parameters = residentParameters;
    const int64_t b = blockOf(i);
    if (b >= 0)
      now.parameters += cost.shardedBlockBytes(b);
    begun |= b >= 0;
    if (begun && nextBlock[i] >= 0)
      now.parameters += cost.shardedBlockBytes(nextBlock[i]);
    if (now.total() > peak.bytes)
      peak = {now.total(), forward[i], now};
  }
  return peak;
}
} // namespace

void mtp::analyzeEvaluation(ModelOp model, ArrayRef<Operation *> order,
                            MemoryReport &report) {
  // The forward as evaluation runs it: no checkpoint re-runs (they belong to
  // the backward), nothing but units and the batch.
  SmallVector<Operation *> forward;
  for (Operation *op : order)
    if ((isa<FwdOp>(op) && !op->getParentOfType<RecomputeOp>()) ||
        isa<InputOp>(op))
      forward.push_back(op);
  const CostModel cost(model);
  const int64_t micro = cost.microBatch();
  // The largest batch of whole micro-batches, up to 8, whose evaluation
  // stays within the step's peak and the budget: evaluation then never
  // raises the process's high-water mark, and runs in fewer, larger calls.
  // The step's peak as planned (the report may be of the step before its
  // checkpoints are written in: keeping everything).
  int64_t stepPeak = report.peakBytes;
  if (StepPlanAttr plan = model.getStep().getPlanAttr())
    stepPeak = std::min(stepPeak, plan.getPlannedPeakBytes());
  const int64_t bound = std::min(stepPeak, cost.usableBytes());
  EvalPeak best = evaluationPeak(model, cost, forward, 1);
  int64_t batch = micro;
  for (int64_t k = 2; k <= 8; ++k) {
    EvalPeak at =
        evaluationPeak(model, CostModel(model, k * micro), forward, k);
    if (at.bytes > bound)
      break;
    best = at;
    batch = k * micro;
  }
  report.evalBatch = batch;
  report.evalPeakBytes = best.bytes;
  report.evalPeakOp = best.op;
  report.evalAtPeak = best.at;
}

void mtp::attachMemoryReport(StepOp step, const MemoryReport &report) {
  Builder b(step.getContext());
  auto *mtp = step->getContext()->getLoadedDialect<MTPDialect>();
  auto i64 = [&](int64_t v) { return b.getI64IntegerAttr(v); };
  const MemoryBreakdown &m = report.atPeak;
  mtp->getPeakBytesAttrHelper().setAttr(step, i64(report.peakBytes));
  mtp->getPeakAtAttrHelper().setAttr(
      step, b.getStringAttr(MemoryReport::describe(report.peakOp)));
  SmallVector<NamedAttribute> breakdown = {
      b.getNamedAttr("parameters", i64(m.parameters)),
      b.getNamedAttr("gradients", i64(m.gradients)),
      b.getNamedAttr("optimizer", i64(m.optimizer)),
      b.getNamedAttr("activations", i64(m.activations)),
      b.getNamedAttr("activation_grads", i64(m.activationGrads)),
      b.getNamedAttr("workspace", i64(m.workspace)),
  };
  if (m.exchange) // only where there is one (more than one process, GSC)
    breakdown.push_back(b.getNamedAttr("exchange", i64(m.exchange)));
  mtp->getBreakdownAttrHelper().setAttr(step, b.getDictionaryAttr(breakdown));
  mtp->getSavedBytesAttrHelper().setAttr(step, i64(report.savedBytes));
  mtp->getEvalPeakBytesAttrHelper().setAttr(step, i64(report.evalPeakBytes));
  mtp->getEvalBatchAttrHelper().setAttr(step, i64(report.evalBatch));
  SmallVector<NamedAttribute> perTask;
  for (auto &[task, bytes] : report.taskOnlyBytes)
    perTask.push_back(b.getNamedAttr(task, i64(bytes)));
  mtp->getTaskOnlyBytesAttrHelper().setAttr(step,
                                            b.getDictionaryAttr(perTask));
  mtp->getActivationReuseRatioAttrHelper().setAttr(
      step, b.getF64FloatAttr(report.activationReuseRatio));
}

namespace {
struct MemoryAnalysisPass
    : public mtp::impl::MemoryAnalysisBase<MemoryAnalysisPass> {
  using MemoryAnalysisBase::MemoryAnalysisBase;
  explicit MemoryAnalysisPass(MemoryReportSink sink) : sink(std::move(sink)) {}
  MemoryReportSink sink;

  void runOnOperation() override {
    ModelOp model = getOperation();
    StepOp step = model.getStep();
    if (!step) {
      model.emitError("model '")
          << model.getSymName()
          << "' has no training step; run --mtp-expand-training-step first";
      return signalPassFailure();
    }
    const MemoryReport &report = getAnalysis<StepMemoryAnalysis>().report;
    attachMemoryReport(step, report);
    if (sink)
      sink(model, report);
    // Attributes only: the analysis (and every other) still holds.
    markAllAnalysesPreserved();
    if (!print)
      return;
    llvm::raw_ostream &os = llvm::outs();
    const MemoryBreakdown &m = report.atPeak;
    os << "memory analysis of '" << model.getSymName() << "'\n";
    os << "  peak              " << formatBytes(report.peakBytes) << " at "
       << MemoryReport::describe(report.peakOp) << "\n";
    os << "    parameters      " << formatBytes(m.parameters) << "\n";
    os << "    gradients       " << formatBytes(m.gradients) << "\n";
    os << "    optimizer       " << formatBytes(m.optimizer) << "\n";
    os << "    activations     " << formatBytes(m.activations) << "\n";
    os << "    activation grads " << formatBytes(m.activationGrads) << "\n";
    os << "    workspace       " << formatBytes(m.workspace) << "\n";
    if (m.exchange)
      os << "    exchange        " << formatBytes(m.exchange) << "\n";
    os << "  saved activations " << formatBytes(report.savedBytes) << "\n";
    for (auto &[task, bytes] : report.taskOnlyBytes)
      os << "    only for " << task << ": " << formatBytes(bytes) << "\n";
    os << "  activation_reuse_ratio "
       << llvm::format("%.4f", report.activationReuseRatio) << "\n";
    os << "  evaluation peak   " << formatBytes(report.evalPeakBytes) << " at "
       << MemoryReport::describe(report.evalPeakOp) << ", batch "
       << report.evalBatch << " (forward only, no autograd)\n";
  }
};
} // namespace

std::unique_ptr<mlir::Pass> mtp::createMemoryAnalysis(MemoryReportSink sink) {
  return std::make_unique<MemoryAnalysisPass>(std::move(sink));
}

namespace {
/// The unit group an op belongs to: a task's head, or one backbone block.
/// Empty for anything but a forward or backward unit.
std::string groupOf(Operation *op) {
  std::optional<UnitRef> unit = getUnitRef(op);
  if (!unit)
    return "";
  if (unit->task)
    return ("task " + unit->task.getValue()).str();
  return "block " + std::to_string(getBlockNumber(unit->kind, unit->layer));
}
} // namespace

std::optional<OffloadPlacement> mtp::placeOffload(FwdOp fwd, Value value) {
  const std::string owner = groupOf(fwd);
  Operation *lastForward = fwd, *firstBackward = nullptr;
  for (Operation *user : value.getUsers()) {
    if (isa<BwdOp>(user)) {
      if (groupOf(user) != owner)
        return std::nullopt;
      if (!firstBackward || user->isBeforeInBlock(firstBackward))
        firstBackward = user;
    } else if (lastForward->isBeforeInBlock(user)) {
      lastForward = user;
    }
  }
  if (!firstBackward || firstBackward->isBeforeInBlock(lastForward))
    return std::nullopt;
  Operation *issue = firstBackward;
  std::string before;
  for (Operation *op = firstBackward->getPrevNode(); op;
       op = op->getPrevNode()) {
    if (!isa<BwdOp>(op))
      continue;
    std::string g = groupOf(op);
    if (g == owner)
      continue;
    if (before.empty())
      before = g;
    if (g != before)
      break;
    issue = op;
  }
  if (!lastForward->isBeforeInBlock(issue))
    issue = firstBackward;
  return OffloadPlacement{lastForward, issue, firstBackward};
}
