//===- Trainer.h - one optimizer step over the units ------------*- C++ -*-===//
//
// Runs a training step as a Schedule says: the backbone chain with its
// checkpoint regions (boundaries optionally offloaded), the heads (their
// saved tensors optionally offloaded, prefetched ahead of their backward),
// the per-task gradient pipeline at the configured scope, micro-batch
// accumulation, precision, the per-group AdamW step with per-task learning
// rate schedules, and the step's measurements.
//
// Internal API (LibTorch); mtprt/Runtime.h is the torch-free facade.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_TRAINER_H
#define MTPRT_TORCH_TRAINER_H

#include "mtprt/Config.h"
#include "mtprt/torch/GradPipeline.h"
#include "mtprt/torch/Model.h"
#include "mtprt/torch/Regions.h"

#include <functional>
#include <memory>

namespace torch::optim {
class AdamW;
}

namespace mtprt {

class SparseUpdate;
class ElasticConsolidation;
class ZeroOptimizer;
class Communicator;

/// The learning rate of `c` at optimizer step `step` (0-based).
double scheduledLr(const LrConfig &c, int64_t step);

class TrainerCore {
public:
  TrainerCore(ModelConfig model, std::vector<HeadConfig> heads,
              TrainConfig train, OffloadOptions offload = {});
  ~TrainerCore();

  /// The whole step as `schedule` says, composed of the phases below:
  /// forward, per-task backward and fusion, leaving every parameter's .grad
  /// set (unscaled) without updating.
  StepStats computeGradients(const Batch &batch, const Schedule &schedule);
  /// computeGradients, then the optimizer step (skipped on fp16 overflow).
  StepStats step(const Batch &batch, const Schedule &schedule);

  //===--- The step phase by phase (what a unit-grain program calls)
  //-------===//
  //
  //   beginStep(batch)
  //   for mb in 0..microBatches-1:
  //     beginMicroBatch(mb)
  //     v = input(); w = forward(first, last, v, mode); release(v) ...
  //     forwardHead(h, offload) ...                          // every head
  //     [prefetch("head<h>")] backwardHead(h) ...            // every head
  //     backwardBackbone()                                   // α, fusion, one
  //     backward
  //   endStep(applyUpdate)                                   // optimizer step,
  //   stats
  //
  // Misordered calls throw std::logic_error; bad arguments
  // std::invalid_argument.

  void beginStep(const Batch &batch);
  void beginMicroBatch(int64_t mb);
  ValueId input();
  /// Units [first, last] from value `in`; records the taps it produces.
  ValueId forward(int64_t first, int64_t last, ValueId in, RegionMode mode);
  /// Drops the step's reference to a value after its last forward use (the
  /// compiler's liveness says when); otherwise it lives to the micro-batch's
  /// end. Taps stay referenced for their heads and the backbone backward.
  void release(ValueId v);
  /// Head h + its loss on its tap (skipped when the batch has no labels for
  /// it); `offload` sends what they save to the host pool (group "head<h>").
  void forwardHead(int64_t h, bool offload);
  /// Head h's backward: its parameters' gradients and, at scope features /
  /// params, its tap / top-k gradient for the pipeline.
  void backwardHead(int64_t h);
  /// GFM, clip, α and fusion for this micro-batch: the backbone backward's
  /// roots and their gradients, held for backwardBackbone.
  void fuseTaskGradients();
  /// The backbone backward for this micro-batch (fuseTaskGradients first
  /// when it has not run).
  void backwardBackbone();
  /// After the last micro-batch: params-scope fusion, unscaling, the step's
  /// statistics, then the data-parallel exchange (beforeUpdate).
  void exchangeGradients();
  /// The optimizer step with each group's scheduled learning rate (skipped on
  /// fp16 overflow); exchangeGradients first when it has not run.
  void optimizerStep();
  /// Finishes the step: the phases above that have not run (the exchange and
  /// the optimizer step only when applyUpdate), the step's statistics.
  StepStats endStep(bool applyUpdate);
  /// Drops a step in progress (after an error).
  void abortStep();
  //===--- A pipeline stage (docs/pipeline.md) ------------------------------===//
  //
  // A stage runs its micro-batches' forwards and backwards interleaved
  // (mtprt/torch/Pipeline.h): beginMicroBatch parks the one in flight, and
  // resumeMicroBatch takes a parked one up again for its backward.

  /// Makes this trainer one stage: the model keeps units [first, last] and
  /// the heads `tasks` marks; the optimizer is rebuilt over what it holds.
  /// Before any step; the features or sum scope, no saps, ewc, adapters or
  /// ZeRO.
  void restrictToStage(int64_t first, int64_t last,
                       const std::vector<bool> &tasks);
  bool pipelined() const { return !local_.empty(); }
  void resumeMicroBatch(int64_t mb);
  /// The activation the previous stage sent (a leaf; its gradient is
  /// inputGradient() after the backward).
  ValueId inputActivation(const at::Tensor &x);
  /// The value this stage sends on; the next stage's gradient for it
  /// (setBoundaryGradient) is a root of this stage's backward.
  void setBoundaryOutput(ValueId v);
  void setBoundaryGradient(const at::Tensor &g);
  /// After backwardBackbone: the received activation's gradient (undefined
  /// when the units below need none).
  at::Tensor inputGradient();
  /// The gate's inputs from this micro-batch's heads (features scope): each
  /// task's loss before its weight, its processed tap gradient's norm,
  /// whether it fuses, the processed gradients (GFM, clip). fuseTaskGradients
  /// runs this itself when nothing did.
  struct GateInputs {
    std::vector<double> losses, norms;
    std::vector<bool> fusing;
    std::vector<GradList> processed;
  };
  GateInputs processTaskGradients();
  /// The step's α from every stage's gate inputs (the last stage computes
  /// it: the gate's weights, measured cosines on the processed tap
  /// gradients, the gate's update).
  std::vector<double> pipelineAlpha(const std::vector<GradList> &processed,
                                    const std::vector<double> &losses,
                                    const std::vector<double> &norms,
                                    const std::vector<bool> &fusing);
  /// A stage's α for the step, before micro-batch 0's fusion.
  void setAlpha(std::vector<double> alpha);
  /// The step's statistics so far (a pipeline stage adds what it gathers).
  StepStats &stepStats();
  /// The current micro-batch's value `v` (what a stage sends on).
  at::Tensor value(ValueId v);

  /// Offloaded region boundaries prefetched ahead by the backward's hooks.
  void setPrefetchAhead(int64_t n) { prefetchAhead_ = n; }

  /// The backbone forward alone (no step): the tap activations (index = tap
  /// layer; undefined where no head reads it).
  std::vector<at::Tensor> forwardBackbone(const at::Tensor &tokens,
                                          const Schedule &schedule);

  Model &model() { return *model_; }
  const TrainConfig &config() const { return train_; }
  /// The next steps' micro-batches per step (the dynamic batch schedule,
  /// D15); between steps only.
  void setMicroBatches(int64_t n);
  Offloader &offloader() { return *offloader_; }
  Gate &gate() { return *gate_; }
  torch::optim::AdamW &optimizer() { return *optimizer_; }
  /// ZeRO stages 1–2 (TrainConfig::zeroStage) and the optimizer offload:
  /// this rank's run of AdamW's state (on the host when offloaded) replaces
  /// the optimizer's; `comm` may be null (one process).
  void shardOptimizer(Communicator *comm);
  /// The sharded optimizer (nullptr without ZeRO).
  ZeroOptimizer *zero() { return zero_.get(); }
  /// ZeRO 3: every parameter whole while it lives, to read (an export, a
  /// prediction, a dump; collective: every rank makes one). Nothing without
  /// ZeRO 3.
  class WholeParameters {
  public:
    /// `masters`: 16-bit weights hold their fp32 masters for the time too
    /// (what writes values out needs them; a forward under autocast casts
    /// either to the same bf16, so it does not).
    explicit WholeParameters(ZeroOptimizer *zero, bool masters = true);
    ~WholeParameters();
    WholeParameters(const WholeParameters &) = delete;
    WholeParameters &operator=(const WholeParameters &) = delete;

  private:
    ZeroOptimizer *zero_;
  };
  /// SAPS's sparse update of the backbone (nullptr without it): its state
  /// replaces the backbone's AdamW state and dense gradients.
  SparseUpdate *sparseUpdate() { return saps_.get(); }
  /// EWC's state (nullptr without it).
  ElasticConsolidation *consolidation() { return ewc_.get(); }
  /// EWC at a phase's end: the gradients of `batch` (the ending phase's
  /// tasks' labels) join the Fisher estimate — no update, no gate learning;
  /// then consolidate() makes F and θ* the penalty's.
  void addFisherSample(const Batch &batch, const Schedule &schedule);
  void consolidate();
  /// EWC's conflict detector (D14): the cosines between `tasks`' gradients
  /// (each task's loss alone on `batch`'s first micro-batch, eval mode) on
  /// the parameters of the topmost backbone layer every one of them reads
  /// through — the layer the DGFG gate's cosine matrix uses. Row and column
  /// i are tasks[i]; a task without labels in the batch gets NaN. Empty
  /// when that layer is frozen (nothing shared trains) or the tasks are
  /// fewer than two. No gradient, statistic or step count changes.
  /// `params`: measured on these parameters instead of the layer's (any
  /// trainable ones every task's loss reaches).
  std::vector<std::vector<double>> taskSimilarity(
      const Batch &batch, const Schedule &schedule,
      const std::vector<int64_t> &tasks, int64_t *layer = nullptr,
      const std::vector<at::Tensor> *params = nullptr);
  /// npd(regroup) (D13/D14): each adapter group's members' gradients on
  /// their shared adapter (taskSimilarity on `batch`; NaN between tasks of
  /// different groups and where a task has no labels), then the groups split
  /// where those fall below the plan's share (AdapterConfig::
  /// regroupedOwners; splitAdapters). Returns the matrix, over every head.
  std::vector<std::vector<double>> regroupAdapters(const Batch &batch,
                                                   const Schedule &schedule);
  /// The adapter groups split to `owner` (Model::splitAdapters): each copy
  /// joins its task's optimizer group with a copy of the AdamW state of the
  /// adapter it copies (step, moments), so the split changes no function
  /// and no update. A checkpoint's resume makes its recorded split this way.
  void splitAdapters(const std::vector<int64_t> &owner);
  int64_t stepsTaken() const { return step_; }

  /// Called by endStep(applyUpdate = true) once every parameter's .grad is
  /// final (fused, unscaled) and before the optimizer step: the data-parallel
  /// gradient exchange plugs in here and records its bytes in the stats.
  std::function<void(StepStats &)> beforeUpdate;
  /// With more than one data-parallel rank: averages the tensors in place
  /// over the ranks. EWC's Fisher (addFisherSample) and the conflict
  /// measurement (taskSimilarity) then see every rank's rows, as one
  /// process sees the whole batch, and every rank holds the same estimate.
  std::function<void(std::vector<at::Tensor> &)> averageOverRanks;

  /// Restores the counters a checkpoint saves (steps taken, fp16 loss scale).
  void restoreCounters(int64_t steps, double lossScale, int64_t goodSteps) {
    step_ = steps;
    lossScale_ = lossScale;
    goodSteps_ = goodSteps;
  }
  double lossScale() const { return lossScale_; }
  /// The cosine matrix the gate reads between measurements (checkpointed).
  std::vector<std::vector<double>> &lastCosines() { return lastCosines_; }
  int64_t goodSteps() const { return goodSteps_; }

  /// The last step's processed per-task gradients ĝ_t (features: each task's
  /// tap gradient; params: its top-k layer gradients), α, and for params the
  /// fused gradient Σ α_t ĝ_t written to those parameters. For tests and
  /// debugging; kept only when `keepDebug`.
  bool keepDebug = false;
  std::vector<GradList> lastProcessed;
  std::vector<double> lastAlpha;
  GradList lastFused;
  std::vector<at::Tensor> lastParamsScopeParams;

private:
  /// D13: after the micro-batch's last head backward, the gate-separation
  /// loss over the present tasks' gates, back-propagated to the gates.
  void separateGates();
  struct MicroState;
  struct StepState;
  /// The step in progress; with `forwardOnly` false, after ZeRO 1–2's
  /// updated values have all arrived.
  StepState &state(const char *phase, bool needMicroBatch,
                   bool forwardOnly = false);
  void buildOptimizer();
  /// Whether head t runs in this process (every head but on a pipeline
  /// stage).
  bool runsHead(int64_t t) const { return local_.empty() || local_[t]; }
  std::vector<double> meanTaskLosses(const std::vector<int64_t> &order);
  /// A pipeline stage's heads (empty: every head, no pipeline).
  std::vector<bool> local_;
  /// The backbone's forward as `s` says; `afterChunk(last)` runs after each
  /// unit or checkpoint region, `last` its final unit.
  void runBackbone(const Schedule &s,
                   const std::function<void(int64_t)> &afterChunk = {});
  StepStats run(const Batch &batch, const Schedule &s, bool applyUpdate);
  void validate(const Schedule &s) const;
  void finalizeGradients();
  std::vector<double> computeAlpha(const std::vector<GradList> &processed,
                                   const std::vector<GradList> &probe,
                                   const std::vector<double> &losses,
                                   const std::vector<double> &norms,
                                   const std::vector<bool> &present,
                                   StepStats &stats);

  std::unique_ptr<Model> model_;
  TrainConfig train_;
  std::unique_ptr<Offloader> offloader_;
  std::unique_ptr<Gate> gate_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<SparseUpdate> saps_;
  std::unique_ptr<ElasticConsolidation> ewc_;
  std::unique_ptr<ZeroOptimizer> zero_;
  /// A Fisher pass: the gate neither learns nor measures.
  bool quiet_ = false;
  /// Some backbone parameter trains: a backbone frozen whole has no
  /// backward for a step program to call.
  bool backboneTrains_ = true;
  std::vector<std::vector<double>> lastCosines_;
  std::unique_ptr<StepState> state_;
  int64_t prefetchAhead_ = 2;
  /// The plan's tensor-grain blocks could not run so (said once).
  bool warnedPartial_ = false;
  /// True while a head's backward or the cosine probe's partial backwards
  /// run: the prefetch hooks armed for the backbone backward stay quiet, so
  /// an offloaded block at a tap is not brought back at the backward's
  /// start, and the probe brings back only what it unpacks.
  std::shared_ptr<bool> probing_ = std::make_shared<bool>(false);
  double lossScale_ = 1.0;
  int64_t goodSteps_ = 0;
  int64_t step_ = 0;
};

} // namespace mtprt

#endif // MTPRT_TORCH_TRAINER_H
