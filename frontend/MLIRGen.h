//===- MLIRGen.h - checked spec to the mtp dialect --------------*- C++ -*-===//

#ifndef MTPC_FRONTEND_MLIRGEN_H
#define MTPC_FRONTEND_MLIRGEN_H

#include "frontend/Sema.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace mtp {

/// Builds the spec-level module (one mtp.model) with a FileLineColLoc from
/// `filename` on every op, and verifies it. Null if verification fails (a
/// Sema gap: reported as an internal error at the failing op).
mlir::OwningOpRef<mlir::ModuleOp> mlirGen(const CheckedSpec &spec,
                                          llvm::StringRef filename,
                                          mlir::MLIRContext *context);

} // namespace mtp

#endif // MTPC_FRONTEND_MLIRGEN_H
