//===- Memory.h - measured tensor memory ------------------------*- C++ -*-===//
//
// The runtime's memory measurements: what the plan's predictions are checked
// against. On CPU a tracking allocator wraps LibTorch's CPU allocator and
// counts the bytes every tensor storage asks for; on CUDA the caching
// allocator's own statistics are read. Torch-free, so any file may include it.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_MEMORY_H
#define MTPRT_MEMORY_H

#include <cstdint>

namespace mtprt {

/// Bytes of live tensor storage, as requested by LibTorch (no allocator
/// rounding), and its high-water mark since the last peak reset.
struct MemoryStats {
  int64_t currentBytes = 0;
  int64_t peakBytes = 0;
  /// Allocations and frees seen since tracking began (CPU only).
  int64_t allocations = 0;
  int64_t frees = 0;
};

/// Makes the tracking allocator LibTorch's CPU allocator. Idempotent and
/// thread-safe; storage allocated before the call is not counted (its frees
/// are passed through untracked).
void installCpuMemoryTracking();
/// True once installCpuMemoryTracking() has run.
bool cpuMemoryTrackingInstalled();
/// CPU tensor memory since tracking was installed.
MemoryStats cpuMemoryStats();
/// Starts a new high-water mark at the current level.
void resetCpuPeak();

/// True when this build has the LibTorch-CUDA parts and a device is visible.
bool cudaMemoryStatsAvailable();
/// The CUDA caching allocator's allocated-bytes statistics for `device`;
/// throws std::runtime_error when unavailable.
MemoryStats cudaMemoryStats(int device);
void resetCudaPeak(int device);

} // namespace mtprt

#endif // MTPRT_MEMORY_H
