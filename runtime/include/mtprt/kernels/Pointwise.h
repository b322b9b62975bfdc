//===- Pointwise.h - the backbone's fused pointwise kernels -----*- C++ -*-===//
//
// fp32 LayerNorm and GELU kernels for the fused pointwise path
// (docs/runtime.md §2): the backward passes recompute what the forward did
// not keep — the norm's output from its input and statistics, the GELU's
// output and derivative from its input — so a linear that follows a norm or
// a GELU keeps nothing of its own. Rows are contiguous, `width` wide.
//
// The CPU kernels are ATen's at::vec, compiled for AVX2+FMA and for the
// generic fallback and picked at run time; `mtpc build` specializes the norm
// kernels with the spec's hidden size (mtprt/kernels/Specialized.h).
// Torch-free interface: included by emitted programs and .cu files.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_KERNELS_POINTWISE_H
#define MTPRT_KERNELS_POINTWISE_H

#include <cstdint>

namespace mtprt::kernels {

/// The CPU kernels of one instruction set (or one specialized width).
struct PointwiseCpu {
  /// y = (x - mean) * rstd * w + b, per row; mean and rstd out ([rows]).
  void (*normForward)(const float *x, const float *w, const float *b,
                      float *y, float *mean, float *rstd, int64_t rows,
                      int64_t width, float eps) = nullptr;
  /// y from x and the saved statistics (the forward's y, bit for bit).
  void (*normRecompute)(const float *x, const float *mean, const float *rstd,
                        const float *w, const float *b, float *y,
                        int64_t rows, int64_t width) = nullptr;
  /// dx from dy; dw and db accumulated (+=) over these rows.
  void (*normBackward)(const float *x, const float *mean, const float *rstd,
                       const float *w, const float *dy, float *dx, float *dw,
                       float *db, int64_t rows, int64_t width) = nullptr;
  /// g = u * Φ(u) (exact, erf).
  void (*geluForward)(const float *u, float *g, int64_t n) = nullptr;
  /// du = dg * GELU'(u); du may alias dg.
  void (*geluBackward)(const float *u, const float *dg, float *du,
                       int64_t n) = nullptr;
};

/// The generic-width kernels for this CPU: AVX-512 (F, BW, VL, DQ) or
/// AVX2+FMA where it has them, else the portable build.
const PointwiseCpu &pointwiseCpu();
/// The name of the instruction set pointwiseCpu() uses ("avx512", "avx2",
/// "default").
const char *pointwiseCpuIsa();
/// Whether the AVX2+FMA kernels may run on this CPU.
bool cpuHasAvx2Fma();
/// Whether the AVX-512 kernels may run on this CPU.
bool cpuHasAvx512();
/// The kernels of instruction set `isa` ("avx512", "avx2", "default"), or
/// null where this build or this CPU has none (tests check each against
/// ATen).
const PointwiseCpu *pointwiseCpuFor(const char *isa);

/// The CUDA twins (on `stream`); each returns a cudaError_t (0 = success).
/// normBackward's dw and db are accumulated (+=) with atomics.
int normForwardCuda(const float *x, const float *w, const float *b, float *y,
                    float *mean, float *rstd, int64_t rows, int64_t width,
                    float eps, void *stream);
int normRecomputeCuda(const float *x, const float *mean, const float *rstd,
                      const float *w, const float *b, float *y, int64_t rows,
                      int64_t width, void *stream);
int normBackwardCuda(const float *x, const float *mean, const float *rstd,
                     const float *w, const float *dy, float *dx, float *dw,
                     float *db, int64_t rows, int64_t width, void *stream);
int geluForwardCuda(const float *u, float *g, int64_t n, void *stream);
int geluBackwardCuda(const float *u, const float *dg, float *du, int64_t n,
                     void *stream);

} // namespace mtprt::kernels

#endif // MTPRT_KERNELS_POINTWISE_H
