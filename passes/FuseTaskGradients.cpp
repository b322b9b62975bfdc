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
  SmallVector<Attribute> tasks;
  int64_t flops = 0, widest = 0;
  std::optional<double> keep;
  if (auto k = strategy.getGfmKeep())
    keep = k->convertToDouble();
  for (BwdOp head : heads) {
    Value g = head.getInputGrads().front();
    grads.push_back(g);
    tasks.push_back(head.getTaskAttr());
    auto type = cast<RankedTensorType>(g.getType());
    int64_t n = type.getNumElements(), channels = type.getShape().back();
    // rfft and irfft along the channels (about 5·n·log2 each), the mask,
    // the clip's norm and scale, the weighted accumulate.
    if (keep)
      flops += int64_t(10.0 * n * std::log2(std::max<int64_t>(2, channels)));
    flops += 6 * n;
    // The complex spectrum (n/2+1 pairs per row) beside the processed copy.
    widest = std::max(widest, 2 * CostModel::bytes(type));
  }
  // GFM and the clip act first; then (features scope) the cosine probe and
  // the Gram matrix, with the processed tap gradients live and the fused ones
  // not yet made (MemoryAnalysis counts this workspace before the results).
  int64_t workspace = widest;
  if (strategy.getGradientScope() == GradientScope::features)
    workspace = std::max(workspace, cost.cosineProbeWorkspace());
  if (strategy.getGradientScope() == GradientScope::params) {
    // Per-task gradients of the top k shared layers' parameters.
    int64_t k = strategy.getScopeLayers();
    workspace += int64_t(heads.size()) * k * cost.layerParameters() *
                 CostModel::kGradientBytes;
  }

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
