//===- Specialized.h - kernels an emitted program specialized ---*- C++ -*-===//
//
// `mtpc build` emits the GFM mask and the GSC block quantizer with the spec's
// sizes as compile-time constants (a CPU twin and CUDA C++), and the fused
// pointwise norm kernels with the hidden size as row width, and registers
// them here at start-up. The runtime runs a specialized kernel wherever a
// tensor has its shape (the spec's hidden size, keep, block) and the generic
// kernel everywhere else; both compute the same values.
//
// Torch-free on purpose: included by emitted programs.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_KERNELS_SPECIALIZED_H
#define MTPRT_KERNELS_SPECIALIZED_H

#include "mtprt/kernels/Pointwise.h"

#include <cstdint>

namespace mtprt::kernels {

struct Specialized {
  const char *what = ""; ///< for the log: the model and the constants
  /// GFM: rows of `gfmBins` interleaved complex bins; bins >= gfmKeep zeroed.
  int64_t gfmBins = 0, gfmKeep = 0;
  void (*maskBinsCpu)(float *spectrum, int64_t rows) = nullptr;
  int (*maskBinsCuda)(float *spectrum, int64_t rows, void *stream) = nullptr;
  /// GSC 8-bit blocks of `quantBlock` values.
  int64_t quantBlock = 0;
  void (*blockQuantizeCpu)(const float *values, int64_t n, int8_t *codes,
                           float *scales) = nullptr;
  void (*blockDequantizeCpu)(const int8_t *codes, const float *scales,
                             int64_t n, float *values) = nullptr;
  int (*blockQuantizeCuda)(const float *values, int64_t n, int8_t *codes,
                           float *scales, void *stream) = nullptr;
  int (*blockDequantizeCuda)(const int8_t *codes, const float *scales,
                             int64_t n, float *values, void *stream) = nullptr;
  /// The fused pointwise kernels with rows of `normWidth` (the hidden size)
  /// a compile-time constant.
  int64_t normWidth = 0;
  PointwiseCpu pointwise;
};

/// Registers the program's kernels (once, before training).
void setSpecialized(const Specialized &kernels);
const Specialized &specialized();
/// How many times a specialized kernel ran in this process.
int64_t specializedLaunches();
void countSpecializedLaunch();

} // namespace mtprt::kernels

#endif // MTPRT_KERNELS_SPECIALIZED_H
