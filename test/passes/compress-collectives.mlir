// RUN: mtp-opt %s -split-input-file --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step,mtp-compress-collectives))' | FileCheck %s
// RUN: mtp-opt %s -split-input-file -mlir-print-op-on-diagnostic=false --pass-pipeline='builtin.module(mtp.model(mtp-expand-training-step,mtp-compress-collectives{remarks=true}))' 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK

// REMARK: remark: compressed 1 gradient buckets: top-k 15.00%, 8-bit blocks of 256
// REMARK: remark: left 1 gradient buckets uncompressed (collective = auto, 1 devices)

// collective = compressed: every bucket carries the GSC settings.
// CHECK-LABEL: mtp.model @compressed
// CHECK: mtp.allreduce 1461 values ["head.hi", "head.lo", "layer2", "layer1", "embed"] compressed topk 1.500000e-01 block 256 bits 8 decay 8.000000e-01
mtp.model @compressed {
  mtp.backbone transformer(layers = 2, hidden = 8, heads = 2, ffn = 16, vocab = 10, seq = 4, dropout = 0.1)
  mtp.task @lo : tag(labels = 3) from layer 1 loss cross_entropy weight 1.0
  mtp.task @hi : classify(classes = 2) from pooled layer 2 loss cross_entropy weight 1.0
  mtp.budget device "A100_40GB" memory 40 GiB headroom 2 GiB link 32 GBps gpus 4 batch 8 micro 2 precision bf16
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope features layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective compressed topk 0.15 block 256 bits 8 decay 0.8
}

// -----

// collective = auto on one device: nothing to exchange, nothing compressed.
// CHECK-LABEL: mtp.model @single
// CHECK: mtp.allreduce 1461 values ["head.hi", "head.lo", "layer2", "layer1", "embed"]{{$}}
mtp.model @single {
  mtp.backbone transformer(layers = 2, hidden = 8, heads = 2, ffn = 16, vocab = 10, seq = 4, dropout = 0.1)
  mtp.task @lo : tag(labels = 3) from layer 1 loss cross_entropy weight 1.0
  mtp.task @hi : classify(classes = 2) from pooled layer 2 loss cross_entropy weight 1.0
  mtp.budget device "cpu" memory 1 GiB headroom 0 B link 10 GBps gpus 1 batch 2 micro 2 precision fp32
  mtp.strategy checkpoint auto every 1 threshold 0.5 offload auto max_latency 1.2e-3 gfm 0.3 scope features layers 1 dgfg 32 recalibrate reuse 0.15 std 0.4 clip per_task max_norm 1.0 collective auto topk 0.15 block 256 bits 8 decay 0.8
}
