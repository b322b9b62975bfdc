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
    // A pipeline stage exchanges with its replicas only.
    int64_t world = budget ? budget.getReplicas() : 1;
    CollectivePolicy policy = strategy.getCollective();
    // ZeRO 2 sums plain gradients during the backward (docs/zero.md).
    const bool scattered = budget && budget.getZeroStage() >= 2;
    // SAPS exchanges the selected entries, uncompressed (docs/techniques.md
    // D12).
    const bool sparse = bool(strategy.getSapsAttr());
    bool compress =
        policy == CollectivePolicy::compressed ||
        (policy == CollectivePolicy::automatic && world > 1 && !scattered &&
         !sparse);
    auto buckets = step.getBody().front().getOps<AllReduceOp>();
    if (!compress) {
      if (remarks)
        model.emitRemark() << "left " << llvm::range_size(buckets)
                           << " gradient buckets uncompressed (collective = "
                           << stringifyCollectivePolicy(policy) << ", "
                           << world << " devices)";
      return;
    }
    Builder b(model.getContext());
    if (remarks)
      model.emitRemark() << "compressed " << llvm::range_size(buckets)
                         << " gradient buckets: top-k "
                         << llvm::formatv("{0:P}",
                                          strategy.getTopk().convertToDouble())
                                .str()
                         << ", "
                         << strategy.getQuantBits() << "-bit blocks of "
                         << strategy.getQuantBlock();
    for (AllReduceOp op : buckets) {
      op.setCompressed(true);
      op.setTopkAttr(b.getF64FloatAttr(strategy.getTopk().convertToDouble()));
      op.setBlockAttr(b.getI64IntegerAttr(strategy.getQuantBlock()));
      op.setBitsAttr(b.getI64IntegerAttr(strategy.getQuantBits()));
      op.setDecayAttr(
          b.getF64FloatAttr(strategy.getResidualDecay().convertToDouble()));
    }
  }
};
} // namespace
