//===- Report.cpp - `mtpc report`: a run's metrics as one HTML page -------===//
//
// Reading: each line of the metrics file is one JSON object (llvm::json);
// step records have `step` and `loss` (docs/contracts.md), events have `event` and
// `step`. Anything else is refused with the file and line. A last line
// without its newline that does not parse is a run still being written: it
// is skipped with a note and the rest is rendered.
//
// Rendering: the charts are drawn here as static SVG (the page reads without
// script: every series carries its point count and last value as data
// attributes and an SVG <title>); each chart's data is embedded as JSON
// beside it for the inline script, which adds the hover crosshair with exact
// values, the loss smoothing slider and the cosine heat map's step slider.
//
//===----------------------------------------------------------------------===//

#include "Report.h"
#include "ReportData.h"

#include "codegen/Codegen.h"
#include "passes/PlanFile.h"
#include "mtprt/PlanFrame.h"
#include "schema/plan_generated.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

using llvm::StringRef;
using llvm::Twine;
namespace json = llvm::json;

using namespace mtp::report;

namespace {
enum ExitCode { kOk = 0, kBadInput = 1, kUsageError = 2 };

//===----------------------------------------------------------------------===//
// Small formatting helpers
//===----------------------------------------------------------------------===//

std::string esc(StringRef s) {
  std::string out;
  for (char c : s) {
    switch (c) {
    case '&':
      out += "&amp;";
      break;
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '"':
      out += "&quot;";
      break;
    case '\'':
      out += "&#39;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

/// A number for data attributes and JSON: 9 significant digits, as the
/// runtime writes them; null when not finite.
std::string num(double v) {
  if (!std::isfinite(v))
    return "null";
  return llvm::formatv("{0}", llvm::format("%.9g", v)).str();
}
std::string num(Opt v) { return v ? num(*v) : std::string("null"); }
/// Coordinates: two decimals are finer than a pixel.
std::string px(double v) {
  return llvm::formatv("{0}", llvm::format("%.2f", v)).str();
}
std::string fmtG(double v, int digits = 4) {
  return llvm::formatv("{0}", llvm::format("%.*g", digits, v)).str();
}
std::string jsonString(StringRef s) {
  return llvm::formatv("{0}", json::Value(s.str())).str();
}
/// JSON inside <script>: "</" would end the element.
std::string scriptSafe(std::string s) {
  for (size_t at = s.find("</"); at != std::string::npos; at = s.find("</"))
    s.replace(at, 2, "<\\/");
  return s;
}

std::string bytesText(double b) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::abs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? llvm::formatv("{0} B", (int64_t)b).str()
                : llvm::formatv("{0:f2} {1}", b, units[u]).str();
}

struct ByteUnit {
  StringRef name;
  double scale;
};
ByteUnit byteUnitFor(double maxBytes) {
  if (maxBytes >= 1024.0 * 1024 * 1024)
    return {"GiB", 1024.0 * 1024 * 1024};
  if (maxBytes >= 1024.0 * 1024)
    return {"MiB", 1024.0 * 1024};
  if (maxBytes >= 1024.0)
    return {"KiB", 1024.0};
  return {"B", 1};
}

// Okabe & Ito's colour-blind-safe palette, the yellow last (weak on white).
const char *const kPalette[] = {"#0072B2", "#E69F00", "#009E73", "#D55E00",
                                "#CC79A7", "#56B4E9", "#000000", "#F0E442"};
std::string colorOf(unsigned i) { return kPalette[i % 8]; }
/// Past eight series the colours repeat with a dash pattern.
std::string dashOf(unsigned i) {
  static const char *const dashes[] = {"", "6 3", "2 2", "8 3 2 3"};
  return dashes[(i / 8) % 4];
}
// Decisions: blue keep, orange recompute, reddish purple offload (and a
// letter in each cell, so colour is never the only cue).
const char *const kKeep = "#0072B2", *const kRecompute = "#E69F00",
                  *const kOffload = "#CC79A7";

/// The page's output stream: doubles print as "%.6g" (raw_ostream writes
/// them as "%e"), everything else as raw_ostream does.
class Markup {
public:
  explicit Markup(llvm::raw_ostream &os) : os(os) {}
  template <typename T> Markup &operator<<(const T &v) {
    os << v;
    return *this;
  }
  Markup &operator<<(double v) {
    os << llvm::format("%.6g", v);
    return *this;
  }

private:
  llvm::raw_ostream &os;
};

//===----------------------------------------------------------------------===//
// Time charts
//===----------------------------------------------------------------------===//

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

/// TensorBoard's smoothing: a debiased exponential moving average.
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

std::string pathOf(const std::vector<Opt> &y, const std::vector<int64_t> &x,
                   const Scale &s, unsigned &points) {
  std::string d;
  bool pen = false;
  points = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!y[i] || !std::isfinite(*y[i])) {
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

void renderChart(Markup &os, const Chart &c, const Run &run) {
  std::vector<int64_t> xs;
  for (const Record &r : run.records)
    xs.push_back(r.step);
  Scale s;
  s.x0 = xs.front();
  s.x1 = xs.back();
  if (s.x1 <= s.x0) {
    s.x0 -= 0.5;
    s.x1 += 0.5;
  }
  // The y range: the data (and the reference lines), nicely rounded.
  std::vector<double> values;
  for (const Series &se : c.series)
    for (Opt v : se.y)
      if (v && std::isfinite(*v))
        values.push_back(*v);
  bool hasData = !values.empty() && c.empty.empty();
  double lo = values.empty() ? 0 : *llvm::min_element(values);
  double hi = values.empty() ? 1 : *llvm::max_element(values);
  std::string clipped;
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
  double ystep = niceStep(hi - lo, 5);
  s.y0 = std::floor(lo / ystep) * ystep;
  s.y1 = std::ceil(hi / ystep) * ystep;
  if (c.yMaxFixed && hi <= *c.yMaxFixed)
    s.y1 = *c.yMaxFixed;
  if (s.y1 <= s.y0)
    s.y1 = s.y0 + ystep;

  double pw = kW - kL - kR, ph = kH - kT - kB;
  os << "<svg class=\"chart\" id=\"chart-" << c.id << "\" data-panel=\"" << c.id
     << "\" data-src=\"data-" << c.id << "\" data-records=\""
     << run.records.size() << "\" viewBox=\"0 0 " << kW << " " << kH
     << "\" width=\"" << kW << "\" height=\"" << kH << "\" role=\"img\" "
     << "aria-label=\"" << esc(c.title) << "\">\n";
  os << "<defs><clipPath id=\"clip-" << c.id << "\"><rect x=\"" << kL
     << "\" y=\"" << kT << "\" width=\"" << pw << "\" height=\"" << ph
     << "\"/></clipPath></defs>\n";
  // Grid and ticks.
  os << "<g class=\"axis\">";
  for (double v = s.y0; v <= s.y1 + ystep * 1e-6; v += ystep) {
    double y = s.y(v);
    os << "<line class=\"grid\" x1=\"" << kL << "\" x2=\"" << kL + pw
       << "\" y1=\"" << px(y) << "\" y2=\"" << px(y) << "\"/>"
       << "<text x=\"" << kL - 6 << "\" y=\"" << px(y + 4)
       << "\" text-anchor=\"end\">"
       << fmtG(std::abs(v) < ystep * 1e-9 ? 0 : v, 6) << "</text>";
  }
  double xstep = std::max(1.0, niceStep(s.x1 - s.x0, 6));
  for (double v = std::ceil(s.x0 / xstep) * xstep; v <= s.x1; v += xstep) {
    double x = s.x(v);
    os << "<line class=\"grid\" x1=\"" << px(x) << "\" x2=\"" << px(x)
       << "\" y1=\"" << kT << "\" y2=\"" << kT + ph << "\"/>"
       << "<text x=\"" << px(x) << "\" y=\"" << kT + ph + 16
       << "\" text-anchor=\"middle\">" << fmtG(v, 9) << "</text>";
  }
  os << "<rect class=\"frame\" x=\"" << kL << "\" y=\"" << kT << "\" width=\""
     << pw << "\" height=\"" << ph << "\"/>";
  os << "<text class=\"label\" x=\"" << kL + pw / 2 << "\" y=\"" << kH - 6
     << "\" text-anchor=\"middle\">step</text>";
  os << "<text class=\"label\" transform=\"translate(14," << kT + ph / 2
     << ") rotate(-90)\" text-anchor=\"middle\">" << esc(c.yLabel)
     << "</text></g>\n";

  os << "<g clip-path=\"url(#clip-" << c.id << ")\">\n";
  // Labels of close reference lines: the higher line's above it, the
  // lower's below.
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
       << num(r.y) << "\" x1=\"" << kL << "\" x2=\"" << kL + pw << "\" y1=\""
       << px(y) << "\" y2=\"" << px(y) << "\" stroke=\"" << r.color
       << "\"><title>" << esc(r.label) << "</title></line>"
       << "<text class=\"reflabel\" x=\"" << kL + pw - 4 << "\" y=\"" << px(ly)
       << "\" text-anchor=\"end\" fill=\"" << r.color << "\">" << esc(r.label)
       << "</text>\n";
  }
  for (const Event &e : run.events) {
    if (e.step < s.x0 || e.step > s.x1)
      continue;
    double x = s.x(e.step);
    os << "<g class=\"event\" data-step=\"" << e.step << "\"><title>"
       << esc(e.name) << " at step " << e.step
       << (e.detail.empty() ? "" : " (" + esc(e.detail) + ")")
       << "</title><line x1=\"" << px(x) << "\" x2=\"" << px(x) << "\" y1=\""
       << kT << "\" y2=\"" << kT + ph << "\"/><path d=\"M" << px(x - 5) << ","
       << kT << "h10l-5,8z\"/></g>\n";
  }
  if (hasData) {
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
  } else {
    os << "<text class=\"empty\" x=\"" << kL + pw / 2 << "\" y=\""
       << kT + ph / 2 << "\" text-anchor=\"middle\">"
       << esc(c.empty.empty() ? "no data in this run" : c.empty) << "</text>\n";
  }
  os << "</g>\n";
  // The hover cursor and one dot per series, placed by the script.
  os << "<line class=\"cursor\" x1=\"0\" x2=\"0\" y1=\"" << kT << "\" y2=\""
     << kT + ph << "\" visibility=\"hidden\"/>";
  for (unsigned i = 0; i < c.series.size(); ++i)
    os << "<circle class=\"dot\" r=\"3\" fill=\"" << c.series[i].color
       << "\" visibility=\"hidden\"/>";
  os << "\n</svg>\n";

  // The data the script needs: steps, the scale and each series.
  std::string data;
  llvm::raw_string_ostream dsStream(data);
  Markup ds(dsStream);
  ds << "{\"unit\":" << jsonString(c.unit) << ",\"box\":[" << kL << "," << kT
     << "," << pw << "," << ph << "],\"dom\":[" << num(s.x0) << "," << num(s.x1)
     << "," << num(s.y0) << "," << num(s.y1) << "],\"x\":[";
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
  os << "<script type=\"application/json\" id=\"data-" << c.id << "\">"
     << scriptSafe(data) << "</script>\n";
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

void panel(Markup &os, const Chart &c, const Run &run,
           StringRef extraHtml = "") {
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

void renderHeatmap(Markup &os, const Run &run) {
  std::vector<const Record *> measured;
  for (const Record &r : run.records)
    if (!r.cosine.empty())
      measured.push_back(&r);
  os << "<section class=\"panel\" id=\"panel-cosine\"><h2>Gradient cosine "
        "similarity, task × task</h2>\n";
  const auto &tasks = run.tasks;
  unsigned n = measured.empty() ? tasks.size() : measured.back()->cosine.size();
  double cell = n <= 4 ? 64 : n <= 8 ? 44 : 28;
  double left = 90, top = 24;
  double w = left + n * cell + 90, h = std::max(top + n * cell + 20, 200.0);
  os << "<svg class=\"heatmap\" id=\"chart-cosine\" data-panel=\"cosine\" "
        "data-measured=\""
     << measured.size() << "\" data-step=\""
     << (measured.empty() ? std::string("")
                          : std::to_string(measured.back()->step))
     << "\" viewBox=\"0 0 " << w << " " << h << "\" width=\"" << w
     << "\" height=\"" << h
     << "\" role=\"img\" aria-label=\"gradient cosine similarity\">\n";
  auto taskName = [&](unsigned i) {
    return i < tasks.size() ? tasks[i] : "task " + std::to_string(i);
  };
  if (measured.empty()) {
    os << "<text class=\"empty\" x=\"" << w / 2 << "\" y=\"" << h / 2
       << "\" text-anchor=\"middle\">no step measured the cosine "
          "matrix</text>";
  } else {
    const Record &last = *measured.back();
    for (unsigned i = 0; i < n; ++i) {
      os << "<text class=\"tick\" x=\"" << left - 6 << "\" y=\""
         << px(top + i * cell + cell / 2 + 4) << "\" text-anchor=\"end\">"
         << esc(taskName(i)) << "</text>";
      os << "<text class=\"tick\" x=\"" << px(left + i * cell + cell / 2)
         << "\" y=\"" << top - 8 << "\" text-anchor=\"middle\">"
         << esc(taskName(i)) << "</text>";
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
           << "</text><title>" << esc(taskName(i)) << " × " << esc(taskName(j))
           << ": " << fmtG(v, 6) << " at step " << last.step
           << "</title></g>\n";
      }
    // The colour bar, -1 (bottom) to +1 (top).
    double bx = left + n * cell + 24, by = top, bh = std::max(n * cell, 120.0);
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
  os << "\n</svg>\n";
  if (!measured.empty()) {
    os << "<div class=\"control\"><label>step <input type=\"range\" "
          "id=\"cos-slider\" min=\"0\" max=\""
       << measured.size() - 1 << "\" value=\"" << measured.size() - 1
       << "\" step=\"1\"></label> <span id=\"cos-label\">step "
       << measured.back()->step << " (latest of " << measured.size()
       << " measured)</span></div>\n";
    std::string data = "{\"tasks\":[";
    for (unsigned i = 0; i < n; ++i)
      data += (i ? "," : "") + jsonString(taskName(i));
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
    os << "<script type=\"application/json\" id=\"data-cosine\">"
       << scriptSafe(data) << "</script>\n";
    os << "<p class=\"note\">Cosine of the per-task gradients where the "
          "runtime measures them (docs/runtime.md); "
       << measured.size() << " of " << run.records.size()
       << " logged steps carry a matrix.</p>\n";
  }
  os << "</section>\n";
}

//===----------------------------------------------------------------------===//
// The plan
//===----------------------------------------------------------------------===//

StringRef str(const flatbuffers::String *s) {
  return s ? StringRef(s->c_str(), s->size()) : StringRef();
}

const char *decisionColor(mtp::fb::Decision d) {
  switch (d) {
  case mtp::fb::Decision::Recompute:
    return kRecompute;
  case mtp::fb::Decision::Offload:
    return kOffload;
  default:
    return kKeep;
  }
}
StringRef decisionName(mtp::fb::Decision d) {
  switch (d) {
  case mtp::fb::Decision::Recompute:
    return "recompute";
  case mtp::fb::Decision::Offload:
    return "offload";
  default:
    return "keep";
  }
}

std::string unitTitle(const mtp::fb::Unit *u) {
  return llvm::formatv("{0}: {1}, {2} saved, {3:f4} GFLOP forward",
                       str(u->name()), decisionName(u->decision()),
                       bytesText(u->saved_bytes()), u->fwd_flops() / 1e9)
      .str();
}

void renderPlanStrip(Markup &os, const mtp::fb::Plan &plan, const Run &run) {
  // Columns: the backbone's units in forward order (a block is the attention
  // or MLP of a layer, several units each); heads and losses per task row.
  std::vector<const mtp::fb::Unit *> cols;
  std::map<std::string, std::vector<const mtp::fb::Unit *>> taskUnits;
  double maxSaved = 1;
  if (plan.units())
    for (const mtp::fb::Unit *u : *plan.units()) {
      if (u->block() >= 0) {
        cols.push_back(u);
        maxSaved = std::max(maxSaved, double(u->saved_bytes()));
      } else if (u->task()) {
        taskUnits[str(u->task()).str()].push_back(u);
      }
    }
  std::vector<const mtp::fb::Task *> tasks;
  if (plan.tasks())
    for (const mtp::fb::Task *t : *plan.tasks())
      tasks.push_back(t);
  // Tasks in the run's order (the charts' colours), plan-only ones after.
  auto runIndex = [&](const mtp::fb::Task *t) {
    for (unsigned i = 0; i < run.tasks.size(); ++i)
      if (run.tasks[i] == str(t->name()))
        return i;
    return unsigned(run.tasks.size());
  };
  llvm::stable_sort(
      tasks, [&](auto *a, auto *b) { return runIndex(a) < runIndex(b); });
  auto firstCol = [&](int64_t block) {
    for (unsigned i = 0; i < cols.size(); ++i)
      if (cols[i]->block() >= block)
        return i;
    return unsigned(cols.size());
  };
  auto endCol = [&](int64_t block) { // one past the block's last column
    unsigned e = 0;
    for (unsigned i = 0; i < cols.size(); ++i)
      if (cols[i]->block() <= block)
        e = i + 1;
    return e;
  };

  unsigned nc = std::max<size_t>(cols.size(), 1);
  double cw = std::clamp(900.0 / nc, 3.0, 40.0);
  double left = 84, top = 30, barH = 34, stripH = 26, rowH = 26;
  double stripY = top + barH + 2;
  double headX = left + nc * cw + 24;
  double w = headX + 2 * 56 + 12;
  double taskY = stripY + stripH + 26;
  double h = taskY + tasks.size() * rowH + 8;
  os << "<svg class=\"plan\" id=\"chart-plan\" data-panel=\"plan\" "
        "data-units=\""
     << cols.size() << "\" data-tasks=\"" << tasks.size() << "\" viewBox=\"0 0 "
     << w << " " << h << "\" width=\"" << w << "\" height=\"" << h
     << "\" role=\"img\" aria-label=\"plan: decisions per unit\">\n";
  auto letter = [&](mtp::fb::Decision d) {
    return d == mtp::fb::Decision::Recompute ? "R"
           : d == mtp::fb::Decision::Offload ? "O"
                                             : "K";
  };
  // Checkpoint regions as brackets above the bars.
  if (plan.regions())
    for (const mtp::fb::Region *r : *plan.regions()) {
      double x0 = left + firstCol(r->first_block()) * cw + 1,
             x1 = left + endCol(r->last_block()) * cw - 1;
      os << "<g class=\"region\"><title>checkpoint region: blocks "
         << r->first_block() << "–" << r->last_block()
         << ", recomputed together in the backward</title><path d=\"M" << px(x0)
         << "," << top - 2 << "v-6H" << px(x1) << "v6\"/><text x=\""
         << px((x0 + x1) / 2) << "\" y=\"" << top - 11
         << "\" text-anchor=\"middle\">region</text></g>\n";
    }
  os << "<text class=\"tick\" x=\"" << left - 6 << "\" y=\""
     << top + barH / 2 + 4 << "\" text-anchor=\"end\">saved bytes</text>"
     << "<text class=\"tick\" x=\"" << left - 6 << "\" y=\""
     << stripY + stripH / 2 + 4 << "\" text-anchor=\"end\">decision</text>\n";
  for (unsigned i = 0; i < cols.size(); ++i) {
    const mtp::fb::Unit *u = cols[i];
    double x = left + i * cw;
    double bh = std::max(u->saved_bytes() > 0 ? 1.0 : 0.0,
                         barH * u->saved_bytes() / maxSaved);
    os << "<g class=\"unit\" data-unit=\"" << esc(str(u->name()))
       << "\" data-block=\"" << u->block() << "\" data-decision=\""
       << decisionName(u->decision()) << "\"><title>" << esc(unitTitle(u))
       << "</title><rect class=\"bar\" x=\"" << px(x + 0.5) << "\" y=\""
       << px(top + barH - bh) << "\" width=\"" << px(std::max(cw - 1, 1.0))
       << "\" height=\"" << px(bh) << "\"/><rect x=\"" << px(x) << "\" y=\""
       << stripY << "\" width=\"" << px(cw) << "\" height=\"" << stripH
       << "\" fill=\"" << decisionColor(u->decision()) << "\"/>";
    if (cw >= 14)
      os << "<text x=\"" << px(x + cw / 2) << "\" y=\""
         << stripY + stripH / 2 + 4 << "\" text-anchor=\"middle\">"
         << letter(u->decision()) << "</text>";
    os << "</g>\n";
  }
  // Block and layer boundaries, and the layer numbers under the strip.
  int64_t layers = plan.backbone() ? plan.backbone()->layers() : 0;
  int64_t every = layers > 24 ? 4 : layers > 12 ? 2 : 1;
  for (int64_t b = 1; b <= 2 * layers; ++b) {
    unsigned c = firstCol(b);
    double x = left + c * cw;
    bool layerStart = b % 2 == 1;
    os << "<line class=\"" << (layerStart ? "sep layer" : "sep") << "\" x1=\""
       << px(x) << "\" x2=\"" << px(x) << "\" y1=\""
       << (layerStart ? top : stripY) << "\" y2=\"" << stripY + stripH + 4
       << "\"/>";
    if (layerStart && ((b + 1) / 2 % every == 0 || b == 1)) {
      double xe = left + endCol(b + 1) * cw;
      os << "<text class=\"tick\" x=\"" << px((x + xe) / 2) << "\" y=\""
         << stripY + stripH + 14 << "\" text-anchor=\"middle\">"
         << (cw * (endCol(b + 1) - c) >= 40 ? "layer " : "") << (b + 1) / 2
         << "</text>";
    }
  }
  if (!cols.empty())
    os << "<text class=\"tick\" x=\"" << px(left + endCol(0) * cw / 2)
       << "\" y=\"" << stripY + stripH + 14 << "\" text-anchor=\"middle\">"
       << (endCol(0) * cw >= 30 ? "emb" : "e") << "</text>";
  os << "<text class=\"tick\" x=\"" << px(headX + 55) << "\" y=\""
     << stripY + stripH / 2 + 4
     << "\" text-anchor=\"middle\">head · loss</text>\n";
  // One row per task: the backbone it back-propagates through, its tap, its
  // head and loss units.
  for (unsigned k = 0; k < tasks.size(); ++k) {
    const mtp::fb::Task *t = tasks[k];
    std::string name = str(t->name()).str();
    unsigned ci = runIndex(t);
    if (ci >= run.tasks.size())
      ci = run.tasks.size() + k;
    std::string color = colorOf(ci);
    double y = taskY + k * rowH;
    double xEnd = left + endCol(2 * t->tap_layer()) * cw;
    os << "<g class=\"task\" data-task=\"" << esc(name) << "\" data-tap=\""
       << t->tap_layer() << "\">";
    os << "<text class=\"tick\" x=\"" << left - 6 << "\" y=\"" << y + 14
       << "\" text-anchor=\"end\" fill=\"" << color << "\">" << esc(name)
       << "</text>";
    os << "<rect x=\"" << left << "\" y=\"" << y + 6 << "\" width=\""
       << px(std::max(xEnd - left, 1.0)) << "\" height=\"10\" fill=\"" << color
       << "\" opacity=\"0.35\"><title>" << esc(name)
       << " back-propagates through the embeddings and layers 1–"
       << t->tap_layer() << "</title></rect>";
    os << "<g class=\"tap\"><title>" << esc(name) << " taps "
       << (t->pooled() ? "the pooled output of " : "") << "layer "
       << t->tap_layer() << " (" << esc(str(t->head())) << " head, weight "
       << fmtG(t->weight()) << ")</title><line x1=\"" << px(xEnd) << "\" x2=\""
       << px(xEnd) << "\" y1=\"" << y + 4 << "\" y2=\"" << stripY + stripH
       << "\" stroke=\"" << color << "\" stroke-dasharray=\"2 2\"/><path d=\"M"
       << px(xEnd - 6) << "," << y + 2 << "h12l-6,10z\" fill=\"" << color
       << "\"/><line x1=\"" << px(xEnd) << "\" x2=\"" << headX << "\" y1=\""
       << y + 11 << "\" y2=\"" << y + 11 << "\" stroke=\"" << color
       << "\" stroke-dasharray=\"1 3\"/></g>";
    unsigned i = 0;
    for (const mtp::fb::Unit *u : taskUnits[name]) {
      if (i == 2)
        break;
      double x = headX + i * 56;
      os << "<g class=\"unit\" data-unit=\"" << esc(str(u->name()))
         << "\" data-decision=\"" << decisionName(u->decision())
         << "\"><rect x=\"" << px(x) << "\" y=\"" << y + 1
         << "\" width=\"54\" height=\"20\" fill=\""
         << decisionColor(u->decision()) << "\"/><text x=\"" << px(x + 27)
         << "\" y=\"" << y + 15 << "\" text-anchor=\"middle\">"
         << esc(str(u->kind()).take_front(5)) << " " << letter(u->decision())
         << "</text><title>" << esc(unitTitle(u)) << "</title></g>";
      ++i;
    }
    os << "</g>\n";
  }
  os << "</svg>\n";
}

void renderPlanPanel(Markup &os, const mtp::fb::Plan *plan, const Run &run,
                     StringRef planFile) {
  os << "<section class=\"panel wide\" id=\"panel-plan\"><h2>The plan: "
        "keep / recompute / offload per unit, task taps</h2>\n";
  if (!plan) {
    os << "<p class=\"note\">No plan given: <code>mtpc report RUN.jsonl "
          "--plan PLAN|BINARY</code> adds the decisions per layer (the "
          "training binary carries its plan).</p></section>\n";
    return;
  }
  os << "<div class=\"legend\">";
  for (auto [name, color] :
       {std::pair{"keep (K)", kKeep}, std::pair{"recompute (R)", kRecompute},
        std::pair{"offload (O)", kOffload}})
    os << "<span><svg width=\"14\" height=\"12\"><rect width=\"14\" "
          "height=\"12\" fill=\""
       << color << "\"/></svg>" << name << "</span>";
  os << "<span>▼ task tap</span></div>\n";
  renderPlanStrip(os, *plan, run);
  // The same as a table, for exact numbers.
  os << "<details><summary>units ("
     << (plan->units() ? plan->units()->size() : 0) << ") from "
     << esc(planFile)
     << "</summary><table><thead><tr><th>unit</th><th>task</th><th>layer</th>"
        "<th>saved</th><th>fwd GFLOP</th><th>decision</th></tr></thead>"
        "<tbody>\n";
  if (plan->units())
    for (const mtp::fb::Unit *u : *plan->units())
      os << "<tr><td>" << esc(str(u->name())) << "</td><td>"
         << esc(str(u->task())) << "</td><td>" << u->layer() << "</td><td>"
         << bytesText(u->saved_bytes()) << "</td><td>"
         << llvm::formatv("{0:f4}", u->fwd_flops() / 1e9) << "</td><td>"
         << decisionName(u->decision()) << "</td></tr>\n";
  os << "</tbody></table></details>\n";
  if (plan->offloads() && plan->offloads()->size()) {
    os << "<p class=\"note\">Offloaded: ";
    bool first = true;
    for (const mtp::fb::Offload *o : *plan->offloads()) {
      os << (first ? "" : "; ") << esc(str(o->unit())) << " "
         << bytesText(o->bytes()) << " each way, predicted exposed wait "
         << llvm::formatv("{0:f1}", o->exposed_wait_s() * 1e6) << " µs";
      first = false;
    }
    os << ".</p>\n";
  }
  os << "</section>\n";
}

//===----------------------------------------------------------------------===//
// The page
//===----------------------------------------------------------------------===//

// The stylesheet and the script: report/report.css and report/report.js,
// embedded at build time (report/EmbedAsset.cmake).
#include "ReportCss.inc"
#include "ReportJs.inc"

struct PlanInput {
  std::unique_ptr<llvm::MemoryBuffer> buffer;
  StringRef bytes;
  const mtp::fb::Plan *plan = nullptr;
};

double median(std::vector<double> v) {
  if (v.empty())
    return std::nan("");
  llvm::sort(v);
  return v[v.size() / 2];
}

std::string renderPage(const Run &run, const mtp::fb::Plan *plan,
                       StringRef planFile) {
  std::string out;
  llvm::raw_string_ostream pageStream(out);
  Markup os(pageStream);
  std::string model = plan ? str(plan->model()).str() : "";
  const Record &first = run.records.front(), &last = run.records.back();

  os << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, "
        "initial-scale=1\">\n"
        "<meta name=\"generator\" content=\"mtpc report\">\n"
        "<link rel=\"icon\" href=\"data:,\">\n<title>mtpc report: "
     << esc(model.empty() ? llvm::sys::path::filename(run.file) : model)
     << "</title>\n<style>\n" << kReportCss
     << "</style></head>\n<body>\n";

  // --- Header: the spec, the plan, the run, versions. -----------------------
  os << "<header id=\"panel-header\"><h1>"
     << (model.empty()
             ? "Training run " + esc(llvm::sys::path::filename(run.file))
             : "Model '" + esc(model) + "'")
     << "</h1><dl>\n";
  auto row = [&](StringRef k, const std::string &v) {
    os << "<dt>" << esc(k) << "</dt><dd>" << v << "</dd>\n";
  };
  if (plan) {
    row("spec", "<code>" + esc(str(plan->source())) + "</code>");
    if (const mtp::fb::Target *t = plan->target())
      row("target",
          esc(llvm::formatv("{0}, {1}, {2} GPU(s), micro-batch {3}, "
                            "global batch {4}; budget {5}, {6} "
                            "usable",
                            str(t->device()), str(t->precision()), t->gpus(),
                            t->micro_batch(), t->global_batch(),
                            bytesText(t->memory_bytes()),
                            bytesText(t->usable_bytes()))
                  .str()));
    if (const mtp::fb::Backbone *bb = plan->backbone())
      row("backbone",
          esc(llvm::formatv("{0}: {1} layers, hidden {2}, {3} heads, ffn {4}, "
                            "vocab {5}, seq {6}",
                            str(bb->kind()), bb->layers(), bb->hidden(),
                            bb->heads(), bb->ffn(), bb->vocab(), bb->seq())
                  .str()));
    if (plan->tasks()) {
      std::vector<std::string> ts;
      for (const mtp::fb::Task *t : *plan->tasks())
        ts.push_back(llvm::formatv("{0} ({1} from {2}layer {3}, weight {4})",
                                   str(t->name()), str(t->head()),
                                   t->pooled() ? "pooled " : "", t->tap_layer(),
                                   fmtG(t->weight()))
                         .str());
      row("tasks", esc(llvm::join(ts, "; ")));
    }
    unsigned counts[3] = {0, 0, 0};
    if (plan->units())
      for (const mtp::fb::Unit *u : *plan->units())
        ++counts[std::clamp(int(u->decision()), 0, 2)];
    row("plan",
        esc(llvm::formatv(
                "predicted peak {0} (keeping everything {1}, uniform "
                "checkpointing {2}), +{3:f1} µs per step; units: {4} keep, "
                "{5} recompute, {6} offload; {7} checkpoint region(s)",
                bytesText(plan->predicted_peak_bytes()),
                bytesText(plan->keep_peak_bytes()),
                bytesText(plan->uniform_peak_bytes()),
                plan->added_seconds() * 1e6, counts[0], counts[1], counts[2],
                plan->regions() ? plan->regions()->size() : 0)
                .str()));
    if (const mtp::fb::Strategy *st = plan->strategy())
      row("strategy",
          esc(llvm::formatv("gradient scope {0}, GFM keep {1}, clip {2}, DGFG "
                            "{3}, collective {4} (top-k {5}, {6}-bit)",
                            str(st->scope()), fmtG(st->gfm_keep()),
                            fmtG(st->clip_max_norm()),
                            st->gate_hidden()
                                ? "hidden " + std::to_string(st->gate_hidden())
                                : std::string("off"),
                            str(st->collective()), fmtG(st->topk()), st->bits())
                  .str()));
  }
  {
    std::vector<std::string> ls;
    for (unsigned t = 0; t < run.tasks.size(); ++t) {
      Opt a, b;
      for (const Record &r : run.records)
        if (r.loss[t]) {
          if (!a)
            a = r.loss[t];
          b = r.loss[t];
        }
      ls.push_back(run.tasks[t] + " " + (a ? fmtG(*a) : "-") + " → " +
                   (b ? fmtG(*b) : "-"));
    }
    std::vector<double> sps;
    double peak = 0;
    for (const Record &r : run.records) {
      if (r.samplesPerS)
        sps.push_back(*r.samplesPerS);
      peak = std::max(peak, r.measuredPeak.value_or(0));
    }
    std::string runLine = llvm::formatv(
        "<code>{0}</code>: {1} step records (steps {2}–{3}), {4} event(s); "
        "loss first → last: {5}",
        esc(run.file), run.records.size(), first.step, last.step,
        run.events.size(), esc(llvm::join(ls, ", ")));
    row("run", runLine);
    std::string perf =
        llvm::formatv("peak device memory {0} measured", bytesText(peak));
    Opt predicted =
        plan ? Opt(plan->predicted_peak_bytes()) : last.predictedPeak;
    if (predicted && *predicted > 0)
      perf +=
          llvm::formatv(" vs {0} predicted ({1}%)", bytesText(*predicted),
                        llvm::format("%+.1f", (peak / *predicted - 1) * 100))
              .str();
    if (!sps.empty())
      perf +=
          llvm::formatv("; median throughput {0} samples/s", fmtG(median(sps)));
    row("measured", esc(perf));
  }
  row("versions",
      esc(llvm::formatv("mtpc report (LLVM/MLIR {0}); metrics as in "
                        "docs/contracts.md{1}",
                        LLVM_VERSION_STRING,
                        plan ? "; plan format v" +
                                   std::to_string(plan->version()) + " (" +
                                   planFile.str() + ")"
                             : std::string())
              .str()));
  os << "</dl>\n";
  std::vector<std::string> notes = run.notes;
  if (plan && last.predictedPeak &&
      int64_t(*last.predictedPeak) != plan->predicted_peak_bytes())
    notes.push_back(llvm::formatv("the plan predicts {0} B but the run logged "
                                  "predicted_peak_bytes {1}: is {2} the plan "
                                  "this run trained with?",
                                  plan->predicted_peak_bytes(),
                                  int64_t(*last.predictedPeak), planFile)
                        .str());
  if (!notes.empty()) {
    os << "<div class=\"notes\">";
    for (const std::string &n : notes)
      os << esc(n) << "<br>";
    os << "</div>\n";
  }
  os << "</header>\n<main>\n";

  size_t n = run.records.size();
  auto column = [&](auto get) {
    std::vector<Opt> y(n);
    for (size_t i = 0; i < n; ++i)
      y[i] = get(run.records[i]);
    return y;
  };

  // --- Loss per task, smoothed. ----------------------------------------------
  {
    Chart c;
    c.id = "loss";
    c.title = "Loss per task";
    bool ce = plan && plan->tasks();
    if (plan && plan->tasks())
      for (const mtp::fb::Task *t : *plan->tasks())
        ce &= str(t->loss()) == "cross_entropy";
    c.yLabel = ce ? "loss (cross-entropy, nats)" : "loss (task's criterion)";
    c.unit = ce ? "nats" : "";
    c.zeroBased = false;
    for (unsigned t = 0; t < run.tasks.size(); ++t) {
      Series raw;
      raw.name = run.tasks[t] + " (raw)";
      raw.key = run.tasks[t];
      raw.color = colorOf(t);
      raw.faint = true;
      raw.y = column([&](const Record &r) { return r.loss[t]; });
      Series sm = raw;
      sm.name = run.tasks[t];
      sm.key = run.tasks[t] + ".smoothed";
      sm.faint = false;
      sm.dash = dashOf(t);
      sm.smoothOf = c.series.size();
      sm.y = smooth(raw.y, 0.6);
      c.series.push_back(std::move(raw));
      c.series.push_back(std::move(sm));
    }
    panel(os, c, run,
          "<div class=\"control\"><label>smoothing <input type=\"range\" "
          "id=\"smooth-slider\" min=\"0\" max=\"0.99\" step=\"0.01\" "
          "value=\"0.6\"></label> <span id=\"smooth-label\">0.60</span> "
          "(exponential moving average, debiased; faint: raw)</div>\n");
  }

  renderHeatmap(os, run);

  // --- α per task.
  // ------------------------------------------------------------
  {
    Chart c;
    c.id = "alpha";
    c.title = "DGFG weights α per task";
    c.yLabel = "α (share of the backbone gradient)";
    for (unsigned t = 0; t < run.tasks.size(); ++t) {
      Series s;
      s.name = run.tasks[t];
      s.key = run.tasks[t];
      s.color = colorOf(t);
      s.dash = dashOf(t);
      s.y = column([&](const Record &r) { return r.alpha[t]; });
      c.series.push_back(std::move(s));
    }
    if (plan && plan->strategy() && plan->strategy()->gate_hidden() == 0)
      c.note = "The plan has no DGFG gate: α are the fixed loss weights.";
    panel(os, c, run);
  }

  // --- Device memory against the prediction and the budget. -----------------
  {
    double maxBytes = 0;
    for (const Record &r : run.records)
      maxBytes = std::max(
          {maxBytes, r.measuredPeak.value_or(0), r.hostPool.value_or(0)});
    Opt predicted =
        plan ? Opt(plan->predicted_peak_bytes()) : last.predictedPeak;
    if (predicted)
      maxBytes = std::max(maxBytes, *predicted);
    ByteUnit u = byteUnitFor(maxBytes);
    Chart c;
    c.id = "memory";
    c.title = "Device memory per step";
    // From zero only beside the budget: a few percent between the measured
    // and the predicted peak must stay visible.
    c.zeroBased = false;
    c.unit = u.name.str();
    c.yLabel = ("memory (" + u.name + ")").str();
    Series m;
    m.name = "measured peak (device)";
    m.key = "measured_peak_bytes";
    m.color = kPalette[0];
    m.y = column([&](const Record &r) -> Opt {
      return r.measuredPeak ? Opt(*r.measuredPeak / u.scale) : Opt();
    });
    c.series.push_back(std::move(m));
    bool anyHost = llvm::any_of(run.records, [](const Record &r) {
      return r.hostPool.value_or(0) > 0;
    });
    if (anyHost) {
      Series h;
      h.name = "host pool (offloaded copies)";
      h.key = "host_pool_bytes";
      h.color = kPalette[5];
      h.dash = "4 3";
      h.y = column([&](const Record &r) -> Opt {
        return r.hostPool ? Opt(*r.hostPool / u.scale) : Opt();
      });
      c.series.push_back(std::move(h));
    }
    if (predicted)
      c.refs.push_back({*predicted / u.scale,
                        "predicted peak " + bytesText(*predicted) +
                            (plan ? " (plan)" : " (run)"),
                        kPalette[1], "predicted_peak_bytes"});
    if (plan && plan->target()) {
      double budget = plan->target()->memory_bytes(),
             usable = plan->target()->usable_bytes();
      // A budget far above the run would flatten every line: say it instead.
      if (budget <= 4 * maxBytes) {
        c.zeroBased = true;
        c.refs.push_back({budget / u.scale, "budget " + bytesText(budget),
                          kPalette[3], "budget"});
        if (usable != budget && usable > 0)
          c.refs.push_back(
              {usable / u.scale,
               "usable " + bytesText(usable) + " (budget − headroom)",
               kPalette[4], "usable"});
      } else {
        c.note = llvm::formatv("The budget, {0} ({1} usable), is off the "
                               "scale: the run peaks at {2:f1}% of it.",
                               bytesText(budget), bytesText(usable),
                               maxBytes / budget * 100)
                     .str();
      }
    }
    panel(os, c, run);
  }

  // --- Offload.
  // -----------------------------------------------------------------
  {
    bool anyUse = llvm::any_of(run.records, [](const Record &r) {
      return r.offloadHits.value_or(0) + r.offloadMisses.value_or(0) > 0;
    });
    double hits = 0, misses = 0, wait = 0;
    for (const Record &r : run.records) {
      hits += r.offloadHits.value_or(0);
      misses += r.offloadMisses.value_or(0);
      wait += r.offloadWaitS.value_or(0);
    }
    std::string none = "no offloaded activations in this run (offload_hits + "
                       "offload_misses = 0 every step)";
    Chart c;
    c.id = "offload-hit";
    c.title = "Offload hit rate";
    c.yLabel = "hit rate (% of offloaded uses)";
    c.unit = "%";
    c.yMaxFixed = 100;
    Series s;
    s.name = "hit rate";
    s.key = "offload_hit_rate";
    s.color = kPalette[2];
    s.y = column([&](const Record &r) -> Opt {
      double uses = r.offloadHits.value_or(0) + r.offloadMisses.value_or(0);
      return uses > 0 ? Opt(100 * r.offloadHits.value_or(0) / uses) : Opt();
    });
    c.series.push_back(std::move(s));
    if (!anyUse)
      c.empty = none;
    else
      c.note = llvm::formatv("Over the run: {0} hits, {1} misses ({2:f1}% "
                             "hits): a miss is a fetch that was not back "
                             "before the backward used it.",
                             int64_t(hits), int64_t(misses),
                             100 * hits / (hits + misses))
                   .str();
    panel(os, c, run);

    Chart w;
    w.id = "offload-wait";
    w.title = "Exposed offload wait";
    w.yLabel = "wait per step (ms)";
    w.unit = "ms";
    w.clipOutliers = true;
    Series ws;
    ws.name = "exposed wait";
    ws.key = "offload_wait_s";
    ws.color = kPalette[3];
    ws.y = column([&](const Record &r) -> Opt {
      return r.offloadWaitS ? Opt(*r.offloadWaitS * 1e3) : Opt();
    });
    w.series.push_back(std::move(ws));
    if (!anyUse)
      w.empty = none;
    else
      w.note = llvm::formatv("{0:f3} ms waited in all over {1} steps.",
                             wait * 1e3, run.records.size())
                   .str();
    panel(os, w, run);
  }

  // --- Bytes sent.
  // --------------------------------------------------------------
  {
    double maxBytes = 0, sent = 0, full = 0;
    for (const Record &r : run.records) {
      maxBytes = std::max({maxBytes, r.bytesSent.value_or(0),
                           r.bytesSentUncompressed.value_or(0)});
      sent += r.bytesSent.value_or(0);
      full += r.bytesSentUncompressed.value_or(0);
    }
    ByteUnit u = byteUnitFor(maxBytes);
    Chart c;
    c.id = "bytes";
    c.title = "Gradient bytes sent per step";
    c.unit = u.name.str();
    c.yLabel = ("sent per step (" + u.name + ")").str();
    Series a;
    a.name = "sent (compressed)";
    a.key = "bytes_sent";
    a.color = kPalette[0];
    a.y = column([&](const Record &r) -> Opt {
      return r.bytesSent ? Opt(*r.bytesSent / u.scale) : Opt();
    });
    Series b;
    b.name = "uncompressed equivalent";
    b.key = "bytes_sent_uncompressed";
    b.color = kPalette[1];
    b.dash = "6 3";
    b.y = column([&](const Record &r) -> Opt {
      return r.bytesSentUncompressed ? Opt(*r.bytesSentUncompressed / u.scale)
                                     : Opt();
    });
    c.series.push_back(std::move(a));
    c.series.push_back(std::move(b));
    if (full <= 0)
      c.empty = "nothing sent: one process (at world size 1 the gradient "
                "exchange does nothing)";
    else
      c.note = llvm::formatv("Over the run: {0} sent for {1} uncompressed "
                             "({2:f1}× less).",
                             bytesText(sent), bytesText(full),
                             sent > 0 ? full / sent : 0.0)
                   .str();
    panel(os, c, run);
  }

  // --- Throughput and step time.
  // ----------------------------------------------
  {
    Chart c;
    c.id = "throughput";
    c.title = "Throughput";
    c.yLabel = "samples/s";
    c.unit = "samples/s";
    Series s;
    s.name = "samples/s (global batch / step time)";
    s.key = "samples_per_s";
    s.color = kPalette[2];
    s.y = column([](const Record &r) { return r.samplesPerS; });
    c.series.push_back(std::move(s));
    panel(os, c, run);

    Chart t;
    t.id = "step-time";
    t.title = "Step time";
    t.yLabel = "step time (ms)";
    t.unit = "ms";
    t.clipOutliers = true;
    Series ts;
    ts.name = "step time";
    ts.key = "step_time_s";
    ts.color = kPalette[4];
    ts.y = column([](const Record &r) -> Opt {
      return r.stepTimeS ? Opt(*r.stepTimeS * 1e3) : Opt();
    });
    t.series.push_back(std::move(ts));
    panel(os, t, run);
  }

  // --- Events.
  // --------------------------------------------------------------------
  os << "<section class=\"panel\" id=\"panel-events\"><h2>Events</h2>\n";
  if (run.events.empty()) {
    os << "<p class=\"note\">No events: the DGFG gate was never recalibrated "
          "(docs/runtime-services.md §5). Events appear as ▼ markers on "
          "every chart's time axis.</p>\n";
  } else {
    os << "<p class=\"note\">Marked ▼ on every chart's time axis.</p><table "
          "id=\"events\"><thead><tr><th>step</th><th>event</th><th>detail"
          "</th><th>line</th></tr></thead><tbody>\n";
    for (const Event &e : run.events)
      os << "<tr data-step=\"" << e.step << "\"><td>" << e.step << "</td><td>"
         << esc(e.name) << "</td><td>" << esc(e.detail) << "</td><td>" << e.line
         << "</td></tr>\n";
    os << "</tbody></table>\n";
  }
  os << "</section>\n";

  renderPlanPanel(os, plan, run, planFile);

  os << "</main>\n<div id=\"tip\" role=\"tooltip\"></div>\n<script>\n"
     << kReportJs << "</script>\n</body></html>\n";
  return out;
}

//===----------------------------------------------------------------------===//
// The command
//===----------------------------------------------------------------------===//

const char *const kUsage =
    "usage: mtpc report RUN.jsonl [--plan PLAN|BINARY] [-o report.html]\n"
    "\n"
    "Renders a training run's metrics (the JSON Lines a training binary\n"
    "writes with --metrics FILE) as one self-contained HTML page: loss per\n"
    "task, the gradient cosine heat map, DGFG weights, device memory against\n"
    "the plan, offload, bytes sent, throughput, events. --plan adds the\n"
    "plan's decisions per layer (a plan file from `mtpc plan --format=fb`,\n"
    "or a binary from `mtpc build`, which embeds its plan). -o - (the\n"
    "default) writes to stdout. See docs/report.md.\n";

const char *const kUsageLine =
    "usage: mtpc report RUN.jsonl [--plan PLAN|BINARY] [-o report.html] "
    "(--help for more)\n";

llvm::raw_ostream &error() {
  return llvm::WithColor::error(llvm::errs(), "mtpc report");
}

} // namespace

int mtp::runReportCommand(llvm::ArrayRef<char *> args) {
  std::string input, planPath, output = "-";
  for (size_t i = 1; i < args.size(); ++i) {
    StringRef a = args[i];
    if (a == "-h" || a == "--help" || a == "-help") {
      llvm::outs() << kUsage;
      return kOk;
    }
    std::string *into = nullptr;
    StringRef flag = a.split('=').first;
    if (flag == "--plan" || flag == "-plan")
      into = &planPath;
    else if (flag == "-o" || flag == "--o")
      into = &output;
    if (into) {
      if (a.contains('=')) {
        *into = a.split('=').second.str();
      } else if (i + 1 < args.size()) {
        *into = args[++i];
      } else {
        error() << a << " needs a value\n" << kUsageLine;
        return kUsageError;
      }
      continue;
    }
    if (a.starts_with("-") && a != "-") {
      error() << "unknown option '" << a << "'\n" << kUsageLine;
      return kUsageError;
    }
    if (!input.empty()) {
      error() << "one metrics file at a time ('" << input << "' and '" << a
              << "')\n"
              << kUsageLine;
      return kUsageError;
    }
    input = a.str();
  }
  if (input.empty()) {
    error() << "no metrics file\n" << kUsageLine;
    return kUsageError;
  }

  auto inputBuffer = llvm::MemoryBuffer::getFileOrSTDIN(input, /*IsText=*/true);
  if (!inputBuffer) {
    error() << "cannot read '" << input
            << "': " << inputBuffer.getError().message() << "\n";
    return kUsageError;
  }
  llvm::Expected<Run> run = readMetrics((*inputBuffer)->getBuffer(), input);
  if (!run) {
    error() << llvm::toString(run.takeError()) << "\n";
    return kBadInput;
  }
  for (const std::string &note : run->notes)
    llvm::WithColor::warning(llvm::errs(), "mtpc report") << note << "\n";

  PlanInput plan;
  if (!planPath.empty()) {
    auto buf = llvm::MemoryBuffer::getFile(planPath, /*IsText=*/false,
                                           /*RequiresNullTerminator=*/false);
    if (!buf) {
      error() << "cannot read the plan '" << planPath
              << "': " << buf.getError().message() << "\n";
      return kUsageError;
    }
    plan.buffer = std::move(*buf);
    plan.bytes = plan.buffer->getBuffer();
    // A training binary carries its plan after a marker (mtpc build).
    if (!mtprt::looksLikePlan(plan.bytes.data(), plan.bytes.size())) {
      StringRef embedded = mtp::findEmbeddedPlan(plan.bytes);
      if (embedded.empty()) {
        error() << planPath
                << ": neither a plan (no 'MTPPLAN' header) nor a binary "
                   "carrying one; pass `mtpc plan SPEC --format=fb -o PLAN`'s "
                   "file or the binary `mtpc build` wrote\n";
        return kBadInput;
      }
      plan.bytes = embedded;
    }
    if (llvm::Error err = mtp::verifyPlanFile(plan.bytes)) {
      error() << planPath << ": " << llvm::toString(std::move(err)) << "\n";
      return kBadInput;
    }
    plan.plan = mtp::getPlan(plan.bytes);
  }

  std::string page = renderPage(*run, plan.plan, planPath);
  std::error_code ec;
  llvm::ToolOutputFile out(output, ec, llvm::sys::fs::OF_None);
  if (ec) {
    error() << "cannot write '" << output << "': " << ec.message() << "\n";
    return kUsageError;
  }
  out.os() << page;
  out.keep();
  if (output != "-")
    llvm::errs() << "mtpc report: wrote " << output << " (" << page.size()
                 << " bytes; " << run->records.size() << " steps, "
                 << run->tasks.size() << " tasks, " << run->events.size()
                 << " events" << (plan.plan ? ", plan" : "") << ")\n";
  return kOk;
}
