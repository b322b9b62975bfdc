//===- PipelinePlan.cpp - backbone stages across processes ----------------===//
//
// docs/pipeline.md. The split is the linear partition of the backbone's
// blocks (each with the heads on its tap) that minimizes the slowest stage's
// time, which sets the pipeline's step; ties keep the earlier cut. The
// planner may record another (BudgetOp `stages`) to fit the memory.
//
//===----------------------------------------------------------------------===//

#include "passes/PipelinePlan.h"

#include "passes/CostModel.h"
#include "passes/MemoryAnalysis.h"

#include "llvm/ADT/DenseSet.h"

#include <algorithm>
#include <limits>

using namespace mlir;
using namespace mtp;

int64_t PipelinePlanResult::peakBytes() const {
  int64_t peak = 0;
  for (const PipelineStagePlan &s : stages)
    peak = std::max(peak, s.peakBytes);
  return peak;
}

namespace {
/// What one backbone block (with the heads on its tap) costs per micro-batch.
struct BlockCost {
  double fwd = 0, bwd = 0;
  /// The backbone units' alone (a stage runs the heads on a tap with its
  /// forward, after the copies out have been waited for).
  double unitsFwd = 0, unitsBwd = 0;
  /// A recomputed block's forward again, in its backward (not in the
  /// split's balance, so recompute decisions never move the cut).
  double rerun = 0;
  int64_t kept = 0, params = 0, trainable = 0, backboneTrainable = 0;
  llvm::SmallVector<int64_t> tasks;
  /// The block's output: whether its own backward keeps it anyway.
  bool outputKept = false;
  /// In a checkpoint region: re-run before its backward.
  bool recomputed = false;
  /// Saved bytes the plan sends to the host after the block's forward and
  /// brings back for its backward (in `kept` no more).
  int64_t offloaded = 0;
  /// What offloading the block would send to the host (those bytes under
  /// any decision).
  int64_t offloadable = 0;
};

/// Whether the plan sends `v`, a backbone forward's output, to the host
/// between its forward and its backward: planned (the unit's decision is
/// offload and only its own block's backward reads it, MaterializeOffload's
/// rule) or materialized (an mtp.offload takes it).
bool offloaded(FwdOp fwd, Value v) {
  if (fwd.getTaskAttr())
    return false;
  if (llvm::any_of(v.getUsers(),
                   [](Operation *u) { return isa<OffloadOp>(u); }))
    return true;
  return fwd.getDecision() == Decision::Offload &&
         placeOffload(fwd, v).has_value();
}

/// A value a backward reads, as its forward made it (through a
/// materialized offload's prefetch).
Value fromForward(Value v) {
  if (auto pre = v.getDefiningOp<PrefetchOp>())
    if (auto off = pre.getHost().getDefiningOp<OffloadOp>())
      return off.getValue();
  return v;
}

/// The plan's checkpoint regions by backbone block (the fwd units' `region`
/// attributes): a value a recomputed unit makes is kept only where a unit
/// outside its region reads it in the backward (the region's output, the
/// next block's input); the rest the region's recompute re-creates.
struct Regions {
  llvm::DenseMap<int64_t, int64_t> ofBlock;
  int64_t nblocks = 1;

  int64_t blockOf(UnitKind unit, uint64_t layer) const {
    return std::clamp<int64_t>(getBlockNumber(unit, layer), 0, nblocks - 1);
  }
  int64_t of(Operation *op) const {
    auto regionOfBlock = [&](UnitKind u, uint64_t l, bool task) -> int64_t {
      if (task)
        return -1;
      auto it = ofBlock.find(blockOf(u, l));
      return it == ofBlock.end() ? -1 : it->second;
    };
    if (auto f = dyn_cast<FwdOp>(op))
      return regionOfBlock(f.getUnit(), f.getLayer(), bool(f.getTaskAttr()));
    if (auto b = dyn_cast<BwdOp>(op))
      return regionOfBlock(b.getUnit(), b.getLayer(), bool(b.getTaskAttr()));
    return -1;
  }
  /// Whether the backbone backward holds `v` from its forward (else:
  /// re-created). A stage runs its heads' backward with their forward, so
  /// what only they read is gone before — but a tap (mtp.release) is the
  /// root of the backbone backward, held until it returns.
  bool kept(Value v) const {
    const int64_t r = v.getDefiningOp() ? of(v.getDefiningOp()) : -1;
    return llvm::any_of(v.getUsers(), [&](Operation *u) {
      if (isa<ReleaseOp>(u))
        return true;
      auto bwd = dyn_cast<BwdOp>(u);
      return bwd && !bwd.getTaskAttr() && (r < 0 || of(u) != r);
    });
  }
};
} // namespace

std::vector<int64_t> mtp::balancedStages(llvm::ArrayRef<double> seconds,
                                         int64_t S) {
  // The linear partition: best[s][i] = the least slowest-stage time of the
  // first i blocks in s stages; cut[s][i] where its last stage starts.
  const int64_t n = int64_t(seconds.size());
  S = std::clamp<int64_t>(S, 1, std::max<int64_t>(1, n));
  std::vector<double> prefix(n + 1, 0.0);
  for (int64_t b = 0; b < n; ++b)
    prefix[b + 1] = prefix[b] + seconds[b];
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(S + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int64_t>> cut(S + 1, std::vector<int64_t>(n + 1, 0));
  best[0][0] = 0;
  for (int64_t s = 1; s <= S; ++s)
    for (int64_t i = s; i <= n; ++i)
      for (int64_t j = s - 1; j < i; ++j) {
        const double t = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (t < best[s][i]) {
          best[s][i] = t;
          cut[s][i] = j;
        }
      }
  std::vector<int64_t> starts(S);
  for (int64_t s = S, i = n; s >= 1; --s) {
    starts[s - 1] = cut[s][i];
    i = cut[s][i];
  }
  return starts;
}

double mtp::dataParallelStepSeconds(ModelOp model) {
  StepOp step = model.getStep();
  BudgetOp budget = model.getBudget();
  if (!step)
    return 0;
  const CostModel cm(model);
  double units = 0;
  for (Operation &op : step.getBody().front())
    if (isa<FwdOp, BwdOp>(op))
      units += cm.opSeconds(&op);
  if (StepPlanAttr plan = step.getPlanAttr())
    units += plan.getAddedSeconds().convertToDouble();
  const int64_t M = budget ? budget.getAccumulationSteps() : 1;
  return double(M) * units + cm.stepCommunication().seconds;
}

std::optional<PipelinePlanResult> mtp::planPipeline(ModelOp model) {
  BudgetOp budget = model.getBudget();
  StepOp step = model.getStep();
  BackboneOp backbone = model.getBackbone();
  if (!budget || !step || !backbone || budget.getPipelineStages() < 2)
    return std::nullopt;
  const CostModel cm(model);
  const int64_t nblocks = 2 * int64_t(backbone.getLayers()) + 1;
  const int64_t S = std::min<int64_t>(budget.getPipelineStages(), nblocks);
  llvm::SmallVector<TaskOp> tasks(model.getTasks());
  llvm::DenseMap<Operation *, int64_t> taskIndex;
  for (auto [i, t] : llvm::enumerate(tasks))
    taskIndex[t] = int64_t(i);

  Regions regions;
  regions.nblocks = nblocks;
  for (FwdOp fwd : step.getBody().front().getOps<FwdOp>())
    if (std::optional<uint64_t> r = fwd.getRegion(); r && !fwd.getTaskAttr())
      regions.ofBlock[regions.blockOf(fwd.getUnit(), fwd.getLayer())] =
          int64_t(*r);

  std::vector<BlockCost> blocks(nblocks);
  llvm::DenseSet<Value> boundaries;
  auto blockOf = [&](UnitKind unit, uint64_t layer,
                     FlatSymbolRefAttr task) -> int64_t {
    if (task)
      if (auto t = model.lookupSymbol<TaskOp>(task))
        return std::min<int64_t>(nblocks - 1, 2 * int64_t(t.getTapLayer()));
    return std::clamp<int64_t>(getBlockNumber(unit, layer), 0, nblocks - 1);
  };
  for (Operation &op : step.getBody().front()) {
    if (auto fwd = dyn_cast<FwdOp>(op)) {
      const int64_t b =
          blockOf(fwd.getUnit(), fwd.getLayer(), fwd.getTaskAttr());
      BlockCost &c = blocks[b];
      c.fwd += cm.opSeconds(&op);
      if (!fwd.getTaskAttr())
        c.unitsFwd += cm.opSeconds(&op);
      // A recomputed unit runs again before its region's backward.
      if (regions.of(fwd) >= 0) {
        c.rerun += cm.opSeconds(&op);
        c.recomputed = true;
      }
      for (Value r : fwd.getOutputs()) {
        const int64_t bytes = CostModel::bytes(r.getType());
        const bool off = offloaded(fwd, r);
        if (off)
          c.offloaded += bytes;
        else if (regions.kept(r))
          c.kept += bytes;
        if (off || (!fwd.getTaskAttr() && placeOffload(fwd, r)))
          c.offloadable += bytes;
      }
      // A region's boundary stays saved for its recompute, read in the
      // backward or not.
      if (const int64_t r = regions.of(fwd); r >= 0)
        for (Value in : fwd.getInputs())
          if (auto def = in.getDefiningOp<FwdOp>();
              def && !def.getTaskAttr() && regions.of(def) != r &&
              !regions.kept(in) && boundaries.insert(in).second)
            c.kept += CostModel::bytes(in.getType());
      TaskOp task = fwd.getTaskAttr()
                        ? model.lookupSymbol<TaskOp>(fwd.getTaskAttr())
                        : TaskOp();
      const int64_t p = cm.unitParameters(fwd.getUnit(), task);
      c.params += p;
      if (task ? true : !cm.frozen(int64_t(fwd.getLayer())))
        c.trainable += p;
      if (!task && !cm.frozen(int64_t(fwd.getLayer())))
        c.backboneTrainable += p;
      if (task && fwd.getUnit() == UnitKind::head &&
          !llvm::is_contained(c.tasks, taskIndex.lookup(task)))
        c.tasks.push_back(taskIndex.lookup(task));
      if (!task)
        c.outputKept = regions.kept(fwd.getOutput());
    } else if (auto bwd = dyn_cast<BwdOp>(op)) {
      BlockCost &c =
          blocks[blockOf(bwd.getUnit(), bwd.getLayer(), bwd.getTaskAttr())];
      c.bwd += cm.opSeconds(&op);
      if (!bwd.getTaskAttr())
        c.unitsBwd += cm.opSeconds(&op);
    }
  }

  // The planner's cut when it chose one (BudgetOp `stages`), else the
  // partition balancing the blocks' kept time.
  std::vector<double> seconds;
  for (const BlockCost &c : blocks)
    seconds.push_back(c.fwd + c.bwd);
  const std::vector<int64_t> balanced = balancedStages(seconds, S);
  std::vector<int64_t> starts = balanced;
  if (std::optional<ArrayRef<int64_t>> given = budget.getStageStarts();
      given && int64_t(given->size()) == S && given->back() < nblocks)
    starts.assign(given->begin(), given->end());

  // What a micro-batch's backward on a stage holds beyond its kept tensors:
  // a liveness walk over the stage's backbone backward units (in step
  // order), each saved tensor freed after its last use there, each gradient
  // alive from the unit that makes it to its last use (one coming from
  // outside the stage — the received boundary gradient, a fused tap
  // gradient — from the start), plus the unit's workspace.
  // `paramGrads`: the units' parameter gradients appear as they run (the
  // step's first backward, when none exists yet).
  // An offloaded block's tensors come back (`fetchAt`: block → the block
  // whose backward's start brings them) and go after their last use.
  auto backwardExtra = [&](int64_t first, int64_t last, bool paramGrads,
                           const llvm::DenseMap<int64_t, int64_t> &fetchAt)
      -> int64_t {
    // The stage's backbone backward units and the gradient sums among them
    // (mtp.add_grads: a residual's two paths, a tap's fused gradient added
    // to the one coming down), in step order.
    llvm::SmallVector<Operation *> ops;
    llvm::DenseSet<Operation *> inStage;
    auto onStage = [&](BwdOp bwd) {
      if (bwd.getTaskAttr())
        return false;
      const int64_t b = std::clamp<int64_t>(
          getBlockNumber(bwd.getUnit(), bwd.getLayer()), 0, nblocks - 1);
      return b >= first && b <= last;
    };
    for (Operation &op : step.getBody().front()) {
      bool in = false;
      if (auto bwd = dyn_cast<BwdOp>(op))
        in = onStage(bwd);
      else if (isa<AddGradsOp>(op))
        // A sum the stage makes: a tap's fused gradient and the one coming
        // down (the root of the tap's stage's backward: there, even when
        // the other comes from the stage above), or of the stage's own
        // units' gradients (a residual's; sent down when the stage's first
        // block reads it).
        in = llvm::any_of(op.getOperands(),
                          [](Value v) {
                            return isa_and_nonnull<FuseTaskGradsOp>(
                                v.getDefiningOp());
                          })
                 ? llvm::any_of(op.getUsers(),
                                [&](Operation *u) {
                                  auto bwd = dyn_cast<BwdOp>(u);
                                  return bwd && onStage(bwd);
                                })
                 : llvm::any_of(op.getOperands(), [&](Value v) {
                     return inStage.contains(v.getDefiningOp());
                   });
      if (in) {
        ops.push_back(&op);
        inStage.insert(&op);
      }
    }
    const int64_t n = int64_t(ops.size());
    if (n == 0)
      return 0;
    auto gradsOf = [](Operation *op) -> ValueRange {
      if (auto bwd = dyn_cast<BwdOp>(op))
        return bwd.getGrads();
      return op->getOperands();
    };
    auto madeBy = [](Operation *op) -> ValueRange {
      if (auto bwd = dyn_cast<BwdOp>(op))
        return bwd.getInputGrads();
      return op->getResults();
    };
    llvm::DenseMap<Value, int64_t> lastUse, def;
    for (auto [i, op] : llvm::enumerate(ops)) {
      for (Value v : op->getOperands())
        lastUse[v] = int64_t(i);
      for (Value r : madeBy(op))
        def[r] = int64_t(i);
    }
    // An aliased input gradient is the incoming one: that lives as long as
    // its aliases are read (last first, so chains carry through).
    for (Operation *op : llvm::reverse(ops))
      if (auto bwd = dyn_cast<BwdOp>(op); bwd && bwd.getAliases())
        for (Value r : bwd.getInputGrads().take_front(bwd.getAliases()))
          if (auto it = lastUse.find(r); it != lastUse.end())
            lastUse[bwd.getGrads().front()] =
                std::max(lastUse[bwd.getGrads().front()], it->second);
    // The kept tensors: those the stage's own forward made (counted in
    // keptBytesPerMicroBatch); only their release here matters. A
    // checkpoint region's re-created ones appear before its first backward
    // unit (with the re-run's workspace and a second copy of its output,
    // the root of the region's backward) and go after their last use.
    int64_t kept = 0;
    std::vector<int64_t> freedAfter(n, 0), recreated(n, 0), rerunWs(n, 0);
    llvm::DenseMap<int64_t, int64_t> regionStart, regionEnd;
    for (auto [i, op] : llvm::enumerate(ops))
      if (const int64_t r = regions.of(op); r >= 0) {
        regionStart.try_emplace(r, int64_t(i));
        regionEnd[r] = int64_t(i);
      }
    for (FwdOp fwd : step.getBody().front().getOps<FwdOp>()) {
      auto it = regionStart.find(regions.of(fwd));
      if (it == regionStart.end())
        continue;
      rerunWs[it->second] =
          std::max(rerunWs[it->second], int64_t(fwd.getWorkspace()));
      if (regions.kept(fwd.getOutput())) {
        recreated[it->second] += CostModel::bytes(fwd.getOutput().getType());
        freedAfter[regionEnd.lookup(it->first)] +=
            CostModel::bytes(fwd.getOutput().getType());
      }
    }
    auto blockOfOp = [&](Operation *op) {
      auto bwd = cast<BwdOp>(op);
      return std::clamp<int64_t>(getBlockNumber(bwd.getUnit(), bwd.getLayer()),
                                 0, nblocks - 1);
    };
    llvm::DenseMap<int64_t, int64_t> blockStart;
    for (auto [i, op] : llvm::enumerate(ops))
      if (isa<BwdOp>(op))
        blockStart.try_emplace(blockOfOp(op), int64_t(i));
    llvm::DenseSet<Value> seen;
    for (auto [i, op] : llvm::enumerate(ops))
      if (auto bwd = dyn_cast<BwdOp>(op))
        for (Value v : bwd.getSaved()) {
          const Value f = fromForward(v);
          auto def = f.getDefiningOp<FwdOp>();
          if (!seen.insert(v).second || !def || def.getTaskAttr())
            continue;
          const int64_t bytes = CostModel::bytes(v.getType());
          if (offloaded(def, f)) {
            const int64_t b = std::clamp<int64_t>(
                getBlockNumber(def.getUnit(), def.getLayer()), 0,
                nblocks - 1);
            auto at = blockStart.find(fetchAt.lookup(b));
            recreated[at != blockStart.end() ? std::min(at->second,
                                                        int64_t(i))
                                             : int64_t(i)] += bytes;
          } else if (regions.kept(f)) {
            kept += bytes;
          } else {
            recreated[regionStart.lookup(regions.of(def))] += bytes;
          }
          freedAfter[lastUse[v]] += bytes;
        }
    // Gradients: [def, lastUse], aliases own none. One from outside the
    // stage is there from the start to the end: the backward's roots — a
    // tap's fused gradient, the received one — are held by autograd's
    // graph root (and PipelineRunner) until the backward returns.
    std::vector<int64_t> born(n + 1, 0), dies(n + 1, 0);
    llvm::DenseSet<Value> counted;
    for (auto [i, op] : llvm::enumerate(ops)) {
      for (Value g : gradsOf(op))
        if (!def.count(g) && counted.insert(g).second) {
          born[0] += CostModel::bytes(g.getType());
          dies[n - 1] += CostModel::bytes(g.getType());
        }
      auto bwd = dyn_cast<BwdOp>(op);
      for (auto [j, r] : llvm::enumerate(madeBy(op))) {
        if (bwd && int64_t(j) < int64_t(bwd.getAliases()))
          continue;
        born[i] += CostModel::bytes(r.getType());
        // Used by another stage (sent) or by nothing: freed after its
        // unit.
        auto it = lastUse.find(r);
        dies[it == lastUse.end() ? int64_t(i) : it->second] +=
            CostModel::bytes(r.getType());
      }
    }
    int64_t keptNow = kept, grads = 0, worst = 0, regionGrads = 0;
    for (int64_t i = 0; i < n; ++i) {
      grads += born[i];
      keptNow += recreated[i];
      worst = std::max(worst, keptNow + grads + rerunWs[i] - kept);
      auto bwd = dyn_cast<BwdOp>(ops[i]);
      if (!bwd) {
        // A sum inside a region's backward: the region's new parameter
        // gradients (a later backward's) are still held beside it.
        worst = std::max(worst, keptNow + grads +
                                    (paramGrads ? 0 : regionGrads) - kept);
        grads -= dies[i];
        continue;
      }
      // Its parameters' gradients: kept from here in the first backward;
      // later made beside the resident ones and added in (a transient).
      int64_t ws = int64_t(bwd.getWorkspace());
      // A checkpoint region's backward (one autograd::grad) hands its
      // parameters' gradients out together at its end: later backwards
      // hold the region's new ones beside the resident ones until then.
      const int64_t r = regions.of(bwd);
      regionGrads = r >= 0 ? regionGrads + cm.gradientBytes(bwd) : 0;
      if (paramGrads)
        grads += cm.gradientBytes(bwd);
      else
        ws += r >= 0 ? regionGrads : cm.gradientBytes(bwd);
      if (r >= 0 && regionEnd.lookup(r) == i)
        regionGrads = 0;
      worst = std::max(worst, keptNow + grads + ws - kept);
      grads -= dies[i];
      keptNow -= freedAfter[i];
    }
    return worst;
  };
  // The heads' forward and backward run with the stage's forward (the tap
  // gradient made then, processed by GFM and clipping, held to the
  // fusion): their transient there.
  const bool features =
      model.getStrategy() &&
      model.getStrategy().getGradientScope() == GradientScope::features;
  const int64_t tapBytes = CostModel::bytes(cm.hiddenType());
  bool gate = false;
  for (FuseTaskGradsOp f : step.getBody().front().getOps<FuseTaskGradsOp>())
    gate = f.getGateHidden().has_value();
  const int64_t gateBuffer = features && gate && tasks.size() >= 2
                                 ? int64_t(tasks.size()) * tapBytes
                                 : 0;

  auto allReduces = step.getBody().front().getOps<AllReduceOp>();
  const AllReduceOp firstBucket =
      allReduces.empty() ? AllReduceOp() : *allReduces.begin();
  PipelinePlanResult out;
  for (const BlockCost &c : blocks) {
    out.blockKeptBytes.push_back(c.kept);
    out.blockForwardSeconds.push_back(c.unitsFwd);
    out.blockBackwardSeconds.push_back(c.unitsBwd);
    out.blockOffloadableBytes.push_back(c.offloadable);
  }
  out.movedForMemory = starts != balanced;
  out.gpipe = budget.getGpipe();
  out.replicas = budget.getReplicas();
  out.microBatches = budget.getAccumulationSteps();
  const int64_t M = out.microBatches;
  const int64_t boundary = CostModel::bytes(cm.hiddenType());
  double slowest = 0;
  for (int64_t s = 0; s < S; ++s) {
    PipelineStagePlan st;
    st.firstUnit = starts[s];
    st.lastUnit = s + 1 < S ? starts[s + 1] - 1 : nblocks - 1;
    st.boundaryBytes = boundary;
    for (int64_t b = st.firstUnit; b <= st.lastUnit; ++b) {
      const BlockCost &c = blocks[b];
      st.forwardSeconds += c.fwd;
      st.backwardSeconds += c.bwd + c.rerun;
      st.keptBytesPerMicroBatch += c.kept;
      st.parameters += c.params;
      st.trainableParameters += c.trainable;
      st.backboneTrainable += c.backboneTrainable;
      st.tasks.append(c.tasks.begin(), c.tasks.end());
      if (c.recomputed)
        st.recomputed.push_back(b);
      if (c.offloaded) {
        st.offloaded.push_back(b);
        st.offloadedBytesPerMicroBatch += c.offloaded;
      }
    }
    llvm::sort(st.tasks);
    // Offload (docs/pipeline.md): as the runtime's gradient hooks bring the
    // blocks back — a block's backward start asks for itself when it is
    // offloaded and for the offloaded blocks right below it, each ending
    // where the one above starts, kPrefetchAhead in all — each comes back
    // at the first that reaches it. Copies out wait after each block's
    // forward (the copy beyond the block's own compute is exposed); copies
    // in queue on one link in the backward's order, stalling it where one
    // is late.
    llvm::DenseMap<int64_t, int64_t> fetchAt;
    int64_t offloadTransient = 0;
    {
      for (int64_t b = st.firstUnit; b <= st.lastUnit; ++b) {
        const BlockCost &c = blocks[b];
        if (c.offloaded) {
          offloadTransient = std::max(offloadTransient, c.offloaded);
          st.transferSeconds += std::max(
              0.0, cm.transferSeconds(c.offloaded) - c.unitsFwd);
        }
        int64_t n = CostModel::kPrefetchAhead - (c.offloaded ? 0 : 1);
        for (int64_t k = c.offloaded ? b : b - 1;
             k >= st.firstUnit && blocks[k].offloaded && n > 0; --k, --n)
          fetchAt[k] = std::max(fetchAt.lookup(k), b);
      }
      double now = 0, link = 0;
      llvm::DenseMap<int64_t, double> back;
      for (int64_t b = st.lastUnit; b >= st.firstUnit; --b) {
        for (int64_t g = b; g >= st.firstUnit; --g)
          if (auto it = fetchAt.find(g); it != fetchAt.end() && it->second == b)
            back[g] = link = std::max(link, now) +
                             cm.transferSeconds(blocks[g].offloaded);
        if (auto it = back.find(b); it != back.end() && it->second > now) {
          st.transferSeconds += it->second - now;
          now = it->second;
        }
        now += blocks[b].unitsBwd + blocks[b].rerun;
      }
    }
    // The received activation is kept for the first unit's backward; the
    // sent one is the root the stage's backward starts from.
    if (s > 0)
      st.keptBytesPerMicroBatch += boundary;
    if (s + 1 < S && !blocks[st.lastUnit].outputKept)
      st.keptBytesPerMicroBatch += boundary;
    st.inFlight = out.gpipe ? M : std::min<int64_t>(M, S - s);
    st.stateBytes =
        CostModel::kWeightBytes * st.parameters +
        (CostModel::kGradientBytes + CostModel::kOptimizerBytes) *
            st.trainableParameters;
    // Features scope: each local task's processed tap gradient waits from
    // its micro-batch's forward to its backward; GFM's transform of one is
    // the heads' transient then.
    const int64_t atForward =
        features && !st.tasks.empty()
            ? CostModel::gfmWorkspace({cm.hiddenType()})
            : 0;
    // A stage after the first: the gradient it sent down waits there until
    // the previous stage takes it.
    const int64_t sent = s > 0 ? boundary : 0;
    // The most micro-batches are in flight at the first backward, before
    // the backbone's gradients exist (they appear during it); the next
    // backward has the gradients and one micro-batch fewer (or, in 1F1B's
    // steady state, as many). The micro-batch in its backward has fused its
    // processed tap gradients: the walk holds them (as the fusion's
    // outputs), the others wait.
    const int64_t tapsHeld =
        features ? int64_t(st.tasks.size()) * tapBytes : 0;
    // With the DGFG gate, micro-batch 0's processed tap gradients go up
    // the pipe for the cosines: a stage before the last holds that buffer
    // (every task's) from micro-batch 0's forward until α comes back
    // before its backward, so through the first forwards only.
    const int64_t gateHeld = s + 1 < S ? gateBuffer : 0;
    // A block's offloaded tensors are on the device in its forward until
    // their copies finish (the runtime waits for them there).
    auto heldWith = [&](int64_t inFlight, bool paramGrads) {
      return std::max(
          inFlight * (st.keptBytesPerMicroBatch + tapsHeld) +
              std::max(atForward, offloadTransient) +
              (paramGrads ? gateHeld : 0),
          inFlight * st.keptBytesPerMicroBatch + (inFlight - 1) * tapsHeld +
              backwardExtra(st.firstUnit, st.lastUnit, paramGrads, fetchAt));
    };
    st.peakBytes = st.stateBytes -
                   CostModel::kGradientBytes * st.backboneTrainable +
                   heldWith(st.inFlight, true) + sent;
    if (M > 1) {
      const int64_t later =
          out.gpipe ? M - 1 : std::min<int64_t>(S - s, M - 1);
      st.peakBytes = std::max(st.peakBytes, st.stateBytes +
                                                heldWith(later, false) + sent);
    }
    // The replicas' exchange of the stage's gradients: GSC's error-feedback
    // residual is held through the step, and the exchange's own transient
    // comes after the last backward, beside the state.
    if (out.replicas > 1) {
      const CostModel::ExchangeMemory ex =
          cm.gradientExchange(st.trainableParameters, firstBucket);
      st.peakBytes = std::max(st.peakBytes + ex.resident,
                              st.stateBytes + ex.resident + ex.transient);
    }
    // docs/cost-model.md, "Communication": a receive is a message and the
    // boundary's bytes; the replicas sum the stage's gradients at the end.
    st.communicationSeconds =
        double(int64_t(s > 0) + int64_t(s + 1 < S)) *
        (cm.messageLatency() + double(boundary) / cm.interconnectBandwidth());
    if (out.replicas > 1) {
      CostModel::Communication ex;
      cm.addGradientExchange(ex, st.trainableParameters, firstBucket);
      out.exchangeSeconds = std::max(out.exchangeSeconds, ex.seconds);
    }
    slowest = std::max(slowest, st.forwardSeconds + st.backwardSeconds +
                                    st.transferSeconds +
                                    st.communicationSeconds);
    out.stages.push_back(std::move(st));
  }
  out.bubble = double(S - 1) / double(M + S - 1);
  out.stepSeconds = double(M + S - 1) * slowest + out.exchangeSeconds;
  return out;
}
