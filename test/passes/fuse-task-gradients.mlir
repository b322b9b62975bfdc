// RUN: mtp-opt %s -split-input-file --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step,mtp-fuse-task-gradients))' | FileCheck %s
// RUN: mtp-opt %s -split-input-file -mlir-print-op-on-diagnostic=false --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step,mtp-fuse-task-gradients{remarks=true}))' 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK

// REMARK: remark: fused the gradients of 2 tasks at their taps (scope features, GFM, per-task clipping): 4608 FLOPs, 7872 bytes of workspace
// REMARK: remark: fused the gradients of 2 tasks at their taps (scope params): 768 FLOPs, 0 bytes of workspace

// After both heads' backward, one op takes the tap gradients and returns
// what the backbone receives: the later joins read its results, never the
// raw per-task gradients.
// CHECK-LABEL: mtp.model @features
// CHECK: %[[HI:d_head_hi]] = mtp.bwd head[0] @hi
// CHECK: %[[LO:d_head_lo]] = mtp.bwd head[0] @lo
// CHECK-NEXT: %[[F:.*]]:2 = mtp.fuse_task_grads [@hi, @lo](%[[HI]], %[[LO]]) scope features gfm 3.000000e-01 clip 1.000000e+00 gate 32 flops {{[0-9]+}} workspace 7872 : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>)
// CHECK-NEXT: mtp.bwd mlp_residual[2] grads(%[[F]]#0)
// CHECK: mtp.add_grads %{{.*}}, %[[F]]#1
// The one backbone backward holds its roots (the taps) and grad_outputs
// until it returns: released after the embeddings' backward.
// CHECK: mtp.bwd embed[0]
// CHECK-NEXT: mtp.release %mlp_residual2, %mlp_residual1, %[[F]]#0, %[[F]]#1
// CHECK-NOT: %[[LO]]
mtp.model @features {
  mtp.backbone transformer(layers = 2, hidden = 8, heads = 2, ffn = 16, vocab = 10, seq = 4, dropout = 0.1)
  mtp.task @lo : tag(labels = 3) from layer 1 loss cross_entropy weight 1.0
  mtp.task @hi : classify(classes = 2) from pooled layer 2 loss cross_entropy weight 1.0
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 10 GBps gpus 1 batch 2 micro 2 precision fp32
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope features layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8
}

// -----

// The params scope holds k layers x tasks of per-task gradients (2 tasks x
// 1 layer x 600 parameters x 4 bytes, which the timeline counts from each
// head's backward); without GFM and clipping the pipeline makes no
// processed copies of them: no workspace. The heads' partial backwards
// keep their graphs: their and the losses' saved tensors live through the
// fuse op.
// CHECK-LABEL: mtp.model @params
// CHECK: mtp.fuse_task_grads [@hi, @lo]({{.*}}) scope params gfm none clip 0.000000e+00 gate none flops {{[0-9]+}} :
// CHECK-NEXT: mtp.release %loss_hi_log_probs, %loss_hi_total_weight, %head_hi_mean, %head_hi_rstd, %head_hi_pooled, %loss_lo_log_probs, %loss_lo_total_weight, %head_lo_mean, %head_lo_rstd :
// CHECK-NEXT: mtp.bwd
mtp.model @params {
  mtp.backbone transformer(layers = 2, hidden = 8, heads = 2, ffn = 16, vocab = 10, seq = 4, dropout = 0.1)
  mtp.task @lo : tag(labels = 3) from layer 1 loss cross_entropy weight 1.0
  mtp.task @hi : classify(classes = 2) from pooled layer 2 loss cross_entropy weight 1.0
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 10 GBps gpus 1 batch 2 micro 2 precision fp32
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm none scope params layers 1 dgfg none recalibrate reuse 0.15 std 0.4 clip none max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8
}

// -----

// Without a strategy the step keeps the plain sum of the losses.
// CHECK-LABEL: mtp.model @plain
// CHECK-NOT: mtp.fuse_task_grads
mtp.model @plain {
  mtp.backbone transformer(layers = 2, hidden = 8, heads = 2, ffn = 16, vocab = 10, seq = 4, dropout = 0.1)
  mtp.task @lo : tag(labels = 3) from layer 1 loss cross_entropy weight 1.0
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 10 GBps gpus 1 batch 2 micro 2 precision fp32
}
