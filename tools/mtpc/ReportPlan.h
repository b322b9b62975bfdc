//===- ReportPlan.h - `mtpc report`: the plan's panel -----------*- C++ -*-===//
//
// The plan the run trained with (a flatbuffer plan, or the one a binary built
// by `mtpc build` embeds), drawn as a strip of keep / recompute / offload per
// backbone unit with the checkpoint regions above it and a row per task (its
// tap, its head and loss units), and the same as a table.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_TOOLS_MTPC_REPORTPLAN_H
#define MTPC_TOOLS_MTPC_REPORTPLAN_H

#include "ReportData.h"
#include "ReportMarkup.h"

#include "schema/plan_generated.h"

#include "llvm/ADT/StringRef.h"

namespace mtp::report {

/// A flatbuffer string; empty where absent.
inline llvm::StringRef str(const flatbuffers::String *s) {
  return s ? llvm::StringRef(s->c_str(), s->size()) : llvm::StringRef();
}

/// The plan's panel; without a plan, a note saying how to add one. The
/// tasks are in the run's order (the charts' colours), plan-only ones after.
void renderPlanPanel(Markup &os, const mtp::fb::Plan *plan, const Run &run,
                     llvm::StringRef planFile);

} // namespace mtp::report

#endif // MTPC_TOOLS_MTPC_REPORTPLAN_H
