//===- PipelinePlan.cpp - backbone stages across processes ----------------===//
//
// docs/pipeline.md. The split is the linear partition of the backbone's
// blocks (each with the heads on its tap) that minimizes the slowest stage's
// time, which sets the pipeline's step; ties keep the earlier cut.
//
//===----------------------------------------------------------------------===//

#include "passes/PipelinePlan.h"

#include "passes/CostModel.h"

#include <algorithm>
#include <limits>

using namespace mlir;
using namespace mtp;

int64_t PipelinePlanResult::peakBytes() const {
  int64_t peak = 0;
  for (const PipelineStagePlan &s : stages)
    peak = std::max(peak, s.peakBytes);
  return peak;
}

namespace {
/// What one backbone block (with the heads on its tap) costs per micro-batch.
struct BlockCost {
  double fwd = 0, bwd = 0;
  int64_t kept = 0, params = 0, trainable = 0;
  llvm::SmallVector<int64_t> tasks;
  /// The block's output: whether its own backward keeps it anyway.
  bool outputKept = false;
};

bool usedByBackward(Value v) {
  return llvm::any_of(v.getUsers(),
                      [](Operation *u) { return isa<BwdOp>(u); });
}
} // namespace

std::optional<PipelinePlanResult> mtp::planPipeline(ModelOp model) {
  BudgetOp budget = model.getBudget();
  StepOp step = model.getStep();
  BackboneOp backbone = model.getBackbone();
  if (!budget || !step || !backbone || budget.getPipelineStages() < 2)
    return std::nullopt;
  const CostModel cm(model);
  const int64_t nblocks = 2 * int64_t(backbone.getLayers()) + 1;
  const int64_t S = std::min<int64_t>(budget.getPipelineStages(), nblocks);
  llvm::SmallVector<TaskOp> tasks(model.getTasks());
  llvm::DenseMap<Operation *, int64_t> taskIndex;
  for (auto [i, t] : llvm::enumerate(tasks))
    taskIndex[t] = int64_t(i);

  std::vector<BlockCost> blocks(nblocks);
  auto blockOf = [&](Operation *op, UnitKind unit, uint64_t layer,
                     FlatSymbolRefAttr task) -> int64_t {
    if (task)
      if (auto t = model.lookupSymbol<TaskOp>(task))
        return std::min<int64_t>(nblocks - 1, 2 * int64_t(t.getTapLayer()));
    (void)op;
    return std::clamp<int64_t>(getBlockNumber(unit, layer), 0, nblocks - 1);
  };
  for (Operation &op : step.getBody().front()) {
    if (auto fwd = dyn_cast<FwdOp>(op)) {
      const int64_t b =
          blockOf(&op, fwd.getUnit(), fwd.getLayer(), fwd.getTaskAttr());
      BlockCost &c = blocks[b];
      c.fwd += cm.opSeconds(&op);
      for (Value r : fwd.getOutputs())
        if (usedByBackward(r))
          c.kept += CostModel::bytes(r.getType());
      TaskOp task = fwd.getTaskAttr()
                        ? model.lookupSymbol<TaskOp>(fwd.getTaskAttr())
                        : TaskOp();
      const int64_t p = cm.unitParameters(fwd.getUnit(), task);
      c.params += p;
      if (task ? true : !cm.frozen(int64_t(fwd.getLayer())))
        c.trainable += p;
      if (task && fwd.getUnit() == UnitKind::head &&
          !llvm::is_contained(c.tasks, taskIndex.lookup(task)))
        c.tasks.push_back(taskIndex.lookup(task));
      if (!task)
        c.outputKept = usedByBackward(fwd.getOutput());
    } else if (auto bwd = dyn_cast<BwdOp>(op)) {
      blocks[blockOf(&op, bwd.getUnit(), bwd.getLayer(), bwd.getTaskAttr())]
          .bwd += cm.opSeconds(&op);
    }
  }

  // The linear partition: best[s][i] = the least slowest-stage time of the
  // first i blocks in s stages; cut[s][i] where its last stage starts.
  std::vector<double> prefix(nblocks + 1, 0.0);
  for (int64_t b = 0; b < nblocks; ++b)
    prefix[b + 1] = prefix[b] + blocks[b].fwd + blocks[b].bwd;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(S + 1,
                                        std::vector<double>(nblocks + 1, inf));
  std::vector<std::vector<int64_t>> cut(S + 1,
                                        std::vector<int64_t>(nblocks + 1, 0));
  best[0][0] = 0;
  for (int64_t s = 1; s <= S; ++s)
    for (int64_t i = s; i <= nblocks; ++i)
      for (int64_t j = s - 1; j < i; ++j) {
        const double t = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (t < best[s][i]) {
          best[s][i] = t;
          cut[s][i] = j;
        }
      }
  std::vector<int64_t> starts(S);
  for (int64_t s = S, i = nblocks; s >= 1; --s) {
    starts[s - 1] = cut[s][i];
    i = cut[s][i];
  }

  PipelinePlanResult out;
  out.gpipe = budget.getGpipe();
  out.replicas = budget.getReplicas();
  out.microBatches = budget.getAccumulationSteps();
  const int64_t M = out.microBatches;
  const int64_t boundary = CostModel::bytes(cm.hiddenType());
  double slowest = 0;
  for (int64_t s = 0; s < S; ++s) {
    PipelineStagePlan st;
    st.firstUnit = starts[s];
    st.lastUnit = s + 1 < S ? starts[s + 1] - 1 : nblocks - 1;
    st.boundaryBytes = boundary;
    for (int64_t b = st.firstUnit; b <= st.lastUnit; ++b) {
      const BlockCost &c = blocks[b];
      st.forwardSeconds += c.fwd;
      st.backwardSeconds += c.bwd;
      st.keptBytesPerMicroBatch += c.kept;
      st.parameters += c.params;
      st.trainableParameters += c.trainable;
      st.tasks.append(c.tasks.begin(), c.tasks.end());
    }
    llvm::sort(st.tasks);
    // The received activation is kept for the first unit's backward; the
    // sent one is the root the stage's backward starts from.
    if (s > 0)
      st.keptBytesPerMicroBatch += boundary;
    if (s + 1 < S && !blocks[st.lastUnit].outputKept)
      st.keptBytesPerMicroBatch += boundary;
    st.inFlight = out.gpipe ? M : std::min<int64_t>(M, S - s);
    st.stateBytes =
        CostModel::kWeightBytes * st.parameters +
        (CostModel::kGradientBytes + CostModel::kOptimizerBytes) *
            st.trainableParameters;
    // The boundary gradient received (or sent) in the backward is the
    // transient above the kept micro-batches.
    st.peakBytes = st.stateBytes + st.inFlight * st.keptBytesPerMicroBatch +
                   (S > 1 ? boundary : 0);
    slowest = std::max(slowest, st.forwardSeconds + st.backwardSeconds);
    out.stages.push_back(std::move(st));
  }
  out.bubble = double(S - 1) / double(M + S - 1);
  out.stepSeconds = double(M + S - 1) * slowest;
  return out;
}
