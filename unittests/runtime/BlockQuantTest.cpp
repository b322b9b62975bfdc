//===- BlockQuantTest.cpp - 8-bit block quantization ----------------------===//

#include "mtprt/kernels/BlockQuant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#ifdef MTPRT_HAVE_CUDA_KERNELS
#include <cuda_runtime.h>
#endif

using namespace mtprt::kernels;

namespace {

TEST(BlockQuant, KnownBlockEncodesExactly) {
  // absmax 2.55 -> scale 0.02; codes are x / 0.02 rounded to nearest even.
  const std::vector<float> x = {2.55f, -1.0f, 0.01f, 0.0f};
  std::vector<int8_t> q(4);
  float scale = -1.f;
  blockQuantizeCpu(x.data(), 4, 4, q.data(), &scale);
  EXPECT_FLOAT_EQ(scale, 2.55f / 127.5f);
  EXPECT_EQ(q[0], 127); // 127.5 rounds to 128, clamped to 127
  EXPECT_EQ(q[1], -50);
  EXPECT_EQ(q[2], 0); // 0.5 rounds to even
  EXPECT_EQ(q[3], 0);
}

TEST(BlockQuant, ZeroBlockHasZeroScale) {
  const std::vector<float> x(300, 0.f);
  std::vector<int8_t> q(300, 1);
  std::vector<float> s(numBlocks(300, 256), -1.f);
  blockQuantizeCpu(x.data(), 300, 256, q.data(), s.data());
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0], 0.f);
  EXPECT_EQ(s[1], 0.f);
  for (int8_t c : q)
    EXPECT_EQ(c, 0);
}

TEST(BlockQuant, ErrorIsAtMostHalfAScalePerBlock) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 3.f);
  const int64_t n = 1000, block = 256; // last block is partial (232 values)
  std::vector<float> x(n), y(n);
  for (float &v : x)
    v = dist(rng);
  std::vector<int8_t> q(n);
  std::vector<float> s(numBlocks(n, block));
  blockQuantizeCpu(x.data(), n, block, q.data(), s.data());
  blockDequantizeCpu(q.data(), s.data(), n, block, y.data());
  for (int64_t i = 0; i < n; ++i) {
    const float scale = s[i / block];
    EXPECT_LE(std::fabs(x[i] - y[i]), 0.5f * scale * (1 + 1e-5f)) << "at " << i;
  }
  // Each block's largest value decodes to 127 codes: within half a scale.
  for (int64_t b = 0; b < numBlocks(n, block); ++b) {
    float absmax = 0.f;
    for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i)
      absmax = std::max(absmax, std::fabs(x[i]));
    EXPECT_FLOAT_EQ(s[b], absmax / 127.5f);
  }
}

#ifdef MTPRT_HAVE_CUDA_KERNELS
TEST(BlockQuant, CudaMatchesCpuTwinBitForBit) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    GTEST_SKIP() << "no CUDA device (the kernel is compiled and linked only)";
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int64_t n = 100000, block = 256;
  std::vector<float> x(n);
  for (float &v : x)
    v = dist(rng);
  const int64_t nb = numBlocks(n, block);
  std::vector<int8_t> qCpu(n), qGpu(n);
  std::vector<float> sCpu(nb), sGpu(nb), yGpu(n), yCpu(n);
  blockQuantizeCpu(x.data(), n, block, qCpu.data(), sCpu.data());
  blockDequantizeCpu(qCpu.data(), sCpu.data(), n, block, yCpu.data());

  float *dx, *ds, *dy;
  int8_t *dq;
  ASSERT_EQ(cudaMalloc(&dx, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ds, nb * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dq, n), cudaSuccess);
  cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  ASSERT_EQ(blockQuantizeCuda(dx, n, block, dq, ds, nullptr), cudaSuccess);
  ASSERT_EQ(blockDequantizeCuda(dq, ds, n, block, dy, nullptr), cudaSuccess);
  cudaMemcpy(qGpu.data(), dq, n, cudaMemcpyDeviceToHost);
  cudaMemcpy(sGpu.data(), ds, nb * sizeof(float), cudaMemcpyDeviceToHost);
  cudaMemcpy(yGpu.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(ds);
  cudaFree(dq);
  EXPECT_EQ(sGpu, sCpu);
  EXPECT_EQ(qGpu, qCpu);
  EXPECT_EQ(yGpu, yCpu);
}
#endif

} // namespace
