//===- MeasuredCosts.h - segment costs measured on the target ---*- C++ -*-===//
//
// What `mtpc profile` measures (the runtime's --profile-units; schema
// mtpc.costs/1): a layer's attention and MLP blocks forward, backward and
// tensor-grain re-run, the embeddings and each head with its loss, the host
// link both ways; and (optional, later profiles) the whole model's forward
// and backward and the optimizer step. `mtpc plan --costs FILE` plans with
// these instead of the cost model's roofline (docs/planning.md, "Added
// time").
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_PASSES_MEASUREDCOSTS_H
#define MTPC_PASSES_MEASUREDCOSTS_H

#include "dialect/MTPOps.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"

#include <string>
#include <utility>

namespace mtp {

struct MeasuredCosts {
  std::string path;
  /// Seconds, indexed by block % 2 (0: MLP, 1: attention).
  double blockFwd[2] = {0, 0}, blockBwd[2] = {0, 0}, chain[2] = {0, 0};
  double embedFwd = 0, embedBwd = 0;
  /// Per task: its head and loss, forward and backward.
  llvm::StringMap<std::pair<double, double>> heads;
  /// Host link, bytes per second each way.
  double toHost = 0, toDevice = 0;
  /// AdamW's update of every parameter (0: not measured).
  double optimizer = 0;
  /// What the segments above were scaled by so that they add up to the
  /// whole model's measured forward and backward (1: not measured). A
  /// segment timed alone runs with its working set in cache; in a step the
  /// activations of every layer go through the caches.
  double fwdScale = 1, bwdScale = 1;

  /// Reads `path` and checks it was measured for `model`'s shapes (hidden,
  /// heads, ffn, seq, vocab, micro batch) and tasks; the error names the file,
  /// the field and what to do.
  static llvm::Expected<MeasuredCosts> load(llvm::StringRef path,
                                            ModelOp model);
};

} // namespace mtp

#endif // MTPC_PASSES_MEASUREDCOSTS_H
