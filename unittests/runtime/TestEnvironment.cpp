//===- TestEnvironment.cpp - one intra-op thread for the gtest suite ------===//
//
// The models under test are tiny: with OpenMP's threads on a shared 2-core
// machine, spin-waiting costs far more than the parallelism gains (a 200-step
// training test went from ~2 s to ~110 s). One thread keeps the suite fast and
// its timings stable.
//
//===----------------------------------------------------------------------===//

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

namespace {

class SingleThreaded : public ::testing::Environment {
public:
  void SetUp() override { at::set_num_threads(1); }
};

[[maybe_unused]] ::testing::Environment *const env =
    ::testing::AddGlobalTestEnvironment(new SingleThreaded);

} // namespace
