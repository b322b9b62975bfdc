//===- Limits.h - The bounds every reader of a model checks ----*- C++ -*-===//
//
// One set of bounds on the model's sizes, shared by the frontend's Sema (a
// `.mtp` value out of range), the dialect's verifiers (hand-written `.mlir`),
// the plan writer and the runtime's plan loader (a damaged or forged plan).
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

// Backbone.
inline constexpr Range kLayers{1, 1024};
inline constexpr Range kHidden{1, int64_t(1) << 20};
inline constexpr Range kHeads{1, 1024};
inline constexpr Range kFfn{1, int64_t(1) << 22};
inline constexpr Range kVocab{2, int64_t(1) << 24};
inline constexpr Range kSeq{1, int64_t(1) << 20};

// Heads. A classifier has at least one class (1 = regression, MSE).
inline constexpr Range kClasses{1, int64_t(1) << 20};
inline constexpr Range kLabels{2, int64_t(1) << 20};
inline constexpr Range kDecoderLayers{1, 64};
inline constexpr int64_t kMaxTasks = 4096;

// Budget.
inline constexpr Range kGpus{1, 4096};
inline constexpr Range kMicroBatch{1, int64_t(1) << 20};
inline constexpr Range kGlobalBatch{1, int64_t(1) << 24};
inline constexpr Range kAccumulation{1, int64_t(1) << 16};

// Strategy and training.
inline constexpr Range kDgfgHidden{1, int64_t(1) << 16};
inline constexpr Range kQuantBlock{1, int64_t(1) << 20};
inline constexpr Range kSteps{1, int64_t(1) << 40};
inline constexpr Range kWarmup{0, int64_t(1) << 30};

} // namespace mtprt::limits

#endif // MTPRT_LIMITS_H
