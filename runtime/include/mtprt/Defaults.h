//===- Defaults.h - the one set of defaults the compiler and runtime share -*- C++ -*-===//
//
// What a spec gets when it leaves a strategy or train field out, what a plan
// without a strategy runs with, and what `--compress` uses without its
// flags: one number each (docs/contracts.md, docs/techniques.md). Torch-free
// and header-only, like mtprt/Limits.h, which bounds the same fields.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_DEFAULTS_H
#define MTPRT_DEFAULTS_H

#include <cstdint>

namespace mtprt::defaults {

// GSC compressed collectives (docs/contracts.md#compression-gsc).
inline constexpr double kTopK = 0.15;
inline constexpr double kResidualDecay = 0.8;
inline constexpr int64_t kQuantBlock = 256;
inline constexpr int64_t kQuantBits = 8;

// The per-task gradient pipeline: GFM's kept fraction, the DGFG gate's width
// and its recalibration thresholds, per-task clipping.
inline constexpr double kGfmKeep = 0.30;
inline constexpr int64_t kGateHidden = 32;
inline constexpr double kReuseThreshold = 0.15;
inline constexpr double kSimStdThreshold = 0.4;
inline constexpr double kClipMaxNorm = 1.0;

// Checkpointing and offload.
inline constexpr double kGroupThreshold = 0.5;
inline constexpr double kMaxOffloadLatency = 1.2e-3;

// Training.
inline constexpr int64_t kSteps = 1000;
inline constexpr int64_t kLogEvery = 10;
inline constexpr double kWeightDecay = 0.01;
inline constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;

} // namespace mtprt::defaults

#endif // MTPRT_DEFAULTS_H
