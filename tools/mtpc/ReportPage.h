//===- ReportPage.h - `mtpc report`: the HTML page --------------*- C++ -*-===//
//
// The whole page for one run: one self-contained HTML file (inline SVG, the
// stylesheet and script embedded, no network). docs/report.md describes it.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_TOOLS_MTPC_REPORTPAGE_H
#define MTPC_TOOLS_MTPC_REPORTPAGE_H

#include "ReportData.h"

#include "schema/plan_generated.h"

#include "llvm/ADT/StringRef.h"

#include <string>

namespace mtp::report {

/// The page for `run`; `plan` (null: none given) adds the header's plan
/// rows, the budget lines and the plan's panel, `planFile` names it.
std::string renderPage(const Run &run, const mtp::fb::Plan *plan,
                       llvm::StringRef planFile);

} // namespace mtp::report

#endif // MTPC_TOOLS_MTPC_REPORTPAGE_H
