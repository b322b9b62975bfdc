//===- Format.h - byte counts as a person reads them ------------*- C++ -*-===//
//
// The one byte formatter of the tree: the compiler's (passes/Bytes.h: two
// decimals, for `mtpc plan`, `check`, the planner's diagnostics and the
// report page) and the runtime's memory messages (one decimal) are this with
// their precision. Header-only and torch-free, like mtprt/Limits.h.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_FORMAT_H
#define MTPRT_FORMAT_H

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace mtprt {

/// 640 B, 12.0 MiB, 1.50 GiB: binary units up to PiB with `decimals`
/// digits; under 1 KiB, whole bytes (a fraction is dropped).
inline std::string formatBytes(double bytes, int decimals) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (std::isnan(bytes))
    return "nan B";
  double value = bytes;
  int unit = 0;
  while (std::abs(value) >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0)
    return std::to_string(static_cast<int64_t>(value)) + " B";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f %s", decimals, value, units[unit]);
  return buf;
}

} // namespace mtprt

#endif // MTPRT_FORMAT_H
