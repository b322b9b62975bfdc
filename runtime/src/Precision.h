//===- Precision.h - autocast for a scope (internal) ------------*- C++ -*-===//
//
// The trainer's step and the held-out evaluation run under the same
// autocast, so that evaluation sees the precision training does.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_SRC_PRECISION_H
#define MTPRT_SRC_PRECISION_H

#include "mtprt/Config.h"

#include <ATen/autocast_mode.h>
#include <c10/core/Device.h>

namespace mtprt {

/// Autocast on the model's device for bf16 / fp16; restores on exit.
/// `cacheCasts` false: no cache of weights' low-precision copies (a forward
/// without backward uses each weight once, so a cache only holds memory).
class PrecisionGuard {
public:
  PrecisionGuard(Precision p, const at::Device &d, bool cacheCasts = true) {
    if (p == Precision::Fp32)
      return;
    type_ = d.type();
    was_ = at::autocast::is_autocast_enabled(type_);
    dtype_ = at::autocast::get_autocast_dtype(type_);
    cache_ = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_enabled(type_, true);
    at::autocast::set_autocast_dtype(type_, p == Precision::Bf16 ? at::kBFloat16
                                                                 : at::kHalf);
    at::autocast::set_autocast_cache_enabled(cache_ && cacheCasts);
    active_ = true;
  }
  ~PrecisionGuard() {
    if (!active_)
      return;
    at::autocast::set_autocast_enabled(type_, was_);
    at::autocast::set_autocast_dtype(type_, dtype_);
    at::autocast::set_autocast_cache_enabled(cache_);
    if (!was_)
      at::autocast::clear_cache();
  }
  PrecisionGuard(const PrecisionGuard &) = delete;
  PrecisionGuard &operator=(const PrecisionGuard &) = delete;

private:
  bool active_ = false, was_ = false, cache_ = true;
  at::DeviceType type_ = at::kCPU;
  at::ScalarType dtype_ = at::kBFloat16;
};

} // namespace mtprt

#endif // MTPRT_SRC_PRECISION_H
