//===- MTPDialect.h - the mtp dialect ---------------------------*- C++ -*-===//

#ifndef MTPC_DIALECT_MTPDIALECT_H
#define MTPC_DIALECT_MTPDIALECT_H

#include "mlir/IR/Dialect.h"
#include "mlir/IR/Operation.h" // the generated discardable-attribute helpers

#include "dialect/MTPOpsDialect.h.inc"

#endif // MTPC_DIALECT_MTPDIALECT_H
