// RUN: mtp-opt %s --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step,mtp-plan-memory,mtp-materialize-checkpoints,mtp-memory-analysis))' | FileCheck %s
// RUN: mtp-opt %s --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step,mtp-plan-memory,mtp-materialize-checkpoints))' | mtp-opt | FileCheck %s --check-prefix=ROUNDTRIP
// RUN: mtp-opt %s -mlir-print-op-on-diagnostic=false --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step,mtp-plan-memory,mtp-materialize-checkpoints{remarks=true}))' 2>&1 | FileCheck %s --check-prefix=REMARK

// The remark counts what the IR holds: two regions, each re-run once, and one
// block's projections at tensor grain.
// REMARK: remark: materialized 2 checkpoint regions: 10 forward units, 22 saved tensors recomputed before their backward; 3 projection outputs of 1 blocks recomputed at their first backward use
// REMARK-COUNT-2: mtp.checkpoint
// REMARK-NOT: mtp.checkpoint

// The plan of plan-memory.mlir (7000 KiB, a 1 GB/s link: the attention blocks of layers 1
// and 3 recomputed, layer 3's MLP projections at tensor grain). Each region's forward units move into an mtp.checkpoint
// that keeps only its boundary; an mtp.recompute before the region's
// backward re-creates what the backward takes. The memory analysis of the
// result is exactly the peak the planner simulated.
// CHECK-LABEL: mtp.model @auto
// CHECK: mtp.step plan <peak [[PEAK:[0-9]+]], {{.*}}> attributes {{{.*}}mtp.peak_bytes = [[PEAK]] : i64,

// Region 0: layer 1's attention block, from the embeddings.
// CHECK: %[[Y1:.*]] = mtp.checkpoint 0(%embed) : (tensor<8x32x64xf32>) -> tensor<8x32x64xf32> {
// CHECK-NEXT: mtp.fwd attn_norm[1](%embed)
// CHECK-COUNT-4: mtp.fwd
// CHECK-NEXT: mtp.yield %attn_residual1 : tensor<8x32x64xf32>
// CHECK-NEXT: }
// The rest of the step reads the region's output.
// CHECK-NEXT: mtp.fwd mlp_norm[1](%[[Y1]])

// Tensor grain: layer 3's MLP units stay in the forward (planned recompute,
// no region); right before the first backward unit reading their outputs, a
// partial mtp.recompute re-creates the norm, up-projection and GELU outputs
// from the block's input, and the backward units read those.
// CHECK: %[[P:.*]]:3 = mtp.recompute 6 partial(%[[IN:[0-9a-z_]+]])
// CHECK-NEXT: mtp.fwd mlp_norm[3](%[[IN]])
// CHECK-NEXT: mtp.fwd mlp_up[3]
// CHECK-NEXT: mtp.fwd mlp_act[3]
// CHECK-NEXT: mtp.yield
// CHECK-NEXT: }
// CHECK-NEXT: mtp.bwd mlp_down[3] {{.*}}saved(%[[P]]#2)
// CHECK-NEXT: mtp.bwd mlp_act[3] {{.*}}saved(%[[P]]#1)
// CHECK-NEXT: mtp.bwd mlp_up[3] {{.*}}saved(%[[P]]#0)

// Before layer 1's attention backward: the units again, from the boundary;
// it yields what the backward takes and, last, the re-created output, held
// until the region's backward ends.
// CHECK: %[[R:.*]]:12 = mtp.recompute 0(%embed)
// CHECK-NEXT: mtp.fwd attn_norm[1](%embed)
// CHECK: mtp.yield %attn_norm1{{.*}}, %attn_residual1 :
// CHECK-NEXT: }
// CHECK-NEXT: mtp.bwd attn_residual[1] {{.*}} saved(%[[R]]#10)
// CHECK: mtp.bwd attn_norm[1]
// CHECK-NEXT: mtp.release %[[R]]#11 : tensor<8x32x64xf32>

// ROUNDTRIP: mtp.checkpoint 0
// ROUNDTRIP: mtp.recompute 6 partial
// ROUNDTRIP: mtp.recompute 0
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
