//===- BlockQuant.h - 8-bit block quantization (GSC) ------------*- C++ -*-===//
//
// The quantizer of the compressed collectives (docs/contracts.md#compression-gsc):
// values split into blocks of `block`; each block keeps a scale
// absmax/127.5 and int8 codes clamp(round(x/scale), -127, 127); a block of
// zeros has scale 0 and codes 0. Decoding is code * scale, so the error of
// every value is at most scale/2.
//
// Torch-free on purpose: included by emitted programs and .cu files.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_KERNELS_BLOCKQUANT_H
#define MTPRT_KERNELS_BLOCKQUANT_H

#include <cstdint>

namespace mtprt::kernels {

/// Number of blocks (and scales) for n values.
inline int64_t numBlocks(int64_t n, int64_t block) {
  return (n + block - 1) / block;
}

/// CPU twin: codes[n], scales[numBlocks(n, block)].
void blockQuantizeCpu(const float *values, int64_t n, int64_t block,
                      int8_t *codes, float *scales);
void blockDequantizeCpu(const int8_t *codes, const float *scales, int64_t n,
                        int64_t block, float *values);

#ifdef MTPRT_HAVE_CUDA_KERNELS
/// CUDA: device pointers, launched on `stream` (a cudaStream_t, or null for
/// the default stream). Returns the cudaError_t of the launch as an int.
int blockQuantizeCuda(const float *values, int64_t n, int64_t block,
                      int8_t *codes, float *scales, void *stream);
int blockDequantizeCuda(const int8_t *codes, const float *scales, int64_t n,
                        int64_t block, float *values, void *stream);
#endif

} // namespace mtprt::kernels

#endif // MTPRT_KERNELS_BLOCKQUANT_H
