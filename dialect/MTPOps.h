//===- MTPOps.h - mtp operations and attributes -----------------*- C++ -*-===//

#ifndef MTPC_DIALECT_MTPOPS_H
#define MTPC_DIALECT_MTPOPS_H

#include "dialect/MTPDialect.h"

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/RegionKindInterface.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"

#include "llvm/ADT/bit.h"

#include "dialect/MTPEnums.h.inc"

namespace mtp {
/// A checkpoint region of a plan: runtime blocks `first`..`last` inclusive
/// (2l-1 attention, 2l MLP of layer l).
struct PlanRegion {
  int64_t first = 0, last = 0;
  bool operator==(const PlanRegion &o) const {
    return first == o.first && last == o.last;
  }
};
inline llvm::hash_code hash_value(const PlanRegion &r) {
  return llvm::hash_combine(r.first, r.last);
}

/// An offloaded unit of a plan: its saved bytes go to pinned host memory on
/// copy stream `stream`; `exposedWait` is what the backward waits for the
/// prefetch (0 when the copy is hidden).
struct PlanOffload {
  mlir::StringAttr unit;
  int64_t bytes = 0, stream = 1;
  double exposedWait = 0.0;
  bool operator==(const PlanOffload &o) const {
    return unit == o.unit && bytes == o.bytes && stream == o.stream &&
           exposedWait == o.exposedWait;
  }
};
inline llvm::hash_code hash_value(const PlanOffload &o) {
  return llvm::hash_combine(o.unit, o.bytes, o.stream,
                            llvm::bit_cast<uint64_t>(o.exposedWait));
}
} // namespace mtp

#include "mtprt/Adapters.h"      // AdaptersAttr::getConfig
#include "mtprt/BatchSchedule.h" // BatchScheduleAttr::getSchedule
#include "mtprt/Ewc.h"           // EwcAttr::getConfig
#include "mtprt/Saps.h"          // SapsAttr::getConfig

#define GET_ATTRDEF_CLASSES
#include "dialect/MTPAttrs.h.inc"

#include "dialect/MTPInterfaces.h.inc"

namespace mtp {
/// The DGFG gate's bound (docs/techniques.md B6: fewer than 0.1M parameters).
constexpr int64_t kDgfgMaxParameters = 100000;
/// Parameters of the DGFG gate: one MLP shared by every task, from four
/// per-task signals (loss, gradient norm, mean and minimum cosine with the
/// others) through a tanh layer of width `hidden` to the task's logit,
/// biases included — so the count does not grow with the number of tasks.
/// The runtime's gate has exactly this shape (docs/runtime.md).
inline int64_t dgfgParameterCount(int64_t /*tasks*/, int64_t hidden) {
  constexpr int64_t kSignals = 4;
  return (kSignals + 1) * hidden + (hidden + 1);
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

namespace mtp {
/// Which unit a forward or backward op runs.
struct UnitRef {
  UnitKind kind;
  uint64_t layer;
  mlir::FlatSymbolRefAttr task; ///< heads and losses
};
/// The unit of an `mtp.fwd` or `mtp.bwd`; nullopt for any other op.
std::optional<UnitRef> getUnitRef(mlir::Operation *op);
/// The runtime's block number of a backbone unit (docs/contracts.md#granularity):
/// 2l-1 for layer l's attention sub-blocks, 2l for its MLP sub-blocks, 0 for
/// the embeddings; -1 for heads and losses.
int64_t getBlockNumber(UnitKind kind, uint64_t layer);
} // namespace mtp

#endif // MTPC_DIALECT_MTPOPS_H
