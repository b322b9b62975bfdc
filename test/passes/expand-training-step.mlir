// RUN: mtp-opt %s --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step))' | FileCheck %s
// RUN: mtp-opt %s --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step))' | mtp-opt | FileCheck %s
// RUN: not mtp-opt %s --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step,mtp-expand-training-step))' 2>&1 | FileCheck %s --check-prefix=TWICE

// A 2-layer, 2-task spec: @lo tags tokens from layer 1, @hi classifies the
// pooled top layer. B=2, S=4, H=8, 2 heads, F=16, fp32, dropout on, ATen's
// pointwise ops (expand-training-step-fused.mlir: the fused ones).
mtp.model @two {
  mtp.backbone transformer(layers = 2, hidden = 8, heads = 2, ffn = 16, vocab = 10, seq = 4, dropout = 0.1) pointwise aten
  mtp.task @lo : tag(labels = 3) from layer 1 loss cross_entropy weight 1.0
  mtp.task @hi : classify(classes = 2) from pooled layer 2 loss cross_entropy weight 1.0
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 10 GBps gpus 1 batch 2 micro 2 precision fp32
}

// CHECK-LABEL: mtp.step {
// Inputs and the parameter groups.
// CHECK-NEXT: %[[TOK:.*]] = mtp.input "tokens" : tensor<2x4xi64>
// CHECK-NEXT: %[[LLO:.*]] = mtp.input "labels" @lo : tensor<2x4xi64>
// CHECK-NEXT: %[[LHI:.*]] = mtp.input "labels" @hi : tensor<2xi64>
// CHECK-NEXT: mtp.weights "embed" params 112
// CHECK-NEXT: mtp.weights "layer1" params 600
// CHECK-NEXT: mtp.weights "layer2" params 600
// CHECK-NEXT: mtp.weights "head" @lo params 43
// CHECK-NEXT: mtp.weights "head" @hi params 106

// Forward, layer 1: every sub-block, with what it saves.
// CHECK-NEXT: %[[X0:embed]], %[[X0M:.*]] = mtp.fwd embed[0](%[[TOK]]) {{.*}} saves ["mask"] : (tensor<2x4xi64>) -> (tensor<2x4x8xf32>, tensor<2x4x8xi1>)
// CHECK-NEXT: %[[N1:attn_norm1]], %[[N1M:.*]], %[[N1R:.*]] = mtp.fwd attn_norm[1](%[[X0]]) {{.*}} saves ["mean", "rstd"]
// CHECK-NEXT: %[[QKV1:qkv1]] = mtp.fwd qkv[1](%[[N1]]) flops 3072 : (tensor<2x4x8xf32>) -> tensor<2x4x24xf32>
// CHECK-NEXT: %[[C1:attn_core1]], {{.*}} = mtp.fwd attn_core[1](%[[QKV1]]) flops 1408 workspace 512 saves ["q", "k_t", "probs", "probs_mask", "probs_dropped", "v"] : (tensor<2x4x24xf32>) -> (tensor<2x4x8xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xi1>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>)
// CHECK-NEXT: %[[O1:attn_out1]] = mtp.fwd attn_out[1](%[[C1]])
// CHECK-NEXT: %[[Y1:attn_residual1]], %{{.*}} = mtp.fwd attn_residual[1](%[[X0]], %[[O1]])
// CHECK-NEXT: %[[M1:mlp_norm1]], {{.*}} = mtp.fwd mlp_norm[1](%[[Y1]])
// CHECK-NEXT: %[[U1:mlp_up1]] = mtp.fwd mlp_up[1](%[[M1]]) {{.*}} -> tensor<2x4x16xf32>
// CHECK-NEXT: %[[A1:mlp_act1]] = mtp.fwd mlp_act[1](%[[U1]])
// CHECK-NEXT: %[[D1:mlp_down1]] = mtp.fwd mlp_down[1](%[[A1]])
// CHECK-NEXT: %[[X1:mlp_residual1]], %{{.*}} = mtp.fwd mlp_residual[1](%[[Y1]], %[[D1]])

// @lo's head and loss right at its tap, reading layer 1's output.
// CHECK-NEXT: %[[HLO:head_lo]], {{.*}} = mtp.fwd head[0] @lo(%[[X1]]) {{.*}} saves ["mean", "rstd", "normed"]
// CHECK-NEXT: %loss_lo, %[[LPLO:loss_lo_log_probs]], %[[LWLO:loss_lo_total_weight]] = mtp.fwd loss[0] @lo(%[[HLO]], %[[LLO]]) {{.*}} -> (tensor<f32>, tensor<8x3xf32>, tensor<f32>)

// Layer 2 reads the same value.
// CHECK-NEXT: mtp.fwd attn_norm[2](%[[X1]])
// CHECK-COUNT-9: mtp.fwd {{[a-z_]+}}[2]
// CHECK-NEXT: %[[HHI:head_hi]], {{.*}} = mtp.fwd head[0] @hi(%mlp_residual2)
// CHECK-NEXT: mtp.fwd loss[0] @hi(%[[HHI]], %[[LHI]])

// Each task's loss and head backward, latest first: gradients at the taps.
// CHECK-NEXT: %[[DLHI:d_loss_hi]] = mtp.bwd loss[0] @hi grads() saved(%loss_hi_log_probs, %loss_hi_total_weight)
// CHECK-NEXT: %[[GHI:d_head_hi]] = mtp.bwd head[0] @hi grads(%[[DLHI]]) saved(%mlp_residual2, %head_hi_mean, %head_hi_rstd, %head_hi_normed, %head_hi_pooled)
// CHECK-NEXT: %[[DLLO:d_loss_lo]] = mtp.bwd loss[0] @lo grads() saved(%[[LPLO]], %[[LWLO]])
// CHECK-NEXT: %[[GLO:d_head_lo]] = mtp.bwd head[0] @lo grads(%[[DLLO]]) saved(%[[X1]], %head_lo_mean, %head_lo_rstd, %head_lo_normed)

// The backbone backward from the top, each unit taking what it saved.
// CHECK-NEXT: mtp.bwd mlp_residual[2] grads(%[[GHI]]) saved(%mlp_residual2_mask)
// CHECK-NEXT: mtp.bwd mlp_down[2] {{.*}} saved(%mlp_act2)
// CHECK-NEXT: mtp.bwd mlp_act[2] {{.*}} saved(%mlp_up2)
// CHECK-NEXT: mtp.bwd mlp_up[2] {{.*}} saved(%mlp_norm2)
// CHECK-NEXT: mtp.bwd mlp_norm[2] {{.*}} saved(%attn_residual2, %mlp_norm2_mean, %mlp_norm2_rstd)
// CHECK-NEXT: mtp.add_grads
// CHECK-NEXT: mtp.bwd attn_residual[2] {{.*}} saved(%attn_residual2_mask)
// CHECK-NEXT: mtp.bwd attn_out[2] {{.*}} saved(%attn_core2)
// CHECK-NEXT: mtp.bwd attn_core[2] {{.*}} saved(%attn_core2_q, %attn_core2_k_t, %attn_core2_probs, %attn_core2_probs_mask, %attn_core2_probs_dropped, %attn_core2_v) flops 2368 workspace 768 freed 512
// CHECK-NEXT: mtp.bwd qkv[2] {{.*}} saved(%attn_norm2)
// CHECK-NEXT: %[[DN2:d_attn_norm2]] = mtp.bwd attn_norm[2] {{.*}} saved(%[[X1]], %attn_norm2_mean, %attn_norm2_rstd)
// CHECK-NEXT: %[[S2:.*]] = mtp.add_grads %d_attn_residual2, %[[DN2]]
// Where @lo reads, its tap gradient joins the stream.
// CHECK-NEXT: %[[J1:.*]] = mtp.add_grads %[[S2]], %[[GLO]] : tensor<2x4x8xf32>
// CHECK-NEXT: mtp.bwd mlp_residual[1] grads(%[[J1]])
// CHECK-COUNT-4: mtp.bwd {{[a-z_]+}}[1]
// CHECK-NEXT: mtp.add_grads
// CHECK-COUNT-5: mtp.bwd {{[a-z_]+}}[1]
// CHECK-NEXT: %[[DX0:.*]] = mtp.add_grads
// CHECK-NEXT: mtp.bwd embed[0] grads(%[[DX0]]) saved(%[[TOK]], %[[X0M]]) flops 128 : (tensor<2x4x8xf32>, tensor<2x4xi64>, tensor<2x4x8xi1>) -> ()
// Gradient buckets, top layers first (one bucket: 1461 values < 25 MiB).
// CHECK-NEXT: mtp.allreduce 1461 values ["head.hi", "head.lo", "layer2", "layer1", "embed"]
// CHECK-NEXT: mtp.optimizer_step flops 17532
// CHECK-NEXT: }

// TWICE: error: model 'two' is already expanded into a step
