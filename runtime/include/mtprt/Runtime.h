//===- Runtime.h - what an emitted step program calls -----------*- C++ -*-===//
//
// The torch-free facade of the runtime: build the model from plain config
// structs, give it batches as raw arrays (or synthetic ones), run steps as a
// Schedule says, read each step's measurements and write them as one JSON
// Lines record with docs/contracts.md's metric names. Programs that schedule at the
// unit grain themselves use the LibTorch-level API in mtprt/torch/.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_RUNTIME_H
#define MTPRT_RUNTIME_H

#include "mtprt/Config.h"

#include <memory>
#include <string>
#include <vector>

namespace mtprt {

class TrainerCore;
struct Batch;

class Trainer {
public:
  /// Throws std::invalid_argument naming the bad field.
  Trainer(const ModelConfig &model, const std::vector<HeadConfig> &heads,
          const TrainConfig &train);
  ~Trainer();
  Trainer(const Trainer &) = delete;
  Trainer &operator=(const Trainer &) = delete;

  /// The built-in synthetic multi-task data: a fixed batch from `seed`.
  void useSyntheticBatch(int64_t batchSize, uint64_t seed);
  /// A batch from raw arrays: tokens [batchSize × seq] int64; labels[h] points
  /// at head h's labels (shapes as in mtprt/torch/Model.h's Batch; int64, or
  /// float for mse) or is null when the batch has none. Copied.
  void setBatch(int64_t batchSize, const int64_t *tokens,
                const std::vector<const void *> &labels);
  /// A batch already in tensors (LibTorch callers: the driver); copied to
  /// the model's device.
  void setBatch(const Batch &batch);
  /// One optimizer step on the current batch, as `schedule` says.
  StepStats step(const Schedule &schedule);

  //===--- The same step at the unit grain
  //---------------------------------===//
  //
  // What a step program emitted by mtpc calls, in this order (misordered
  // calls throw std::logic_error):
  //
  //   beginStep();
  //   for (mb = 0; mb < microBatches(); ++mb) {
  //     beginMicroBatch(mb);
  //     ValueId v = input();
  //     ValueId w = forward(0, 0, v, RegionMode::Keep); release(v); ...
  //     forwardHead(h, /*offload=*/true); ...
  //     prefetch("head2"); backwardHead(2); ...
  //     fuseTaskGradients();   // optional: backwardBackbone runs it if not
  //     backwardBackbone();
  //   }
  //   exchangeGradients();     // optional: optimizerStep runs it if not
  //   optimizerStep();         // optional: endStep runs it if not
  //   StepStats s = endStep();
  void beginStep();
  int64_t microBatches() const;
  void beginMicroBatch(int64_t mb);
  ValueId input();
  /// Units [first, last] (0 = embed, 2l-1 / 2l = layer l's attention / MLP).
  ValueId forward(int64_t first, int64_t last, ValueId in, RegionMode mode);
  void release(ValueId value);
  void forwardHead(int64_t head, bool offload);
  void backwardHead(int64_t head);
  /// GFM, clip, the gate's α and the fused gradient for this micro-batch.
  void fuseTaskGradients();
  void backwardBackbone();
  /// After the last micro-batch: final gradients, exchanged with the ranks.
  void exchangeGradients();
  void optimizerStep();
  /// The optimizer step (unless applyUpdate is false) and the statistics.
  StepStats endStep(bool applyUpdate = true);
  /// Offload groups: "head<h>", "unit<u>" and "region<first unit>" (every
  /// micro-batch's of that unit: "unit<u>/<m>" names one).
  void prefetch(const std::string &group);
  void waitOffloaded(const std::string &group);
  /// How many offloaded region boundaries a region's backward prefetches.
  void setPrefetchAhead(int64_t n);

  int64_t numParameters() const;
  int64_t numUnits() const;
  std::string unitName(int64_t unit) const;
  std::vector<std::string> taskNames() const;

  TrainerCore &core() { return *core_; }

private:
  std::unique_ptr<TrainerCore> core_;
  struct BatchHolder;
  std::unique_ptr<BatchHolder> batch_;
};

/// One JSON Lines record (no newline) with the metric names of docs/contracts.md.
std::string toJsonLine(const StepStats &stats);

/// The population standard deviation of all T×T entries of the step's cosine
/// matrix (diagonal included); NaN when it was not measured.
double cosineMatrixStd(const StepStats &stats);
/// docs/techniques.md B8: the DGFG gate is recalibrated when the tasks share little
/// (activation_reuse_ratio < reuseThreshold, default 0.15) and their
/// gradients disagree in a spread way (cosine matrix std > stdThreshold,
/// default 0.4; TrainConfig.recalibrateReuse / recalibrateStd, the plan's
/// dgfg thresholds). Needs a measured matrix.
bool needsGateRecalibration(const StepStats &stats,
                            double reuseThreshold = defaults::kReuseThreshold,
                            double stdThreshold = defaults::kSimStdThreshold);
/// The event record the driver logs when it recalibrates.
std::string recalibrationJsonLine(const StepStats &stats);
/// EWC's conflict detector at a phase's end (D14): the event record
/// {"event":"ewc_conflict","step":S,"phase":P,"tasks":[..],"similarity":
/// [[..]],"largest":C,"threshold":T,"protect":B} (largest: null where the
/// tasks share no trainable layer and the phase is protected regardless).
std::string conflictJsonLine(int64_t step, int64_t phase,
                             const std::vector<std::string> &tasks,
                             const std::vector<std::vector<double>> &cosines,
                             double largest, double threshold, bool protect);
/// npd(regroup)'s measurement (D13/D14): {"event":"adapter_regroup",
/// "step":S,"tasks":[..],"similarity":[[..]],"threshold":T,"groups_before":
/// [[..]],"groups":[[..]]} — the cosines of each group's members' gradients
/// on its adapter (null between groups and where unmeasured), the groups
/// (task names, each group's holder first) before and after.
std::string regroupJsonLine(int64_t step, const std::vector<std::string> &tasks,
                            const std::vector<std::vector<double>> &cosines,
                            double threshold,
                            const std::vector<int64_t> &before,
                            const std::vector<int64_t> &after);

} // namespace mtprt

#endif // MTPRT_RUNTIME_H
