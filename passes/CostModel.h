//===- CostModel.h - the one source of bytes, FLOPs and time ----*- C++ -*-===//
//
// Every pass, the plan report and the driver ask this model; no pass keeps
// its own arithmetic. Its figures describe the runtime's model exactly
// (docs/runtime.md): the same layers, the same parameters, the same saved
// tensors.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_PASSES_COSTMODEL_H
#define MTPC_PASSES_COSTMODEL_H

#include "dialect/MTPOps.h"

namespace mtp {

/// Parameter counts of a spec-level model, by part.
struct ParameterCount {
  int64_t embeddings = 0; ///< token + position embeddings
  int64_t perLayer = 0;   ///< one transformer layer
  int64_t backbone = 0;   ///< embeddings + layers + final norm
  int64_t heads = 0;      ///< every task head
  int64_t gate = 0;       ///< the DGFG gate (0 when off)
  int64_t total() const { return backbone + heads + gate; }
};

class CostModel {
public:
  explicit CostModel(ModelOp model) : model(model) {}

  /// Parameters of one transformer layer of width `hidden` with an MLP of
  /// width `ffn` (pre-norm: two LayerNorms, QKV, output projection, MLP).
  static int64_t layerParameters(int64_t hidden, int64_t ffn);
  /// Parameters of one task head given the backbone it reads.
  static int64_t headParameters(TaskOp task, BackboneOp backbone);

  ParameterCount parameters() const;

private:
  mutable ModelOp model;
};

} // namespace mtp

#endif // MTPC_PASSES_COSTMODEL_H
