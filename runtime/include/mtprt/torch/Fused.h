//===- Fused.h - linear layers that keep nothing of their own ---*- C++ -*-===//
//
// The fused pointwise path (docs/runtime.md §2): a linear after a norm keeps
// the norm's input and statistics, not its output, and a linear after a
// GELU keeps the GELU's input, not its output; their backward passes
// recompute those in the pointwise kernels of mtprt/kernels/Pointwise.h.
// Gradients equal the ATen composition's (to fp32 rounding).
//
// fp32 without autocast only; elsewhere each is the plain composition.
// Internal API: includes LibTorch.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_FUSED_H
#define MTPRT_TORCH_FUSED_H

#include <ATen/ATen.h>

#include <vector>

namespace mtprt::fused {

/// linear(layer_norm(x, w_n, b_n, eps), w, b), keeping x, mean and rstd.
at::Tensor normLinear(const at::Tensor &x, const at::Tensor &normWeight,
                      const at::Tensor &normBias, const at::Tensor &weight,
                      const at::Tensor &bias, double eps);
/// linear(gelu(u), w, b), keeping u.
at::Tensor geluLinear(const at::Tensor &u, const at::Tensor &weight,
                      const at::Tensor &bias);
/// A fused projection's [B, S, n·H] output as n heads-first [B, a, S, H/a]
/// views (what the fused attention kernel takes), whose backward writes the
/// n gradients straight into one [B, S, n·H] buffer. Narrow and transpose
/// views would have autograd zero-fill a [B, S, n·H] buffer per view, copy
/// each gradient into it, and add them: n fills, n copies, n − 1 adds, two
/// such buffers alive. Any dtype, any device.
std::vector<at::Tensor> splitHeads(const at::Tensor &x, int64_t n,
                                   int64_t heads);

/// Whether the fused functions take `x` (fp32, no autocast on its device);
/// elsewhere they run the composition.
bool serves(const at::Tensor &x);

/// The kernels as plain tensor ops, for tests against ATen: the norm's
/// output, mean and rstd; its recompute; (dx, dw, db); GELU and its
/// backward. CPU tensors use the CPU kernels, CUDA ones the CUDA twins
/// where this runtime was built with them.
std::tuple<at::Tensor, at::Tensor, at::Tensor>
normForward(const at::Tensor &x, const at::Tensor &w, const at::Tensor &b,
            double eps);
at::Tensor normRecompute(const at::Tensor &x, const at::Tensor &mean,
                         const at::Tensor &rstd, const at::Tensor &w,
                         const at::Tensor &b);
std::tuple<at::Tensor, at::Tensor, at::Tensor>
normBackward(const at::Tensor &dy, const at::Tensor &x, const at::Tensor &mean,
             const at::Tensor &rstd, const at::Tensor &w);
at::Tensor geluForward(const at::Tensor &u);
at::Tensor geluBackward(const at::Tensor &dg, const at::Tensor &u);
/// Whether CUDA tensors run the CUDA twins (else ATen's kernels).
bool cudaTwins();

} // namespace mtprt::fused

#endif // MTPRT_TORCH_FUSED_H
