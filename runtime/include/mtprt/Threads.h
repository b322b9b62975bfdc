//===- Threads.h - the intra-op thread count that suits the machine -*- C++ -*-===//
//
// `--threads auto` (the CPU default): LibTorch's OpenMP workers spin while
// they wait, so beside another CPU-bound process a step at the default
// count (one thread per core) can take several times as long as at one
// thread, where PyTorch users just see a slow machine. The tuner times the
// steps at each candidate count (the default, then halving to 1), keeps the
// fastest (the count kept before, if within 5% of it), and probes again when the kept count's steps slow down or every
// `reprobeEvery` steps (the load may have gone). Torch-free: the driver sets
// the count it returns. Floating-point reductions may split differently at
// another count, so a run that must repeat bit for bit pins `--threads N`.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_THREADS_H
#define MTPRT_THREADS_H

#include <string>
#include <vector>

namespace mtprt {

class ThreadTuner {
public:
  /// `maxThreads`: the default count (at least 1). Each candidate runs
  /// `probeSteps` steps (the fastest counts); a kept count is probed again
  /// after `slowSteps` steps in a row `slowFactor` times slower than it
  /// was, or after `reprobeEvery` steps.
  explicit ThreadTuner(int maxThreads, int probeSteps = 2,
                       int reprobeEvery = 100, int slowSteps = 3,
                       double slowFactor = 1.3);

  /// The count the next step runs at.
  int threads() const { return candidates_[current_]; }
  const std::vector<int> &candidates() const { return candidates_; }
  /// Whether the next step is a probe's (timed against the other counts).
  bool probing() const { return probing_; }

  /// Records the step that just ran at threads(), `seconds` of wall time.
  /// The first step (warm-up: first touches, allocator growth) is not
  /// counted. Returns true when threads() changed.
  bool record(double seconds);
  /// Whether the last record() settled on a count other than the one kept
  /// before (the first settling included); why() gives the probe's timings.
  bool settledAnew() const { return announce_; }
  const std::string &why() const { return why_; }

private:
  void startProbe();
  void settle();

  std::vector<int> candidates_;
  std::vector<double> best_; ///< fastest probed step per candidate
  int probeSteps_, reprobeEvery_, slowSteps_;
  double slowFactor_;
  int current_ = 0, kept_ = -1;
  bool warm_ = false, probing_ = true, announce_ = false;
  int stepsAtCandidate_ = 0, settledSteps_ = 0, slowInRow_ = 0;
  std::string why_;
};

} // namespace mtprt

#endif // MTPRT_THREADS_H
