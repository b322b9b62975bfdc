//===- Pipeline.h - a pipeline's stages and schedules (torch-free) -*- C++ -*-===//
//
// Task-aware pipeline parallelism (docs/pipeline.md): the plan's stages and
// the order in which one stage runs its micro-batches' forwards and
// backwards. The runner is mtprt/torch/Pipeline.h.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_PIPELINE_H
#define MTPRT_PIPELINE_H

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mtprt {

struct PipelineStageConfig {
  int64_t firstUnit = 0, lastUnit = 0; ///< runtime block numbers, inclusive
  std::vector<int64_t> tasks;          ///< heads (spec order) on this stage
  int64_t predictedPeakBytes = 0;
  int64_t inFlight = 1;
  /// The plan's checkpoint regions inside this stage (none crosses one).
  std::vector<std::pair<int64_t, int64_t>> regions;
  /// Its offloaded units (Schedule::offloadUnits inside the stage): their
  /// saved tensors go to the host pool between each micro-batch's forward
  /// and its backward.
  std::vector<int64_t> offloadUnits;
};

struct PipelineConfig {
  std::vector<PipelineStageConfig> stages; ///< empty: no pipeline
  bool gpipe = false;                      ///< false: 1F1B
  int64_t microBatches = 1;
  double bubble = 0; ///< predicted (S − 1) / (M + S − 1)
  int64_t size() const { return static_cast<int64_t>(stages.size()); }
  bool active() const { return stages.size() > 1; }
  /// Rank r's stage: ranks are replica-major (r = replica × S + stage), so
  /// a replica's stages are neighbours.
  int64_t stageOf(int64_t rank) const { return rank % size(); }
  int64_t replicaOf(int64_t rank) const { return rank / size(); }
};

/// One step of a stage: a micro-batch's forward or backward.
struct PipeAction {
  bool forward = true;
  int64_t micro = 0;
  bool operator==(const PipeAction &o) const {
    return forward == o.forward && micro == o.micro;
  }
};

/// Stage `stage` of `stages` over `micro` micro-batches. GPipe: every
/// forward, then every backward (in micro-batch order). 1F1B: S − 1 − stage
/// forwards to fill the pipe, then one forward and one backward in turn,
/// then the backwards left — at most S − stage micro-batches in flight.
/// Backwards run in micro-batch order on every stage (micro-batch 0's
/// carries the step's α down the pipe).
std::vector<PipeAction> pipelineActions(int64_t stages, int64_t stage,
                                        int64_t micro, bool gpipe);

/// "F0 F1 B0 F2 B1 B2" (docs and errors).
std::string describeActions(const std::vector<PipeAction> &actions);

} // namespace mtprt

#endif // MTPRT_PIPELINE_H
