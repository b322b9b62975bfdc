//===- Pipelines.cpp - The mtp pass pipelines mtpc runs -------------------===//

#include "passes/Pipelines.h"

#include "dialect/MTPOps.h"
#include "passes/Passes.h"

#include "mlir/Pass/PassRegistry.h"

using namespace mlir;

void mtp::buildCheckPipeline(OpPassManager &pm, MemoryReportSink sink) {
  OpPassManager &model = pm.nest<ModelOp>();
  model.addPass(createNormalizeSpec());
  model.addPass(createExpandTrainingStep());
  model.addPass(createFuseTaskGradients());
  model.addPass(createMemoryAnalysis(std::move(sink)));
}

void mtp::buildPlanPipeline(OpPassManager &pm,
                            const PlanPipelineOptions &options,
                            MemoryReportSink sink) {
  OpPassManager &model = pm.nest<ModelOp>();
  model.addPass(createNormalizeSpec());
  model.addPass(createExpandTrainingStep());
  model.addPass(createFuseTaskGradients());
  model.addPass(createCompressCollectives());
  if (options.planMemory) {
    PlanMemoryOptions plan;
    plan.costs = options.costs;
    plan.exactFloor = options.exactFloor;
    if (options.maxNodes >= 0)
      plan.maxNodes = options.maxNodes;
    model.addPass(createPlanMemory(plan));
  }
  // The plan table reads what each unit would keep; a materialized step
  // shows the regions written out (its analysis is then the planned peak).
  if (options.materialize) {
    model.addPass(createMaterializeOffload());
    model.addPass(createMaterializeCheckpoints());
  }
  model.addPass(createMemoryAnalysis(std::move(sink)));
}

void mtp::buildMaterializePipeline(OpPassManager &pm,
                                   MemoryReportSink sink) {
  OpPassManager &model = pm.nest<ModelOp>();
  model.addPass(createMaterializeOffload());
  model.addPass(createMaterializeCheckpoints());
  model.addPass(createMemoryAnalysis(std::move(sink)));
}

void mtp::registerMTPPipelines() {
  PassPipelineRegistration<>(
      "mtp-check-pipeline",
      "mtpc check's memory estimate: the step as written, no plan",
      [](OpPassManager &pm) { buildCheckPipeline(pm); });
  PassPipelineRegistration<PlanPipelineOptions>(
      "mtp-plan-pipeline",
      "mtpc plan / --emit=step: expand, plan and analyze the training step",
      [](OpPassManager &pm, const PlanPipelineOptions &options) {
        buildPlanPipeline(pm, options);
      });
  PassPipelineRegistration<>(
      "mtp-materialize-pipeline",
      "Write a planned step's decisions into it and re-analyze",
      [](OpPassManager &pm) { buildMaterializePipeline(pm); });
}
