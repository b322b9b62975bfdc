//===- Pipeline.h - one pipeline stage's step -------------------*- C++ -*-===//
//
// docs/pipeline.md. A stage process holds its units and heads (TrainerCore::
// restrictToStage) and runs its micro-batches in the schedule's order
// (mtprt/Pipeline.h), exchanging boundary activations forward and their
// gradients backward with its neighbours over c10d point-to-point (gloo on
// CPU, NCCL on GPU). The per-task gradient pipeline sees every task: each
// stage runs GFM and clipping on its own heads' tap gradients; micro-batch
// 0's gate inputs (losses, norms, and at measured steps the processed tap
// gradients) travel forward with the activation to the last stage, which
// computes α (and the cosine matrix) and sends them back down with the
// gradient, before any stage's first fusion.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_PIPELINE_H
#define MTPRT_TORCH_PIPELINE_H

#include "mtprt/Config.h"
#include "mtprt/Pipeline.h"

#include <cstdint>
#include <vector>

namespace mtprt {

class Communicator;
class TrainerCore;
struct Batch;

class PipelineRunner {
public:
  /// `world` holds every rank; this rank is stage `stage` of `config`, its
  /// neighbours `rank − 1` and `rank + 1` (replica-major ranks).
  PipelineRunner(TrainerCore &core, Communicator &world,
                 const PipelineConfig &config, int64_t stage);

  /// One step on this replica's rows: the schedule's forwards and
  /// backwards, then endStep(applyUpdate) (the exchange among the stage's
  /// replicas is TrainerCore::beforeUpdate's). The statistics hold this
  /// stage's tasks as present, the others not (the driver's step-end
  /// all-reduce joins them), α and the cosine matrix from the last stage.
  StepStats step(const Batch &batch, bool applyUpdate = true);

  /// Seconds of the last step spent waiting for a neighbour.
  double lastWaitSeconds() const { return waitS_; }

private:
  TrainerCore &core_;
  Communicator &world_;
  PipelineConfig config_;
  int64_t stage_, stages_;
  int prev_, next_;
  std::vector<bool> local_;
  double waitS_ = 0;
};

} // namespace mtprt

#endif // MTPRT_TORCH_PIPELINE_H
