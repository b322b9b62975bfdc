//===- MTPAttrs.td - mtp enums and attributes --------------*- tablegen -*-===//

#ifndef MTP_ATTRS
#define MTP_ATTRS

include "dialect/MTPDialect.td"
include "mlir/IR/EnumAttr.td"

def MTP_BackboneKind : I32EnumAttr<"BackboneKind", "kind of shared backbone", [
    // mtpc's own pre-norm transformer (no Hugging Face names).
    I32EnumAttrCase<"transformer", 0>,
    // GPT-2: pre-norm, causal attention, GELU's tanh form, a final LayerNorm
    // on the last layer's output; loads and exports Hugging Face weights.
    I32EnumAttrCase<"gpt2", 1>,
    // Llama: RMSNorm, rotary positions (optionally llama3-scaled), grouped-
    // query attention, a SwiGLU MLP, causal, a final norm; loads and exports
    // Hugging Face weights.
    I32EnumAttrCase<"llama", 2>,
    // BERT / RoBERTa: post-norm (each block's LayerNorm after its residual
    // add), learned positions (RoBERTa's from its padding id + 1), token-type
    // embeddings, a LayerNorm on the embeddings, GELU.
    I32EnumAttrCase<"bert", 3>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_BackboneKindAttr : EnumAttr<MTP_Dialect, MTP_BackboneKind, "backbone">;

def MTP_AttentionKind : I32EnumAttr<"AttentionKind",
    "how the attention core is computed", [
    // softmax(q·kᵀ/√d)·v written out: keeps the S×S probabilities (and the
    // dropout mask) for backward. The only path for attention dropout on CPU.
    I32EnumAttrCase<"math", 0>,
    // One scaled_dot_product_attention kernel (flash / memory-efficient on
    // CUDA, the flash CPU kernel): keeps its output and log-sum-exp.
    I32EnumAttrCase<"fused", 1>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_AttentionKindAttr : EnumAttr<MTP_Dialect, MTP_AttentionKind,
                                     "attention">;

def MTP_PointwiseKind : I32EnumAttr<"PointwiseKind",
    "how the norms and the GELU keep what their backward needs", [
    // ATen's layer_norm, gelu and linear: a linear after a norm or a GELU
    // keeps that op's output.
    I32EnumAttrCase<"aten", 0>,
    // The runtime's fused pointwise kernels: the norm keeps its input and
    // statistics, the GELU its input; backward recomputes their outputs, so
    // the linear after them keeps nothing. fp32 only (no autocast).
    I32EnumAttrCase<"fused", 1>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_PointwiseKindAttr : EnumAttr<MTP_Dialect, MTP_PointwiseKind,
                                     "pointwise">;

def MTP_HeadKind : I32EnumAttr<"HeadKind", "kind of task head", [
    // Sequence classification on the pooled (first-token) output.
    I32EnumAttrCase<"classify", 0>,
    // Per-token tagging (NER, POS, chunking).
    I32EnumAttrCase<"tag", 1>,
    // Span extraction: start/end logits per token (SQuAD).
    I32EnumAttrCase<"span", 2>,
    // A small decoder for generation, cross-attending to the tap.
    I32EnumAttrCase<"decoder", 3>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_HeadKindAttr : EnumAttr<MTP_Dialect, MTP_HeadKind, "head">;

def MTP_LossKind : I32EnumAttr<"LossKind", "task loss", [
    I32EnumAttrCase<"cross_entropy", 0>,
    I32EnumAttrCase<"mse", 1>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_LossKindAttr : EnumAttr<MTP_Dialect, MTP_LossKind, "loss">;

def MTP_Precision : I32EnumAttr<"Precision", "training precision", [
    I32EnumAttrCase<"fp32", 0>,
    // bf16 autocast with fp32 master weights.
    I32EnumAttrCase<"bf16", 1>,
    // fp16 with loss scaling (GPU only).
    I32EnumAttrCase<"fp16", 2>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_PrecisionAttr : EnumAttr<MTP_Dialect, MTP_Precision, "precision">;

def MTP_CheckpointPolicy : I32EnumAttr<"CheckpointPolicy",
    "activation checkpointing policy", [
    // The planner decides, jointly with offload, under the budget.
    I32EnumAttrCase<"automatic", 0, "auto">,
    I32EnumAttrCase<"none", 1>,
    // The classic baseline: a region every `every` layers.
    I32EnumAttrCase<"uniform", 2>,
    // Regions cut at task taps; correlated tasks share an interval.
    I32EnumAttrCase<"task_granular", 3>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_CheckpointPolicyAttr :
    EnumAttr<MTP_Dialect, MTP_CheckpointPolicy, "checkpoint_policy">;

def MTP_OffloadPolicy : I32EnumAttr<"OffloadPolicy", "activation offload", [
    I32EnumAttrCase<"automatic", 0, "auto">,
    I32EnumAttrCase<"none", 1>,
    // Head inputs to pinned host memory, prefetched before their backward.
    I32EnumAttrCase<"cpu_pinned", 2>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_OffloadPolicyAttr :
    EnumAttr<MTP_Dialect, MTP_OffloadPolicy, "offload_policy">;

def MTP_GradientScope : I32EnumAttr<"GradientScope",
    "where per-task gradients are taken", [
    // Gradients w.r.t. each task's tap activation, fused before one
    // backbone backward.
    I32EnumAttrCase<"features", 0>,
    // Per-task gradients of the top k shared layers' parameters.
    I32EnumAttrCase<"params", 1>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_GradientScopeAttr :
    EnumAttr<MTP_Dialect, MTP_GradientScope, "gradient_scope">;

def MTP_ClipPolicy : I32EnumAttr<"ClipPolicy", "gradient clipping", [
    I32EnumAttrCase<"none", 0>,
    I32EnumAttrCase<"per_task", 1>,
    I32EnumAttrCase<"global", 2>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_ClipPolicyAttr : EnumAttr<MTP_Dialect, MTP_ClipPolicy, "clip_policy">;

def MTP_CollectivePolicy : I32EnumAttr<"CollectivePolicy",
    "gradient collectives", [
    // Compressed when more than one device takes part.
    I32EnumAttrCase<"automatic", 0, "auto">,
    // A plain all-reduce.
    I32EnumAttrCase<"none", 1>,
    I32EnumAttrCase<"compressed", 2>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_CollectivePolicyAttr :
    EnumAttr<MTP_Dialect, MTP_CollectivePolicy, "collective_policy">;

def MTP_ScheduleKind : I32EnumAttr<"ScheduleKind", "learning-rate schedule", [
    I32EnumAttrCase<"constant", 0>,
    // Linear decay from the peak to 0 over the training steps.
    I32EnumAttrCase<"linear", 1>,
    // Cosine decay from the peak to 0 over the training steps.
    I32EnumAttrCase<"cosine", 2>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}

def MTP_LRScheduleAttr : AttrDef<MTP_Dialect, "LRSchedule"> {
  let mnemonic = "lr";
  let summary = "a learning-rate schedule: kind, peak rate, warm-up steps";
  let description = [{
    `#mtp.lr<cosine(3.0e-04, warmup = 500)>`: linear warm-up from 0 to the
    peak over `warmup` steps, then the kind's decay to 0 at the last step.
  }];
  let parameters = (ins EnumParameter<MTP_ScheduleKind>:$kind,
                        APFloatParameter<"peak learning rate">:$peak,
                        "int64_t":$warmup);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// `kind(peak, warmup = N)`, as the op printers show it inline.
    void printBare(::mlir::AsmPrinter &printer) const;
    static ::mlir::FailureOr<LRScheduleAttr>
    parseBare(::mlir::AsmParser &parser);
  }];
}

def MTP_BatchScheduleAttr : AttrDef<MTP_Dialect, "BatchSchedule"> {
  let mnemonic = "batch_schedule";
  let summary = "the dynamic batch schedule (docs/techniques.md D15)";
  let description = [{
    `#mtp.batch_schedule<start 32, max 512, rate 1.0e-02, ramp 2000, decay
    9.8e-01 every 500, floor 32>`: the global batch at step s is
    start·(1 + rate·s), capped at max, for the first `ramp` steps; then the
    ramp's last value times decay^⌊(s − ramp)/every⌋, at least floor
    (mtprt::BatchSchedule, rounded down to whole micro-batches).
  }];
  let parameters = (ins "int64_t":$start, "int64_t":$max,
                        APFloatParameter<"growth per step">:$rate,
                        "int64_t":$ramp_steps,
                        APFloatParameter<"decay factor">:$decay,
                        "int64_t":$every, "int64_t":$floor);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The schedule as the runtime computes it, and back.
    ::mtprt::BatchSchedule getSchedule() const;
    static BatchScheduleAttr get(::mlir::MLIRContext *context,
                                 const ::mtprt::BatchSchedule &s);
  }];
}

def MTP_SapsAttr : AttrDef<MTP_Dialect, "Saps"> {
  let mnemonic = "saps";
  let summary = "SAPS sparse updates of the backbone (docs/techniques.md D12)";
  let description = [{
    `#mtp.saps<fraction 3.0e-02, every 1000, lambda 1.0e+00>`: each trainable
    backbone tensor updates only its `fraction` of entries of the largest
    importance |θ·g| + λ·g², re-ranked every `every` steps (mtprt::SapsConfig).
    The backbone then holds no dense gradient or AdamW state, only the
    selected entries' (mtprt::SapsConfig::kBytesPerSelected each).
  }];
  let parameters = (ins APFloatParameter<"updated share">:$fraction,
                        "int64_t":$every,
                        APFloatParameter<"squared-gradient weight">:$lambda);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The configuration as the runtime reads it, and back.
    ::mtprt::SapsConfig getConfig() const;
    static SapsAttr get(::mlir::MLIRContext *context,
                        const ::mtprt::SapsConfig &c);
  }];
}

def MTP_EwcAttr : AttrDef<MTP_Dialect, "Ewc"> {
  let mnemonic = "ewc";
  let summary = "EWC across training phases (docs/techniques.md D14)";
  let description = [{
    `#mtp.ewc<lambda 1.0e+04, batches 8>`: at the end of every phase but the
    last, the Fisher diagonal of the trainable backbone is estimated on
    `batches` batches of the phase's tasks; later steps add
    λ·Σ F·(θ − θ*)² to the loss (mtprt::EwcConfig). With `threshold T`, the
    conflict detector protects a phase only where a gradient cosine between
    its tasks and the next phase's exceeds T.
  }];
  let parameters = (ins APFloatParameter<"penalty weight">:$lambda,
                        "int64_t":$batches,
                        APFloatParameter<"conflict threshold (-2: none)">:$threshold);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    ::mtprt::EwcConfig getConfig() const;
    static EwcAttr get(::mlir::MLIRContext *context,
                       const ::mtprt::EwcConfig &c);
  }];
}

def MTP_AdaptersAttr : AttrDef<MTP_Dialect, "Adapters"> {
  let mnemonic = "adapters";
  let summary = "NPD gated per-task adapters (docs/techniques.md D13)";
  let description = [{
    `#mtp.adapters<bottleneck 8, separation 1.0e-01>`: every task's head
    reads its tap through its own bottleneck adapter (hidden -> bottleneck
    -> hidden), mixed in by a per-channel gate of the task and the input;
    `separation` weighs the gate-separation loss (mtprt::AdapterConfig).
    `bottleneck auto` (about 0.1% of the backbone's parameters per task)
    is resolved by --mtp-normalize-spec. `share 5.0e-01`: tasks whose
    `mtp.correlate` reaches it (transitively) read one adapter, the group's
    first task's; each keeps its own gate. `regroup 100` (with share): every
    100 steps and at every phase's end the groups split where their members'
    gradients on the shared adapter no longer reach `share`.
  }];
  let parameters = (ins "int64_t":$bottleneck,
                        APFloatParameter<"gate-separation weight">:$separation,
                        OptionalParameter<"std::optional<::llvm::APFloat>">:$share,
                        OptionalParameter<"std::optional<int64_t>">:$regroup);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    ::mtprt::AdapterConfig getConfig() const;
    static AdaptersAttr get(::mlir::MLIRContext *context,
                            const ::mtprt::AdapterConfig &c);
  }];
}

def MTP_PhaseAttr : AttrDef<MTP_Dialect, "Phase"> {
  let mnemonic = "phase";
  let summary = "a stretch of training on some tasks (train { phases })";
  let description = [{
    `#mtp.phase<200 steps on @a, @b>`: the next 200 steps train tasks a and
    b only (the others' labels are left out of their batches).
  }];
  let parameters = (ins "int64_t":$steps,
                        ArrayRefParameter<"::mlir::FlatSymbolRefAttr">:$tasks);
  let assemblyFormat = "`<` $steps `steps` `on` $tasks `>`";
}

def MTP_PipelineChoiceAttr : AttrDef<MTP_Dialect, "PipelineChoice"> {
  let mnemonic = "pipeline_choice";
  let summary = "one number of stages `pipeline = auto` planned";
  let description = [{
    `#mtp.pipeline_choice<2 stages peak 21037056 step 1.2e-02 fits>`: the
    planner's outcome for a pipeline of 2 stages (1: data parallelism over
    every gpu) — its predicted peak (the largest stage's) and step in
    seconds; `refused "why"` instead of `fits` when no plan fit.
  }];
  let parameters = (ins "int64_t":$stages, "int64_t":$peak_bytes,
                        APFloatParameter<"the predicted step">:$step_seconds,
                        "::mlir::StringAttr":$refusal);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    bool fits() const { return !getRefusal() || getRefusal().getValue().empty(); }
  }];
}

def MTP_UnitKind : I32EnumAttr<"UnitKind", "a unit of the training step", [
    // docs/contracts.md#granularity; the runtime runs each as one call.
    I32EnumAttrCase<"embed", 0>,          // token + position embeddings, dropout
    I32EnumAttrCase<"attn_norm", 1>,      // LayerNorm before attention
    I32EnumAttrCase<"qkv", 2>,            // fused QKV projection
    I32EnumAttrCase<"attn_core", 3>,      // scores, softmax, dropout, x V
    I32EnumAttrCase<"attn_out", 4>,       // output projection
    I32EnumAttrCase<"attn_residual", 5>,  // dropout + residual add
    I32EnumAttrCase<"mlp_norm", 6>,       // LayerNorm before the MLP
    I32EnumAttrCase<"mlp_up", 7>,         // up-projection
    I32EnumAttrCase<"mlp_act", 8>,        // GELU
    I32EnumAttrCase<"mlp_down", 9>,       // down-projection
    I32EnumAttrCase<"mlp_residual", 10>,  // dropout + residual add
    I32EnumAttrCase<"head", 11>,          // a task head on its tap
    I32EnumAttrCase<"loss", 12>,          // the task's loss
    I32EnumAttrCase<"final_norm", 13>     // a LayerNorm on the last layer's output
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_UnitKindAttr : EnumAttr<MTP_Dialect, MTP_UnitKind, "unit">;

def MTP_Decision : I32EnumAttr<"Decision",
    "what the plan does with a unit's saved tensors", [
    I32EnumAttrCase<"Keep", 0, "keep">,
    // Dropped after the forward, re-created in a checkpoint region.
    I32EnumAttrCase<"Recompute", 1, "recompute">,
    // Copied to pinned host memory, prefetched before the backward.
    I32EnumAttrCase<"Offload", 2, "offload">,
    // A block's, at tensor grain: its projection outputs (the norm's and the
    // QKV / up-projection's, with ATen pointwise the GELU's too) recomputed
    // from the block's kept input at their first backward use, the rest
    // kept. The planner's choice for a block; its units then carry keep and
    // recompute (no region), tensor by tensor.
    I32EnumAttrCase<"Partial", 3, "partial">
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_DecisionAttr : EnumAttr<MTP_Dialect, MTP_Decision, "decision">;

// A checkpoint region of the plan, in runtime block numbers (inclusive).
def MTP_PlanRegionParameter :
    AttrOrTypeParameter<"::mtp::PlanRegion", "a checkpoint region">;
// An offloaded unit of the plan.
def MTP_PlanOffloadParameter :
    AttrOrTypeParameter<"::mtp::PlanOffload", "an offloaded unit">;

def MTP_StepPlanAttr : AttrDef<MTP_Dialect, "StepPlan"> {
  let mnemonic = "plan";
  let summary = "the joint memory plan of a step, as --mtp-plan-memory chose it";
  let description = [{
    The step's peaks under the plan and its two baselines (keep everything;
    uniform checkpointing, a region per layer), the smallest peak any plan
    reaches, the added seconds, the predicted step with everything kept,
    the checkpoint regions and the offload schedule. Each unit's own
    decision is the `decision` of its `mtp.fwd`.

    `#mtp.plan<peak 5884428, keep 9163532, uniform 5556748, minimal 5000000,
    added 1.2e-04, uniform_added 3.4e-04, step 2.1e-03 measured,
    search 812 optimal, regions [1 to 1, 3 to 3],
    offloads ["head pos" 4096 stream 1 wait 0.0e+00]>`

    `step S`: the step with everything kept, predicted (the plan's step is
    S + added); `measured` when the times are measured ones (mtpc profile),
    else the cost model's roofline. Optional: absent reads as 0, unknown.

    `search N optimal`: the branch and bound searched its whole tree in N
    nodes, so no plan of the cost model is cheaper; `search N stopped`: it
    stopped at its node limit with the best plan found, `bound F` (when
    known) a lower bound on every plan's added seconds, so the plan is at
    most added / F - 1 above the optimum; `search 0 stopped`:
    the instance was too large for it (the heuristic's plan).
  }];
  let parameters = (ins "int64_t":$planned_peak_bytes,
                        "int64_t":$keep_peak_bytes,
                        "int64_t":$uniform_peak_bytes,
                        "int64_t":$minimal_peak_bytes,
                        APFloatParameter<"added seconds">:$added_seconds,
                        APFloatParameter<"uniform's added seconds">:$uniform_added_seconds,
                        APFloatParameter<"the step with everything kept">:$keep_step_seconds,
                        "bool":$measured_costs,
                        "int64_t":$search_nodes,
                        "bool":$optimal,
                        APFloatParameter<"a lower bound on every plan's added seconds (0: none)">:$lower_bound_seconds,
                        ArrayRefParameter<"::mtp::PlanRegion">:$regions,
                        ArrayRefParameter<"::mtp::PlanOffload">:$offloads);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
}

#endif // MTP_ATTRS
