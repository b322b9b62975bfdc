//===- PlanFileTest.cpp - the flatbuffer plan: written, verified, refused -===//

#include "passes/MemoryAnalysis.h"
#include "passes/PlanFile.h"
#include "passes/Passes.h"

#include "mtprt/PlanFrame.h"
#include "schema/plan_generated.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mtp;

namespace {

/// A tiny two-task model, expanded and planned, as `mtpc plan` sees it.
class PlanFileTest : public ::testing::Test {
protected:
  void SetUp() override {
    context.loadDialect<MTPDialect>();
    module = parseSourceString<ModuleOp>(
        "mtp.model @m {\n"
        "  mtp.backbone transformer(layers = 2, hidden = 8, heads = 2, "
        "ffn = 16, vocab = 10, seq = 4, dropout = 0.1)\n"
        "  mtp.task @lo : tag(labels = 3) from layer 1 loss cross_entropy "
        "weight 1.0\n"
        "  mtp.task @hi : classify(classes = 2) from pooled layer 2 loss "
        "cross_entropy weight 0.5\n"
        "  mtp.budget device \"cpu\" memory 1 GiB headroom 0 B link 10 GBps "
        "gpus 1 batch 2 micro 2 precision fp32\n"
        "}\n",
        &context);
    ASSERT_TRUE(module);
    PassManager pm(&context);
    pm.addNestedPass<ModelOp>(createExpandTrainingStep());
    pm.addNestedPass<ModelOp>(createPlanMemory());
    ASSERT_TRUE(succeeded(pm.run(*module)));
    model = *module->getOps<ModelOp>().begin();
    report = analyzeMemory(model);
    bytes = serializePlan(model, report, "m.mtp");
  }

  static std::string printed(llvm::StringRef data, std::string *error) {
    std::string out;
    llvm::raw_string_ostream os(out);
    if (llvm::Error err = printPlanFile(data, os))
      *error = llvm::toString(std::move(err));
    return out;
  }

  MLIRContext context;
  OwningOpRef<ModuleOp> module;
  ModelOp model;
  MemoryReport report;
  std::string bytes;
};

TEST_F(PlanFileTest, RoundTripsTheModelAndTheUnits) {
  // The frame: magic, version, CRC-32 and length, then the flatbuffer.
  ASSERT_GT(bytes.size(), mtprt::kPlanFrameBytes);
  EXPECT_EQ(bytes.substr(0, 8), "MTPPLAN\n");
  const auto *flat =
      reinterpret_cast<const uint8_t *>(bytes.data()) + mtprt::kPlanFrameBytes;
  const size_t flatSize = bytes.size() - mtprt::kPlanFrameBytes;
  EXPECT_EQ(bytes, mtprt::framePlan(flat, flatSize));
  flatbuffers::Verifier verifier(flat, flatSize);
  ASSERT_TRUE(fb::VerifyPlanBuffer(verifier));
  const fb::Plan *plan = getPlan(bytes);
  EXPECT_EQ(plan, fb::GetPlan(flat));
  EXPECT_EQ(plan->version(), unsigned(fb::PlanVersion::Current));
  EXPECT_EQ(plan->backbone()->hidden(), 8);
  ASSERT_EQ(plan->tasks()->size(), 2u);
  EXPECT_EQ(plan->tasks()->Get(1)->name()->str(), "hi");
  EXPECT_EQ(plan->tasks()->Get(1)->classes(), 2);
  EXPECT_DOUBLE_EQ(plan->tasks()->Get(1)->weight(), 0.5);
  ASSERT_EQ(plan->units()->size(), report.units.size());
  for (auto [u, unit] : llvm::zip(*plan->units(), report.units)) {
    EXPECT_EQ(u->name()->str(), unit.op.getUnitName());
    EXPECT_EQ(u->saved_bytes(), unit.savedBytes);
  }
  EXPECT_EQ(plan->target()->usable_bytes(), int64_t(1) << 30);

  std::string error;
  std::string text = printed(bytes, &error);
  EXPECT_EQ(error, "");
  EXPECT_NE(text.find("plan v" + std::to_string(mtprt::kPlanVersion) +
                      " for model 'm' from m.mtp"),
            std::string::npos)
      << text;
}

TEST_F(PlanFileTest, AnotherVersionIsRefused) {
  // A version-1 plan: the bare flatbuffer.
  std::string error;
  printed(bytes.substr(mtprt::kPlanFrameBytes), &error);
  const std::string current = std::to_string(mtprt::kPlanVersion);
  EXPECT_NE(error.find("plan version 1 (a bare flatbuffer, written before "
                       "plans carried a checksum); this mtpc and runtime read "
                       "version " + current),
            std::string::npos)
      << error;
  // Version 2 (the kinds as strings) and a version from a newer mtpc.
  for (uint32_t version : {2u, mtprt::kPlanVersion + 1}) {
    std::string other = bytes;
    other[8] = char(version);
    printed(other, &error);
    EXPECT_NE(error.find("plan version " + std::to_string(version) +
                         "; this mtpc and runtime read version " + current),
              std::string::npos)
        << error;
  }
}

TEST_F(PlanFileTest, EveryTruncationAndFlippedByteIsRefused) {
  // Every prefix and every single-byte change is refused (the frame's
  // fields and the CRC-32; once 62% of flips were accepted).
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::string error;
    printed(llvm::StringRef(bytes.data(), n), &error);
    EXPECT_NE(error, "") << "a " << n << "-byte prefix was accepted";
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string flipped = bytes;
    flipped[i] = char(flipped[i] ^ 0x5a);
    std::string error;
    printed(flipped, &error);
    EXPECT_NE(error, "") << "a flip at byte " << i << " was accepted";
  }
}

TEST_F(PlanFileTest, InspectChecksTheFieldsAsTheRuntimeDoes) {
  // A forged plan (its CRC matches) with 2^20 layers: once printed by
  // `mtpc inspect` and OOM-killed when run; now refused by both, with the
  // runtime's own checks (mtprt::checkPlan).
  flatbuffers::FlatBufferBuilder b;
  auto backbone = fb::CreateBackbone(b, fb::BackboneKind::transformer,
                                     int64_t(1) << 20, 8, 2, 16, 10, 4, 0.1);
  std::vector<flatbuffers::Offset<fb::Task>> tasks = {fb::CreateTask(
      b, b.CreateString("t"), fb::HeadKind::classify, 1, true, 2, 0, 0, 0,
      1.0, fb::LossKind::cross_entropy)};
  std::vector<flatbuffers::Offset<fb::Unit>> units;
  fb::FinishPlanBuffer(
      b, fb::CreatePlan(b, unsigned(fb::PlanVersion::Current),
                        b.CreateString("m"), b.CreateString("m.mtp"), 0,
                        backbone, b.CreateVector(tasks), b.CreateVector(units)));
  const std::string forged = mtprt::framePlan(b.GetBufferPointer(), b.GetSize());
  std::string error;
  printed(forged, &error);
  EXPECT_NE(error.find("field backbone.layers: 1048576 is out of [1, 1024]"),
            std::string::npos)
      << error;
}

TEST_F(PlanFileTest, EnumsOutOfRangeAreRefusedByName) {
  // The flatbuffers verifier does not range-check enums; the plan's reader
  // does, naming the field and the values it takes.
  flatbuffers::FlatBufferBuilder b;
  auto backbone = fb::CreateBackbone(b, fb::BackboneKind::transformer, 2, 8, 2,
                                     16, 10, 4, 0.1);
  std::vector<flatbuffers::Offset<fb::Task>> tasks = {fb::CreateTask(
      b, b.CreateString("t"), static_cast<fb::HeadKind>(9), 1, true, 2, 0, 0,
      0, 1.0, fb::LossKind::cross_entropy)};
  std::vector<flatbuffers::Offset<fb::Unit>> units;
  fb::FinishPlanBuffer(
      b, fb::CreatePlan(b, unsigned(fb::PlanVersion::Current),
                        b.CreateString("m"), b.CreateString("m.mtp"), 0,
                        backbone, b.CreateVector(tasks), b.CreateVector(units)));
  std::string error;
  printed(mtprt::framePlan(b.GetBufferPointer(), b.GetSize()), &error);
  EXPECT_NE(error.find("field task 't' (tasks[0]).head: 9 is none of "
                       "classify, tag, span, decoder"),
            std::string::npos)
      << error;
}

} // namespace
