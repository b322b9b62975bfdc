//===- CudaMemory.cpp - the CUDA caching allocator's statistics -----------===//

#include "mtprt/Memory.h"

#include <stdexcept>
#include <string>

#ifdef MTPRT_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace mtprt {

#ifdef MTPRT_TORCH_CUDA
bool cudaMemoryStatsAvailable() { return c10::cuda::device_count() > 0; }

MemoryStats cudaMemoryStats(int device) {
  if (!cudaMemoryStatsAvailable())
    throw std::runtime_error("mtprt: no CUDA device is visible");
  auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
      static_cast<c10::DeviceIndex>(device));
  constexpr auto all =
      static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  // Requested (unrounded) bytes, the same measure the CPU tracker uses.
  const auto &bytes = stats.requested_bytes[all];
  const auto &count = stats.allocation[all];
  return {bytes.current, bytes.peak, count.allocated, count.freed};
}

void resetCudaPeak(int device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(
      static_cast<c10::DeviceIndex>(device));
}
#else
bool cudaMemoryStatsAvailable() { return false; }

MemoryStats cudaMemoryStats(int) {
  throw std::runtime_error("mtprt: built without the LibTorch-CUDA parts (the "
                           "torch wheel's CUDA does not match the toolkit, or "
                           "MTPRT_TORCH_CUDA=OFF); rebuild on a matching machine");
}

void resetCudaPeak(int) {}
#endif

} // namespace mtprt
