//===- Pipelines.h - The mtp pass pipelines mtpc runs ----------*- C++ -*-===//
//
// The pipelines `mtpc` builds for each command, in one place and registered
// with mtp-opt (as CIRCT's firtool pipelines are), so that
//   mtp-opt --mtp-plan-pipeline=materialize=true spec.mlir
// reproduces what `mtpc --emit=step` runs, pass by pass.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_PASSES_PIPELINES_H
#define MTPC_PASSES_PIPELINES_H

#include "passes/MemoryAnalysis.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

namespace mtp {

struct PlanPipelineOptions
    : public mlir::PassPipelineOptions<PlanPipelineOptions> {
  Option<bool> planMemory{
      *this, "plan-memory",
      llvm::cl::desc("Decide what to keep, recompute and offload (needs a "
                     "budget in every model)"),
      llvm::cl::init(true)};
  Option<bool> materialize{
      *this, "materialize",
      llvm::cl::desc("Write the plan into the step (checkpoint regions, "
                     "offload ops) before the final analysis"),
      llvm::cl::init(false)};
  Option<bool> exactFloor{
      *this, "exact-floor",
      llvm::cl::desc("Search for the smallest reachable peak (the error's "
                     "and the report's floor); off: mtpc search's quick "
                     "plans"),
      llvm::cl::init(true)};
  Option<int64_t> maxNodes{
      *this, "max-nodes",
      llvm::cl::desc("Branch-and-bound nodes before the planner keeps its "
                     "best plan (-1: the planner's own; mtpc search plans "
                     "each candidate with fewer first)"),
      llvm::cl::init(-1)};
  Option<std::string> costs{
      *this, "costs",
      llvm::cl::desc("Plan with the segment costs measured on the target "
                     "(mtpc profile's JSON) instead of the roofline"),
      llvm::cl::init("")};
};

/// `mtpc check`'s estimate: the step as written, no plan, analyzed.
/// Each pipeline ends in the memory analysis; a `sink` receives its reports.
void buildCheckPipeline(mlir::OpPassManager &pm,
                        MemoryReportSink sink = {});

/// `mtpc plan` / `--emit=step` / `build`: normalize, expand, the gradient
/// pipeline and collectives, the plan, optionally materialized, analyzed.
void buildPlanPipeline(mlir::OpPassManager &pm,
                       const PlanPipelineOptions &options,
                       MemoryReportSink sink = {});

/// Writes an already planned step's decisions into it and re-analyzes.
void buildMaterializePipeline(mlir::OpPassManager &pm,
                              MemoryReportSink sink = {});

/// Registers the three as mtp-check-pipeline, mtp-plan-pipeline and
/// mtp-materialize-pipeline.
void registerMTPPipelines();

} // namespace mtp

#endif // MTPC_PASSES_PIPELINES_H
