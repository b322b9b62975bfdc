//===- MTPStepOps.td - the training-step IR ----------------*- tablegen -*-===//
//
// One training step made explicit (--mtp-expand-training-step): forward units
// in execution order, each task's head and loss at its tap, backward units in
// reverse consuming exactly the tensors their forward saved, gradient sums
// where the DAG joins, and the optimizer update. Values are ranked tensors,
// so every value has a shape, an element type and a size; every unit carries
// its FLOPs. The memory analysis reads liveness straight off the SSA uses.
//
//===----------------------------------------------------------------------===//

#ifndef MTP_STEP_OPS
#define MTP_STEP_OPS

include "dialect/MTPInterfaces.td"

def MTP_StepOp : MTP_Op<"step", [
    HasParent<"ModelOp">, SingleBlock, NoTerminator, NoRegionArguments]> {
  let summary = "one training step (one micro-batch), explicit";
  let description = [{
    The body runs in order: inputs, forward units, heads and losses,
    backward units, gradient sums, then `mtp.optimizer_step`. `mtp.weights`
    ops declare the parameter groups (resident for the whole step, with
    their gradients and optimizer state). `plan` is the joint memory plan
    once `--mtp-plan-memory` has run.
  }];
  let arguments = (ins OptionalAttr<MTP_StepPlanAttr>:$plan);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "(`plan` $plan^)? attr-dict-with-keyword $body";
  let skipDefaultBuilders = 1;
  let builders = [OpBuilder<(ins)>];
}

def MTP_InputOp : MTP_Op<"input", [HasParent<"StepOp">,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "a batch tensor: the tokens, or a task's labels";
  let arguments = (ins StrAttr:$name, OptionalAttr<FlatSymbolRefAttr>:$task);
  let results = (outs AnyRankedTensor:$value);
  let assemblyFormat = "$name ($task^)? attr-dict `:` type($value)";
  let hasVerifier = 1;
}

def MTP_WeightsOp : MTP_Op<"weights", [HasParent<"StepOp">,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "a parameter group with its gradients and optimizer state";
  let description = [{
    `params` elements of `dtype` (fp32 master weights), their gradients
    (allocated by the group's first backward unit, kept until the optimizer
    step) and AdamW's two fp32 moments (created at the first step, then
    resident). A `frozen` group (the backbone's `freeze`) has neither.
  }];
  let arguments = (ins StrAttr:$group, MTP_NonNegativeI64Attr:$params,
                       OptionalAttr<FlatSymbolRefAttr>:$task,
                       UnitAttr:$frozen);
  let assemblyFormat =
      "$group ($task^)? `params` $params (`frozen` $frozen^)? attr-dict";
}

def MTP_FwdOp : MTP_Op<"fwd", [
    ParentOneOf<["StepOp", "CheckpointOp", "RecomputeOp"]>,
    DeclareOpInterfaceMethods<MTP_CostOpInterface>,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "a forward unit: its output first, then what it saves";
  let description = [{
    `outputs[0]` is the unit's result; further results are tensors the unit
    allocates only to keep them for its backward (norm statistics, dropout
    masks, softmax outputs, contiguous copies). Saved tensors that are also
    inputs or outputs are not repeated: the backward unit takes them as
    operands, which is what keeps them alive. `layer` is 1-based for backbone
    units (0 for the embeddings and for heads and losses). `decision` is the
    plan's for the unit's saved tensors (`--mtp-plan-memory`); `region` the
    checkpoint region a recomputed backbone unit falls in.
  }];
  let arguments = (ins MTP_UnitKindAttr:$unit, MTP_NonNegativeI64Attr:$layer,
                       OptionalAttr<FlatSymbolRefAttr>:$task,
                       Variadic<AnyRankedTensor>:$inputs,
                       MTP_NonNegativeI64Attr:$flops,
                       DefaultValuedAttr<MTP_NonNegativeI64Attr, "0">:$workspace,
                       OptionalAttr<StrArrayAttr>:$saved_names,
                       OptionalAttr<MTP_DecisionAttr>:$decision,
                       OptionalAttr<MTP_NonNegativeI64Attr>:$region);
  let results = (outs Variadic<AnyRankedTensor>:$outputs);
  let assemblyFormat = [{
    $unit `[` $layer `]` ($task^)? `(` $inputs `)`
    `flops` $flops (`workspace` $workspace^)? (`saves` $saved_names^)?
    (`plan` $decision^)? (`region` $region^)? attr-dict
    `:` functional-type($inputs, $outputs)
  }];
  let extraClassDeclaration = [{
    /// The unit's result (the rest are saved tensors).
    ::mlir::Value getOutput() { return getOutputs().front(); }
    ::mlir::ResultRange getSaved() { return getOutputs().drop_front(); }
    /// `attn_core3`, `head_pos`: the stem of the unit's value names.
    std::string getUnitName();
  }];
  let hasVerifier = 1;
}

def MTP_BwdOp : MTP_Op<"bwd", [HasParent<"StepOp">, AttrSizedOperandSegments,
    DeclareOpInterfaceMethods<MTP_CostOpInterface>,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "a backward unit: gradients in, saved tensors, gradients out";
  let arguments = (ins MTP_UnitKindAttr:$unit, MTP_NonNegativeI64Attr:$layer,
                       OptionalAttr<FlatSymbolRefAttr>:$task,
                       Variadic<AnyRankedTensor>:$grads,
                       Variadic<AnyRankedTensor>:$saved,
                       MTP_NonNegativeI64Attr:$flops,
                       DefaultValuedAttr<MTP_NonNegativeI64Attr, "0">:$workspace,
                       DefaultValuedAttr<MTP_NonNegativeI64Attr, "0">:$aliases,
                       DefaultValuedAttr<MTP_NonNegativeI64Attr, "0">:$freed,
                       DefaultValuedAttr<MTP_NonNegativeI64Attr, "0">:$pending);
  let results = (outs Variadic<AnyRankedTensor>:$input_grads);
  // `aliases n`: the first n input gradients are the one incoming gradient
  // itself — a residual add hands it to both branches, the fused GELU
  // backward scales it in place: no buffer of their own, and the incoming
  // one lives as long as they do. `freed f pending p`: at the backward's
  // internal peak (where its workspace is counted) f bytes of its saved
  // operands are already freed and p bytes of its parameters' gradients not
  // yet created — a unit of many layers (the decoder head), whose autograd
  // nodes free and create them one by one.
  let assemblyFormat = [{
    $unit `[` $layer `]` ($task^)? `grads` `(` $grads `)`
    `saved` `(` $saved `)` `flops` $flops (`workspace` $workspace^)?
    (`aliases` $aliases^)? (`freed` $freed^)? (`pending` $pending^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def MTP_AddGradsOp : MTP_Op<"add_grads", [HasParent<"StepOp">,
    SameOperandsAndResultType]> {
  let summary = "where the DAG joins: the sum of gradient contributions";
  let arguments = (ins Variadic<AnyRankedTensor>:$grads);
  let results = (outs AnyRankedTensor:$sum);
  let assemblyFormat = "$grads attr-dict `:` type($sum)";
}

def MTP_FuseTaskGradsOp : MTP_Op<"fuse_task_grads", [HasParent<"StepOp">,
    DeclareOpInterfaceMethods<MTP_CostOpInterface>,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "the per-task gradient pipeline: GFM, clip, DGFG, fusion";
  let description = [{
    Takes each task's gradient at its tap (scope `features`) and returns
    what the backbone backward receives from that tap: GFM (keep the lowest
    `gfm_keep` fraction of rfft bins along the channel dimension; none =
    off), per-task clipping to `clip_max_norm` (0 = off), then α_t from the
    DGFG gate (`gate_hidden` wide; none = uniform α over present tasks), so
    that the backbone's gradient is Σ α_t ĝ_t (docs/contracts.md): one
    result per tap layer, the sum over the tasks reading it, in the order
    the heads first reach each tap. Each head's own
    parameters keep their gradients for their optimizer group
    (TaskLRAdapter).
  }];
  let arguments = (ins Variadic<AnyRankedTensor>:$grads,
                       SymbolRefArrayAttr:$tasks,
                       MTP_GradientScopeAttr:$scope,
                       OptionalAttr<F64Attr>:$gfm_keep,
                       F64Attr:$clip_max_norm,
                       OptionalAttr<MTP_PositiveI64Attr>:$gate_hidden,
                       MTP_NonNegativeI64Attr:$flops,
                       DefaultValuedAttr<MTP_NonNegativeI64Attr, "0">:$workspace);
  let results = (outs Variadic<AnyRankedTensor>:$fused);
  let assemblyFormat = [{
    $tasks `(` $grads `)` `scope` $scope
    `gfm` custom<OptionalF64>($gfm_keep) `clip` $clip_max_norm
    `gate` custom<OptionalI64>($gate_hidden) `flops` $flops
    (`workspace` $workspace^)? attr-dict `:` functional-type($grads, $fused)
  }];
  let hasVerifier = 1;
}

def MTP_AllReduceOp : MTP_Op<"allreduce", [HasParent<"StepOp">]> {
  let summary = "a bucket of parameter gradients summed across processes";
  let description = [{
    `elements` gradient values of the named parameter groups, reduced across
    the data-parallel processes before the optimizer step; at world size 1 it
    does nothing at run time, so one binary serves 1 and N processes. With
    `compression` (GSC, docs/contracts.md#compression-gsc): top-k by magnitude (`topk` fraction),
    the kept values block-quantized (`block` values per fp32 scale, `bits`
    per value), indices as int32 or a bitmap, whichever is smaller, the
    residual fed back with `decay`; compressed payloads are all-gathered.
  }];
  let arguments = (ins MTP_PositiveI64Attr:$elements, StrArrayAttr:$groups,
                       UnitAttr:$compressed,
                       OptionalAttr<F64Attr>:$topk,
                       OptionalAttr<MTP_PositiveI64Attr>:$block,
                       OptionalAttr<MTP_PositiveI64Attr>:$bits,
                       OptionalAttr<F64Attr>:$decay);
  let assemblyFormat = [{
    $elements `values` $groups (`compressed` $compressed^ `topk` $topk
    `block` $block `bits` $bits `decay` $decay)? attr-dict
  }];
}

def MTP_CheckpointOp : MTP_Op<"checkpoint", [HasParent<"StepOp">,
    SingleBlockImplicitTerminator<"YieldOp">]> {
  let summary = "a checkpoint region's forward: run, keep only the boundary";
  let hasVerifier = 1;
  let description = [{
    The forward units of checkpoint region `region` run inside; only the
    boundary (the operands) stays saved for the backward, and only what the
    rest of the step reads leaves the region (the results, yielded). The
    tensors the units would keep for their backward die inside: the
    matching `mtp.recompute` re-creates them.
  }];
  let arguments = (ins MTP_NonNegativeI64Attr:$region,
                       Variadic<AnyRankedTensor>:$boundary);
  let results = (outs Variadic<AnyRankedTensor>:$outputs);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $region `(` $boundary `)` attr-dict `:` functional-type($boundary, $outputs)
    $body
  }];
}

def MTP_RecomputeOp : MTP_Op<"recompute", [HasParent<"StepOp">,
    SingleBlockImplicitTerminator<"YieldOp">]> {
  let summary = "a checkpoint region's forward again, at its backward";
  let hasVerifier = 1;
  let description = [{
    Re-runs the forward units of region `region` from its saved boundary
    right before the region's backward and yields the tensors its backward
    units read.

    With `partial`, tensor grain: `region` is a backbone block whose
    projection units (decision recompute, no region) stay in the forward;
    they re-run from the block's kept input right before the first backward
    unit that reads their outputs, which then reads the re-created ones.
  }];
  let arguments = (ins MTP_NonNegativeI64Attr:$region, UnitAttr:$partial,
                       Variadic<AnyRankedTensor>:$boundary);
  let results = (outs Variadic<AnyRankedTensor>:$saved);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $region (`partial` $partial^)? `(` $boundary `)` attr-dict `:`
    functional-type($boundary, $saved) $body
  }];
}

def MTP_YieldOp : MTP_Op<"yield", [Terminator,
    ParentOneOf<["CheckpointOp", "RecomputeOp"]>]> {
  let summary = "what a checkpoint region hands out";
  let arguments = (ins Variadic<AnyRankedTensor>:$values);
  let assemblyFormat = "$values attr-dict `:` type($values)";
  let builders = [OpBuilder<(ins), [{ /* no values */ }]>];
}

def MTP_OffloadOp : MTP_Op<"offload", [HasParent<"StepOp">,
    AllTypesMatch<["value", "host"]>]> {
  let summary = "copy a saved tensor to pinned host memory after its last forward use";
  let description = [{
    The device copy is released once the copy on stream `stream` (a
    low-priority copy stream) completes; the result names the host copy.
  }];
  let arguments = (ins AnyRankedTensor:$value, MTP_NonNegativeI64Attr:$stream);
  let results = (outs AnyRankedTensor:$host);
  let assemblyFormat = "$value `stream` $stream attr-dict `:` type($value)";
}

def MTP_PrefetchOp : MTP_Op<"prefetch", [HasParent<"StepOp">,
    AllTypesMatch<["value", "host"]>]> {
  let summary = "start bringing an offloaded tensor back to the device";
  let arguments = (ins AnyRankedTensor:$host, MTP_NonNegativeI64Attr:$stream);
  let results = (outs AnyRankedTensor:$value);
  let assemblyFormat = "$host `stream` $stream attr-dict `:` type($host)";
}

def MTP_WaitOp : MTP_Op<"wait", [HasParent<"StepOp">]> {
  let summary = "the compute stream waits for a prefetch before its use";
  let arguments = (ins AnyRankedTensor:$value);
  let assemblyFormat = "$value attr-dict `:` type($value)";
}

def MTP_ReleaseOp : MTP_Op<"release", [HasParent<"StepOp">]> {
  let summary = "where the runtime lets go of tensors it holds";
  let description = [{
    Marks the end of tensors' lives that no unit reads but the runtime
    still holds: the taps and the fused tap gradients, which the one
    backbone backward keeps as its roots and `grad_outputs` until it
    returns, and a checkpoint region's re-created output, held until the
    region's backward ends.
  }];
  let arguments = (ins Variadic<AnyRankedTensor>:$values);
  let assemblyFormat = "$values attr-dict `:` type($values)";
}

def MTP_OptimizerStepOp : MTP_Op<"optimizer_step", [HasParent<"StepOp">,
    DeclareOpInterfaceMethods<MTP_CostOpInterface, ["getWorkspaceBytes"]>]> {
  let summary = "AdamW over every parameter group";
  let arguments = (ins MTP_NonNegativeI64Attr:$flops);
  let assemblyFormat = "`flops` $flops attr-dict";
}

#endif // MTP_STEP_OPS
