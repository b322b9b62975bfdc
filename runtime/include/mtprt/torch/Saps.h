//===- Saps.h - SAPS: sparse updates of the backbone (D12) -----*- C++ -*-===//
//
// Keeps, per trainable backbone tensor, the selected entries' indices,
// gradient, AdamW moments and step counts (mtprt/Saps.h says which and why).
// Each tensor's dense gradient is folded into its compact one by a
// post-accumulate-grad hook as autograd makes it, then dropped: between and
// during steps the backbone holds no dense gradient, and no dense optimizer
// state. The update is AdamW's (decoupled weight decay, bias correction by
// the entry's own step count) on the selected entries only.
//
// Internal API (LibTorch).
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_SAPS_H
#define MTPRT_TORCH_SAPS_H

#include "mtprt/Saps.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mtprt {

/// AdamW's hyper-parameters for one update.
struct SparseAdamW {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8,
         weightDecay = 0.0;
};

class SparseUpdate {
public:
  /// Manages `params` (each must require grad). `hooks`: fold gradients as
  /// autograd accumulates them (false: only through add(), for tests).
  SparseUpdate(std::vector<at::Tensor> params, SapsConfig config,
               bool hooks = true);
  ~SparseUpdate();
  SparseUpdate(const SparseUpdate &) = delete;
  SparseUpdate &operator=(const SparseUpdate &) = delete;

  /// Before a step's first backward: clears the compact gradients; at a
  /// re-rank step, the next gradient each tensor receives ranks it anew.
  /// `lossScale`: what the gradients to come are multiplied by (fp16),
  /// divided out of the importance. `rankable` false (data-parallel ranks
  /// whose batches do not give every tensor a gradient alike): no ranking
  /// this step — the selections stay, and a tensor never ranked folds
  /// nothing.
  void beginStep(int64_t step, double lossScale = 1.0, bool rankable = true);
  /// Whether a gradient at `step` would rank a tensor (a re-rank step, or
  /// one never ranked).
  bool wouldRank(int64_t step) const;
  /// Data parallelism: averages a dense gradient over the ranks in place,
  /// before a ranking reads it (every rank then selects the same entries).
  /// Unset: one process.
  std::function<void(const at::Tensor &)> averageDense;
  /// Averages the compact gradients (and which tensors got one) over the
  /// ranks with `average` (in place): the exchange of a sparse step, 4 B
  /// per selected entry. Returns the bytes handed to it.
  int64_t averageGradients(
      const std::function<void(std::vector<at::Tensor> &)> &average);
  /// Folds `grad` (a dense gradient of params()[i]) into i's compact one,
  /// re-ranking i first when the step asks.
  void add(size_t i, const at::Tensor &grad);
  /// Divides the compact gradients by `scale` (fp16's unscale).
  void unscale(double scale);
  /// Whether every compact gradient is finite.
  bool finite() const;
  /// AdamW on the selected entries (none before a tensor's first ranking).
  void step(const SparseAdamW &o);

  /// The per-tensor state in a fixed order (index, exp_avg, exp_avg_sq,
  /// steps for each tensor), for checkpoints.
  std::vector<at::Tensor> state() const;
  /// Restores what state() gave; throws std::runtime_error naming the
  /// tensor and what is wrong (counts, ranges, order) before changing
  /// anything.
  void loadState(const std::vector<at::Tensor> &state);

  const std::vector<at::Tensor> &params() const { return params_; }
  const SapsConfig &config() const { return config_; }
  /// Tensor i's selection (sorted flat indices; undefined before ranking),
  /// and its compact gradient.
  const at::Tensor &selection(size_t i) const { return entries_[i].index; }
  const at::Tensor &gradient(size_t i) const { return entries_[i].grad; }
  /// Of the last re-ranking, the share of selected entries that were not
  /// selected before (1 at the first).
  double lastTurnover() const { return turnover_; }

private:
  struct Entry {
    at::Tensor index, grad, avg, sq, steps;
    bool rerank = false; ///< rank at the next gradient
    bool ranked = false; ///< ranked at least once (index is a selection)
    bool got = false;    ///< received a gradient this step
    bool skip = false;   ///< never ranked and not rankable: fold nothing
  };
  void rerank(size_t i, const at::Tensor &grad);

  std::vector<at::Tensor> params_;
  SapsConfig config_;
  std::vector<Entry> entries_;
  double lossScale_ = 1.0;
  int64_t changed_ = 0, ranked_ = 0;
  double turnover_ = 0.0;
  /// Cleared by the destructor, so a hook outliving this does nothing.
  std::shared_ptr<SparseUpdate *> self_;
};

} // namespace mtprt

#endif // MTPRT_TORCH_SAPS_H
