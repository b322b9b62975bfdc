//===- GradFuse.cu - mask–clip–weight–accumulate, CUDA --------------------===//
//
// Three small launches: bin masking (one thread per zeroed bin), a Σx²
// reduction (block tree + one atomicAdd per block) whose result the host turns
// into the clip scale, and the scaled accumulate. Torch-free.
//
//===----------------------------------------------------------------------===//

#include "mtprt/kernels/GradFuse.h"

#include <cuda_runtime.h>

namespace mtprt::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void maskKernel(float2 *spectrum, int64_t rows, int64_t bins,
                           int64_t keep) {
  const int64_t dropped = bins - keep;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * dropped) {
    const int64_t r = i / dropped, b = keep + i % dropped;
    spectrum[r * bins + b] = make_float2(0.f, 0.f);
  }
}

__global__ void sumSquaresKernel(const float *__restrict__ x, int64_t n,
                                 float *out) {
  __shared__ float partial[kThreads];
  float s = 0.f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    s += x[i] * x[i];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    atomicAdd(out, partial[0]);
}

__global__ void scaleAccumulateKernel(const float *__restrict__ g, int64_t n,
                                      float scale, float *__restrict__ acc) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n)
    acc[i] += scale * g[i];
}

unsigned gridFor(int64_t n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

} // namespace

int maskBinsCuda(float *spectrum, int64_t rows, int64_t bins, int64_t keep,
                 void *stream) {
  const int64_t n = rows * (bins - keep);
  if (n <= 0)
    return cudaSuccess;
  maskKernel<<<gridFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<float2 *>(spectrum), rows, bins, keep);
  return cudaGetLastError();
}

int sumSquaresCuda(const float *x, int64_t n, float *out, void *stream) {
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemsetAsync(out, 0, sizeof(float), s);
  if (err != cudaSuccess || n == 0)
    return err;
  const unsigned grid = gridFor(n) < 1024u ? gridFor(n) : 1024u;
  sumSquaresKernel<<<grid, kThreads, 0, s>>>(x, n, out);
  return cudaGetLastError();
}

int scaleAccumulateCuda(const float *g, int64_t n, float scale, float *acc,
                        void *stream) {
  if (n == 0)
    return cudaSuccess;
  scaleAccumulateKernel<<<gridFor(n), kThreads, 0,
                          static_cast<cudaStream_t>(stream)>>>(g, n, scale,
                                                               acc);
  return cudaGetLastError();
}

} // namespace mtprt::kernels
