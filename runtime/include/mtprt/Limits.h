//===- Limits.h - The bounds every reader of a model checks ----*- C++ -*-===//
//
// One set of bounds on the model's sizes and training settings, shared by
// the frontend's Sema (a `.mtp` value out of range), the dialect's verifiers
// (hand-written `.mlir`), the plan writer, the runtime's plan loader (a
// damaged or forged plan) and its data and checkpoint readers.
// Within them the cost model's products stay inside int64 only with checked
// arithmetic; outside them nothing is allocated. Torch-free and LLVM-free:
// both the compiler and the runtime include it.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_LIMITS_H
#define MTPRT_LIMITS_H

#include <cstdint>

namespace mtprt::limits {

/// A closed integer range [lo, hi].
struct Range {
  int64_t lo, hi;
  constexpr bool contains(int64_t v) const { return v >= lo && v <= hi; }
};

/// A range of reals with open or closed ends. NaN lies in none, and ±inf
/// only in a range with that end infinite and closed (none below).
struct RealRange {
  double lo, hi;
  bool openLo = false, openHi = false;
  constexpr bool contains(double v) const {
    return (openLo ? v > lo : v >= lo) && (openHi ? v < hi : v <= hi);
  }
};

// Backbone.
inline constexpr Range kLayers{1, 1024};
inline constexpr Range kHidden{1, int64_t(1) << 20};
inline constexpr Range kHeads{1, 1024};
inline constexpr Range kFfn{1, int64_t(1) << 22};
inline constexpr Range kVocab{2, int64_t(1) << 24};
inline constexpr Range kSeq{1, int64_t(1) << 20};
/// Rows of a pretrained position table (0: as many as seq).
inline constexpr Range kPositions{0, int64_t(1) << 20};
/// A norm's epsilon.
inline constexpr RealRange kNormEps{0.0, 0.5, true, false};
inline constexpr RealRange kDropout{0.0, 1.0, false, true};

// Heads. A classifier has at least one class (1 = regression, MSE).
inline constexpr Range kClasses{1, int64_t(1) << 20};
inline constexpr Range kLabels{2, int64_t(1) << 20};
inline constexpr Range kDecoderLayers{1, 64};
inline constexpr int64_t kMaxTasks = 4096;
inline constexpr RealRange kLossWeight{0.0, 1e6};
/// A name a file carries (a task, a unit, a model): at most this many bytes;
/// a path (the spec, the data): at most kMaxPathBytes.
inline constexpr int64_t kMaxNameBytes = 4096;
inline constexpr int64_t kMaxPathBytes = 4096;
/// What the planner's 64-bit arithmetic holds with room: a step's bytes and
/// FLOPs, a plan's peaks.
inline constexpr int64_t kMaxBytes = int64_t(1) << 60;
inline constexpr int64_t kMaxFlops = int64_t(1) << 62;

// Budget.
inline constexpr Range kGpus{1, 4096};
/// Pipeline stages (docs/pipeline.md): at most one per backbone unit.
inline constexpr Range kPipelineStages{1, 2049};
inline constexpr Range kMicroBatch{1, int64_t(1) << 20};
inline constexpr Range kGlobalBatch{1, int64_t(1) << 24};
inline constexpr Range kAccumulation{1, int64_t(1) << 16};
/// Processes of a data-parallel run (--world-size, a checkpoint's world).
inline constexpr Range kWorldSize{1, int64_t(1) << 20};

// Strategy and training.
inline constexpr Range kDgfgHidden{1, int64_t(1) << 16};
inline constexpr Range kQuantBlock{1, int64_t(1) << 20};
inline constexpr Range kQuantBits{2, 16}; ///< and a power of two
inline constexpr Range kSteps{1, int64_t(1) << 40};
inline constexpr Range kWarmup{0, int64_t(1) << 30}; ///< and at most the steps
inline constexpr RealRange kGfmKeep{0.0, 1.0, true, false};
inline constexpr RealRange kClipNorm{0.0, 1e9, true, false}; ///< 0 = off
inline constexpr RealRange kRecalibration{0.0, 1.0}; ///< reuse and std thresholds
inline constexpr RealRange kTopK{0.0, 1.0, true, false};
inline constexpr RealRange kResidualDecay{0.0, 1.0};
inline constexpr RealRange kLearningRate{0.0, 10.0, true, false};
inline constexpr RealRange kWeightDecay{0.0, 10.0};
inline constexpr RealRange kBeta{0.0, 1.0, false, true}; ///< beta1 and beta2
inline constexpr RealRange kEps{0.0, 1.0, true, false};

} // namespace mtprt::limits

#endif // MTPRT_LIMITS_H
