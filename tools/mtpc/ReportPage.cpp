//===- ReportPage.cpp - `mtpc report`: the page, section by section -------===//
//
// The page: the head (with report/report.css), the header (the spec, the
// plan, the run, versions, warnings), one panel per chart, the events, the
// plan's panel and report/report.js. Each section is a member of PageWriter.
//
//===----------------------------------------------------------------------===//

#include "ReportPage.h"

#include "ReportCharts.h"
#include "ReportMarkup.h"
#include "ReportPlan.h"

#include "passes/Bytes.h"
#include "passes/PlanFile.h"
#include "mtprt/EvalMetrics.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using llvm::StringRef;

namespace mtp::report {
namespace {

// The stylesheet and the script: report/report.css and report/report.js,
// embedded at build time (report/EmbedAsset.cmake).
#include "ReportCss.inc"
#include "ReportJs.inc"

double median(std::vector<double> v) {
  if (v.empty())
    return std::nan("");
  llvm::sort(v);
  return v[v.size() / 2];
}

/// Writes the page, one section at a time.
class PageWriter {
public:
  PageWriter(llvm::raw_ostream &out, const Run &run, const mtp::fb::Plan *plan,
             StringRef planFile)
      : os(out), run(run), plan(plan), planFile(planFile),
        first(run.records.front()), last(run.records.back()),
        model(plan ? str(plan->model()).str() : "") {}

  void write() {
    head();
    header();
    lossPanel();
    renderHeatmapPanel(os, run);
    alphaPanel();
    memoryPanel();
    offloadPanels();
    bytesPanel();
    throughputPanels();
    evalPanels();
    eventsPanel();
    renderPlanPanel(os, plan, run, planFile);
    tail();
  }

private:
  void head();
  void header();
  void planRows();
  void runRows();
  void versionsRow();
  void warnings();
  void lossPanel();
  void alphaPanel();
  void memoryPanel();
  void offloadPanels();
  void bytesPanel();
  void throughputPanels();
  void evalPanels();
  void eventsPanel();
  void tail();

  /// One line of the header's list; `v` is HTML.
  void row(StringRef k, const std::string &v) {
    os << "<dt>" << esc(k) << "</dt><dd>" << v << "</dd>\n";
  }
  /// One value per step record.
  template <typename Get> std::vector<Opt> column(Get get) const {
    size_t n = run.records.size();
    std::vector<Opt> y(n);
    for (size_t i = 0; i < n; ++i)
      y[i] = get(run.records[i]);
    return y;
  }

  Markup os;
  const Run &run;
  const mtp::fb::Plan *plan; ///< null without --plan
  StringRef planFile;
  const Record &first, &last;
  std::string model; ///< the plan's model name; empty without a plan
};

/// The doctype, the title and the stylesheet.
void PageWriter::head() {
  os << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, "
        "initial-scale=1\">\n"
        "<meta name=\"generator\" content=\"mtpc report\">\n"
        "<link rel=\"icon\" href=\"data:,\">\n<title>mtpc report: "
     << esc(model.empty() ? llvm::sys::path::filename(run.file) : model)
     << "</title>\n<style>\n"
     << kReportCss << "</style></head>\n<body>\n";
}

//===----------------------------------------------------------------------===//
// The header: the spec, the plan, the run, versions
//===----------------------------------------------------------------------===//

void PageWriter::header() {
  os << "<header id=\"panel-header\"><h1>"
     << (model.empty()
             ? "Training run " + esc(llvm::sys::path::filename(run.file))
             : "Model '" + esc(model) + "'")
     << "</h1><dl>\n";
  if (plan)
    planRows();
  runRows();
  versionsRow();
  os << "</dl>\n";
  warnings();
  os << "</header>\n<main>\n";
}

/// The spec, the target, the backbone, the tasks, the plan's totals and the
/// gradient strategy.
void PageWriter::planRows() {
  row("spec", "<code>" + esc(str(plan->source())) + "</code>");
  if (const mtp::fb::Target *t = plan->target())
    row("target",
        esc(llvm::formatv("{0}, {1}, {2} GPU(s), micro-batch {3}, "
                          "global batch {4}; budget {5}, {6} "
                          "usable",
                          str(t->device()), mtp::planName(t->precision()), t->gpus(),
                          t->micro_batch(), t->global_batch(),
                          formatBytes(t->memory_bytes()),
                          formatBytes(t->usable_bytes()))
                .str()));
  if (const mtp::fb::Backbone *bb = plan->backbone())
    row("backbone",
        esc(llvm::formatv("{0}: {1} layers, hidden {2}, {3} heads, ffn {4}, "
                          "vocab {5}, seq {6}, dropout {7}, attention {8}, "
                          "pointwise {9}",
                          mtp::planName(bb->kind()), bb->layers(), bb->hidden(),
                          bb->heads(), bb->ffn(), bb->vocab(), bb->seq(),
                          llvm::format("%g", bb->dropout()),
                          mtp::planName(bb->attention()),
                          mtp::planName(bb->pointwise()))
                .str()));
  if (plan->tasks()) {
    std::vector<std::string> ts;
    for (const mtp::fb::Task *t : *plan->tasks())
      ts.push_back(llvm::formatv("{0} ({1} from {2}layer {3}, weight {4})",
                                 str(t->name()), mtp::planName(t->head()),
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
              formatBytes(plan->predicted_peak_bytes()),
              formatBytes(plan->keep_peak_bytes()),
              formatBytes(plan->uniform_peak_bytes()),
              plan->added_seconds() * 1e6, counts[0], counts[1], counts[2],
              plan->regions() ? plan->regions()->size() : 0)
              .str()));
  if (const mtp::fb::Strategy *st = plan->strategy())
    row("strategy",
        esc(llvm::formatv("gradient scope {0}, GFM keep {1}, clip {2}, DGFG "
                          "{3}, collective {4} (top-k {5}, {6}-bit)",
                          mtp::planName(st->scope()), fmtG(st->gfm_keep()),
                          fmtG(st->clip_max_norm()),
                          st->gate_hidden()
                              ? "hidden " + std::to_string(st->gate_hidden())
                              : std::string("off"),
                          mtp::planName(st->collective()), fmtG(st->topk()), st->bits())
                .str()));
}

/// The run's records and losses, and what it measured.
void PageWriter::runRows() {
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
      llvm::formatv("peak device memory {0} measured", formatBytes(peak));
  Opt predicted = plan ? Opt(plan->predicted_peak_bytes()) : last.predictedPeak;
  if (predicted && *predicted > 0)
    perf += llvm::formatv(" vs {0} predicted ({1}%)", formatBytes(*predicted),
                          llvm::format("%+.1f", (peak / *predicted - 1) * 100))
                .str();
  if (!sps.empty())
    perf +=
        llvm::formatv("; median throughput {0} samples/s", fmtG(median(sps)));
  row("measured", esc(perf));
}

void PageWriter::versionsRow() {
  row("versions",
      esc(llvm::formatv("mtpc report (LLVM/MLIR {0}); metrics as in "
                        "docs/contracts.md{1}",
                        LLVM_VERSION_STRING,
                        plan ? "; plan format v" +
                                   std::to_string(plan->version()) + " (" +
                                   planFile.str() + ")"
                             : std::string())
              .str()));
}

/// The run's warnings, and a plan that does not match the run.
void PageWriter::warnings() {
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
}

//===----------------------------------------------------------------------===//
// The charts
//===----------------------------------------------------------------------===//

/// Loss per task: raw (faint) and smoothed, with the smoothing slider.
void PageWriter::lossPanel() {
  Chart c;
  c.id = "loss";
  c.title = "Loss per task";
  bool ce = plan && plan->tasks();
  if (plan && plan->tasks())
    for (const mtp::fb::Task *t : *plan->tasks())
      ce &= t->loss() == mtp::fb::LossKind::cross_entropy;
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
  renderChartPanel(
      os, c, run,
      "<div class=\"control\"><label>smoothing <input type=\"range\" "
      "id=\"smooth-slider\" min=\"0\" max=\"0.99\" step=\"0.01\" "
      "value=\"0.6\"></label> <span id=\"smooth-label\">0.60</span> "
      "(exponential moving average, debiased; faint: raw)</div>\n");
}

/// α per task.
void PageWriter::alphaPanel() {
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
  renderChartPanel(os, c, run);
}

/// Device memory against the prediction and the budget.
void PageWriter::memoryPanel() {
  double maxBytes = 0;
  for (const Record &r : run.records)
    maxBytes = std::max(
        {maxBytes, r.measuredPeak.value_or(0), r.hostPool.value_or(0)});
  Opt predicted = plan ? Opt(plan->predicted_peak_bytes()) : last.predictedPeak;
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
  bool anyHost = llvm::any_of(
      run.records, [](const Record &r) { return r.hostPool.value_or(0) > 0; });
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
                      "predicted peak " + formatBytes(*predicted) +
                          (plan ? " (plan)" : " (run)"),
                      kPalette[1], "predicted_peak_bytes"});
  if (plan && plan->target()) {
    double budget = plan->target()->memory_bytes(),
           usable = plan->target()->usable_bytes();
    // A budget far above the run would flatten every line: say it instead.
    if (budget <= 4 * maxBytes) {
      c.zeroBased = true;
      c.refs.push_back({budget / u.scale, "budget " + formatBytes(budget),
                        kPalette[3], "budget"});
      if (usable != budget && usable > 0)
        c.refs.push_back(
            {usable / u.scale,
             "usable " + formatBytes(usable) + " (budget − headroom)",
             kPalette[4], "usable"});
    } else {
      c.note = llvm::formatv("The budget, {0} ({1} usable), is off the "
                             "scale: the run peaks at {2:f1}% of it.",
                             formatBytes(budget), formatBytes(usable),
                             maxBytes / budget * 100)
                   .str();
    }
  }
  renderChartPanel(os, c, run);
}

/// The offload hit rate and the exposed wait.
void PageWriter::offloadPanels() {
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
  renderChartPanel(os, c, run);

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
  renderChartPanel(os, w, run);
}

/// Gradient bytes sent, compressed and not.
void PageWriter::bytesPanel() {
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
                           formatBytes(sent), formatBytes(full),
                           sent > 0 ? full / sent : 0.0)
                 .str();
  renderChartPanel(os, c, run);
}

/// Throughput and step time.
void PageWriter::throughputPanels() {
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
  renderChartPanel(os, c, run);

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
  renderChartPanel(os, t, run);
}

//===----------------------------------------------------------------------===//
// The events and the end
//===----------------------------------------------------------------------===//

/// A panel per task evaluated on held-out data: its metrics at every
/// evaluation, the best of each marked.
void PageWriter::evalPanels() {
  if (run.evals.empty())
    return;
  std::vector<std::string> tasks;
  for (const EvalRecord &e : run.evals)
    for (const EvalRecord::Task &t : e.tasks)
      if (!llvm::is_contained(tasks, t.name))
        tasks.push_back(t.name);
  for (const std::string &task : tasks) {
    std::vector<std::string> metrics;
    for (const EvalRecord &e : run.evals)
      for (const EvalRecord::Task &t : e.tasks)
        if (t.name == task)
          for (const auto &m : t.metrics)
            if (!llvm::is_contained(metrics, m.first))
              metrics.push_back(m.first);
    auto value = [&](const EvalRecord &e, const std::string &metric) -> Opt {
      for (const EvalRecord::Task &t : e.tasks)
        if (t.name == task)
          for (const auto &m : t.metrics)
            if (m.first == metric)
              return m.second;
      return std::nullopt;
    };
    // The best of each column (lowest loss and mse, highest of the rest).
    std::vector<Opt> best(metrics.size());
    for (size_t k = 0; k < metrics.size(); ++k) {
      const bool lower = mtprt::metrics::lowerIsBetter(metrics[k]);
      for (const EvalRecord &e : run.evals)
        if (Opt v = value(e, metrics[k]))
          if (!best[k] || (lower ? *v < *best[k] : *v > *best[k]))
            best[k] = v;
    }
    os << "<section class=\"panel eval\" id=\"panel-eval-" << esc(task)
       << "\" data-task=\"" << esc(task) << "\"><h2>" << esc(task)
       << " on held-out data</h2>\n<p class=\"note\">"
       << run.evals.back().records
       << " records, evaluated without dropout or autograd (docs/data.md); "
          "the best of each metric in bold.</p><table class=\"eval\"><thead>"
          "<tr><th>step</th>";
    for (const std::string &m : metrics)
      os << "<th>" << esc(m) << "</th>";
    os << "</tr></thead><tbody>\n";
    for (const EvalRecord &e : run.evals) {
      os << "<tr data-step=\"" << e.step << "\"><td>" << e.step << "</td>";
      for (size_t k = 0; k < metrics.size(); ++k) {
        const Opt v = value(e, metrics[k]);
        const bool top = v && best[k] && *v == *best[k];
        os << "<td data-metric=\"" << esc(metrics[k]) << "\" data-value=\""
           << (v ? llvm::formatv("{0}", llvm::format("%.17g", *v)).str()
                 : std::string("null"))
           << "\">" << (top ? "<b>" : "")
           << (v ? llvm::formatv("{0}", llvm::format("%.4f", *v)).str()
                 : std::string("—"))
           << (top ? "</b>" : "") << "</td>";
      }
      os << "</tr>\n";
    }
    os << "</tbody></table></section>\n";
  }
}

void PageWriter::eventsPanel() {
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
}

/// The tooltip and the script.
void PageWriter::tail() {
  os << "</main>\n<div id=\"tip\" role=\"tooltip\"></div>\n<script>\n"
     << kReportJs << "</script>\n</body></html>\n";
}

} // namespace

std::string renderPage(const Run &run, const mtp::fb::Plan *plan,
                       StringRef planFile) {
  std::string out;
  llvm::raw_string_ostream stream(out);
  PageWriter(stream, run, plan, planFile).write();
  return out;
}

} // namespace mtp::report
