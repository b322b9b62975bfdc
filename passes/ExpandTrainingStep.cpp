//===- ExpandTrainingStep.cpp - the spec as one explicit step -------------===//

#include "passes/CostModel.h"
#include "passes/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"

namespace mtp {
#define GEN_PASS_DEF_EXPANDTRAININGSTEP
#include "passes/Passes.h.inc"
} // namespace mtp

using namespace mlir;
using namespace mtp;

namespace {

struct ExpandTrainingStepPass
    : public mtp::impl::ExpandTrainingStepBase<ExpandTrainingStepPass> {
  void runOnOperation() override;
};

/// A forward unit as built, remembered for its backward.
struct Emitted {
  FwdOp op;
  UnitCost cost;
};

class StepBuilder {
public:
  StepBuilder(ModelOp model, OpBuilder &builder)
      : model(model), cost(model), b(builder), loc(model.getLoc()) {}

  void build();

private:
  Emitted forward(UnitKind kind, int64_t layer, TaskOp task,
                  ValueRange inputs, Location at) {
    // The final norm belongs to layer L (its parameters and its freeze).
    const int64_t owner =
        task ? -1
             : kind == UnitKind::final_norm ? model.getBackbone().getLayers()
                                            : layer;
    UnitCost c = cost.unit(kind, task, owner);
    SmallVector<Type> types{c.output};
    SmallVector<Attribute> names;
    for (const SavedTensor &saved : c.saved) {
      types.push_back(saved.type);
      names.push_back(b.getStringAttr(saved.name));
    }
    auto op = b.create<FwdOp>(
        at, types, UnitKindAttr::get(b.getContext(), kind),
        b.getI64IntegerAttr(layer),
        task ? FlatSymbolRefAttr::get(task.getSymNameAttr()) : nullptr,
        inputs, b.getI64IntegerAttr(c.fwdFlops),
        b.getI64IntegerAttr(c.fwdWorkspace),
        names.empty() ? nullptr : b.getArrayAttr(names),
        /*decision=*/nullptr, /*region=*/nullptr);
    // Below the no-grad top nothing carries a gradient.
    if (!task && owner <= cost.noGradTop())
      noGrad.insert(op.getOutput());
    return {op, std::move(c)};
  }

  /// The backward of `unit`, given the gradient(s) of its output. Returns
  /// one value per input, in input order: its gradient, or null where the
  /// input has none (token ids, labels, a no-grad layer's output).
  SmallVector<Value> backward(const Emitted &unit, ValueRange grads) {
    FwdOp fwd = unit.op;
    SmallVector<Value> saved;
    if (unit.cost.backwardNeedsInput)
      saved.push_back(fwd.getInputs().front());
    if (unit.cost.backwardNeedsOutput)
      saved.push_back(fwd.getOutput());
    llvm::append_range(saved, fwd.getSaved());
    SmallVector<Type> gradTypes;
    SmallVector<bool> hasGrad;
    for (Value input : fwd.getInputs()) {
      hasGrad.push_back(isa<FloatType>(cast<RankedTensorType>(input.getType())
                                           .getElementType()) &&
                        !isa<InputOp>(input.getDefiningOp()) &&
                        !noGrad.contains(input));
      if (hasGrad.back())
        gradTypes.push_back(input.getType());
    }
    auto op = b.create<BwdOp>(fwd.getLoc(), gradTypes, fwd.getUnitAttr(),
                              fwd.getLayerAttr(), fwd.getTaskAttr(), grads,
                              saved, b.getI64IntegerAttr(unit.cost.bwdFlops),
                              b.getI64IntegerAttr(unit.cost.bwdWorkspace));
    if (unit.cost.bwdFreed)
      op.setFreed(unit.cost.bwdFreed);
    if (unit.cost.bwdPending)
      op.setPending(unit.cost.bwdPending);
    // The first `backwardAliases` inputs' gradients are the incoming one;
    // of those, the ones made (an input without a gradient gets none). Only
    // a gradient of the incoming one's type can be it (under autocast the
    // 16-bit branch's is a cast copy).
    if (unit.cost.backwardAliases > 0 && op.getGrads().size() == 1) {
      uint64_t made = 0;
      for (int i = 0; i < unit.cost.backwardAliases && i < int(hasGrad.size());
           ++i)
        made += hasGrad[i];
      uint64_t n = 0;
      for (Value g : op.getInputGrads())
        if (n < made && g.getType() == op.getGrads().front().getType())
          ++n;
        else
          break;
      if (n)
        op.setAliases(n);
    }
    SmallVector<Value> result;
    auto made = op.getInputGrads().begin();
    for (bool has : hasGrad)
      result.push_back(has ? *made++ : Value());
    return result;
  }

  /// The sum of the non-null `grads` (null when there are none).
  Value sum(ArrayRef<Value> grads, Location at) {
    SmallVector<Value> terms(llvm::make_filter_range(
        grads, [](Value v) { return bool(v); }));
    if (terms.empty())
      return Value();
    if (terms.size() == 1)
      return terms.front();
    return b.create<AddGradsOp>(at, terms.front().getType(), terms);
  }

  ModelOp model;
  CostModel cost;
  OpBuilder &b;
  Location loc;
  /// Values no gradient reaches: the no-grad layers' outputs.
  llvm::DenseSet<Value> noGrad;
};

void StepBuilder::build() {
  BackboneOp backbone = model.getBackbone();
  Location bbLoc = backbone.getLoc();
  SmallVector<TaskOp> tasks(model.getTasks());
  const int64_t layers = backbone.getLayers();
  const bool postNorm = backbone.isPostNorm();
  // The highest layer a task reads: the step (and the runtime) runs no
  // layer above it — nothing would read it or flow back through it.
  int64_t top = 0;
  for (TaskOp task : tasks)
    top = std::max<int64_t>(top, task.getTapLayer());

  auto step = b.create<StepOp>(loc);
  b.setInsertionPointToEnd(&step.getBody().front());

  // Inputs and parameter groups.
  Value tokens =
      b.create<InputOp>(bbLoc, cost.tokensType(), b.getStringAttr("tokens"),
                        nullptr);
  llvm::DenseMap<Operation *, Value> labels;
  for (TaskOp task : tasks)
    labels[task] = b.create<InputOp>(task.getLoc(), cost.labelsType(task),
                                     b.getStringAttr("labels"),
                                     FlatSymbolRefAttr::get(task.getSymNameAttr()));
  auto frozenAttr = [&](int64_t layer) {
    return cost.frozen(layer) ? b.getUnitAttr() : UnitAttr();
  };
  b.create<WeightsOp>(bbLoc, b.getStringAttr("embed"),
                      b.getI64IntegerAttr(cost.embeddingParameters()), nullptr,
                      frozenAttr(0));
  for (int64_t l = 1; l <= layers; ++l)
    b.create<WeightsOp>(bbLoc, b.getStringAttr("layer" + std::to_string(l)),
                        b.getI64IntegerAttr(cost.layerParameters()), nullptr,
                        frozenAttr(l));
  for (TaskOp task : tasks)
    b.create<WeightsOp>(task.getLoc(), b.getStringAttr("head"),
                        b.getI64IntegerAttr(cost.headParameters(task)),
                        FlatSymbolRefAttr::get(task.getSymNameAttr()),
                        UnitAttr());
  if (int64_t gate = cost.parameters().gate)
    b.create<WeightsOp>(model.getStrategy().getLoc(), b.getStringAttr("gate"),
                        b.getI64IntegerAttr(gate), nullptr, UnitAttr());

  // Forward: embeddings, then per layer the attention and MLP sub-blocks;
  // each task's head and loss right after the layer it reads.
  SmallVector<Emitted> chain;            // backbone units in order
  llvm::MapVector<Operation *, std::pair<Emitted, Emitted>> heads;
  auto runHeads = [&](int64_t layer, Value tap) {
    for (TaskOp task : tasks) {
      if (int64_t(task.getTapLayer()) != layer)
        continue;
      SmallVector<Value> inputs{tap};
      if (task.getHead() == HeadKind::decoder)
        inputs.push_back(labels[task]); // teacher forcing
      Emitted head = forward(UnitKind::head, 0, task, inputs, task.getLoc());
      Emitted loss = forward(UnitKind::loss, 0, task,
                             {head.op.getOutput(), labels[task]},
                             task.getLoc());
      heads[task] = {head, loss};
    }
  };

  chain.push_back(forward(UnitKind::embed, 0, {}, {tokens}, bbLoc));
  Value x = chain.back().op.getOutput();
  runHeads(0, x);
  for (int64_t l = 1; l <= top; ++l) {
    auto unit = [&](UnitKind kind, ValueRange in) {
      chain.push_back(forward(kind, l, {}, in, bbLoc));
      return chain.back().op.getOutput();
    };
    if (postNorm) {
      // BERT: each sub-block's norm after its residual add.
      Value qkv = unit(UnitKind::qkv, {x});
      Value ctx = unit(UnitKind::attn_core, {qkv});
      Value o = unit(UnitKind::attn_out, {ctx});
      Value r = unit(UnitKind::attn_residual, {x, o});
      Value y = unit(UnitKind::attn_norm, {r});
      Value up = unit(UnitKind::mlp_up, {y});
      Value act = unit(UnitKind::mlp_act, {up});
      Value down = unit(UnitKind::mlp_down, {act});
      Value r2 = unit(UnitKind::mlp_residual, {y, down});
      x = unit(UnitKind::mlp_norm, {r2});
      runHeads(l, x);
      continue;
    }
    Value n = unit(UnitKind::attn_norm, {x});
    Value qkv = unit(UnitKind::qkv, {n});
    Value ctx = unit(UnitKind::attn_core, {qkv});
    Value o = unit(UnitKind::attn_out, {ctx});
    Value y = unit(UnitKind::attn_residual, {x, o});
    Value m = unit(UnitKind::mlp_norm, {y});
    Value up = unit(UnitKind::mlp_up, {m});
    Value act = unit(UnitKind::mlp_act, {up});
    Value down = unit(UnitKind::mlp_down, {act});
    x = unit(UnitKind::mlp_residual, {y, down});
    // GPT-2's ln_f: layer L's output as the heads (and Hugging Face's last
    // hidden state) see it.
    if (l == layers && backbone.hasFinalNorm()) // top == layers here
      x = unit(UnitKind::final_norm, {x});
    runHeads(l, x);
  }

  // Every task's loss and head backward first: the per-task gradient at
  // each tap (latest head first, as autograd would order them).
  llvm::DenseMap<int64_t, SmallVector<Value>> tapGrads;
  for (auto &[op, pair] : llvm::reverse(heads)) {
    auto &[head, loss] = pair;
    TaskOp task = cast<TaskOp>(op);
    SmallVector<Value> dOut = backward(loss, {});
    SmallVector<Value> dTap = backward(head, {dOut.front()});
    // A head on a no-grad layer trains itself only.
    if (dTap.front())
      tapGrads[task.getTapLayer()].push_back(dTap.front());
  }

  // The backbone backward from the top; where a head reads, its tap
  // gradient joins the stream.
  // Nothing at or below the no-grad top runs a backward.
  const int64_t noGradTop = cost.noGradTop();
  Value grad = sum(tapGrads.lookup(top), bbLoc);
  if (grad && backbone.hasFinalNorm() && top == layers)
    grad = backward(chain.back(), {grad}).front();
  // Units of layer l, in chain order: 1 + 10 * (l - 1) .. 10 * l.
  for (int64_t l = top; l >= 1 && l > noGradTop; --l) {
    const Emitted *u = &chain[1 + 10 * (l - 1)];
    if (!grad) { // no task reads this high: only lower taps' gradients join
      grad = sum(tapGrads.lookup(l - 1), bbLoc);
      continue;
    }
    if (postNorm) {
      // qkv, core, out, residual, norm; up, act, down, residual, norm.
      Value dR2 = backward(u[9], {grad}).front();
      SmallVector<Value> dRes = backward(u[8], {dR2});
      Value dDown = backward(u[7], {dRes[1]}).front();
      Value dAct = backward(u[6], {dDown}).front();
      Value dy = sum({dRes[0], backward(u[5], {dAct}).front()}, bbLoc);
      Value dR = backward(u[4], {dy}).front();
      SmallVector<Value> dAttnRes = backward(u[3], {dR});
      Value dCtx = backward(u[2], {dAttnRes[1]}).front();
      Value dQkv = backward(u[1], {dCtx}).front();
      grad = sum({dAttnRes[0], backward(u[0], {dQkv}).front()}, bbLoc);
    } else {
      // norm, qkv, core, out, residual; norm, up, act, down, residual.
      SmallVector<Value> dRes = backward(u[9], {grad});
      Value dDown = backward(u[8], {dRes[1]}).front();
      Value dAct = backward(u[7], {dDown}).front();
      Value dUp = backward(u[6], {dAct}).front();
      Value dy = sum({dRes[0], backward(u[5], {dUp}).front()}, bbLoc);
      SmallVector<Value> dAttnRes = backward(u[4], {dy});
      Value dCtx = backward(u[3], {dAttnRes[1]}).front();
      Value dQkv = backward(u[2], {dCtx}).front();
      Value dN = backward(u[1], {dQkv}).front();
      grad = sum({dAttnRes[0], backward(u[0], {dN}).front()}, bbLoc);
    }
    SmallVector<Value> joining{grad};
    llvm::append_range(joining, tapGrads.lookup(l - 1));
    grad = sum(joining, bbLoc);
  }
  if (!grad && noGradTop < 0)
    grad = sum(tapGrads.lookup(0), bbLoc);
  if (grad && noGradTop < 0)
    backward(chain.front(), {grad});

  // Gradient buckets, top layers first (the order their gradients are
  // ready), at most 25 MiB of fp32 each like DDP's; at world size 1 the
  // runtime skips them.
  {
    // Frozen groups have no gradients to exchange.
    SmallVector<std::pair<std::string, int64_t>> groups;
    for (TaskOp task : llvm::reverse(tasks))
      groups.push_back({("head." + task.getSymName()).str(),
                        cost.headParameters(task)});
    for (int64_t l = layers; l >= 1; --l)
      if (!cost.frozen(l))
        groups.push_back({"layer" + std::to_string(l),
                          cost.layerParameters() +
                              (l == layers ? cost.finalNormParameters() : 0)});
    if (!cost.frozen(0))
      groups.push_back({"embed", cost.embeddingParameters()});
    SmallVector<Attribute> names;
    int64_t elements = 0;
    auto flush = [&] {
      if (elements == 0)
        return;
      b.create<AllReduceOp>(loc, b.getI64IntegerAttr(elements),
                            b.getArrayAttr(names), nullptr, nullptr, nullptr,
                            nullptr, nullptr);
      names.clear();
      elements = 0;
    };
    for (auto &[name, count] : groups) {
      if (elements > 0 && elements + count > CostModel::kBucketElements)
        flush();
      names.push_back(b.getStringAttr(name));
      elements += count;
    }
    flush();
  }

  b.create<OptimizerStepOp>(loc, b.getI64IntegerAttr(cost.optimizerFlops()));
}

} // namespace

void ExpandTrainingStepPass::runOnOperation() {
  ModelOp model = getOperation();
  if (model.getStep()) {
    model.emitError("model '") << model.getSymName()
                               << "' is already expanded into a step";
    return signalPassFailure();
  }
  OpBuilder builder(model.getContext());
  builder.setInsertionPointToEnd(&model.getBody().front());
  StepBuilder(model, builder).build();
}
