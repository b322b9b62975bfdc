//===- Passes.h - codegen passes --------------------------------*- C++ -*-===//

#ifndef MTPC_CODEGEN_PASSES_H
#define MTPC_CODEGEN_PASSES_H

#include "dialect/MTPOps.h"
#include "mlir/Pass/Pass.h"

namespace mtp {

#define GEN_PASS_DECL
#include "codegen/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "codegen/Passes.h.inc"

} // namespace mtp

#endif // MTPC_CODEGEN_PASSES_H
