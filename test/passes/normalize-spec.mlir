// RUN: mtp-opt %s --pass-pipeline='builtin.module(mtp.model(mtp-normalize-spec))' | FileCheck %s
// Idempotent: normalizing normalized IR changes nothing.
// RUN: mtp-opt %s --pass-pipeline='builtin.module(mtp.model(mtp-normalize-spec))' -o %t.once
// RUN: mtp-opt %t.once --pass-pipeline='builtin.module(mtp.model(mtp-normalize-spec))' -o %t.twice
// RUN: diff %t.once %t.twice

// Tasks by tap layer (ties keep source order), correlations named and sorted
// in task order, the budget last.
// CHECK-LABEL: mtp.model @scrambled
// CHECK-NEXT:    mtp.backbone transformer
// CHECK-NEXT:    mtp.task @pos : {{.*}} layer 8
// CHECK-NEXT:    mtp.task @chunk : {{.*}} layer 8
// CHECK-NEXT:    mtp.task @ner : {{.*}} layer 24
// CHECK-NEXT:    mtp.task @mt : {{.*}} layer 24
// CHECK-NEXT:    mtp.correlate @pos, @chunk = 8.000000e-01
// CHECK-NEXT:    mtp.correlate @pos, @ner = 2.000000e-01
// CHECK-NEXT:    mtp.correlate @ner, @mt = 1.000000e-01
// CHECK-NEXT:    mtp.budget
// CHECK-NEXT:  }
mtp.model @scrambled {
  mtp.budget device "A100_32GB" memory 32 GiB headroom 2 GiB link 32 GBps gpus 1 batch 8 micro 8 precision bf16
  mtp.correlate @mt, @ner = 0.1
  mtp.task @ner : tag(labels = 9) from layer 24 loss cross_entropy weight 1.0
  mtp.correlate @ner, @pos = 0.2
  mtp.task @pos : tag(labels = 17) from layer 8 loss cross_entropy weight 1.0
  mtp.task @mt : decoder(layers = 2, vocab = 1000, target_seq = 16) from layer 24 loss cross_entropy weight 1.0
  mtp.backbone transformer(layers = 24, hidden = 64, heads = 4, ffn = 256, vocab = 1000, seq = 16, dropout = 0.1)
  mtp.task @chunk : tag(labels = 23) from layer 8 loss cross_entropy weight 1.0
  mtp.correlate @chunk, @pos = 0.8
}
