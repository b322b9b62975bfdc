//===- ThreadsTest.cpp - --threads auto's choices, on given timings -------===//

#include "mtprt/Threads.h"

#include <gtest/gtest.h>

using mtprt::ThreadTuner;

namespace {

/// Runs steps whose time is `time(threads)` until `n` have been recorded.
template <typename F> void run(ThreadTuner &t, int n, F time) {
  for (int i = 0; i < n; ++i)
    t.record(time(t.threads()));
}

} // namespace

TEST(ThreadTuner, CandidatesHalveFromTheDefaultToOne) {
  EXPECT_EQ(ThreadTuner(8).candidates(), (std::vector<int>{8, 4, 2, 1}));
  EXPECT_EQ(ThreadTuner(6).candidates(), (std::vector<int>{6, 3, 1}));
  EXPECT_EQ(ThreadTuner(1).candidates(), (std::vector<int>{1}));
  EXPECT_EQ(ThreadTuner(0).candidates(), (std::vector<int>{1}));
}

TEST(ThreadTuner, QuietMachineKeepsTheDefault) {
  ThreadTuner t(2);
  EXPECT_EQ(t.threads(), 2);
  // Warm-up, then two probe steps at 2 and two at 1.
  run(t, 5, [](int n) { return n == 2 ? 0.15 : 0.22; });
  EXPECT_EQ(t.threads(), 2);
  EXPECT_TRUE(t.settledAnew());
  EXPECT_NE(t.why().find("150 ms at 2, 220 ms at 1"), std::string::npos)
      << t.why();
  run(t, 50, [](int n) { return n == 2 ? 0.15 : 0.22; });
  EXPECT_EQ(t.threads(), 2);
  EXPECT_FALSE(t.settledAnew());
}

TEST(ThreadTuner, TheWarmUpStepIsNotCounted) {
  ThreadTuner t(2);
  t.record(100.0); // a slow first step at 2 threads
  run(t, 4, [](int n) { return n == 2 ? 0.15 : 0.22; });
  EXPECT_EQ(t.threads(), 2);
}

TEST(ThreadTuner, LoadedMachineDropsToOneThreadAndComesBack) {
  ThreadTuner t(2, /*probeSteps=*/2, /*reprobeEvery=*/20);
  bool loaded = true;
  auto time = [&](int n) {
    return loaded ? (n == 2 ? 0.50 : 0.21) : (n == 2 ? 0.15 : 0.22);
  };
  run(t, 5, time);
  EXPECT_EQ(t.threads(), 1);
  // The load goes: steps at one thread do not slow, so only the periodic
  // probe finds that two threads are faster again.
  loaded = false;
  run(t, 19, time);
  EXPECT_EQ(t.threads(), 1);
  run(t, 1 + 4, time);
  EXPECT_EQ(t.threads(), 2);
  EXPECT_TRUE(t.settledAnew());
}

TEST(ThreadTuner, SlowedStepsProbeAgain) {
  ThreadTuner t(2, 2, /*reprobeEvery=*/1000, /*slowSteps=*/3, 1.3);
  bool loaded = false;
  auto time = [&](int n) {
    return loaded ? (n == 2 ? 0.50 : 0.21) : (n == 2 ? 0.15 : 0.22);
  };
  run(t, 5, time);
  EXPECT_EQ(t.threads(), 2);
  loaded = true; // another process starts: three slow steps, then a probe
  run(t, 3, time);
  EXPECT_EQ(t.threads(), 2); // the probe starts at the default
  run(t, 4, time);
  EXPECT_EQ(t.threads(), 1);
  EXPECT_NE(t.why().find("at 1"), std::string::npos);
}

TEST(ThreadTuner, OneSlowStepIsNoise) {
  ThreadTuner t(2, 2, 1000, 3, 1.3);
  run(t, 5, [](int n) { return n == 2 ? 0.15 : 0.22; });
  t.record(0.9);
  run(t, 10, [](int n) { return n == 2 ? 0.15 : 0.22; });
  EXPECT_EQ(t.threads(), 2);
}

TEST(ThreadTuner, CloseTimingsKeepTheCountKeptBefore) {
  ThreadTuner t(2, 2, /*reprobeEvery=*/10);
  run(t, 5, [](int n) { return n == 2 ? 0.042 : 0.047; });
  EXPECT_EQ(t.threads(), 2);
  // The next probe finds one thread 3% faster: noise, no change.
  run(t, 10 + 4, [](int n) { return n == 2 ? 0.045 : 0.0437; });
  EXPECT_EQ(t.threads(), 2);
  EXPECT_FALSE(t.settledAnew());
  // 20% faster is a change.
  run(t, 10 + 4, [](int n) { return n == 2 ? 0.045 : 0.036; });
  EXPECT_EQ(t.threads(), 1);
}
