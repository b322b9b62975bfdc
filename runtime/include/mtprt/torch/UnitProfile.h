//===- UnitProfile.h - the step's segments timed on the device -*- C++ -*-===//
//
// `--profile-units FILE` (mtprt-run and every binary `mtpc build` makes; `mtpc
// profile` runs it): the costs `mtpc plan --costs FILE` plans with instead of
// the cost model's roofline. Every layer has the same shapes, so layer
// 1's attention and MLP blocks stand for all: their forward, backward and
// tensor-grain re-run (Model::projections); the embeddings and each head with
// its loss, forward and backward; host copies of a block's output both ways;
// then the whole model's forward and backward (every layer, every head at its
// tap: a step's working set, which the segments alone do not have — the
// planner scales them to it) and AdamW's update of copies of the parameters.
// Each figure is wall time, the fastest of several runs after a warm-up (other
// work on the machine only adds time); profile on the machine, threads and
// micro batch the training will use. Under bf16 / fp16 each forward and
// re-run runs under its own autocast scope, as the trainer's do (paying its
// weights' casts: the cache ends with the scope), the backwards outside it;
// the file records the precision it was measured at.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_UNITPROFILE_H
#define MTPRT_TORCH_UNITPROFILE_H

#include "mtprt/torch/Model.h"

#include <string>

namespace mtprt {

/// Times `model`'s segments on a micro-batch `batch` and writes them as JSON
/// (schema mtpc.costs/1, docs/planning.md) to `path`, at `precision`.
void writeUnitProfile(const Model &model, const Batch &batch,
                      const std::string &path,
                      Precision precision = Precision::Fp32, int reps = 7);

} // namespace mtprt

#endif // MTPRT_TORCH_UNITPROFILE_H
