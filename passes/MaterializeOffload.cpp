//===- MaterializeOffload.cpp - planned offloads into the step ------------===//

#include "passes/CostModel.h"
#include "passes/Passes.h"

#include "mlir/IR/Builders.h"

namespace mtp {
#define GEN_PASS_DEF_MATERIALIZEOFFLOAD
#include "passes/Passes.h.inc"
} // namespace mtp

using namespace mlir;
using namespace mtp;

namespace {
struct MaterializeOffloadPass
    : public mtp::impl::MaterializeOffloadBase<MaterializeOffloadPass> {
  using MaterializeOffloadBase::MaterializeOffloadBase;
  void runOnOperation() override;
};

/// The unit group an op belongs to: a task's head, or one backbone block.
/// Empty for anything but a forward or backward unit.
std::string groupOf(Operation *op) {
  std::optional<UnitRef> unit = getUnitRef(op);
  if (!unit)
    return "";
  if (unit->task)
    return ("task " + unit->task.getValue()).str();
  return "block " + std::to_string(getBlockNumber(unit->kind, unit->layer));
}

constexpr int64_t kCopyStream = 1;
} // namespace

void MaterializeOffloadPass::runOnOperation() {
  ModelOp model = getOperation();
  StepOp step = model.getStep();
  if (!step)
    return;
  Block &body = step.getBody().front();
  OpBuilder b(model.getContext());

  SmallVector<FwdOp> offloaded;
  for (FwdOp fwd : body.getOps<FwdOp>())
    if (fwd.getDecision() == Decision::Offload)
      offloaded.push_back(fwd);

  int64_t tensors = 0, bytes = 0;
  for (FwdOp fwd : offloaded) {
    std::string owner = groupOf(fwd);
    for (Value value : fwd.getOutputs()) {
      // Only what the unit's own backward reads leaves the device.
      Operation *lastForward = fwd, *firstBackward = nullptr;
      bool own = true, any = false;
      for (Operation *user : value.getUsers()) {
        if (isa<BwdOp>(user)) {
          any = true;
          own &= groupOf(user) == owner;
          if (!firstBackward || user->isBeforeInBlock(firstBackward))
            firstBackward = user;
        } else if (lastForward->isBeforeInBlock(user)) {
          lastForward = user;
        }
      }
      if (!any || !own || !firstBackward ||
          firstBackward->isBeforeInBlock(lastForward))
        continue;

      b.setInsertionPointAfter(lastForward);
      auto off = b.create<OffloadOp>(fwd.getLoc(), value.getType(), value,
                                     b.getI64IntegerAttr(kCopyStream));
      // One unit group ahead: where the group before this one starts its
      // backward.
      Operation *issue = firstBackward;
      std::string before;
      for (Operation *op = firstBackward->getPrevNode(); op;
           op = op->getPrevNode()) {
        std::string g = groupOf(op);
        if (!isa<BwdOp>(op) || g == owner)
          continue;
        if (before.empty())
          before = g;
        if (g != before)
          break;
        issue = op;
      }
      if (issue->isBeforeInBlock(off))
        issue = firstBackward;
      b.setInsertionPoint(issue);
      auto pre = b.create<PrefetchOp>(fwd.getLoc(), value.getType(), off,
                                      b.getI64IntegerAttr(kCopyStream));
      b.setInsertionPoint(firstBackward);
      b.create<WaitOp>(fwd.getLoc(), pre);
      value.replaceUsesWithIf(pre, [&](OpOperand &use) {
        return isa<BwdOp>(use.getOwner());
      });
      ++tensors;
      bytes += CostModel::bytes(cast<RankedTensorType>(value.getType()));
    }
  }
  if (remarks)
    model.emitRemark() << "offloaded " << tensors << " tensors (" << bytes
                       << " bytes) of " << offloaded.size()
                       << " units on stream " << kCopyStream
                       << ", each prefetched one unit group ahead";
}
