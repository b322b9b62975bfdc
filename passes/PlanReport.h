//===- PlanReport.h - the plan a person reads -------------------*- C++ -*-===//
//
// `mtpc plan`: per backbone block and per head what it saves and which tasks
// need it, the decision for it, then the totals against the budget with a
// verdict. The same data as JSON (docs/plan-format.md). Later planning passes
// fill in decisions other than "keep"; the report already carries them.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_PASSES_PLANREPORT_H
#define MTPC_PASSES_PLANREPORT_H

#include "passes/MemoryAnalysis.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

namespace mtp {

/// The terminal table.
void printPlan(ModelOp model, const MemoryReport &report,
               llvm::raw_ostream &os);

/// The same data, schema "mtpc.plan/1".
llvm::json::Value planToJson(ModelOp model, const MemoryReport &report);

} // namespace mtp

#endif // MTPC_PASSES_PLANREPORT_H
