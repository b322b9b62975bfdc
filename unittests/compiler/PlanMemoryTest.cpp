//===- PlanMemoryTest.cpp - the joint solver against the exact optimum ----===//
//
// A family of generated instances small enough for exhaustive search: on
// each, a budget strictly between the smallest reachable peak and the
// no-strategy peak. The solver's added time must be within 2% of the
// optimum's, and at least half of the optima must mix recompute and offload
// (else the family would not test the joint decision).
//
//===----------------------------------------------------------------------===//

#include "passes/PlanMemory.h"
#include "passes/Passes.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <chrono>

using namespace mlir;
using namespace mtp;

namespace {

struct Instance {
  int layers, lowTap, labels, budgetPercent;
};

OwningOpRef<ModuleOp> expand(MLIRContext &context, const Instance &inst,
                             int64_t memory, const char *link = "40 GBps") {
  std::string text =
      "mtp.model @m {\n"
      "  mtp.backbone transformer(layers = " + std::to_string(inst.layers) +
      ", hidden = 64, heads = 4, ffn = 128, vocab = 50, seq = 256, dropout = 0.1)\n"
      "  mtp.task @low : tag(labels = " + std::to_string(inst.labels) +
      ") from layer " + std::to_string(inst.lowTap) +
      " loss cross_entropy weight 1.0\n"
      "  mtp.task @top : classify(classes = 3) from pooled layer " +
      std::to_string(inst.layers) + " loss cross_entropy weight 1.0\n"
      // Activations dominate (long sequences, narrow layers) and the host
      // link is fast next to the compute (40 GB/s beside 1 TFLOP/s), so recompute and
      // offload cost the same order and the optima mix them.
      "  mtp.budget device \"cpu\" memory " + std::to_string(memory) +
      " B headroom 0 B link " + link +
      " gpus 1 batch 16 micro 16 precision fp32\n"
      "  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto "
      "max_latency 1.0 gfm none scope features layers 1 dgfg none recalibrate "
      "reuse 0.15 std 0.4 clip none max_norm 1.0 collective none topk 0.15 "
      "block 256 bits 8 decay 0.8\n"
      "}\n";
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(text, &context);
  EXPECT_TRUE(module);
  PassManager pm(&context);
  pm.addNestedPass<ModelOp>(createExpandTrainingStep());
  EXPECT_TRUE(succeeded(pm.run(*module)));
  return module;
}

bool mixes(const PlanResult &r) {
  bool recompute = false, offload = false;
  for (Decision d : r.decisions) {
    recompute |= d == Decision::Recompute;
    offload |= d == Decision::Offload;
  }
  return recompute && offload;
}

TEST(PlanMemory, WithinTwoPercentOfTheExactOptimum) {
  MLIRContext context;
  context.loadDialect<MTPDialect>();
  int counted = 0, mixed = 0;
  double worstGap = 0;
  for (int layers : {2, 3})
    for (int lowTap = 1; lowTap < layers; ++lowTap)
      for (int labels : {64, 1024})
        for (int percent : {15, 35, 55, 75}) {
          Instance inst{layers, lowTap, labels, percent};
          // First the range of reachable peaks with an unlimited budget.
          auto probe = expand(context, inst, int64_t(1) << 40);
          PlanResult range =
              MemoryPlanner(*probe->getOps<ModelOp>().begin()).solve();
          int64_t lo = range.minimalPeak, hi = range.keepPeak;
          if (hi <= lo + 1)
            continue;
          int64_t budget = lo + (hi - lo) * percent / 100;
          auto module = expand(context, inst, budget);
          ModelOp model = *module->getOps<ModelOp>().begin();
          MemoryPlanner planner(model);
          PlanResult exact = planner.solveExactly();
          PlanResult greedy = planner.solve();
          std::string what = "layers " + std::to_string(layers) + " tap " +
                             std::to_string(lowTap) + " labels " +
                             std::to_string(labels) + " at " +
                             std::to_string(percent) + "%";
          ASSERT_TRUE(exact.fits) << what;
          ASSERT_TRUE(greedy.fits) << what;
          EXPECT_LE(greedy.peakBytes, budget) << what;
          double gap = exact.addedSeconds > 0
                           ? greedy.addedSeconds / exact.addedSeconds - 1
                           : (greedy.addedSeconds > 0 ? 1.0 : 0.0);
          worstGap = std::max(worstGap, gap);
          EXPECT_LE(gap, 0.02) << what << ": solver " << greedy.addedSeconds
                               << " s, optimum " << exact.addedSeconds << " s";
          ++counted;
          mixed += mixes(exact);
          if (getenv("MTPC_PLAN_DEBUG")) {
            std::string d;
            for (Decision x : exact.decisions)
              d += stringifyDecision(x).str().substr(0, 1);
            std::printf("%s: optimum %s %.3g s peak %lld (budget %lld, keep %lld, min %lld)\n",
                        what.c_str(), d.c_str(), exact.addedSeconds,
                        (long long)exact.peakBytes, (long long)budget,
                        (long long)hi, (long long)lo);
          }
        }
  EXPECT_GE(counted, 16);
  EXPECT_GE(2 * mixed, counted) << mixed << " of " << counted
                                << " optima mix recompute and offload";
  RecordProperty("instances", counted);
  RecordProperty("mixed_optima", mixed);
  std::printf("%d instances, %d optima mix recompute and offload, worst gap "
              "%.4f%%\n",
              counted, mixed, 100 * worstGap);
}

/// Not a test: bench/run's plan-quality survey (run with
/// --gtest_also_run_disabled_tests). A wider family than the test above —
/// up to 4 layers (3^10 assignments), budgets every 10% of the reachable
/// range, a fast and a slow host link — one line per instance with the
/// solver's and the optimum's added time and their gap, and the solve times.
TEST(PlanMemory, DISABLED_GapSurvey) {
  MLIRContext context;
  context.loadDialect<MTPDialect>();
  for (const char *link : {"40 GBps", "4 GBps"})
    for (int layers : {2, 3, 4})
      for (int lowTap = 1; lowTap < layers; ++lowTap)
        for (int labels : {64, 1024})
          for (int percent = 10; percent < 100; percent += 10) {
            Instance inst{layers, lowTap, labels, percent};
            auto probe = expand(context, inst, int64_t(1) << 40, link);
            PlanResult range =
                MemoryPlanner(*probe->getOps<ModelOp>().begin()).solve();
            int64_t lo = range.minimalPeak, hi = range.keepPeak;
            if (hi <= lo + 1)
              continue;
            int64_t budget = lo + (hi - lo) * percent / 100;
            auto module = expand(context, inst, budget, link);
            MemoryPlanner planner(*module->getOps<ModelOp>().begin());
            auto t0 = std::chrono::steady_clock::now();
            PlanResult exact = planner.solveExactly();
            auto t1 = std::chrono::steady_clock::now();
            PlanResult greedy = planner.solve();
            auto t2 = std::chrono::steady_clock::now();
            if (!exact.fits || !greedy.fits) {
              std::printf("gap-survey link=%s layers=%d tap=%d labels=%d "
                          "percent=%d fits=%d/%d\n",
                          link, layers, lowTap, labels, percent, greedy.fits,
                          exact.fits);
              continue;
            }
            std::printf(
                "gap-survey link=%s layers=%d tap=%d labels=%d percent=%d "
                "solver_s=%.9g exact_s=%.9g peak=%lld budget=%lld "
                "solve_us=%.1f exact_us=%.1f\n",
                link, layers, lowTap, labels, percent, greedy.addedSeconds,
                exact.addedSeconds, (long long)greedy.peakBytes,
                (long long)budget,
                std::chrono::duration<double, std::micro>(t2 - t1).count(),
                std::chrono::duration<double, std::micro>(t1 - t0).count());
          }
}

TEST(PlanMemory, TaskGroupsFollowTheThreshold) {
  MLIRContext context;
  context.loadDialect<MTPDialect>();
  auto module = parseSourceString<ModuleOp>(
      "mtp.model @g {\n"
      "  mtp.backbone transformer(layers = 4, hidden = 8, heads = 2, ffn = 16, "
      "vocab = 10, seq = 4, dropout = 0.0)\n"
      "  mtp.task @a : tag(labels = 3) from layer 1 loss cross_entropy weight 1.0\n"
      "  mtp.task @b : tag(labels = 3) from layer 2 loss cross_entropy weight 1.0\n"
      "  mtp.task @c : tag(labels = 3) from layer 4 loss cross_entropy weight 1.0\n"
      "  mtp.correlate @a, @b = 0.8\n"
      "  mtp.correlate @b, @c = 0.3\n"
      "}\n",
      &context);
  ModelOp model = *module->getOps<ModelOp>().begin();
  auto groups = taskGroups(model, 0.5);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].size(), 2u);
  EXPECT_EQ(groups[1].front(), "c");
  EXPECT_EQ(taskGroups(model, 0.2).size(), 1u);
  EXPECT_EQ(taskGroups(model, 0.9).size(), 3u);
}

} // namespace
