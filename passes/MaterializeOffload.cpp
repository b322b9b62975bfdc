//===- MaterializeOffload.cpp - planned offloads into the step ------------===//

#include "passes/CostModel.h"
#include "passes/MemoryAnalysis.h"
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
    for (Value value : fwd.getOutputs()) {
      std::optional<OffloadPlacement> at = placeOffload(fwd, value);
      if (!at)
        continue;
      b.setInsertionPointAfter(at->lastForward);
      auto off = b.create<OffloadOp>(fwd.getLoc(), value.getType(), value,
                                     b.getI64IntegerAttr(kCopyStream));
      Operation *issue = at->issue, *firstBackward = at->firstBackward;
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
