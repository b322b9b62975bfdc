//===- Plan.h - the compiler's plan, read by the runtime ---------*- C++ -*-===//
//
// The plan `mtpc plan --format=fb` writes (a frame, mtprt/PlanFrame.h, around
// the flatbuffer of runtime/schema/plan.fbs), verified and turned into what a
// step needs: the model, the heads and the
// Schedule carrying the planner's decisions. Torch-free.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_PLAN_H
#define MTPRT_PLAN_H

#include "mtprt/BatchSchedule.h"
#include "mtprt/Pipeline.h"
#include "mtprt/Config.h"
#include "mtprt/Defaults.h"
#include "mtprt/Errors.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mtprt {

/// The spec's collective policy (auto: compressed when processes share the
/// gradients).
enum class Collective { Auto, None, Compressed };

struct Plan {
  std::string modelName, source;
  std::string device; ///< the target the plan was made for
  Precision precision = Precision::Fp32;
  int64_t gpus = 1, microBatch = 1, globalBatch = 1, memoryBytes = 0,
          usableBytes = 0;
  int64_t zero = 0; ///< ZeRO stage: 0, 1 or 2
  std::string backboneKind = "transformer";
  ModelConfig model;
  std::vector<HeadConfig> heads; ///< in the spec's task order
  /// The strategy and the training settings (defaults when the plan
  /// predates them): scope, GFM, clip, gate, per-task learning rates.
  TrainConfig train;
  int64_t steps = 100, logEvery = 1, saveEvery = 0;
  uint64_t seed = 0;
  std::string data = "synthetic";
  std::string evalData; ///< held-out data ("" = none)
  int64_t evalEvery = 0;
  Collective collective = Collective::Auto;
  double compressTopK = defaults::kTopK,
         compressDecay = defaults::kResidualDecay;
  int64_t compressBlock = defaults::kQuantBlock,
          compressBits = defaults::kQuantBits;
  /// regions, offloadUnits and offloadHeadList from the decisions.
  Schedule schedule;
  int64_t predictedPeakBytes = 0, keepPeakBytes = 0, uniformPeakBytes = -1;
  /// npd(regroup): the peak with the adapter groups unsplit (0: unknown).
  int64_t groupedPeakBytes = 0;
  /// D15: the global batch per step (none: globalBatch, fixed).
  std::optional<BatchSchedule> dynamicBatch;
  /// Sequential training (empty: every task at every step).
  std::vector<Phase> phases;
  /// SAPS: the peak of a step that does not re-rank (0: predictedPeakBytes
  /// at every step).
  int64_t steadyPeakBytes = 0;
  /// Held-out evaluation's predicted peak (forward only); 0: the plan has
  /// none (written before it).
  int64_t evalPeakBytes = 0;
  /// Its batch per process (0: the micro batch).
  int64_t evalBatch = 0;
  double addedSeconds = 0.0;
  /// docs/pipeline.md: the stages (empty: none).
  PipelineConfig pipeline;
};

/// Verifies `size` bytes at `data` — the frame (mtprt/PlanFrame.h: version,
/// length, CRC-32), the 'MTPP' identifier, the flatbuffers verifier, the
/// version, then every field the runtime uses against mtprt/Limits.h
/// (non-finite and out-of-range reals included) and the decisions against
/// the schedule rule — and reads them. Throws PlanError naming `name` (the
/// file), the field, what is wrong and what to do; never reads outside the
/// buffer and allocates nothing a field says before checking it.
Plan readPlan(const void *data, size_t size, const std::string &name);

/// readPlan's verdict without exceptions (for `mtpc inspect`, which is
/// built without them): "" when the plan is good, else PlanError::reason().
std::string checkPlan(const void *data, size_t size, const std::string &name);

/// readPlan on a file's contents (a regular file of at most the 2 GiB a
/// flatbuffer can hold).
Plan loadPlan(const std::string &path);

struct Program;
/// The driver's program for a plan: every field the runtime acts on (the
/// table in docs/runtime.md, "The compiler's plan") — model, heads, schedule,
/// precision, batch and micro-batches, the strategy (scope, GFM, clip, the
/// DGFG gate's width and recalibration thresholds, compression), the training
/// settings (steps, seed, data, learning rates, AdamW's weight decay, betas
/// and eps, log and save intervals) — and the predicted peak to log beside
/// the measured. Throws std::runtime_error for a plan this runtime cannot run
/// as written (a backbone kind it does not build).
Program programFromPlan(const Plan &plan);

} // namespace mtprt

#endif // MTPRT_PLAN_H
