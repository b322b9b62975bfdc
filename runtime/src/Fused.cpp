//===- Fused.cpp - linear layers that keep nothing of their own -----------===//
//
// Two autograd functions over the pointwise kernels. Each saves its input
// as given (a view keeps its base alive, as the composition's would) and
// makes contiguous copies only transiently.
//
//===----------------------------------------------------------------------===//

#include "mtprt/torch/Fused.h"

#include "mtprt/kernels/Pointwise.h"
#include "mtprt/kernels/Specialized.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#if defined(MTPRT_TORCH_CUDA) && defined(MTPRT_CUDA_KERNELS_BUILT)
#include <ATen/cuda/CUDAContext.h>
#define MTPRT_FUSED_CUDA 1
#endif

#include <stdexcept>
#include <string>

namespace mtprt::fused {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// Rows per parallel chunk: enough work to be worth a thread.
int64_t grainRows(int64_t width) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, width));
}
constexpr int64_t kGrainElements = 16384;

/// The CPU table for rows of `width`: the program's specialization where it
/// registered one for this width, else the generic kernels of this ISA.
const kernels::PointwiseCpu &cpuTable(int64_t width) {
  const kernels::Specialized &sk = kernels::specialized();
  if (sk.normWidth == width && sk.pointwise.normForward) {
    kernels::countSpecializedLaunch();
    return sk.pointwise;
  }
  return kernels::pointwiseCpu();
}

#ifdef MTPRT_FUSED_CUDA
void check(int err, const char *what) {
  if (err)
    throw std::runtime_error(std::string("mtprt: CUDA kernel ") + what +
                             " failed: error " + std::to_string(err));
}
void *stream() { return at::cuda::getCurrentCUDAStream().stream(); }
#endif

/// mean / rstd shaped as at::native_layer_norm returns them: [..., 1].
std::vector<int64_t> statShape(const at::Tensor &x) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().end());
  s.back() = 1;
  return s;
}

at::Tensor flatRows(const at::Tensor &t) {
  return t.reshape({-1, t.size(-1)});
}

} // namespace

bool cudaTwins() {
#ifdef MTPRT_FUSED_CUDA
  return true;
#else
  return false;
#endif
}

bool serves(const at::Tensor &x) {
  return x.scalar_type() == at::kFloat &&
         !at::autocast::is_autocast_enabled(x.device().type());
}

//===----------------------------------------------------------------------===//
// The kernels as tensor ops
//===----------------------------------------------------------------------===//

std::tuple<at::Tensor, at::Tensor, at::Tensor>
normForward(const at::Tensor &x, const at::Tensor &w, const at::Tensor &b,
            double eps) {
  const int64_t width = x.size(-1);
  at::Tensor xc = x.contiguous();
  if (x.is_cuda() && !cudaTwins())
    return at::native_layer_norm(xc, {width}, w, b, eps);
  at::Tensor y = at::empty_like(xc);
  at::Tensor mean = at::empty(statShape(x), xc.options());
  at::Tensor rstd = at::empty(statShape(x), xc.options());
  const int64_t rows = xc.numel() / width;
  const float *px = xc.const_data_ptr<float>();
  const float *pw = w.const_data_ptr<float>(), *pb = b.const_data_ptr<float>();
  float *py = y.data_ptr<float>(), *pm = mean.data_ptr<float>(),
        *pr = rstd.data_ptr<float>();
#ifdef MTPRT_FUSED_CUDA
  if (x.is_cuda()) {
    check(kernels::normForwardCuda(px, pw, pb, py, pm, pr, rows, width,
                                   static_cast<float>(eps), stream()),
          "normForward");
    return {y, mean, rstd};
  }
#endif
  const kernels::PointwiseCpu &k = cpuTable(width);
  at::parallel_for(0, rows, grainRows(width), [&](int64_t lo, int64_t hi) {
    k.normForward(px + lo * width, pw, pb, py + lo * width, pm + lo, pr + lo,
                  hi - lo, width, static_cast<float>(eps));
  });
  return {y, mean, rstd};
}

at::Tensor normRecompute(const at::Tensor &x, const at::Tensor &mean,
                         const at::Tensor &rstd, const at::Tensor &w,
                         const at::Tensor &b) {
  const int64_t width = x.size(-1);
  at::Tensor xc = x.contiguous();
  if (x.is_cuda() && !cudaTwins())
    return at::addcmul(b, (xc - mean) * rstd, w);
  at::Tensor y = at::empty_like(xc);
  const int64_t rows = xc.numel() / width;
  const float *px = xc.const_data_ptr<float>(),
              *pm = mean.const_data_ptr<float>(),
              *pr = rstd.const_data_ptr<float>();
  const float *pw = w.const_data_ptr<float>(), *pb = b.const_data_ptr<float>();
  float *py = y.data_ptr<float>();
#ifdef MTPRT_FUSED_CUDA
  if (x.is_cuda()) {
    check(kernels::normRecomputeCuda(px, pm, pr, pw, pb, py, rows, width,
                                     stream()),
          "normRecompute");
    return y;
  }
#endif
  const kernels::PointwiseCpu &k = cpuTable(width);
  at::parallel_for(0, rows, grainRows(width), [&](int64_t lo, int64_t hi) {
    k.normRecompute(px + lo * width, pm + lo, pr + lo, pw, pb,
                    py + lo * width, hi - lo, width);
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor>
normBackward(const at::Tensor &dy, const at::Tensor &x, const at::Tensor &mean,
             const at::Tensor &rstd, const at::Tensor &w) {
  const int64_t width = x.size(-1);
  at::Tensor xc = x.contiguous(), dyc = dy.contiguous();
  if (x.is_cuda() && !cudaTwins())
    return at::native_layer_norm_backward(dyc, xc, {width}, mean, rstd, w,
                                          /*bias=*/{}, {true, true, true});
  at::Tensor dx = at::empty_like(xc);
  const int64_t rows = xc.numel() / width;
  const float *px = xc.const_data_ptr<float>(),
              *pm = mean.const_data_ptr<float>(),
              *pr = rstd.const_data_ptr<float>(), *pw = w.const_data_ptr<float>(),
              *pdy = dyc.const_data_ptr<float>();
  float *pdx = dx.data_ptr<float>();
#ifdef MTPRT_FUSED_CUDA
  if (x.is_cuda()) {
    at::Tensor dw = at::zeros_like(w), db = at::zeros_like(w);
    check(kernels::normBackwardCuda(px, pm, pr, pw, pdy, pdx,
                                    dw.data_ptr<float>(), db.data_ptr<float>(),
                                    rows, width, stream()),
          "normBackward");
    return {dx, dw, db};
  }
#endif
  // dw and db: one partial per thread (as ATen's CPU kernel), summed after.
  const int64_t threads = at::get_num_threads();
  at::Tensor partial = at::zeros({threads, 2, width}, w.options());
  float *pp = partial.data_ptr<float>();
  const kernels::PointwiseCpu &k = cpuTable(width);
  at::parallel_for(0, rows, grainRows(width), [&](int64_t lo, int64_t hi) {
    float *mine = pp + at::get_thread_num() * 2 * width;
    k.normBackward(px + lo * width, pm + lo, pr + lo, pw, pdy + lo * width,
                   pdx + lo * width, mine, mine + width, hi - lo, width);
  });
  at::Tensor sums = threads == 1 ? partial[0] : partial.sum(0);
  return {dx, sums[0], sums[1]};
}

at::Tensor geluForward(const at::Tensor &u) {
  at::Tensor uc = u.contiguous();
  if (u.is_cuda() && !cudaTwins())
    return at::gelu(uc);
  at::Tensor g = at::empty_like(uc);
  const float *pu = uc.const_data_ptr<float>();
  float *pg = g.data_ptr<float>();
#ifdef MTPRT_FUSED_CUDA
  if (u.is_cuda()) {
    check(kernels::geluForwardCuda(pu, pg, uc.numel(), stream()), "gelu");
    return g;
  }
#endif
  const kernels::PointwiseCpu &k = kernels::pointwiseCpu();
  at::parallel_for(0, uc.numel(), kGrainElements, [&](int64_t lo, int64_t hi) {
    k.geluForward(pu + lo, pg + lo, hi - lo);
  });
  return g;
}

/// du = dg * GELU'(u), written into dg when it is a contiguous temporary.
at::Tensor geluBackwardInto(at::Tensor dg, const at::Tensor &u) {
  at::Tensor uc = u.contiguous();
  if (u.is_cuda() && !cudaTwins())
    return at::gelu_backward(dg, uc);
  const float *pu = uc.const_data_ptr<float>();
  float *pd = dg.data_ptr<float>();
#ifdef MTPRT_FUSED_CUDA
  if (u.is_cuda()) {
    check(kernels::geluBackwardCuda(pu, pd, pd, uc.numel(), stream()),
          "geluBackward");
    return dg;
  }
#endif
  const kernels::PointwiseCpu &k = kernels::pointwiseCpu();
  at::parallel_for(0, uc.numel(), kGrainElements, [&](int64_t lo, int64_t hi) {
    k.geluBackward(pu + lo, pd + lo, pd + lo, hi - lo);
  });
  return dg;
}

at::Tensor geluBackward(const at::Tensor &dg, const at::Tensor &u) {
  return geluBackwardInto(dg.contiguous().clone(), u);
}

//===----------------------------------------------------------------------===//
// The autograd functions
//===----------------------------------------------------------------------===//

namespace {

struct NormLinearFn : torch::autograd::Function<NormLinearFn> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x,
                            const at::Tensor &nw, const at::Tensor &nb,
                            const at::Tensor &w, const at::Tensor &b,
                            double eps) {
    auto [y, mean, rstd] = normForward(x, nw, nb, eps);
    at::Tensor out = at::linear(y, w, b);
    ctx->save_for_backward({x, mean, rstd, nw, nb, w});
    return out;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    variable_list s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &mean = s[1], &rstd = s[2], &nw = s[3],
                     &nb = s[4], &w = s[5];
    at::Tensor g = flatRows(grads[0].contiguous());
    at::Tensor dy;
    at::Tensor dw, db;
    {
      at::Tensor y = flatRows(normRecompute(x, mean, rstd, nw, nb));
      if (ctx->needs_input_grad(3))
        dw = g.t().mm(y);
    }
    if (ctx->needs_input_grad(4))
      db = g.sum(0);
    dy = g.mm(w).view(x.sizes());
    g.reset();
    auto [dx, dnw, dnb] = normBackward(dy, x, mean, rstd, nw);
    return {dx.view(x.sizes()), dnw, dnb, dw, db, at::Tensor()};
  }
};

struct GeluLinearFn : torch::autograd::Function<GeluLinearFn> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &u,
                            const at::Tensor &w, const at::Tensor &b) {
    at::Tensor out = at::linear(geluForward(u), w, b);
    ctx->save_for_backward({u, w});
    return out;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    variable_list s = ctx->get_saved_variables();
    const at::Tensor &u = s[0], &w = s[1];
    at::Tensor g = flatRows(grads[0].contiguous());
    at::Tensor dw, db;
    if (ctx->needs_input_grad(1))
      dw = g.t().mm(flatRows(geluForward(u)));
    if (ctx->needs_input_grad(2))
      db = g.sum(0);
    at::Tensor du = geluBackwardInto(g.mm(w), u);
    return {du.view(u.sizes()), dw, db};
  }
};

struct SplitHeadsFn : torch::autograd::Function<SplitHeadsFn> {
  static variable_list forward(AutogradContext *ctx, const at::Tensor &x,
                               int64_t n, int64_t heads) {
    const int64_t width = x.size(-1) / n;
    ctx->saved_data["sizes"] = x.sizes().vec();
    ctx->saved_data["n"] = n;
    variable_list out;
    for (int64_t i = 0; i < n; ++i)
      out.push_back(x.narrow(-1, i * width, width)
                        .view({x.size(0), x.size(1), heads, width / heads})
                        .transpose(1, 2));
    return out;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    const int64_t n = ctx->saved_data["n"].toInt();
    const at::Tensor *any = nullptr;
    for (const at::Tensor &g : grads)
      if (g.defined() && !any)
        any = &g;
    if (!any)
      return {at::Tensor(), at::Tensor(), at::Tensor()};
    at::Tensor dx = at::empty(sizes, any->options());
    const int64_t width = sizes.back() / n;
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor &g = grads[i];
      at::Tensor slot = dx.narrow(-1, i * width, width);
      // [B, a, S, d] -> [B, S, a, d], copied into its columns.
      if (g.defined())
        slot.view({sizes[0], sizes[1], g.size(1), g.size(3)})
            .copy_(g.transpose(1, 2));
      else
        slot.zero_();
    }
    return {dx, at::Tensor(), at::Tensor()};
  }
};

} // namespace

std::vector<at::Tensor> splitHeads(const at::Tensor &x, int64_t n,
                                   int64_t heads) {
  if (x.dim() != 3 || n < 1 || x.size(-1) % (n * heads) != 0)
    throw std::invalid_argument(
        "mtprt: splitHeads: needs [B, S, n*H] with H a multiple of the heads");
  return SplitHeadsFn::apply(x, n, heads);
}

at::Tensor normLinear(const at::Tensor &x, const at::Tensor &normWeight,
                      const at::Tensor &normBias, const at::Tensor &weight,
                      const at::Tensor &bias, double eps) {
  if (!serves(x))
    return at::linear(
        at::layer_norm(x, {x.size(-1)}, normWeight, normBias, eps), weight,
        bias);
  return NormLinearFn::apply(x, normWeight, normBias, weight, bias, eps);
}

at::Tensor geluLinear(const at::Tensor &u, const at::Tensor &weight,
                      const at::Tensor &bias) {
  if (!serves(u))
    return at::linear(at::gelu(u), weight, bias);
  return GeluLinearFn::apply(u, weight, bias);
}

} // namespace mtprt::fused
