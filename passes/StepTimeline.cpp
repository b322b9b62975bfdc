//===- StepTimeline.cpp - a step's memory over time ----------------------===//

#include "passes/StepTimeline.h"
#include "passes/CostModel.h"

#include "mtprt/Zero.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mtp;

StepTimeline::StepTimeline(ModelOp model, const CostModel &cost,
                           ArrayRef<Operation *> ops, bool sapsRerank)
    : cost(cost), order(ops.begin(), ops.end()) {
  StepOp step = model.getStep();
  const ParameterGroups groups = parameterGroups(step);
  // The gradient exchange: its residual is resident, its transient comes at
  // the mtp.allreduce ops (the runtime exchanges every bucket there).
  const CostModel::ExchangeMemory exchange = cost.gradientExchange(
      llvm::to_vector(step.getBody().front().getOps<AllReduceOp>()));
  // The other micro-batches' inputs are held through the step.
  BudgetOp budget = model.getBudget();
  resident = residentState(model, cost,
                           budget ? budget.getAccumulationSteps() - 1 : 0);
  // SAPS folds the backbone's dense gradients away as they arrive (its
  // compact gradient is resident state).
  allGradients = CostModel::kGradientBytes * (groups.trainable - groups.sparse) -
                 2 * cost.halfProjectionValues();
  const bool sparse = groups.sparse > 0;
  // EWC's penalty gradient: two temporaries of the largest protected tensor
  // (θ − θ*, then times F) at the optimizer step.
  int64_t largestProtected = 0;
  twoSweeps = cost.gradientsResidentThroughStep();

  // The params scope's per-task gradients, per head (FuseTaskGradients'
  // op says the scope).
  int64_t perTask = 0, topLayersFrom = INT64_MAX, deferred = 0;
  for (Operation *op : order)
    if (auto f = dyn_cast_if_present<FuseTaskGradsOp>(op);
        f && f.getScope() == GradientScope::params && model.getStrategy()) {
      const int64_t k = model.getStrategy().getScopeLayers();
      perTask = cost.perTaskParameterGradientBytes(1, k);
      topLayersFrom = model.getBackbone().getLayers() - k;
    }
  zeroStage = cost.zeroStage();
  if (zeroStage) {
    const int64_t values = zeroValues(step), world = cost.processes();
    zeroGradientShard = zeroStage >= 2
                            ? mtprt::ZeroLayout::gradientShardBytes(values, world)
                            : 0;
  }
  // ZeRO 3: the backbone's trainable blocks are held as this rank's run of
  // every value (residentState); a block is gathered whole around its
  // forward and backward (sweep), nothing after the update.
  blockAt.assign(order.size(), -1);
  if (zeroStage >= 3) {
    forwardAt.assign(order.size(), false);
    for (auto [pos, op] : llvm::enumerate(order))
      if (std::optional<UnitRef> unit = op ? getUnitRef(op) : std::nullopt;
          unit && !unit->task) {
        const int64_t b = getBlockNumber(unit->kind, unit->layer);
        if (isa<FwdOp>(op) || cost.backwardReadsParameters(b))
          blockAt[pos] = int(b);
        // A recompute's forward is part of the backward (sweep).
        forwardAt[pos] = isa<FwdOp>(op) && !op->getParentOfType<RecomputeOp>();
        if (forwardAt[pos])
          lastForward = std::max(lastForward, int(b));
      }
    // Per block (sweep asks these at every position of every plan tried).
    int maxBlock = -1;
    for (int b : blockAt)
      maxBlock = std::max(maxBlock, b);
    for (int b = 0; b <= maxBlock; ++b) {
      blockBytes.push_back(cost.shardedBlockBytes(b));
      readsParameters.push_back(cost.backwardReadsParameters(b));
    }
  }
  // Stage 2 (only at more than one process) releases the backbone's
  // gradients during the backward (ZeroOptimizer::release): where the first
  // two releasing units are, and what is held to the exchange.
  const bool zeroRelease = zeroStage >= 2;
  int firstRelease = -1, secondRelease = -1;
  int64_t held = 0;
  workspace.assign(order.size(), 0);
  relief.assign(order.size(), {0, 0});
  llvm::DenseSet<int64_t> sharedAdapters; // groups whose gradient is made
  for (auto [pos, op] : llvm::enumerate(order)) {
    if (!op) // a position of its own with nothing on it (the planner's)
      continue;
    if (auto f = dyn_cast<FuseTaskGradsOp>(op)) {
      fuse = f;
      fusePosition = pos;
    } else if (auto costly = dyn_cast<CostOpInterface>(op)) {
      workspace[pos] = costly.getWorkspaceBytes();
    } else if (isa<AllReduceOp>(op)) {
      // SAPS flattens only the dense gradients (its compact ones are
      // averaged in place).
      workspace[pos] = std::max<int64_t>(
          0, exchange.transient - (sparse ? 4 * groups.sparse : 0));
    }
    // A unit's parameter gradients appear at its backward (where autograd
    // accumulates them) and stay until the optimizer step.
    if (auto bwd = dyn_cast<BwdOp>(op)) {
      // At the params scope a head's backward also makes its task's
      // gradients of the top k layers, held (summed over micro-batches)
      // until the step's end.
      if (bwd.getUnit() == UnitKind::head && perTask) {
        gradientArrivals.push_back({int(pos), perTask});
        allGradients += perTask;
      }
      relief[pos] = {int64_t(bwd.getFreed()), int64_t(bwd.getPending())};
      // A shared adapter's gradient (npd(share)): with the first of its
      // group's heads' backwards in this order (a phase's, too).
      int64_t sharedAdapter = 0;
      if (bwd.getUnit() == UnitKind::head && bwd.getTaskAttr())
        for (TaskOp t : model.getTasks())
          if (t.getSymName() == bwd.getTaskAttr().getValue())
            if (int64_t b = cost.sharedAdapterGradientBytes(t);
                b && sharedAdapters.insert(cost.adapterOwnerIndex(t)).second)
              sharedAdapter = b;
      if (sharedAdapter) {
        gradientArrivals.push_back({int(pos), sharedAdapter});
        held += sharedAdapter;
      }
      if (groups.protectedByEwc && !bwd.getTaskAttr())
        largestProtected =
            std::max(largestProtected, cost.gradientBytes(bwd));
      if (const int64_t bytes = cost.gradientBytes(bwd);
          bytes && sparse && !bwd.getTaskAttr()) {
        workspace[pos] += cost.sapsFoldTransient(bytes, sapsRerank);
        relief[pos].second = 0;
      } else if (bytes) {
        // The backbone backward leaves the top k layers' gradients to the
        // step's end (the fused per-task ones become them there).
        if (perTask && !bwd.getTaskAttr() && bwd.getUnit() != UnitKind::embed &&
            int64_t(bwd.getLayer()) > topLayersFrom) {
          deferred += bytes;
        } else if (zeroRelease && !bwd.getTaskAttr()) {
          // ZeRO 2: summed over the ranks and freed as autograd makes them
          // (a head's, made by its own backward, wait for the exchange).
          released.push_back({int(pos), bytes});
          releasedBlock.push_back(
              int(getBlockNumber(bwd.getUnit(), bwd.getLayer())));
          releasedBlockMax = std::max(releasedBlockMax, releasedBlock.back());
          if (firstRelease < 0)
            firstRelease = int(pos);
          else if (secondRelease < 0)
            secondRelease = int(pos);
        } else {
          gradientArrivals.push_back({int(pos), bytes});
          held += bytes;
        }
      }
    }
    if (isa<OptimizerStepOp>(op))
      updatePosition = int(pos);
    if (isa<OptimizerStepOp>(op))
      workspace[pos] += 2 * largestProtected;
    if (isa<OptimizerStepOp>(op) && deferred) {
      gradientArrivals.push_back({int(pos), deferred});
      held += deferred;
      deferred = 0;
    }
  }
  if (zeroRelease) {
    // The exchange sums what is still held a bucket at a time (its
    // gradients freed as it goes): one bucket beside them.
    // The run is made at the first sum: in the first releasing unit's
    // backward (so held from the next one), else at the exchange.
    shardFrom = secondRelease >= 0 ? secondRelease
                : firstRelease >= 0 ? firstRelease + 1
                                    : -1;
    for (auto [pos, op] : llvm::enumerate(order))
      if (isa_and_present<AllReduceOp>(op)) {
        workspace[pos] = std::min(
            held, mtprt::ZeroLayout::releaseBucketBytes(zeroValues(step),
                                                        cost.processes()));
        if (shardFrom < 0)
          shardFrom = int(pos);
      }
    // The small gradients are copied into one bucket as they are made and
    // freed; the bucket lives from the first release to the backward's end.
    if (!released.empty()) {
      releaseBucket = mtprt::ZeroLayout::releaseBucketBytes(zeroValues(step),
                                                            cost.processes());
      releaseFrom = released.front().first;
      releaseTo = released.back().first;
      // Each sum runs on while the backward goes on, one at a time: a
      // bucket, or a gradient of a bucket or more alone. The runtime picks
      // per parameter, the plan sees a unit's total (a projection's weight
      // with its bias), so what is in flight is bounded by the larger of a
      // bucket and the largest unit released before.
      inFlightAt.assign(order.size(), 0);
      int64_t largest = releaseBucket;
      auto next = released.begin();
      for (int p = releaseFrom; p <= releaseTo; ++p) {
        inFlightAt[p] = largest;
        for (; next != released.end() && next->first == p; ++next)
          largest = std::max(largest, next->second);
      }
    }
    // A later micro-batch holds this rank's run and what is not released.
    int64_t releasedBytes = 0;
    for (const auto &r : released)
      releasedBytes += r.second;
    allGradients += zeroGradientShard - releasedBytes;
  }
}

StepTimeline::Peak
StepTimeline::sweep(const Live &live, int64_t fuseWorkspace, bool later,
                    ArrayRef<std::pair<int64_t, int64_t>> regions) const {
  // ZeRO 3: what is gathered while block b runs — the block, or its
  // checkpoint region's blocks (gathered together, freed together).
  std::vector<int64_t> gatherOf(blockBytes);
  // ZeRO 3's prefetch (ZeroOptimizer::gatherForward and the backward's
  // hook): where a block (its region) is gathered, the next one's gather
  // begins — in the forward the block after the region, in the backward
  // the top block of the one below when its backward reads its parameters
  // — and that block is whole from there to its own turn.
  std::vector<int> spanFirst(gatherOf.size()), spanLast(gatherOf.size());
  for (size_t b = 0; b < gatherOf.size(); ++b)
    spanFirst[b] = spanLast[b] = int(b);
  const int64_t blocks = int64_t(gatherOf.size());
  for (auto [first, last] : regions) {
    int64_t sum = 0;
    for (int64_t k = first; k <= last && k < blocks; ++k)
      sum += blockBytes[k];
    for (int64_t k = first; k <= last && k < blocks; ++k) {
      gatherOf[k] = sum;
      spanFirst[k] = int(first);
      spanLast[k] = int(last);
    }
  }
  auto gathered = [&](int b) -> int64_t {
    return b < 0 || b >= int(gatherOf.size()) ? 0 : gatherOf[b];
  };
  auto single = [&](int b) -> int64_t {
    return b < 0 || b >= int(blockBytes.size()) ? 0 : blockBytes[b];
  };
  int prefetched = -1;
  // A checkpoint region's backward (one block's too) is one autograd node,
  // which returns every gradient of its parameters at its end: each
  // released one is held from its unit to the region's last release
  // before the release sees it. A region's releases are consecutive (the
  // backward runs its blocks in a row).
  SmallVector<int, 256> regionOfBlock;
  if (!released.empty() && !regions.empty()) {
    regionOfBlock.assign(size_t(releasedBlockMax + 1), -1);
    for (auto [k, r] : llvm::enumerate(regions))
      for (int64_t b = std::max<int64_t>(r.first, 0);
           b <= r.second && b <= releasedBlockMax; ++b)
        regionOfBlock[size_t(b)] = int(k);
  }
  auto regionOf = [&](size_t i) -> int {
    return regionOfBlock.empty() || i >= releasedBlock.size() ||
                   releasedBlock[i] < 0
               ? -1
               : regionOfBlock[size_t(releasedBlock[i])];
  };
  int64_t heldNow = 0;
  Peak best;
  MemoryBreakdown now = resident;
  if (later)
    now.gradients = allGradients;
  auto arrival = gradientArrivals.begin();
  auto release = released.begin();
  for (int p = 0, e = size(); p < e; ++p) {
    now.activations += live.activations[p];
    if (!live.activationGrads.empty())
      now.activationGrads += live.activationGrads[p];
    // A later micro-batch's gradients are added into the accumulated ones:
    // each is a transient beside them until then.
    int64_t accumulating = 0;
    for (; arrival != gradientArrivals.end() && arrival->first == p; ++arrival)
      (later ? accumulating : now.gradients) += arrival->second;
    // ZeRO 2: this rank's run from the first sum to the update — made once
    // the first releasing unit is done (its backward may be one fused node
    // with the positions after it), so from the next releasing unit on
    // (shardFrom); a released gradient is a transient where its unit makes
    // it, less what the unit's peak lacks of it.
    int64_t releasing = 0, heldFromNext = 0;
    bool regionEnds = false;
    for (; release != released.end() && release->first == p; ++release) {
      releasing += release->second;
      const size_t i = size_t(release - released.begin());
      if (const int k = regionOf(i); k >= 0) {
        if (regionOf(i + 1) == k)
          heldFromNext += release->second;
        else
          regionEnds = true;
      }
    }
    if (p == shardFrom && !later)
      now.gradients += zeroGradientShard;
    now.workspace =
        (p == fusePosition ? fuseWorkspace : workspace[p]) + accumulating;
    // Inside a many-layer backward unit: its peak, not its start.
    if (const int b = blockAt[p]; b >= 0) {
      // A recompute's forward runs in the backward, after the region's
      // hook gathered it and began the one below.
      const bool forward = forwardAt[p];
      const int next = forward ? spanLast[b] + 1 : spanFirst[b] - 1;
      prefetched = -1;
      if (forward ? next <= lastForward
                  : next >= 0 && next < int(readsParameters.size()) &&
                        readsParameters[next])
        prefetched = next;
    }
    MemoryBreakdown at = now;
    at.parameters += gathered(blockAt[p]) + single(prefetched);
    at.activations -= relief[p].first;
    if (releasing)
      at.workspace += std::max<int64_t>(0, releasing - relief[p].second);
    else if (!later)
      at.gradients -= relief[p].second;
    if (p >= releaseFrom && p <= releaseTo)
      at.workspace += releaseBucket + inFlightAt[p];
    at.workspace += heldNow;
    if (regionEnds)
      heldNow = 0;
    heldNow += heldFromNext;
    // Stage 2's update reads the averaged run, the full gradients gone.
    // The updated values are broadcast in place (ZeroOptimizer::step): no
    // buffer after it.
    if (p == updatePosition && zeroStage >= 2) {
      at.gradients = 0;
      at.workspace += zeroGradientShard;
    }
    if (at.total() > best.bytes) {
      best.bytes = at.total();
      best.position = p;
      best.at = at;
    }
  }
  return best;
}

StepTimeline::Peak
StepTimeline::peak(const Live &live,
                   ArrayRef<std::pair<int64_t, int64_t>> regions,
                   ArrayRef<int64_t> partials) const {
  Peak first = sweep(
      live,
      fuse ? fuseWorkspaceBeyondResults(fuse, cost, regions, false,
                                        fuseWorkspace, partials)
           : 0,
      /*later=*/false, regions);
  if (!twoSweeps)
    return first;
  Peak later = sweep(live,
                     fuse ? fuseWorkspaceBeyondResults(fuse, cost, regions,
                                                       /*laterMicroBatch=*/true,
                                                       fuseWorkspace)
                          : 0,
                     /*later=*/true, regions);
  return later.bytes > first.bytes ? later : first;
}
