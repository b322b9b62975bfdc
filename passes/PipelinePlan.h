//===- PipelinePlan.h - backbone stages across processes --------*- C++ -*-===//
//
// Task-aware pipeline parallelism (docs/pipeline.md, SPEC §3 C9): the
// backbone's units cut into contiguous stages, each task's head and loss on
// the stage where its tap unit is, balanced on the cost model's time; each
// stage's peak with the micro-batches its schedule holds in flight. A pure
// function of the expanded step: the planner, the plan writer and the plan
// report all ask it, so they cannot disagree.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_PASSES_PIPELINEPLAN_H
#define MTPC_PASSES_PIPELINEPLAN_H

#include "dialect/MTPOps.h"

#include "llvm/ADT/SmallVector.h"

#include <optional>
#include <string>
#include <vector>

namespace mtp {

struct PipelineStagePlan {
  /// Runtime block numbers (0 embeddings, 2l−1 / 2l layer l's attention /
  /// MLP), inclusive.
  int64_t firstUnit = 0, lastUnit = 0;
  /// The tasks (spec order) whose head and loss run here.
  llvm::SmallVector<int64_t> tasks;
  /// Parameters held (trainable: with gradients and AdamW's state).
  int64_t parameters = 0, trainableParameters = 0, backboneTrainable = 0;
  /// One micro-batch's forward and backward on the cost model's roofline
  /// (a recomputed block's re-run in the backward).
  double forwardSeconds = 0, backwardSeconds = 0;
  /// One micro-batch's waits on the interconnect: the activation it
  /// receives and the gradient it receives (the sends do not block).
  double communicationSeconds = 0;
  /// What one micro-batch keeps here from its forward to its backward (the
  /// received boundary included), and how many are held at once.
  int64_t keptBytesPerMicroBatch = 0, inFlight = 1;
  /// Parameters, gradients and AdamW's state.
  int64_t stateBytes = 0;
  /// Bytes of one boundary activation (and of its gradient).
  int64_t boundaryBytes = 0;
  int64_t peakBytes = 0;
  /// Blocks in checkpoint regions (re-run before their backward).
  llvm::SmallVector<int64_t> recomputed;
  /// Blocks whose saved tensors go to the host between a micro-batch's
  /// forward and its backward (not in keptBytesPerMicroBatch), their bytes,
  /// and the copies' time one micro-batch's compute does not hide.
  llvm::SmallVector<int64_t> offloaded;
  int64_t offloadedBytesPerMicroBatch = 0;
  double transferSeconds = 0;
};

struct PipelinePlanResult {
  std::vector<PipelineStagePlan> stages;
  int64_t microBatches = 1, replicas = 1;
  /// Per backbone block (runtime numbers): what one micro-batch keeps of it
  /// under the plan, and its forward's time (what re-running it costs).
  llvm::SmallVector<int64_t> blockKeptBytes;
  llvm::SmallVector<double> blockForwardSeconds;
  /// Per block: its backward's time, and what offloading it would send to
  /// the host per micro-batch.
  llvm::SmallVector<double> blockBackwardSeconds;
  llvm::SmallVector<int64_t> blockOffloadableBytes;
  bool gpipe = false;
  /// The cut is not the time-balanced one: the planner moved blocks off a
  /// stage over the budget (docs/pipeline.md, "Balancing memory").
  bool movedForMemory = false;
  /// (S − 1) / (M + S − 1): the share of the step a stage idles.
  double bubble = 0;
  /// The step on the slowest stage's time: (M + S − 1) micro-batch slots
  /// (compute and its receives), then the replicas' exchange.
  double stepSeconds = 0;
  /// The slowest stage's gradient all-reduce over its replicas.
  double exchangeSeconds = 0;
  int64_t peakBytes() const;
};

/// The stage split and per-stage prediction of `model`'s expanded step;
/// none when the budget asks for no pipeline (or there is no step). The
/// split is the budget's `stages` when the planner set it, else
/// balancedStages over the blocks' kept time.
std::optional<PipelinePlanResult> planPipeline(ModelOp model);

/// The step of a data-parallel plan in the pipeline's terms (to compare
/// with PipelinePlanResult::stepSeconds, as pipeline = auto does): each
/// micro-batch's units forward and backward with the plan's added time,
/// times the micro-batches per step, then the step's communication.
double dataParallelStepSeconds(ModelOp model);

/// The linear partition of blocks with these times into S contiguous
/// stages minimizing the slowest: each stage's first block.
std::vector<int64_t> balancedStages(llvm::ArrayRef<double> seconds,
                                    int64_t S);

} // namespace mtp

#endif // MTPC_PASSES_PIPELINEPLAN_H
