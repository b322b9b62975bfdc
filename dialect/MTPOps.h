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
class BackboneOp;
class BudgetOp;
class TaskOp;
} // namespace mtp

#define GET_OP_CLASSES
#include "dialect/MTPOps.h.inc"

#endif // MTPC_DIALECT_MTPOPS_H
