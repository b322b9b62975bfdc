// RUN: mtp-opt %s -split-input-file --pass-pipeline='builtin.module(mtp.model(mtp-normalize-spec,mtp-expand-training-step,mtp-fuse-task-gradients,mtp-compress-collectives,mtp-plan-memory,mtp-materialize-offload,mtp-materialize-checkpoints),mtp-lower-step-to-emitc)' | FileCheck %s
// RUN: mtp-opt %s -split-input-file --pass-pipeline='builtin.module(mtp.model(mtp-normalize-spec,mtp-expand-training-step,mtp-fuse-task-gradients,mtp-compress-collectives,mtp-plan-memory,mtp-materialize-offload,mtp-materialize-checkpoints),mtp-lower-step-to-emitc)' | mtp-opt | FileCheck %s

// The tiny model at 6 MiB, task-granular: both intervals recomputed, a
// region per layer. The step becomes one emitc.func; each backbone unit or
// region is one forward call, each head follows its tap, the heads'
// backwards run in reverse, then the fused op, the backbone backward (the
// regions' recomputes listed above it), the collective and the optimizer.
// CHECK-LABEL: emitc.include "mtprt/Step.h"
// CHECK: emitc.func @mtp_step_tiny(%[[T:.*]]: !emitc.opaque<"mtprt::Trainer &">) -> !emitc.opaque<"mtprt::StepStats">
// CHECK: emitc.call_opaque "mtprt::step::beginStep"(%[[T]])
// CHECK: %[[N:.*]] = emitc.call_opaque "mtprt::step::microBatches"(%[[T]]) {{.*}} -> index
// CHECK: emitc.for %[[MB:.*]] = %{{.*}} to %[[N]] step %{{.*}} {
// CHECK:   emitc.call_opaque "mtprt::step::beginMicroBatch"(%[[T]], %[[MB]])
// CHECK:   %[[V0:.*]] = emitc.call_opaque "mtprt::step::input"(%[[T]])
// CHECK:   %[[V1:.*]] = emitc.call_opaque "mtprt::step::forward"(%[[T]], %[[V0]]) {args = [0 : index, 0, 0, 1 : index, #emitc.opaque<"mtprt::RegionMode::Keep">]}
// CHECK:   emitc.call_opaque "mtprt::step::release"(%[[T]], %[[V0]])
// CHECK:   emitc.verbatim "// checkpoint region 0: units 1..2 (layer 1 attention .. layer 1 MLP) keep only their input; recomputed in the backward"
// CHECK:   %[[V2:.*]] = emitc.call_opaque "mtprt::step::forward"(%[[T]], %[[V1]]) {args = [0 : index, 1, 2, 1 : index, #emitc.opaque<"mtprt::RegionMode::Checkpoint">]}
// CHECK:   emitc.call_opaque "mtprt::step::forward"(%[[T]], %[[V2]]) {args = [0 : index, 3, 4, 1 : index, #emitc.opaque<"mtprt::RegionMode::Checkpoint">]}
// CHECK:   emitc.call_opaque "mtprt::step::forwardHead"(%[[T]]) {args = [0 : index, 0, #emitc.opaque<"false">]}
// CHECK:   emitc.call_opaque "mtprt::step::forwardHead"(%[[T]]) {args = [0 : index, 1, #emitc.opaque<"false">]}
// CHECK:   emitc.call_opaque "mtprt::step::forward"(%[[T]], %{{.*}}) {args = [0 : index, 7, 8, 1 : index, #emitc.opaque<"mtprt::RegionMode::Checkpoint">]}
// CHECK:   emitc.call_opaque "mtprt::step::forwardHead"(%[[T]]) {args = [0 : index, 2, #emitc.opaque<"false">]}
// CHECK:   emitc.call_opaque "mtprt::step::backwardHead"(%[[T]]) {args = [0 : index, 2]}
// CHECK:   emitc.call_opaque "mtprt::step::backwardHead"(%[[T]]) {args = [0 : index, 1]}
// CHECK:   emitc.call_opaque "mtprt::step::backwardHead"(%[[T]]) {args = [0 : index, 0]}
// CHECK:   emitc.call_opaque "mtprt::step::fuseTaskGradients"(%[[T]])
// CHECK:   emitc.verbatim "//   recompute region 3 (units 7..8: layer 4 attention .. layer 4 MLP) from its boundary"
// CHECK:   emitc.verbatim "//   recompute region 0 (units 1..2: layer 1 attention .. layer 1 MLP) from its boundary"
// CHECK:   emitc.call_opaque "mtprt::step::backwardBackbone"(%[[T]])
// CHECK: }
// CHECK: emitc.call_opaque "mtprt::step::exchangeGradients"(%[[T]])
// CHECK: emitc.call_opaque "mtprt::step::optimizerStep"(%[[T]])
// CHECK: %[[S:.*]] = emitc.call_opaque "mtprt::step::endStep"(%[[T]])
// CHECK: emitc.return %[[S]]
// CHECK-NOT: mtp.
module {
  mtp.model @tiny {
    mtp.backbone transformer(layers = 4, hidden = 64, heads = 4, ffn = 256, vocab = 512, seq = 32, dropout = 1.000000e-01)
    mtp.task @pos : tag(labels = 12) from layer 2 loss cross_entropy weight 1.000000e+00 lr cosine(1.000000e-03, warmup = 20)
    mtp.task @chunk : tag(labels = 8) from layer 2 loss cross_entropy weight 5.000000e-01 lr cosine(1.000000e-03, warmup = 20)
    mtp.task @topic : classify(classes = 4) from pooled layer 4 loss cross_entropy weight 1.000000e+00 lr cosine(1.000000e-03, warmup = 20)
    mtp.correlate @pos, @chunk = 8.000000e-01
    mtp.correlate @pos, @topic = 1.000000e-01
    mtp.budget device "cpu" memory 6 MiB headroom 0 B link 10 GBps gpus 1 batch 8 micro 8 precision fp32
    mtp.strategy checkpoint task_granular every 1 threshold 5.000000e-01 offload none max_latency 1.200000e-03 gfm 5.000000e-01 scope features layers 1 dgfg 16 recalibrate reuse 1.500000e-01 std 4.000000e-01 clip per_task max_norm 1.000000e+00 collective auto topk 1.500000e-01 block 256 bits 8 decay 8.000000e-01
    mtp.train steps 200 seed 7 data synthetic lr cosine(1.000000e-03, warmup = 20) adamw(weight_decay = 1.000000e-02, beta1 = 9.000000e-01, beta2 = 0.99899999999999999, eps = 1.000000e-08) log_every 10 save_every 0
  }
}
