//===- Bytes.cpp - byte counts as a person reads them ---------------------===//

#include "passes/Bytes.h"

#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <cstdint>

std::string mtp::formatBytes(double bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = bytes;
  int unit = 0;
  while (std::abs(value) >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0)
    return std::isnan(value) ? std::string("nan B")
                             : std::to_string(int64_t(value)) + " B";
  return llvm::formatv("{0:f2} {1}", value, units[unit]).str();
}
