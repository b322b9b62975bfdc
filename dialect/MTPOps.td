//===- MTPOps.td - mtp spec-level operations ---------------*- tablegen -*-===//
//
// The spec level: what a `.mtp` file says, checked. Every count is a typed
// attribute; verifiers catch what a hand-written .mlir file can get wrong and
// the frontend's own checks would have caught in a .mtp file.
//
//===----------------------------------------------------------------------===//

#ifndef MTP_OPS
#define MTP_OPS

include "dialect/MTPDialect.td"
include "dialect/MTPAttrs.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/IR/CommonAttrConstraints.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

def MTP_PositiveI64Attr : ConfinedAttr<I64Attr, [IntPositive]>;
def MTP_NonNegativeI64Attr : ConfinedAttr<I64Attr, [IntNonNegative]>;

//===----------------------------------------------------------------------===//
// ModelOp
//===----------------------------------------------------------------------===//

def MTP_ModelOp : MTP_Op<"model", [
    HasParent<"::mlir::ModuleOp">,
    IsolatedFromAbove, Symbol, SymbolTable, NoTerminator, SingleBlock,
    NoRegionArguments]> {
  let summary = "a multi-task model: backbone, tasks, correlations, budget";
  let description = [{
    The root of a spec. Its body holds exactly one `mtp.backbone`, one or
    more `mtp.task`s (symbols, so correlations can name them), any number of
    `mtp.correlate`s and at most one `mtp.budget`.

    ```mlir
    mtp.model @glue_mt {
      mtp.backbone transformer(layers = 24, hidden = 1024, heads = 16,
                               ffn = 4096, vocab = 32000, seq = 512)
      mtp.task @pos : tag(labels = 17) from layer 8 loss cross_entropy weight 1.0
      ...
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name attr-dict-with-keyword $body";
  let hasRegionVerifier = 1;
  let skipDefaultBuilders = 1;
  let builders = [OpBuilder<(ins "::llvm::StringRef":$name)>];
  let extraClassDeclaration = [{
    /// The model's backbone, or null if the body has none (a verifier error).
    BackboneOp getBackbone();
    /// The budget, or null when the spec has none.
    BudgetOp getBudget();
    /// The strategy / training settings, or null when absent.
    StrategyOp getStrategy();
    TrainOp getTrain();
    /// The expanded training step, or null before --mtp-expand-training-step.
    StepOp getStep();
    /// Tasks in body order.
    auto getTasks() { return getBody().getOps<TaskOp>(); }
  }];
}

//===----------------------------------------------------------------------===//
// BackboneOp
//===----------------------------------------------------------------------===//

def MTP_BackboneOp : MTP_Op<"backbone", [HasParent<"ModelOp">]> {
  let summary = "the shared backbone's dimensions";
  let description = [{
    A pre-norm transformer of `layers` layers; `hidden` must split evenly
    into `heads` attention heads. Layer 0 is the embedding output, layers
    1..`layers` are the transformer layers' outputs. `gpt2` is GPT-2's
    architecture (causal, GELU's tanh form, a final LayerNorm that layer
    `layers`' output passes through); `positions` rows of learned
    positions (default `seq`), `norm_eps` the norms' epsilon (1e-5), and
    `weights` a Hugging Face directory whose weights the binary loads.
    `freeze = array<i64: first, last>` keeps layers first..last (0: the
    embeddings; `layers`: the last layer with the final norm) out of the
    optimizer: no gradients, no optimizer state. Frozen from the embeddings
    up, those layers run without autograd and keep nothing for a backward.

    ```mlir
    mtp.backbone transformer(layers = 24, hidden = 1024, heads = 16,
                             ffn = 4096, vocab = 32000, seq = 512,
                             dropout = 0.1) attention math pointwise aten
    ```
  }];
  let arguments = (ins MTP_BackboneKindAttr:$kind,
                       MTP_PositiveI64Attr:$layers,
                       MTP_PositiveI64Attr:$hidden,
                       MTP_PositiveI64Attr:$heads,
                       MTP_PositiveI64Attr:$ffn,
                       MTP_PositiveI64Attr:$vocab,
                       MTP_PositiveI64Attr:$seq,
                       F64Attr:$dropout,
                       OptionalAttr<MTP_AttentionKindAttr>:$attention,
                       OptionalAttr<MTP_PointwiseKindAttr>:$pointwise,
                       OptionalAttr<I64Attr>:$positions,
                       OptionalAttr<F64Attr>:$norm_eps,
                       OptionalAttr<StrAttr>:$weights,
                       OptionalAttr<I64Attr>:$kv_heads,
                       OptionalAttr<F64Attr>:$rope_theta,
                       OptionalAttr<DenseF64ArrayAttr>:$rope_scaling,
                       OptionalAttr<BoolAttr>:$attention_bias,
                       OptionalAttr<BoolAttr>:$mlp_bias,
                       OptionalAttr<I64Attr>:$type_vocab,
                       OptionalAttr<I64Attr>:$position_pad,
                       OptionalAttr<I64Attr>:$token_pad,
                       OptionalAttr<DenseI64ArrayAttr>:$freeze);
  let assemblyFormat = [{
    $kind `(` `layers` `=` $layers `,` `hidden` `=` $hidden `,`
              `heads` `=` $heads `,` `ffn` `=` $ffn `,`
              `vocab` `=` $vocab `,` `seq` `=` $seq `,` `dropout` `=` $dropout `)`
              (`attention` $attention^)? (`pointwise` $pointwise^)?
              (`positions` $positions^)? (`norm_eps` $norm_eps^)?
              (`weights` $weights^)? (`kv_heads` $kv_heads^)?
              (`rope_theta` $rope_theta^)? (`rope_scaling` $rope_scaling^)?
              (`attention_bias` $attention_bias^)? (`mlp_bias` $mlp_bias^)?
              (`type_vocab` $type_vocab^)? (`position_pad` $position_pad^)?
              (`token_pad` $token_pad^)? (`freeze` $freeze^)?
              attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getHeadDim() { return getHidden() / getHeads(); }
    /// Rows of the position table: `positions`, else `seq`.
    int64_t getPositionRows() { return getPositions().value_or(getSeq()); }
    double getNormEpsilon() {
      return getNormEps() ? getNormEps()->convertToDouble() : 1e-5;
    }
    bool isCausal() {
      return getKind() == BackboneKind::gpt2 || isLlama();
    }
    /// BERT's: each block's norm after its residual add (units qkv ..
    /// residual, then the norm), a LayerNorm on the embeddings.
    bool isPostNorm() { return getKind() == BackboneKind::bert; }
    int64_t getTypeVocabRows() {
      return std::max<int64_t>(
          1, int64_t(getTypeVocab().value_or(isPostNorm() ? 2 : 0)));
    }
    /// GELU's tanh form (GPT-2's gelu_new).
    bool hasGeluTanh() { return getKind() == BackboneKind::gpt2; }
    /// A norm on the last layer's output (unit final_norm).
    bool hasFinalNorm() {
      return getKind() == BackboneKind::gpt2 || isLlama();
    }
    bool isLlama() { return getKind() == BackboneKind::llama; }
    /// Whether `freeze` keeps layer `layer`'s parameters (0: the
    /// embeddings) out of the optimizer.
    bool isFrozen(int64_t layer) {
      std::optional<::llvm::ArrayRef<int64_t>> f = getFreeze();
      return f && f->size() == 2 && layer >= (*f)[0] && layer <= (*f)[1];
    }
    /// The top layer of the frozen run that starts at the embeddings: it
    /// and everything below run without autograd (-1: none do).
    int64_t getNoGradTop() {
      std::optional<::llvm::ArrayRef<int64_t>> f = getFreeze();
      return f && f->size() == 2 && (*f)[0] == 0 ? (*f)[1] : -1;
    }
    /// Llama's: RMSNorm, rotary positions (no position table), a SwiGLU
    /// MLP whose up-projection holds the gate's and the up's rows.
    bool hasRmsNorm() { return isLlama(); }
    bool hasPositionTable() { return !isLlama(); }
    bool hasGatedMlp() { return isLlama(); }
    int64_t getKvHeadCount() { return getKvHeads().value_or(getHeads()); }
    bool hasAttentionBias() { return getAttentionBias().value_or(!isLlama()); }
    bool hasMlpBias() { return getMlpBias().value_or(!isLlama()); }
  }];
}

//===----------------------------------------------------------------------===//
// TaskOp
//===----------------------------------------------------------------------===//

def MTP_TaskOp : MTP_Op<"task", [HasParent<"ModelOp">, Symbol]> {
  let summary = "a task head reading one backbone layer, with its loss";
  let description = [{
    A head of kind `classify(classes = N)`, `tag(labels = N)`, `span()` or
    `decoder(layers = N, vocab = V, target_seq = T)` (T target tokens,
    teacher-forced) reading the output of backbone layer
    `tap_layer` (0 = embeddings). `pooled` means the head reads the pooled
    (first-token) vector of that layer rather than every token. The task's
    loss is scaled by `weight`. `lr` is the schedule of the head's own
    parameter group (TaskLRAdapter); without it the head follows the
    backbone's schedule in `mtp.train`.

    ```mlir
    mtp.task @mnli : classify(classes = 3) from pooled layer 24 loss cross_entropy weight 1.0
    mtp.task @squad : span() from layer 24 loss cross_entropy weight 0.5
    mtp.task @mt : decoder(layers = 6, vocab = 32000, target_seq = 128) from layer 24 loss cross_entropy weight 1.0
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       MTP_HeadKindAttr:$head,
                       OptionalAttr<MTP_PositiveI64Attr>:$classes,
                       OptionalAttr<MTP_PositiveI64Attr>:$labels,
                       OptionalAttr<MTP_PositiveI64Attr>:$layers,
                       OptionalAttr<MTP_PositiveI64Attr>:$vocab,
                       OptionalAttr<MTP_PositiveI64Attr>:$target_seq,
                       MTP_NonNegativeI64Attr:$tap_layer,
                       UnitAttr:$pooled,
                       MTP_LossKindAttr:$loss,
                       F64Attr:$weight,
                       OptionalAttr<MTP_LRScheduleAttr>:$lr);
  // The kind-specific parameters parse as one list; which kind takes which
  // is the verifier's to say.
  let assemblyFormat = [{
    $sym_name `:` $head ``
    custom<HeadParams>($classes, $labels, $layers, $vocab, $target_seq)
    `from` (`pooled` $pooled^)? `layer` $tap_layer `loss` $loss
    `weight` $weight (`lr` custom<Schedule>($lr)^)? attr-dict
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// CorrelateOp
//===----------------------------------------------------------------------===//

def MTP_CorrelateOp : MTP_Op<"correlate", [
    HasParent<"ModelOp">, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "how related two tasks are, in [-1, 1]";
  let description = [{
    Planning groups highly correlated tasks (e.g. POS and chunking) into one
    checkpoint interval and separates weakly correlated ones.

    ```mlir
    mtp.correlate @pos, @chunk = 0.8
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$lhs, FlatSymbolRefAttr:$rhs,
                       F64Attr:$value);
  let assemblyFormat = "$lhs `,` $rhs `=` $value attr-dict";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// BudgetOp
//===----------------------------------------------------------------------===//

def MTP_BudgetOp : MTP_Op<"budget", [HasParent<"ModelOp">]> {
  let summary = "the device, its memory, the batch and the precision";
  let description = [{
    `memory` is the per-device memory in bytes and `headroom` the part a plan
    may not use; both print with a binary unit when exact. `link` is the
    host link's bandwidth per direction in bytes per second (offload and
    prefetch traffic). `hbm` (device memory bandwidth, bytes/s) and `flops`
    (peak FLOP/s at the training precision) override the device preset's. `global_batch`
    must be a whole number of `micro_batch × gpus` micro-batches (gradient
    accumulation covers the rest). `zero` is the ZeRO stage (1: AdamW's
    state sharded over the gpus; 2: the gradients too; absent: none);
    `zero_auto` lets the planner choose the lowest stage whose plan fits.
    `pipeline` cuts the backbone into that many stages, one process each
    (docs/pipeline.md); `gpus` is then stages × data-parallel replicas, and
    the batch splits over the replicas. `gpipe` runs every forward before any
    backward (otherwise one-forward-one-backward, 1F1B). `stages` is the
    planner's cut: each stage's first unit (runtime block numbers, the first
    0); absent, the cut balances the stages' time (docs/pipeline.md).
    `pipeline_auto` lets the planner choose the stages among the divisors of
    `gpus` (the fitting plan with the least predicted step); `choices`
    records what it planned for each, and `pipeline` holds its choice.

    ```mlir
    mtp.budget device "A100_32GB" memory 32 GiB headroom 2 GiB
               link 32 GBps gpus 8 batch 64 micro 8 precision bf16
    ```
  }];
  let arguments = (ins StrAttr:$device,
                       MTP_PositiveI64Attr:$memory,
                       MTP_NonNegativeI64Attr:$headroom,
                       MTP_PositiveI64Attr:$link_bandwidth,
                       MTP_PositiveI64Attr:$gpus,
                       MTP_PositiveI64Attr:$global_batch,
                       MTP_PositiveI64Attr:$micro_batch,
                       MTP_PrecisionAttr:$precision,
                       OptionalAttr<MTP_PositiveI64Attr>:$memory_bandwidth,
                       OptionalAttr<F64Attr>:$peak_flops,
                       OptionalAttr<MTP_PositiveI64Attr>:$interconnect_bandwidth,
                       OptionalAttr<MTP_PositiveI64Attr>:$zero,
                       UnitAttr:$zero_auto,
                       OptionalAttr<MTP_PositiveI64Attr>:$pipeline,
                       UnitAttr:$pipeline_auto,
                       OptionalAttr<TypedArrayAttrBase<MTP_PipelineChoiceAttr,
                           "the stage counts pipeline = auto planned">>:$pipeline_choices,
                       UnitAttr:$gpipe,
                       OptionalAttr<DenseI64ArrayAttr>:$stage_starts);
  let assemblyFormat = [{
    `device` $device `memory` custom<Bytes>($memory)
    `headroom` custom<Bytes>($headroom)
    `link` custom<Bandwidth>($link_bandwidth) `gpus` $gpus
    `batch` $global_batch `micro` $micro_batch `precision` $precision
    (`hbm` $memory_bandwidth^ `Bps`)? (`flops` $peak_flops^)?
    (`interconnect` $interconnect_bandwidth^ `Bps`)?
    (`zero` $zero^)? (`zero_auto` $zero_auto^)?
    (`pipeline` $pipeline^)? (`pipeline_auto` $pipeline_auto^)?
    (`choices` $pipeline_choices^)? (`gpipe` $gpipe^)?
    (`stages` $stage_starts^)? attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// Bytes a plan may use on one device.
    int64_t getUsableBytes() { return getMemory() - getHeadroom(); }
    /// The ZeRO stage (0: none).
    int64_t getZeroStage() { return getZero().value_or(0); }
    /// Pipeline stages (1: none); `gpus` = stages × data-parallel replicas.
    int64_t getPipelineStages() { return getPipeline().value_or(1); }
    /// The data-parallel replicas: the processes that hold the same units.
    int64_t getReplicas() {
      return std::max<int64_t>(1, getGpus() / getPipelineStages());
    }
    /// Micro-batches per optimizer step on each replica (accumulated, or
    /// in flight through the pipeline).
    int64_t getAccumulationSteps() {
      return getGlobalBatch() / (getMicroBatch() * getReplicas());
    }
  }];
}

//===----------------------------------------------------------------------===//
// StrategyOp
//===----------------------------------------------------------------------===//

def MTP_StrategyOp : MTP_Op<"strategy", [HasParent<"ModelOp">]> {
  let summary = "every strategy knob, resolved to its value";
  let description = [{
    The knobs of docs/techniques.md A1–A2, B5–B8 and C10, each explicit (the
    frontend fills in documented defaults): activation checkpointing
    (`auto` lets the planner choose; `uniform` every k layers;
    `task_granular` groups tasks whose correlation reaches `threshold`),
    offload with its latency bound in seconds, GFM's kept fraction (`none`
    turns it off), the gradient scope (`params` with the top k layers), the
    DGFG gate's hidden width (`none` = fixed loss weights) and its
    recalibration thresholds, clipping, and gradient compression.
    `optimizer_offload` keeps AdamW's state and its update on the host
    (docs/zero.md); `optimizer_offload_auto` lets the planner decide.

    ```mlir
    mtp.strategy checkpoint task_granular every 1 threshold 0.5
      offload cpu_pinned max_latency 1.2e-3 gfm 0.3 scope features layers 1
      dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0
      collective compressed topk 0.15 block 256 bits 8 decay 0.8
    ```
  }];
  let arguments = (ins MTP_CheckpointPolicyAttr:$checkpoint,
                       MTP_PositiveI64Attr:$checkpoint_every,
                       F64Attr:$group_threshold,
                       MTP_OffloadPolicyAttr:$offload,
                       F64Attr:$max_offload_latency,
                       OptionalAttr<F64Attr>:$gfm_keep,
                       MTP_GradientScopeAttr:$gradient_scope,
                       MTP_PositiveI64Attr:$scope_layers,
                       OptionalAttr<MTP_PositiveI64Attr>:$dgfg_hidden,
                       F64Attr:$reuse_threshold,
                       F64Attr:$sim_std_threshold,
                       MTP_ClipPolicyAttr:$clip,
                       F64Attr:$clip_max_norm,
                       MTP_CollectivePolicyAttr:$collective,
                       F64Attr:$topk,
                       MTP_PositiveI64Attr:$quant_block,
                       MTP_PositiveI64Attr:$quant_bits,
                       F64Attr:$residual_decay,
                       OptionalAttr<MTP_BatchScheduleAttr>:$dynamic_batch,
                       OptionalAttr<MTP_SapsAttr>:$saps,
                       OptionalAttr<MTP_EwcAttr>:$ewc,
                       OptionalAttr<MTP_AdaptersAttr>:$adapters,
                       UnitAttr:$optimizer_offload,
                       UnitAttr:$optimizer_offload_auto);
  let assemblyFormat = [{
    `checkpoint` $checkpoint `every` $checkpoint_every
        `threshold` $group_threshold
    `offload` $offload `max_latency` $max_offload_latency
    `gfm` custom<OptionalF64>($gfm_keep)
    `scope` $gradient_scope `layers` $scope_layers
    `dgfg` custom<OptionalI64>($dgfg_hidden) `recalibrate` `reuse` $reuse_threshold
        `std` $sim_std_threshold
    `clip` $clip `max_norm` $clip_max_norm
    `collective` $collective `topk` $topk
        `block` $quant_block `bits` $quant_bits `decay` $residual_decay
    (`dynamic_batch` $dynamic_batch^)?
    (`saps` $saps^)?
    (`ewc` $ewc^)?
    (`adapters` $adapters^)?
    (`optimizer_offload` $optimizer_offload^)?
    (`optimizer_offload_auto` $optimizer_offload_auto^)?
    attr-dict
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// TrainOp
//===----------------------------------------------------------------------===//

def MTP_TrainOp : MTP_Op<"train", [HasParent<"ModelOp">]> {
  let summary = "training settings: steps, seed, data, optimizer, schedule";
  let description = [{
    `data` is `synthetic` (the built-in multi-task generator) or a path to
    a data directory. `lr` is the backbone's schedule and the default of
    every head without its own. AdamW is the optimizer. Metrics are logged
    every `log_every` steps; a training checkpoint is saved every
    `save_every` steps (0 = only at the end). `eval` names held-out data,
    evaluated every `eval_every` steps (0 or absent: at the end).

    ```mlir
    mtp.train steps 1000 seed 7 data synthetic lr cosine(3.0e-04, warmup = 500)
      adamw(weight_decay = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-08)
      log_every 10 save_every 0
    ```
  }];
  let arguments = (ins MTP_PositiveI64Attr:$steps,
                       MTP_NonNegativeI64Attr:$seed,
                       OptionalAttr<StrAttr>:$data_path,
                       MTP_LRScheduleAttr:$lr,
                       F64Attr:$weight_decay,
                       F64Attr:$beta1,
                       F64Attr:$beta2,
                       F64Attr:$eps,
                       MTP_PositiveI64Attr:$log_every,
                       MTP_NonNegativeI64Attr:$save_every,
                       OptionalAttr<StrAttr>:$eval_path,
                       OptionalAttr<I64Attr>:$eval_every,
                       OptionalAttr<TypedArrayAttrBase<MTP_PhaseAttr,
                                                       "training phases">>:$phases);
  let assemblyFormat = [{
    `steps` $steps `seed` $seed `data` custom<DataSource>($data_path)
    `lr` custom<Schedule>($lr)
    `adamw` `(` `weight_decay` `=` $weight_decay `,` `beta1` `=` $beta1 `,`
              `beta2` `=` $beta2 `,` `eps` `=` $eps `)`
    `log_every` $log_every `save_every` $save_every
    (`eval` $eval_path^)? (`eval_every` $eval_every^)?
    (`phases` $phases^)? attr-dict
  }];
  let hasVerifier = 1;
}

include "dialect/MTPStepOps.td"

#endif // MTP_OPS
