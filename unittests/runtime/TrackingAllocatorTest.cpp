//===- TrackingAllocatorTest.cpp - counted tensor memory ------------------===//

#include "mtprt/Memory.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

using mtprt::MemoryStats;

namespace {

class TrackingAllocator : public ::testing::Test {
protected:
  void SetUp() override {
    mtprt::installCpuMemoryTracking();
    mtprt::resetCpuPeak();
    base = mtprt::cpuMemoryStats();
  }
  int64_t current() { return mtprt::cpuMemoryStats().currentBytes - base.currentBytes; }
  int64_t peak() { return mtprt::cpuMemoryStats().peakBytes - base.currentBytes; }
  MemoryStats base;
};

TEST_F(TrackingAllocator, IsInstalled) {
  EXPECT_TRUE(mtprt::cpuMemoryTrackingInstalled());
}

TEST_F(TrackingAllocator, ExactPeakForAKnownSequence) {
  at::Tensor a = at::empty({1000}, at::kFloat); // 4000 B
  EXPECT_EQ(current(), 4000);
  at::Tensor b = at::empty({10, 20}, at::kLong); // 1600 B
  EXPECT_EQ(current(), 5600);
  EXPECT_EQ(peak(), 5600);
  a.reset();
  EXPECT_EQ(current(), 1600);
  at::Tensor c = at::empty({3000}, at::kByte); // 3000 B
  EXPECT_EQ(current(), 4600);
  EXPECT_EQ(peak(), 5600); // the high-water mark stays
  at::Tensor d = at::empty({2048}, at::kFloat); // 8192 B
  EXPECT_EQ(current(), 12792);
  EXPECT_EQ(peak(), 12792);
  b.reset();
  c.reset();
  d.reset();
  EXPECT_EQ(current(), 0);
  EXPECT_EQ(peak(), 12792);
  MemoryStats now = mtprt::cpuMemoryStats();
  EXPECT_EQ(now.allocations - base.allocations, 4);
  EXPECT_EQ(now.frees - base.frees, 4);

  mtprt::resetCpuPeak();
  EXPECT_EQ(peak(), 0);
}

TEST_F(TrackingAllocator, ViewsAndEmptyTensorsCostNothing) {
  at::Tensor a = at::zeros({64, 64}, at::kFloat);
  EXPECT_EQ(current(), 64 * 64 * 4);
  at::Tensor v = a.view({4096});
  at::Tensor s = a.slice(0, 0, 8);
  at::Tensor t = a.t();
  at::Tensor e = at::empty({0}, at::kFloat);
  EXPECT_EQ(current(), 64 * 64 * 4);
}

TEST_F(TrackingAllocator, CountsAnOpsOutputAndItsTemporaries) {
  at::Tensor x = at::ones({64, 32}, at::kFloat);
  at::Tensor w = at::ones({32, 16}, at::kFloat);
  const int64_t inputs = (64 * 32 + 32 * 16) * 4;
  EXPECT_EQ(current(), inputs);
  at::Tensor y = at::mm(x, w);
  EXPECT_EQ(current(), inputs + 64 * 16 * 4);
  EXPECT_GE(peak(), inputs + 64 * 16 * 4);
  EXPECT_EQ(y[0][0].item<float>(), 32.f);
}

TEST_F(TrackingAllocator, RawInterfaceIsTracked) {
  c10::Allocator *alloc = c10::GetCPUAllocator();
  void *p = alloc->raw_allocate(100);
  EXPECT_EQ(current(), 100);
  alloc->raw_deallocate(p);
  EXPECT_EQ(current(), 0);
  EXPECT_EQ(peak(), 100);
}

TEST_F(TrackingAllocator, ConcurrentAllocationsAddUpExactly) {
  constexpr int kThreads = 2, kPerThread = 500;
  std::vector<std::thread> threads;
  std::vector<std::vector<at::Tensor>> kept(kThreads);
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i)
        kept[t].push_back(at::empty({i + 1}, at::kByte));
    });
  for (std::thread &t : threads)
    t.join();
  const int64_t expected = kThreads * (kPerThread * (kPerThread + 1) / 2);
  EXPECT_EQ(current(), expected);
  EXPECT_EQ(peak(), expected);
  kept.clear();
  EXPECT_EQ(current(), 0);
}

TEST(CudaMemoryStats, RequestedBytesOfAKnownTensor) {
  if (!mtprt::cudaMemoryStatsAvailable())
    GTEST_SKIP() << "no CUDA device, or built without the LibTorch-CUDA parts";
  mtprt::resetCudaPeak(0);
  const MemoryStats before = mtprt::cudaMemoryStats(0);
  {
    at::Tensor a = at::empty({1000}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0));
    const MemoryStats during = mtprt::cudaMemoryStats(0);
    EXPECT_EQ(during.currentBytes - before.currentBytes, 4000);
    EXPECT_EQ(during.peakBytes - before.currentBytes, 4000);
  }
  EXPECT_EQ(mtprt::cudaMemoryStats(0).currentBytes, before.currentBytes);
}

} // namespace
