//===- ReportCharts.cpp - `mtpc report`: the SVG charts -------------------===//

#include "ReportCharts.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

using llvm::StringRef;

namespace mtp::report {
namespace {

//===----------------------------------------------------------------------===//
// Time charts
//===----------------------------------------------------------------------===//

constexpr double kW = 560, kH = 250, kL = 64, kR = 16, kT = 14, kB = 44;

struct Scale {
  double x0, x1, y0, y1;
  double x(double step) const {
    return kL + (step - x0) / (x1 - x0) * (kW - kL - kR);
  }
  double y(double v) const {
    return kT + (kH - kT - kB) - (v - y0) / (y1 - y0) * (kH - kT - kB);
  }
};

double niceStep(double span, int target) {
  if (!(span > 0))
    return 1;
  double raw = span / target;
  double mag = std::pow(10, std::floor(std::log10(raw)));
  double r = raw / mag;
  return (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
}

/// A value the chart can place: finite and small enough that the scale's
/// range (hi − lo) stays finite (a diverged loss of 1e308 made it NaN and
/// emptied the chart); the rest are gaps, their values in the tooltips.
bool plottable(double v) { return std::isfinite(v) && std::abs(v) <= 1e100; }

std::string pathOf(const std::vector<Opt> &y, const std::vector<int64_t> &x,
                   const Scale &s, unsigned &points) {
  std::string d;
  bool pen = false;
  points = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!y[i] || !plottable(*y[i])) {
      pen = false;
      continue;
    }
    d += (pen ? "L" : (d.empty() ? "M" : " M")) + px(s.x(x[i])) + "," +
         px(s.y(*y[i]));
    pen = true;
    ++points;
  }
  // A single point still needs something visible.
  if (points == 1)
    d += "h0.01";
  return d;
}

/// The series' finite values (display units).
std::vector<double> finiteValues(const Chart &c) {
  std::vector<double> values;
  for (const Series &se : c.series)
    for (Opt v : se.y)
      if (v && plottable(*v))
        values.push_back(*v);
  return values;
}

/// The plot area's width and height inside the margins.
constexpr double kPW = kW - kL - kR, kPH = kH - kT - kB;

/// The axes' ranges: every step, the data and the reference lines, nicely
/// rounded. `ystep` is the y grid's spacing; `clipped` says what a chart that
/// clips outliers left above the scale (empty: nothing).
Scale scaleOf(const Chart &c, const std::vector<int64_t> &xs, double &ystep,
              std::string &clipped) {
  Scale s;
  s.x0 = xs.front();
  s.x1 = xs.back();
  if (s.x1 <= s.x0) {
    s.x0 -= 0.5;
    s.x1 += 0.5;
  }
  std::vector<double> values = finiteValues(c);
  double lo = values.empty() ? 0 : *llvm::min_element(values);
  double hi = values.empty() ? 1 : *llvm::max_element(values);
  if (c.clipOutliers && values.size() >= 10) {
    std::vector<double> sorted = values;
    llvm::sort(sorted);
    double p90 = sorted[sorted.size() * 9 / 10];
    double inRange = lo;
    unsigned above = 0;
    for (double v : sorted) {
      if (v <= 3 * p90)
        inRange = v;
      else
        ++above;
    }
    if (above) {
      clipped = llvm::formatv("{0} point(s) above the scale (up to {1} {2}; "
                              "the tooltip has every value).",
                              above, fmtG(hi), c.unit)
                    .str();
      hi = inRange;
    }
  }
  for (const RefLine &r : c.refs) {
    lo = std::min(lo, r.y);
    hi = std::max(hi, r.y);
  }
  if (c.zeroBased)
    lo = std::min(lo, 0.0);
  if (c.yMaxFixed)
    hi = std::max(hi, *c.yMaxFixed);
  if (hi <= lo)
    hi = lo + (lo == 0 ? 1 : std::abs(lo) * 0.1);
  ystep = niceStep(hi - lo, 5);
  s.y0 = std::floor(lo / ystep) * ystep;
  s.y1 = std::ceil(hi / ystep) * ystep;
  if (c.yMaxFixed && hi <= *c.yMaxFixed)
    s.y1 = *c.yMaxFixed;
  if (s.y1 <= s.y0)
    s.y1 = s.y0 + ystep;
  return s;
}

/// The grid, the ticks, the frame and the axis labels.
void renderAxes(Markup &os, const Chart &c, const Scale &s, double ystep) {
  os << "<g class=\"axis\">";
  for (double v = s.y0; v <= s.y1 + ystep * 1e-6; v += ystep) {
    double y = s.y(v);
    os << "<line class=\"grid\" x1=\"" << kL << "\" x2=\"" << kL + kPW
       << "\" y1=\"" << px(y) << "\" y2=\"" << px(y) << "\"/>"
       << "<text x=\"" << kL - 6 << "\" y=\"" << px(y + 4)
       << "\" text-anchor=\"end\">"
       << fmtG(std::abs(v) < ystep * 1e-9 ? 0 : v, 6) << "</text>";
  }
  double xstep = std::max(1.0, niceStep(s.x1 - s.x0, 6));
  for (double v = std::ceil(s.x0 / xstep) * xstep; v <= s.x1; v += xstep) {
    double x = s.x(v);
    os << "<line class=\"grid\" x1=\"" << px(x) << "\" x2=\"" << px(x)
       << "\" y1=\"" << kT << "\" y2=\"" << kT + kPH << "\"/>"
       << "<text x=\"" << px(x) << "\" y=\"" << kT + kPH + 16
       << "\" text-anchor=\"middle\">" << fmtG(v, 9) << "</text>";
  }
  os << "<rect class=\"frame\" x=\"" << kL << "\" y=\"" << kT << "\" width=\""
     << kPW << "\" height=\"" << kPH << "\"/>";
  os << "<text class=\"label\" x=\"" << kL + kPW / 2 << "\" y=\"" << kH - 6
     << "\" text-anchor=\"middle\">step</text>";
  os << "<text class=\"label\" transform=\"translate(14," << kT + kPH / 2
     << ") rotate(-90)\" text-anchor=\"middle\">" << esc(c.yLabel)
     << "</text></g>\n";
}

/// The reference lines and their labels: of two close lines, the higher
/// line's label above it, the lower's below.
void renderRefLines(Markup &os, const Chart &c, const Scale &s) {
  std::vector<double> labelYs;
  std::vector<RefLine> refs = c.refs;
  llvm::stable_sort(
      refs, [](const RefLine &a, const RefLine &b) { return a.y > b.y; });
  for (const RefLine &r : refs) {
    double y = s.y(r.y);
    double ly = y - 4;
    for (double other : labelYs)
      if (std::abs(other - ly) < 12)
        ly = y + 13;
    labelYs.push_back(ly);
    os << "<line class=\"ref\" data-ref=\"" << esc(r.key) << "\" data-value=\""
       << num(r.y) << "\" x1=\"" << kL << "\" x2=\"" << kL + kPW << "\" y1=\""
       << px(y) << "\" y2=\"" << px(y) << "\" stroke=\"" << r.color
       << "\"><title>" << esc(r.label) << "</title></line>"
       << "<text class=\"reflabel\" x=\"" << kL + kPW - 4 << "\" y=\"" << px(ly)
       << "\" text-anchor=\"end\" fill=\"" << r.color << "\">" << esc(r.label)
       << "</text>\n";
  }
}

/// A ▼ marker and a dashed line at each of the run's events.
void renderEvents(Markup &os, const Run &run, const Scale &s) {
  for (const Event &e : run.events) {
    if (e.step < s.x0 || e.step > s.x1)
      continue;
    double x = s.x(e.step);
    os << "<g class=\"event\" data-step=\"" << e.step << "\"><title>"
       << esc(e.name) << " at step " << e.step
       << (e.detail.empty() ? "" : " (" + esc(e.detail) + ")")
       << "</title><line x1=\"" << px(x) << "\" x2=\"" << px(x) << "\" y1=\""
       << kT << "\" y2=\"" << kT + kPH << "\"/><path d=\"M" << px(x - 5) << ","
       << kT << "h10l-5,8z\"/></g>\n";
  }
}

/// One path per series, with its point count and last value as data
/// attributes and in its <title>.
void renderSeries(Markup &os, const Chart &c, const Scale &s,
                  const std::vector<int64_t> &xs) {
  for (const Series &se : c.series) {
    unsigned points = 0;
    std::string d = pathOf(se.y, xs, s, points);
    Opt last;
    int64_t lastStep = 0;
    for (size_t i = 0; i < se.y.size(); ++i)
      if (se.y[i]) {
        last = se.y[i];
        lastStep = xs[i];
      }
    os << "<path class=\"series" << (se.faint ? " raw" : "")
       << (se.smoothOf >= 0 ? " smooth" : "") << "\" data-series=\""
       << esc(se.key) << "\" data-n=\"" << points << "\" data-last=\""
       << num(last) << "\" stroke=\"" << se.color << "\"";
    if (!se.dash.empty())
      os << " stroke-dasharray=\"" << se.dash << "\"";
    os << " d=\"" << d << "\"><title>" << esc(se.name) << ": " << points
       << " points, last " << (last ? fmtG(*last, se.digits) : "-") << " "
       << esc(c.unit) << " at step " << lastStep << "</title></path>\n";
  }
}

/// The data the script needs, as JSON: steps, the scale and each series.
std::string chartData(const Chart &c, const Scale &s,
                      const std::vector<int64_t> &xs) {
  std::string data;
  llvm::raw_string_ostream dsStream(data);
  Markup ds(dsStream);
  ds << "{\"unit\":" << jsonString(c.unit) << ",\"box\":[" << kL << "," << kT
     << "," << kPW << "," << kPH << "],\"dom\":[" << num(s.x0) << ","
     << num(s.x1) << "," << num(s.y0) << "," << num(s.y1) << "],\"x\":[";
  for (size_t i = 0; i < xs.size(); ++i)
    ds << (i ? "," : "") << xs[i];
  ds << "],\"s\":[";
  for (size_t k = 0; k < c.series.size(); ++k) {
    const Series &se = c.series[k];
    ds << (k ? "," : "") << "{\"n\":" << jsonString(se.name)
       << ",\"k\":" << jsonString(se.key) << ",\"c\":" << jsonString(se.color)
       << ",\"raw\":" << (se.faint ? "true" : "false")
       << ",\"sm\":" << se.smoothOf << ",\"d\":" << se.digits << ",\"y\":[";
    for (size_t i = 0; i < se.y.size(); ++i)
      ds << (i ? "," : "") << num(se.y[i]);
    ds << "]}";
  }
  ds << "]}";
  return data;
}

/// The chart's SVG, its data for the script and its note.
void renderChart(Markup &os, const Chart &c, const Run &run) {
  std::vector<int64_t> xs;
  for (const Record &r : run.records)
    xs.push_back(r.step);
  double ystep = 1;
  std::string clipped;
  Scale s = scaleOf(c, xs, ystep, clipped);
  bool hasData = !finiteValues(c).empty() && c.empty.empty();

  os << "<svg class=\"chart\" id=\"chart-" << c.id << "\" data-panel=\"" << c.id
     << "\" data-src=\"data-" << c.id << "\" data-records=\""
     << run.records.size() << "\" viewBox=\"0 0 " << kW << " " << kH
     << "\" width=\"" << kW << "\" height=\"" << kH << "\" role=\"img\" "
     << "aria-label=\"" << esc(c.title) << "\">\n";
  os << "<defs><clipPath id=\"clip-" << c.id << "\"><rect x=\"" << kL
     << "\" y=\"" << kT << "\" width=\"" << kPW << "\" height=\"" << kPH
     << "\"/></clipPath></defs>\n";
  renderAxes(os, c, s, ystep);
  os << "<g clip-path=\"url(#clip-" << c.id << ")\">\n";
  renderRefLines(os, c, s);
  renderEvents(os, run, s);
  if (hasData)
    renderSeries(os, c, s, xs);
  else
    os << "<text class=\"empty\" x=\"" << kL + kPW / 2 << "\" y=\""
       << kT + kPH / 2 << "\" text-anchor=\"middle\">"
       << esc(c.empty.empty() ? "no data in this run" : c.empty) << "</text>\n";
  os << "</g>\n";
  // The hover cursor and one dot per series, placed by the script.
  os << "<line class=\"cursor\" x1=\"0\" x2=\"0\" y1=\"" << kT << "\" y2=\""
     << kT + kPH << "\" visibility=\"hidden\"/>";
  for (unsigned i = 0; i < c.series.size(); ++i)
    os << "<circle class=\"dot\" r=\"3\" fill=\"" << c.series[i].color
       << "\" visibility=\"hidden\"/>";
  os << "\n</svg>\n";

  os << "<script type=\"application/json\" id=\"data-" << c.id << "\">"
     << scriptSafe(chartData(c, s, xs)) << "</script>\n";
  std::string note = c.note;
  if (!clipped.empty())
    note += (note.empty() ? "" : " ") + clipped;
  if (!note.empty())
    os << "<p class=\"note\">" << esc(note) << "</p>\n";
}

void legend(Markup &os, const Chart &c) {
  os << "<div class=\"legend\">";
  for (const Series &se : c.series) {
    if (se.faint)
      continue;
    os << "<span><svg width=\"22\" height=\"10\"><line x1=\"1\" x2=\"21\" "
          "y1=\"5\" y2=\"5\" stroke=\""
       << se.color << "\" stroke-width=\"2.5\""
       << (se.dash.empty() ? "" : " stroke-dasharray=\"" + se.dash + "\"")
       << "/></svg>" << esc(se.name) << "</span>";
  }
  for (const RefLine &r : c.refs)
    os << "<span><svg width=\"22\" height=\"10\"><line x1=\"1\" x2=\"21\" "
          "y1=\"5\" y2=\"5\" stroke=\""
       << r.color << "\" stroke-width=\"2\" stroke-dasharray=\"5 3\"/></svg>"
       << esc(r.label) << "</span>";
  os << "</div>\n";
}

} // namespace

std::vector<Opt> smooth(const std::vector<Opt> &y, double weight) {
  std::vector<Opt> out(y.size());
  double last = 0;
  int n = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!y[i])
      continue;
    last = last * weight + (1 - weight) * *y[i];
    ++n;
    out[i] = last / (1 - std::pow(weight, n));
  }
  return out;
}

void renderChartPanel(Markup &os, const Chart &c, const Run &run,
                      StringRef extraHtml) {
  os << "<section class=\"panel\" id=\"panel-" << c.id << "\"><h2>"
     << esc(c.title) << "</h2>\n";
  legend(os, c);
  os << extraHtml;
  renderChart(os, c, run);
  os << "</section>\n";
}

//===----------------------------------------------------------------------===//
// The cosine heat map
//===----------------------------------------------------------------------===//

namespace {
/// -1 blue (Okabe-Ito #0072B2), 0 light grey, +1 vermillion (#D55E00).
std::string divergingColor(double v) {
  if (!std::isfinite(v))
    return "#ffffff";
  v = std::clamp(v, -1.0, 1.0);
  const double mid[3] = {247, 247, 247}, neg[3] = {0, 114, 178},
               pos[3] = {213, 94, 0};
  const double *end = v < 0 ? neg : pos;
  double t = std::abs(v);
  int rgb[3];
  for (int i = 0; i < 3; ++i)
    rgb[i] = int(std::lround(mid[i] + (end[i] - mid[i]) * t));
  return llvm::formatv("#{0:x-2}{1:x-2}{2:x-2}", rgb[0], rgb[1], rgb[2]).str();
}
/// The heat map's layout: `n` tasks, square cells.
struct HeatmapLayout {
  unsigned n;
  double cell;
  double left = 90, top = 24;
};

/// A row's and a column's label; past the run's tasks, by number.
std::string taskName(const Run &run, unsigned i) {
  return i < run.tasks.size() ? run.tasks[i] : "task " + std::to_string(i);
}

/// The task labels and a cell per task pair of `last`'s matrix.
void renderCells(Markup &os, const Run &run, const Record &last,
                 const HeatmapLayout &l) {
  unsigned n = l.n;
  double cell = l.cell, left = l.left, top = l.top;
  for (unsigned i = 0; i < n; ++i) {
    os << "<text class=\"tick\" x=\"" << left - 6 << "\" y=\""
       << px(top + i * cell + cell / 2 + 4) << "\" text-anchor=\"end\">"
       << esc(taskName(run, i)) << "</text>";
    os << "<text class=\"tick\" x=\"" << px(left + i * cell + cell / 2)
       << "\" y=\"" << top - 8 << "\" text-anchor=\"middle\">"
       << esc(taskName(run, i)) << "</text>";
  }
  for (unsigned i = 0; i < n; ++i)
    for (unsigned j = 0; j < n; ++j) {
      double v = j < last.cosine[i].size() ? last.cosine[i][j] : std::nan("");
      double x = left + j * cell, y = top + i * cell;
      os << "<g class=\"cell\" data-i=\"" << i << "\" data-j=\"" << j
         << "\"><rect x=\"" << px(x) << "\" y=\"" << px(y) << "\" width=\""
         << cell - 1 << "\" height=\"" << cell - 1 << "\" fill=\""
         << divergingColor(v) << "\" data-v=\"" << num(v) << "\"/>"
         << "<text x=\"" << px(x + cell / 2) << "\" y=\""
         << px(y + cell / 2 + 4) << "\" text-anchor=\"middle\" fill=\""
         << (std::abs(v) > 0.55 ? "#fff" : "#000") << "\">"
         << (std::isfinite(v) ? llvm::formatv("{0:f2}", v).str() : "-")
         << "</text><title>" << esc(taskName(run, i)) << " × "
         << esc(taskName(run, j)) << ": " << fmtG(v, 6) << " at step "
         << last.step << "</title></g>\n";
    }
}

/// The colour bar, -1 (bottom) to +1 (top).
void renderColorBar(Markup &os, const HeatmapLayout &l) {
  double bx = l.left + l.n * l.cell + 24, by = l.top,
         bh = std::max(l.n * l.cell, 120.0);
  os << "<defs><linearGradient id=\"cosbar\" x1=\"0\" y1=\"1\" x2=\"0\" "
        "y2=\"0\">";
  for (int k = 0; k <= 10; ++k)
    os << "<stop offset=\"" << k * 10 << "%\" stop-color=\""
       << divergingColor(-1 + k * 0.2) << "\"/>";
  os << "</linearGradient></defs><rect x=\"" << bx << "\" y=\"" << by
     << "\" width=\"12\" height=\"" << bh
     << "\" fill=\"url(#cosbar)\" stroke=\"#999\"/>";
  for (int k = -1; k <= 1; ++k)
    os << "<text class=\"tick\" x=\"" << bx + 16 << "\" y=\""
       << px(by + bh / 2 - k * bh / 2 + 4) << "\">"
       << (k > 0   ? "+1"
           : k < 0 ? "−1"
                   : "0")
       << "</text>";
  os << "<text class=\"label\" transform=\"translate(" << bx + 44 << ","
     << by + bh / 2
     << ") rotate(90)\" text-anchor=\"middle\">cosine "
        "(unitless)</text>";
}

/// Every measured step's matrix for the script's slider, as JSON.
std::string heatmapData(const Run &run,
                        const std::vector<const Record *> &measured,
                        unsigned n) {
  std::string data = "{\"tasks\":[";
  for (unsigned i = 0; i < n; ++i)
    data += (i ? "," : "") + jsonString(taskName(run, i));
  data += "],\"steps\":[";
  for (size_t k = 0; k < measured.size(); ++k)
    data += (k ? "," : "") + std::to_string(measured[k]->step);
  data += "],\"m\":[";
  for (size_t k = 0; k < measured.size(); ++k) {
    data += k ? ",[" : "[";
    for (size_t i = 0; i < measured[k]->cosine.size(); ++i) {
      data += i ? ",[" : "[";
      for (size_t j = 0; j < measured[k]->cosine[i].size(); ++j)
        data += (j ? "," : "") + num(measured[k]->cosine[i][j]);
      data += "]";
    }
    data += "]";
  }
  data += "]}";
  return data;
}
} // namespace

void renderHeatmapPanel(Markup &os, const Run &run) {
  std::vector<const Record *> measured;
  for (const Record &r : run.records)
    if (!r.cosine.empty())
      measured.push_back(&r);
  os << "<section class=\"panel\" id=\"panel-cosine\"><h2>Gradient cosine "
        "similarity, task × task</h2>\n";
  HeatmapLayout l;
  l.n = measured.empty() ? run.tasks.size() : measured.back()->cosine.size();
  l.cell = l.n <= 4 ? 64 : l.n <= 8 ? 44 : 28;
  double w = l.left + l.n * l.cell + 90,
         h = std::max(l.top + l.n * l.cell + 20, 200.0);
  os << "<svg class=\"heatmap\" id=\"chart-cosine\" data-panel=\"cosine\" "
        "data-measured=\""
     << measured.size() << "\" data-step=\""
     << (measured.empty() ? std::string("")
                          : std::to_string(measured.back()->step))
     << "\" viewBox=\"0 0 " << w << " " << h << "\" width=\"" << w
     << "\" height=\"" << h
     << "\" role=\"img\" aria-label=\"gradient cosine similarity\">\n";
  if (measured.empty()) {
    os << "<text class=\"empty\" x=\"" << w / 2 << "\" y=\"" << h / 2
       << "\" text-anchor=\"middle\">no step measured the cosine "
          "matrix</text>";
  } else {
    renderCells(os, run, *measured.back(), l);
    renderColorBar(os, l);
  }
  os << "\n</svg>\n";
  if (!measured.empty()) {
    os << "<div class=\"control\"><label>step <input type=\"range\" "
          "id=\"cos-slider\" min=\"0\" max=\""
       << measured.size() - 1 << "\" value=\"" << measured.size() - 1
       << "\" step=\"1\"></label> <span id=\"cos-label\">step "
       << measured.back()->step << " (latest of " << measured.size()
       << " measured)</span></div>\n";
    os << "<script type=\"application/json\" id=\"data-cosine\">"
       << scriptSafe(heatmapData(run, measured, l.n)) << "</script>\n";
    os << "<p class=\"note\">Cosine of the per-task gradients where the "
          "runtime measures them (docs/runtime.md); "
       << measured.size() << " of " << run.records.size()
       << " logged steps carry a matrix.</p>\n";
  }
  os << "</section>\n";
}

} // namespace mtp::report
