//===- Passes.h - mtp passes ------------------------------------*- C++ -*-===//

#ifndef MTPC_PASSES_PASSES_H
#define MTPC_PASSES_PASSES_H

#include "dialect/MTPOps.h"
#include "mlir/Pass/Pass.h"

namespace mtp {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

} // namespace mtp

#endif // MTPC_PASSES_PASSES_H
