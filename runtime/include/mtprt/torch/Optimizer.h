//===- Optimizer.h - AdamW's update in one fused call per group -*- C++ -*-===//
//
// LibTorch's C++ AdamW updates parameter by parameter, about nine ATen calls
// each (kernel launches on a GPU): ~3 ms of a 90 ms CPU step on bench/'s
// model M, and on a GPU launch-bound. ATen's _fused_adamw_ updates a whole
// parameter group at once with the same decoupled weight decay, bias
// corrections and epsilon (torch.optim.AdamW(fused=True)). The state stays
// LibTorch's (AdamWParamState: step, exp_avg, exp_avg_sq), so checkpoints
// are unchanged.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_OPTIMIZER_H
#define MTPRT_TORCH_OPTIMIZER_H

#include <torch/optim/adamw.h>

namespace mtprt {

/// One AdamW step of `optimizer` over every parameter with a gradient: one
/// fused call per group, device and dtype (LibTorch's own step where a group
/// uses amsgrad or a gradient is sparse or of another dtype).
void adamwStep(torch::optim::AdamW &optimizer);

/// `p`'s AdamW state, made as LibTorch's first step makes it (step 0, zero
/// moments) where it has none yet.
torch::optim::AdamWParamState &adamwState(torch::optim::AdamW &optimizer,
                                          const at::Tensor &p);

} // namespace mtprt

#endif // MTPRT_TORCH_OPTIMIZER_H
