// RUN: mtp-opt %s | mtp-opt | FileCheck %s
// RUN: mtp-opt %s -mlir-print-op-generic | mtp-opt | FileCheck %s
// RUN: mtp-opt %s -emit-bytecode | mtp-opt | FileCheck %s

// CHECK-LABEL: mtp.model @glue_mt {
mtp.model @glue_mt {
  // CHECK: mtp.backbone transformer(layers = 24, hidden = 1024, heads = 16, ffn = 4096, vocab = 32000, seq = 512)
  mtp.backbone transformer(layers = 24, hidden = 1024, heads = 16, ffn = 4096, vocab = 32000, seq = 512)
  // CHECK: mtp.task @mnli : classify(classes = 3) from pooled layer 24 loss cross_entropy weight 1.000000e+00
  mtp.task @mnli : classify(classes = 3) from pooled layer 24 loss cross_entropy weight 1.0
  // CHECK: mtp.task @stsb : classify(classes = 1) from pooled layer 12 loss mse weight 5.000000e-01
  mtp.task @stsb : classify(classes = 1) from pooled layer 12 loss mse weight 0.5
  // CHECK: mtp.task @pos : tag(labels = 17) from layer 8 loss cross_entropy weight 1.000000e+00
  mtp.task @pos : tag(labels = 17) from layer 8 loss cross_entropy weight 1.0
  // CHECK: mtp.task @squad : span() from layer 24 loss cross_entropy weight 2.000000e+00
  mtp.task @squad : span() from layer 24 loss cross_entropy weight 2.0
  // CHECK: mtp.task @mt : decoder(layers = 6, vocab = 32000) from layer 24 loss cross_entropy weight 1.000000e+00
  mtp.task @mt : decoder(vocab = 32000, layers = 6) from layer 24 loss cross_entropy weight 1.0
  // Layer 0 is the embedding output.
  // CHECK: mtp.task @lang : tag(labels = 12) from layer 0 loss cross_entropy weight 0.000000e+00 {note = "kept"}
  mtp.task @lang : tag(labels = 12) from layer 0 loss cross_entropy weight 0.0 {note = "kept"}
  // CHECK: mtp.correlate @pos, @squad = 8.000000e-01
  mtp.correlate @pos, @squad = 0.8
  // CHECK: mtp.correlate @mnli, @mt = -2.500000e-01
  mtp.correlate @mnli, @mt = -0.25
  // CHECK: mtp.budget device "A100_32GB" memory 32 GiB headroom 2 GiB gpus 8 batch 64 micro 8 precision bf16
  mtp.budget device "A100_32GB" memory 32 GiB headroom 2048 MiB gpus 8 batch 64 micro 8 precision bf16
}

// Byte counts keep the largest exact unit, and plain bytes otherwise.
// CHECK-LABEL: mtp.model @cpu_job {
mtp.model @cpu_job {
  mtp.backbone transformer(layers = 2, hidden = 64, heads = 4, ffn = 256, vocab = 1000, seq = 32)
  mtp.task @a : tag(labels = 5) from layer 2 loss cross_entropy weight 1.0
  // CHECK: mtp.budget device "cpu" memory 1000001 B headroom 0 B gpus 1 batch 12 micro 4 precision fp32
  mtp.budget device "cpu" memory 1000001 headroom 0 gpus 1 batch 12 micro 4 precision fp32
}
