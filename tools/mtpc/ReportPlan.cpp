//===- ReportPlan.cpp - `mtpc report`: the plan's panel -------------------===//

#include "ReportPlan.h"

#include "passes/Bytes.h"
#include "passes/PlanFile.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

using llvm::StringRef;

namespace mtp::report {
namespace {

// Decisions: blue keep, orange recompute, reddish purple offload (and a
// letter in each cell, so colour is never the only cue).
const char *const kKeep = "#0072B2", *const kRecompute = "#E69F00",
                  *const kOffload = "#CC79A7";

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
                       formatBytes(u->saved_bytes()), u->fwd_flops() / 1e9)
      .str();
}

const char *decisionLetter(mtp::fb::Decision d) {
  return d == mtp::fb::Decision::Recompute ? "R"
         : d == mtp::fb::Decision::Offload ? "O"
                                           : "K";
}

/// The plan's strip: columns are the backbone's units in forward order (a
/// block is the attention or MLP of a layer, several units each), with the
/// saved bytes as bars above the decisions; heads and losses per task row.
class PlanStrip {
public:
  PlanStrip(const mtp::fb::Plan &plan, const Run &run);
  void render(Markup &os);

private:
  /// The task's index in the run (its charts' colour); past the run's tasks
  /// where the run has no such task.
  unsigned runIndex(const mtp::fb::Task *t) const;
  /// The first column of `block` or a later one.
  unsigned firstCol(int64_t block) const;
  /// One past the last column of `block` or an earlier one.
  unsigned endCol(int64_t block) const;

  void regions(Markup &os);
  void unitColumns(Markup &os);
  void boundaries(Markup &os);
  void taskRow(Markup &os, unsigned k);

  const mtp::fb::Plan &plan;
  const Run &run;
  std::vector<const mtp::fb::Unit *> cols;
  std::map<std::string, std::vector<const mtp::fb::Unit *>> taskUnits;
  std::vector<const mtp::fb::Task *> tasks; ///< in the run's order
  double maxSaved = 1;

  // The layout.
  static constexpr double left = 84, top = 30, barH = 34, stripH = 26,
                          rowH = 26;
  unsigned nc;   ///< columns (at least one)
  double cw;     ///< a column's width
  double stripY; ///< the decisions' strip, under the bars
  double headX;  ///< the tasks' head and loss units
  double taskY;  ///< the first task row
  double w, h;
};

PlanStrip::PlanStrip(const mtp::fb::Plan &plan, const Run &run)
    : plan(plan), run(run) {
  if (plan.units())
    for (const mtp::fb::Unit *u : *plan.units()) {
      if (u->block() >= 0) {
        cols.push_back(u);
        maxSaved = std::max(maxSaved, double(u->saved_bytes()));
      } else if (u->task()) {
        taskUnits[str(u->task()).str()].push_back(u);
      }
    }
  if (plan.tasks())
    for (const mtp::fb::Task *t : *plan.tasks())
      tasks.push_back(t);
  // Tasks in the run's order (the charts' colours), plan-only ones after.
  llvm::stable_sort(
      tasks, [&](auto *a, auto *b) { return runIndex(a) < runIndex(b); });

  nc = std::max<size_t>(cols.size(), 1);
  cw = std::clamp(900.0 / nc, 3.0, 40.0);
  stripY = top + barH + 2;
  headX = left + nc * cw + 24;
  w = headX + 2 * 56 + 12;
  taskY = stripY + stripH + 26;
  h = taskY + tasks.size() * rowH + 8;
}

unsigned PlanStrip::runIndex(const mtp::fb::Task *t) const {
  for (unsigned i = 0; i < run.tasks.size(); ++i)
    if (run.tasks[i] == str(t->name()))
      return i;
  return unsigned(run.tasks.size());
}

unsigned PlanStrip::firstCol(int64_t block) const {
  for (unsigned i = 0; i < cols.size(); ++i)
    if (cols[i]->block() >= block)
      return i;
  return unsigned(cols.size());
}

unsigned PlanStrip::endCol(int64_t block) const {
  unsigned e = 0;
  for (unsigned i = 0; i < cols.size(); ++i)
    if (cols[i]->block() <= block)
      e = i + 1;
  return e;
}

void PlanStrip::render(Markup &os) {
  os << "<svg class=\"plan\" id=\"chart-plan\" data-panel=\"plan\" "
        "data-units=\""
     << cols.size() << "\" data-tasks=\"" << tasks.size() << "\" viewBox=\"0 0 "
     << w << " " << h << "\" width=\"" << w << "\" height=\"" << h
     << "\" role=\"img\" aria-label=\"plan: decisions per unit\">\n";
  regions(os);
  unitColumns(os);
  boundaries(os);
  // One row per task: the backbone it back-propagates through, its tap, its
  // head and loss units.
  for (unsigned k = 0; k < tasks.size(); ++k)
    taskRow(os, k);
  os << "</svg>\n";
}

/// Checkpoint regions as brackets above the bars.
void PlanStrip::regions(Markup &os) {
  if (!plan.regions())
    return;
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
}

/// A column per backbone unit: its saved bytes as a bar, its decision as a
/// colour (and a letter where the column is wide enough).
void PlanStrip::unitColumns(Markup &os) {
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
         << decisionLetter(u->decision()) << "</text>";
    os << "</g>\n";
  }
}

/// Block and layer boundaries, and the layer numbers under the strip.
void PlanStrip::boundaries(Markup &os) {
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
}

/// Task `k`'s row: the backbone it back-propagates through, its tap, its
/// head and loss units.
void PlanStrip::taskRow(Markup &os, unsigned k) {
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
     << t->tap_layer() << " (" << esc(mtp::planName(t->head())) << " head, weight "
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
       << esc(mtp::planName(u->kind()).take_front(5)) << " "
       << decisionLetter(u->decision()) << "</text><title>" << esc(unitTitle(u))
       << "</title></g>";
    ++i;
  }
  os << "</g>\n";
}

} // namespace

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
  PlanStrip(*plan, run).render(os);
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
         << formatBytes(u->saved_bytes()) << "</td><td>"
         << llvm::formatv("{0:f4}", u->fwd_flops() / 1e9) << "</td><td>"
         << decisionName(u->decision()) << "</td></tr>\n";
  os << "</tbody></table></details>\n";
  if (plan->offloads() && plan->offloads()->size()) {
    os << "<p class=\"note\">Offloaded: ";
    bool first = true;
    for (const mtp::fb::Offload *o : *plan->offloads()) {
      os << (first ? "" : "; ") << esc(str(o->unit())) << " "
         << formatBytes(o->bytes()) << " each way, predicted exposed wait "
         << llvm::formatv("{0:f1}", o->exposed_wait_s() * 1e6) << " µs";
      first = false;
    }
    os << ".</p>\n";
  }
  os << "</section>\n";
}

} // namespace mtp::report
