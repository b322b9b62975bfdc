//===- TrackingAllocator.cpp - counted CPU tensor memory ------------------===//
//
// Wraps LibTorch's CPU allocator. Storage pointers are both data and context
// (as in the default allocator), so the raw allocate/deallocate interface
// keeps working; a size table maps each live pointer to its requested bytes.
//
//===----------------------------------------------------------------------===//

#include "mtprt/Memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace mtprt {
namespace {

class TrackingAllocator final : public c10::Allocator {
public:
  explicit TrackingAllocator(c10::Allocator *base)
      : base_(base), baseDeleter_(base->raw_deleter()) {
    if (!baseDeleter_)
      throw std::runtime_error(
          "mtprt: LibTorch's CPU allocator has no raw deleter; cannot track it");
  }

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void *data = inner.get();
    if (!data)
      return inner; // zero bytes: nothing to count, nothing to free
    // Own the pointer from here on; freed through our deleter.
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_.emplace(data, n);
      current_ += static_cast<int64_t>(n);
      peak_ = std::max(peak_, current_);
      ++allocations_;
    }
    return {data, data, &TrackingAllocator::deleter, c10::Device(c10::kCPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &TrackingAllocator::deleter;
  }

  void copy_data(void *dest, const void *src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  MemoryStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {current_, peak_, allocations_, frees_};
  }

  void resetPeak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = current_;
  }

  static TrackingAllocator *instance;

private:
  static void deleter(void *ptr) {
    if (!ptr)
      return;
    TrackingAllocator *self = instance;
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      auto it = self->sizes_.find(ptr);
      if (it != self->sizes_.end()) {
        self->current_ -= static_cast<int64_t>(it->second);
        ++self->frees_;
        self->sizes_.erase(it);
      }
    }
    self->baseDeleter_(ptr);
  }

  c10::Allocator *base_;
  c10::DeleterFnPtr baseDeleter_;
  std::mutex mutex_;
  std::unordered_map<void *, size_t> sizes_;
  int64_t current_ = 0, peak_ = 0, allocations_ = 0, frees_ = 0;
};

TrackingAllocator *TrackingAllocator::instance = nullptr;
std::once_flag installOnce;

} // namespace

void installCpuMemoryTracking() {
  std::call_once(installOnce, [] {
    // Leaked on purpose: tensors may outlive every static destructor.
    TrackingAllocator::instance = new TrackingAllocator(c10::GetCPUAllocator());
    // Above the default allocator's priority, so ours wins.
    c10::SetCPUAllocator(TrackingAllocator::instance, /*priority=*/100);
    if (c10::GetCPUAllocator() != TrackingAllocator::instance)
      throw std::runtime_error("mtprt: another CPU allocator with a higher "
                               "priority is installed; cannot track memory");
  });
}

bool cpuMemoryTrackingInstalled() { return TrackingAllocator::instance; }

MemoryStats cpuMemoryStats() {
  return TrackingAllocator::instance ? TrackingAllocator::instance->stats()
                                     : MemoryStats{};
}

void resetCpuPeak() {
  if (TrackingAllocator::instance)
    TrackingAllocator::instance->resetPeak();
}

} // namespace mtprt
