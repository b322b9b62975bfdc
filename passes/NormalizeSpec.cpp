//===- NormalizeSpec.cpp - canonical order of a spec-level model ----------===//

#include "passes/Passes.h"

#include "passes/CostModel.h"

#include "llvm/ADT/STLExtras.h"

namespace mtp {
#define GEN_PASS_DEF_NORMALIZESPEC
#include "passes/Passes.h.inc"
} // namespace mtp

using namespace mlir;
using namespace mtp;

namespace {
struct NormalizeSpecPass
    : public mtp::impl::NormalizeSpecBase<NormalizeSpecPass> {
  void runOnOperation() override;
  LogicalResult resolveAttention(ModelOp model);
  LogicalResult resolvePointwise(ModelOp model);
  void resolveAdapters(ModelOp model);
};
} // namespace

/// Section of the canonical order; ops of other dialects stay at the end.
static int section(Operation *op) {
  if (isa<BackboneOp>(op))
    return 0;
  if (isa<TaskOp>(op))
    return 1;
  if (isa<CorrelateOp>(op))
    return 2;
  if (isa<BudgetOp>(op))
    return 3;
  return 4;
}

void NormalizeSpecPass::runOnOperation() {
  ModelOp model = getOperation();
  Block &body = model.getBody().front();

  // Task order is the order heads run in forward: by tap layer, stable.
  SmallVector<TaskOp> tasks(model.getTasks());
  std::stable_sort(tasks.begin(), tasks.end(), [](TaskOp a, TaskOp b) {
    return a.getTapLayer() < b.getTapLayer();
  });
  llvm::DenseMap<StringAttr, unsigned> taskRank;
  for (TaskOp task : tasks)
    taskRank[task.getSymNameAttr()] = taskRank.size();
  auto rank = [&](FlatSymbolRefAttr ref) {
    auto it = taskRank.find(ref.getAttr());
    return it == taskRank.end() ? ~0u : it->second;
  };

  // Name each correlated pair in task order.
  for (CorrelateOp corr : body.getOps<CorrelateOp>()) {
    if (rank(corr.getLhsAttr()) <= rank(corr.getRhsAttr()))
      continue;
    FlatSymbolRefAttr lhs = corr.getLhsAttr();
    corr.setLhsAttr(corr.getRhsAttr());
    corr.setRhsAttr(lhs);
  }

  // One total key per op; stable_sort keeps source order among equals.
  using Key = std::tuple<int, unsigned, unsigned>;
  auto key = [&](Operation *op) -> Key {
    if (auto task = dyn_cast<TaskOp>(op))
      return {section(op), taskRank.lookup(task.getSymNameAttr()), 0};
    if (auto corr = dyn_cast<CorrelateOp>(op))
      return {section(op), rank(corr.getLhsAttr()), rank(corr.getRhsAttr())};
    return {section(op), 0, 0};
  };
  SmallVector<Operation *> ops;
  for (Operation &op : body)
    ops.push_back(&op);
  SmallVector<Operation *> sorted(ops);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](Operation *a, Operation *b) { return key(a) < key(b); });

  for (Operation *op : sorted)
    op->moveBefore(&body, body.end());

  if (failed(resolveAttention(model)) || failed(resolvePointwise(model)))
    return signalPassFailure();
  resolveAdapters(model);
}

/// `bottleneck auto`: the width whose adapter is nearest 0.1% of the
/// backbone's parameters (mtprt::AdapterConfig::bottleneckFor).
void NormalizeSpecPass::resolveAdapters(ModelOp model) {
  StrategyOp strategy = model.getStrategy();
  AdaptersAttr adapters = strategy ? strategy.getAdaptersAttr() : AdaptersAttr();
  if (!adapters || adapters.getBottleneck() != 0)
    return;
  mtprt::AdapterConfig c = adapters.getConfig();
  const CostModel cost(model);
  c.bottleneck = c.bottleneckFor(model.getBackbone().getHidden(),
                                 cost.parameters().backbone);
  strategy.setAdaptersAttr(AdaptersAttr::get(model.getContext(), c));
}

/// The attention kind, picked where the spec left it out: fused wherever a
/// fused kernel serves the dropout on the device (without a budget the
/// model is costed on the CPU).
LogicalResult NormalizeSpecPass::resolveAttention(ModelOp model) {
  BackboneOp bb = model.getBackbone();
  const AttentionKind fitting = CostModel::fittingAttention(model);
  if (std::optional<AttentionKind> kind = bb.getAttention()) {
    if (*kind == AttentionKind::fused && fitting != AttentionKind::fused) {
      BudgetOp budget = model.getBudget();
      return bb.emitOpError("attention fused needs dropout = 0 on device '")
             << (budget ? budget.getDevice() : StringRef("cpu"))
             << "': the fused CPU kernel has no dropout";
    }
    return success();
  }
  bb.setAttention(fitting);
  return success();
}

/// The pointwise kind, picked where the spec left it out: fused wherever
/// the model trains in fp32.
LogicalResult NormalizeSpecPass::resolvePointwise(ModelOp model) {
  BackboneOp bb = model.getBackbone();
  const PointwiseKind fitting = CostModel::fittingPointwise(model);
  if (std::optional<PointwiseKind> kind = bb.getPointwise()) {
    if (*kind == PointwiseKind::fused && fitting != PointwiseKind::fused)
      return bb.emitOpError("pointwise fused needs precision fp32: the fused "
                            "norm and GELU kernels do not run under autocast");
    return success();
  }
  bb.setPointwise(fitting);
  return success();
}
