//===- CompressCollectives.cpp - GSC on the gradient buckets --------------===//

#include "passes/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/FormatVariadic.h"

namespace mtp {
#define GEN_PASS_DEF_COMPRESSCOLLECTIVES
#include "passes/Passes.h.inc"
} // namespace mtp

using namespace mlir;
using namespace mtp;

/// Whether the step's buckets go compressed over `world` processes: asked
/// for, or `auto` with more than one and nothing that exchanges otherwise.
bool mtp::compressesBuckets(ModelOp model, int64_t world) {
  StrategyOp strategy = model.getStrategy();
  if (!strategy)
    return false;
  BudgetOp budget = model.getBudget();
  CollectivePolicy policy = strategy.getCollective();
  // ZeRO 2 sums plain gradients during the backward (docs/zero.md).
  const bool scattered = budget && budget.getZeroStage() >= 2;
  // SAPS exchanges the selected entries, uncompressed (docs/techniques.md
  // D12).
  const bool sparse = bool(strategy.getSapsAttr());
  return policy == CollectivePolicy::compressed ||
         (policy == CollectivePolicy::automatic && world > 1 && !scattered &&
          !sparse);
}

void mtp::setBucketsCompressed(ModelOp model, bool compress) {
  StepOp step = model.getStep();
  StrategyOp strategy = model.getStrategy();
  if (!step || !strategy)
    return;
  Builder b(model.getContext());
  for (AllReduceOp op : step.getBody().front().getOps<AllReduceOp>()) {
    if (!compress) {
      op.removeCompressedAttr();
      op.removeTopkAttr();
      op.removeBlockAttr();
      op.removeBitsAttr();
      op.removeDecayAttr();
      continue;
    }
    op.setCompressed(true);
    op.setTopkAttr(b.getF64FloatAttr(strategy.getTopk().convertToDouble()));
    op.setBlockAttr(b.getI64IntegerAttr(strategy.getQuantBlock()));
    op.setBitsAttr(b.getI64IntegerAttr(strategy.getQuantBits()));
    op.setDecayAttr(
        b.getF64FloatAttr(strategy.getResidualDecay().convertToDouble()));
  }
}

namespace {
struct CompressCollectivesPass
    : public mtp::impl::CompressCollectivesBase<CompressCollectivesPass> {
  using CompressCollectivesBase::CompressCollectivesBase;
  void runOnOperation() override {
    ModelOp model = getOperation();
    StepOp step = model.getStep();
    StrategyOp strategy = model.getStrategy();
    if (!step || !strategy)
      return;
    BudgetOp budget = model.getBudget();
    // A pipeline stage exchanges with its replicas only (pipeline = auto:
    // every gpu until the planner chooses; docs/pipeline.md).
    int64_t world = !budget                   ? 1
                    : budget.getPipelineAuto() ? budget.getGpus()
                                               : budget.getReplicas();
    CollectivePolicy policy = strategy.getCollective();
    const bool compress = compressesBuckets(model, world);
    auto buckets = step.getBody().front().getOps<AllReduceOp>();
    if (!compress) {
      if (remarks)
        model.emitRemark() << "left " << llvm::range_size(buckets)
                           << " gradient buckets uncompressed (collective = "
                           << stringifyCollectivePolicy(policy) << ", "
                           << world << " devices)";
      return;
    }
    if (remarks)
      model.emitRemark() << "compressed " << llvm::range_size(buckets)
                         << " gradient buckets: top-k "
                         << llvm::formatv("{0:P}",
                                          strategy.getTopk().convertToDouble())
                                .str()
                         << ", "
                         << strategy.getQuantBits() << "-bit blocks of "
                         << strategy.getQuantBlock();
    setBucketsCompressed(model, true);
  }
};
} // namespace
