// A planned one-layer, one-task step (mtpc --emit=step of a tiny spec):
// the bad-step tests (bad-step.test) break it one way at a time.
module {
  mtp.model @s {
    mtp.backbone transformer(layers = 1, hidden = 8, heads = 2, ffn = 16, vocab = 16, seq = 4, dropout = 0.000000e+00)
    mtp.task @a : tag(labels = 3) from layer 1 loss cross_entropy weight 1.000000e+00 lr cosine(3.000000e-04, warmup = 0)
    mtp.budget device "cpu" memory 1 GiB headroom 0 B link 10 GBps gpus 1 batch 2 micro 2 precision fp32
    mtp.strategy checkpoint uniform every 1 threshold 5.000000e-01 offload auto max_latency 1.200000e-03 gfm 3.000000e-01 scope features layers 1 dgfg 32 recalibrate reuse 1.500000e-01 std 4.000000e-01 clip per_task max_norm 1.000000e+00 collective auto topk 1.500000e-01 block 256 bits 8 decay 8.000000e-01
    mtp.train steps 10 seed 0 data synthetic lr cosine(3.000000e-04, warmup = 0) adamw(weight_decay = 1.000000e-02, beta1 = 9.000000e-01, beta2 = 0.99899999999999999, eps = 1.000000e-08) log_every 10 save_every 0
    mtp.step plan <peak 19836, keep 19580, uniform 19836, minimal 19836, added 1.203200e-08, uniform_added 1.203200e-08, regions [1 to 2], offloads []> attributes {mtp.activation_reuse_ratio = 0.000000e+00 : f64, mtp.breakdown = {activation_grads = 1280 : i64, activations = 4032 : i64, gradients = 2572 : i64, optimizer = 7968 : i64, parameters = 3984 : i64, workspace = 0 : i64}, mtp.peak_at = "bwd mlp_down[1]", mtp.peak_bytes = 19836 : i64, mtp.saved_bytes = 4196 : i64, mtp.task_only_bytes = {a = 4196 : i64}} {
      %0 = mtp.input "tokens" : tensor<2x4xi64>
      %1 = mtp.input "labels" @a : tensor<2x4xi64>
      mtp.weights "embed" params 160
      mtp.weights "layer1" params 600
      mtp.weights "head" @a params 43
      mtp.weights "gate" params 193
      %embed = mtp.fwd embed[0](%0) flops 128 workspace 256 plan keep : (tensor<2x4xi64>) -> tensor<2x4x8xf32>
      %2 = mtp.checkpoint 0(%embed) : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32> {
        %attn_norm1, %attn_norm1_mean, %attn_norm1_rstd = mtp.fwd attn_norm[1](%embed) flops 512 saves ["mean", "rstd"] plan recompute region 0 : (tensor<2x4x8xf32>) -> (tensor<2x4x8xf32>, tensor<2x4x1xf32>, tensor<2x4x1xf32>)
        %qkv1 = mtp.fwd qkv[1](%attn_norm1) flops 3072 plan recompute region 0 : (tensor<2x4x8xf32>) -> tensor<2x4x24xf32>
        %attn_core1, %attn_core1_q, %attn_core1_k_t, %attn_core1_probs, %attn_core1_v = mtp.fwd attn_core[1](%qkv1) flops 1408 workspace 512 saves ["q", "k_t", "probs", "v"] plan recompute region 0 : (tensor<2x4x24xf32>) -> (tensor<2x4x8xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>)
        %attn_out1 = mtp.fwd attn_out[1](%attn_core1) flops 1024 plan recompute region 0 : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
        %attn_residual1 = mtp.fwd attn_residual[1](%embed, %attn_out1) flops 192 plan recompute region 0 : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
        %mlp_norm1, %mlp_norm1_mean, %mlp_norm1_rstd = mtp.fwd mlp_norm[1](%attn_residual1) flops 512 saves ["mean", "rstd"] plan recompute region 0 : (tensor<2x4x8xf32>) -> (tensor<2x4x8xf32>, tensor<2x4x1xf32>, tensor<2x4x1xf32>)
        %mlp_up1 = mtp.fwd mlp_up[1](%mlp_norm1) flops 2048 plan recompute region 0 : (tensor<2x4x8xf32>) -> tensor<2x4x16xf32>
        %mlp_act1 = mtp.fwd mlp_act[1](%mlp_up1) flops 1024 plan recompute region 0 : (tensor<2x4x16xf32>) -> tensor<2x4x16xf32>
        %mlp_down1 = mtp.fwd mlp_down[1](%mlp_act1) flops 2048 plan recompute region 0 : (tensor<2x4x16xf32>) -> tensor<2x4x8xf32>
        %mlp_residual1 = mtp.fwd mlp_residual[1](%attn_residual1, %mlp_down1) flops 192 plan recompute region 0 : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
        mtp.yield %mlp_residual1 : tensor<2x4x8xf32>
      }
      %head_a, %head_a_mean, %head_a_rstd, %head_a_normed = mtp.fwd head[0] @a(%2) flops 896 saves ["mean", "rstd", "normed"] plan keep : (tensor<2x4x8xf32>) -> (tensor<2x4x3xf32>, tensor<2x4x1xf32>, tensor<2x4x1xf32>, tensor<2x4x8xf32>)
      %loss_a, %loss_a_log_probs, %loss_a_total_weight = mtp.fwd loss[0] @a(%head_a, %1) flops 120 saves ["log_probs", "total_weight"] plan keep : (tensor<2x4x3xf32>, tensor<2x4xi64>) -> (tensor<f32>, tensor<8x3xf32>, tensor<f32>)
      %d_loss_a = mtp.bwd loss[0] @a grads() saved(%loss_a_log_probs, %loss_a_total_weight) flops 72 workspace 96 : (tensor<8x3xf32>, tensor<f32>) -> tensor<2x4x3xf32>
      %d_head_a = mtp.bwd head[0] @a grads(%d_loss_a) saved(%2, %head_a_mean, %head_a_rstd, %head_a_normed) flops 1792 : (tensor<2x4x3xf32>, tensor<2x4x8xf32>, tensor<2x4x1xf32>, tensor<2x4x1xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
      %3 = mtp.fuse_task_grads [@a](%d_head_a) scope features gfm 3.000000e-01 clip 1.000000e+00 gate 32 flops 2304 workspace 512 : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
      %4:15 = mtp.recompute 0(%embed) : (tensor<2x4x8xf32>) -> (tensor<2x4x8xf32>, tensor<2x4x1xf32>, tensor<2x4x1xf32>, tensor<2x4x8xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x1xf32>, tensor<2x4x1xf32>, tensor<2x4x16xf32>, tensor<2x4x16xf32>, tensor<2x4x8xf32>) {
        %attn_norm1, %attn_norm1_mean, %attn_norm1_rstd = mtp.fwd attn_norm[1](%embed) flops 512 saves ["mean", "rstd"] : (tensor<2x4x8xf32>) -> (tensor<2x4x8xf32>, tensor<2x4x1xf32>, tensor<2x4x1xf32>)
        %qkv1 = mtp.fwd qkv[1](%attn_norm1) flops 3072 : (tensor<2x4x8xf32>) -> tensor<2x4x24xf32>
        %attn_core1, %attn_core1_q, %attn_core1_k_t, %attn_core1_probs, %attn_core1_v = mtp.fwd attn_core[1](%qkv1) flops 1408 workspace 512 saves ["q", "k_t", "probs", "v"] : (tensor<2x4x24xf32>) -> (tensor<2x4x8xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>)
        %attn_out1 = mtp.fwd attn_out[1](%attn_core1) flops 1024 : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
        %attn_residual1 = mtp.fwd attn_residual[1](%embed, %attn_out1) flops 192 : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
        %mlp_norm1, %mlp_norm1_mean, %mlp_norm1_rstd = mtp.fwd mlp_norm[1](%attn_residual1) flops 512 saves ["mean", "rstd"] : (tensor<2x4x8xf32>) -> (tensor<2x4x8xf32>, tensor<2x4x1xf32>, tensor<2x4x1xf32>)
        %mlp_up1 = mtp.fwd mlp_up[1](%mlp_norm1) flops 2048 : (tensor<2x4x8xf32>) -> tensor<2x4x16xf32>
        %mlp_act1 = mtp.fwd mlp_act[1](%mlp_up1) flops 1024 : (tensor<2x4x16xf32>) -> tensor<2x4x16xf32>
        %mlp_down1 = mtp.fwd mlp_down[1](%mlp_act1) flops 2048 : (tensor<2x4x16xf32>) -> tensor<2x4x8xf32>
        %mlp_residual1 = mtp.fwd mlp_residual[1](%attn_residual1, %mlp_down1) flops 192 : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
        mtp.yield %attn_norm1, %attn_norm1_mean, %attn_norm1_rstd, %attn_core1, %attn_core1_q, %attn_core1_k_t, %attn_core1_probs, %attn_core1_v, %attn_residual1, %mlp_norm1, %mlp_norm1_mean, %mlp_norm1_rstd, %mlp_up1, %mlp_act1, %mlp_residual1 : tensor<2x4x8xf32>, tensor<2x4x1xf32>, tensor<2x4x1xf32>, tensor<2x4x8xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x1xf32>, tensor<2x4x1xf32>, tensor<2x4x16xf32>, tensor<2x4x16xf32>, tensor<2x4x8xf32>
      }
      %d_mlp_residual1, %d_mlp_residual1_0 = mtp.bwd mlp_residual[1] grads(%3) saved() flops 128 : (tensor<2x4x8xf32>) -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>)
      %d_mlp_down1 = mtp.bwd mlp_down[1] grads(%d_mlp_residual1_0) saved(%4#13) flops 4096 : (tensor<2x4x8xf32>, tensor<2x4x16xf32>) -> tensor<2x4x16xf32>
      %d_mlp_act1 = mtp.bwd mlp_act[1] grads(%d_mlp_down1) saved(%4#12) flops 1536 : (tensor<2x4x16xf32>, tensor<2x4x16xf32>) -> tensor<2x4x16xf32>
      %d_mlp_up1 = mtp.bwd mlp_up[1] grads(%d_mlp_act1) saved(%4#9) flops 4096 : (tensor<2x4x16xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
      %d_mlp_norm1 = mtp.bwd mlp_norm[1] grads(%d_mlp_up1) saved(%4#8, %4#10, %4#11) flops 768 : (tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x1xf32>, tensor<2x4x1xf32>) -> tensor<2x4x8xf32>
      %5 = mtp.add_grads %d_mlp_residual1, %d_mlp_norm1 : tensor<2x4x8xf32>
      %d_attn_residual1, %d_attn_residual1_1 = mtp.bwd attn_residual[1] grads(%5) saved() flops 128 : (tensor<2x4x8xf32>) -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>)
      %d_attn_out1 = mtp.bwd attn_out[1] grads(%d_attn_residual1_1) saved(%4#3) flops 2048 : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
      %d_attn_core1 = mtp.bwd attn_core[1] grads(%d_attn_out1) saved(%4#4, %4#5, %4#6, %4#7) flops 2368 workspace 1280 : (tensor<2x4x8xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>) -> tensor<2x4x24xf32>
      %d_qkv1 = mtp.bwd qkv[1] grads(%d_attn_core1) saved(%4#0) flops 6144 : (tensor<2x4x24xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
      %d_attn_norm1 = mtp.bwd attn_norm[1] grads(%d_qkv1) saved(%embed, %4#1, %4#2) flops 768 : (tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x1xf32>, tensor<2x4x1xf32>) -> tensor<2x4x8xf32>
      mtp.release %4#14 : tensor<2x4x8xf32>
      %6 = mtp.add_grads %d_attn_residual1, %d_attn_norm1 : tensor<2x4x8xf32>
      mtp.bwd embed[0] grads(%6) saved(%0) flops 128 : (tensor<2x4x8xf32>, tensor<2x4xi64>) -> ()
      mtp.release %2, %3 : tensor<2x4x8xf32>, tensor<2x4x8xf32>
      mtp.allreduce 803 values ["head.a", "layer1", "embed"]
      mtp.optimizer_step flops 11952
    }
  }
}
