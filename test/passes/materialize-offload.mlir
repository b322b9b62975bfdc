// RUN: mtp-opt %s --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step,mtp-plan-memory,mtp-materialize-offload,mtp-memory-analysis))' | FileCheck %s
// RUN: mtp-opt %s --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step,mtp-plan-memory,mtp-materialize-offload))' | mtp-opt | FileCheck %s --check-prefix=ROUNDTRIP
// RUN: mtp-opt %s -mlir-print-op-on-diagnostic=false --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step,mtp-plan-memory,mtp-materialize-offload{remarks=true}))' 2>&1 | FileCheck %s --check-prefix=REMARK

// REMARK: remark: offloaded 22 tensors (1282048 bytes) of 10 units on stream 1, each prefetched one unit group ahead
// REMARK-COUNT-22: mtp.offload {{.*}} stream 1
// REMARK-NOT: mtp.offload 

// Recompute is off, so the plan offloads (7900 KiB; keeping everything peaks at
// 8.54 MiB). Each tensor only its unit's backward reads leaves after its last
// forward use and comes back one unit group ahead of its backward, where the
// compute stream waits for it. The analysis of the result is exactly the
// planned peak.
// CHECK-LABEL: mtp.model @offload
// CHECK: mtp.step plan <peak [[PEAK:[0-9]+]], {{.*}}> attributes {{{.*}}mtp.peak_bytes = [[PEAK]] : i64,

// Layer 1's attention core saves its softmax output: offloaded right after
// the attention output projection (its last forward use is the core itself).
// CHECK: %attn_core1, {{.*}}%attn_core1_probs, {{.*}} = mtp.fwd attn_core[1]
// CHECK: %[[HOST:.*]] = mtp.offload %attn_core1_probs stream 1 : tensor<8x4x32x32xf32>

// Prefetched where layer 1's MLP backward starts, waited for before the
// attention core's backward, which reads the prefetched copy.
// CHECK: %[[DEV:.*]] = mtp.prefetch %[[HOST]] stream 1 : tensor<8x4x32x32xf32>
// CHECK: mtp.bwd mlp_residual[1]
// CHECK: mtp.wait %[[DEV]] : tensor<8x4x32x32xf32>
// CHECK: mtp.bwd attn_core[1] {{.*}}%[[DEV]]

// ROUNDTRIP: mtp.offload
// ROUNDTRIP: mtp.prefetch
// ROUNDTRIP: mtp.wait
mtp.model @offload {
  mtp.backbone transformer(layers = 4, hidden = 64, heads = 4, ffn = 256, vocab = 512, seq = 32, dropout = 0.1) pointwise aten
  mtp.task @pos : tag(labels = 12) from layer 2 loss cross_entropy weight 1.0
  mtp.task @chunk : tag(labels = 8) from layer 2 loss cross_entropy weight 0.5
  mtp.task @topic : classify(classes = 4) from pooled layer 4 loss cross_entropy weight 1.0
  mtp.budget device "cpu" memory 7900 KiB headroom 0 B link 10 GBps gpus 1 batch 8 micro 8 precision fp32
  mtp.strategy checkpoint none every 1 threshold 0.5 offload cpu_pinned max_latency 1.0 gfm 0.5 scope features layers 1 dgfg 16 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8
}
