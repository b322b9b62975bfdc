//===- Pointwise.cu - the fused pointwise kernels, CUDA twins -------------===//
//
// One block per row for the norms (two-pass statistics, as the CPU twin),
// a grid-stride loop for GELU. dw and db of the norm backward are
// accumulated with one atomicAdd per element per row block. Torch-free.
//
//===----------------------------------------------------------------------===//

#include "mtprt/kernels/Pointwise.h"

#include <cuda_runtime.h>

namespace mtprt::kernels {
namespace {

constexpr int kThreads = 128;

__device__ float blockSum(float v, float *shared) {
  for (int o = 16; o > 0; o /= 2)
    v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0)
    shared[warp] = v;
  __syncthreads();
  float s = 0.f;
  if (threadIdx.x < 32) {
    s = threadIdx.x < kThreads / 32 ? shared[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o /= 2)
      s += __shfl_down_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0)
      shared[0] = s;
  }
  __syncthreads();
  s = shared[0];
  __syncthreads();
  return s;
}

__global__ void normForwardKernel(const float *__restrict__ x,
                                  const float *__restrict__ w,
                                  const float *__restrict__ b,
                                  float *__restrict__ y, float *mean,
                                  float *rstd, int64_t n, float eps) {
  __shared__ float shared[kThreads / 32];
  const float *xr = x + blockIdx.x * n;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    s += xr[i];
  const float mu = blockSum(s, shared) / static_cast<float>(n);
  float q = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    q += (xr[i] - mu) * (xr[i] - mu);
  const float rs = rsqrtf(blockSum(q, shared) / static_cast<float>(n) + eps);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = mu;
    rstd[blockIdx.x] = rs;
  }
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    y[blockIdx.x * n + i] = fmaf((xr[i] - mu) * rs, w[i], b[i]);
}

__global__ void normRecomputeKernel(const float *__restrict__ x,
                                    const float *mean, const float *rstd,
                                    const float *__restrict__ w,
                                    const float *__restrict__ b,
                                    float *__restrict__ y, int64_t n) {
  const float mu = mean[blockIdx.x], rs = rstd[blockIdx.x];
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const int64_t j = blockIdx.x * n + i;
    y[j] = fmaf((x[j] - mu) * rs, w[i], b[i]);
  }
}

__global__ void normBackwardKernel(const float *__restrict__ x,
                                   const float *mean, const float *rstd,
                                   const float *__restrict__ w,
                                   const float *__restrict__ dy,
                                   float *__restrict__ dx, float *dw,
                                   float *db, int64_t n) {
  __shared__ float shared[kThreads / 32];
  const int64_t off = blockIdx.x * n;
  const float mu = mean[blockIdx.x], rs = rstd[blockIdx.x];
  float s1 = 0.f, s2 = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float xhat = (x[off + i] - mu) * rs, d = dy[off + i], g = d * w[i];
    s1 += g;
    s2 += g * xhat;
    atomicAdd(dw + i, d * xhat);
    atomicAdd(db + i, d);
  }
  const float m1 = blockSum(s1, shared) / static_cast<float>(n);
  const float m2 = blockSum(s2, shared) / static_cast<float>(n);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float xhat = (x[off + i] - mu) * rs;
    dx[off + i] = (dy[off + i] * w[i] - m1 - xhat * m2) * rs;
  }
}

__global__ void geluForwardKernel(const float *__restrict__ u,
                                  float *__restrict__ g, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    g[i] = 0.5f * u[i] * (1.f + erff(u[i] * 0.70710678118654752f));
}

__global__ void geluBackwardKernel(const float *u, const float *dg, float *du,
                                   int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = u[i];
    const float cdf = 0.5f * (1.f + erff(x * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
    du[i] = dg[i] * fmaf(x, pdf, cdf);
  }
}

unsigned gridFor(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

cudaStream_t cast(void *stream) { return static_cast<cudaStream_t>(stream); }

} // namespace

int normForwardCuda(const float *x, const float *w, const float *b, float *y,
                    float *mean, float *rstd, int64_t rows, int64_t width,
                    float eps, void *stream) {
  if (rows <= 0)
    return cudaSuccess;
  normForwardKernel<<<static_cast<unsigned>(rows), kThreads, 0, cast(stream)>>>(
      x, w, b, y, mean, rstd, width, eps);
  return cudaGetLastError();
}

int normRecomputeCuda(const float *x, const float *mean, const float *rstd,
                      const float *w, const float *b, float *y, int64_t rows,
                      int64_t width, void *stream) {
  if (rows <= 0)
    return cudaSuccess;
  normRecomputeKernel<<<static_cast<unsigned>(rows), kThreads, 0,
                        cast(stream)>>>(x, mean, rstd, w, b, y, width);
  return cudaGetLastError();
}

int normBackwardCuda(const float *x, const float *mean, const float *rstd,
                     const float *w, const float *dy, float *dx, float *dw,
                     float *db, int64_t rows, int64_t width, void *stream) {
  if (rows <= 0)
    return cudaSuccess;
  normBackwardKernel<<<static_cast<unsigned>(rows), kThreads, 0,
                       cast(stream)>>>(x, mean, rstd, w, dy, dx, dw, db, width);
  return cudaGetLastError();
}

int geluForwardCuda(const float *u, float *g, int64_t n, void *stream) {
  if (n <= 0)
    return cudaSuccess;
  geluForwardKernel<<<gridFor(n), 256, 0, cast(stream)>>>(u, g, n);
  return cudaGetLastError();
}

int geluBackwardCuda(const float *u, const float *dg, float *du, int64_t n,
                     void *stream) {
  if (n <= 0)
    return cudaSuccess;
  geluBackwardKernel<<<gridFor(n), 256, 0, cast(stream)>>>(u, dg, du, n);
  return cudaGetLastError();
}

} // namespace mtprt::kernels
