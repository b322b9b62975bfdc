//===- Ewc.h - elastic weight consolidation across phases (D14) -*- C++ -*-===//
//
// `strategy { ewc = ... }` with `train { phases = ... }`: at the end of every
// phase but the last, the Fisher information's diagonal is estimated on
// `fisherBatches` batches of that phase's tasks (the mean squared batch
// gradient — the empirical Fisher with a batch as one sample) and the
// weights are remembered; every later step adds λ·Σ F·(θ − θ*)² to the loss
// (its gradient, 2λ·F·(θ − θ*), to the gradients before the update). Online
// EWC: a later phase's Fisher adds to the earlier ones' and θ* moves to the
// newest weights (one F and one θ*, however many phases). The trainable
// backbone is protected: heads of tasks not in a phase get no gradient and
// do not move.
//
// One definition for the compiler (which plans F and θ*: 8 B per protected
// parameter) and the runtime. Torch-free and LLVM-free.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_EWC_H
#define MTPRT_EWC_H

#include "mtprt/Limits.h"

#include <cstdint>

namespace mtprt {

struct EwcConfig {
  double lambda = 1e4;       ///< the source's
  int64_t fisherBatches = 8; ///< batches the Fisher is estimated on
  /// The conflict detector (the source's "similarity > 0.6 turns the
  /// protection on"): at a phase's end, the gradient cosines between the
  /// ending phase's tasks and the next one's, on the next batch; the phase
  /// is protected only where some pair exceeds this. kAlways: no detector.
  double threshold = kAlways;
  static constexpr double kAlways = -2.0;
  static constexpr double kSourceThreshold = 0.6;
  bool detects() const { return threshold >= -1.0; }

  /// F and θ*, fp32 each.
  static constexpr int64_t kBytesPerParameter = 8;
};

namespace limits {
inline constexpr RealRange kEwcLambda{0.0, 1e12};
inline constexpr Range kEwcBatches{1, 4096};
inline constexpr RealRange kEwcThreshold{-1.0, 1.0};
} // namespace limits

} // namespace mtprt

#endif // MTPRT_EWC_H
