//===- MaterializeCheckpoints.cpp - planned regions into the step ---------===//

#include "passes/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

namespace mtp {
#define GEN_PASS_DEF_MATERIALIZECHECKPOINTS
#include "passes/Passes.h.inc"
} // namespace mtp

using namespace mlir;
using namespace mtp;

namespace {
struct MaterializeCheckpointsPass
    : public mtp::impl::MaterializeCheckpointsBase<MaterializeCheckpointsPass> {
  using MaterializeCheckpointsBase::MaterializeCheckpointsBase;
  void runOnOperation() override;
};

/// Fills `recompute`'s body with the units again (without their plan: the
/// re-run's units are the same units) and yields the clones of `yielded`.
void fillRecompute(OpBuilder &b, RecomputeOp recompute, ArrayRef<FwdOp> units,
                   ArrayRef<Value> yielded) {
  Block *body = new Block();
  recompute.getBody().push_back(body);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToEnd(body);
  IRMapping mapping;
  for (FwdOp fwd : units) {
    auto clone = cast<FwdOp>(b.clone(*fwd, mapping));
    clone.removeDecisionAttr();
    clone.removeRegionAttr();
  }
  SmallVector<Value> clones;
  for (Value v : yielded)
    clones.push_back(mapping.lookup(v));
  b.create<YieldOp>(recompute.getLoc(), clones);
}

} // namespace

void MaterializeCheckpointsPass::runOnOperation() {
  ModelOp model = getOperation();
  StepOp step = model.getStep();
  if (!step)
    return;
  Block &body = step.getBody().front();

  llvm::MapVector<int64_t, SmallVector<FwdOp>> regions;
  for (FwdOp fwd : body.getOps<FwdOp>())
    if (std::optional<uint64_t> r = fwd.getRegion())
      regions[*r].push_back(fwd);

  OpBuilder b(model.getContext());
  int64_t movedUnits = 0, recomputedTensors = 0;
  for (auto &[index, units] : regions) {
    movedUnits += units.size();
    llvm::DenseSet<Operation *> inside;
    llvm::DenseSet<int64_t> blocks;
    for (FwdOp fwd : units) {
      inside.insert(fwd);
      blocks.insert(getBlockNumber(fwd.getUnit(), fwd.getLayer()));
    }
    auto isRegionBackward = [&](Operation *op) {
      auto bwd = dyn_cast<BwdOp>(op);
      return bwd && !bwd.getTaskAttr() &&
             blocks.count(getBlockNumber(bwd.getUnit(), bwd.getLayer()));
    };
    // The boundary: what the units read from outside. What leaves: what
    // anything but the region's own backward reads.
    llvm::SetVector<Value> boundary, outputs, interiorSaved;
    for (FwdOp fwd : units) {
      for (Value in : fwd.getInputs())
        if (!inside.count(in.getDefiningOp()))
          boundary.insert(in);
      for (Value out : fwd.getOutputs())
        for (Operation *user : out.getUsers()) {
          if (inside.count(user))
            continue;
          if (isRegionBackward(user))
            interiorSaved.insert(out);
          else
            outputs.insert(out);
        }
    }
    // A tensor the rest of the step keeps anyway needs no recompute.
    SmallVector<Value> recomputed;
    for (Value v : interiorSaved)
      if (!outputs.contains(v))
        recomputed.push_back(v);
    // The re-run also re-creates the region's output, which its backward
    // holds (as the root it differentiates) until it ends.
    Value regionOutput = units.back().getOutput();

    // Forward: the units move into the checkpoint.
    b.setInsertionPoint(units.front());
    auto checkpoint = b.create<CheckpointOp>(
        units.front().getLoc(), ValueRange(outputs.getArrayRef()).getTypes(),
        b.getI64IntegerAttr(index), boundary.getArrayRef());
    Block *fwdBody = new Block();
    checkpoint.getBody().push_back(fwdBody);
    for (FwdOp fwd : units)
      fwd->moveBefore(fwdBody, fwdBody->end());
    b.setInsertionPointToEnd(fwdBody);
    b.create<YieldOp>(checkpoint.getLoc(), outputs.getArrayRef());
    for (auto [value, result] :
         llvm::zip(SmallVector<Value>(outputs.begin(), outputs.end()),
                   checkpoint.getOutputs()))
      value.replaceUsesWithIf(result, [&](OpOperand &use) {
        return !checkpoint->isProperAncestor(use.getOwner());
      });

    // Backward: re-run the units right before the region's first backward
    // unit and hand its backward what it saved.
    Operation *firstBackward = nullptr;
    for (Operation &op : body)
      if (isRegionBackward(&op)) {
        firstBackward = &op;
        break;
      }
    if (!firstBackward || recomputed.empty())
      continue;
    recomputedTensors += recomputed.size();
    b.setInsertionPoint(firstBackward);
    SmallVector<Value> boundaryOutside;
    for (Value v : boundary)
      boundaryOutside.push_back(v);
    // Yielded: what the backward takes, then the re-created output.
    SmallVector<Type> types(ValueRange(recomputed).getTypes());
    types.push_back(regionOutput.getType());
    auto recompute = b.create<RecomputeOp>(firstBackward->getLoc(), types,
                                           b.getI64IntegerAttr(index),
                                           /*partial=*/nullptr,
                                           boundaryOutside);
    SmallVector<Value> yielded(recomputed);
    yielded.push_back(regionOutput);
    fillRecompute(b, recompute, units, yielded);
    for (auto [value, result] : llvm::zip(recomputed, recompute.getSaved()))
      value.replaceUsesWithIf(result, [&](OpOperand &use) {
        return isRegionBackward(use.getOwner());
      });
    Operation *lastBackward = firstBackward;
    for (Operation *op = firstBackward; op; op = op->getNextNode())
      if (isRegionBackward(op))
        lastBackward = op;
    b.setInsertionPointAfter(lastBackward);
    b.create<ReleaseOp>(recompute.getLoc(),
                        ValueRange{recompute.getSaved().back()});
  }

  // Tensor grain: a block's projection units planned recompute without a
  // region stay in the forward; a partial mtp.recompute re-runs them from
  // the block's input right before the first backward unit that reads
  // their outputs, and every backward unit reads the re-created ones.
  llvm::MapVector<int64_t, SmallVector<FwdOp>> partial;
  for (FwdOp fwd : body.getOps<FwdOp>())
    if (fwd.getDecision() == Decision::Recompute && !fwd.getRegion() &&
        !fwd.getTaskAttr())
      partial[getBlockNumber(fwd.getUnit(), fwd.getLayer())].push_back(fwd);
  int64_t partialTensors = 0;
  for (auto &[block, units] : partial) {
    llvm::DenseSet<Operation *> inside;
    for (FwdOp fwd : units)
      inside.insert(fwd);
    llvm::SetVector<Value> boundary;
    SmallVector<Value> recomputed;
    for (FwdOp fwd : units) {
      for (Value in : fwd.getInputs())
        if (!inside.count(in.getDefiningOp()))
          boundary.insert(in);
      if (llvm::any_of(fwd.getOutput().getUsers(),
                       [](Operation *u) { return isa<BwdOp>(u); }))
        recomputed.push_back(fwd.getOutput());
    }
    Operation *firstBackward = nullptr;
    for (Operation &op : body)
      if (isa<BwdOp>(op) && llvm::any_of(op.getOperands(), [&](Value v) {
            return llvm::is_contained(recomputed, v);
          })) {
        firstBackward = &op;
        break;
      }
    if (!firstBackward)
      continue;
    partialTensors += recomputed.size();
    b.setInsertionPoint(firstBackward);
    auto recompute = b.create<RecomputeOp>(
        firstBackward->getLoc(), ValueRange(recomputed).getTypes(),
        b.getI64IntegerAttr(block), b.getUnitAttr(), boundary.getArrayRef());
    fillRecompute(b, recompute, units, recomputed);
    for (auto [value, result] : llvm::zip(recomputed, recompute.getSaved()))
      value.replaceUsesWithIf(result, [&](OpOperand &use) {
        return isa<BwdOp>(use.getOwner());
      });
  }
  if (remarks)
    model.emitRemark() << "materialized " << regions.size()
                       << " checkpoint regions: " << movedUnits
                       << " forward units, " << recomputedTensors
                       << " saved tensors recomputed before their backward; "
                       << partialTensors << " projection outputs of "
                       << partial.size()
                       << " blocks recomputed at their first backward use";
}
