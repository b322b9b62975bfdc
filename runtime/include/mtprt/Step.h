//===- Step.h - the calls an emitted step program makes ---------*- C++ -*-===//
//
// The ABI between mtpc's generated C++ and the runtime: one free function per
// step operation, so MLIR's EmitC (whose calls are plain function calls) can
// name each of them, and the emitted step reads as the plan:
//
//   mtprt::StepStats mtp_step_tiny(mtprt::Trainer &t) {
//     mtprt::step::beginStep(t);
//     for (size_t mb = 0; mb < mtprt::step::microBatches(t); mb += 1) {
//       mtprt::step::beginMicroBatch(t, mb);
//       int64_t v0 = mtprt::step::input(t);
//       int64_t v1 = mtprt::step::forward(t, 0, 0, v0, mtprt::RegionMode::Keep);
//       mtprt::step::release(t, v0);
//       ...
//     }
//     mtprt::step::exchangeGradients(t);
//     mtprt::step::optimizerStep(t);
//     return mtprt::step::endStep(t);
//   }
//
// Each is a thin inline call into mtprt::Trainer (mtprt/Runtime.h), which
// checks the order and the arguments. Torch-free: a generated project
// compiles against this header and links the prebuilt runtime.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_STEP_H
#define MTPRT_STEP_H

#include "mtprt/Runtime.h"

#include <cstddef>
#include <cstdint>

namespace mtprt::step {

inline void beginStep(Trainer &t) { t.beginStep(); }
inline size_t microBatches(Trainer &t) {
  return static_cast<size_t>(t.microBatches());
}
inline void beginMicroBatch(Trainer &t, size_t mb) {
  t.beginMicroBatch(static_cast<int64_t>(mb));
}
inline ValueId input(Trainer &t) { return t.input(); }
/// Backbone units [first, last] (0 embed, 2l-1 / 2l layer l's attention /
/// MLP) from value `in`, kept, checkpointed or offloaded as `mode` says.
inline ValueId forward(Trainer &t, int64_t first, int64_t last, ValueId in,
                       RegionMode mode) {
  return t.forward(first, last, in, mode);
}
inline void release(Trainer &t, ValueId v) { t.release(v); }
inline void setPrefetchAhead(Trainer &t, int64_t n) { t.setPrefetchAhead(n); }
/// Head h and its loss; `offload` sends what they save to the host.
inline void forwardHead(Trainer &t, int64_t head, bool offload) {
  t.forwardHead(head, offload);
}
/// Brings an offloaded group ("head<h>", "unit<u>", "region<u>") back ahead of
/// its use, on the copy stream.
inline void prefetch(Trainer &t, const char *group) { t.prefetch(group); }
inline void backwardHead(Trainer &t, int64_t head) { t.backwardHead(head); }
/// The fused per-task gradient op: GFM, per-task clip, the DGFG gate's α.
inline void fuseTaskGradients(Trainer &t) { t.fuseTaskGradients(); }
/// The backbone backward: regions recompute and offloaded units come back
/// (prefetched ahead) as it reaches them.
inline void backwardBackbone(Trainer &t) { t.backwardBackbone(); }
/// The gradient collective (compressed when the plan says so).
inline void exchangeGradients(Trainer &t) { t.exchangeGradients(); }
inline void optimizerStep(Trainer &t) { t.optimizerStep(); }
inline StepStats endStep(Trainer &t) { return t.endStep(true); }

} // namespace mtprt::step

#endif // MTPRT_STEP_H
