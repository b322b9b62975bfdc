//===- LowerStepToEmitC.cpp - the planned step as EmitC runtime calls -----===//
//
// Each model's planned `mtp.step` becomes an `emitc.func` that calls the
// runtime's step operations (mtprt/Step.h) in the step's order: the backbone
// units one by one (a checkpoint region as one call, an offloaded unit with
// KeepOffload), each head and loss right after its tap, the head backwards
// with their prefetches, the fused per-task gradient op, the backbone
// backward, the gradient collective and the optimizer step. The backbone
// backward is one autograd call in the runtime; the events the plan places
// inside it (recomputes, prefetches) are listed in a comment above it, in
// order. Comments carry the plan's decisions, so the emitted C++ reads as
// the plan.
//
//===----------------------------------------------------------------------===//

#include "dialect/MTPOps.h"
#include "passes/CostModel.h"
#include "codegen/Passes.h"

#include "mlir/Dialect/EmitC/IR/EmitC.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallSet.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

namespace mtp {
#define GEN_PASS_DEF_LOWERSTEPTOEMITC
#include "codegen/Passes.h.inc"
} // namespace mtp

using namespace mlir;
using namespace mtp;

namespace {

constexpr llvm::StringLiteral kNs = "mtprt::step::";

std::string blockName(int64_t block) {
  if (block == 0)
    return "embeddings";
  return llvm::formatv("layer {0} {1}", (block + 1) / 2,
                       block % 2 ? "attention" : "MLP");
}

/// The first and last backbone unit of a checkpoint or recompute body.
std::pair<int64_t, int64_t> unitRange(Region &body) {
  int64_t first = INT64_MAX, last = -1;
  body.walk([&](FwdOp fwd) {
    if (auto ref = getUnitRef(fwd)) {
      int64_t block = getBlockNumber(ref->kind, ref->layer);
      first = std::min(first, block);
      last = std::max(last, block);
    }
  });
  return {first, last};
}

/// Builds one step function; `b` sits in the module at the function's place.
class StepLowering {
public:
  StepLowering(ModelOp model, StepOp step, OpBuilder &b)
      : model(model), step(step), b(b), loc(step.getLoc()) {
    for (auto [i, task] : llvm::enumerate(model.getTasks())) {
      taskIndex[task.getSymName()] = static_cast<int64_t>(i);
      tasks[task.getSymName()] = task;
    }
  }

  LogicalResult run();

private:
  // The ops of the emitted code.
  void comment(const llvm::Twine &text) {
    std::string s = text.str();
    SmallVector<StringRef> lines;
    StringRef(s).split(lines, '\n');
    for (StringRef line : lines)
      b.create<emitc::VerbatimOp>(loc, ("// " + line).str());
  }
  /// mtprt::step::<callee>(trainer, args...); `args` name operands by index
  /// (IndexAttr) or are literals.
  Value call(StringRef callee, ArrayRef<Attribute> args, Type result = {}) {
    return callWith(callee, trainer, args, result);
  }
  Value callWith(StringRef callee, ValueRange operands,
                 ArrayRef<Attribute> args, Type result = {}) {
    SmallVector<Type> types;
    if (result)
      types.push_back(result);
    auto op = b.create<emitc::CallOpaqueOp>(loc, types,
                                            (kNs + callee).str(), operands,
                                            b.getArrayAttr(args));
    return result ? op.getResult(0) : Value();
  }
  Attribute operand(int64_t i) { return b.getIndexAttr(i); }
  Attribute lit(int64_t v) { return b.getI64IntegerAttr(v); }
  Attribute opaque(StringRef text) {
    return emitc::OpaqueAttr::get(b.getContext(), text);
  }
  Attribute str(StringRef text) { return opaque(("\"" + text + "\"").str()); }

  /// The current value (an int64 ValueId) through backbone units
  /// [first, last] in `mode`, then the previous value released.
  void forwardUnits(int64_t first, int64_t last, StringRef mode,
                    const llvm::Twine &why);
  void lowerBody();
  void lower(InputOp in);
  void lower(CheckpointOp ck);
  void lower(FwdOp fwd);
  void lower(PrefetchOp pre);
  void lower(BwdOp bwd);
  void lower(FuseTaskGradsOp fuse);
  std::string backwardEvents(Operation *from);
  /// The one backbone-backward call, at the first op that belongs to it.
  void backboneBackward(Operation &first) {
    if (backboneBackwardDone)
      return;
    backboneBackwardDone = true;
    std::string events = backwardEvents(&first);
    comment("the backbone backward, top to bottom, from the fused gradients "
            "at the taps" +
            (events.empty() ? std::string(": nothing to recompute or fetch")
                            : ":\n" + StringRef(events).rtrim().str()));
    call("backwardBackbone", {operand(0)});
  }

  int64_t blockOf(Value v) {
    if (auto fwd = v.getDefiningOp<FwdOp>())
      if (auto ref = getUnitRef(fwd))
        return getBlockNumber(ref->kind, ref->layer);
    return -1;
  }
  FlatSymbolRefAttr taskOf(Value v) {
    if (auto fwd = v.getDefiningOp<FwdOp>())
      if (auto ref = getUnitRef(fwd))
        return ref->task;
    return {};
  }

  ModelOp model;
  StepOp step;
  OpBuilder &b;
  Location loc;
  Value trainer, current;
  int64_t currentBlock = -1;
  /// The runtime's head index: the task's position in the model (the plan
  /// file's order).
  llvm::StringMap<int64_t> taskIndex;
  llvm::StringMap<TaskOp> tasks;
  /// Offloaded tensors per backbone block / per task: count and bytes.
  llvm::DenseMap<int64_t, std::pair<int64_t, int64_t>> offloadedBlocks;
  llvm::StringMap<std::pair<int64_t, int64_t>> offloadedTasks;
  llvm::StringSet<> prefetchedTasks;
  /// Backbone blocks recomputed at tensor grain (partial mtp.recompute).
  llvm::DenseSet<int64_t> partialBlocks;
  bool backboneBackwardDone = false;
};

void StepLowering::forwardUnits(int64_t first, int64_t last, StringRef mode,
                                const llvm::Twine &why) {
  comment(why);
  Value next = callWith("forward", {trainer, current},
                        {operand(0), lit(first), lit(last), operand(1),
                         opaque(("mtprt::RegionMode::" + mode).str())},
                        b.getI64Type());
  // The chain's last use: only what autograd saved keeps it alive.
  callWith("release", {trainer, current}, {operand(0), operand(1)});
  current = next;
  currentBlock = last;
}

std::string StepLowering::backwardEvents(Operation *from) {
  std::string out;
  llvm::raw_string_ostream os(out);
  int64_t lastBlock = -1;
  llvm::SmallSet<int64_t, 8> prefetchedBlocks;
  for (Operation *op = from; op; op = op->getNextNode()) {
    if (auto bwd = dyn_cast<BwdOp>(op)) {
      auto ref = getUnitRef(bwd);
      if (ref && !ref->task)
        lastBlock = getBlockNumber(ref->kind, ref->layer);
    } else if (auto rec = dyn_cast<RecomputeOp>(op); rec && rec.getPartial()) {
      std::string units;
      rec.getBody().walk([&](FwdOp fwd) {
        units += (units.empty() ? "" : ", ") +
                 stringifyUnitKind(fwd.getUnit()).str();
      });
      os << llvm::formatv("  re-create unit {0}'s ({1}) {2} from its input at "
                          "their first backward use\n",
                          rec.getRegion(), blockName(rec.getRegion()), units);
    } else if (auto rec = dyn_cast<RecomputeOp>(op)) {
      auto [first, last] = unitRange(rec.getBody());
      os << llvm::formatv("  recompute region {0} (units {1}..{2}: {3} .. "
                          "{4}) from its boundary\n",
                          rec.getRegion(), first, last, blockName(first),
                          blockName(last));
    } else if (auto pre = dyn_cast<PrefetchOp>(op)) {
      auto off = pre.getHost().getDefiningOp<OffloadOp>();
      int64_t block = off ? blockOf(off.getValue()) : -1;
      if (block >= 0 && prefetchedBlocks.insert(block).second)
        os << llvm::formatv("  prefetch unit {0} ({1}) on stream {2}{3}\n",
                            block, blockName(block), pre.getStream(),
                            lastBlock >= 0
                                ? llvm::formatv(", after unit {0}'s backward",
                                                lastBlock)
                                      .str()
                                : std::string());
    }
  }
  return out;
}

void StepLowering::lowerBody() {
  // What the plan offloads, by backbone block and by task.
  step.getBody().walk([&](OffloadOp off) {
    int64_t bytes = CostModel::bytes(off.getValue().getType());
    if (FlatSymbolRefAttr task = taskOf(off.getValue())) {
      auto &e = offloadedTasks[task.getValue()];
      ++e.first;
      e.second += bytes;
    } else if (int64_t block = blockOf(off.getValue()); block >= 0) {
      auto &e = offloadedBlocks[block];
      ++e.first;
      e.second += bytes;
    }
  });

  for (Operation &op : step.getBody().front())
    llvm::TypeSwitch<Operation *>(&op)
        .Case<InputOp>([&](InputOp in) { lower(in); })
        .Case<CheckpointOp>([&](CheckpointOp ck) { lower(ck); })
        .Case<FwdOp>([&](FwdOp fwd) { lower(fwd); })
        .Case<PrefetchOp>([&](PrefetchOp pre) { lower(pre); })
        .Case<BwdOp>([&](BwdOp bwd) { lower(bwd); })
        .Case<RecomputeOp>([&](RecomputeOp rec) { backboneBackward(*rec.getOperation()); })
        .Case<FuseTaskGradsOp>([&](FuseTaskGradsOp fuse) { lower(fuse); })
        // Weights, sums, offloads, waits, releases, buckets and the
        // optimizer step live in the runtime's calls above.
        .Default([](Operation *) {});
}

void StepLowering::lower(InputOp in) {
  if (in.getName() == "tokens") {
    comment("the micro-batch's token ids");
    current = call("input", {operand(0)}, b.getI64Type());
  }
}

void StepLowering::lower(CheckpointOp ck) {
  auto [first, last] = unitRange(ck.getBody());
  forwardUnits(first, last, "Checkpoint",
               llvm::formatv("checkpoint region {0}: units {1}..{2} ({3} "
                             ".. {4}) keep only their input; recomputed "
                             "in the backward",
                             ck.getRegion(), first, last, blockName(first),
                             blockName(last)));
}

void StepLowering::lower(FwdOp fwd) {
  std::optional<UnitRef> ref = getUnitRef(fwd);
  if (!ref)
    return;
  if (ref->task) {
    if (ref->kind != UnitKind::head)
      return; // the loss runs inside forwardHead
    StringRef task = ref->task.getValue();
    auto it = offloadedTasks.find(task);
    bool offload = it != offloadedTasks.end();
    TaskOp t = tasks.lookup(task);
    comment(llvm::formatv(
        "task {0}: {1} head + loss on layer {2}{3}", task,
        stringifyHeadKind(t.getHead()), t.getTapLayer(),
        offload ? llvm::formatv("; offloads {0} saved tensors ({1} B) to "
                                "the host",
                                it->second.first, it->second.second)
                      .str()
                : std::string("; keeps what it saves")));
    call("forwardHead", {operand(0), lit(taskIndex.lookup(task)),
                         opaque(offload ? "true" : "false")});
    return;
  }
  int64_t block = getBlockNumber(ref->kind, ref->layer);
  if (block == currentBlock)
    return;
  auto it = offloadedBlocks.find(block);
  if (partialBlocks.count(block))
    forwardUnits(block, block, "Partial",
                 llvm::formatv("unit {0} ({1}): keep, but its projection "
                               "outputs are re-created from its input at "
                               "their first backward use",
                               block, blockName(block)));
  else if (it != offloadedBlocks.end())
    forwardUnits(block, block, "KeepOffload",
                 llvm::formatv("unit {0} ({1}): offload {2} saved tensors "
                               "({3} B) to the host on stream 1",
                               block, blockName(block), it->second.first,
                               it->second.second));
  else
    forwardUnits(block, block, "Keep",
                 llvm::formatv("unit {0} ({1}): keep", block,
                               blockName(block)));
}

void StepLowering::lower(PrefetchOp pre) {
  auto off = pre.getHost().getDefiningOp<OffloadOp>();
  FlatSymbolRefAttr task = off ? taskOf(off.getValue()) : nullptr;
  if (!task && off && blockOf(off.getValue()) >= 0) {
    backboneBackward(*pre.getOperation()); // the backbone's: inside its backward
    return;
  }
  if (task && prefetchedTasks.insert(task.getValue()).second) {
    comment(llvm::formatv("bring task {0}'s saved tensors back ahead of "
                          "its backward (stream {1})",
                          task.getValue(), pre.getStream()));
    call("prefetch",
         {operand(0),
          str(("head" + llvm::Twine(taskIndex.lookup(task.getValue()))).str())});
  }
}

void StepLowering::lower(BwdOp bwd) {
  std::optional<UnitRef> ref = getUnitRef(bwd);
  if (!ref)
    return;
  if (!ref->task) {
    backboneBackward(*bwd.getOperation());
    return;
  }
  if (ref->kind != UnitKind::head)
    return; // with its head
  comment(llvm::formatv("task {0}: loss + head backward; its gradient "
                        "at the tap goes to the fused op",
                        ref->task.getValue()));
  call("backwardHead",
       {operand(0), lit(taskIndex.lookup(ref->task.getValue()))});
}

void StepLowering::lower(FuseTaskGradsOp fuse) {
  std::string tasks;
  for (Attribute t : fuse.getTasks())
    tasks += (tasks.empty() ? "" : ", ") +
             cast<FlatSymbolRefAttr>(t).getValue().str();
  std::string gfm =
      fuse.getGfmKeep()
          ? llvm::formatv("GFM keeps {0} of the frequency bins",
                          llvm::format("%g",
                                       fuse.getGfmKeep()->convertToDouble()))
                .str()
          : "no GFM";
  std::string clip =
      fuse.getClipMaxNorm().convertToDouble() > 0
          ? llvm::formatv(
                "per-task clip to {0}",
                llvm::format("%g", fuse.getClipMaxNorm().convertToDouble()))
                .str()
          : "no clip";
  std::string gate =
      fuse.getGateHidden()
          ? llvm::formatv("DGFG gate ({0} hidden) weighs", *fuse.getGateHidden())
                .str()
          : "uniform α over";
  comment(llvm::formatv("the fused per-task gradient op (scope {0}): {1}; "
                        "{2}; {3} [{4}]",
                        stringifyGradientScope(fuse.getScope()), gfm, clip,
                        gate, tasks));
  call("fuseTaskGradients", {operand(0)});
}

LogicalResult StepLowering::run() {
  // The plan must be written into the step: a recompute decision as a
  // checkpoint region, an offload decision as mtp.offload ops.
  bool hasOffloadOps = !step.getBody().getOps<OffloadOp>().empty();
  // Blocks at tensor grain: their units are planned recompute outside any
  // checkpoint, re-created by a partial mtp.recompute.
  step.getBody().walk([&](RecomputeOp rec) {
    if (rec.getPartial())
      partialBlocks.insert(rec.getRegion());
  });
  WalkResult unplanned = step.walk([&](FwdOp fwd) {
    std::optional<Decision> decision = fwd.getDecision();
    if (!decision)
      return WalkResult::advance();
    const bool partial =
        !fwd.getRegion() && !fwd.getTaskAttr() &&
        partialBlocks.count(getBlockNumber(fwd.getUnit(), fwd.getLayer()));
    if ((*decision == Decision::Recompute &&
         !fwd->getParentOfType<CheckpointOp>() && !partial) ||
        (*decision == Decision::Offload && !hasOffloadOps)) {
      fwd.emitError() << "unit " << fwd.getUnitName() << " is planned to "
                      << stringifyDecision(*decision)
                      << " but the plan is not written into the step; run "
                         "--mtp-materialize-offload and "
                         "--mtp-materialize-checkpoints first";
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  if (unplanned.wasInterrupted())
    return failure();
  // What the emitted calls rely on beyond the verifier: the tokens come
  // first (every forward chains from them) and the step ends in an update.
  Block &body = step.getBody().front();
  InputOp tokens;
  for (Operation &op : body) {
    if (auto in = dyn_cast<InputOp>(op); in && in.getName() == "tokens") {
      if (tokens)
        return in.emitError("a second 'tokens' input; a step reads one "
                            "micro-batch of token ids");
      tokens = in;
    } else if (isa<FwdOp, CheckpointOp>(op) && !tokens) {
      return op.emitError("runs before the step's 'tokens' input; "
                          "regenerate the step with "
                          "--mtp-expand-training-step");
    }
  }
  if (!tokens)
    return step.emitError("reads no 'tokens' input; regenerate the step with "
                          "--mtp-expand-training-step");
  if (body.getOps<OptimizerStepOp>().empty())
    return step.emitError("has no 'mtp.optimizer_step'; a training step "
                          "ends in the update (--mtp-expand-training-step "
                          "writes it)");
  MLIRContext *ctx = b.getContext();
  Type trainerType = emitc::OpaqueType::get(ctx, "mtprt::Trainer &");
  Type statsType = emitc::OpaqueType::get(ctx, "mtprt::StepStats");
  std::string name = ("mtp_step_" + model.getSymName()).str();
  auto func = b.create<emitc::FuncOp>(
      loc, name, b.getFunctionType({trainerType}, {statsType}));
  Block *entry = func.addEntryBlock();
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(entry);
  trainer = entry->getArgument(0);

  StepPlanAttr peak = step.getPlanAttr();
  auto budget = model.getBudget();
  comment(llvm::formatv(
      "One optimizer step of model {0}, as planned{1}{2}.", model.getSymName(),
      peak ? llvm::formatv(": predicted peak {0} B", peak.getPlannedPeakBytes())
                 .str()
           : std::string(),
      budget ? llvm::formatv(" of {0} B usable",
                             CostModel(model).usableBytes())
                   .str()
             : std::string()));
  call("beginStep", {operand(0)});
  Type index = b.getIndexType();
  Value count = call("microBatches", {operand(0)}, index);
  Value zero = b.create<emitc::ConstantOp>(loc, index, b.getIndexAttr(0));
  Value one = b.create<emitc::ConstantOp>(loc, index, b.getIndexAttr(1));
  auto loop = b.create<emitc::ForOp>(loc, zero, count, one);
  {
    OpBuilder::InsertionGuard inLoop(b);
    b.setInsertionPointToStart(loop.getBody());
    callWith("beginMicroBatch", {trainer, loop.getInductionVar()},
             {operand(0), operand(1)});
    lowerBody();
  }
  // One exchange for every bucket (the runtime buckets as the plan did).
  SmallVector<AllReduceOp> buckets(step.getBody().front().getOps<AllReduceOp>());
  if (!buckets.empty()) {
    int64_t values = 0, compressed = 0;
    for (AllReduceOp ar : buckets) {
      values += ar.getElements();
      compressed += ar.getCompressed();
    }
    AllReduceOp first = buckets.front();
    comment(llvm::formatv(
        "the gradient collective: {0} values in {1} bucket(s){2}; nothing at "
        "1 process",
        values, buckets.size(),
        compressed
            ? llvm::formatv(", {0} GSC-compressed (top-k {1}, {2}-bit blocks "
                            "of {3}, residual decay {4})",
                            compressed,
                            llvm::format("%g", first.getTopk()
                                                   ? first.getTopk()->convertToDouble()
                                                   : 0.0),
                            first.getBits().value_or(0),
                            first.getBlock().value_or(0),
                            llvm::format("%g", first.getDecay()
                                                   ? first.getDecay()->convertToDouble()
                                                   : 0.0))
                  .str()
            : std::string(", uncompressed")));
    call("exchangeGradients", {operand(0)});
  }
  comment("AdamW, each task's head with its own learning-rate schedule");
  call("optimizerStep", {operand(0)});
  Value stats = call("endStep", {operand(0)}, statsType);
  b.create<emitc::ReturnOp>(loc, stats);
  return success();
}

struct LowerStepToEmitCPass
    : public mtp::impl::LowerStepToEmitCBase<LowerStepToEmitCPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    OpBuilder b(module.getContext());
    SmallVector<ModelOp> models(module.getOps<ModelOp>());
    if (models.empty()) {
      module.emitError("no 'mtp.model' to lower");
      return signalPassFailure();
    }
    b.setInsertionPointToStart(module.getBody());
    b.create<emitc::IncludeOp>(module.getLoc(), "mtprt/Step.h",
                               /*is_standard_include=*/false);
    for (ModelOp model : models) {
      StepOp step = model.getStep();
      if (!step) {
        model.emitError() << "model '" << model.getSymName() << "' "
                          << ("has no training step to lower; run "
                        "--mtp-expand-training-step (and the planning "
                        "passes) first");
        return signalPassFailure();
      }
      b.setInsertionPoint(model);
      StepLowering lowering(model, step, b);
      if (failed(lowering.run()))
        return signalPassFailure();
      model.erase();
    }
  }
};

} // namespace
