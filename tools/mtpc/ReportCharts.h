//===- ReportCharts.h - `mtpc report`: the SVG charts -----------*- C++ -*-===//
//
// The time charts (one value per step record, drawn as static SVG: every
// series carries its point count and last value as data attributes and an
// SVG <title>, so the page reads without script) and the cosine heat map.
// Each chart's data is embedded as JSON beside it for report/report.js,
// which adds the hover crosshair with exact values, the loss smoothing
// slider and the heat map's step slider.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_TOOLS_MTPC_REPORTCHARTS_H
#define MTPC_TOOLS_MTPC_REPORTCHARTS_H

#include "ReportData.h"
#include "ReportMarkup.h"

#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>
#include <vector>

namespace mtp::report {

struct Series {
  std::string name; ///< legend and tooltip
  std::string key;  ///< data-series
  std::string color;
  std::string dash;
  std::vector<Opt> y; ///< one per record, display units
  bool faint = false; ///< the raw line under a smoothed one
  int smoothOf = -1;  ///< index of the raw series this one smooths
  int digits = 5;
};

struct RefLine {
  double y; ///< display units
  std::string label, color, key;
};

struct Chart {
  std::string id, title, yLabel, unit;
  std::vector<Series> series;
  std::vector<RefLine> refs;
  bool zeroBased = true;
  std::optional<double> yMaxFixed;
  bool clipOutliers = false; ///< one slow first step must not flatten the rest
  std::string empty;         ///< shown instead of lines when nothing to draw
  std::string note;          ///< a line under the chart
};

/// TensorBoard's smoothing: a debiased exponential moving average.
std::vector<Opt> smooth(const std::vector<Opt> &y, double weight);

/// A time chart in its panel: the title, the legend, `extraHtml` (a
/// control), the SVG with the run's events marked, its data for the script,
/// and the note.
void renderChartPanel(Markup &os, const Chart &c, const Run &run,
                      llvm::StringRef extraHtml = "");

/// The gradient cosine similarity of the last measured step, task × task,
/// with its slider and every measured step's matrix for the script.
void renderHeatmapPanel(Markup &os, const Run &run);

} // namespace mtp::report

#endif // MTPC_TOOLS_MTPC_REPORTCHARTS_H
