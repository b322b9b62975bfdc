// RUN: mtp-opt %s -split-input-file --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step,mtp-plan-memory))' -verify-diagnostics | FileCheck %s

// The tiny example's model with 7000 KiB: keeping everything peaks at 8.61
// MiB, recomputing every block at 5.17 MiB (one region per layer: the
// planner's regions end at every layer, so that is uniform(every = 1)'s
// peak). The proven-optimal plan recomputes the attention blocks of layers 1
// and 3 (one region each: regions end at every layer) and, at
// tensor grain, layer 3's MLP projections: its norm, up-projection and GELU
// outputs are re-created (plan recompute, no region), the rest of the block
// kept — cheaper than its attention block's whole re-run.
// CHECK-LABEL: mtp.model @auto
// CHECK: mtp.step plan <peak [[PLANNED:[0-9]+]], keep 9029388, uniform 5422604, minimal 5422604, added {{.*}}, uniform_added {{.*}}, search {{[0-9]+}} optimal, regions [1 to 1, 5 to 5], offloads []> {
// CHECK: mtp.fwd attn_norm[1]{{.*}} plan recompute region 0 :
// CHECK: mtp.fwd attn_core[1]{{.*}} plan recompute region 0 :
// CHECK: mtp.fwd mlp_norm[1]{{.*}} plan keep :
// CHECK: mtp.fwd attn_core[2]{{.*}} plan keep :
// CHECK: mtp.fwd head[0] @pos{{.*}} plan keep :
// CHECK: mtp.fwd attn_core[3]{{.*}} plan recompute region 1 :
// CHECK: mtp.fwd mlp_norm[3]{{.*}} plan recompute :
// CHECK: mtp.fwd mlp_up[3]{{.*}} plan recompute :
// CHECK: mtp.fwd mlp_act[3]{{.*}} plan recompute :
// CHECK: mtp.fwd mlp_down[3]{{.*}} plan keep :
// CHECK: mtp.fwd attn_core[4]{{.*}} plan keep :
mtp.model @auto {
  mtp.backbone transformer(layers = 4, hidden = 64, heads = 4, ffn = 256, vocab = 512, seq = 32, dropout = 0.1) pointwise aten
  mtp.task @pos : tag(labels = 12) from layer 2 loss cross_entropy weight 1.0
  mtp.task @chunk : tag(labels = 8) from layer 2 loss cross_entropy weight 0.5
  mtp.task @topic : classify(classes = 4) from pooled layer 4 loss cross_entropy weight 1.0
  mtp.correlate @pos, @chunk = 0.8
  mtp.correlate @pos, @topic = 0.1
  mtp.budget device "cpu" memory 7000 KiB headroom 0 B link 1 GBps gpus 1 batch 8 micro 8 precision fp32
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.5 scope features layers 1 dgfg 16 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8
}

// -----

// Nothing may be recomputed or offloaded: the budget is an error that says
// what the smallest plan needs and what would fit.
mtp.model @impossible {
  mtp.backbone transformer(layers = 4, hidden = 64, heads = 4, ffn = 256, vocab = 512, seq = 32, dropout = 0.1) pointwise aten
  mtp.task @pos : tag(labels = 12) from layer 2 loss cross_entropy weight 1.0
  mtp.task @topic : classify(classes = 4) from pooled layer 4 loss cross_entropy weight 1.0
  // expected-error @+5 {{no plan fits the budget: the smallest peak any plan reaches is 8.54 MiB, over the usable 7.00 MiB}}
  // expected-note @+4 {{micro_batch = 5 would fit (estimated: activations scale with the micro batch)}}
  // expected-note @+3 {{precision = bf16 roughly halves the activations}}
  // expected-note @+2 {{more GPUs keep the global batch with a smaller micro batch}}
  // expected-note @+3 {{offload = auto lets the plan move saved tensors to the host}}
  mtp.budget device "cpu" memory 7 MiB headroom 0 B link 10 GBps gpus 1 batch 8 micro 8 precision fp32
  // expected-note @+1 {{optimizer_offload = cpu keeps AdamW's state on the host: 1.83 MiB less per device (would fit)}}
  mtp.strategy checkpoint none every 1 threshold 0.5 offload none max_latency 1.2e-3 gfm 0.5 scope features layers 1 dgfg 16 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8
}

// -----

// With recompute off, offload carries the plan alone.
// CHECK-LABEL: mtp.model @offload_only
// CHECK: mtp.step plan <{{.*}} regions [], offloads ["layer 1 attention" 641024 stream 1 wait {{.*}}, "layer 2 attention" 641024 stream 1 wait {{.*}}]>
// CHECK-NOT: plan recompute
// CHECK: mtp.fwd attn_core[1]{{.*}} plan offload :
mtp.model @offload_only {
  mtp.backbone transformer(layers = 4, hidden = 64, heads = 4, ffn = 256, vocab = 512, seq = 32, dropout = 0.1) pointwise aten
  mtp.task @pos : tag(labels = 12) from layer 2 loss cross_entropy weight 1.0
  mtp.task @topic : classify(classes = 4) from pooled layer 4 loss cross_entropy weight 1.0
  mtp.budget device "cpu" memory 7900 KiB headroom 0 B link 10 GBps gpus 1 batch 8 micro 8 precision fp32
  mtp.strategy checkpoint none every 1 threshold 0.5 offload cpu_pinned max_latency 1.0 gfm 0.5 scope features layers 1 dgfg 16 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8
}
