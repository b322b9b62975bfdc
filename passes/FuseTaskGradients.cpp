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

  // A head on a no-grad layer (the backbone's freeze) makes no gradient at
  // its tap: it takes no part.
  SmallVector<BwdOp> heads;
  BwdOp lastHead; // the fused op runs after every head's backward
  for (BwdOp bwd : body.getOps<BwdOp>()) {
    if (bwd.getUnit() != UnitKind::head)
      continue;
    lastHead = bwd;
    if (!bwd.getInputGrads().empty())
      heads.push_back(bwd);
  }
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
                            strategy.getScopeLayers(),
                            strategy.getClip() == ClipPolicy::per_task);
  const int64_t flops = pipeline.flops, workspace = pipeline.workspace;

  // One fused gradient per tap layer (Σ α_t ĝ_t over the tasks reading it),
  // in the order the heads first reach each tap: what the runtime hands the
  // backbone backward as grad_outputs.
  llvm::StringMap<int64_t> tapOf;
  for (TaskOp t : model.getTasks())
    tapOf[t.getSymName()] = t.getTapLayer();
  SmallVector<int64_t> taps;
  SmallVector<Type> fusedTypes;
  SmallVector<unsigned> groupOf; // head index -> its tap's result
  for (auto [i, head] : llvm::enumerate(heads)) {
    int64_t tap = tapOf.lookup(head.getTaskAttr().getValue());
    auto it = llvm::find(taps, tap);
    if (it == taps.end()) {
      groupOf.push_back(taps.size());
      taps.push_back(tap);
      fusedTypes.push_back(gradTypes[i]);
    } else {
      groupOf.push_back(it - taps.begin());
    }
  }

  OpBuilder b(model.getContext());
  b.setInsertionPointAfter(lastHead);
  Builder &attrs = b;
  auto fuse = b.create<FuseTaskGradsOp>(
      heads.back().getLoc(), fusedTypes, grads,
      attrs.getArrayAttr(tasks),
      GradientScopeAttr::get(model.getContext(), strategy.getGradientScope()),
      keep ? attrs.getF64FloatAttr(*keep) : FloatAttr(),
      attrs.getF64FloatAttr(strategy.getClip() == ClipPolicy::per_task
                                ? strategy.getClipMaxNorm().convertToDouble()
                                : 0.0),
      strategy.getDgfgHiddenAttr(), attrs.getI64IntegerAttr(flops),
      attrs.getI64IntegerAttr(workspace));
  // Each tap's sum of head gradients becomes its fused gradient: the head
  // gradients leave every mtp.add_grads (the tap's one fused gradient takes
  // their place once), and a sum left with one term is that term.
  llvm::SetVector<AddGradsOp> sums;
  for (auto [i, g] : llvm::enumerate(grads)) {
    Value fused = fuse.getFused()[groupOf[i]];
    for (OpOperand &use : llvm::make_early_inc_range(g.getUses())) {
      Operation *user = use.getOwner();
      if (user == fuse)
        continue;
      if (auto sum = dyn_cast<AddGradsOp>(user)) {
        sums.insert(sum);
        continue;
      }
      use.set(fused);
    }
  }
  llvm::DenseSet<Value> headGrads(grads.begin(), grads.end());
  for (AddGradsOp sum : sums) {
    SmallVector<Value> terms;
    llvm::SetVector<Value> fusedTerms;
    for (Value v : sum.getGrads()) {
      if (!headGrads.count(v)) {
        terms.push_back(v);
        continue;
      }
      unsigned i = llvm::find(grads, v) - grads.begin();
      fusedTerms.insert(fuse.getFused()[groupOf[i]]);
    }
    llvm::append_range(terms, fusedTerms);
    if (terms.size() == 1) {
      sum.getSum().replaceAllUsesWith(terms.front());
      sum.erase();
      continue;
    }
    sum->setOperands(terms);
  }
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

  // At the params scope each head's backward is a partial one that keeps
  // the graph (the backbone backward runs through the heads again, from
  // Σ α_t loss_t): the heads' and losses' saved tensors live through the
  // fuse op and go at the backbone backward's start.
  if (strategy.getGradientScope() == GradientScope::params) {
    llvm::SetVector<Value> retained;
    for (BwdOp bwd : body.getOps<BwdOp>())
      if (bwd.getTaskAttr())
        for (Value v : bwd.getSaved())
          if (auto fwd = v.getDefiningOp<FwdOp>(); fwd && fwd.getTaskAttr())
            retained.insert(v);
    if (!retained.empty()) {
      b.setInsertionPointAfter(fuse);
      b.create<ReleaseOp>(fuse.getLoc(), retained.getArrayRef());
    }
  }

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
