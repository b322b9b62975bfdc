//===- PlanMemory.h - the joint keep / recompute / offload plan -*- C++ -*-===//
//
// One deciding component: for every candidate (a backbone block, or a group
// of blocks under task-granular checkpointing, and every head) keep its saved
// tensors, recompute them in a checkpoint region, or offload them to host
// memory and prefetch them — so the simulated peak fits the budget at the
// least added time. `--mtp-plan-memory` writes the decision into the IR;
// later passes only materialize it.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_PASSES_PLANMEMORY_H
#define MTPC_PASSES_PLANMEMORY_H

#include "dialect/MTPOps.h"

#include "llvm/ADT/SmallVector.h"

#include <string>
#include <vector>

namespace mtp {

struct MeasuredCosts;

// Decision (keep / recompute / offload) is the dialect's enum: MTPAttrs.td.

/// Something the planner decides about.
struct Candidate {
  std::string name; ///< "layer 3 attention", "layers 1-8 (pos chunk)", "head ner"
  /// Backbone blocks (1-based: 2l-1 attention, 2l MLP of layer l); empty for
  /// a head.
  llvm::SmallVector<int64_t> blocks;
  /// The task whose head this is (heads only).
  std::string task;
  bool canRecompute = false, canOffload = false;
  /// Whether the block's projections can be recomputed at tensor grain
  /// (Decision::Partial: CostModel::projectionChain).
  bool canPartial = false;
};

/// Task groups: tasks joined when their correlation reaches the threshold
/// (union of pairs), in forward order of their lowest tap.
std::vector<llvm::SmallVector<llvm::StringRef>> taskGroups(ModelOp model,
                                                          double threshold);

struct PlanResult {
  std::vector<Candidate> candidates;
  std::vector<Decision> decisions;
  int64_t peakBytes = 0;
  /// Added step time: recompute plus exposed transfer time.
  double addedSeconds = 0.0;
  /// The predicted step with everything kept (the plan's step is this plus
  /// addedSeconds), and whether it comes from measured costs (else the cost
  /// model's roofline).
  double keepStepSeconds = 0.0;
  bool measuredCosts = false;
  bool fits = false;
  /// The no-strategy and uniform-checkpointing (every layer) baselines.
  int64_t keepPeak = 0, uniformPeak = 0;
  double uniformSeconds = 0.0;
  /// The smallest peak any plan reaches (everything recomputed/offloaded
  /// that the strategy allows).
  int64_t minimalPeak = 0;
  /// Checkpoint regions in runtime block numbers, inclusive.
  std::vector<std::pair<int64_t, int64_t>> regions;
  /// Per offloaded candidate: bytes moved each way and the backward's wait
  /// for its prefetch (0 when the copy is hidden).
  struct Offload {
    size_t candidate;
    int64_t bytes;
    double exposedWait;
  };
  std::vector<Offload> offloads;
  /// The search: nodes the branch and bound visited (0: not run), and
  /// whether it searched its whole tree, which proves the decisions optimal
  /// for the simulator (and `minimalPeak` the smallest peak any plan has).
  int64_t nodes = 0;
  bool optimal = false;
  /// Where not optimal: a lower bound on every fitting plan's added
  /// seconds (the search's root relaxation; 0: none).
  double lowerBoundSeconds = 0;
};

/// What the branch and bound found: the best assignment (empty when none
/// fits), and whether the tree was searched to its end.
struct BoundResult {
  std::vector<Decision> decisions;
  double seconds = 0;
  int64_t peak = 0;
  int64_t nodes = 0;
  bool complete = false;
  /// The root's bound on every fitting plan's added seconds (0: none).
  double rootBound = 0;
};

struct SolveOptions {
  /// Branch-and-bound nodes before the search stops with the best plan so
  /// far (a count, not a time, so plans are the same on every machine).
  /// Each node is three simulations; 0: the heuristic alone.
  int64_t maxNodes = 40000;
  /// Where no plan fits, search for the smallest reachable peak; false: a
  /// budget under the bound on every plan stops at the most frugal plan,
  /// and a budget everything kept fits is planned so at once (the floor
  /// reported is then that peak).
  bool exactFloor = true;
};

class MemoryPlanner {
public:
  /// `model` must be expanded into a step. With `measured` (mtpc profile;
  /// kept alive by the caller), times are those segments' instead of the
  /// cost model's roofline.
  explicit MemoryPlanner(ModelOp model,
                         const MeasuredCosts *measured = nullptr);
  ~MemoryPlanner();

  /// The joint decision under the model's strategy and budget: the
  /// heuristic's plan, then the branch and bound from it.
  PlanResult solve(const SolveOptions &options = {});
  /// Depth-first branch and bound over the candidates, exact for the
  /// simulator: the least added time under the budget (or, with
  /// `minimizePeak`, the smallest peak), starting from `incumbent` (empty:
  /// none) and stopping after `maxNodes` nodes.
  BoundResult branchAndBound(std::vector<Decision> incumbent, int64_t maxNodes,
                             bool minimizePeak = false) const;
  /// Exhaustive search over every combination (tests only; 3^n).
  PlanResult solveExactly();
  /// A given assignment's plan (peak, added time, regions, offloads), as
  /// solve() reports its own; attachPlan writes it into the step.
  PlanResult evaluate(std::vector<Decision> decisions) const;
  /// Whether candidate `c` may take decision `d` under the strategy.
  bool allowed(size_t c, Decision d) const;

  /// The simulated peak and added time of a given assignment.
  int64_t simulatePeak(llvm::ArrayRef<Decision> decisions) const;
  double addedSeconds(llvm::ArrayRef<Decision> decisions) const;
  /// Whether every offload in `decisions` keeps its exposed prefetch
  /// latency under the strategy's bound.
  bool latencyOk(llvm::ArrayRef<Decision> decisions) const;
  /// The offloads of an assignment with their exposed prefetch waits.
  std::vector<PlanResult::Offload>
  offloads(llvm::ArrayRef<Decision> decisions) const;
  const std::vector<Candidate> &getCandidates() const;
  int64_t budget() const;
  /// The predicted step with everything kept (PlanResult::keepStepSeconds).
  double keepStepSeconds() const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl;
};

/// Writes `result` into the step: `mtp.decision` and `mtp.region` on every
/// forward unit, the summary on the step.
void attachPlan(ModelOp model, const PlanResult &result);

} // namespace mtp

#endif // MTPC_PASSES_PLANMEMORY_H
