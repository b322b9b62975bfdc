// RUN: mtp-opt %s | mtp-opt | FileCheck %s
// RUN: mtp-opt %s -mlir-print-op-generic | mtp-opt | FileCheck %s
// RUN: mtp-opt %s -emit-bytecode | mtp-opt | FileCheck %s

// CHECK-LABEL: mtp.model @glue_mt {
mtp.model @glue_mt {
  // CHECK: mtp.backbone transformer(layers = 24, hidden = 1024, heads = 16, ffn = 4096, vocab = 32000, seq = 512, dropout = 1.000000e-01)
  mtp.backbone transformer(layers = 24, hidden = 1024, heads = 16, ffn = 4096, vocab = 32000, seq = 512, dropout = 0.1)
  // CHECK: mtp.task @mnli : classify(classes = 3) from pooled layer 24 loss cross_entropy weight 1.000000e+00
  mtp.task @mnli : classify(classes = 3) from pooled layer 24 loss cross_entropy weight 1.0
  // CHECK: mtp.task @stsb : classify(classes = 1) from pooled layer 12 loss mse weight 5.000000e-01
  mtp.task @stsb : classify(classes = 1) from pooled layer 12 loss mse weight 0.5
  // CHECK: mtp.task @pos : tag(labels = 17) from layer 8 loss cross_entropy weight 1.000000e+00
  mtp.task @pos : tag(labels = 17) from layer 8 loss cross_entropy weight 1.0
  // CHECK: mtp.task @squad : span() from layer 24 loss cross_entropy weight 2.000000e+00
  mtp.task @squad : span() from layer 24 loss cross_entropy weight 2.0
  // CHECK: mtp.task @mt : decoder(layers = 6, vocab = 32000, target_seq = 64) from layer 24 loss cross_entropy weight 1.000000e+00 lr linear(1.000000e-04, warmup = 0)
  mtp.task @mt : decoder(vocab = 32000, target_seq = 64, layers = 6) from layer 24 loss cross_entropy weight 1.0 lr linear(1.0e-4)
  // Layer 0 is the embedding output.
  // CHECK: mtp.task @lang : tag(labels = 12) from layer 0 loss cross_entropy weight 0.000000e+00 {note = "kept"}
  mtp.task @lang : tag(labels = 12) from layer 0 loss cross_entropy weight 0.0 {note = "kept"}
  // CHECK: mtp.correlate @pos, @squad = 8.000000e-01
  mtp.correlate @pos, @squad = 0.8
  // CHECK: mtp.correlate @mnli, @mt = -2.500000e-01
  mtp.correlate @mnli, @mt = -0.25
  // CHECK: mtp.budget device "A100_32GB" memory 32 GiB headroom 2 GiB link 32 GBps gpus 8 batch 64 micro 8 precision bf16
  mtp.budget device "A100_32GB" memory 32 GiB headroom 2048 MiB link 32 GBps gpus 8 batch 64 micro 8 precision bf16
  // CHECK: mtp.strategy checkpoint task_granular every 1 threshold 5.000000e-01 offload cpu_pinned max_latency 1.200000e-03 gfm 3.000000e-01 scope features layers 1 dgfg 32 recalibrate reuse 1.500000e-01 std 4.000000e-01 clip per_task max_norm 1.000000e+00 collective compressed topk 1.500000e-01 block 256 bits 8 decay 8.000000e-01
  mtp.strategy checkpoint task_granular every 1 threshold 0.5 offload cpu_pinned max_latency 1.2e-3 gfm 0.3 scope features layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective compressed topk 0.15 block 256 bits 8 decay 0.8
  // CHECK: mtp.train steps 1000 seed 7 data synthetic lr cosine(3.000000e-04, warmup = 500) adamw(weight_decay = 1.000000e-02, beta1 = 9.000000e-01, beta2 = 0.99899999999999999, eps = 1.000000e-08) log_every 10 save_every 0
  mtp.train steps 1000 seed 7 data synthetic lr cosine(3.0e-4, warmup = 500) adamw(weight_decay = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1.0e-8) log_every 10 save_every 0
}

// Byte counts keep the largest exact unit, and plain bytes otherwise.
// CHECK-LABEL: mtp.model @cpu_job {
mtp.model @cpu_job {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 1000, seq = 32, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 2 loss cross_entropy weight 1.0
  // CHECK: mtp.budget device "cpu" memory 1000001 B headroom 0 B link 1500 MBps gpus 1 batch 12 micro 4 precision fp32
  mtp.budget device "cpu" memory 1000001 headroom 0 link 1500000000 Bps gpus 1 batch 12 micro 4 precision fp32
  // CHECK: mtp.strategy checkpoint auto {{.*}} offload none {{.*}} gfm none {{.*}} dgfg none {{.*}} collective none
  mtp.strategy checkpoint auto every 2 threshold 0.5 offload none max_latency 1.2e-3 gfm none scope params layers 2 dgfg none recalibrate reuse 0.15 std 0.4 clip global max_norm 5.0 collective none topk 1.0 block 128 bits 4 decay 0.0
  // CHECK: mtp.train steps 10 seed 0 data "data/glue" lr constant(1.000000e-03, warmup = 0) adamw
  mtp.train steps 10 seed 0 data "data/glue" lr constant(1.0e-3) adamw(weight_decay = 0.0, beta1 = 0.9, beta2 = 0.95, eps = 1.0e-8) log_every 1 save_every 5
}

// A dynamic batch schedule: the budget's batch is the largest it reaches.
// CHECK-LABEL: mtp.model @dynamic
mtp.model @dynamic {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 1000, seq = 32, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 2 loss cross_entropy weight 1.0
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 10 GBps gpus 2 batch 512 micro 8 precision fp32
  // CHECK: decay 8.000000e-01 dynamic_batch <start 32, max 512, rate 1.000000e-02, ramp 2000, decay {{[0-9.e-]+}} every 500, floor 32>
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope features layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8 dynamic_batch <start 32, max 512, rate 0.01, ramp 2000, decay 0.98 every 500, floor 32>
}

// SAPS's sparse updates (docs/techniques.md D12).
// CHECK-LABEL: mtp.model @saps
mtp.model @saps {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 1000, seq = 32, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 2 loss cross_entropy weight 1.0
  // CHECK: decay 8.000000e-01 saps <fraction 3.000000e-02, every 1000, lambda 1.000000e+00>
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope features layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8 saps <fraction 0.03, every 1000, lambda 1.0>
}

// The schedule attribute in generic form.
// CHECK-LABEL: mtp.model @generic
mtp.model @generic {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 1000, seq = 32, dropout = 0.0)
  // CHECK: mtp.task @a : tag(labels = 5) from layer 2 loss cross_entropy weight 1.000000e+00 lr cosine(2.000000e-04, warmup = 3)
  "mtp.task"() <{sym_name = "a", head = #mtp<head tag>, labels = 5 : i64, tap_layer = 2 : i64, loss = #mtp<loss cross_entropy>, weight = 1.0 : f64, lr = #mtp.lr<cosine(2.0e-4, warmup = 3)>}> : () -> ()
}

// pipeline = auto's record: each try's stages, peak and step, or why not
// (quotes escaped).
// CHECK-LABEL: mtp.model @auto_pipeline
mtp.model @auto_pipeline {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 1000, seq = 32, dropout = 0.1)
  mtp.task @a : tag(labels = 5) from layer 2 loss cross_entropy weight 1.0
  // CHECK: gpus 4 batch 16 micro 4 precision fp32 pipeline 2 pipeline_auto choices [#mtp.pipeline_choice<1 stages peak 0 step 0.000000e+00 refused "no plan \22fits\22">, #mtp.pipeline_choice<2 stages peak 3420992 step 8.250000e-03 fits>] gpipe
  mtp.budget device "cpu" memory 5 MiB headroom 0 B link 10 GBps gpus 4 batch 16 micro 4 precision fp32 pipeline 2 pipeline_auto choices [#mtp.pipeline_choice<1 stages peak 0 step 0.0 refused "no plan \"fits\"">, #mtp.pipeline_choice<2 stages peak 3420992 step 8.25e-3 fits>] gpipe
}
