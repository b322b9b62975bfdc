//===- Threads.cpp - the intra-op thread count that suits the machine -----===//

#include "mtprt/Threads.h"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace mtprt {

ThreadTuner::ThreadTuner(int maxThreads, int probeSteps, int reprobeEvery,
                         int slowSteps, double slowFactor)
    : probeSteps_(std::max(1, probeSteps)),
      reprobeEvery_(std::max(1, reprobeEvery)),
      slowSteps_(std::max(1, slowSteps)), slowFactor_(slowFactor) {
  for (int n = std::max(1, maxThreads);; n /= 2) {
    candidates_.push_back(n);
    if (n == 1)
      break;
  }
  best_.assign(candidates_.size(),
               std::numeric_limits<double>::infinity());
}

static std::string ms(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f ms", seconds * 1e3);
  return buf;
}

void ThreadTuner::startProbe() {
  probing_ = true;
  std::fill(best_.begin(), best_.end(),
            std::numeric_limits<double>::infinity());
  current_ = 0;
  stepsAtCandidate_ = 0;
}

void ThreadTuner::settle() {
  probing_ = false;
  current_ = int(std::min_element(best_.begin(), best_.end()) - best_.begin());
  // Within 5% of the fastest, the count kept before stays: timings that
  // close are noise, and each change is announced.
  for (size_t i = 0; i < candidates_.size(); ++i)
    if (candidates_[i] == kept_ && best_[i] <= 1.05 * best_[current_])
      current_ = int(i);
  announce_ = candidates_[current_] != kept_;
  kept_ = candidates_[current_];
  settledSteps_ = slowInRow_ = 0;
  why_ = "fastest:";
  for (size_t i = 0; i < candidates_.size(); ++i)
    why_ += (i ? ", " : " ") + ms(best_[i]) + " at " +
            std::to_string(candidates_[i]);
}

bool ThreadTuner::record(double seconds) {
  const int before = threads();
  announce_ = false;
  if (candidates_.size() == 1)
    return false;
  if (!warm_) {
    warm_ = true;
    return false;
  }
  if (probing_) {
    best_[current_] = std::min(best_[current_], seconds);
    if (++stepsAtCandidate_ >= probeSteps_) {
      stepsAtCandidate_ = 0;
      if (size_t(current_ + 1) < candidates_.size())
        ++current_;
      else
        settle();
    }
    return threads() != before;
  }
  // Kept: watch for the load changing.
  ++settledSteps_;
  slowInRow_ = seconds > slowFactor_ * best_[current_] ? slowInRow_ + 1 : 0;
  if (slowInRow_ >= slowSteps_ || settledSteps_ >= reprobeEvery_)
    startProbe();
  return threads() != before;
}

} // namespace mtprt
