//===- BatchSchedule.h - the dynamic batch schedule (D15) -------*- C++ -*-===//
//
// `strategy { dynamic_batch = ... }`: the global batch as a function of the
// optimizer step. One definition for the compiler (which plans for the
// largest batch the schedule reaches) and the runtime (which trains each
// step at its batch). Torch-free and LLVM-free.
//
// The source's schedule (docs/techniques.md D15): from 32, ×(1 + step/100)
// — linear growth at 32/100 per step — capped at 512, for the first 2000
// steps; then ×0.98 every 500 steps, never below 32. A step's batch is a
// whole number of micro-batches on every process: the schedule's value
// rounded down to a multiple of micro_batch × processes, at least one.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_BATCHSCHEDULE_H
#define MTPRT_BATCHSCHEDULE_H

#include "mtprt/Limits.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace mtprt {

struct BatchSchedule {
  int64_t start = 32;      ///< the batch at step 0
  int64_t max = 512;       ///< the ramp's cap
  double rate = 0.01;      ///< growth per step: start × (1 + rate·step)
  int64_t rampSteps = 2000;///< the ramp's length; the decay starts there
  double decay = 0.98;     ///< the factor applied every `every` steps after
  int64_t every = 500;
  int64_t floor = 32;      ///< the decay's floor

  /// What is inconsistent between the fields (nullptr: nothing); each
  /// field's own range is in limits below. Sema, the dialect's verifier and
  /// the plan reader all ask this.
  const char *inconsistency() const {
    if (max < start)
      return "'max' is below 'start'";
    if (floor > max)
      return "'floor' is above 'max'";
    return nullptr;
  }
  /// The schedule's value at optimizer step `step` (0-based), before
  /// rounding to micro-batches.
  int64_t at(int64_t step) const {
    if (step < rampSteps)
      return ramp(step);
    // The decay starts from where the ramp ended (its cap, unless it is
    // short).
    const double decays = double((step - rampSteps) / every);
    const double v = double(top()) * std::pow(decay, decays);
    return std::max<int64_t>(floor, int64_t(std::floor(v)));
  }
  /// The largest value the schedule reaches: the ramp's top (the decay only
  /// lowers it; a floor above it lifts it).
  int64_t largest() const { return std::max(top(), floor); }
  /// The smallest value it reaches (in the limit): the ramp's start, or
  /// the decay's floor (its top where nothing decays).
  int64_t smallest() const {
    const int64_t decayed = decay < 1.0 ? floor : std::max(top(), floor);
    return rampSteps > 0 ? std::min(ramp(0), decayed) : decayed;
  }
  /// The step's global batch: at(step) rounded down to a multiple of
  /// `perStep` (micro batch × processes), at least `perStep`.
  int64_t batch(int64_t step, int64_t perStep) const {
    return std::max<int64_t>(perStep, at(step) / perStep * perStep);
  }
  /// The largest global batch any step runs.
  int64_t largestBatch(int64_t perStep) const {
    return std::max<int64_t>(perStep, largest() / perStep * perStep);
  }

private:
  int64_t ramp(int64_t step) const {
    // In doubles until capped: a large rate times a late step overflows.
    const double grown = std::min(
        double(max), double(start) * (1.0 + rate * double(step)));
    return std::max<int64_t>(1, int64_t(std::floor(grown)));
  }
  /// Where the ramp ends.
  int64_t top() const {
    return rampSteps > 0 ? ramp(rampSteps - 1) : std::min(start, max);
  }
};

namespace limits {
inline constexpr RealRange kBatchRate{0.0, 1e6};
inline constexpr RealRange kBatchDecay{0.0, 1.0, /*openLo=*/true};
inline constexpr Range kBatchSteps{0, int64_t(1) << 40};
inline constexpr Range kBatchEvery{1, int64_t(1) << 40};
} // namespace limits

} // namespace mtprt

#endif // MTPRT_BATCHSCHEDULE_H
