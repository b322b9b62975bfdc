//===- Passes.h - mtp passes ------------------------------------*- C++ -*-===//

#ifndef MTPC_PASSES_PASSES_H
#define MTPC_PASSES_PASSES_H

#include "dialect/MTPOps.h"
#include "mlir/Pass/Pass.h"

namespace mtp {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

/// Whether the gradient buckets of `model`'s step are exchanged compressed
/// (GSC) over `world` processes under its `collective` policy.
bool compressesBuckets(ModelOp model, int64_t world);
/// Marks every gradient bucket compressed with the strategy's GSC knobs, or
/// plain (what --mtp-compress-collectives decides; pipeline = auto decides
/// again once the stages, and so the replicas, are chosen).
void setBucketsCompressed(ModelOp model, bool compress);

} // namespace mtp

#endif // MTPC_PASSES_PASSES_H
