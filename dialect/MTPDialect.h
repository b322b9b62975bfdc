//===- MTPDialect.h - the mtp dialect ---------------------------*- C++ -*-===//

#ifndef MTPC_DIALECT_MTPDIALECT_H
#define MTPC_DIALECT_MTPDIALECT_H

#include "mlir/IR/Dialect.h"

#include "dialect/MTPOpsDialect.h.inc"

#endif // MTPC_DIALECT_MTPDIALECT_H
