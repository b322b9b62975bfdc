//===- MTPOps.h - mtp operations and attributes -----------------*- C++ -*-===//

#ifndef MTPC_DIALECT_MTPOPS_H
#define MTPC_DIALECT_MTPOPS_H

#include "dialect/MTPDialect.h"

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/RegionKindInterface.h"
#include "mlir/IR/SymbolTable.h"

#include "dialect/MTPEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialect/MTPAttrs.h.inc"

namespace mtp {
/// The DGFG gate's bound (SPEC.md §3 B6: fewer than 0.1M parameters).
constexpr int64_t kDgfgMaxParameters = 100000;
/// Parameters of the DGFG gate: an MLP from 2T + T(T-1)/2 signals (each
/// task's loss and gradient norm, every pairwise cosine) through one hidden
/// layer of width `hidden` to T logits, biases included. The runtime's gate
/// has exactly this shape (docs/runtime.md).
inline int64_t dgfgParameterCount(int64_t tasks, int64_t hidden) {
  int64_t inputs = 2 * tasks + tasks * (tasks - 1) / 2;
  return (inputs + 1) * hidden + (hidden + 1) * tasks;
}

class BackboneOp;
class BudgetOp;
class StrategyOp;
class StepOp;
class TrainOp;
class TaskOp;
} // namespace mtp

#define GET_OP_CLASSES
#include "dialect/MTPOps.h.inc"

#endif // MTPC_DIALECT_MTPOPS_H
