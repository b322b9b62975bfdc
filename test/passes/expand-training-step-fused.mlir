// RUN: mtp-opt %s --split-input-file --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step))' | FileCheck %s
// RUN: mtp-opt %s --split-input-file --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step))' | mtp-opt --split-input-file | FileCheck %s
// RUN: mtp-opt %s --split-input-file --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step))' | sed -e 's/freed 5040/freed 99999/' | not mtp-opt --split-input-file 2>&1 | FileCheck %s --check-prefix=FREED
// FREED: error: 'mtp.bwd' op frees 99999 bytes at its peak but saves only 6400
// RUN: not mtp-opt %s --split-input-file --pass-pipeline='builtin.module(mtp.model(mtp-normalize-spec))' 2>&1 | FileCheck %s --check-prefix=BF16

// The fused pointwise kernels in the step IR (expand-training-step.mlir has
// the ATen rows): a linear after a norm or the GELU saves nothing — qkv,
// mlp_up and mlp_down take no saved operand, the heads keep no norm output
// — and the backward passes its gradient through: the residual add hands
// its incoming gradient to both branches (no dropout), the GELU backward
// scales it in place (`aliases`).
mtp.model @two {
  mtp.backbone transformer(layers = 1, hidden = 8, heads = 2, ffn = 16, vocab = 10, seq = 4, dropout = 0.0) attention fused pointwise fused
  mtp.task @lo : tag(labels = 3) from layer 1 loss cross_entropy weight 1.0
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 10 GBps gpus 1 batch 2 micro 2 precision fp32
}

// CHECK-LABEL: mtp.step {
// CHECK: mtp.fwd head[0] @lo({{.*}}) {{.*}} saves ["mean", "rstd"] :
// CHECK: mtp.bwd head[0] @lo grads(%{{.*}}) saved(%mlp_residual1, %head_lo_mean, %head_lo_rstd) flops
// CHECK-NEXT: mtp.bwd mlp_residual[1] grads(%d_head_lo) saved() flops {{[0-9]+}} aliases 2 :
// CHECK-NEXT: mtp.bwd mlp_down[1] grads(%d_mlp_residual1_0) saved() flops
// CHECK-NEXT: mtp.bwd mlp_act[1] grads(%d_mlp_down1) saved(%mlp_up1) flops {{[0-9]+}} aliases 1 :
// CHECK-NEXT: mtp.bwd mlp_up[1] grads(%d_mlp_act1) saved() flops
// CHECK-NEXT: mtp.bwd mlp_norm[1] grads(%d_mlp_up1) saved(%attn_residual1, %mlp_norm1_mean, %mlp_norm1_rstd)
// CHECK-NEXT: mtp.add_grads
// CHECK-NEXT: mtp.bwd attn_residual[1] {{.*}} aliases 2 :
// CHECK-NEXT: mtp.bwd attn_out[1] {{.*}} saved(%attn_core1)
// CHECK-NEXT: mtp.bwd attn_core[1] {{.*}} saved(%qkv1, %attn_core1, %attn_core1_logsumexp)
// CHECK-NEXT: mtp.bwd qkv[1] grads(%d_attn_core1) saved() flops

// -----

// Under 16-bit autocast the fused kernels do not run: asking for them is an
// error at the backbone.
mtp.model @half {
  // BF16: error: 'mtp.backbone' op pointwise fused needs precision fp32
  mtp.backbone transformer(layers = 1, hidden = 8, heads = 2, ffn = 16, vocab = 10, seq = 4, dropout = 0.0) pointwise fused
  mtp.task @lo : tag(labels = 3) from layer 1 loss cross_entropy weight 1.0
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 10 GBps gpus 1 batch 2 micro 2 precision bf16
}

// -----

// A decoder head's backward runs its layers' nodes last to first, freeing
// each one's saved tensors and creating its weights' gradients as it goes.
// Here the gradients outweigh the activations, so its peak is late, at
// layer 1's self-attention: all saved but that phase's 1104 B (its own but
// its output, the embedding's) are freed, and only the embeddings'
// gradients are pending ((6 + 3) x 8 floats = 288 B).
mtp.model @gen {
  mtp.backbone transformer(layers = 1, hidden = 8, heads = 2, ffn = 16, vocab = 10, seq = 4, dropout = 0.0) attention fused pointwise fused
  mtp.task @mt : decoder(layers = 2, vocab = 6, target_seq = 3) from layer 1 loss cross_entropy weight 1.0
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 10 GBps gpus 1 batch 2 micro 2 precision fp32
}

// CHECK-LABEL: mtp.step {
// CHECK: mtp.bwd head[0] @mt grads({{.*}}) saved({{.*}}) flops {{[0-9]+}} workspace {{[0-9]+}} freed 5040 pending 288 :
