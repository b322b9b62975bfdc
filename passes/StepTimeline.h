//===- StepTimeline.h - a step's memory over time, for every pass -*- C++ -*-===//
//
// The one skeleton the memory analysis and the planner's simulator share: a
// step's ops in execution order as positions; what is resident through it
// (fp32 weights, AdamW's moments, the exchange's error-feedback residual);
// where each parameter group's gradients appear (its first backward unit);
// and each position's workspace (a unit's temporaries, the gradient
// pipeline's transient, the exchange's). Tensors are intervals of positions
// on it. `peak` sweeps them for the first micro-batch (gradients arriving,
// the cosine probe) and, with accumulation, for the later ones (every
// gradient live from the start, no probe), and returns the larger peak with
// where it is and what it is made of. The figures come from the CostModel.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_PASSES_STEPTIMELINE_H
#define MTPC_PASSES_STEPTIMELINE_H

#include "passes/MemoryAnalysis.h"

#include "llvm/ADT/ArrayRef.h"

#include <utility>
#include <vector>

namespace mtp {

class StepTimeline {
public:
  /// `order`: the step's ops as they run (a checkpoint or recompute region's
  /// ops inline, where they run); a null op is a position with nothing of
  /// its own (the planner's place for a re-run it may plan).
  /// `sapsRerank`: under SAPS, a step that re-ranks (the plan's worst) or
  /// one that does not.
  StepTimeline(ModelOp model, const CostModel &cost,
               llvm::ArrayRef<mlir::Operation *> order, bool sapsRerank = true);

  int size() const { return static_cast<int>(order.size()); }
  mlir::Operation *at(int position) const { return order[position]; }

  /// Tensors alive over positions, by kind (difference arrays: adding an
  /// interval is O(1), the sweep reads them once).
  class Live {
  public:
    /// `bytes` alive from position `from` through `to` (inclusive; nothing
    /// when `from > to`). Forward values (activations) and backward values
    /// (activation gradients) are counted apart for the breakdown.
    void add(int from, int to, int64_t bytes, bool forward) {
      if (from > to)
        return;
      std::vector<int64_t> &d =
          forward || activationGrads.empty() ? activations : activationGrads;
      d[from] += bytes;
      d[to + 1] -= bytes;
    }

  private:
    friend class StepTimeline;
    Live(int size, bool breakdown)
        : activations(size + 1, 0), activationGrads(breakdown ? size + 1 : 0, 0) {}
    /// Without a breakdown every value counts as an activation.
    std::vector<int64_t> activations, activationGrads;
  };
  /// `breakdown`: keep activations and activation gradients apart (the
  /// analysis's report); the planner needs only the total.
  Live live(bool breakdown = true) const { return Live(size(), breakdown); }

  struct Peak {
    int64_t bytes = 0;
    int position = -1;
    MemoryBreakdown at;
  };
  /// The step's peak with `live` alive, its checkpoint `regions` (block
  /// numbers, inclusive) and tensor-grain blocks (`partials`) deciding the
  /// gradient pipeline's probe workspace.
  Peak peak(const Live &live,
            llvm::ArrayRef<std::pair<int64_t, int64_t>> regions,
            llvm::ArrayRef<int64_t> partials = {}) const;

private:
  Peak sweep(const Live &live, int64_t fuseWorkspace, bool later,
             llvm::ArrayRef<std::pair<int64_t, int64_t>> regions) const;

  const CostModel &cost;
  std::vector<mlir::Operation *> order;
  MemoryBreakdown resident; ///< parameters, optimizer state, exchange
  int64_t allGradients = 0;
  /// (position, bytes) where a parameter group's gradients appear.
  std::vector<std::pair<int, int64_t>> gradientArrivals;
  std::vector<int64_t> workspace; ///< per position, the fuse op's aside
  /// Per position, what a backward unit's internal peak lacks of its saved
  /// tensors and (first micro-batch) of its gradients (BwdOp freed/pending).
  std::vector<std::pair<int64_t, int64_t>> relief;
  FuseTaskGradsOp fuse;

public:
  /// The fuse op's workspace for a step that runs some tasks alone (a
  /// phase's: CostModel::gradientPipeline over their gradients); none: the
  /// op's own.
  std::optional<int64_t> fuseWorkspace;
  /// A step that makes only its units' gradients (a phase's): a later
  /// micro-batch holds those (and `otherBytes`), not every parameter's.
  void onlyArrivingGradients(int64_t otherBytes) {
    allGradients = otherBytes;
    for (const auto &arrival : gradientArrivals)
      allGradients += arrival.second;
  }

private:
  int fusePosition = -1;
  bool twoSweeps = false;
  /// ZeRO (mtprt/Zero.h): at the optimizer step the update (stage 2: the
  /// full gradients freed, this rank's averaged run held); the updated
  /// values are broadcast in place, beside the next forward.
  int updatePosition = -1;
  int64_t zeroStage = 0, zeroGradientShard = 0;
  /// Stage 2's release: (position, bytes) of the backbone gradients it sums
  /// and frees as they are made, and where this rank's run is made.
  std::vector<std::pair<int, int64_t>> released;
  std::vector<int> releasedBlock; ///< each released one's backbone block
  int releasedBlockMax = -1;
  int shardFrom = -1;
  /// The release's bucket (ZeroOptimizer::release): from the first release
  /// to the last of a backward; beside it, per position, the sum in flight
  /// (the bucket before, or a large gradient alone).
  int64_t releaseBucket = 0;
  int releaseFrom = -1, releaseTo = -1;
  std::vector<int64_t> inFlightAt;
  /// ZeRO 3: per position, the backbone block whose forward or backward
  /// runs there (-1: none); its parameters are whole then (a checkpoint
  /// region's: the region's blocks').
  std::vector<int> blockAt;
  /// ZeRO 3, made once for every sweep: per position, a forward outside a
  /// recompute; the highest block a forward runs; per block, its sharded
  /// bytes and whether its backward reads its parameters.
  std::vector<bool> forwardAt;
  int lastForward = -1;
  std::vector<int64_t> blockBytes;
  std::vector<bool> readsParameters;
};

} // namespace mtp

#endif // MTPC_PASSES_STEPTIMELINE_H
