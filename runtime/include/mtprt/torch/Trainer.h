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

#include <memory>

namespace torch::optim {
class AdamW;
}

namespace mtprt {

/// The learning rate of `c` at optimizer step `step` (0-based).
double scheduledLr(const LrConfig &c, int64_t step);

class TrainerCore {
public:
  TrainerCore(ModelConfig model, std::vector<HeadConfig> heads, TrainConfig train,
              OffloadOptions offload = {});
  ~TrainerCore();

  /// Forward, per-task backward and fusion: leaves every parameter's .grad
  /// set (unscaled) without updating. Fills the stats it can.
  StepStats computeGradients(const Batch &batch, const Schedule &schedule);
  /// computeGradients, then the optimizer step (skipped on fp16 overflow).
  StepStats step(const Batch &batch, const Schedule &schedule);

  /// The backbone forward: returns the tap activations (index = tap layer;
  /// undefined where no head reads it).
  std::vector<at::Tensor> forwardBackbone(const at::Tensor &tokens,
                                          const Schedule &schedule);

  Model &model() { return *model_; }
  const TrainConfig &config() const { return train_; }
  Offloader &offloader() { return *offloader_; }
  Gate &gate() { return *gate_; }
  torch::optim::AdamW &optimizer() { return *optimizer_; }
  int64_t stepsTaken() const { return step_; }

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
  void validate(const Schedule &s) const;
  std::vector<double> computeAlpha(const std::vector<GradList> &processed,
                                   const std::vector<GradList> &probe,
                                   const std::vector<double> &losses,
                                   const std::vector<double> &norms,
                                   const std::vector<bool> &present, StepStats &stats);

  std::unique_ptr<Model> model_;
  TrainConfig train_;
  std::unique_ptr<Offloader> offloader_;
  std::unique_ptr<Gate> gate_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::vector<std::vector<double>> lastCosines_;
  double lossScale_ = 1.0;
  int64_t goodSteps_ = 0;
  int64_t step_ = 0;
};

} // namespace mtprt

#endif // MTPRT_TORCH_TRAINER_H
