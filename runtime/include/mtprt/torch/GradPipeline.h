//===- GradPipeline.h - GFM, per-task clip, DGFG gate, fusion ---*- C++ -*-===//
//
// The per-task gradient pipeline of docs/techniques.md B5–B7 and docs/contracts.md. A task's
// gradient is a list of tensors (its tap-activation gradient at scope
// `features`, its gradients of the top k shared layers' parameters at scope
// `params`). Each present task's gradient is GFM-filtered and clipped to
// `clipNorm` (ĝ_t); the gate maps per-task signals to α (a softmax over the
// present tasks); the fused gradient is Σ_t α_t ĝ_t.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_GRADPIPELINE_H
#define MTPRT_TORCH_GRADPIPELINE_H

#include <ATen/ATen.h>

#include <memory>
#include <vector>

namespace torch::serialize {
class OutputArchive;
class InputArchive;
} // namespace torch::serialize

namespace mtprt {

using GradList = std::vector<at::Tensor>;

/// GFM of one tensor along its last (channel) dimension, n = g.size(-1):
/// irfft(mask(rfft(g, dim=-1)), n), the mask keeping the first
/// ceil(keep * (n/2 + 1)) bins. keep >= 1 returns g unchanged. fp32 math.
at::Tensor gfm(const at::Tensor &g, double keep);

/// The L2 norm over every tensor of a list.
double globalNorm(const GradList &g);

/// In place on each present task's list: GFM (keep < 1), then scale so the
/// task's norm is at most clipNorm (clipNorm <= 0: no clip). Returns each
/// task's norm after GFM and before the clip (0 for absent tasks).
std::vector<double> processTaskGrads(std::vector<GradList> &grads,
                                     const std::vector<bool> &present,
                                     double keep, double clipNorm);

/// Σ_t alpha[t] * grads[t] (absent tasks, alpha 0, are skipped), through the
/// mask–clip–weight–accumulate kernels (CPU twin or CUDA). Returns one
/// tensor per list entry; undefined entries count as zeros.
GradList fuse(const std::vector<GradList> &grads,
              const std::vector<double> &alpha);

/// The T × T Gram matrix of the flattened task gradients (fp64), and the
/// cosine matrix derived from it (0 for a zero gradient; 1 on the diagonal of
/// a nonzero one).
at::Tensor gramMatrix(const std::vector<GradList> &grads);
std::vector<std::vector<double>> cosineMatrix(const at::Tensor &gram);

/// The DGFG gate (docs/contracts.md). Per present task t it reads four signals —
/// log(1 + loss_t), log(norm_t + 1e-12), the mean and the minimum cosine of
/// ĝ_t with the other present tasks — through a shared MLP 4 → H → 1 (tanh;
/// H = `hidden`, TrainConfig.gateHidden, the plan's dgfg width) to a logit;
/// α = softmax over the present tasks (absent: 0). 6H + 1 parameters (193 at
/// the default H = 32) whatever the task count.
///
/// Online objective (one Adam step per optimizer step, on the step's Gram
/// matrix G of ĝ, detached), leave-one-out agreement: maximize
///     J(α) = Σ_t α_t · cos(ĝ_t, d_{-t}(α)) + τ · H(α),
///     d_{-t}(α) = Σ_{s≠t} α_s ĝ_s,
/// everything computed from G (ĝ_t·d_{-t} = (Gα)_t − α_t G_tt, and so on),
/// H the entropy, τ = TrainConfig.gateEntropy. A task is rewarded for
/// agreeing with what the *other* tasks fuse to, so a task whose gradient
/// opposes the rest loses weight. (Measuring agreement with the full d = Σ
/// α_s ĝ_s instead would count each task's agreement with itself and always
/// favour collapsing α onto one task.) The entropy term keeps α spread over
/// the tasks that agree.
class Gate {
public:
  Gate(uint64_t seed, double lr, double entropyWeight, int64_t hidden = 32);
  ~Gate();
  /// α for the given signals (no grad).
  std::vector<double> alpha(const std::vector<double> &losses,
                            const std::vector<double> &norms,
                            const std::vector<std::vector<double>> &cosines,
                            const std::vector<bool> &present) const;
  /// One objective step on these signals and Gram matrix; returns J before it.
  double update(const std::vector<double> &losses,
                const std::vector<double> &norms,
                const std::vector<std::vector<double>> &cosines,
                const std::vector<bool> &present, const at::Tensor &gram);
  int64_t numParameters() const;

  /// Checkpointing: the MLP's parameters and its Adam state. load throws
  /// std::runtime_error when the archive's gate has another width.
  void save(torch::serialize::OutputArchive &archive) const;
  void load(torch::serialize::InputArchive &archive);
  /// docs/techniques.md B8 recalibration: back to the initial (seeded) weights with a
  /// fresh Adam state, so α restarts near uniform and re-learns from the
  /// gradient conflict as it is now rather than as it was when it collapsed.
  void reset();

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace mtprt

#endif // MTPRT_TORCH_GRADPIPELINE_H
