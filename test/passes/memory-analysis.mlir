// RUN: mtp-opt %s --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step,mtp-memory-analysis{print=true}))' | FileCheck %s
// RUN: mtp-opt %s --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step,mtp-memory-analysis))' | FileCheck %s --check-prefix=ATTRS
// RUN: not mtp-opt %s --pass-pipeline='builtin.module(mtp.model(mtp-memory-analysis))' 2>&1 | FileCheck %s --check-prefix=NOSTEP

// The 2-layer, 2-task step of expand-training-step.mlir. Worked by hand
// (unittests/compiler/CostModelTest.cpp): parameters 1461 fp32 = 5844 B,
// AdamW state 11688 B; each layer saves 3904 B (ATen's pointwise ops).
mtp.model @two {
  mtp.backbone transformer(layers = 2, hidden = 8, heads = 2, ffn = 16, vocab = 10, seq = 4, dropout = 0.1) pointwise aten
  mtp.task @lo : tag(labels = 3) from layer 1 loss cross_entropy weight 1.0
  mtp.task @hi : classify(classes = 2) from pooled layer 2 loss cross_entropy weight 1.0
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 10 GBps gpus 1 batch 2 micro 2 precision fp32
}

// CHECK-LABEL: memory analysis of 'two'
// CHECK-NEXT: peak {{.*}} at bwd mlp_down[2]
// CHECK-NEXT: parameters      5.71 KiB
// CHECK-NEXT: gradients
// CHECK-NEXT: optimizer       11.41 KiB
// CHECK-NEXT: activations
// CHECK-NEXT: activation grads
// CHECK-NEXT: workspace       0 B
// CHECK-NEXT: saved activations
// CHECK-NEXT: only for lo: 420 B
// CHECK-NEXT: only for hi:
// The runtime's definition: @lo depends on the embeddings (320 B) and layer
// 1 (3904 B), @hi on those and layer 2 (3904 B); what both depend on, counted
// per task, over all: 2*4224 / (2*4224 + 3904) = 0.6839.
// CHECK-NEXT: activation_reuse_ratio 0.6839

// ATTRS-LABEL: mtp.model @two
// ATTRS: mtp.step attributes {
// ATTRS-SAME: optimizer = 11688 : i64, parameters = 5844 : i64
// ATTRS-SAME: mtp.peak_at = "bwd mlp_down[2]"
// ATTRS-SAME: mtp.task_only_bytes = {{{.*}}lo = 420 : i64}

// NOSTEP: error: model 'two' has no training step; run --mtp-expand-training-step first
