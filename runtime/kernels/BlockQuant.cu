//===- BlockQuant.cu - 8-bit block quantization, CUDA ---------------------===//
//
// One thread block per quantization block: a block-wide absmax reduction
// (warp shuffles, then one warp over the warp maxima), then every thread
// encodes its strided share. Torch-free.
//
//===----------------------------------------------------------------------===//

#include "mtprt/kernels/BlockQuant.h"

#include <cuda_runtime.h>

namespace mtprt::kernels {
namespace {

constexpr int kThreads = 256;

__device__ float warpMax(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, offset));
  return v;
}

__global__ void quantizeKernel(const float *__restrict__ values, int64_t n,
                               int64_t block, int8_t *__restrict__ codes,
                               float *__restrict__ scales) {
  __shared__ float warpMaxima[kThreads / 32];
  __shared__ float blockScale;
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * block;
  const int64_t hi = min(n, lo + block);

  float m = 0.f;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
    m = fmaxf(m, fabsf(values[i]));
  m = warpMax(m);
  if (threadIdx.x % 32 == 0)
    warpMaxima[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < blockDim.x / 32 ? warpMaxima[threadIdx.x] : 0.f;
    m = warpMax(m);
    if (threadIdx.x == 0) {
      blockScale = m / 127.5f;
      scales[blockIdx.x] = blockScale;
    }
  }
  __syncthreads();

  const float scale = blockScale;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float q = scale > 0.f ? nearbyintf(values[i] / scale) : 0.f;
    codes[i] = static_cast<int8_t>(fminf(fmaxf(q, -127.f), 127.f));
  }
}

__global__ void dequantizeKernel(const int8_t *__restrict__ codes,
                                 const float *__restrict__ scales, int64_t n,
                                 int64_t block, float *__restrict__ values) {
  const int64_t i =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n)
    values[i] = static_cast<float>(codes[i]) * scales[i / block];
}

} // namespace

int blockQuantizeCuda(const float *values, int64_t n, int64_t block,
                      int8_t *codes, float *scales, void *stream) {
  const int64_t blocks = numBlocks(n, block);
  if (blocks == 0)
    return cudaSuccess;
  quantizeKernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                   static_cast<cudaStream_t>(stream)>>>(values, n, block,
                                                        codes, scales);
  return cudaGetLastError();
}

int blockDequantizeCuda(const int8_t *codes, const float *scales, int64_t n,
                        int64_t block, float *values, void *stream) {
  if (n == 0)
    return cudaSuccess;
  const unsigned grid = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  dequantizeKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      codes, scales, n, block, values);
  return cudaGetLastError();
}

} // namespace mtprt::kernels
