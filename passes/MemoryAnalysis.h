//===- MemoryAnalysis.h - peak memory of a step, by liveness ----*- C++ -*-===//

#ifndef MTPC_PASSES_MEMORYANALYSIS_H
#define MTPC_PASSES_MEMORYANALYSIS_H

#include "dialect/MTPOps.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringMap.h"

#include "mlir/Pass/Pass.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mtp {

class CostModel;

/// Bytes by kind at one point of the step.
struct MemoryBreakdown {
  int64_t parameters = 0;     ///< fp32 weights
  int64_t gradients = 0;      ///< parameter gradients allocated so far
  int64_t optimizer = 0;      ///< AdamW moments (resident after step 1)
  int64_t activations = 0;    ///< forward values alive (saved or in use)
  int64_t activationGrads = 0;///< backward values alive
  int64_t workspace = 0;      ///< the running unit's temporaries
  /// The data-parallel exchange's error-feedback residual (GSC at more than
  /// one process), resident through every step.
  int64_t exchange = 0;
  int64_t total() const {
    return parameters + gradients + optimizer + activations + activationGrads +
           workspace + exchange;
  }
};

/// One backbone sub-block, head or loss: what it saves and who needs it.
struct UnitMemory {
  FwdOp op;
  /// Bytes of the tensors this unit produced that some backward unit takes.
  int64_t savedBytes = 0;
  /// The tasks whose gradient flows through this unit's backward.
  llvm::SmallVector<llvm::StringRef> tasks;
};

struct MemoryReport {
  int64_t peakBytes = 0;
  /// Under SAPS, the peak of a step that does not re-rank (peakBytes is a
  /// re-ranking step's); 0 without SAPS.
  int64_t steadyPeakBytes = 0;
  /// train { phases }: each phase's step peak (its tasks alone; at most
  /// peakBytes, which is every task's at once); empty without phases.
  llvm::SmallVector<int64_t> phasePeakBytes;
  /// The op at which the peak occurs, and the breakdown there.
  mlir::Operation *peakOp = nullptr;
  MemoryBreakdown atPeak;
  /// Saved activations: produced by a forward unit, taken by a backward one.
  int64_t savedBytes = 0;
  /// Per task: saved bytes needed by that task's backward alone.
  llvm::MapVector<llvm::StringRef, int64_t> taskOnlyBytes;
  /// Over every task, the saved backbone bytes its backward depends on
  /// (counted once per task); the share some other task depends on too —
  /// the runtime's definition (docs/runtime.md §7).
  double activationReuseRatio = 0.0;
  /// Every forward unit in order.
  llvm::SmallVector<UnitMemory> units;
  int64_t usableBytes = 0;
  /// The held-out evaluation (analyzeEvaluation): its batch — the largest
  /// multiple of the micro batch, up to 8, whose peak stays within the
  /// step's (and the budget) — and its peak there.
  int64_t evalBatch = 0;
  int64_t evalPeakBytes = 0;
  mlir::Operation *evalPeakOp = nullptr;
  MemoryBreakdown evalAtPeak;

  /// "bwd attn_core[3]", "fwd head @pos".
  static std::string describe(mlir::Operation *op);
};

/// Analyzes the expanded step of `model` (which must have one).
MemoryReport analyzeMemory(ModelOp model);

/// The held-out evaluation's plan (the runtime's evaluate(),
/// docs/cost-model.md "Evaluation"): the step's forward units in their
/// order, in eval mode under NoGradGuard (CostModel::evalUnit: no dropout,
/// nothing kept), each head right after its tap; every value from its unit
/// to its last forward reader, the batch's inputs through the batch; over
/// the parameters, AdamW's moments and the exchange's residual (the
/// gradients were freed with the update). Its batch is the largest multiple
/// of the micro batch (up to 8×) whose peak stays within the step's
/// `report.peakBytes` and the budget; writes the batch, the peak there,
/// where it is and its breakdown into `report`. `order` is the step as
/// analyzeMemory walks it.
void analyzeEvaluation(ModelOp model, llvm::ArrayRef<mlir::Operation *> order,
                       MemoryReport &report);

/// analyzeMemory as an MLIR analysis on an mtp.model with a step: passes ask
/// `getAnalysis<StepMemoryAnalysis>()`, the pass manager computes it once
/// and keeps it while the passes that ran preserve it.
struct StepMemoryAnalysis {
  explicit StepMemoryAnalysis(mlir::Operation *model)
      : report(analyzeMemory(llvm::cast<ModelOp>(model))) {}
  MemoryReport report;
};

/// Where the memory-analysis pass hands its report, so that a tool (mtpc)
/// reads the analysis the pipeline computed instead of computing it again.
/// Called once per analyzed model; may be called from pass-manager threads.
using MemoryReportSink =
    std::function<void(ModelOp, const MemoryReport &)>;

/// The mtp-memory-analysis pass, handing each report to `sink` as well.
std::unique_ptr<mlir::Pass> createMemoryAnalysis(MemoryReportSink sink);

/// A fuse op's workspace is its transient before its results (the fused
/// gradients) exist; counted on top of the live values at the op, which
/// already include those results, it is the workspace beyond them (>= 0).
/// At the features scope the transient is at least the cosine probe's under
/// the step's checkpoint `regions` (block numbers, inclusive; the probe
/// re-runs those on its path: CostModel::cosineProbeWorkspace). The probe
/// runs in the first micro-batch only: `laterMicroBatch` gives the transient
/// of the others (GFM and the clip alone). The analysis and the planner's
/// simulator both use this.
int64_t fuseWorkspaceBeyondResults(
    FuseTaskGradsOp fuse, const CostModel &cost,
    llvm::ArrayRef<std::pair<int64_t, int64_t>> regions,
    bool laterMicroBatch = false,
    std::optional<int64_t> workspaceOverride = std::nullopt,
    llvm::ArrayRef<int64_t> partials = {});

/// The step's parameters, from its mtp.weights: all of them, and the
/// trainable ones (a frozen group has no gradients and no optimizer state).
struct ParameterGroups {
  int64_t total = 0;     ///< every parameter, frozen ones too
  int64_t trainable = 0; ///< the optimizer's
  /// Of those, the ones SAPS updates sparsely (the trainable backbone), and
  /// how many of their entries it selects: their state is compact and
  /// their dense gradients transient.
  int64_t sparse = 0, selected = 0;
  /// The trainable backbone under EWC: its Fisher and remembered weights
  /// are resident.
  int64_t protectedByEwc = 0;
};
ParameterGroups parameterGroups(StepOp step);
/// The values ZeRO shards: what the step's gradient exchange (its
/// mtp.allreduce buckets) sums.
int64_t zeroValues(StepOp step);
/// AdamW's moments of those values on one process, wherever they live: its
/// run under `zero` (mtprt/Zero.h), else all of them.
int64_t adamwStateBytes(ModelOp model);

/// What is resident through every step and between steps: the fp32
/// weights, AdamW's moments (SAPS's compact state for what it updates; EWC's
/// Fisher and remembered weights), the exchange's error-feedback residual, and the
/// step's batch beyond one micro-batch — the trainer moves the whole batch
/// to the device at the step's start and holds it to the next (the step's
/// inputs are one micro-batch's; with accumulation, or a dynamic batch's
/// largest, the others' are held too). `heldMicroBatches`: how many
/// micro-batches of inputs to count beyond the step's own (the step: the
/// accumulation steps − 1; an evaluation between steps: all of them).
MemoryBreakdown residentState(ModelOp model, const CostModel &cost,
                              int64_t heldMicroBatches);

/// The checkpoint regions of a materialized step (mtp.checkpoint ops), in
/// block numbers, inclusive.
std::vector<std::pair<int64_t, int64_t>> checkpointRegions(StepOp step);
/// The backbone blocks planned at tensor grain (a projection unit planned
/// recompute outside any region), in order.
llvm::SmallVector<int64_t> tensorGrainBlocks(StepOp step);

/// The report as attributes on the step (mtp.peak_bytes, ...).
void attachMemoryReport(StepOp step, const MemoryReport &report);

/// Where an offloaded forward output leaves the device and comes back, as
/// --mtp-materialize-offload places its copies and the planner's simulator
/// assumes them: out after its last use that is not a backward unit; the
/// prefetch issued where the unit group (a backbone block, or a task's head)
/// whose backward runs just before its own starts — one group ahead, or at
/// its first backward use when that group started before the copy out —
/// and waited for at that first use. None when it has no backward reader or
/// a backward of another unit group reads it (it stays on the device).
struct OffloadPlacement {
  mlir::Operation *lastForward, *issue, *firstBackward;
};
std::optional<OffloadPlacement> placeOffload(FwdOp owner, mlir::Value value);

} // namespace mtp

#endif // MTPC_PASSES_MEMORYANALYSIS_H
