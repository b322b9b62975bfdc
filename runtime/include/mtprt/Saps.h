//===- Saps.h - SAPS sparse parameter updates (D12) -------------*- C++ -*-===//
//
// `strategy { saps = ... }`: only the most important entries of each backbone
// tensor are updated; the rest keep their values. One definition for the
// compiler (which plans the compact state) and the runtime (which keeps it).
// Torch-free and LLVM-free.
//
// Importance of entry i (docs/techniques.md D12): |θ_i·g_i| + λ·g_i², the
// squared gradient standing in for the Hessian diagonal (the empirical
// Fisher with the micro-batch as one sample). Ranked per tensor — each
// backbone tensor updates its own top `fraction` — so a tensor of large
// weights (a norm's, near 1) does not crowd out a projection's (near 0.02).
// Re-ranked at every step that is a multiple of `every` (step 0 included),
// from that step's first micro-batch gradient as it arrives, so the whole
// step's gradient is gathered under the new selection and no dense
// gradient outlives its own accumulation. Heads and the gate update densely.
//
// Per selected entry the runtime holds its index, its gradient, AdamW's two
// moments and its own step count (bias correction restarts for an entry
// that enters the selection): bytesPerSelected.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_SAPS_H
#define MTPRT_SAPS_H

#include "mtprt/Limits.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace mtprt {

struct SapsConfig {
  double fraction = 0.03; ///< the share of each tensor updated
  int64_t every = 1000;   ///< steps between re-rankings
  double lambda = 1.0;    ///< weight of the squared-gradient term

  /// Index (int64), gradient, exp_avg, exp_avg_sq, step (fp32 each).
  static constexpr int64_t kBytesPerSelected = 8 + 4 + 4 + 4 + 4;

  /// How many entries of a tensor of `numel` are updated: the fraction,
  /// rounded to nearest, at least one.
  int64_t selected(int64_t numel) const {
    if (numel <= 0)
      return 0;
    const double k = std::nearbyint(fraction * double(numel));
    return std::clamp<int64_t>(int64_t(k), 1, numel);
  }
  /// Whether optimizer step `step` (0-based) re-ranks.
  bool rerankAt(int64_t step) const { return step % every == 0; }
};

namespace limits {
inline constexpr RealRange kSapsFraction{0.0, 1.0, /*openLo=*/true};
inline constexpr Range kSapsEvery{1, int64_t(1) << 40};
inline constexpr RealRange kSapsLambda{0.0, 1e12};
} // namespace limits

} // namespace mtprt

#endif // MTPRT_SAPS_H
