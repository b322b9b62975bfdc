//===- FuseTaskGradients.cpp - the per-task gradient pipeline op ----------===//

#include "passes/CostModel.h"
#include "passes/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/SetVector.h"

#include <cmath>

namespace mtp {
#define GEN_PASS_DEF_FUSETASKGRADIENTS
#include "passes/Passes.h.inc"
} // namespace mtp

using namespace mlir;
using namespace mtp;

namespace {
struct FuseTaskGradientsPass
    : public mtp::impl::FuseTaskGradientsBase<FuseTaskGradientsPass> {
  using FuseTaskGradientsBase::FuseTaskGradientsBase;
  void runOnOperation() override;
};
} // namespace

void FuseTaskGradientsPass::runOnOperation() {
  ModelOp model = getOperation();
  StepOp step = model.getStep();
  StrategyOp strategy = model.getStrategy();
  if (!step || !strategy)
    return; // no strategy: the plain sum of the losses
  Block &body = step.getBody().front();
  if (!body.getOps<FuseTaskGradsOp>().empty())
    return;

  SmallVector<BwdOp> heads;
  for (BwdOp bwd : body.getOps<BwdOp>())
    if (bwd.getUnit() == UnitKind::head)
      heads.push_back(bwd);
  if (heads.empty())
    return;

  CostModel cost(model);
  SmallVector<Value> grads;
  SmallVector<Type> gradTypes;
  SmallVector<Attribute> tasks;
  std::optional<double> keep;
  if (auto k = strategy.getGfmKeep())
    keep = k->convertToDouble();
  for (BwdOp head : heads) {
    Value g = head.getInputGrads().front();
    grads.push_back(g);
    gradTypes.push_back(g.getType());
    tasks.push_back(head.getTaskAttr());
  }
  const CostModel::PipelineCost pipeline =
      cost.gradientPipeline(gradTypes, keep.has_value(),
                            strategy.getGradientScope(),
                            strategy.getScopeLayers());
  const int64_t flops = pipeline.flops, workspace = pipeline.workspace;

  OpBuilder b(model.getContext());
  b.setInsertionPointAfter(heads.back());
  Builder &attrs = b;
  auto fuse = b.create<FuseTaskGradsOp>(
      heads.back().getLoc(), ValueRange(grads).getTypes(), grads,
      attrs.getArrayAttr(tasks),
      GradientScopeAttr::get(model.getContext(), strategy.getGradientScope()),
      keep ? attrs.getF64FloatAttr(*keep) : FloatAttr(),
      attrs.getF64FloatAttr(strategy.getClip() == ClipPolicy::per_task
                                ? strategy.getClipMaxNorm().convertToDouble()
                                : 0.0),
      strategy.getDgfgHiddenAttr(), attrs.getI64IntegerAttr(flops),
      attrs.getI64IntegerAttr(workspace));
  for (auto [g, fused] : llvm::zip(grads, fuse.getFused()))
    g.replaceAllUsesExcept(fused, fuse);
  if (remarks)
    model.emitRemark() << "fused the gradients of " << heads.size()
                       << " tasks at their taps (scope "
                       << stringifyGradientScope(strategy.getGradientScope())
                       << (keep ? ", GFM" : "")
                       << (strategy.getClip() == ClipPolicy::per_task
                               ? ", per-task clipping"
                               : "")
                       << "): " << flops << " FLOPs, " << workspace
                       << " bytes of workspace";

  // The runtime runs the backbone backward as one call whose roots are the
  // taps and whose grad_outputs are the fused gradients: it holds them all
  // until the backbone backward returns, after the embeddings' backward.
  Operation *last = nullptr;
  for (BwdOp bwd : body.getOps<BwdOp>())
    if (!bwd.getTaskAttr())
      last = bwd;
  if (!last)
    return;
  llvm::SetVector<Value> held;
  for (BwdOp head : heads)
    held.insert(head.getSaved().front()); // the head's input: its tap
  for (Value g : fuse.getFused())
    held.insert(g);
  b.setInsertionPointAfter(last);
  b.create<ReleaseOp>(last->getLoc(), held.getArrayRef());
}
