//===- PlanTest.cpp - the runtime reads the compiler's plan ---------------===//

#include "mtprt/Driver.h"
#include "mtprt/Plan.h"

#include "schema/plan_generated.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

using namespace mtprt;
namespace fb = mtp::fb;

namespace {

/// A plan as mtpc writes it: 2 layers, two tasks; layer 1's attention
/// offloaded, the tag head offloaded, layer 2 a checkpoint region.
std::string makePlan(unsigned version = unsigned(fb::PlanVersion::Current),
                     int64_t tap = 1, bool strategy = false,
                     double gfmKeep = 0.5) {
  flatbuffers::FlatBufferBuilder b;
  auto backbone = fb::CreateBackbone(b, b.CreateString("transformer"), 2, 16,
                                     2, 32, 40, 12, 0.1);
  std::vector<flatbuffers::Offset<fb::Task>> tasks = {
      fb::CreateTask(b, b.CreateString("cls"), b.CreateString("classify"), 2,
                     true, 4, 0, 0, 0, 1.0, b.CreateString("cross_entropy")),
      fb::CreateTask(b, b.CreateString("tag"), b.CreateString("tag"), tap,
                     false, 6, 0, 0, 0, 0.5, b.CreateString("cross_entropy"),
                     strategy ? fb::CreateLrSchedule(b, b.CreateString("linear"),
                                                     5e-4, 3)
                              : 0)};
  auto unit = [&](const char *name, const char *kind, int64_t layer,
                  int64_t block, const char *task, fb::Decision d) {
    return fb::CreateUnit(b, b.CreateString(name), b.CreateString(kind),
                          layer, block, b.CreateString(task), 100, 1000, d);
  };
  std::vector<flatbuffers::Offset<fb::Unit>> units = {
      unit("embed", "embed", 0, 0, "", fb::Decision::Keep),
      unit("attn_norm1", "attn_norm", 1, 1, "", fb::Decision::Offload),
      unit("attn_core1", "attn_core", 1, 1, "", fb::Decision::Offload),
      unit("mlp_up1", "mlp_up", 1, 2, "", fb::Decision::Keep),
      unit("head_tag", "head", 0, -1, "tag", fb::Decision::Offload),
      unit("loss_tag", "loss", 0, -1, "tag", fb::Decision::Offload),
      unit("attn_core2", "attn_core", 2, 3, "", fb::Decision::Recompute),
      unit("head_cls", "head", 0, -1, "cls", fb::Decision::Keep)};
  std::vector<fb::Region> regions = {fb::Region(3, 4)};
  auto target = fb::CreateTarget(b, b.CreateString("cpu"),
                                 b.CreateString("fp32"), 1 << 20, 1 << 20, 1,
                                 8, 16);
  flatbuffers::Offset<fb::Strategy> st;
  flatbuffers::Offset<fb::Train> train;
  if (strategy) {
    st = fb::CreateStrategy(b, b.CreateString("params"), 2, gfmKeep, 1.5, 16,
                            0.15, 0.4, b.CreateString("compressed"), 0.1, 128,
                            8, 0.9);
    train = fb::CreateTrain(
        b, 300, 7, b.CreateString("synthetic"),
        fb::CreateLrSchedule(b, b.CreateString("cosine"), 1e-3, 20), 0.05,
        0.9, 0.999, 1e-8, 10, 0);
  }
  auto plan = fb::CreatePlan(
      b, version, b.CreateString("m"), b.CreateString("m.mtp"), target,
      backbone, b.CreateVector(tasks), b.CreateVector(units),
      b.CreateVectorOfStructs(regions), 0, 0, 123456, 200000, 100000, 1e-4,
      st, train);
  fb::FinishPlanBuffer(b, plan);
  return std::string(reinterpret_cast<const char *>(b.GetBufferPointer()),
                     b.GetSize());
}

std::string errorOf(const std::string &bytes) {
  try {
    readPlan(bytes.data(), bytes.size(), "p.mtpplan");
  } catch (const std::runtime_error &e) {
    return e.what();
  }
  return "";
}

TEST(Plan, DecisionsBecomeTheSchedule) {
  std::string bytes = makePlan();
  Plan p = readPlan(bytes.data(), bytes.size(), "p.mtpplan");
  EXPECT_EQ(p.model.layers, 2);
  EXPECT_EQ(p.model.hidden, 16);
  EXPECT_DOUBLE_EQ(p.model.dropout, 0.1);
  ASSERT_EQ(p.heads.size(), 2u);
  EXPECT_EQ(p.heads[0].kind, HeadKind::Classify);
  EXPECT_EQ(p.heads[0].classes, 4);
  EXPECT_EQ(p.heads[1].tap, 1);
  EXPECT_EQ(p.heads[1].weight, 0.5);
  EXPECT_EQ(p.schedule.offloadUnits, std::vector<int64_t>({1}));
  EXPECT_EQ(p.schedule.offloadHeadList, std::vector<int64_t>({1}));
  ASSERT_EQ(p.schedule.regions.size(), 1u);
  EXPECT_EQ(p.schedule.regions[0], std::make_pair(int64_t(3), int64_t(4)));
  EXPECT_EQ(p.predictedPeakBytes, 123456);
  EXPECT_EQ(p.microBatch, 8);
  EXPECT_EQ(p.precision, "fp32");
  Program program = programFromPlan(p);
  EXPECT_EQ(program.batchSize, 16);
  EXPECT_EQ(program.train.microBatches, 2);
  EXPECT_EQ(program.predictedPeakBytes, 123456);
  EXPECT_EQ(program.schedule.offloadHeadList, p.schedule.offloadHeadList);
}

TEST(Plan, StrategyAndTrainingReachTheProgram) {
  std::string bytes = makePlan(unsigned(fb::PlanVersion::Current), 1, true);
  Program p = programFromPlan(readPlan(bytes.data(), bytes.size(), "p"));
  EXPECT_EQ(p.train.scope, GradScope::Params);
  EXPECT_EQ(p.train.paramsTopK, 2);
  EXPECT_DOUBLE_EQ(p.train.gfmKeep, 0.5);
  EXPECT_DOUBLE_EQ(p.train.clipNorm, 1.5);
  EXPECT_TRUE(p.train.gate);
  EXPECT_EQ(p.train.cosineEvery, 1); // the gate reads the cosine matrix
  EXPECT_DOUBLE_EQ(p.train.weightDecay, 0.05);
  EXPECT_EQ(p.train.backboneLr.schedule, LrSchedule::Cosine);
  EXPECT_EQ(p.train.backboneLr.warmupSteps, 20);
  EXPECT_EQ(p.train.backboneLr.totalSteps, 300);
  ASSERT_EQ(p.train.headLr.size(), 2u);
  EXPECT_EQ(p.train.headLr[0].schedule, LrSchedule::Cosine); // the train's
  EXPECT_EQ(p.train.headLr[1].schedule, LrSchedule::Linear); // its own
  EXPECT_DOUBLE_EQ(p.train.headLr[1].lr, 5e-4);
  EXPECT_DOUBLE_EQ(p.heads[1].weight, 0.5);
  EXPECT_EQ(p.steps, 300);
  EXPECT_EQ(p.seed, 7u);
  EXPECT_EQ(p.logEvery, 10);
  EXPECT_EQ(p.data, "synthetic");
  EXPECT_TRUE(p.compress);
  EXPECT_DOUBLE_EQ(p.compressTopK, 0.1);
  EXPECT_EQ(p.compressBlock, 128);
  EXPECT_DOUBLE_EQ(p.compressDecay, 0.9);
}

TEST(Plan, APlanWithoutStrategyRunsWithTheDefaults) {
  std::string bytes = makePlan();
  Program p = programFromPlan(readPlan(bytes.data(), bytes.size(), "p"));
  TrainConfig defaults;
  EXPECT_EQ(p.train.scope, defaults.scope);
  EXPECT_DOUBLE_EQ(p.train.gfmKeep, defaults.gfmKeep);
  EXPECT_TRUE(p.train.headLr.empty());
}

TEST(Plan, AStrategyOutOfRangeIsRefused) {
  std::string bytes =
      makePlan(unsigned(fb::PlanVersion::Current), 1, true, /*gfmKeep=*/0.0);
  EXPECT_NE(errorOf(bytes).find("the strategy is out of range (gfm keep 0"),
            std::string::npos)
      << errorOf(bytes);
}

TEST(Plan, BadFilesAreRefusedWithWhatToDo) {
  EXPECT_NE(errorOf(makePlan(2)).find(
                "plan p.mtpplan: plan version 2, this runtime reads version 1"),
            std::string::npos);
  EXPECT_NE(errorOf(makePlan(unsigned(fb::PlanVersion::Current), 7))
                .find("task 'tag' reads layer 7 of 2"),
            std::string::npos);
  EXPECT_NE(errorOf("layers = 2").find("not an mtpc plan"), std::string::npos);
  std::string bytes = makePlan();
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_NE(errorOf(bytes.substr(0, n)), "") << n << "-byte prefix accepted";
  // A flipped byte is refused or read within the buffer; never a crash.
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string flipped = bytes;
    flipped[i] = char(flipped[i] ^ 0x5a);
    errorOf(flipped);
  }
  try {
    loadPlan("/nonexistent/p.mtpplan");
    ADD_FAILURE() << "a missing file was read";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("cannot open it"), std::string::npos);
  }
}

} // namespace
