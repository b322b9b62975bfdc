//===- Zero.h - ZeRO sharding of the optimizer state and gradients -*- C++ -*-===//
//
// `budget { zero = 1 | 2 }` (docs/zero.md): the trainable parameters the
// AdamW optimizer updates, laid end to end in its group order, are cut into
// one equal run of `shardValues` per rank (the last may hold padding). Rank r
// keeps AdamW's two moments for its run only and updates only its run; the
// owners broadcast the updated values in place, beside the next forward
// (mtprt/torch/Zero.h). Stage 2 also
// shards the gradients: each is summed over the ranks as the backward makes
// it, the rank keeps the average of its run and frees the full one. One definition for the compiler (which plans the per-rank bytes)
// and the runtime (which allocates them). Torch-free and LLVM-free.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_ZERO_H
#define MTPRT_ZERO_H

#include <algorithm>
#include <cstdint>

namespace mtprt {

struct ZeroLayout {
  /// Values per rank per collective: an eighth of the run, at least 16 Ki
  /// and at most 4 Mi values (16 MiB of fp32) — stage 2 sums gradients a
  /// bucket at a time and the offload's update copies a bucket at a time,
  /// so their buffers stay a small part of the state they save, and a 10B
  /// model's step makes a few hundred collectives.
  static constexpr int64_t kMinBucketValues = int64_t(1) << 14;
  static constexpr int64_t kMaxBucketValues = int64_t(1) << 22;

  /// Each rank's run of `total` values over `world` ranks.
  static int64_t shardValues(int64_t total, int64_t world) {
    return world <= 1 ? total : (total + world - 1) / world;
  }
  static int64_t bucketValues(int64_t total, int64_t world) {
    const int64_t shard = shardValues(total, world);
    return std::min(shard, std::clamp((shard + 7) / 8, kMinBucketValues,
                                      kMaxBucketValues));
  }
  /// AdamW's moments on one rank (fp32 exp_avg and exp_avg_sq of its run).
  static int64_t stateBytes(int64_t total, int64_t world) {
    return 8 * shardValues(total, world);
  }
  /// Stage 2: the rank's averaged gradient run (held from the first
  /// release to the update).
  static int64_t gradientShardBytes(int64_t total, int64_t world) {
    return 4 * shardValues(total, world);
  }
  /// Optimizer offload at bf16 or fp16 (docs/zero.md, "16-bit weights"):
  /// the trainable backbone projections' weights and biases are held on the
  /// device in 16 bits, their fp32 masters on the host beside AdamW's
  /// moments, as ZeRO-Offload does. At fp16 only at one process: its
  /// 16-bit gradients stay at the loss scale until the host's update
  /// divides it out in fp32 (in 16 bits it would underflow), which the
  /// ranks' exchange (its compression's residuals) would not know of. Not
  /// at stage 3 (its units are flat fp32 buffers) nor with the params
  /// gradient scope (its per-task gradients of the top layers are planned
  /// at fp32): there the device keeps fp32 weights. `stage` is the
  /// requested one; one process runs stage 2 or 3 as 1.
  static bool halfProjections(bool offload, bool bf16, bool fp16, int64_t stage,
                              int64_t world, bool paramsScope) {
    const int64_t effective = world > 1 ? stage : std::min<int64_t>(stage, 1);
    return offload && (bf16 || (fp16 && world == 1)) && effective < 3 &&
           !paramsScope;
  }
  /// With 16-bit weights at one process and several micro-batches a step,
  /// each micro-batch's 16-bit gradients are summed into fp32 buffers in
  /// the host pool (4 B a 16-bit value) and freed on the device, so the
  /// update reads fp32 sums (ZeroOptimizer::foldHalfGradients). More ranks
  /// average .grad in the exchange and keep them.
  static bool foldsHalfGradients(bool half, int64_t ranks,
                                 int64_t microBatches) {
    return half && ranks == 1 && microBatches > 1;
  }
  /// The fp32 masters of this rank's run, in the host pool beside the
  /// moments (with halfProjections: every value of the run, so the update
  /// reads no parameter back from the device).
  static int64_t masterBytes(int64_t total, int64_t world) {
    return 4 * shardValues(total, world);
  }
  /// Stage 2 releases the gradients during the backward: a parameter's as
  /// autograd makes it is summed over the ranks (alone and in place when it
  /// has a bucket's values, else copied into the release's bucket, which
  /// is summed when the next would not fit), this rank's run of it added
  /// to its averaged run, and freed. The bucket lives from the first
  /// release to the backward's end.
  static int64_t releaseBucketBytes(int64_t total, int64_t world) {
    return 4 * bucketValues(total, world);
  }
};

} // namespace mtprt

#endif // MTPRT_ZERO_H
