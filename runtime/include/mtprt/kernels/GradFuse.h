//===- GradFuse.h - the mask–clip–weight–accumulate pass --------*- C++ -*-===//
//
// The elementwise half of the fused per-task gradient op (docs/contracts.md#gfm and
// #gradient-scope): zero the high rfft bins of every row of a spectrum, then
// clip a task's gradient to a maximum norm, weight it by α_t and add it into
// the fused gradient. The transforms themselves are LibTorch's FFT.
//
// Torch-free on purpose: included by emitted programs and .cu files.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_KERNELS_GRADFUSE_H
#define MTPRT_KERNELS_GRADFUSE_H

#include <cmath>
#include <cstdint>

namespace mtprt::kernels {

/// The rfft bins of a length-n signal. Inline: the compiler's codegen
/// specializes the kernels with the same numbers.
inline constexpr int64_t gfmBins(int64_t n) { return n / 2 + 1; }
/// The number of rfft bins GFM keeps of a length-n signal:
/// ceil(keep * (n/2 + 1)), clamped to [0, n/2 + 1].
inline int64_t gfmKeptBins(int64_t n, double keep) {
  const int64_t bins = gfmBins(n);
  const auto kept =
      static_cast<int64_t>(std::ceil(keep * static_cast<double>(bins) - 1e-9));
  return kept < 0 ? 0 : kept > bins ? bins : kept;
}

/// The scale clip-and-weight applies to a gradient of norm `norm`:
/// alpha * min(1, maxNorm / norm), with maxNorm <= 0 meaning no clip.
float clipWeightScale(double norm, double maxNorm, double alpha);

/// CPU twin. spectrum: rows × bins interleaved complex floats (re, im);
/// bins >= keep are zeroed.
void maskBinsCpu(float *spectrum, int64_t rows, int64_t bins, int64_t keep);
/// Σ x² in double precision.
double sumSquaresCpu(const float *x, int64_t n);
/// acc[i] += scale * g[i].
void scaleAccumulateCpu(const float *g, int64_t n, float scale, float *acc);

#ifdef MTPRT_HAVE_CUDA_KERNELS
/// CUDA: device pointers, launched on `stream` (a cudaStream_t, or null).
/// Return the cudaError_t of the launch as an int.
int maskBinsCuda(float *spectrum, int64_t rows, int64_t bins, int64_t keep,
                 void *stream);
/// Writes Σ x² to *out (one float in device memory), which it zeroes first.
int sumSquaresCuda(const float *x, int64_t n, float *out, void *stream);
int scaleAccumulateCuda(const float *g, int64_t n, float scale, float *acc,
                        void *stream);
#endif

} // namespace mtprt::kernels

#endif // MTPRT_KERNELS_GRADFUSE_H
