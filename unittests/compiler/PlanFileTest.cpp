//===- PlanFileTest.cpp - the flatbuffer plan: written, verified, refused -===//

#include "passes/MemoryAnalysis.h"
#include "passes/PlanFile.h"
#include "passes/Passes.h"

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
  flatbuffers::Verifier verifier(
      reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size());
  ASSERT_TRUE(fb::VerifyPlanBuffer(verifier));
  const fb::Plan *plan = fb::GetPlan(bytes.data());
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
  EXPECT_NE(text.find("plan v1 for model 'm' from m.mtp"), std::string::npos)
      << text;
}

TEST_F(PlanFileTest, AnotherVersionIsRefused) {
  flatbuffers::FlatBufferBuilder b;
  fb::FinishPlanBuffer(b, fb::CreatePlan(b, unsigned(fb::PlanVersion::Current) + 1));
  std::string error;
  printed(llvm::StringRef(reinterpret_cast<const char *>(b.GetBufferPointer()),
                          b.GetSize()),
          &error);
  EXPECT_NE(error.find("plan version 2, this mtpc reads version 1"),
            std::string::npos)
      << error;
}

TEST_F(PlanFileTest, NoTruncationOrFlippedByteCrashes) {
  // Every prefix is refused; every single-byte change is refused or read
  // back within the buffer (the verifier bounds every offset).
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::string error;
    printed(llvm::StringRef(bytes.data(), n), &error);
    EXPECT_NE(error, "") << "a " << n << "-byte prefix was accepted";
  }
  int refused = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string flipped = bytes;
    flipped[i] = char(flipped[i] ^ 0x5a);
    std::string error;
    printed(flipped, &error);
    refused += !error.empty();
  }
  EXPECT_GT(refused, 0);
}

} // namespace
