//===- MLIRGen.cpp - checked spec to the mtp dialect ----------------------===//

#include "frontend/MLIRGen.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"

using namespace mlir;
using namespace mtp;

namespace {
class Generator {
public:
  Generator(StringRef filename, MLIRContext *context)
      : builder(context), file(StringAttr::get(context, filename)) {}

  OwningOpRef<ModuleOp> run(const CheckedSpec &spec) {
    OwningOpRef<ModuleOp> module = ModuleOp::create(loc(spec.loc));
    builder.setInsertionPointToEnd(module->getBody());
    auto model = builder.create<ModelOp>(loc(spec.loc), spec.name);
    builder.setInsertionPointToEnd(&model.getBody().front());

    const auto &bb = spec.backbone;
    builder.create<BackboneOp>(
        loc(bb.loc), BackboneKindAttr::get(ctx(), bb.kind),
        i64(bb.layers), i64(bb.hidden), i64(bb.heads), i64(bb.ffn),
        i64(bb.vocab), i64(bb.seq), f64(bb.dropout),
        bb.attention ? AttentionKindAttr::get(ctx(), *bb.attention)
                     : AttentionKindAttr(),
        bb.pointwise ? PointwiseKindAttr::get(ctx(), *bb.pointwise)
                     : PointwiseKindAttr(),
        bb.positions ? builder.getI64IntegerAttr(*bb.positions)
                     : IntegerAttr(),
        bb.normEps ? builder.getF64FloatAttr(*bb.normEps) : FloatAttr(),
        bb.weights ? builder.getStringAttr(*bb.weights) : StringAttr(),
        bb.kvHeads ? builder.getI64IntegerAttr(*bb.kvHeads) : IntegerAttr(),
        bb.ropeTheta ? builder.getF64FloatAttr(*bb.ropeTheta) : FloatAttr(),
        bb.ropeScaling ? builder.getDenseF64ArrayAttr(*bb.ropeScaling)
                       : DenseF64ArrayAttr(),
        bb.attentionBias ? builder.getBoolAttr(*bb.attentionBias) : BoolAttr(),
        bb.mlpBias ? builder.getBoolAttr(*bb.mlpBias) : BoolAttr(),
        bb.typeVocab ? builder.getI64IntegerAttr(*bb.typeVocab) : IntegerAttr(),
        bb.positionPad ? builder.getI64IntegerAttr(*bb.positionPad)
                       : IntegerAttr(),
        bb.tokenPad ? builder.getI64IntegerAttr(*bb.tokenPad) : IntegerAttr(),
        bb.freeze ? builder.getDenseI64ArrayAttr(
                        {bb.freeze->first, bb.freeze->second})
                  : DenseI64ArrayAttr());

    for (const CheckedSpec::Task &t : spec.tasks) {
      auto task = builder.create<TaskOp>(
          loc(t.loc), builder.getStringAttr(t.name),
          HeadKindAttr::get(ctx(), t.head), optI64(t.classes),
          optI64(t.labels), optI64(t.layers), optI64(t.vocab), optI64(t.targetSeq),
          i64(t.tapLayer),
          t.pooled ? builder.getUnitAttr() : UnitAttr(),
          LossKindAttr::get(ctx(), t.loss), f64(t.weight), schedule(t.lr));
      (void)task;
    }

    for (const CheckedSpec::Correlation &c : spec.correlations)
      builder.create<CorrelateOp>(loc(c.loc),
                                  FlatSymbolRefAttr::get(ctx(), c.a),
                                  FlatSymbolRefAttr::get(ctx(), c.b),
                                  f64(c.value));

    const auto &b = spec.budget;
    builder.create<BudgetOp>(loc(b.loc), builder.getStringAttr(b.device),
                             i64(b.memory), i64(b.headroom), i64(b.link),
                             i64(b.gpus), i64(b.globalBatch),
                             i64(b.microBatch),
                             PrecisionAttr::get(ctx(), b.precision),
                             b.hbm ? i64(*b.hbm) : IntegerAttr(),
                             b.peakFlops ? f64(*b.peakFlops) : FloatAttr(),
                             b.interconnect ? i64(*b.interconnect)
                                            : IntegerAttr(),
                             b.zero ? i64(b.zero) : IntegerAttr(),
                             b.zeroAuto ? builder.getUnitAttr() : UnitAttr(),
                             b.pipeline > 1 ? i64(b.pipeline) : IntegerAttr(),
                             b.pipelineAuto ? builder.getUnitAttr()
                                            : UnitAttr(),
                             /*pipeline_choices=*/ArrayAttr(),
                             (b.pipeline > 1 || b.pipelineAuto) &&
                                     spec.strategy.gpipe
                                 ? builder.getUnitAttr()
                                 : UnitAttr(),
                             /*stage_starts=*/DenseI64ArrayAttr());

    const auto &s = spec.strategy;
    builder.create<StrategyOp>(
        loc(s.loc.line ? s.loc : spec.loc),
        CheckpointPolicyAttr::get(ctx(), s.checkpoint), i64(s.checkpointEvery),
        f64(s.groupThreshold), OffloadPolicyAttr::get(ctx(), s.offload),
        f64(s.maxOffloadLatency), s.gfmKeep ? f64(*s.gfmKeep) : FloatAttr(),
        GradientScopeAttr::get(ctx(), s.scope), i64(s.scopeLayers),
        optI64(s.dgfgHidden), f64(s.reuseThreshold), f64(s.simStdThreshold),
        ClipPolicyAttr::get(ctx(), s.clip), f64(s.clipMaxNorm),
        CollectivePolicyAttr::get(ctx(), s.collective), f64(s.topk),
        i64(s.quantBlock), i64(s.quantBits), f64(s.residualDecay),
        s.dynamicBatch ? BatchScheduleAttr::get(ctx(), *s.dynamicBatch)
                       : BatchScheduleAttr(),
        s.saps ? SapsAttr::get(ctx(), *s.saps) : SapsAttr(),
        s.ewc ? EwcAttr::get(ctx(), *s.ewc) : EwcAttr(),
        s.adapters ? AdaptersAttr::get(ctx(), *s.adapters) : AdaptersAttr(),
        s.optimizerOffload ? builder.getUnitAttr() : UnitAttr(),
        s.optimizerOffloadAuto ? builder.getUnitAttr() : UnitAttr());

    const auto &tr = spec.train;
    auto phases = [&](ArrayRef<CheckedSpec::Phase> list) {
      if (list.empty())
        return ArrayAttr();
      SmallVector<Attribute> out;
      for (const CheckedSpec::Phase &p : list) {
        SmallVector<FlatSymbolRefAttr> tasks;
        for (const std::string &t : p.tasks)
          tasks.push_back(FlatSymbolRefAttr::get(ctx(), t));
        out.push_back(PhaseAttr::get(ctx(), p.steps, tasks));
      }
      return builder.getArrayAttr(out);
    };
    builder.create<TrainOp>(
        loc(tr.loc.line ? tr.loc : spec.loc), i64(tr.steps), i64(tr.seed),
        tr.dataPath ? builder.getStringAttr(*tr.dataPath) : StringAttr(),
        schedule(tr.lr), f64(tr.weightDecay), f64(tr.beta1), f64(tr.beta2),
        f64(tr.eps), i64(tr.logEvery), i64(tr.saveEvery),
        tr.evalPath ? builder.getStringAttr(*tr.evalPath) : StringAttr(),
        tr.evalPath && tr.evalEvery ? i64(tr.evalEvery) : IntegerAttr(),
        phases(tr.phases));

    if (failed(verify(*module)))
      return nullptr;
    return module;
  }

private:
  MLIRContext *ctx() { return builder.getContext(); }
  Location loc(ast::Location l) {
    return FileLineColLoc::get(file, l.line, l.col);
  }
  IntegerAttr i64(int64_t v) { return builder.getI64IntegerAttr(v); }
  IntegerAttr optI64(std::optional<int64_t> v) {
    return v ? i64(*v) : IntegerAttr();
  }
  FloatAttr f64(double v) { return builder.getF64FloatAttr(v); }
  LRScheduleAttr schedule(const Schedule &s) {
    return LRScheduleAttr::get(ctx(), s.kind, APFloat(s.peak), s.warmup);
  }

  OpBuilder builder;
  StringAttr file;
};
} // namespace

OwningOpRef<ModuleOp> mtp::mlirGen(const CheckedSpec &spec, StringRef filename,
                                   MLIRContext *context) {
  return Generator(filename, context).run(spec);
}
