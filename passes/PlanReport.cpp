//===- PlanReport.cpp - the plan a person reads ---------------------------===//

#include "passes/PlanReport.h"
#include "passes/PipelinePlan.h"
#include "passes/Bytes.h"
#include "passes/CostModel.h"
#include "mtprt/Zero.h"
#include "passes/PlanMemory.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace mtp;

namespace {
/// A row of the table: the embeddings, one block of a layer, or a head.
struct Row {
  std::string name;
  int64_t saved = 0, fwdFlops = 0;
  llvm::SmallVector<StringRef> tasks;
  /// Tasks whose head reads the output of this row (a tap point).
  llvm::SmallVector<StringRef> taps;
  Decision decision = Decision::Keep;
  /// Tensor grain: the units whose outputs the backward re-creates.
  llvm::SmallVector<StringRef> recomputedUnits;
};

/// The planner's decision on a unit (keep before planning).
Decision decisionOf(FwdOp op) {
  return op.getDecision().value_or(Decision::Keep);
}

std::string microseconds(double seconds) {
  return llvm::formatv("{0:f1} us", seconds * 1e6).str();
}

std::string milliseconds(double seconds) {
  return llvm::formatv("{0:f2} ms", seconds * 1e3).str();
}

std::string taskList(ArrayRef<StringRef> tasks, size_t all) {
  if (tasks.empty())
    return "-";
  if (tasks.size() == all && all > 2)
    return "all " + std::to_string(all);
  std::string out;
  for (StringRef t : tasks)
    out += (out.empty() ? "" : " ") + t.str();
  return out;
}

/// The gradient pipeline's cost, both scopes, and the collectives' bytes.
void printGradientsAndCollectives(ModelOp model, llvm::raw_ostream &os) {
  StepOp step = model.getStep();
  StrategyOp strategy = model.getStrategy();
  BudgetOp budget = model.getBudget();
  CostModel cost(model);
  Block &body = step.getBody().front();
  auto fuses = body.getOps<FuseTaskGradsOp>();
  if (!fuses.empty() && strategy) {
    FuseTaskGradsOp fuse = *fuses.begin();
    os << "\n  gradient pipeline: scope "
       << stringifyGradientScope(fuse.getScope());
    if (fuse.getScope() == GradientScope::params)
      os << " (top " << strategy.getScopeLayers() << " layers)";
    os << ", GFM ";
    if (auto keep = fuse.getGfmKeep())
      os << "keep " << llvm::format("%g", keep->convertToDouble());
    else
      os << "off";
    os << ", clip ";
    double clip = fuse.getClipMaxNorm().convertToDouble();
    if (clip > 0)
      os << "per task " << llvm::format("%g", clip);
    else
      os << stringifyClipPolicy(strategy.getClip());
    os << ", DGFG ";
    if (auto hidden = fuse.getGateHidden())
      os << "hidden " << *hidden << " ("
         << dgfgParameterCount(fuse.getTasks().size(), *hidden)
         << " parameters)";
    else
      os << "off (uniform weights)";
    os << "\n    " << formatBytes(fuse.getWorkspace()) << " workspace, "
       << llvm::format("%.3f", fuse.getFlops() / 1e9) << " GFLOP";
    // The other scope, for comparison.
    int64_t perTask = cost.perTaskParameterGradientBytes(
        int64_t(fuse.getTasks().size()), strategy.getScopeLayers());
    if (fuse.getScope() == GradientScope::features)
      os << "; params scope (top " << strategy.getScopeLayers()
         << " layers) would add " << formatBytes(perTask)
         << " of per-task gradients and a backward per task";
    else
      os << "; features scope would save " << formatBytes(perTask);
    os << "\n";
  }
  auto buckets = body.getOps<AllReduceOp>();
  if (buckets.empty())
    return;
  int64_t world = budget ? budget.getReplicas() : 1;
  // One process runs stages 2 and 3 as 1 (nothing to scatter).
  const int64_t zero = std::min<int64_t>(budget ? budget.getZeroStage() : 0,
                                         world > 1 ? 3 : 1);
  int64_t elements = 0, plain = 0, compressed = 0, payload = 0, count = 0;
  bool isCompressed = false;
  for (AllReduceOp op : buckets) {
    ++count;
    elements += op.getElements();
    plain += CostModel::allReduceBytes(op.getElements(), world);
    if (op.getCompressed()) {
      isCompressed = true;
      int64_t p = CostModel::compressedPayloadBytes(
          op.getElements(), op.getTopk()->convertToDouble(), *op.getBlock(),
          *op.getBits());
      payload += p;
      compressed += CostModel::allGatherBytes(p, world);
    }
  }
  os << "\n  collectives: " << count << " buckets, " << elements
     << " gradient values, " << world << " process(es)\n";
  if (world <= 1)
    os << "    one process: the all-reduce does nothing at run time\n";
  else if (zero < 2)
    os << "    all-reduce sends " << formatBytes(plain)
       << " per process per step\n";
  if (isCompressed && strategy) {
    double ratio = payload ? double(4 * elements) / double(payload) : 0;
    os << "    compressed (top-k " << llvm::format("%g", strategy.getTopk().convertToDouble())
       << ", " << strategy.getQuantBits() << "-bit values, block "
       << strategy.getQuantBlock() << ", decay "
       << llvm::format("%g", strategy.getResidualDecay().convertToDouble())
       << "): payload " << formatBytes(payload) << ", "
       << llvm::format("%.1f", ratio) << "x smaller than fp32; all-gathered, "
       << formatBytes(compressed) << " sent per process (grows as (W-1) x payload)\n";
  }
  if (zero) {
    // docs/zero.md: per rank, what sharding keeps and what it sends.
    const int64_t shard = mtprt::ZeroLayout::shardValues(elements, world);
    os << "    ZeRO " << zero << ": AdamW's state of " << shard
       << " values per rank, " << formatBytes(mtprt::ZeroLayout::stateBytes(elements, world))
       << " (" << formatBytes(CostModel::kOptimizerBytes * elements)
       << " unsharded)";
    if (zero >= 2)
      os << "; gradients released during the backward (summed over the "
            "ranks a bucket at a time as autograd makes them), "
         << formatBytes(mtprt::ZeroLayout::gradientShardBytes(elements, world))
         << " kept per rank";
    os << "\n";
    // ZeRO 3: the backbone's blocks sharded too (CostModel's bytes).
    const CostModel::ShardedBlocks blocks = CostModel(model).shardedBlocks();
    const int64_t sharded = blocks.total;
    if (zero >= 3 && world > 1)
      os << "    ZeRO 3: the backbone's parameters sharded, "
         << formatBytes(sharded) << " as a run of "
         << formatBytes(4 * shard)
         << " per rank (with the heads' values; heads and frozen layers "
            "stay whole); each block gathered whole for its forward and "
            "again for its backward, freed after, the next one's gather "
            "begun while it computes (largest block "
         << formatBytes(blocks.largest) << ")\n";
    if (world > 1)
      os << "    ZeRO sends per process per step: "
         << (zero < 2 ? std::string()
             : CostModel(model).halfProjectionValues()
                 ? "gradients up to " + formatBytes(4 * elements) +
                       " (per micro-batch; a large bf16 one's at 2 B a "
                       "value) + "
                 : "gradients " + formatBytes(4 * elements) +
                       " (per micro-batch) + ")
         << (zero >= 3
                 ? "its run of each block, twice per micro-batch (each rank "
                   "receives " +
                       formatBytes(2 * (sharded - sharded / world)) +
                       " per micro-batch)"
                 : "its run of the updated values to each other rank, " +
                       formatBytes(
                           (world - 1) *
                           (4 * elements -
                            2 * CostModel(model).halfProjectionValues()) /
                           world) +
                       " (broadcast in place, waited for block by block "
                       "as the next forward reads them" +
                       (CostModel(model).halfProjectionValues()
                            ? std::string("; a bf16 weight at 2 B a value)")
                            : std::string(")")))
         << "\n";
  }
  if (strategy && strategy.getOptimizerOffload()) {
    const int64_t shard =
        mtprt::ZeroLayout::shardValues(elements, zero ? world : 1);
    const CostModel cost(model);
    // The copies' time over the host link (docs/zero.md): not in the
    // step's predicted time — the host's AdamW has no figure here.
    auto overTheLink = [&](int64_t bytes) {
      os << "; over the host link ("
         << llvm::format("%.1f", 1e-9 / cost.transferSeconds(1)) << " GB/s) "
         << formatBytes(bytes) << " take "
         << milliseconds(cost.transferSeconds(bytes))
         << " a step, beside the next forward where the host has cores free "
            "(not in the step time below)";
    };
    if (const int64_t half = cost.halfProjectionValues()) {
      // ZeRO-Offload's 16-bit weights: the update reads the masters, not
      // the device's parameters.
      os << "    optimizer offload: AdamW's state and the fp32 master weights "
            "of "
         << shard << " values on the host, "
         << formatBytes(mtprt::ZeroLayout::stateBytes(shard, 1) +
                        mtprt::ZeroLayout::masterBytes(shard, 1))
         << " per process, none on the device; the projections' " << half
         << " values are " << stringifyPrecision(model.getBudget().getPrecision())
         << " on the device (" << formatBytes(2 * half)
         << " fewer bytes of parameters and of gradients each); each step the "
            "update copies ";
      // Folded 16-bit gradients went to the host after each micro-batch:
      // the update copies the fp32 ones.
      const int64_t folded = cost.foldedGradientBytes();
      os << (shard != elements ? std::string("this run's ")
             : folded          ? formatBytes(4 * (shard - half)) + " of fp32 "
                               : formatBytes(4 * shard - 2 * half) + " of ")
         << "gradients to the host and the parameters back";
      if (folded)
        os << "; with " << model.getBudget().getAccumulationSteps()
           << " micro-batches a step the 16-bit gradients ("
           << formatBytes(2 * half)
           << ") go to the host after each, summed in fp32 there ("
           << formatBytes(folded) << ") and freed on the device";
      // This rank's run: its gradients over, its parameters back, a
      // projection's at 2 B (folded: the 16-bit gradients went already);
      // a run's share of the projections taken as its share of the values.
      const int64_t runHalf = int64_t(double(half) * double(shard) /
                                      double(std::max<int64_t>(1, elements)));
      overTheLink((folded ? 4 * (shard - half) : 4 * shard - 2 * runHalf) +
                  4 * shard - 2 * runHalf);
      os << "\n";
    } else {
      os << "    optimizer offload: AdamW's state of " << shard
         << " values on the host, " << formatBytes(8 * shard)
         << " per process, none on the device; each step the update copies "
         << formatBytes(4 * shard) << " of gradients and "
         << formatBytes(4 * shard)
         << " of parameters to the host and the parameters back";
      overTheLink(12 * shard);
      os << "\n";
    }
  }
  if (world > 1 || zero >= 2) {
    CostModel cost(model);
    CostModel::ExchangeMemory m =
        cost.gradientExchange(llvm::to_vector(buckets));
    os << "    exchange memory: ";
    if (m.resident)
      os << formatBytes(m.resident) << " resident (the GSC residual), ";
    os << (zero >= 2 ? "at most " : "") << formatBytes(m.transient)
       << " at the exchange"
       << (zero >= 2 ? " (what the backward did not release, a bucket at a "
                       "time)"
                     : "")
       << "\n";
  }
  // Their time (docs/cost-model.md, "Communication"): the runtime blocks on
  // them, so it adds to the step's.
  if (world > 1 && budget.getPipelineStages() <= 1) {
    const CostModel::Communication comm = cost.stepCommunication();
    os << "    communication: " << milliseconds(comm.seconds)
       << " per step per process (";
    llvm::interleaveComma(comm.parts, os, [&](const auto &p) {
      os << p.first << " " << milliseconds(p.second);
    });
    os << ") at " << llvm::format("%.1f", cost.interconnectBandwidth() * 1e-9)
       << " GB/s and " << microseconds(cost.messageLatency())
       << " a message"
       << (cost.broadcastLatency() != cost.messageLatency()
               ? ", " + microseconds(cost.broadcastLatency()) +
                     " a broadcast's step"
               : std::string())
       << " ("
       << (budget && budget.getInterconnectBandwidth()
               ? std::string("the budget's interconnect")
               : "the " + cost.device().name.str() +
                     " preset's; budget `interconnect` sets it")
       << (zero >= 3   ? "); the release's sums and the blocks' gathers "
                         "overlap compute at run time, counted whole here"
           : zero == 2 ? "); the release's sums overlap the backward and the "
                         "updated values' broadcasts the next forward at run "
                         "time, counted whole here"
           : zero == 1 ? "); the updated values' broadcasts overlap the next "
                         "forward at run time, counted whole here"
                       : "); nothing overlaps compute");
    if (StepPlanAttr plan = step.getPlanAttr();
        plan && plan.getKeepStepSeconds().convertToDouble() > 0) {
      const double compute = plan.getKeepStepSeconds().convertToDouble() +
                             plan.getAddedSeconds().convertToDouble();
      os << "; the step " << milliseconds(compute + comm.seconds)
         << " with it ("
         << llvm::format("%.0f%%", 100.0 * comm.seconds /
                                       (compute + comm.seconds))
         << " communication)";
    }
    os << "\n";
  }
}

SmallVector<Row> rowsOf(ModelOp model, const MemoryReport &report) {
  SmallVector<Row> rows;
  llvm::StringMap<size_t> index;
  for (const UnitMemory &unit : report.units) {
    FwdOp op = unit.op;
    std::string name;
    if (op.getUnit() == UnitKind::embed)
      name = "embed";
    else if (FlatSymbolRefAttr task = op.getTaskAttr())
      name = (stringifyUnitKind(op.getUnit()) + " " + task.getValue()).str();
    else
      name = "layer " + std::to_string(op.getLayer()) +
             (getBlockNumber(op.getUnit(), op.getLayer()) % 2 ? " attention"
                                                               : " mlp");
    auto [it, inserted] = index.try_emplace(name, rows.size());
    if (inserted) {
      rows.emplace_back();
      rows.back().name = name;
      rows.back().tasks = unit.tasks;
    }
    Row &row = rows[it->second];
    row.saved += unit.savedBytes;
    row.fwdFlops += op.getFlops();
    // A unit planned recompute outside a region is the block's tensor-grain
    // (partial) decision; otherwise every unit of a row has the row's.
    if (decisionOf(op) == Decision::Recompute && !op.getRegion()) {
      row.decision = Decision::Partial;
      row.recomputedUnits.push_back(stringifyUnitKind(op.getUnit()));
    } else if (row.decision != Decision::Partial) {
      row.decision = decisionOf(op);
    }
  }
  for (TaskOp task : model.getTasks()) {
    std::string at = task.getTapLayer() == 0
                         ? "embed"
                         : "layer " + std::to_string(task.getTapLayer()) +
                               " mlp";
    if (auto it = index.find(at); it != index.end())
      rows[it->second].taps.push_back(task.getSymName());
  }
  return rows;
}
} // namespace

namespace {
/// D13's adapters by the one each task reads (the first of a group holds
/// it): every task alone without `share`; and what they hold in all.
struct AdapterGroups {
  SmallVector<SmallVector<StringRef>> groups;
  int64_t parameters = 0;
};
AdapterGroups adapterGroups(ModelOp model, const CostModel &cost) {
  AdapterGroups out;
  std::optional<mtprt::AdapterConfig> ad = cost.adapters();
  SmallVector<TaskOp> tasks(model.getTasks());
  llvm::DenseMap<int64_t, size_t> groupOf;
  for (auto [i, t] : llvm::enumerate(tasks)) {
    out.parameters += cost.headParameters(t) - cost.plainHeadParameters(t);
    const int64_t owner = ad ? ad->ownerOf(int64_t(i)) : int64_t(i);
    auto [it, fresh] = groupOf.try_emplace(owner, out.groups.size());
    if (fresh)
      out.groups.emplace_back();
    out.groups[it->second].push_back(t.getSymName());
  }
  return out;
}
} // namespace

/// docs/pipeline.md: the stages, their units and heads, per-stage peak and
/// time, the bubble.
static void printPipeline(ModelOp model, llvm::raw_ostream &os) {
  std::optional<PipelinePlanResult> pipe = planPipeline(model);
  if (!pipe)
    return;
  BudgetOp budget = model.getBudget();
  const int64_t S = int64_t(pipe->stages.size());
  SmallVector<TaskOp> tasks(model.getTasks());
  auto unitName = [](int64_t u) -> std::string {
    if (u == 0)
      return "embeddings";
    return "layer " + std::to_string((u + 1) / 2) + (u % 2 ? " attn" : " mlp");
  };
  os << "  pipeline (C9): " << S << " stages x " << pipe->replicas
     << " replica(s), " << (pipe->gpipe ? "GPipe" : "1F1B") << ", "
     << pipe->microBatches << " micro-batches of " << budget.getMicroBatch()
     << " per step; bubble (S-1)/(M+S-1) = "
     << llvm::format("%.3f", pipe->bubble) << "; predicted step "
     << llvm::formatv("{0:f3} ms", pipe->stepSeconds * 1e3)
     << " on the slowest stage (its receives "
     << milliseconds(llvm::max_element(pipe->stages,
                                       [](const auto &a, const auto &b) {
                                         return a.communicationSeconds <
                                                b.communicationSeconds;
                                       })
                         ->communicationSeconds)
     << " per micro-batch"
     << (pipe->exchangeSeconds > 0
             ? ", the replicas' exchange " +
                   milliseconds(pipe->exchangeSeconds)
             : std::string())
     << "); "
     << [&]() -> std::string {
          const bool re = llvm::any_of(pipe->stages, [](const auto &st) {
            return !st.recomputed.empty();
          });
          const bool off = llvm::any_of(pipe->stages, [](const auto &st) {
            return !st.offloaded.empty();
          });
          if (!re && !off)
            return "each stage keeps its activations";
          return std::string("over-budget stages ") +
                 (re && off ? "recompute and offload"
                  : re      ? "recompute"
                            : "offload") +
                 " blocks";
        }()
     << (pipe->movedForMemory
             ? "; the cut moved off the time balance to fit the budget"
             : "")
     << "\n";
  for (auto [s, st] : llvm::enumerate(pipe->stages)) {
    os << "    stage " << s << ": " << unitName(st.firstUnit) << " .. "
       << unitName(st.lastUnit) << " (units " << st.firstUnit << "-"
       << st.lastUnit << "), heads";
    if (st.tasks.empty())
      os << " none";
    for (auto [i, t] : llvm::enumerate(st.tasks))
      os << (i ? ", " : " ") << tasks[t].getSymName();
    os << "; " << st.parameters << " parameters; "
       << llvm::formatv("{0:f3} ms", (st.forwardSeconds + st.backwardSeconds +
                                     st.transferSeconds) *
                                         1e3)
       << " per micro-batch; peak " << formatBytes(st.peakBytes) << " ("
       << st.inFlight << " micro-batch" << (st.inFlight == 1 ? "" : "es")
       << " in flight x " << formatBytes(st.keptBytesPerMicroBatch)
       << " kept, state " << formatBytes(st.stateBytes) << ")";
    if (!st.recomputed.empty()) {
      os << "; recomputes";
      for (auto [i, b] : llvm::enumerate(st.recomputed))
        os << (i ? ", " : " ") << unitName(b);
    }
    if (!st.offloaded.empty()) {
      os << "; offloads";
      for (auto [i, b] : llvm::enumerate(st.offloaded))
        os << (i ? ", " : " ") << unitName(b);
      os << " (" << formatBytes(st.offloadedBytesPerMicroBatch)
         << " a micro-batch, copies exposing "
         << llvm::formatv("{0:f3} ms", st.transferSeconds * 1e3) << ")";
    }
    os << "\n";
  }
}

/// pipeline = auto's tries (docs/pipeline.md): each number of stages with
/// its predicted peak and step, or why it did not fit.
static void printPipelineChoices(ModelOp model, llvm::raw_ostream &os) {
  BudgetOp budget = model.getBudget();
  ArrayAttr choices = budget ? budget.getPipelineChoicesAttr() : ArrayAttr();
  if (!choices)
    return;
  os << "  pipeline = auto chose " << budget.getPipelineStages()
     << (budget.getPipelineStages() == 1
             ? " stage (data parallelism over every gpu)"
             : " stages")
     << ": the fitting plan with the least predicted step\n";
  for (auto c : choices.getAsRange<PipelineChoiceAttr>()) {
    os << "    " << c.getStages() << (c.getStages() == 1 ? " stage: " : " stages: ");
    if (c.fits())
      os << "peak " << formatBytes(c.getPeakBytes()) << ", step "
         << milliseconds(c.getStepSeconds().convertToDouble());
    else
      os << "refused: " << c.getRefusal().getValue();
    os << (c.getStages() == budget.getPipelineStages() ? "  <- chosen" : "")
       << "\n";
  }
}

void mtp::printPlan(ModelOp model, const MemoryReport &report,
                    llvm::raw_ostream &os) {
  CostModel cost(model);
  BudgetOp budget = model.getBudget();
  size_t numTasks = llvm::range_size(model.getTasks());
  os << "plan for '" << model.getSymName() << "'";
  if (budget)
    os << " on " << budget.getDevice() << " (" << formatBytes(budget.getMemory())
       << ", " << formatBytes(budget.getUsableBytes()) << " usable), micro batch "
       << budget.getMicroBatch() << ", "
       << stringifyPrecision(budget.getPrecision());
  os << ", attention " << stringifyAttentionKind(CostModel(model).attention())
     << ", pointwise " << stringifyPointwiseKind(CostModel(model).pointwise());
  os << "\n";
  printPipelineChoices(model, os);
  printPipeline(model, os);
  StrategyOp strategy = model.getStrategy();
  if (BatchScheduleAttr dynamic =
          strategy ? strategy.getDynamicBatchAttr() : BatchScheduleAttr();
      dynamic && budget) {
    const mtprt::BatchSchedule s = dynamic.getSchedule();
    const int64_t perStep = budget.getMicroBatch() * budget.getGpus();
    const int64_t most = s.largestBatch(perStep);
    const int64_t least =
        std::max<int64_t>(perStep, s.smallest() / perStep * perStep);
    os << "  dynamic batch (D15): " << s.start << " growing x(1 + "
       << llvm::format("%g", s.rate) << " step), capped at " << s.max
       << ", for " << s.rampSteps << " steps; then x"
       << llvm::format("%g", s.decay) << " every " << s.every
       << " steps, floor " << s.floor << ". Steps run " << least << " to "
       << most << " records (" << least / perStep << " to " << most / perStep
       << " micro-batches of " << perStep << "); the plan is for " << most
       << " (gradients accumulate, the step's batch is held on the device)\n";
  }
  if (TrainOp train = model.getTrain(); train && train.getPhasesAttr()) {
    os << "  phases:";
    for (auto [i, phase] :
         llvm::enumerate(train.getPhasesAttr().getAsRange<PhaseAttr>())) {
      os << (i ? ";" : "") << " " << phase.getSteps() << " steps on";
      for (auto [j, t] : llvm::enumerate(phase.getTasks()))
        os << (j ? ", " : " ") << t.getValue();
      if (i < report.phasePeakBytes.size())
        os << " (peak " << formatBytes(report.phasePeakBytes[i]) << ")";
    }
    os << "\n";
  }
  if (std::optional<mtprt::AdapterConfig> ad = cost.adapters()) {
    const int64_t per = mtprt::AdapterConfig::parameters(
                      model.getBackbone().getHidden(), ad->bottleneck),
                  backboneParams = cost.parameters().backbone;
    const AdapterGroups groups = adapterGroups(model, cost);
    os << "  adapters (D13): bottleneck " << ad->bottleneck << ", " << per
       << " parameters per task ("
       << llvm::format("%.2f", 100.0 * double(per) / double(backboneParams))
       << "% of the backbone's), " << groups.parameters
       << " in all (planned with the heads: weights, gradients, AdamW state); gate "
          "separation weight "
       << llvm::format("%g", ad->separation) << "\n";
    if (ad->share) {
      os << "    shared where tasks correlate at "
         << llvm::format("%g", *ad->share) << " or more:";
      for (auto [i, g] : llvm::enumerate(groups.groups)) {
        os << (i ? ";" : "");
        for (auto [j, t] : llvm::enumerate(g))
          os << (j ? ", " : " ") << t;
        if (g.size() < 2)
          os << " (its own)";
      }
      os << " (each task keeps its own gate)\n";
      if (ad->regroup)
        os << "    regrouped every " << ad->regroup
           << " steps and at each phase's end: a group splits where its "
              "members' gradients on its adapter fall below "
           << llvm::format("%g", *ad->share)
           << " (planned as every task its own adapter)\n";
    }
  }
  if (EwcAttr ewc = strategy ? strategy.getEwcAttr() : EwcAttr()) {
    const ParameterGroups g = parameterGroups(model.getStep());
    os << "  ewc (D14): lambda " << llvm::format("%g", ewc.getConfig().lambda)
       << ", the Fisher on " << ewc.getBatches()
       << " batches at each phase's end"
       << (ewc.getConfig().detects()
               ? llvm::formatv(" where a task's gradient similarity to the "
                               "next phase's exceeds {0}",
                               ewc.getConfig().threshold)
                     .str()
               : std::string())
       << "; F and the remembered weights of "
       << g.protectedByEwc << " backbone parameters hold "
       << formatBytes(mtprt::EwcConfig::kBytesPerParameter * g.protectedByEwc)
       << "\n";
  }
  if (SapsAttr saps = strategy ? strategy.getSapsAttr() : SapsAttr()) {
    const mtprt::SapsConfig c = saps.getConfig();
    const ParameterGroups g = parameterGroups(model.getStep());
    os << "  saps (D12): top " << llvm::format("%g", 100 * c.fraction)
       << "% of each backbone tensor by |w*g| + " << llvm::format("%g", c.lambda)
       << " g^2, re-ranked every " << c.every << " steps: " << g.selected
       << " of " << g.sparse << " backbone entries updated; their state "
       << formatBytes(mtprt::SapsConfig::kBytesPerSelected * g.selected)
       << " where dense gradients and AdamW would hold "
       << formatBytes((CostModel::kGradientBytes + CostModel::kOptimizerBytes) *
                      g.sparse)
       << "\n";
  }
  os << "\n";
  os << llvm::formatv("  {0,-22} {1,12} {2,12}  {3,-10} {4}\n", "unit",
                      "saved", "fwd GFLOP", "decision", "tasks needing it");
  for (const Row &row : rowsOf(model, report)) {
    os << llvm::formatv("  {0,-22} {1,12} {2,12:f3}  {3,-10} {4}", row.name,
                        formatBytes(row.saved), row.fwdFlops / 1e9,
                        stringifyDecision(row.decision), taskList(row.tasks, numTasks));
    if (!row.taps.empty()) {
      os << "   <- tap:";
      for (StringRef t : row.taps)
        os << ' ' << t;
    }
    if (!row.recomputedUnits.empty()) {
      os << "   (re-creates";
      for (StringRef u : row.recomputedUnits)
        os << ' ' << u;
      os << " at its backward)";
    }
    os << "\n";
  }
  const MemoryBreakdown &m = report.atPeak;
  os << "\n  parameters           " << formatBytes(m.parameters) << "\n"
     << "  gradients            " << formatBytes(m.gradients)
     << " (at the peak)\n"
     << "  optimizer state      " << formatBytes(m.optimizer) << "\n"
     << "  saved activations    " << formatBytes(report.savedBytes) << "\n"
     << (model.getStep().getPlan()
             ? "  peak, nothing planned "
             : "  peak                 ")
     << formatBytes(report.peakBytes) << " at "
     << MemoryReport::describe(report.peakOp) << "\n"
     << "    of which activations " << formatBytes(m.activations)
     << ", activation grads " << formatBytes(m.activationGrads)
     << ", workspace " << formatBytes(m.workspace)
     << (m.exchange ? ", exchange residual " + formatBytes(m.exchange) : "")
     << "\n"
     << "  activation_reuse_ratio "
     << llvm::format("%.3f", report.activationReuseRatio)
     << " (of the backbone bytes each task depends on, the share others depend "
        "on too)\n";
  for (auto &[task, bytes] : report.taskOnlyBytes)
    os << "  only for " << task << ": " << formatBytes(bytes) << "\n";
  os << "  evaluation peak      " << formatBytes(report.evalPeakBytes) << " at "
     << MemoryReport::describe(report.evalPeakOp) << ", batch "
     << report.evalBatch
     << " (forward only, no autograd; the largest of up to 8 micro-batches "
        "within the step's peak; activations "
     << formatBytes(report.evalAtPeak.activations) << ", workspace "
     << formatBytes(report.evalAtPeak.workspace) << ")\n";
  if (!budget) {
    os << "\n  no budget: nothing to compare with\n";
    return;
  }
  StepPlanAttr plan = model.getStep().getPlanAttr();
  int64_t peak = plan ? plan.getPlannedPeakBytes() : report.peakBytes;
  if (plan) {
    if (StrategyOp strategy = model.getStrategy()) {
      os << "\n  strategy: checkpoint "
         << stringifyCheckpointPolicy(strategy.getCheckpoint()) << ", offload "
         << stringifyOffloadPolicy(strategy.getOffload());
      if (strategy.getCheckpoint() == CheckpointPolicy::task_granular) {
        os << "; task groups (correlation >= "
           << llvm::format("%g", strategy.getGroupThreshold().convertToDouble())
           << "):";
        for (auto &group : taskGroups(
                 model, strategy.getGroupThreshold().convertToDouble())) {
          os << " {";
          llvm::interleave(group, os, " ");
          os << "}";
        }
      }
      os << "\n";
    }
    os << "  checkpoint regions:";
    if (plan.getRegions().empty())
      os << " none";
    for (const PlanRegion &r : plan.getRegions()) {
      auto block = [](int64_t b) {
        return std::to_string((b + 1) / 2) + (b % 2 ? ".attn" : ".mlp");
      };
      os << " [" << block(r.first) << " .. " << block(r.last) << "]";
    }
    os << "\n";
    if (!plan.getOffloads().empty()) {
      double bound = 0;
      if (StrategyOp strategy = model.getStrategy())
        bound = strategy.getMaxOffloadLatency().convertToDouble();
      os << "  offload (stream 1, low priority; prefetch one unit group ahead, "
            "wait bound "
         << microseconds(bound) << "):\n";
      for (const PlanOffload &o : plan.getOffloads())
        os << llvm::formatv("    {0,-24} {1,12} each way, exposed wait {2}\n",
                            o.unit.getValue(), formatBytes(o.bytes),
                            microseconds(o.exposedWait));
    }
    // The step column only where the plan carries its prediction.
    const double keepStep = plan.getKeepStepSeconds().convertToDouble();
    auto row = [&](StringRef name, int64_t peak, double added) {
      os << llvm::formatv("  {0,-26} {1,12} {2,14}", name, formatBytes(peak),
                          microseconds(added));
      if (keepStep > 0)
        os << llvm::formatv(" {0,12}", milliseconds(keepStep + added));
      os << "\n";
    };
    os << llvm::formatv("\n  {0,-26} {1,12} {2,14}", "plan", "peak",
                        "added time");
    os << (keepStep > 0 ? llvm::formatv(" {0,12}\n", "step").str() : "\n");
    row("keep everything", plan.getKeepPeakBytes(), 0);
    row("uniform (every block)", plan.getUniformPeakBytes(),
        plan.getUniformAddedSeconds().convertToDouble());
    row("this plan", plan.getPlannedPeakBytes(),
        plan.getAddedSeconds().convertToDouble());
    if (keepStep > 0) {
      CostModel cost(model);
      if (plan.getMeasuredCosts())
        os << "  step time: from measured costs (mtpc profile)\n";
      else
        os << llvm::formatv("  step time: the roofline at {0} ({1:f0} GFLOP/s, "
                            "{2:f0} GB/s; `mtpc profile` measures them)\n",
                            cost.device().name,
                            cost.peakFlops() * 1e-9,
                            cost.memoryBandwidth() * 1e-9);
    }
    if (plan.getOptimal())
      os << "  search: optimal for the cost model (branch and bound, "
         << plan.getSearchNodes() << " nodes)\n";
    else if (plan.getSearchNodes()) {
      os << "  search: the best plan in " << plan.getSearchNodes()
         << " branch-and-bound nodes (not proven optimal";
      // The root's bound: no plan adds less.
      const double bound = plan.getLowerBoundSeconds().convertToDouble(),
                   added = plan.getAddedSeconds().convertToDouble();
      if (bound > 0 && added >= bound)
        os << llvm::formatv("; its added time at most {0:f1}% above the "
                            "optimum's, which no plan's goes under: {1:f1} us",
                            100.0 * (added / bound - 1), 1e6 * bound);
      os << ")\n";
    }
    else
      os << "  search: the heuristic's plan (too many candidates for the "
            "exact search)\n";
  }
  printGradientsAndCollectives(model, os);
  int64_t margin = budget.getUsableBytes() - peak;
  os << "\n  verdict: ";
  if (margin >= 0)
    os << "fits, " << formatBytes(margin) << " to spare of "
       << formatBytes(budget.getUsableBytes()) << "\n";
  else
    os << "DOES NOT FIT: over by " << formatBytes(-margin) << " ("
       << formatBytes(peak) << " needed, "
       << formatBytes(budget.getUsableBytes()) << " usable)\n";
}

llvm::json::Value mtp::planToJson(ModelOp model, const MemoryReport &report) {
  using llvm::json::Array;
  using llvm::json::Object;
  BudgetOp budget = model.getBudget();
  Array units;
  for (const UnitMemory &unit : report.units) {
    FwdOp op = unit.op;
    Object u{{"unit", stringifyUnitKind(op.getUnit())},
             {"name", op.getUnitName()},
             {"layer", int64_t(op.getLayer())},
             {"saved_bytes", unit.savedBytes},
             {"fwd_flops", int64_t(op.getFlops())},
             {"decision", stringifyDecision(decisionOf(op))}};
    if (FlatSymbolRefAttr task = op.getTaskAttr())
      u["task"] = task.getValue();
    Array tasks;
    for (StringRef t : unit.tasks)
      tasks.push_back(t);
    u["tasks"] = std::move(tasks);
    units.push_back(std::move(u));
  }
  Object taskOnly;
  for (auto &[task, bytes] : report.taskOnlyBytes)
    taskOnly[task] = bytes;
  const MemoryBreakdown &m = report.atPeak;
  Object out{{"schema", "mtpc.plan/1"},
             {"model", model.getSymName()},
             {"attention",
              stringifyAttentionKind(CostModel(model).attention())},
             {"pointwise",
              stringifyPointwiseKind(CostModel(model).pointwise())},
             {"units", std::move(units)},
             {"peak", Object{{"bytes", report.peakBytes},
                             {"at", MemoryReport::describe(report.peakOp)},
                             {"parameters", m.parameters},
                             {"gradients", m.gradients},
                             {"optimizer", m.optimizer},
                             {"activations", m.activations},
                             {"activation_grads", m.activationGrads},
                             {"workspace", m.workspace},
                             {"exchange", m.exchange}}},
             {"saved_bytes", report.savedBytes},
             {"task_only_bytes", std::move(taskOnly)},
             {"activation_reuse_ratio", report.activationReuseRatio},
             {"eval_peak",
              Object{{"bytes", report.evalPeakBytes},
                     {"batch", report.evalBatch},
                     {"at", MemoryReport::describe(report.evalPeakOp)},
                     {"activations", report.evalAtPeak.activations},
                     {"workspace", report.evalAtPeak.workspace}}}};
  StepPlanAttr plan = model.getStep().getPlanAttr();
  int64_t planned = plan ? plan.getPlannedPeakBytes() : -1;
  if (plan) {
    Array regions;
    for (const PlanRegion &r : plan.getRegions())
      regions.push_back(Array{r.first, r.last});
    Array offloads;
    for (const PlanOffload &o : plan.getOffloads())
      offloads.push_back(Object{{"unit", o.unit.getValue()},
                                {"bytes", o.bytes},
                                {"stream", o.stream},
                                {"exposed_wait_s", o.exposedWait}});
    out["plan"] = Object{
        {"offloads", std::move(offloads)},
        {"planned_peak_bytes", planned},
        {"added_seconds", plan.getAddedSeconds().convertToDouble()},
        {"keep_peak_bytes", plan.getKeepPeakBytes()},
        {"uniform_peak_bytes", plan.getUniformPeakBytes()},
        {"uniform_added_seconds",
         plan.getUniformAddedSeconds().convertToDouble()},
        {"minimal_peak_bytes", plan.getMinimalPeakBytes()},
        {"keep_step_seconds", plan.getKeepStepSeconds().convertToDouble()},
        {"step_seconds", plan.getKeepStepSeconds().convertToDouble() +
                             plan.getAddedSeconds().convertToDouble()},
        {"step_costs", plan.getMeasuredCosts() ? "measured" : "roofline"},
        {"search",
         Object{{"nodes", plan.getSearchNodes()},
                {"optimal", plan.getOptimal()},
                {"lower_bound_seconds",
                 plan.getLowerBoundSeconds().convertToDouble()}}},
        {"regions", std::move(regions)}};
  }
  if (budget) {
    int64_t usable = budget.getUsableBytes();
    int64_t peak = planned >= 0 ? planned : report.peakBytes;
    if (StrategyOp st = model.getStrategy(); st && st.getDynamicBatchAttr()) {
      const mtprt::BatchSchedule s = st.getDynamicBatchAttr().getSchedule();
      out["dynamic_batch"] = Object{
          {"start", s.start},
          {"max", s.max},
          {"rate", s.rate},
          {"ramp_steps", s.rampSteps},
          {"decay", s.decay},
          {"every", s.every},
          {"floor", s.floor},
          {"largest_batch",
           s.largestBatch(budget.getMicroBatch() * budget.getGpus())}};
    }
    if (TrainOp train = model.getTrain(); train && train.getPhasesAttr()) {
      Array phases;
      for (auto [i, phase] :
           llvm::enumerate(train.getPhasesAttr().getAsRange<PhaseAttr>())) {
        Array names;
        for (FlatSymbolRefAttr t : phase.getTasks())
          names.push_back(t.getValue());
        phases.push_back(Object{
            {"steps", phase.getSteps()},
            {"tasks", std::move(names)},
            {"peak_bytes", i < report.phasePeakBytes.size()
                               ? report.phasePeakBytes[i]
                               : int64_t(0)}});
      }
      out["phases"] = std::move(phases);
    }
    if (std::optional<mtprt::AdapterConfig> ad = CostModel(model).adapters()) {
      const int64_t per = mtprt::AdapterConfig::parameters(
          model.getBackbone().getHidden(), ad->bottleneck);
      const AdapterGroups groups = adapterGroups(model, CostModel(model));
      Array names;
      for (const SmallVector<StringRef> &g : groups.groups) {
        Array members;
        for (StringRef t : g)
          members.push_back(t.str());
        names.push_back(std::move(members));
      }
      out["adapters"] = Object{{"bottleneck", ad->bottleneck},
                               {"separation", ad->separation},
                               {"params_per_task", per},
                               {"params", groups.parameters},
                               {"groups", std::move(names)}};
      if (ad->share)
        out["adapters"].getAsObject()->try_emplace("share", *ad->share);
      if (ad->regroup)
        out["adapters"].getAsObject()->try_emplace("regroup", ad->regroup);
    }
    if (StrategyOp st = model.getStrategy(); st && st.getEwcAttr()) {
      const ParameterGroups g = parameterGroups(model.getStep());
      out["ewc"] = Object{
          {"lambda", st.getEwcAttr().getConfig().lambda},
          {"batches", st.getEwcAttr().getBatches()},
          {"threshold", st.getEwcAttr().getConfig().detects()
                            ? llvm::json::Value(
                                  st.getEwcAttr().getConfig().threshold)
                            : llvm::json::Value(nullptr)},
          {"protected_params", g.protectedByEwc},
          {"state_bytes",
           mtprt::EwcConfig::kBytesPerParameter * g.protectedByEwc}};
    }
    if (StrategyOp st = model.getStrategy(); st && st.getSapsAttr()) {
      const mtprt::SapsConfig c = st.getSapsAttr().getConfig();
      const ParameterGroups g = parameterGroups(model.getStep());
      out["saps"] = Object{
          {"fraction", c.fraction},
          {"every", c.every},
          {"lambda", c.lambda},
          {"backbone_params", g.sparse},
          {"selected", g.selected},
          {"state_bytes", mtprt::SapsConfig::kBytesPerSelected * g.selected},
          {"dense_bytes",
           (CostModel::kGradientBytes + CostModel::kOptimizerBytes) * g.sparse}};
    }
    out["budget"] = Object{{"device", budget.getDevice()},
                           {"memory_bytes", int64_t(budget.getMemory())},
                           {"usable_bytes", usable},
                           {"micro_batch", int64_t(budget.getMicroBatch())},
                           {"precision", stringifyPrecision(budget.getPrecision())},
                           {"gpus", int64_t(budget.getGpus())},
                           {"zero", budget.getZeroStage()},
                           {"fits", peak <= usable},
                           {"margin_bytes", usable - peak}};
    // docs/cost-model.md, "Communication": one process's per step.
    if (CostModel cost(model);
        cost.processes() > 1 && budget.getPipelineStages() <= 1) {
      const CostModel::Communication comm = cost.stepCommunication();
      Object parts;
      for (const auto &p : comm.parts)
        parts[p.first] = p.second;
      out["communication"] =
          Object{{"bytes", comm.bytes},
                 {"messages", comm.messages},
                 {"seconds", comm.seconds},
                 {"parts_s", std::move(parts)},
                 {"interconnect_bytes_per_s", cost.interconnectBandwidth()},
                 {"message_latency_s", cost.messageLatency()},
                 {"broadcast_latency_s", cost.broadcastLatency()}};
    }
    // docs/pipeline.md: the stages (their peaks decide the fit).
    if (std::optional<PipelinePlanResult> pipe = planPipeline(model)) {
      Array stages;
      SmallVector<TaskOp> tasks(model.getTasks());
      for (const PipelineStagePlan &st : pipe->stages) {
        Array names;
        for (int64_t t : st.tasks)
          names.push_back(tasks[t].getSymName().str());
        stages.push_back(Object{
            {"first_unit", st.firstUnit},
            {"last_unit", st.lastUnit},
            {"tasks", std::move(names)},
            {"parameters", st.parameters},
            {"peak_bytes", st.peakBytes},
            {"in_flight", st.inFlight},
            {"kept_bytes_per_micro_batch", st.keptBytesPerMicroBatch},
            {"state_bytes", st.stateBytes},
            {"forward_s", st.forwardSeconds},
            {"backward_s", st.backwardSeconds},
            {"communication_s", st.communicationSeconds},
            {"recomputed_units", Array(st.recomputed)},
            {"offloaded_units", Array(st.offloaded)},
            {"offloaded_bytes_per_micro_batch",
             st.offloadedBytesPerMicroBatch},
            {"transfer_s", st.transferSeconds}});
      }
      out["pipeline"] = Object{{"stages", std::move(stages)},
                               {"replicas", pipe->replicas},
                               {"schedule", pipe->gpipe ? "gpipe" : "1f1b"},
                               {"micro_batches", pipe->microBatches},
                               {"moved_for_memory", pipe->movedForMemory},
                               {"bubble", pipe->bubble},
                               {"step_s", pipe->stepSeconds},
                               {"exchange_s", pipe->exchangeSeconds}};
      (*out.getObject("budget"))["fits"] = pipe->peakBytes() <= usable;
      (*out.getObject("budget"))["margin_bytes"] = usable - pipe->peakBytes();
    }
    if (ArrayAttr choices = budget.getPipelineChoicesAttr()) {
      Array tried;
      for (auto c : choices.getAsRange<PipelineChoiceAttr>()) {
        Object o{{"stages", c.getStages()}, {"fits", c.fits()}};
        if (c.fits()) {
          o["peak_bytes"] = c.getPeakBytes();
          o["step_s"] = c.getStepSeconds().convertToDouble();
        } else {
          o["refusal"] = c.getRefusal().getValue().str();
        }
        tried.push_back(std::move(o));
      }
      out["pipeline_auto"] = Object{{"chosen", budget.getPipelineStages()},
                                    {"tried", std::move(tried)}};
    }
    // docs/zero.md: what AdamW's state takes per process, where.
    StrategyOp st = model.getStrategy();
    const bool offloaded = st && st.getOptimizerOffload();
    if (budget.getZeroStage() || offloaded) {
      const int64_t values = zeroValues(model.getStep());
      const int64_t world = budget.getZeroStage() ? budget.getGpus() : 1;
      const int64_t state = adamwStateBytes(model);
      const CostModel cost(model);
      // 16-bit weights: their fp32 masters beside the moments.
      const int64_t masters =
          cost.halfProjections()
              ? mtprt::ZeroLayout::masterBytes(values, world)
              : 0;
      out["optimizer_state"] = Object{
          {"values", values},
          {"run_values", mtprt::ZeroLayout::shardValues(values, world)},
          {"device_bytes", offloaded ? int64_t(0) : state},
          {"host_bytes", offloaded ? state + masters +
                                         cost.foldedGradientBytes()
                                   : int64_t(0)},
          {"unsharded_bytes", CostModel::kOptimizerBytes * values}};
      if (masters) {
        out["optimizer_state"].getAsObject()->insert(
            {"master_bytes", masters});
        out["optimizer_state"].getAsObject()->insert(
            {"half_values", cost.halfProjectionValues()});
        if (const int64_t folded = cost.foldedGradientBytes())
          out["optimizer_state"].getAsObject()->insert(
              {"folded_gradient_bytes", folded});
      }
      if (budget.getZeroStage() >= 3 && budget.getGpus() > 1) {
        const CostModel::ShardedBlocks blocks =
            CostModel(model).shardedBlocks();
        out["sharded_parameters"] = Object{
            {"bytes", blocks.total},
            {"run_bytes",
             CostModel::kWeightBytes *
                 mtprt::ZeroLayout::shardValues(values, world)},
            {"largest_block_bytes", blocks.largest}};
      }
    }
  }
  return out;
}
