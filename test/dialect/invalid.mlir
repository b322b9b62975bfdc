// RUN: mtp-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{'mtp.model' op needs an 'mtp.backbone'}}
mtp.model @no_backbone {
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
}

// -----

// expected-error @+1 {{'mtp.model' op needs at least one 'mtp.task'}}
mtp.model @no_tasks {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
}

// -----

mtp.model @two_backbones {
  // expected-note @+1 {{first backbone here}}
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  // expected-error @+1 {{'mtp.backbone' op duplicates the model's backbone}}
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
}

// -----

mtp.model @two_budgets {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-note @+1 {{first budget here}}
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 32 GBps gpus 1 batch 8 micro 8 precision fp32
  // expected-error @+1 {{'mtp.budget' op duplicates the model's budget}}
  mtp.budget device "cpu" memory 2 GiB headroom 0 B link 32 GBps gpus 1 batch 8 micro 8 precision fp32
}

// -----

mtp.model @bad_heads {
  // expected-error @+1 {{'mtp.backbone' op hidden size 100 does not split into 16 attention heads}}
  mtp.backbone transformer(layers = 2, hidden = 100, heads = 16, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
}

// -----

mtp.model @zero_layers {
  // expected-error @+1 {{'mtp.backbone' op attribute 'layers' failed to satisfy constraint: 64-bit signless integer attribute whose value is positive}}
  mtp.backbone transformer(layers = 0, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 0 loss cross_entropy weight 1.0
}

// -----

mtp.model @tap_out_of_range {
  mtp.backbone transformer(layers = 12, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  // expected-error @+1 {{'mtp.task' op reads layer 13 but the backbone has 12 layers (0 = embeddings)}}
  mtp.task @a : tag(labels = 5) from layer 13 loss cross_entropy weight 1.0
}

// -----

mtp.model @missing_param {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  // expected-error @+1 {{'mtp.task' op 'decoder' head needs 'vocab'}}
  "mtp.task"() <{sym_name = "mt", head = #mtp<head decoder>, layers = 2 : i64, target_seq = 4 : i64, tap_layer = 2 : i64, loss = #mtp<loss cross_entropy>, weight = 1.0 : f64}> : () -> ()
}

// -----

mtp.model @extra_param {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  // expected-error @+1 {{'mtp.task' op 'span' head takes no 'labels'}}
  "mtp.task"() <{sym_name = "s", head = #mtp<head span>, labels = 3 : i64, tap_layer = 2 : i64, loss = #mtp<loss cross_entropy>, weight = 1.0 : f64}> : () -> ()
}

// -----

mtp.model @param_in_custom_form {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  // expected-error @+1 {{'mtp.task' op 'tag' head takes no 'classes'}}
  mtp.task @a : tag(classes = 5) from layer 1 loss cross_entropy weight 1.0
}

// -----

mtp.model @unknown_head {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  // expected-error @+2 {{expected ::mtp::HeadKind to be one of: classify, tag, span, decoder}}
  // expected-error @+1 {{failed to parse MTP_HeadKindAttr parameter}}
  mtp.task @a : regress(classes = 5) from layer 1 loss cross_entropy weight 1.0
}

// -----

mtp.model @negative_weight {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  // expected-error @+1 {{'mtp.task' op loss weight must lie in [0, 1e+06], got -1.000000e+00}}
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight -1.0
}

// -----

mtp.model @mse_on_tags {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  // expected-error @+1 {{'mtp.task' op mse loss needs a 'classify' head (regression), not 'tag'}}
  mtp.task @a : tag(labels = 5) from layer 1 loss mse weight 1.0
}

// -----

mtp.model @pooled_tags {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  // expected-error @+1 {{'mtp.task' op only a 'classify' head reads a pooled tap; 'tag' reads every token}}
  mtp.task @a : tag(labels = 5) from pooled layer 1 loss cross_entropy weight 1.0
}

// -----

mtp.model @self_correlation {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.correlate' op correlates task 'a' with itself; name two distinct tasks}}
  mtp.correlate @a, @a = 0.5
}

// -----

mtp.model @correlation_range {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  mtp.task @b : tag(labels = 5) from layer 2 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.correlate' op correlation must lie in [-1, 1], got 1.500000e+00}}
  mtp.correlate @a, @b = 1.5
}

// -----

mtp.model @unknown_task {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.correlate' op names unknown task @c}}
  mtp.correlate @a, @c = 0.5
}

// -----

mtp.model @twice_correlated {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  mtp.task @b : tag(labels = 5) from layer 2 loss cross_entropy weight 1.0
  // expected-note @+1 {{first given here}}
  mtp.correlate @a, @b = 0.5
  // expected-error @+1 {{'mtp.correlate' op correlates 'a' and 'b' a second time}}
  mtp.correlate @b, @a = 0.7
}

// -----

mtp.model @duplicate_task {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  // expected-note @+1 {{see existing symbol definition here}}
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{redefinition of symbol named 'a'}}
  mtp.task @a : tag(labels = 9) from layer 2 loss cross_entropy weight 1.0
}

// -----

mtp.model @zero_memory {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.budget' op attribute 'memory' failed to satisfy constraint: 64-bit signless integer attribute whose value is positive}}
  mtp.budget device "cpu" memory 0 B headroom 0 B link 32 GBps gpus 1 batch 8 micro 8 precision fp32
}

// -----

mtp.model @auto_pipeline_with_zero {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.budget' op pipeline_auto with ZeRO: a pipeline's stages do not shard their state (docs/pipeline.md)}}
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 32 GBps gpus 4 batch 8 micro 2 precision fp32 zero_auto pipeline_auto
}

// -----

mtp.model @choices_without_auto {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.budget' op choices are pipeline_auto's record; it is absent}}
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 32 GBps gpus 4 batch 8 micro 2 precision fp32 pipeline 2 choices [#mtp.pipeline_choice<2 stages peak 100 step 1.0e-03 fits>]
}

// -----

mtp.model @bad_pipeline_choice {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{a pipeline choice's peak and step must be non-negative and finite}}
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 32 GBps gpus 4 batch 8 micro 2 precision fp32 pipeline 2 pipeline_auto choices [#mtp.pipeline_choice<2 stages peak -1 step 1.0e-03 fits>]
}

// -----

mtp.model @headroom_too_big {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.budget' op headroom (2147483648 bytes) leaves nothing of the device's 1073741824 bytes}}
  mtp.budget device "A100_32GB" memory 1 GiB headroom 2 GiB link 32 GBps gpus 1 batch 8 micro 8 precision bf16
}

// -----

mtp.model @uneven_batch {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.budget' op global batch 64 is not a multiple of micro_batch x gpus = 24}}
  mtp.budget device "A100_32GB" memory 32 GiB headroom 2 GiB link 32 GBps gpus 3 batch 64 micro 8 precision bf16
}

// -----

mtp.model @stage_starts_count {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.budget' op stages needs one first unit per pipeline stage (2), the first 0}}
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 32 GBps gpus 2 batch 8 micro 4 precision fp32 pipeline 2 stages [1, 3]
}

// -----

mtp.model @stage_starts_order {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.budget' op stages' first units must increase}}
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 32 GBps gpus 2 batch 8 micro 4 precision fp32 pipeline 2 stages [0, 0]
}

// -----

mtp.model @fp16_on_cpu {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.budget' op fp16 needs a GPU (loss scaling); use bf16 or fp32 on 'cpu'}}
  mtp.budget device "cpu" memory 8 GiB headroom 0 B link 32 GBps gpus 1 batch 8 micro 8 precision fp16
}

// -----

mtp.model @bad_unit {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{byte count out of range}}
  mtp.budget device "cpu" memory 99999999999 TiB headroom 0 B link 32 GBps gpus 1 batch 8 micro 8 precision fp32
}

// -----

// expected-error @+1 {{'mtp.task' op expects parent op 'mtp.model'}}
mtp.task @orphan : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0

// -----

mtp.model @bad_dropout {
  // expected-error @+1 {{'mtp.backbone' op dropout must lie in [0, 1), got 1.000000e+00}}
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 1.0)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
}

// -----

mtp.model @bad_lr {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  // expected-error @+1 {{learning rate must lie in (0, 10], got 0.000000e+00}}
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0 lr cosine(0.0)
}

// -----

mtp.model @bad_link_unit {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{unknown bandwidth unit 'GB' (expected TBps, GBps, MBps, KBps or Bps)}}
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 32 GB gpus 1 batch 8 micro 8 precision fp32
}

// -----

mtp.model @two_strategies {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-note @+1 {{first strategy here}}
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope features layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8
  // expected-error @+1 {{'mtp.strategy' op duplicates the model's strategy}}
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope features layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8
}

// -----

mtp.model @strategy_ranges {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.strategy' op GFM keep fraction must lie in (0, 1], got 1.500000e+00}}
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 1.5 scope features layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8
}

// -----

mtp.model @strategy_bits {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.strategy' op quantization bits must be 2, 4, 8 or 16, got 3}}
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope features layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 3 decay 0.8
}

// -----

mtp.model @strategy_gate {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.strategy' op DGFG gate of width 50000 over 1 tasks has 300001 parameters; the gate must stay under 100000}}
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope features layers 1 dgfg 50000 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8
}

// -----

mtp.model @strategy_scope {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.strategy' op gradient scope covers 3 layers but the backbone has 2}}
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope params layers 3 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8
}

// -----

mtp.model @train_warmup {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.train' op warm-up of 50 steps exceeds the 10 training steps}}
  mtp.train steps 10 seed 0 data synthetic lr cosine(1.0e-3, warmup = 50) adamw(weight_decay = 0.0, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8) log_every 1 save_every 0
}

// -----

mtp.model @train_beta {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.train' op beta2 must lie in [0, 1), got 1.000000e+00}}
  mtp.train steps 10 seed 0 data synthetic lr cosine(1.0e-3) adamw(weight_decay = 0.0, beta1 = 0.9, beta2 = 1.0, eps = 1.0e-8) log_every 1 save_every 0
}

// -----

mtp.model @long_target {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  // expected-error @+1 {{'mtp.task' op decodes 32 target tokens, more than the backbone's seq 16}}
  mtp.task @mt : decoder(layers = 1, vocab = 100, target_seq = 32) from layer 2 loss cross_entropy weight 1.0
}

// -----

// The shared bounds (mtprt/Limits.h) hold for hand-written IR too: a million
// layers was planned for 80 s and 8.5 GB before.
mtp.model @huge_layers {
  // expected-error @+1 {{'mtp.backbone' op layers must lie in [1, 1024], got 1000000}}
  mtp.backbone transformer(layers = 1000000, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
}

// -----

mtp.model @huge_hidden {
  // expected-error @+1 {{'mtp.backbone' op hidden must lie in [1, 1048576], got 4611686018427387904}}
  mtp.backbone transformer(layers = 2, hidden = 4611686018427387904, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
}

// -----

mtp.model @zero_classes_bound {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  // expected-error @+1 {{'mtp.task' op labels must lie in [2, 1048576], got 1}}
  mtp.task @a : tag(labels = 1) from layer 1 loss cross_entropy weight 1.0
}

// -----

mtp.model @huge_gpus {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.budget' op gpus must lie in [1, 4096], got 9223372036854775807}}
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 32 GBps gpus 9223372036854775807 batch 8 micro 8 precision fp32
}

// -----

// Every size in range, their products past int64 (they overflowed the cost
// model's arithmetic into an internal verifier error on mtp.weights).
// expected-error @+1 {{'mtp.model' op is too large to plan}}
mtp.model @overflowing {
  mtp.backbone transformer(layers = 1024, hidden = 1048576, heads = 1024, ffn = 4194304, vocab = 16777216, seq = 1048576, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
}

// -----

// The plan is for the largest batch a dynamic batch schedule reaches.
mtp.model @dynamic_batch_budget {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 10 GBps gpus 1 batch 8 micro 8 precision fp32
  // expected-error @+1 {{'mtp.strategy' op dynamic batch reaches a global batch of 64 but the budget's is 8; the budget's batch must be the schedule's largest}}
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope features layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8 dynamic_batch <start 8, max 64, rate 1.0, ramp 100, decay 0.5 every 10, floor 8>
}

// -----

mtp.model @dynamic_batch_order {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{dynamic batch: 'max' is below 'start' (start 64, max 8, floor 8)}}
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope features layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8 dynamic_batch <start 64, max 8, rate 1.0, ramp 100, decay 0.5 every 10, floor 8>
}

// -----

mtp.model @dynamic_batch_decay {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{dynamic batch decay must lie in (0, 1], got 1.5}}
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope features layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8 dynamic_batch <start 8, max 64, rate 1.0, ramp 100, decay 1.5 every 10, floor 8>
}

// -----

mtp.model @saps_fraction {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{saps fraction must lie in (0, 1], got 1.5}}
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope features layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8 saps <fraction 1.5, every 1000, lambda 1.0>
}

// -----

// SAPS folds the backbone's gradients as they come; the params scope fuses
// its top layers' after the backward.
mtp.model @saps_scope {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 1 loss cross_entropy weight 1.0
  // expected-error @+1 {{'mtp.strategy' op saps folds the backbone's gradients as autograd makes them; the params scope needs them whole}}
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope params layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8 saps <fraction 0.03, every 1000, lambda 1.0>
}
