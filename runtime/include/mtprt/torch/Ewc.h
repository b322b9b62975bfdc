//===- Ewc.h - elastic weight consolidation (D14) ---------------*- C++ -*-===//
//
// The Fisher diagonal F and the remembered weights θ* of the trainable
// backbone (mtprt/Ewc.h says what and when), allocated up front as AdamW's
// moments are; the penalty λ·Σ F·(θ − θ*)² and its gradient.
//
// Internal API (LibTorch).
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_EWC_H
#define MTPRT_TORCH_EWC_H

#include "mtprt/Ewc.h"

#include <ATen/core/Tensor.h>

#include <vector>

namespace mtprt {

class ElasticConsolidation {
public:
  explicit ElasticConsolidation(std::vector<at::Tensor> params,
                                EwcConfig config);

  /// One batch's gradients of the ending phase (the parameters' .grad; an
  /// undefined one counts as zero): F += g² / fisherBatches (a phase's end
  /// gives fisherBatches of them; F is not read in between).
  void addFisherSample();
  /// Ends the estimate: θ* = the weights now; the penalty applies from here
  /// on.
  void consolidate();
  /// Adds 2λ·F·(θ − θ*) to every parameter's .grad and returns the penalty
  /// λ·Σ F·(θ − θ*)² at these weights (over the parameters with a gradient:
  /// the others have not moved since the phase began); 0, and nothing
  /// added, before the first consolidation.
  double addPenaltyGradient();

  bool active() const { return consolidations_ > 0; }
  int64_t consolidations() const { return consolidations_; }
  const std::vector<at::Tensor> &params() const { return params_; }
  const std::vector<at::Tensor> &fisher() const { return fisher_; }
  const std::vector<at::Tensor> &anchor() const { return anchor_; }

  /// F then θ* for each parameter, and the consolidation count, for
  /// checkpoints; loadState checks everything before changing anything
  /// (std::runtime_error naming what is wrong).
  std::vector<at::Tensor> state() const;
  void loadState(const std::vector<at::Tensor> &state);

private:
  std::vector<at::Tensor> params_, fisher_, anchor_;
  EwcConfig config_;
  int64_t samples_ = 0, consolidations_ = 0;
};

} // namespace mtprt

#endif // MTPRT_TORCH_EWC_H
