//===- PlanFile.h - the plan as a flatbuffer ---------------------*- C++ -*-===//
//
// The binary plan (runtime/schema/plan.fbs) that `mtpc plan --format=fb`
// writes, the generated binary embeds and `mtpc inspect` prints. Reading
// always goes through the flatbuffers verifier and the version check.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_PASSES_PLANFILE_H
#define MTPC_PASSES_PLANFILE_H

#include "passes/MemoryAnalysis.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace mtp {

/// The planned model as a flatbuffer; `source` names the spec.
std::string serializePlan(ModelOp model, const MemoryReport &report,
                          llvm::StringRef source);

/// Verifies `bytes` (identifier, structure, version): success means
/// `fb::GetPlan(bytes)` (schema/plan_generated.h) may be read. The error says
/// what is wrong with the file and what to do.
llvm::Error verifyPlanFile(llvm::StringRef bytes);

/// Verifies `bytes` (identifier, structure, version) and prints the plan.
/// The error says what is wrong with the file and what to do.
llvm::Error printPlanFile(llvm::StringRef bytes, llvm::raw_ostream &os);

} // namespace mtp

#endif // MTPC_PASSES_PLANFILE_H
