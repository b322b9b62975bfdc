//===- Report.h - `mtpc report`: a run as one HTML page ---------*- C++ -*-===//
//
// `mtpc report RUN.jsonl [--plan PLAN|BINARY] [-o report.html]` reads the
// runtime's metrics JSON Lines (docs/runtime-services.md §5) and, optionally,
// the plan the run trained with (a flatbuffer plan, or the one a binary built
// by `mtpc build` embeds), and writes one self-contained HTML page: inline
// SVG charts, CSS and a small script for tooltips and sliders, no network.
// docs/report.md describes the page.
//
// The parts: Report.cpp (the command), ReportData (the metrics file read
// into a Run), ReportMarkup (escaping, number formats, colours), ReportCharts
// (the time charts and the cosine heat map), ReportPlan (the plan's strip),
// ReportPage (the page, section by section), report/ (the page's CSS and
// script, embedded at build time by report/EmbedAsset.cmake).
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_TOOLS_MTPC_REPORT_H
#define MTPC_TOOLS_MTPC_REPORT_H

#include "llvm/ADT/ArrayRef.h"

namespace mtp {

/// Runs `mtpc report`; `args` are the words after `mtpc` with `report`
/// removed (args[0] is the program name). Returns the exit code: 0 written,
/// 1 the metrics or the plan are unusable (the error names the file and the
/// line), 2 wrong usage.
int runReportCommand(llvm::ArrayRef<char *> args);

} // namespace mtp

#endif // MTPC_TOOLS_MTPC_REPORT_H
