//===- BatchScheduleTest.cpp - the dynamic batch schedule's values --------===//
//
// mtprt::BatchSchedule against the source's description (docs/techniques.md
// D15) computed directly: from 32, ×(1 + step/100), capped at 512, for 2000
// steps; then ×0.98 every 500 steps, floor 32; whole micro-batches.
//
//===----------------------------------------------------------------------===//

#include "mtprt/BatchSchedule.h"

#include <gtest/gtest.h>

#include <cmath>

using mtprt::BatchSchedule;

namespace {

TEST(BatchSchedule, TheSourcesNumbers) {
  const BatchSchedule s; // the defaults are the source's
  // The ramp: 32·(1 + step/100), capped at 512 (reached at step 1500).
  for (int64_t step = 0; step < 2000; ++step) {
    const double direct = std::min(512.0, 32.0 * (1.0 + step / 100.0));
    ASSERT_EQ(s.at(step), int64_t(std::floor(direct))) << "step " << step;
  }
  EXPECT_EQ(s.at(0), 32);
  EXPECT_EQ(s.at(100), 64);
  EXPECT_EQ(s.at(1499), 511);
  EXPECT_EQ(s.at(1500), 512);
  // The decay: 512·0.98^⌊(step − 2000)/500⌋, at least 32.
  for (int64_t step = 2000; step < 200000; step += 37) {
    const double direct =
        std::max(32.0, std::floor(512.0 * std::pow(0.98, (step - 2000) / 500)));
    ASSERT_EQ(s.at(step), int64_t(direct)) << "step " << step;
  }
  EXPECT_EQ(s.at(2499), 512);
  EXPECT_EQ(s.at(2500), 501); // 512 × 0.98 = 501.76
  EXPECT_EQ(s.at(3000), 491); // 512 × 0.98² = 491.7248
  // 512·0.98^k < 32 from k = 138 on: the floor holds.
  EXPECT_EQ(s.at(2000 + 500 * 138), 32);
  EXPECT_EQ(s.at(int64_t(1) << 40), 32);
  EXPECT_EQ(s.largest(), 512);
}

TEST(BatchSchedule, WholeMicroBatches) {
  const BatchSchedule s;
  // Micro batch 8 on 2 processes: multiples of 16, rounded down.
  EXPECT_EQ(s.batch(0, 16), 32);
  EXPECT_EQ(s.batch(10, 16), 32);  // 35.2 → 35 → 32
  EXPECT_EQ(s.batch(50, 16), 48);  // 48
  EXPECT_EQ(s.batch(2500, 16), 496); // 501 → 496
  EXPECT_EQ(s.largestBatch(16), 512);
  // A per-step batch above the schedule's values: at least one micro-batch
  // on every process.
  EXPECT_EQ(s.batch(0, 48), 48);
  EXPECT_EQ(s.largestBatch(48), 480);
  for (int64_t step = 0; step < 5000; step += 13) {
    const int64_t b = s.batch(step, 24);
    EXPECT_EQ(b % 24, 0);
    EXPECT_GE(b, 24);
    EXPECT_LE(b, s.largestBatch(24));
  }
}

TEST(BatchSchedule, UserSchedulesAndEdges) {
  BatchSchedule s{/*start=*/24, /*max=*/72, /*rate=*/0.5, /*rampSteps=*/6,
                  /*decay=*/0.5, /*every=*/3, /*floor=*/24};
  const int64_t expect[] = {24, 36, 48, 60, 72, 72, 72, 72, 72, 36, 36, 36,
                            24, 24};
  for (int64_t step = 0; step < 14; ++step)
    EXPECT_EQ(s.at(step), expect[step]) << "step " << step;
  EXPECT_EQ(s.largest(), 72);
  // A ramp too short to reach its cap decays from where it ended.
  BatchSchedule shortRamp{8, 1000, 1.0, 3, 0.5, 1, 2};
  EXPECT_EQ(shortRamp.at(2), 24);
  EXPECT_EQ(shortRamp.largest(), 24);
  EXPECT_EQ(shortRamp.at(3), 24);
  EXPECT_EQ(shortRamp.at(4), 12);
  EXPECT_EQ(shortRamp.at(100), 2);
  // No ramp: the decay starts at step 0 from min(start, max).
  BatchSchedule noRamp{64, 64, 0.0, 0, 0.5, 10, 16};
  EXPECT_EQ(noRamp.at(0), 64);
  EXPECT_EQ(noRamp.at(10), 32);
  EXPECT_EQ(noRamp.at(1000), 16);
  // A large rate at a late step stays capped (no overflow).
  BatchSchedule steep{1, 100, 1e6, int64_t(1) << 40, 0.5, 1, 1};
  EXPECT_EQ(steep.at((int64_t(1) << 40) - 1), 100);
  // A floor above the ramp lifts the largest.
  BatchSchedule lifted{8, 16, 0.0, 10, 0.5, 1, 16};
  EXPECT_EQ(lifted.largest(), 16);
}

} // namespace
