//===- Bytes.h - byte counts as a person reads them -------------*- C++ -*-===//
//
// The one format for byte counts in what the compiler side prints: `mtpc
// plan`'s report and plan file summary, `mtpc check`, the planner's
// diagnostics and the `mtpc report` page: mtprt/Format.h's, which the
// runtime's messages share, with two decimals.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_PASSES_BYTES_H
#define MTPC_PASSES_BYTES_H

#include <string>

namespace mtp {

/// 640 B, 12.00 MiB, 1.50 GiB: binary units up to PiB with two decimals;
/// under 1 KiB, whole bytes (a fraction is dropped). Taking a double serves
/// both byte counts (int64_t, exact below 2^53) and measured values.
std::string formatBytes(double bytes);

} // namespace mtp

#endif // MTPC_PASSES_BYTES_H
