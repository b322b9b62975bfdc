//===- PlanMemory.cpp - the joint keep / recompute / offload plan ---------===//
//
// The simulator is the memory analysis with decisions: a recomputed tensor
// lives from its forward to its last forward use, then again from the start
// of its region's backward (where the region is re-run) to its last use; an
// offloaded tensor leaves the device after its last forward use and comes
// back when its prefetch is issued, one unit group ahead of its backward.
// A unit group is a block or a task's head (MaterializeOffload's, and the
// runtime's per-unit offload scopes), never a many-block candidate: a tensor
// leaves the device only if its own block's backward alone reads it, and its
// prefetch goes one block ahead of its first backward use.
// Added time: the recomputed units' forward time (measured, or the cost
// model's roofline), and the transfer time not
// hidden behind compute, with the host link shared by every copy (copies out
// behind the rest of the forward, prefetches behind the backward between
// their issue and their use).
//
// The search is greedy on the simulated peak per added second, then prunes
// decisions the budget does not need and swaps recompute for offload where
// that is cheaper; small instances are checked against solveExactly().
//
//===----------------------------------------------------------------------===//

#include "passes/PlanMemory.h"
#include "passes/PipelinePlan.h"
#include "mtprt/Zero.h"
#include "passes/Bytes.h"
#include "passes/CostModel.h"
#include "passes/MeasuredCosts.h"
#include "passes/MemoryAnalysis.h"
#include "passes/Passes.h"
#include "passes/StepTimeline.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/EquivalenceClasses.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <numeric>

namespace mtp {
#define GEN_PASS_DEF_PLANMEMORY
#include "passes/Passes.h.inc"
} // namespace mtp

using namespace mlir;
using namespace mtp;


std::vector<SmallVector<StringRef>> mtp::taskGroups(ModelOp model,
                                                   double threshold) {
  SmallVector<TaskOp> tasks(model.getTasks());
  llvm::EquivalenceClasses<StringRef> classes;
  for (TaskOp t : tasks)
    classes.insert(t.getSymName());
  for (auto corr : model.getBody().getOps<CorrelateOp>())
    if (corr.getValue().convertToDouble() >= threshold)
      classes.unionSets(corr.getLhs(), corr.getRhs());
  std::vector<SmallVector<StringRef>> groups;
  llvm::StringMap<size_t> index;
  // Tasks are in forward order (NormalizeSpec), so groups come out ordered by
  // their lowest tap.
  for (TaskOp t : tasks) {
    StringRef leader = classes.getLeaderValue(t.getSymName());
    auto [it, inserted] = index.try_emplace(leader, groups.size());
    if (inserted)
      groups.emplace_back();
    groups[it->second].push_back(t.getSymName());
  }
  return groups;
}


struct MemoryPlanner::Impl {
  struct ValueInfo {
    int64_t bytes = 0;
    int def = 0, lastFwd = 0, last = 0;
    /// The candidate that decides about it (-1: always kept), its block.
    int owner = -1;
    int64_t block = -1;
    /// Blocks of its backward users (-1 for heads); empty: not saved.
    SmallVector<int64_t> bwdBlocks;
    /// The output of a unit of its block's projection chain that a backward
    /// reads: re-created there under Decision::Partial.
    bool chain = false;
    /// Under Decision::Offload: only its own unit group's backward reads it
    /// (it leaves the device after its last non-backward use, offloadAfter),
    /// and where its prefetch is issued.
    bool offloadable = false;
    int offloadAfter = 0, prefetch = 0;
    /// Under Decision::Partial, a chain value's position when re-created.
    int rerun = 0;
  };

  ModelOp model;
  CostModel cost;
  int numOps = 0;
  /// The step's top-level ops as positions: resident state, gradient
  /// arrivals, workspace (the memory analysis's own timeline).
  std::optional<StepTimeline> timeline;
  std::vector<ValueInfo> values;
  std::vector<Candidate> candidates;
  /// Per block: the candidate owning it; its forward FLOPs; its output's
  /// bytes; the first and last positions of its backward.
  llvm::DenseMap<int64_t, int> blockOwner;
  llvm::DenseMap<int64_t, int64_t> blockFlops, blockOutputBytes;
  llvm::DenseMap<int64_t, int> blockBwdStart, blockBwdEnd;
  /// Per candidate: first backward position, prefetch position, last forward
  /// position, offloadable bytes.
  std::vector<int> candBwdStart, candPrefetch, candLastFwd;
  std::vector<int64_t> candOffloadBytes;
  /// Per candidate under Decision::Partial: the first backward position
  /// reading a chain output (where the chain re-runs), its forward FLOPs and
  /// the bytes it frees.
  /// Per candidate: the units of its projection chain in forward order,
  /// the positions they re-run at under Decision::Partial, and what the
  /// re-run holds there besides the values it re-creates for the backward
  /// (outputs no backward reads, each unit's workspace): (from, to, bytes).
  std::vector<SmallVector<FwdOp, 3>> rerunOps;
  std::vector<SmallVector<int, 3>> rerunAt;
  std::vector<SmallVector<std::tuple<int, int, int64_t>>> rerunTransients;
  std::vector<int64_t> candPartialBytes;
  /// Per block: its forward's seconds (what a recompute re-runs); per
  /// candidate under Decision::Partial: its chain's.
  llvm::DenseMap<int64_t, double> blockFwdSeconds, blockBwdSeconds;
  std::vector<double> candPartialSeconds;
  /// The step with everything kept: every op's seconds, the cosine probe's
  /// partial backwards and the optimizer step (offload and recompute come
  /// on top, added()).
  double keepStepSeconds = 0;
  /// Prefix sums of forward / backward compute seconds by position.
  std::vector<double> fwdSecondsBefore, bwdSecondsBefore;
  int64_t numBlocks = 0;
  llvm::DenseSet<int64_t> cutAfter; // a region must end at these blocks
  int64_t uniformSpan = 0;          // uniform(every = k): 2k blocks
  bool fixedRecompute = false;
  double maxLatency = 1.2e-3;
  int64_t usable = INT64_MAX;

  Impl(ModelOp model, const MeasuredCosts *measured)
      : model(model), cost(model), measured(measured) {}

  /// Measured segment costs (mtpc profile), or null: the roofline.
  const MeasuredCosts *measured = nullptr;
  /// Per block / task: backward FLOPs; per task: its head's and loss's
  /// forward FLOPs (the measured segments' times are shared out by FLOPs).
  llvm::DenseMap<int64_t, int64_t> blockBwdFlops;
  llvm::StringMap<std::pair<int64_t, int64_t>> taskFlops;
  /// An op's seconds: its share of its measured segment, or the cost
  /// model's roofline.
  double opSeconds(Operation *op) const;
  /// Re-running block b's forward (recompute), and a candidate's projection
  /// chain (partial).
  double blockSeconds(int64_t b) const;
  double partialSeconds(size_t c) const;
  double transferSeconds(int64_t bytes, bool toHost) const;

  void build();
  std::vector<std::pair<int64_t, int64_t>>
  regions(ArrayRef<Decision> decisions) const;
  /// The simulated peak; with `decided` (per candidate), a lower bound on
  /// the peak of every completion of a partial assignment (the undecided
  /// at Keep in `decisions`).
  int64_t simulate(ArrayRef<Decision> decisions,
                   ArrayRef<char> decided = {}, int *at = nullptr) const;
  /// A lower bound on the added seconds of every completion of `cur` (the
  /// undecided at Keep) that fits, or infinity where none can: what it adds
  /// already, plus the cheapest way the undecided could take `peak - usable`
  /// bytes off position `at` (a fractional knapsack over
  /// what each can free there at most and the least it can cost).
  double completionBound(ArrayRef<Decision> cur, ArrayRef<char> decided,
                         int64_t peak, int at, double added) const;
  /// Per candidate: the values it decides about, and the others' values a
  /// region through its blocks could free (their block and backward
  /// readers span it).
  std::vector<SmallVector<int>> ownValues, spanValues;
  double added(ArrayRef<Decision> decisions) const;
  std::pair<double, std::vector<double>>
  transfers(ArrayRef<Decision> decisions) const;
  bool latencyOk(ArrayRef<Decision> decisions) const;

  // The phases of MemoryPlanner::solve.
  bool allowed(size_t c, Decision d) const;
  std::vector<Decision> frugal(bool exhaustive) const;
  void rankedPrefix(std::vector<Decision> &current) const;
  int64_t greedy(std::vector<Decision> &current, int64_t peak) const;
  void prune(std::vector<Decision> &current) const;
  void localSearch(std::vector<Decision> &current, bool exhaustive) const;
  /// Depth-first branch and bound (MemoryPlanner::branchAndBound).
  BoundResult branchAndBound(std::vector<Decision> incumbent,
                             int64_t maxNodes, bool minimizePeak) const;

  /// Per block: the segment it is in (a run of blocks no region crosses:
  /// regions end at every cut); per segment, the candidates owning its
  /// blocks. A block's region is known once they are all decided.
  llvm::DenseMap<int64_t, int> segmentOf;
  std::vector<SmallVector<int>> segmentOwners;
};

void MemoryPlanner::Impl::build() {
  StepOp step = model.getStep();
  Block &body = step.getBody().front();
  BackboneOp backbone = model.getBackbone();
  StrategyOp strategy = model.getStrategy();
  usable = cost.usableBytes();
  numBlocks = 2 * backbone.getLayers();

  CheckpointPolicy checkpoint =
      strategy ? strategy.getCheckpoint() : CheckpointPolicy::automatic;
  OffloadPolicy offload =
      strategy ? strategy.getOffload() : OffloadPolicy::automatic;
  if (strategy)
    maxLatency = strategy.getMaxOffloadLatency().convertToDouble();
  // ZeRO 3 does not combine with activation offload (the runtime's).
  bool canOffload = offload != OffloadPolicy::none && cost.zeroStage() < 3;

  // Regions end at every tap: the runtime hands heads the region's output.
  int64_t topTap = 0, lowTap = backbone.getLayers(), tasks = 0;
  for (TaskOp t : model.getTasks()) {
    cutAfter.insert(2 * int64_t(t.getTapLayer()));
    topTap = std::max<int64_t>(topTap, t.getTapLayer());
    lowTap = std::min<int64_t>(lowTap, t.getTapLayer());
    ++tasks;
  }
  // And below the cosine probe's layer (the lowest tap): the probe re-runs
  // the regions on its path, and a region reaching below that layer would
  // re-run layers the probe does not need.
  if (tasks > 1 && lowTap > 1 && strategy &&
      strategy.getGradientScope() == GradientScope::features)
    cutAfter.insert(2 * lowTap - 2);

  // Candidates.
  auto addBlocks = [&](std::string name, SmallVector<int64_t> blocks) {
    Candidate c;
    c.name = std::move(name);
    c.blocks = std::move(blocks);
    c.canRecompute = checkpoint != CheckpointPolicy::none;
    c.canOffload = canOffload;
    for (int64_t b : c.blocks)
      blockOwner[b] = candidates.size();
    candidates.push_back(std::move(c));
  };
  auto blockName = [](int64_t b) {
    return "layer " + std::to_string((b + 1) / 2) +
           (b % 2 ? " attention" : " mlp");
  };
  if (checkpoint == CheckpointPolicy::task_granular) {
    // One interval per task group: the blocks from above the previous
    // group's highest tap up to this group's highest tap, recomputed (or
    // not) as one. Correlated tasks share an interval; uncorrelated ones get
    // their own.
    double threshold = strategy.getGroupThreshold().convertToDouble();
    auto groups = taskGroups(model, threshold);
    llvm::StringMap<int64_t> tap;
    for (TaskOp t : model.getTasks())
      tap[t.getSymName()] = t.getTapLayer();
    std::vector<std::pair<int64_t, std::string>> ends;
    for (auto &group : groups) {
      int64_t high = 0;
      std::string names;
      for (StringRef t : group) {
        high = std::max(high, tap.lookup(t));
        names += (names.empty() ? "" : " ") + t.str();
      }
      ends.push_back({high, names});
    }
    llvm::sort(ends);
    // The no-grad layers keep nothing: no interval there.
    int64_t from = 2 * std::max<int64_t>(0, cost.noGradTop()) + 1;
    for (auto &[high, names] : ends) {
      SmallVector<int64_t> blocks;
      for (int64_t b = from; b <= 2 * high; ++b)
        blocks.push_back(b);
      if (blocks.empty())
        continue;
      addBlocks("layers " + std::to_string((from + 1) / 2) + "-" +
                    std::to_string(high) + " (" + names + ")",
                blocks);
      from = 2 * high + 1;
    }
  } else {
    // The no-grad layers keep nothing to plan. A frozen layer above them
    // keeps no projection input for its weights: no tensor-grain path.
    for (int64_t b = 2 * std::max<int64_t>(0, cost.noGradTop()) + 1;
         b <= 2 * topTap; ++b) {
      addBlocks(blockName(b), {b});
      candidates.back().canPartial =
          checkpoint == CheckpointPolicy::automatic &&
          !cost.frozen((b + 1) / 2) &&
          !cost.projectionChain(/*attention=*/b % 2 == 1).empty();
    }
    if (checkpoint == CheckpointPolicy::uniform) {
      fixedRecompute = true;
      uniformSpan = 2 * strategy.getCheckpointEvery();
    }
  }
  // The planner's own regions (auto, task-granular) end at every layer: a
  // run of recomputed blocks spanning k layers would re-run all k at once in
  // the backward (and the cosine probe re-runs what is on its path), while a
  // cut keeps only one [B,S,H] boundary per layer, for the same recompute
  // FLOPs. So recomputing everything reaches uniform(every = 1)'s peak.
  if (!uniformSpan)
    uniformSpan = 2;
  llvm::StringMap<int> headOwner;
  for (TaskOp t : model.getTasks()) {
    Candidate c;
    c.name = ("head " + t.getSymName()).str();
    c.task = t.getSymName().str();
    c.canOffload = canOffload;
    headOwner[c.task] = candidates.size();
    candidates.push_back(std::move(c));
  }

  // A tensor-grain block's chain re-runs, when the plan says Partial, just
  // before the first backward unit that reads one of its outputs (where
  // --mtp-materialize-checkpoints puts its mtp.recompute): its units get
  // positions of their own there, empty unless the block is Partial.
  llvm::DenseMap<Operation *, int> rerunBefore; // first reader -> candidate
  rerunOps.assign(candidates.size(), {});
  {
    std::vector<Operation *> firstReader(candidates.size(), nullptr);
    for (FwdOp fwd : body.getOps<FwdOp>()) {
      const int64_t b = getBlockNumber(fwd.getUnit(), fwd.getLayer());
      auto owner = blockOwner.find(b);
      if (fwd.getTaskAttr() || owner == blockOwner.end() ||
          !candidates[owner->second].canPartial ||
          !cost.inProjectionChain(b, fwd.getUnit()))
        continue;
      rerunOps[owner->second].push_back(fwd);
      for (Operation *user : fwd.getOutput().getUsers())
        if (isa<BwdOp>(user) &&
            (!firstReader[owner->second] ||
             user->isBeforeInBlock(firstReader[owner->second])))
          firstReader[owner->second] = user;
    }
    for (size_t c = 0; c < candidates.size(); ++c)
      if (firstReader[c])
        rerunBefore[firstReader[c]] = c;
      else
        rerunOps[c].clear();
  }
  // Positions: the timeline of the step as it stands (nothing materialized),
  // with those re-run positions (null ops: no workspace of their own).
  llvm::DenseMap<Operation *, int> position;
  SmallVector<Operation *> order;
  rerunAt.assign(candidates.size(), {});
  for (Operation &op : body) {
    if (auto it = rerunBefore.find(&op); it != rerunBefore.end())
      for (size_t k = 0; k < rerunOps[it->second].size(); ++k) {
        rerunAt[it->second].push_back(numOps++);
        order.push_back(nullptr);
      }
    position[&op] = numOps++;
    order.push_back(&op);
  }
  timeline.emplace(model, cost, order);
  fwdSecondsBefore.assign(numOps + 1, 0.0);
  bwdSecondsBefore.assign(numOps + 1, 0.0);
  candBwdStart.assign(candidates.size(), numOps);
  candLastFwd.assign(candidates.size(), 0);
  candOffloadBytes.assign(candidates.size(), 0);
  candPartialBytes.assign(candidates.size(), 0);
  candPartialSeconds.assign(candidates.size(), 0.0);
  auto ownerOf = [&](int64_t block, FlatSymbolRefAttr task) -> int {
    if (task)
      return headOwner.lookup(task.getValue());
    auto it = blockOwner.find(block);
    return it == blockOwner.end() ? -1 : it->second;
  };
  // FLOPs per segment first: a measured segment's time is shared out over
  // its ops by them.
  for (Operation &op : body) {
    if (auto fwd = dyn_cast<FwdOp>(&op)) {
      if (FlatSymbolRefAttr task = fwd.getTaskAttr())
        taskFlops[task.getValue()].first += fwd.getFlops();
      else
        blockFlops[getBlockNumber(fwd.getUnit(), fwd.getLayer())] +=
            fwd.getFlops();
    } else if (auto bwd = dyn_cast<BwdOp>(&op)) {
      if (FlatSymbolRefAttr task = bwd.getTaskAttr())
        taskFlops[task.getValue()].second += bwd.getFlops();
      else
        blockBwdFlops[getBlockNumber(bwd.getUnit(), bwd.getLayer())] +=
            bwd.getFlops();
    }
  }
  // Order of backward unit groups, for prefetch positions.
  SmallVector<std::pair<int, int>> bwdGroups; // (start position, candidate)
  for (Operation &op : body) {
    int pos = position[&op];
    // The units' and the gradient pipeline's compute time on the timeline
    // (the optimizer step runs after every transfer: only the step's total
    // counts it).
    double fwdS = 0, bwdS = 0;
    const double seconds = isa<CostOpInterface>(&op) ? opSeconds(&op) : 0.0;
    keepStepSeconds += seconds;
    if (isa<CostOpInterface>(&op) && !isa<OptimizerStepOp>(op))
      (isa<FwdOp>(op) ? fwdS : bwdS) = seconds;
    if (auto fwd = dyn_cast<FwdOp>(&op)) {
      int64_t b = getBlockNumber(fwd.getUnit(), fwd.getLayer());
      if (b > 0) {
        blockFwdSeconds[b] += seconds;
        int owner = ownerOf(b, {});
        if (owner >= 0 && candidates[owner].canPartial &&
            cost.inProjectionChain(b, fwd.getUnit())) {
          candPartialSeconds[owner] += seconds;
        }
        if (fwd.getUnit() == UnitKind::attn_residual ||
            fwd.getUnit() == UnitKind::mlp_residual ||
            fwd.getUnit() == UnitKind::final_norm)
          blockOutputBytes[b] = CostModel::bytes(fwd.getOutput().getType());
      }
    } else if (auto bwd = dyn_cast<BwdOp>(&op)) {
      int64_t b = getBlockNumber(bwd.getUnit(), bwd.getLayer());
      if (!bwd.getTaskAttr())
        blockBwdSeconds[b] += seconds;
      if (b > 0) {
        if (!blockBwdStart.count(b))
          blockBwdStart[b] = pos;
        blockBwdEnd[b] = pos;
      }
      int owner = ownerOf(b, bwd.getTaskAttr());
      if (owner >= 0) {
        candBwdStart[owner] = std::min(candBwdStart[owner], pos);
        if (bwdGroups.empty() || bwdGroups.back().second != owner)
          bwdGroups.push_back({pos, owner});
      }
    }
    fwdSecondsBefore[pos + 1] = fwdS;
    bwdSecondsBefore[pos + 1] = bwdS;
  }
  // Prefix sums (a re-run position computes nothing unless planned, and
  // its time is the plan's added time).
  for (int pos = 0; pos < numOps; ++pos) {
    fwdSecondsBefore[pos + 1] += fwdSecondsBefore[pos];
    bwdSecondsBefore[pos + 1] += bwdSecondsBefore[pos];
  }
  // The cosine probe's partial backwards, one per task (when the runtime
  // measures cosines, every step by default): its path's blocks once more.
  for (auto [low, high] : cost.cosineProbePaths())
    for (int64_t b = low; b <= high; ++b)
      keepStepSeconds += blockBwdSeconds.lookup(b);
  // Prefetch one unit group ahead of the first use.
  candPrefetch.assign(candidates.size(), numOps);
  for (size_t i = 0; i < bwdGroups.size(); ++i) {
    int c = bwdGroups[i].second;
    if (candPrefetch[c] != numOps)
      continue;
    candPrefetch[c] = i > 0 ? bwdGroups[i - 1].first : bwdGroups[i].first;
  }

  // Values.
  for (Operation &op : body) {
    for (Value v : op.getResults()) {
      ValueInfo info;
      info.bytes = CostModel::bytes(v.getType());
      info.def = info.lastFwd = info.last = position[&op];
      for (Operation *user : v.getUsers()) {
        int p = position[user];
        info.last = std::max(info.last, p);
        if (isa<FwdOp>(user))
          info.lastFwd = std::max(info.lastFwd, p);
        if (auto bwd = dyn_cast<BwdOp>(user))
          info.bwdBlocks.push_back(bwd.getTaskAttr()
                                       ? -1
                                       : getBlockNumber(bwd.getUnit(), bwd.getLayer()));
      }
      if (auto fwd = dyn_cast<FwdOp>(&op)) {
        info.block = getBlockNumber(fwd.getUnit(), fwd.getLayer());
        info.owner = ownerOf(info.block, fwd.getTaskAttr());
        if (info.owner >= 0 && candidates[info.owner].canPartial &&
            cost.inProjectionChain(info.block, fwd.getUnit()) &&
            v == fwd.getOutput() && !info.bwdBlocks.empty()) {
          info.chain = true;
          candPartialBytes[info.owner] += info.bytes;
          const auto &ops = rerunOps[info.owner];
          info.rerun = rerunAt[info.owner][llvm::find(ops, fwd) - ops.begin()];
        }
        if (info.owner >= 0 && !info.bwdBlocks.empty()) {
          candLastFwd[info.owner] =
              std::max(candLastFwd[info.owner], info.lastFwd);
          // The block's output is kept by the next block's norm, in the
          // same candidate or not: only what the value's own unit group's
          // backward reads is offloaded (MaterializeOffload's `own`).
          if (std::optional<OffloadPlacement> at = placeOffload(fwd, v)) {
            info.offloadable = true;
            candOffloadBytes[info.owner] += info.bytes;
            info.offloadAfter = position[at->lastForward];
            info.prefetch = position[at->issue];
          }
        }
      }
      values.push_back(std::move(info));
    }
  }
  // What a chain's re-run holds besides the values it re-creates: as the
  // materialized mtp.recompute runs its units, each output no backward reads
  // lives until the last unit of the re-run that takes it; each unit's
  // workspace while it runs.
  rerunTransients.assign(candidates.size(), {});
  for (size_t c = 0; c < candidates.size(); ++c)
    for (auto [k, fwd] : llvm::enumerate(rerunOps[c])) {
      const int at = rerunAt[c][k];
      rerunTransients[c].push_back({at, at, int64_t(fwd.getWorkspace())});
      for (Value r : fwd->getResults()) {
        const bool recreated =
            r == fwd.getOutput() &&
            llvm::any_of(r.getUsers(), [](Operation *u) { return isa<BwdOp>(u); });
        if (recreated)
          continue;
        int to = at;
        for (size_t j = k + 1; j < rerunOps[c].size(); ++j)
          if (llvm::is_contained(rerunOps[c][j]->getOperands(), r))
            to = rerunAt[c][j];
        rerunTransients[c].push_back({at, to, CostModel::bytes(r.getType())});
      }
    }
  // A backward's aliased gradients are its incoming one: no bytes of their
  // own, and the incoming one lives as long (walked backwards, so an
  // alias's lifetime is final when its op is reached).
  llvm::DenseMap<Value, size_t> index;
  size_t next = 0;
  for (Operation &op : body)
    for (Value v : op.getResults())
      index[v] = next++;
  for (Operation &op : llvm::reverse(body))
    if (auto bwd = dyn_cast<BwdOp>(&op)) {
      auto it = bwd.getAliases() ? index.find(bwd.getGrads().front())
                                 : index.end();
      if (it == index.end())
        continue;
      ValueInfo &incoming = values[it->second];
      for (Value g : bwd.getInputGrads().take_front(bwd.getAliases())) {
        ValueInfo &alias = values[index.lookup(g)];
        incoming.last = std::max(incoming.last, alias.last);
        alias.bytes = 0;
      }
    }
  // Segments, as regions() cuts them.
  for (int64_t b = 1; b <= numBlocks; ++b) {
    if (b == 1 || cutAfter.count(b - 1) || (b - 1) % uniformSpan == 0)
      segmentOwners.emplace_back();
    segmentOf[b] = int(segmentOwners.size()) - 1;
    auto it = blockOwner.find(b);
    if (it != blockOwner.end() && !llvm::is_contained(segmentOwners.back(), it->second))
      segmentOwners.back().push_back(it->second);
  }
  // What each candidate's decision can free (completionBound).
  ownValues.assign(candidates.size(), {});
  spanValues.assign(candidates.size(), {});
  for (auto [i, v] : llvm::enumerate(values)) {
    if (v.owner < 0 || v.bytes == 0)
      continue;
    ownValues[v.owner].push_back(int(i));
    int64_t lo = v.block, hi = v.block;
    for (int64_t b : v.bwdBlocks)
      if (b >= 0)
        lo = std::min(lo, b), hi = std::max(hi, b);
    for (int64_t b = std::max<int64_t>(lo, 1); b <= hi; ++b) {
      auto it = blockOwner.find(b);
      if (it != blockOwner.end() && it->second != v.owner &&
          (spanValues[it->second].empty() ||
           spanValues[it->second].back() != int(i)))
        spanValues[it->second].push_back(int(i));
    }
  }
}

double MemoryPlanner::Impl::completionBound(ArrayRef<Decision> cur,
                                            ArrayRef<char> decided,
                                            int64_t peak, int at,
                                            double added) const {
  // Every completion holds at `at` at least the kept completion's bytes
  // less what its changed candidates free there. A value leaves only when
  // its owner's decision is not Keep — counted for its owner where that is
  // undecided — or, its owner recomputing already, when a region comes to
  // span it: counted for each undecided candidate in the span. A region
  // already ending below a candidate loses its re-created output when the
  // candidate joins it. Each candidate adds at least its recompute's or
  // re-run's seconds (an offload: nothing, its transfers may hide).
  struct Item {
    double seconds;
    int64_t bytes;
  };
  auto recomputing = [&](int c) {
    return decided[c] && cur[c] == Decision::Recompute;
  };
  auto alive = [&](int i) {
    return values[i].def <= at && at <= values[i].last ? values[i].bytes : 0;
  };
  // A candidate's choices are exclusive: the relaxation takes the lower
  // convex hull of its (bytes, seconds) points as increments (the LP bound
  // of the multiple-choice knapsack).
  SmallVector<Item> items;
  int64_t reachable = 0;
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (decided[c] || cur[c] != Decision::Keep)
      continue;
    SmallVector<Item, 4> points;
    if (allowed(c, Decision::Recompute)) {
      int64_t bytes = 0;
      double seconds = 0;
      for (int i : ownValues[c])
        bytes += alive(i);
      for (int i : spanValues[c])
        if (recomputing(values[i].owner))
          bytes += alive(i);
      if (!candidates[c].blocks.empty()) {
        auto below = blockOwner.find(candidates[c].blocks.front() - 1);
        if (below != blockOwner.end() && recomputing(below->second))
          bytes += blockOutputBytes.lookup(candidates[c].blocks.front() - 1);
      }
      for (int64_t b : candidates[c].blocks)
        seconds += blockSeconds(b);
      points.push_back({seconds, bytes});
    }
    if (allowed(c, Decision::Partial)) {
      int64_t bytes = 0;
      for (int i : ownValues[c])
        if (values[i].chain)
          bytes += alive(i);
      points.push_back({partialSeconds(c), bytes});
    }
    if (allowed(c, Decision::Offload)) {
      int64_t bytes = 0;
      for (int i : ownValues[c])
        if (values[i].offloadable)
          bytes += alive(i);
      points.push_back({0.0, bytes});
    }
    // The Pareto points (more bytes for more seconds) by bytes, from Keep's
    // origin, then their lower convex hull.
    SmallVector<Item, 4> pareto;
    for (const Item &q : points) {
      bool dominated = q.bytes <= 0;
      for (const Item &r : points)
        dominated |= (r.bytes > q.bytes && r.seconds <= q.seconds) ||
                     (r.bytes == q.bytes && r.seconds < q.seconds);
      if (!dominated)
        pareto.push_back(q);
    }
    llvm::sort(pareto, [](const Item &x, const Item &y) {
      return x.bytes < y.bytes;
    });
    SmallVector<Item, 4> hull{{0.0, 0}};
    for (const Item &q : pareto) {
      if (q.bytes == hull.back().bytes)
        continue;
      while (hull.size() >= 2) {
        const Item &o = hull[hull.size() - 2], &m = hull.back();
        // m on or above the chord o..q: not a vertex of the lower hull.
        if ((m.seconds - o.seconds) * double(q.bytes - o.bytes) >=
            (q.seconds - o.seconds) * double(m.bytes - o.bytes))
          hull.pop_back();
        else
          break;
      }
      hull.push_back(q);
    }
    for (size_t k = 1; k < hull.size(); ++k) {
      items.push_back({hull[k].seconds - hull[k - 1].seconds,
                       hull[k].bytes - hull[k - 1].bytes});
      reachable += hull[k].bytes - hull[k - 1].bytes;
    }
  }
  int64_t need = peak - usable;
  if (reachable < need)
    return INFINITY;
  llvm::sort(items, [](const Item &a, const Item &b) {
    return a.seconds * double(b.bytes) < b.seconds * double(a.bytes);
  });
  double bound = added;
  for (const Item &item : items) {
    if (need <= 0)
      break;
    const int64_t take = std::min(need, item.bytes);
    bound += item.seconds * double(take) / double(item.bytes);
    need -= take;
  }
  return bound;
}

double MemoryPlanner::Impl::opSeconds(Operation *op) const {
  auto costly = cast<CostOpInterface>(op);
  if (measured && measured->optimizer > 0 && isa<OptimizerStepOp>(op))
    return measured->optimizer;
  std::optional<UnitRef> unit = getUnitRef(op);
  if (!measured || !unit)
    return cost.opSeconds(op);
  const bool forward = isa<FwdOp>(op);
  const double flops = double(costly.getFlopCount());
  auto share = [&](double segment, int64_t total) {
    return total > 0 ? segment * flops / double(total) : 0.0;
  };
  if (unit->task) {
    auto seconds = measured->heads.lookup(unit->task.getValue());
    auto total = taskFlops.lookup(unit->task.getValue());
    return forward ? share(seconds.first, total.first)
                   : share(seconds.second, total.second);
  }
  const int64_t b = getBlockNumber(unit->kind, unit->layer);
  if (b == 0)
    return forward ? share(measured->embedFwd, blockFlops.lookup(0))
                   : share(measured->embedBwd, blockBwdFlops.lookup(0));
  return forward ? share(measured->blockFwd[b % 2], blockFlops.lookup(b))
                 : share(measured->blockBwd[b % 2], blockBwdFlops.lookup(b));
}

double MemoryPlanner::Impl::blockSeconds(int64_t b) const {
  return blockFwdSeconds.lookup(b);
}

double MemoryPlanner::Impl::partialSeconds(size_t c) const {
  if (!measured)
    return candPartialSeconds[c];
  double s = 0;
  for (int64_t b : candidates[c].blocks)
    s += measured->chain[b % 2];
  return s;
}

double MemoryPlanner::Impl::transferSeconds(int64_t bytes, bool toHost) const {
  if (!measured)
    return cost.transferSeconds(bytes);
  return double(bytes) / (toHost ? measured->toHost : measured->toDevice);
}

std::vector<std::pair<int64_t, int64_t>>
MemoryPlanner::Impl::regions(ArrayRef<Decision> decisions) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t start = -1;
  for (int64_t b = 1; b <= numBlocks + 1; ++b) {
    auto it = blockOwner.find(b);
    bool rec = b <= numBlocks && it != blockOwner.end() &&
               decisions[it->second] == Decision::Recompute;
    if (rec && start < 0)
      start = b;
    bool endHere = start >= 0 &&
                   (!rec || cutAfter.count(b - 1) ||
                    (uniformSpan && (b - 1) % uniformSpan == 0));
    if (start >= 0 && b > start && endHere && !(rec && b == start)) {
      out.push_back({start, b - 1});
      start = rec ? b : -1;
    }
  }
  return out;
}

int64_t MemoryPlanner::Impl::simulate(ArrayRef<Decision> decisions,
                                      ArrayRef<char> decided, int *at) const {
  // Only the peak counts here, not its breakdown (one array, not two: this
  // runs for every assignment the search tries).
  StepTimeline::Live alive = timeline->live(/*breakdown=*/false);
  auto live = [&](int from, int to, int64_t bytes) {
    alive.add(from, to, bytes, /*forward=*/true);
  };
  // A partial assignment: a value whose decision (or region) is not known
  // yet is alive only where every choice keeps it — through its forward
  // uses and at its last use; a region not known yet is left out. Each is a
  // subset of what any completion has alive, and the sweep's peak (and the
  // probe's workspace, growing with the regions) only grows with more.
  const bool partial = !decided.empty();
  auto regionKnown = [&](int64_t block) {
    if (!partial)
      return true;
    auto seg = segmentOf.find(block);
    return seg == segmentOf.end() ||
           llvm::all_of(segmentOwners[seg->second],
                        [&](int c) { return decided[c] != 0; });
  };
  // Which region each block is in.
  llvm::DenseMap<int64_t, std::pair<int64_t, int64_t>> regionOf;
  std::vector<std::pair<int64_t, int64_t>> planned = regions(decisions);
  if (partial)
    llvm::erase_if(planned, [&](auto r) { return !regionKnown(r.first); });
  for (auto [first, last] : planned) {
    for (int64_t b = first; b <= last; ++b)
      regionOf[b] = {first, last};
    // The region re-runs at the start of its backward and holds the output
    // it re-creates until its backward ends (the materialized step's
    // mtp.release).
    int start = blockBwdStart.lookup(last), end = blockBwdEnd.lookup(first);
    live(start, end, blockOutputBytes.lookup(last));
  }
  for (const ValueInfo &v : values) {
    Decision d = v.owner >= 0 ? decisions[v.owner] : Decision::Keep;
    if (partial && v.owner >= 0 && !v.bwdBlocks.empty() &&
        (!decided[v.owner] ||
         (d == Decision::Recompute && !regionKnown(v.block)))) {
      live(v.def, v.lastFwd, v.bytes);
      live(v.last, v.last, v.bytes);
      continue;
    }
    if (d == Decision::Keep || v.bwdBlocks.empty() ||
        (d == Decision::Partial && !v.chain)) {
      live(v.def, v.last, v.bytes);
      continue;
    }
    if (d == Decision::Partial) {
      // Re-created from the block's kept input at the first backward unit
      // that reads a chain output.
      live(v.def, v.lastFwd, v.bytes);
      live(v.rerun, v.last, v.bytes);
      continue;
    }
    if (d == Decision::Recompute) {
      auto it = regionOf.find(v.block);
      bool inside = it != regionOf.end() &&
                    llvm::all_of(v.bwdBlocks, [&](int64_t b) {
                      return b >= it->second.first && b <= it->second.second;
                    });
      if (!inside) {
        live(v.def, v.last, v.bytes);
        continue;
      }
      live(v.def, v.lastFwd, v.bytes);
      live(blockBwdStart.lookup(it->second.second), v.last, v.bytes);
      continue;
    }
    // Offload: what only its own unit group's backward reads leaves the
    // device, and is back from its prefetch, one block ahead (a fixed
    // position: the other decisions do not move it).
    if (!v.offloadable) {
      live(v.def, v.last, v.bytes);
      continue;
    }
    live(v.def, v.offloadAfter, v.bytes);
    live(v.prefetch, v.last, v.bytes);
  }
  // The probe's backward re-creates a decided tensor-grain block on its
  // path too (more such blocks only add to its workspace).
  SmallVector<int64_t> partialBlocks;
  for (size_t c = 0; c < candidates.size(); ++c)
    if (decisions[c] == Decision::Partial) {
      for (auto [from, to, bytes] : rerunTransients[c])
        live(from, to, bytes);
      if (!partial || decided[c])
        llvm::append_range(partialBlocks, candidates[c].blocks);
    }
  StepTimeline::Peak peak = timeline->peak(alive, planned, partialBlocks);
  if (at)
    *at = peak.position;
  return peak.bytes;
}

/// The host link as one stream each way, first come first served: copies
/// out queue behind each other after each candidate's last forward use and
/// must drain before the backward starts; prefetches are issued one unit
/// group ahead, queue the same way, and the backward stalls for any copy not
/// back by its use. Returns the total stall and each prefetch's exposed wait.
std::pair<double, std::vector<double>>
MemoryPlanner::Impl::transfers(ArrayRef<Decision> decisions) const {
  std::vector<int> offloaded;
  for (size_t c = 0; c < candidates.size(); ++c)
    if (decisions[c] == Decision::Offload && candOffloadBytes[c] > 0)
      offloaded.push_back(c);
  std::vector<double> exposed(candidates.size(), 0.0);
  double stall = 0;
  // Out: behind the rest of the forward.
  llvm::sort(offloaded, [&](int a, int b) { return candLastFwd[a] < candLastFwd[b]; });
  double end = 0;
  for (int c : offloaded) {
    double ready = fwdSecondsBefore[candLastFwd[c] + 1];
    end = std::max(end, ready) +
          transferSeconds(candOffloadBytes[c], /*toHost=*/true);
  }
  stall += std::max(0.0, end - fwdSecondsBefore[numOps]);
  // In: in backward order.
  llvm::sort(offloaded, [&](int a, int b) { return candBwdStart[a] < candBwdStart[b]; });
  end = 0;
  double backStall = 0;
  for (int c : offloaded) {
    double issue = bwdSecondsBefore[std::min(candPrefetch[c], candBwdStart[c])] + backStall;
    double use = bwdSecondsBefore[candBwdStart[c]] + backStall;
    end = std::max(end, issue) +
          transferSeconds(candOffloadBytes[c], /*toHost=*/false);
    if (end > use) {
      exposed[c] = end - use;
      backStall += end - use;
    }
  }
  return {stall + backStall, exposed};
}

double MemoryPlanner::Impl::added(ArrayRef<Decision> decisions) const {
  double seconds = transfers(decisions).first;
  for (size_t c = 0; c < candidates.size(); ++c)
    if (decisions[c] == Decision::Recompute)
      for (int64_t b : candidates[c].blocks)
        seconds += blockSeconds(b);
    else if (decisions[c] == Decision::Partial)
      seconds += partialSeconds(c);
  return seconds;
}

bool MemoryPlanner::Impl::latencyOk(ArrayRef<Decision> decisions) const {
  for (double wait : transfers(decisions).second)
    if (wait > maxLatency)
      return false;
  return true;
}

MemoryPlanner::MemoryPlanner(ModelOp model, const MeasuredCosts *measured)
    : impl(new Impl(model, measured)) {
  impl->build();
}
MemoryPlanner::~MemoryPlanner() = default;

int64_t MemoryPlanner::simulatePeak(ArrayRef<Decision> d) const {
  return impl->simulate(d);
}
double MemoryPlanner::addedSeconds(ArrayRef<Decision> d) const {
  return impl->added(d);
}
bool MemoryPlanner::latencyOk(ArrayRef<Decision> d) const {
  return impl->latencyOk(d);
}
std::vector<PlanResult::Offload>
MemoryPlanner::offloads(ArrayRef<Decision> d) const {
  std::vector<PlanResult::Offload> out;
  std::vector<double> waits = impl->transfers(d).second;
  for (size_t c = 0; c < d.size(); ++c)
    if (d[c] == Decision::Offload)
      out.push_back({c, impl->candOffloadBytes[c], waits[c]});
  return out;
}

const std::vector<Candidate> &MemoryPlanner::getCandidates() const {
  return impl->candidates;
}
int64_t MemoryPlanner::budget() const { return impl->usable; }
double MemoryPlanner::keepStepSeconds() const { return impl->keepStepSeconds; }

namespace {
/// Fills in the figures of a result from its decisions.
void finish(const MemoryPlanner &planner, PlanResult &r,
            const std::function<std::vector<std::pair<int64_t, int64_t>>(
                ArrayRef<Decision>)> &regions) {
  r.peakBytes = planner.simulatePeak(r.decisions);
  r.addedSeconds = planner.addedSeconds(r.decisions);
  r.fits = r.peakBytes <= planner.budget();
  r.regions = regions(r.decisions);
  r.offloads = planner.offloads(r.decisions);
}
} // namespace

namespace {
const Decision kAllDecisions[] = {Decision::Keep, Decision::Recompute,
                                  Decision::Offload, Decision::Partial};
} // namespace

bool MemoryPlanner::Impl::allowed(size_t c, Decision d) const {
  const Candidate &cand = candidates[c];
  if (fixedRecompute && !cand.blocks.empty())
    return d == Decision::Recompute;
  return d == Decision::Keep ||
         (d == Decision::Recompute && cand.canRecompute) ||
         (d == Decision::Offload && cand.canOffload) ||
         (d == Decision::Partial && cand.canPartial);
}

std::vector<Decision> MemoryPlanner::Impl::frugal(bool exhaustive) const {
  const size_t n = candidates.size();
  std::vector<Decision> frugal(n, Decision::Keep);
  if (!exhaustive) {
    // Recompute where allowed, else offload.
    for (size_t c = 0; c < n; ++c)
      frugal[c] = candidates[c].canRecompute ? Decision::Recompute
                  : candidates[c].canOffload ? Decision::Offload
                                             : Decision::Keep;
    return frugal;
  }
  // Each candidate's choice that lowers the peak most, one at a time.
  for (size_t c = 0; c < n; ++c) {
    int64_t best = INT64_MAX;
    for (Decision d : kAllDecisions) {
      if (!allowed(c, d))
        continue;
      std::vector<Decision> trial = frugal;
      trial[c] = d;
      if (d == Decision::Offload && !latencyOk(trial))
        continue;
      int64_t p = simulate(trial);
      if (p < best) {
        best = p;
        frugal[c] = d;
      }
    }
  }
  return frugal;
}

void MemoryPlanner::Impl::rankedPrefix(std::vector<Decision> &current) const {
  // Rank each candidate's move by the bytes it frees per second it costs
  // (alone), then take the shortest prefix of that ranking whose simulated
  // peak fits: a binary search, a dozen simulations.
  const size_t n = candidates.size();
  struct Move {
    size_t c;
    Decision d;
    double score;
  };
  std::vector<Move> moves;
  for (size_t c = 0; c < n; ++c) {
    if (current[c] != Decision::Keep || candOffloadBytes[c] == 0)
      continue;
    double freed = double(candOffloadBytes[c]);
    double best = -1;
    Decision bestD = Decision::Keep;
    if (candidates[c].canRecompute) {
      double t = 0;
      for (int64_t b : candidates[c].blocks)
        t += blockSeconds(b);
      best = freed / std::max(t, 1e-12), bestD = Decision::Recompute;
    }
    if (candidates[c].canPartial && candPartialBytes[c] > 0) {
      double score = double(candPartialBytes[c]) /
                     std::max(partialSeconds(c), 1e-12);
      if (score > best)
        best = score, bestD = Decision::Partial;
    }
    if (candidates[c].canOffload) {
      std::vector<Decision> alone(n, Decision::Keep);
      alone[c] = Decision::Offload;
      double t = added(alone);
      if (freed / std::max(t, 1e-12) > best && latencyOk(alone))
        best = freed / std::max(t, 1e-12), bestD = Decision::Offload;
    }
    if (bestD != Decision::Keep)
      moves.push_back({c, bestD, best});
  }
  llvm::stable_sort(moves, [](const Move &a, const Move &b) {
    return a.score > b.score;
  });
  auto prefix = [&](size_t k) {
    std::vector<Decision> d = current;
    for (size_t i = 0; i < k; ++i)
      d[moves[i].c] = moves[i].d;
    return d;
  };
  size_t lo = 0, hi = moves.size();
  if (simulate(prefix(hi)) <= usable) {
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (simulate(prefix(mid)) <= usable)
        hi = mid;
      else
        lo = mid + 1;
    }
  }
  current = prefix(hi);
}

int64_t MemoryPlanner::Impl::greedy(std::vector<Decision> &current,
                                    int64_t peak) const {
  // The move that lowers the simulated peak most per added second, until the
  // budget holds or no move lowers it.
  const size_t n = candidates.size();
  while (peak > usable) {
    int bestC = -1;
    Decision bestD = Decision::Keep;
    double bestScore = -1;
    int64_t bestPeak = peak;
    double now = added(current);
    for (size_t c = 0; c < n; ++c) {
      if (current[c] != Decision::Keep)
        continue;
      for (Decision d :
           {Decision::Recompute, Decision::Offload, Decision::Partial}) {
        if (!allowed(c, d))
          continue;
        std::vector<Decision> trial = current;
        trial[c] = d;
        if (d == Decision::Offload && !latencyOk(trial))
          continue;
        double dt = std::max(added(trial) - now, 1e-12);
        int64_t p = simulate(trial);
        int64_t gain = peak - p;
        if (gain <= 0)
          continue;
        double score = double(gain) / dt;
        if (score > bestScore)
          bestScore = score, bestC = c, bestD = d, bestPeak = p;
      }
    }
    if (bestC < 0)
      break;
    current[bestC] = bestD;
    peak = bestPeak;
  }
  return peak;
}

void MemoryPlanner::Impl::prune(std::vector<Decision> &current) const {
  // Drop what the budget does not need, costliest first; then swap a
  // recompute for an offload (or back) where that is cheaper and still fits.
  const size_t n = candidates.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto costOf = [&](size_t c) {
    std::vector<Decision> alone(n, Decision::Keep);
    alone[c] = current[c];
    return added(alone);
  };
  llvm::sort(order, [&](size_t a, size_t b) { return costOf(a) > costOf(b); });
  for (size_t c : order) {
    if (current[c] == Decision::Keep ||
        (fixedRecompute && !candidates[c].blocks.empty()))
      continue;
    Decision was = current[c];
    current[c] = Decision::Keep;
    if (simulate(current) > usable)
      current[c] = was;
  }
  for (size_t c : order) {
    if (current[c] == Decision::Keep)
      continue;
    for (Decision other :
         {Decision::Recompute, Decision::Offload, Decision::Partial}) {
      if (other == current[c] || !allowed(c, other))
        continue;
      std::vector<Decision> trial = current;
      trial[c] = other;
      if (latencyOk(trial) && simulate(trial) <= usable &&
          added(trial) < added(current))
        current = trial;
    }
  }
}

void MemoryPlanner::Impl::localSearch(std::vector<Decision> &current,
                                      bool exhaustive) const {
  // Any single change, then (on small instances) any pair of changes, that
  // still fits and costs less; up to eight rounds.
  const size_t n = candidates.size();
  auto acceptable = [&](ArrayRef<Decision> trial) {
    return latencyOk(trial) && simulate(trial) <= usable;
  };
  bool improved = true;
  for (int round = 0; improved && round < 8; ++round) {
    improved = false;
    double now = added(current);
    for (size_t c = 0; c < n && exhaustive; ++c)
      for (Decision d : kAllDecisions) {
        if (d == current[c] || !allowed(c, d))
          continue;
        std::vector<Decision> trial = current;
        trial[c] = d;
        double t = added(trial);
        if (t < now && acceptable(trial))
          current = trial, now = t, improved = true;
      }
    if (n > 24 || !exhaustive)
      continue;
    for (size_t a = 0; a < n; ++a)
      for (size_t c = a + 1; c < n; ++c)
        for (Decision da : kAllDecisions)
          for (Decision dc : kAllDecisions) {
            if ((da == current[a] && dc == current[c]) || !allowed(a, da) ||
                !allowed(c, dc))
              continue;
            std::vector<Decision> trial = current;
            trial[a] = da, trial[c] = dc;
            double t = added(trial);
            if (t < now && acceptable(trial))
              current = trial, now = t, improved = true;
          }
  }
}

BoundResult MemoryPlanner::Impl::branchAndBound(std::vector<Decision> incumbent,
                                                int64_t maxNodes,
                                                bool minimizePeak) const {
  const size_t n = candidates.size();
  BoundResult best;
  if (incumbent.size() == n && latencyOk(incumbent)) {
    int64_t p = simulate(incumbent);
    if (minimizePeak || p <= usable)
      best = {incumbent, added(incumbent), p, 0, false};
  }
  // Each candidate's choices, the cheapest alone first (Keep), so the first
  // plans the depth-first search meets are cheap ones.
  std::vector<SmallVector<Decision, 3>> choices(n);
  std::vector<char> decided(n, 0);
  std::vector<Decision> cur(n, Decision::Keep);
  std::vector<size_t> order;
  for (size_t c = 0; c < n; ++c) {
    std::vector<std::pair<double, Decision>> costed;
    for (Decision d : kAllDecisions)
      if (allowed(c, d)) {
        std::vector<Decision> alone(n, Decision::Keep);
        alone[c] = d;
        costed.push_back({d == Decision::Keep ? -1.0 : added(alone), d});
      }
    llvm::stable_sort(costed, [](auto &a, auto &b) { return a.first < b.first; });
    for (auto &[t, d] : costed)
      choices[c].push_back(d);
    if (choices[c].size() == 1) {
      cur[c] = choices[c].front();
      decided[c] = 1;
    } else {
      order.push_back(c);
    }
  }
  // The candidates deciding most bytes first (they move the bound most), a
  // segment's together (its region is known, and bounded tightly, once they
  // are all decided).
  auto key = [&](size_t c) -> std::pair<int64_t, int64_t> {
    if (candidates[c].blocks.empty())
      return {candOffloadBytes[c], int64_t(c)};
    int seg = segmentOf.lookup(candidates[c].blocks.front());
    int64_t bytes = 0;
    for (int o : segmentOwners[seg])
      bytes += candOffloadBytes[o];
    return {bytes, -int64_t(seg) - 1};
  };
  llvm::stable_sort(order, [&](size_t a, size_t b) {
    auto ka = key(a), kb = key(b);
    return ka.first != kb.first ? ka.first > kb.first : ka.second < kb.second;
  });

  int64_t nodes = 0;
  bool stopped = false;
  double rootBound = 0;
  // A node's figures: its added seconds, its undecided-kept completion's
  // peak and where, and the bound on its fitting completions' seconds.
  struct Eval {
    double t = 0, bound = 0;
    int64_t p = 0;
    int at = -1;
  };
  auto evaluate = [&](std::optional<Eval> &e) {
    if (e)
      return;
    e.emplace();
    e->t = added(cur);
    e->p = simulate(cur, {}, &e->at);
    e->bound = e->p <= usable || e->at < 0
                   ? e->t
                   : completionBound(cur, decided, e->p, e->at, e->t);
  };
  std::function<void(size_t, std::optional<Eval>)> visit =
      [&](size_t i, std::optional<Eval> e) {
    if (stopped)
      return;
    if (++nodes > maxNodes) {
      stopped = true;
      return;
    }
    const bool found = !best.decisions.empty();
    if (minimizePeak) {
      if (found && simulate(cur, decided) >= best.peak)
        return;
      // The undecided kept is a plan too.
      int64_t p = simulate(cur);
      if ((!found || p < best.peak) && latencyOk(cur))
        best = {cur, added(cur), p, 0, false};
    } else {
      // Every completion costs at least t (recompute adds its FLOPs,
      // another offload never shortens the link's queues) and at least the
      // bound, and peaks at least at the partial simulation's peak.
      evaluate(e);
      if (i == 0 && e->p > usable && std::isfinite(e->bound))
        rootBound = e->bound;
      if (!std::isfinite(e->bound) || (found && e->bound >= best.seconds))
        return;
      if (simulate(cur, decided) > usable)
        return;
      // The undecided kept is the cheapest completion: if it fits, nothing
      // below this node is better.
      if (e->p <= usable && latencyOk(cur)) {
        best = {cur, e->t, e->p, 0, false};
        return;
      }
    }
    if (i == order.size())
      return;
    size_t c = order[i];
    decided[c] = 1;
    // The child whose completions may cost least first (a fitting one at
    // its own seconds): good plans found early prune the rest.
    SmallVector<std::pair<Decision, std::optional<Eval>>, 4> next;
    for (Decision d : choices[c]) {
      cur[c] = d;
      std::optional<Eval> child;
      if (!minimizePeak)
        evaluate(child);
      next.push_back({d, child});
    }
    if (!minimizePeak)
      llvm::stable_sort(next, [](auto &x, auto &y) {
        return x.second->bound < y.second->bound;
      });
    for (auto &[d, child] : next) {
      cur[c] = d;
      visit(i + 1, child);
    }
    cur[c] = Decision::Keep;
    decided[c] = 0;
  };
  visit(0, std::nullopt);
  best.nodes = std::min(nodes, maxNodes);
  best.complete = !stopped;
  best.rootBound = rootBound;
  return best;
}

BoundResult MemoryPlanner::branchAndBound(std::vector<Decision> incumbent,
                                          int64_t maxNodes,
                                          bool minimizePeak) const {
  return impl->branchAndBound(std::move(incumbent), maxNodes, minimizePeak);
}

PlanResult MemoryPlanner::solve(const SolveOptions &options) {
  const auto &cands = impl->candidates;
  const size_t n = cands.size();
  auto regionsOf = [&](ArrayRef<Decision> d) { return impl->regions(d); };
  PlanResult result;
  result.candidates = cands;

  // The baselines: keep everything; recompute every block.
  std::vector<Decision> keep(n, Decision::Keep);
  result.keepPeak = impl->simulate(keep);
  std::vector<Decision> uniform(n, Decision::Keep);
  for (size_t c = 0; c < n; ++c)
    if (!cands[c].blocks.empty())
      uniform[c] = Decision::Recompute;
  result.uniformPeak = impl->simulate(uniform);
  result.uniformSeconds = impl->added(uniform);
  result.keepStepSeconds = impl->keepStepSeconds;
  result.measuredCosts = impl->measured != nullptr;

  // Everything kept fits: nothing is cheaper. Without the exact floor (mtpc
  // search) the smallest reachable peak is not worth its search here.
  if (!options.exactFloor && !impl->fixedRecompute &&
      result.keepPeak <= impl->usable && impl->latencyOk(keep)) {
    result.decisions = keep;
    result.optimal = true;
    finish(*this, result, regionsOf);
    result.minimalPeak = result.peakBytes;
    return result;
  }

  // The smallest reachable peak: every candidate at its most frugal choice
  // (tried one at a time on small instances).
  const bool exhaustive = n * size_t(impl->numOps) < 4000000;
  result.minimalPeak = impl->simulate(impl->frugal(exhaustive));

  // Where even the bound on every plan (nothing decided: what no decision
  // frees) is over the budget, no search can fit: the most frugal plan, at
  // once (mtpc search plans many such candidates).
  if (!options.exactFloor && exhaustive &&
      impl->simulate(keep, std::vector<char>(n, 0)) > impl->usable) {
    result.decisions = impl->frugal(exhaustive);
    finish(*this, result, regionsOf);
    result.minimalPeak = std::min(result.minimalPeak, result.peakBytes);
    return result;
  }

  // From everything kept (or the uniform policy's recompute) to a plan
  // that fits: the ranked prefix on large instances, greedy moves on small.
  std::vector<Decision> current(n, Decision::Keep);
  if (impl->fixedRecompute)
    current = uniform;
  int64_t peak = impl->simulate(current);
  const int64_t budget = impl->usable;
  if (!exhaustive && peak > budget) {
    impl->rankedPrefix(current);
    peak = impl->simulate(current);
  }
  if (exhaustive)
    peak = impl->greedy(current, peak);
  // Moves one at a time from everything kept can end lower than the
  // frugal estimate above: the smallest peak reported is the lower.
  result.minimalPeak = std::min(result.minimalPeak, peak);

  // Then cheaper: prune, swap, search locally.
  if (peak <= budget && exhaustive)
    impl->prune(current);
  if (peak <= budget || impl->simulate(current) <= budget)
    impl->localSearch(current, exhaustive);

  // Then exact: the branch and bound from the heuristic's plan proves it
  // optimal or finds a better one (or one that fits where it found none)
  // within its node budget.
  if (exhaustive && options.maxNodes > 0) {
    const bool heuristicFits = impl->simulate(current) <= budget &&
                               impl->latencyOk(current);
    BoundResult exact = impl->branchAndBound(
        heuristicFits ? current : std::vector<Decision>{}, options.maxNodes,
        /*minimizePeak=*/false);
    result.nodes = exact.nodes;
    result.optimal = exact.complete;
    result.lowerBoundSeconds = exact.rootBound;
    if (!exact.decisions.empty())
      current = exact.decisions;
    else if (exact.complete) {
      // No plan fits: the smallest peak, searched the same way, for the
      // error to name.
      BoundResult lowest = impl->branchAndBound(
          impl->frugal(exhaustive), options.maxNodes, /*minimizePeak=*/true);
      if (!lowest.decisions.empty())
        result.minimalPeak = lowest.complete
                                 ? lowest.peak
                                 : std::min(result.minimalPeak, lowest.peak);
    }
  }
  result.decisions = current;
  finish(*this, result, regionsOf);
  result.minimalPeak = std::min(result.minimalPeak, result.peakBytes);
  return result;
}

PlanResult MemoryPlanner::solveExactly() {
  const auto &cands = impl->candidates;
  const size_t n = cands.size();
  PlanResult best;
  best.candidates = cands;
  std::vector<Decision> d(n, Decision::Keep);
  double bestTime = INFINITY;
  int64_t bestPeak = INT64_MAX;
  std::function<void(size_t)> search = [&](size_t i) {
    if (i == n) {
      if (!impl->latencyOk(d))
        return;
      int64_t p = impl->simulate(d);
      double t = impl->added(d);
      bool fits = p <= impl->usable;
      bool better = fits ? (bestPeak > impl->usable || t < bestTime ||
                            (t == bestTime && p < bestPeak))
                         : (bestPeak > impl->usable && p < bestPeak);
      if (better) {
        bestTime = t, bestPeak = p;
        best.decisions = d;
      }
      return;
    }
    for (Decision x : kAllDecisions) {
      if (!impl->allowed(i, x))
        continue;
      d[i] = x;
      search(i + 1);
    }
    d[i] = Decision::Keep;
  };
  search(0);
  finish(*this, best, [&](ArrayRef<Decision> x) { return impl->regions(x); });
  return best;
}

PlanResult MemoryPlanner::evaluate(std::vector<Decision> decisions) const {
  PlanResult r;
  r.candidates = impl->candidates;
  r.decisions = std::move(decisions);
  r.keepStepSeconds = impl->keepStepSeconds;
  r.measuredCosts = impl->measured != nullptr;
  finish(*this, r, [&](ArrayRef<Decision> x) { return impl->regions(x); });
  return r;
}

bool MemoryPlanner::allowed(size_t c, Decision d) const {
  return impl->allowed(c, d);
}

void mtp::attachPlan(ModelOp model, const PlanResult &result) {
  StepOp step = model.getStep();
  CostModel cost(model);
  Builder b(model.getContext());
  llvm::DenseMap<int64_t, std::pair<Decision, int64_t>> blockDecision;
  llvm::StringMap<Decision> headDecision;
  for (size_t c = 0; c < result.candidates.size(); ++c) {
    const Candidate &cand = result.candidates[c];
    for (int64_t blk : cand.blocks)
      blockDecision[blk] = {result.decisions[c], -1};
    if (!cand.task.empty())
      headDecision[cand.task] = result.decisions[c];
  }
  for (auto [i, region] : llvm::enumerate(result.regions))
    for (int64_t blk = region.first; blk <= region.second; ++blk)
      blockDecision[blk].second = i;
  for (FwdOp fwd : step.getBody().front().getOps<FwdOp>()) {
    Decision d = Decision::Keep;
    int64_t region = -1;
    if (FlatSymbolRefAttr task = fwd.getTaskAttr()) {
      d = headDecision.lookup(task.getValue()); // Keep when not a candidate
    } else if (auto it = blockDecision.find(getBlockNumber(fwd.getUnit(), fwd.getLayer()));
               it != blockDecision.end()) {
      std::tie(d, region) = it->second;
      // Tensor grain: the projection chain's units are recomputed (no
      // region), the rest of the block kept.
      if (d == Decision::Partial)
        d = cost.inProjectionChain(it->first, fwd.getUnit())
                ? Decision::Recompute
                : Decision::Keep;
    }
    fwd.setDecision(d);
    if (region >= 0)
      fwd.setRegion(region);
    else
      fwd.removeRegionAttr(); // a plan attached before may have set one
  }
  SmallVector<PlanOffload> offloads;
  for (const PlanResult::Offload &o : result.offloads)
    offloads.push_back({b.getStringAttr(result.candidates[o.candidate].name),
                        o.bytes, /*stream=*/1, o.exposedWait});
  SmallVector<PlanRegion> regions;
  for (auto [first, last] : result.regions)
    regions.push_back({first, last});
  step.setPlanAttr(StepPlanAttr::get(
      model.getContext(), result.peakBytes, result.keepPeak, result.uniformPeak,
      result.minimalPeak, APFloat(result.addedSeconds),
      APFloat(result.uniformSeconds), APFloat(result.keepStepSeconds),
      result.measuredCosts, result.nodes, result.optimal,
      APFloat(result.optimal ? 0.0 : result.lowerBoundSeconds),
      ArrayRef<PlanRegion>(regions),
      ArrayRef<PlanOffload>(offloads)));
}

/// zero = auto and optimizer_offload = auto (docs/zero.md): the first of
/// (stage 0, 1, 2 without offload, then with it) whose plan fits; stage 2
/// drops an automatic collective's compression (restored for the others).
/// The last tried stays when none fits.
static void chooseStateSharding(ModelOp model, const MeasuredCosts *measured,
                                const SolveOptions &options) {
  BudgetOp budget = model.getBudget();
  StrategyOp strategy = model.getStrategy();
  const bool zeroAuto = budget && budget.getZeroAuto();
  const bool offloadAuto = strategy && strategy.getOptimizerOffloadAuto();
  if (!zeroAuto && !offloadAuto)
    return;
  Builder b(model.getContext());
  if (zeroAuto)
    budget.removeZeroAutoAttr();
  if (offloadAuto)
    strategy.removeOptimizerOffloadAutoAttr();
  SmallVector<AllReduceOp> buckets(
      model.getStep().getBody().front().getOps<AllReduceOp>());
  SmallVector<DictionaryAttr> original;
  for (AllReduceOp op : buckets)
    original.push_back(op->getAttrDictionary());
  const bool mayScatter =
      !strategy || strategy.getCollective() != CollectivePolicy::compressed;
  SmallVector<int64_t> stages;
  if (zeroAuto)
    stages = mayScatter ? SmallVector<int64_t>{0, 1, 2}
                        : SmallVector<int64_t>{0, 1};
  else
    stages = {budget ? budget.getZeroStage() : 0};
  SmallVector<bool> offloads =
      offloadAuto ? SmallVector<bool>{false, true}
                  : SmallVector<bool>{strategy && strategy.getOptimizerOffload()};
  SmallVector<std::pair<bool, int64_t>> tries;
  for (bool offload : offloads)
    for (int64_t stage : stages)
      tries.push_back({offload, stage});
  // ZeRO 3 last, as DeepSpeed advises: its gathers cost every step's time
  // (not with the params scope or activation offload, which it does not
  // combine with).
  if (zeroAuto && mayScatter &&
      (!strategy ||
       (strategy.getGradientScope() != GradientScope::params &&
        strategy.getOffload() != OffloadPolicy::cpu_pinned)))
    for (bool offload : offloads)
      tries.push_back({offload, 3});
  for (auto [offload, stage] : tries) {
    {
      if (budget) {
        if (stage)
          budget.setZeroAttr(b.getI64IntegerAttr(stage));
        else
          budget.removeZeroAttr();
      }
      if (strategy) {
        if (offload)
          strategy.setOptimizerOffloadAttr(b.getUnitAttr());
        else
          strategy.removeOptimizerOffloadAttr();
      }
      for (auto [op, attrs] : llvm::zip(buckets, original)) {
        op->setAttrs(attrs);
        if (stage >= 2) {
          op.removeCompressedAttr();
          op.removeTopkAttr();
          op.removeBlockAttr();
          op.removeBitsAttr();
          op.removeDecayAttr();
        }
      }
      if (MemoryPlanner(model, measured).solve(options).fits)
        return;
    }
  }
}

/// The plan of `model` as its budget stands (a pipeline's per-stage plan,
/// or the joint solver's), attached to its step; diagnosed when none fits.
static LogicalResult planModel(ModelOp model, const MeasuredCosts *measured,
                               const SolveOptions &options) {
  chooseStateSharding(model, measured, options);
  MemoryPlanner planner(model, measured);
  // A pipeline's split and its keep-everything peak are read with every
  // unit kept: a plan attached before (pipeline = auto's previous try, an
  // earlier run of this pass) may hold regions.
  std::optional<PlanResult> keepAll;
  if (BudgetOp b = model.getBudget(); b && b.getPipelineStages() >= 2) {
    keepAll = planner.evaluate(
        std::vector<Decision>(planner.getCandidates().size(), Decision::Keep));
    attachPlan(model, *keepAll);
  }
  // docs/pipeline.md: each stage keeps its activations unless its peak is
  // over the budget; then its blocks are offloaded (offload = auto) or
  // recomputed (checkpoint = auto, each its own region so none crosses a
  // stage), whichever frees a block's bytes for less time, the most bytes
  // per second first, until it fits. The stages' peaks decide. The cut,
  // recorded as the budget's `stages`, balances the kept time (re-balancing
  // on the time with the re-runs made no example faster: a block moved down
  // the pipe meets more micro-batches in flight), unless a stage still over
  // the budget moves it (below).
  if (std::optional<PipelinePlanResult> initial = planPipeline(model)) {
    const std::vector<Candidate> &cands = planner.getCandidates();
    BudgetOp budget = model.getBudget();
    Builder builder(model.getContext());
    const CostModel cm(model);
    bool canFree = false;
    struct Choice {
      size_t candidate;
      Decision decision;
      double worth; ///< bytes freed per second added
    };
    auto fitStages = [&](ArrayRef<int64_t> starts, PlanResult &plan) {
      budget.setStageStartsAttr(builder.getDenseI64ArrayAttr(starts));
      plan = *keepAll;
      attachPlan(model, plan);
      PipelinePlanResult pipe = *planPipeline(model);
      for (size_t s = 0; s < pipe.stages.size(); ++s) {
        const PipelineStagePlan stage = pipe.stages[s];
        SmallVector<Choice> order;
        for (size_t c = 0; c < cands.size(); ++c) {
          if (cands[c].blocks.size() != 1 ||
              cands[c].blocks[0] < stage.firstUnit ||
              cands[c].blocks[0] > stage.lastUnit)
            continue;
          const int64_t b = cands[c].blocks[0];
          const int64_t kept = pipe.blockKeptBytes[b],
                        offloadable = pipe.blockOffloadableBytes[b];
          const double rerun = pipe.blockForwardSeconds[b];
          // An offload's copy out hides behind the block's forward, its
          // copy back behind the backward of the block above.
          const double copy = cm.transferSeconds(offloadable);
          const double exposed =
              std::max(0.0, copy - rerun) +
              std::max(0.0, copy - (b < stage.lastUnit
                                        ? pipe.blockBackwardSeconds[b + 1]
                                        : 0.0));
          const bool canRe = planner.allowed(c, Decision::Recompute),
                     canOff = offloadable > 0 &&
                              planner.allowed(c, Decision::Offload);
          const double reWorth = double(kept) / std::max(1e-12, rerun),
                       offWorth = double(offloadable) / std::max(1e-12, exposed);
          if (canOff && (!canRe || offWorth > reWorth)) {
            order.push_back({c, Decision::Offload, offWorth});
            // Recompute frees the rest of the block too: taken later in
            // the order (after the offload) where that is still needed.
            if (canRe && kept > offloadable)
              order.push_back(
                  {c, Decision::Recompute,
                   std::min(offWorth, double(kept - offloadable) /
                                          std::max(1e-12, rerun - exposed))});
          } else if (canRe) {
            order.push_back({c, Decision::Recompute, reWorth});
          }
        }
        canFree |= !order.empty();
        llvm::stable_sort(order, [](const Choice &a, const Choice &b) {
          return a.worth > b.worth;
        });
        if (pipe.stages[s].peakBytes <= planner.budget() || order.empty())
          continue;
        // The first k of the order taken (a block's later choice over its
        // earlier); the least k that fits, by bisection (a stage's peak
        // falls as it frees more).
        auto recompute = [&](size_t k) {
          for (const Choice &choice : order)
            plan.decisions[choice.candidate] = Decision::Keep;
          for (const Choice &choice : ArrayRef(order).take_front(k))
            plan.decisions[choice.candidate] = choice.decision;
          plan.regions.clear();
          for (size_t d = 0; d < cands.size(); ++d)
            if (plan.decisions[d] == Decision::Recompute)
              plan.regions.push_back({cands[d].blocks[0], cands[d].blocks[0]});
          llvm::sort(plan.regions);
          attachPlan(model, plan);
          pipe = *planPipeline(model);
          return pipe.stages[s].peakBytes <= planner.budget();
        };
        // The plan and the stage model are the last k tried's: hi's again
        // only where another was tried after it.
        size_t lo = 0, hi = order.size(), last = hi; // lo does not fit
        if (recompute(hi))
          while (hi - lo > 1) {
            const size_t mid = lo + (hi - lo) / 2;
            last = mid;
            (recompute(mid) ? hi : lo) = mid;
          }
        if (last != hi)
          recompute(hi);
      }
      return pipe;
    };
    std::vector<int64_t> starts;
    for (const PipelineStagePlan &st : initial->stages)
      starts.push_back(st.firstUnit);
    PlanResult plan;
    PipelinePlanResult pipe = fitStages(starts, plan);
    // A stage still over the budget gives blocks to a neighbour with room
    // (docs/pipeline.md, "Balancing memory"): one layer across one of its
    // cuts at a time, the move that leaves the least total excess over the
    // budget (then the faster step), while the excess falls, for up to 2S
    // moves. Not tried when the stages' state alone exceeds every stage's
    // budget together.
    auto excess = [&](const PipelinePlanResult &p) {
      int64_t e = 0;
      for (const PipelineStagePlan &st : p.stages)
        e += std::max<int64_t>(0, st.peakBytes - planner.budget());
      return e;
    };
    int64_t state = 0;
    for (const PipelineStagePlan &st : pipe.stages)
      state += st.stateBytes;
    const int64_t S = int64_t(starts.size());
    const int64_t nblocks = 2 * int64_t(model.getBackbone().getLayers()) + 1;
    bool tried = false;
    for (int64_t round = 0;
         excess(pipe) > 0 && state < S * planner.budget() &&
         round < std::min<int64_t>(nblocks, 2 * S);
         ++round) {
      struct Move {
        int64_t excess;
        double step;
        std::vector<int64_t> starts;
      };
      std::optional<Move> best;
      for (int64_t s = 0; s < S; ++s) {
        if (pipe.stages[s].peakBytes <= planner.budget() ||
            pipe.stages[s].firstUnit == pipe.stages[s].lastUnit)
          continue;
        // Its first block to the stage before, or its last to the one
        // after; alone, or with each stage beyond passing one on in turn
        // (later stages hold fewer micro-batches in flight under 1F1B).
        for (int64_t side : {0, 1, 2, 3}) {
          // A layer at a time (its attention and MLP blocks), so a cut at a
          // layer's end stays there.
          std::vector<int64_t> moved = starts;
          if (side == 0 && s > 0) {
            moved[s] += 2;
          } else if (side == 1 && s + 1 < S) {
            moved[s + 1] -= 2;
          } else if (side == 2 && s > 1) {
            for (int64_t t = 1; t <= s; ++t)
              moved[t] += 2;
          } else if (side == 3 && s + 2 < S) {
            for (int64_t t = s + 1; t < S; ++t)
              moved[t] -= 2;
          } else {
            continue;
          }
          // Every stage keeps a block.
          bool valid = moved[0] == 0;
          for (int64_t t = 1; t < S; ++t)
            valid &= moved[t] > moved[t - 1];
          if (!valid || moved[S - 1] >= nblocks)
            continue;
          PlanResult trial;
          tried = true;
          const PipelinePlanResult p = fitStages(moved, trial);
          Move m{excess(p), p.stepSeconds, std::move(moved)};
          if (!best || std::pair(m.excess, m.step) <
                           std::pair(best->excess, best->step))
            best = std::move(m);
        }
      }
      if (!best || best->excess >= excess(pipe))
        break;
      starts = best->starts;
      pipe = fitStages(starts, plan);
      tried = false;
    }
    // A trial left its split recorded: the chosen one again.
    if (tried)
      pipe = fitStages(starts, plan);
    if (llvm::is_contained(plan.decisions, Decision::Recompute) ||
        llvm::is_contained(plan.decisions, Decision::Offload)) {
      // The added time, the offloads and the step's summary for these
      // decisions; the regions stay one block each.
      auto regions = plan.regions;
      plan = planner.evaluate(plan.decisions);
      plan.regions = std::move(regions);
    }
    for (auto [s, stage] : llvm::enumerate(pipe.stages))
      if (stage.peakBytes > planner.budget()) {
        auto diag = budget.emitError()
                    << "pipeline stage " << s << " (units "
                    << stage.firstUnit << " to " << stage.lastUnit
                    << ") needs " << formatBytes(stage.peakBytes)
                    << ", over the usable " << formatBytes(planner.budget());
        if (budget.getPipelineAuto())
          diag.attachNote(budget.getLoc())
              << (budget.getPipelineStages() <
                          2 * int64_t(model.getBackbone().getLayers()) + 1
                      ? "more gpus (gpus = " +
                            std::to_string(budget.getGpus() * 2) +
                            ") let pipeline = auto cut more stages"
                      : "every stage already holds one unit")
              << "; a smaller micro_batch shrinks the " << stage.inFlight
              << " micro-batches in flight";
        else
          diag.attachNote(budget.getLoc())
              << "more stages (pipeline = "
              << budget.getPipelineStages() * 2
              << ") split the parameters further; a smaller micro_batch "
                 "shrinks the "
              << stage.inFlight << " micro-batches in flight";
        if (!canFree)
          diag.attachNote(budget.getLoc())
              << "strategy { checkpoint = auto } recomputes an over-budget "
                 "stage's blocks, offload = auto offloads them";
        else if (!stage.recomputed.empty() || !stage.offloaded.empty())
          diag.attachNote(budget.getLoc())
              << "that is with " << stage.recomputed.size()
              << " of its blocks recomputed and " << stage.offloaded.size()
              << " offloaded";
        return failure();
      }
    // The plan's peaks are the largest stage's (docs/pipeline.md).
    plan.peakBytes = plan.uniformPeak = plan.minimalPeak = pipe.peakBytes();
    plan.keepPeak = initial->peakBytes();
    plan.fits = true;
    attachPlan(model, plan);
    return success();
  }
  PlanResult result = planner.solve(options);
  if (!result.fits) {
    BudgetOp budget = model.getBudget();
    auto diag = (budget ? budget.emitError() : model.emitError())
                << "no plan fits the budget: the smallest peak any plan "
                   "reaches is "
                << formatBytes(result.minimalPeak) << ", over the usable "
                << formatBytes(planner.budget());
    // What would fit, estimated from how activations scale.
    if (budget) {
      int64_t micro = budget.getMicroBatch();
      const MemoryReport report = analyzeMemory(model);
      int64_t state = report.atPeak.parameters + report.atPeak.optimizer +
                      report.atPeak.gradients;
      int64_t perSample = std::max<int64_t>(
          1, (result.minimalPeak - state) / std::max<int64_t>(1, micro));
      int64_t fitMicro = (planner.budget() - state) / perSample;
      if (fitMicro >= 1 && fitMicro < micro)
        diag.attachNote(budget.getLoc())
            << "micro_batch = " << fitMicro
            << " would fit (estimated: activations scale with the micro "
               "batch)";
      else if (fitMicro < 1)
        diag.attachNote(budget.getLoc())
            << "even one sequence per micro batch needs about "
            << formatBytes(state + perSample)
            << ": parameters, gradients and optimizer state alone take "
            << formatBytes(state);
      StrategyOp strategy = model.getStrategy();
      if (strategy && strategy.getOffload() == OffloadPolicy::none)
        diag.attachNote(strategy.getLoc()) << "offload = auto lets the plan "
                                              "move saved tensors to the host";
      if (budget.getPrecision() == Precision::fp32)
        diag.attachNote(budget.getLoc())
            << "precision = bf16 roughly halves the activations";
      // ZeRO: what sharding the state over the gpus would take off.
      if (budget.getGpus() > 1 && budget.getZeroStage() < 2) {
        const int64_t values = zeroValues(model.getStep());
        const int64_t world = budget.getGpus();
        const int64_t saved =
            budget.getZeroStage() == 0
                ? CostModel::kOptimizerBytes * values -
                      mtprt::ZeroLayout::stateBytes(values, world)
                : 0;
        if (saved > 0)
          diag.attachNote(budget.getLoc())
              << "zero = 1 shards AdamW's state over the " << world
              << " gpus: " << formatBytes(saved) << " less per device"
              << (result.minimalPeak - saved <= planner.budget()
                      ? " (would fit)"
                      : "");
        else
          diag.attachNote(budget.getLoc())
              << "zero = 2 also releases the gradients during the backward, "
                 "keeping this rank's run of them: "
              << formatBytes(CostModel::kGradientBytes * values -
                             mtprt::ZeroLayout::gradientShardBytes(values,
                                                                   world))
              << " less per device at most";
      }
      // The optimizer offload: what of AdamW's state leaves the device.
      if (StrategyOp st = model.getStrategy(); st && !st.getOptimizerOffload()) {
        const int64_t saved = adamwStateBytes(model);
        diag.attachNote(st.getLoc())
            << "optimizer_offload = cpu keeps AdamW's state on the host: "
            << formatBytes(saved) << " less per device"
            << (result.minimalPeak - saved <= planner.budget() ? " (would fit)"
                                                               : "");
      }
      // More gpus help a micro batch above one; ZeRO 3 shards the
      // parameters themselves, a pipeline holds a part of them.
      if (micro > 1)
        diag.attachNote(budget.getLoc())
            << "more GPUs keep the global batch with a smaller micro batch";
      const int64_t weights = report.atPeak.parameters;
      if (weights >= planner.budget() / 2 && budget.getPipelineStages() <= 1) {
        if (budget.getGpus() > 1 && budget.getZeroStage() < 3)
          diag.attachNote(budget.getLoc())
              << "the parameters alone take " << formatBytes(weights)
              << " per device: zero = 3 shards them over the "
              << budget.getGpus()
              << " gpus, each layer gathered whole only for its forward "
                 "and backward (docs/zero.md)";
        diag.attachNote(budget.getLoc())
            << "budget { pipeline = N } holds about 1/N of the parameters "
               "on each of N stages (docs/pipeline.md)";
      }
    }
    return failure();
  }
  attachPlan(model, result);
  return success();
}

/// pipeline = auto (docs/pipeline.md): every divisor S of gpus (up to the
/// backbone's units) planned in turn — S = 1 is data parallelism over every
/// gpu — and the fitting plan with the least predicted step kept, the fewer
/// stages on a tie. Each try is recorded in the budget's `choices`; when
/// none fits, the largest S's refusal is the error, with the others' noted.
static LogicalResult choosePipeline(ModelOp model, const MeasuredCosts *measured,
                                    const SolveOptions &options) {
  BudgetOp budget = model.getBudget();
  MLIRContext *ctx = model.getContext();
  Builder b(ctx);
  const int64_t gpus = budget.getGpus();
  const int64_t units = 2 * int64_t(model.getBackbone().getLayers()) + 1;
  auto setStages = [&](int64_t S) {
    if (S > 1)
      budget.setPipelineAttr(b.getI64IntegerAttr(S));
    else
      budget.removePipelineAttr();
    budget.removeStageStartsAttr();
    // The replicas changed, and with them what collective = auto does.
    setBucketsCompressed(model, compressesBuckets(model, budget.getReplicas()));
  };
  SmallVector<Attribute> choices;
  SmallVector<std::pair<int64_t, std::string>> refused;
  int64_t best = 0, largest = 1;
  double bestStep = std::numeric_limits<double>::infinity();
  for (int64_t S = 1; S <= std::min(gpus, units); ++S) {
    if (gpus % S != 0)
      continue;
    largest = S;
    setStages(S);
    std::string why;
    LogicalResult planned = failure();
    {
      // A try's refusal is recorded, not reported. (The handler is the
      // context's: mtpc plans one model at a time.)
      ScopedDiagnosticHandler quiet(ctx, [&](Diagnostic &d) {
        if (d.getSeverity() == DiagnosticSeverity::Error && why.empty())
          why = d.str();
        return success();
      });
      planned = planModel(model, measured, options);
    }
    int64_t peak = 0;
    double step = 0;
    if (succeeded(planned)) {
      if (std::optional<PipelinePlanResult> pipe = planPipeline(model)) {
        peak = pipe->peakBytes();
        step = pipe->stepSeconds;
      } else {
        peak = model.getStep().getPlanAttr().getPlannedPeakBytes();
        step = dataParallelStepSeconds(model);
      }
      if (step < bestStep) {
        best = S;
        bestStep = step;
      }
    } else {
      if (why.empty())
        why = "no plan fits";
      refused.push_back({S, why});
    }
    choices.push_back(PipelineChoiceAttr::get(
        ctx, S, peak, APFloat(step),
        b.getStringAttr(succeeded(planned) ? "" : why)));
  }
  budget.setPipelineChoicesAttr(b.getArrayAttr(choices));
  setStages(best ? best : largest);
  if (best)
    return planModel(model, measured, options);
  // None fits: the largest S's own diagnosis, with the others' refusals.
  ScopedDiagnosticHandler annotate(ctx, [&](Diagnostic &d) {
    if (d.getSeverity() == DiagnosticSeverity::Error) {
      for (auto &[S, why] : refused)
        if (S != largest)
          d.attachNote(budget.getLoc())
              << "pipeline = auto tried " << S
              << (S == 1 ? " stage (data parallelism over every gpu): "
                         : " stages: ")
              << why;
      refused.clear();
    }
    return failure(); // on to the caller's handler
  });
  return planModel(model, measured, options);
}

namespace {
struct PlanMemoryPass : public mtp::impl::PlanMemoryBase<PlanMemoryPass> {
  using PlanMemoryBase::PlanMemoryBase;
  void runOnOperation() override {
    ModelOp model = getOperation();
    if (!model.getStep()) {
      model.emitError("model '")
          << model.getSymName()
          << "' has no training step; run --mtp-expand-training-step first";
      return signalPassFailure();
    }
    std::optional<MeasuredCosts> measured;
    if (!costs.empty()) {
      llvm::Expected<MeasuredCosts> loaded = MeasuredCosts::load(costs, model);
      if (!loaded) {
        model.emitError() << llvm::toString(loaded.takeError());
        return signalPassFailure();
      }
      measured = std::move(*loaded);
    }
    SolveOptions options;
    options.maxNodes = std::max<int64_t>(0, maxNodes);
    options.exactFloor = exactFloor;
    const MeasuredCosts *table = measured ? &*measured : nullptr;
    BudgetOp budget = model.getBudget();
    if (failed(budget && budget.getPipelineAuto()
                   ? choosePipeline(model, table, options)
                   : planModel(model, table, options)))
      return signalPassFailure();
  }
};
} // namespace
