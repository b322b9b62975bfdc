//===- Search.cpp - `mtpc search`: the best shape that fits ---------------===//
//
// Candidates are specs: the input's text with every search range replaced by
// one of its values (padded to the range's width, so each candidate's
// diagnostics point at the user's file). Each is parsed, checked and planned
// by the same pipeline as `mtpc plan`, on --jobs workers with an MLIR
// context each; a candidate fits where the plan succeeds within the budget.
// docs/search.md.
//
//===----------------------------------------------------------------------===//

#include "Search.h"

#include "dialect/MTPDialect.h"
#include "dialect/MTPOps.h"
#include "frontend/AST.h"
#include "frontend/MLIRGen.h"
#include "frontend/Parser.h"
#include "frontend/Sema.h"
#include "passes/CostModel.h"
#include "passes/MemoryAnalysis.h"
#include "passes/PlanFile.h"
#include "passes/Pipelines.h"

#include "mtprt/EvalMetrics.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cmath>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <mutex>

using namespace mlir;
using llvm::StringRef;

namespace {

/// The most values one search range may take (the space is their product;
/// past this a range is a typo or wants a step).
constexpr uint64_t kMaxRangeValues = 100000;

enum ExitCode { kOk = 0, kSpecError = 1, kUsageError = 2 };

using Clock = std::chrono::steady_clock;

/// One search range or choice of the spec: its place in the text and its
/// values as they are written in (`12`, `uniform(every = 2)`).
struct Site {
  std::string where, spelling;
  std::string label; ///< the table's column: `layers`, `a: layer`
  size_t begin = 0, end = 0; ///< byte offsets in the spec's text
  std::vector<std::string> values;
  /// A range's first value and step (step 0: a choice).
  int64_t lo = 0, step = 0;
  /// Sampled on a log scale: a range over two orders of magnitude (in a
  /// uniform sample of micro_batch = 1..100000000 nearly every value is
  /// past what fits, and the small ones that fit are never drawn).
  bool logScale() const {
    return step > 0 && lo > 0 && values.size() >= 64 &&
           double(lo) + double(step) * double(values.size() - 1) >=
               100.0 * double(lo);
  }
  size_t draw(std::mt19937_64 &rng) const {
    if (!logScale())
      return std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng);
    const double hi = double(lo) + double(step) * double(values.size() - 1);
    const double v = std::exp(std::uniform_real_distribution<double>(
        std::log(double(lo)), std::log(hi))(rng));
    const double k = std::round((v - double(lo)) / double(step));
    return size_t(std::clamp(k, 0.0, double(values.size() - 1)));
  }
};

struct Candidate {
  std::vector<size_t> index; ///< per site, into its values
  bool fits = false;
  std::string reason; ///< why not: the first error
  int64_t peak = 0, usable = 0, params = 0, regions = 0, offloads = 0,
          partial = 0; ///< units re-run at tensor grain
  double stepSeconds = 0, samplesPerSecond = 0;
  std::string planBytes;
  double evalLoss = std::numeric_limits<double>::quiet_NaN();
  int64_t trainedSteps = 0;
  bool planned = false; ///< false: the time limit came first
  bool planFailed = false; ///< it checked, but no plan was found
  bool specEval = false; ///< the spec names held-out data (train { eval })
  std::string metrics;   ///< the last proxy run's held-out metrics
  int64_t measuredPeak = 0, predictedPeak = 0; ///< in that run
};

std::string humanBytes(int64_t b) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 4)
    v /= 1024, ++u;
  return u == 0 ? llvm::formatv("{0} B", b).str()
                : llvm::formatv("{0:f2} {1}", v, units[u]).str();
}

std::string humanCount(int64_t n) {
  if (n >= 1000000000)
    return llvm::formatv("{0:f2} G", n / 1e9).str();
  if (n >= 1000000)
    return llvm::formatv("{0:f2} M", n / 1e6).str();
  if (n >= 10000)
    return llvm::formatv("{0:f1} k", n / 1e3).str();
  return std::to_string(n);
}

class Search {
public:
  Search(StringRef filename, StringRef text, const mtp::SearchOptions &o)
      : filename(filename.str()), text(text.str()), o(o) {
    DialectRegistry registry;
    registry.insert<mtp::MTPDialect>();
    unsigned jobs = o.jobs > 0 ? unsigned(o.jobs)
                               : std::max(1u, std::thread::hardware_concurrency());
    for (unsigned w = 0; w < jobs; ++w) {
      // The workers are the parallelism: no pool inside each context.
      contexts.push_back(
          std::make_unique<MLIRContext>(registry, MLIRContext::Threading::DISABLED));
      contexts.back()->loadAllAvailableDialects();
      contexts.back()->printOpOnDiagnostic(false);
    }
  }

  int run(llvm::raw_ostream &os);

private:
  std::string candidateText(const std::vector<size_t> &index, bool pad) const;
  std::string assignment(const Candidate &c) const;
  /// Plans one candidate in `context` (a worker's own) with the planner's
  /// branch and bound stopped after `maxNodes` (-1: the planner's own).
  void evaluate(Candidate &c, MLIRContext &context, int64_t maxNodes);
  void train(std::vector<Candidate *> &pool);
  double trainOne(Candidate &c, int64_t steps);
  /// Whether candidate a is at least as good as b on every axis and better
  /// on one (parameters, peak, throughput, and held-out loss where both
  /// were trained).
  static bool dominates(const Candidate &a, const Candidate &b);
  /// The order without training: throughput, or parameters then throughput.
  bool ranksAbove(const Candidate &a, const Candidate &b) const {
    if (o.capacity && a.params != b.params)
      return a.params > b.params;
    return a.samplesPerSecond > b.samplesPerSecond;
  }

  std::string filename, text;
  const mtp::SearchOptions &o;
  /// One per worker: candidates are planned side by side.
  std::vector<std::unique_ptr<MLIRContext>> contexts;
  std::vector<Site> sites;
};

std::string Search::candidateText(const std::vector<size_t> &index,
                                  bool pad) const {
  std::string out;
  size_t at = 0;
  for (size_t i = 0; i < sites.size(); ++i) {
    const Site &s = sites[i];
    out += text.substr(at, s.begin - at);
    std::string v = s.values[index[i]];
    if (pad) {
      // The span's shape kept (its line breaks, then spaces) so the lines
      // and columns after it are the user's.
      std::string shape = text.substr(s.begin, s.end - s.begin);
      const size_t firstBreak = std::min(shape.find('\n'), shape.size());
      for (char &ch : shape)
        if (ch != '\n')
          ch = ' ';
      if (v.size() <= firstBreak)
        v += shape.substr(v.size());
      else
        v += shape.substr(firstBreak);
    }
    out += v;
    at = s.end;
  }
  out += text.substr(at);
  return out;
}

std::string Search::assignment(const Candidate &c) const {
  std::string out;
  for (size_t i = 0; i < sites.size(); ++i)
    out += (i ? ", " : "") + sites[i].where + " = " +
           sites[i].values[c.index[i]];
  return out;
}

void Search::evaluate(Candidate &c, MLIRContext &context, int64_t maxNodes) {
  {
    Candidate fresh;
    fresh.index = std::move(c.index);
    fresh.planned = c.planned;
    c = std::move(fresh);
  }
  const std::string spec = candidateText(c.index, /*pad=*/true);
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(
      llvm::MemoryBuffer::getMemBufferCopy(spec, filename), llvm::SMLoc());
  std::string first;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &d) {
    if (d.getSeverity() == DiagnosticSeverity::Error && first.empty()) {
      std::string where;
      if (auto loc = dyn_cast<FileLineColLoc>(d.getLocation()))
        where = llvm::formatv("{0}:{1}: ", loc.getLine(), loc.getColumn());
      first = where + d.str();
    }
    return success();
  });
  auto fail = [&] {
    c.fits = false;
    c.reason = first.empty() ? "the plan failed" : first;
  };
  std::optional<mtp::ast::Model> ast = mtp::parseSpec(sourceMgr, &context);
  if (!ast)
    return fail();
  std::optional<mtp::CheckedSpec> checked =
      mtp::checkSpec(*ast, filename, &context);
  if (!checked)
    return fail();
  OwningOpRef<ModuleOp> module = mtp::mlirGen(*checked, filename, &context);
  if (!module)
    return fail();
  auto models = module->getOps<mtp::ModelOp>();
  if (models.empty() || !(*models.begin()).getBudget()) {
    first = "a search needs a budget { ... } to fit";
    return fail();
  }
  std::optional<mtp::MemoryReport> report;
  PassManager pm(&context);
  mtp::PlanPipelineOptions options;
  options.planMemory = true;
  options.materialize = false;
  options.exactFloor = false; // a hopeless candidate stops at once
  options.maxNodes = maxNodes;
  mtp::buildPlanPipeline(pm, options,
                         [&](mtp::ModelOp, const mtp::MemoryReport &r) {
                           report = r;
                         });
  if (failed(pm.run(*module)) || !report) {
    c.planFailed = true; // (a quick plan's node budget may be why)
    return fail();
  }
  mtp::ModelOp model = *module->getOps<mtp::ModelOp>().begin();
  mtp::StepPlanAttr plan = model.getStep().getPlanAttr();
  c.fits = true;
  // The planned peak (the report analyses the step before the plan).
  c.peak = plan ? plan.getPlannedPeakBytes() : report->peakBytes;
  const mtp::CostModel cost(model);
  c.usable = cost.usableBytes();
  c.params = cost.parameters().total();
  if (plan) {
    c.stepSeconds = plan.getKeepStepSeconds().convertToDouble() +
                    plan.getAddedSeconds().convertToDouble();
    c.regions = plan.getRegions().size();
    c.offloads = plan.getOffloads().size();
    // Tensor grain: a block's projection chain re-run at its backward.
    for (mtp::FwdOp fwd : model.getStep().getBody().front().getOps<mtp::FwdOp>())
      if (fwd.getDecision() == mtp::Decision::Recompute && !fwd.getRegion())
        ++c.partial;
  }
  const double batch = double(model.getBudget().getGlobalBatch());
  c.samplesPerSecond = c.stepSeconds > 0 ? batch / c.stepSeconds : 0;
  if (o.trainSteps > 0) {
    c.planBytes = mtp::serializePlan(model, *report, filename);
    if (mtp::TrainOp tr = model.getTrain())
      c.specEval = tr.getEvalPath().has_value();
  }
}

bool Search::dominates(const Candidate &a, const Candidate &b) {
  // Losses compare only after runs of the same length.
  const bool trained = !std::isnan(a.evalLoss) && !std::isnan(b.evalLoss) &&
                       a.trainedSteps == b.trainedSteps;
  // Throughput, not step time: a candidate's batch may differ.
  const bool noWorse = a.params >= b.params && a.peak <= b.peak &&
                       a.samplesPerSecond >= b.samplesPerSecond &&
                       (!trained || a.evalLoss <= b.evalLoss);
  const bool better = a.params > b.params || a.peak < b.peak ||
                      a.samplesPerSecond > b.samplesPerSecond ||
                      (trained && a.evalLoss < b.evalLoss);
  return noWorse && better;
}

double Search::trainOne(Candidate &c, int64_t steps) {
  llvm::SmallString<128> dir;
  if (llvm::sys::fs::createUniqueDirectory("mtpc-search", dir))
    return std::numeric_limits<double>::quiet_NaN();
  const std::string plan = (dir + "/candidate.mtpplan").str(),
                    metrics = (dir + "/metrics.jsonl").str(),
                    log = (dir + "/run.log").str();
  {
    std::ofstream f(plan, std::ios::binary);
    f << c.planBytes;
  }
  const std::string runner = o.runtimeDir + "/tools/mtprt-run";
  const std::string stepsText = std::to_string(steps);
  // Held-out data: --eval-data, else the spec's train { eval } (the plan
  // carries it), else synthetic records the training never saw.
  const std::string eval = !o.evalData.empty() ? o.evalData
                           : c.specEval      ? ""
                                             : "synthetic:256";
  std::vector<StringRef> args = {runner,      "--plan",    plan,
                                 "--steps",   stepsText,   "--threads",
                                 "1",         "--progress", "off",
                                 "--metrics", metrics,     "--log-every",
                                 stepsText};
  if (!eval.empty()) {
    args.push_back("--eval-data");
    args.push_back(eval);
  }
  std::optional<StringRef> redirects[] = {std::nullopt, StringRef(log),
                                          StringRef(log)};
  std::string message;
  const int rc = llvm::sys::ExecuteAndWait(runner, args, std::nullopt,
                                           redirects, 0, 0, &message);
  double loss = std::numeric_limits<double>::quiet_NaN();
  if (rc == 0) {
    std::ifstream in(metrics);
    std::string line, last;
    c.measuredPeak = c.predictedPeak = 0;
    while (std::getline(in, line)) {
      if (line.find("\"eval\"") != std::string::npos) {
        last = line;
        continue;
      }
      // A step's record: the tracked peak against the plan's.
      if (line.find("\"measured_peak_bytes\"") == std::string::npos)
        continue;
      llvm::Expected<llvm::json::Value> v = llvm::json::parse(line);
      if (!v) {
        llvm::consumeError(v.takeError());
        continue;
      }
      if (const llvm::json::Object *r = v->getAsObject()) {
        c.measuredPeak = std::max(
            c.measuredPeak, r->getInteger("measured_peak_bytes").value_or(0));
        c.predictedPeak = r->getInteger("predicted_peak_bytes").value_or(0);
      }
    }
    if (llvm::Expected<llvm::json::Value> v = llvm::json::parse(last)) {
      double sum = 0;
      int n = 0;
      const llvm::json::Object *root = v->getAsObject();
      c.metrics.clear();
      if (auto *evals = root ? root->getObject("eval") : nullptr) {
        // Tasks by name, each metric (but the loss) in the runtime's order.
        std::map<std::string, const llvm::json::Object *> tasks;
        for (auto &[task, m] : *evals)
          if (auto *mo = m.getAsObject())
            tasks[task.str()] = mo;
        for (auto &[task, mo] : tasks) {
          if (std::optional<double> l = mo->getNumber("loss"))
            sum += *l, ++n;
          std::string text;
          for (StringRef key : mtprt::metrics::kNames)
            if (std::optional<double> x = mo->getNumber(key);
                x && key != "loss")
              text += llvm::formatv(" {0} {1:f3}", key, *x).str();
          if (!text.empty())
            c.metrics += (c.metrics.empty() ? "" : "; ") + task + text;
        }
      }
      if (n)
        loss = sum / n;
    } else {
      llvm::consumeError(v.takeError());
    }
  }
  if (std::isnan(loss)) {
    // Why, from the run's own words: its first error line, else its last.
    std::ifstream in(log);
    std::string line, first, last;
    while (std::getline(in, line)) {
      if (!line.empty())
        last = line;
      if (first.empty() && line.find("error") != std::string::npos)
        first = line;
    }
    c.reason = rc == 0 ? "no held-out loss in its metrics"
                       : (first.empty() ? last : first);
    llvm::errs() << "mtpc search: the proxy run of " << assignment(c)
                 << " failed"
                 << (rc == 0 ? std::string() : " (exit " + std::to_string(rc) + ")")
                 << ": " << c.reason << " (its log: " << log << ")\n";
  } else {
    llvm::sys::fs::remove_directories(dir);
  }
  return loss;
}

void Search::train(std::vector<Candidate *> &pool) {
  // Successive halving: every candidate trains a short run, the better half
  // a run twice as long, ... the last round o.trainSteps. Each run starts
  // from the candidate's initialization (the spec's seed).
  // Rounds until two are left for the last (ceil(log2 K), at least 1).
  int rounds = 1;
  while ((int64_t(2) << (rounds - 1)) < int64_t(pool.size()))
    ++rounds;
  std::vector<Candidate *> alive = pool;
  for (int r = 0; r < rounds && !alive.empty(); ++r) {
    const int64_t steps =
        std::max<int64_t>(1, o.trainSteps >> (rounds - 1 - r));
    llvm::errs() << llvm::formatv(
        "mtpc search: proxy training round {0}/{1}: {2} candidate(s), {3} "
        "steps each\n",
        r + 1, rounds, alive.size(), steps);
    for (Candidate *c : alive) {
      c->evalLoss = trainOne(*c, steps);
      c->trainedSteps = steps;
    }
    std::stable_sort(alive.begin(), alive.end(),
                     [](const Candidate *a, const Candidate *b) {
                       const double x = std::isnan(a->evalLoss)
                                            ? INFINITY
                                            : a->evalLoss,
                                    y = std::isnan(b->evalLoss)
                                            ? INFINITY
                                            : b->evalLoss;
                       return x < y;
                     });
    if (r + 1 < rounds)
      alive.resize(std::max<size_t>(1, (alive.size() + 1) / 2));
  }
}

int Search::run(llvm::raw_ostream &os) {
  // The ranges, from one parse of the spec (its own syntax errors stop here).
  {
    llvm::SourceMgr sourceMgr;
    sourceMgr.AddNewSourceBuffer(
        llvm::MemoryBuffer::getMemBufferCopy(text, filename), llvm::SMLoc());
    SourceMgrDiagnosticHandler handler(sourceMgr, contexts[0].get());
    std::optional<mtp::ast::Model> ast =
        mtp::parseSpec(sourceMgr, contexts[0].get());
    if (!ast)
      return kSpecError;
    std::vector<size_t> lineStart = {0};
    for (size_t i = 0; i < text.size(); ++i)
      if (text[i] == '\n')
        lineStart.push_back(i + 1);
    for (const mtp::ast::RangeSite &r : mtp::ast::searchRanges(*ast)) {
      const mtp::ast::Value &v = *r.value;
      Site s;
      s.where = r.where;
      // The column: the key after the last dot; a tap: the task's name.
      StringRef w = r.where;
      if (w.starts_with("task ")) {
        auto [task, key] = w.drop_front(5).split(": ");
        s.label = (task + ": " +
                   (key == "from layer" ? StringRef("layer")
                                        : key.rsplit('.').second.empty()
                                              ? key
                                              : key.rsplit('.').second))
                      .str();
      } else
        s.label = w.rsplit('.').second.empty() ? w.str()
                                               : w.rsplit('.').second.str();
      s.begin = lineStart[v.loc.line - 1] + v.loc.col - 1;
      s.end = lineStart[v.end.line - 1] + v.end.col - 1;
      if (v.kind == mtp::ast::Value::Kind::Call) { // one_of(...)
        // As written, on one line.
        for (char ch : text.substr(s.begin, s.end - s.begin))
          if (!std::isspace(static_cast<unsigned char>(ch)))
            s.spelling += ch;
          else if (!s.spelling.empty() && s.spelling.back() != ' ')
            s.spelling += ' ';
        for (const mtp::ast::Arg &a : v.args)
          s.values.push_back(a.value.source);
      } else {
        s.spelling = v.spelling;
        // Counted before made (a range of 2·10⁹ values would take the
        // memory), stepping without overflow at the int64 ends.
        const uint64_t count =
            v.rangeHi < v.integer
                ? 0
                : (uint64_t(v.rangeHi) - uint64_t(v.integer)) /
                          uint64_t(v.rangeStep) +
                      1;
        if (count > kMaxRangeValues) {
          llvm::WithColor::error(llvm::errs(),
                                 (filename + ":" + Twine(v.loc.line) + ":" +
                                  Twine(v.loc.col))
                                     .str())
              << "'" << r.where << " = " << v.spelling << "' has " << count
              << " values; a search range takes at most " << kMaxRangeValues
              << " (narrow it, or step it with `by`)\n";
          return kSpecError;
        }
        s.lo = v.integer;
        s.step = v.rangeStep;
        for (uint64_t k = 0; k < count; ++k)
          s.values.push_back(
              std::to_string(int64_t(uint64_t(v.integer) + k * uint64_t(v.rangeStep))));
      }
      sites.push_back(std::move(s));
    }
  }
  if (sites.empty()) {
    llvm::WithColor::error(llvm::errs(), filename)
        << "no search range to search; write one where a value may vary, "
           "e.g. layers = 4..12, micro_batch = 4..32 by 4, from layer 2..6 "
           "(docs/search.md)\n";
    return kSpecError;
  }

  // The space, and the candidates: all of it where it is small enough,
  // else a seeded sample followed by a local search around the best.
  double spaceSize = 1;
  for (const Site &s : sites)
    spaceSize *= double(s.values.size());
  const bool exhaustive = spaceSize <= double(o.maxCandidates);
  std::mt19937_64 rng(o.seed);
  std::deque<Candidate> all;
  std::set<std::vector<size_t>> seen;
  auto decode = [&](uint64_t n) {
    std::vector<size_t> index(sites.size());
    for (size_t i = sites.size(); i-- > 0;) {
      index[i] = n % sites[i].values.size();
      n /= sites[i].values.size();
    }
    return index;
  };
  const auto start = Clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  std::atomic<bool> timedOut = false;
  std::atomic<int64_t> planned = 0;
  std::mutex progress;
  // Candidates planned on every worker (each with its own context); the
  // batches and their order are the seed's, so the result does not depend
  // on how many workers there are.
  auto planAll = [&](const std::vector<Candidate *> &batch, int64_t nodes) {
    std::atomic<size_t> next = 0;
    auto work = [&](MLIRContext &ctx) {
      for (size_t i; (i = next++) < batch.size();) {
        if (elapsed() > o.timeLimit) {
          timedOut = true;
          return;
        }
        evaluate(*batch[i], ctx, nodes);
        batch[i]->planned = true;
        if (const int64_t n = ++planned; n % 100 == 0) {
          std::lock_guard<std::mutex> lock(progress);
          llvm::errs() << llvm::formatv("mtpc search: {0} plans in {1:f1} s\n",
                                        n, elapsed());
        }
      }
    };
    std::vector<std::thread> threads;
    for (size_t w = 1; w < contexts.size() && w < batch.size(); ++w)
      threads.emplace_back(work, std::ref(*contexts[w]));
    work(*contexts[0]);
    for (std::thread &t : threads)
      t.join();
  };
  // New candidates, each planned quickly (o.planNodes).
  auto tryBatch = [&](std::vector<std::vector<size_t>> indices) {
    std::vector<Candidate *> batch;
    for (std::vector<size_t> &index : indices) {
      if (!seen.insert(index).second ||
          int64_t(all.size()) >= o.maxCandidates)
        continue;
      all.push_back({});
      all.back().index = std::move(index);
      batch.push_back(&all.back());
    }
    planAll(batch, o.planNodes);
    return batch;
  };
  if (exhaustive) {
    std::vector<std::vector<size_t>> every;
    for (uint64_t n = 0; n < uint64_t(spaceSize); ++n)
      every.push_back(decode(n));
    tryBatch(std::move(every));
  } else {
    const int64_t sampled = o.maxCandidates / 2;
    std::vector<std::vector<size_t>> sample;
    std::set<std::vector<size_t>> drawn;
    for (int64_t k = 0; k < sampled * 4 && int64_t(sample.size()) < sampled;
         ++k) {
      std::vector<size_t> index(sites.size());
      for (size_t i = 0; i < sites.size(); ++i)
        index[i] = sites[i].draw(rng);
      if (drawn.insert(index).second)
        sample.push_back(std::move(index));
    }
    tryBatch(std::move(sample));
    // Hill-climbing from the best fitting candidate: its neighbours (one
    // range a step up or down) planned together, until none is better.
    while (!timedOut && int64_t(all.size()) < o.maxCandidates) {
      const Candidate *best = nullptr;
      for (const Candidate &c : all)
        if (c.planned && c.fits && (!best || ranksAbove(c, *best)))
          best = &c;
      if (!best)
        break;
      const Candidate bar = *best;
      std::vector<std::vector<size_t>> neighbours;
      for (size_t i = 0; i < sites.size(); ++i)
        for (int d : {-1, 1}) {
          if ((d < 0 && bar.index[i] == 0) ||
              (d > 0 && bar.index[i] + 1 >= sites[i].values.size()))
            continue;
          std::vector<size_t> next = bar.index;
          next[i] += d;
          neighbours.push_back(std::move(next));
        }
      bool improved = false;
      for (Candidate *c : tryBatch(std::move(neighbours)))
        improved |= c->planned && c->fits && ranksAbove(*c, bar);
      if (!improved)
        break;
    }
  }
  // The quick plans' node budget can miss a plan that fits, or a cheaper
  // one: those that did not fit for want of a plan, and the best that did,
  // planned again as `mtpc plan` would.
  int64_t replanned = 0;
  if (!timedOut && o.planNodes >= 0) {
    std::vector<Candidate *> again, best;
    for (Candidate &c : all)
      if (c.planned && c.planFailed)
        again.push_back(&c);
      else if (c.planned && c.fits)
        best.push_back(&c);
    std::stable_sort(best.begin(), best.end(),
                     [&](const Candidate *a, const Candidate *b) {
                       return ranksAbove(*a, *b);
                     });
    best.resize(std::min<size_t>(
        best.size(), size_t(o.top + (o.trainSteps > 0 ? o.trainCandidates : 0))));
    again.insert(again.end(), best.begin(), best.end());
    replanned = again.size();
    planAll(again, /*nodes=*/-1);
  }
  // What the time limit left unplanned is not a candidate.
  all.erase(std::remove_if(all.begin(), all.end(),
                           [](const Candidate &c) { return !c.planned; }),
            all.end());
  const double searchSeconds = elapsed();

  std::vector<Candidate *> fitting;
  std::map<std::string, int64_t> reasons;
  for (Candidate &c : all) {
    if (c.fits) {
      fitting.push_back(&c);
    } else {
      std::string r = c.reason.substr(0, c.reason.find('\n'));
      // line:col: of the user's file (the same for every value).
      if (size_t colon = r.find(": "); colon != std::string::npos &&
                                       colon < 16 &&
                                       std::isdigit(static_cast<unsigned char>(r[0])))
        r = r.substr(colon + 2);
      // The same error at other values reads alike: group by its text
      // without the numbers that differ.
      std::string key;
      for (char ch : r)
        if (!std::isdigit(static_cast<unsigned char>(ch)) || key.empty() ||
            !std::isdigit(static_cast<unsigned char>(key.back())))
          key += std::isdigit(static_cast<unsigned char>(ch)) ? 'N' : ch;
      ++reasons[key];
    }
  }
  std::stable_sort(fitting.begin(), fitting.end(),
                   [&](const Candidate *a, const Candidate *b) {
                     return ranksAbove(*a, *b);
                   });

  os << "search over " << filename << ": ";
  llvm::interleave(
      sites, os,
      [&](const Site &s) {
        os << s.where << " in " << s.spelling << " (" << s.values.size()
           << ")";
      },
      ", ");
  os << "\n  "
     << (spaceSize < 9e15 ? llvm::formatv("{0}", int64_t(spaceSize)).str()
                          : llvm::formatv("{0:e2}", spaceSize).str())
     << " candidates in the space; "
     << (exhaustive && !timedOut ? std::string("every one planned")
         : exhaustive
             ? llvm::formatv("{0} of them planned", all.size()).str()
             : llvm::formatv("{0} planned (a sample of seed {1}, then "
                             "a local search from the best)",
                             all.size(), o.seed)
                   .str())
     << (timedOut ? llvm::formatv(", stopped at the time limit ({0} s)",
                                  o.timeLimit)
                        .str()
                  : std::string())
     << llvm::formatv(" in {0:f2} s ({1:f1} ms each)", searchSeconds,
                      planned == 0 ? 0.0
                                   : 1e3 * searchSeconds / double(planned));
  if (replanned)
    os << llvm::formatv("; {0} planned again with mtpc plan's full search "
                        "(the best, and those the quick plan of {1} nodes "
                        "did not fit)",
                        replanned, o.planNodes);
  os << "\n";
  os << "  " << fitting.size() << " fit the budget";
  if (!fitting.empty())
    os << " (" << humanBytes(fitting.front()->usable) << " usable)";
  os << ", " << all.size() - fitting.size() << " do not\n";
  for (const auto &[why, n] : reasons)
    os << "    " << n << " x " << why << "\n";
  if (fitting.empty()) {
    llvm::WithColor::error(llvm::errs(), filename)
        << "no candidate fits the budget; widen a range toward smaller "
           "values or raise budget { memory }\n";
    return kSpecError;
  }

  if (o.trainSteps > 0) {
    // What training decides is capacity against speed: the candidates no
    // other beats on both throughput and parameters, evenly spaced along
    // that front when there are more than K, else filled in rank order.
    std::vector<Candidate *> front;
    for (Candidate *c : fitting) {
      bool beaten = false;
      for (Candidate *d : fitting)
        if (d != c && d->samplesPerSecond >= c->samplesPerSecond &&
            d->params >= c->params &&
            (d->samplesPerSecond > c->samplesPerSecond ||
             d->params > c->params)) {
          beaten = true;
          break;
        }
      if (!beaten)
        front.push_back(c);
    }
    std::stable_sort(front.begin(), front.end(),
                     [](const Candidate *a, const Candidate *b) {
                       return a->samplesPerSecond > b->samplesPerSecond;
                     });
    const size_t k = std::min<size_t>(fitting.size(), o.trainCandidates);
    std::vector<Candidate *> pool;
    if (front.size() > k) {
      for (size_t i = 0; i < k; ++i)
        pool.push_back(front[k == 1 ? 0 : i * (front.size() - 1) / (k - 1)]);
    } else {
      pool = front;
      for (Candidate *c : fitting)
        if (pool.size() < k && !llvm::is_contained(pool, c))
          pool.push_back(c);
    }
    train(pool);
    if (llvm::all_of(pool, [](const Candidate *c) {
          return std::isnan(c->evalLoss);
        })) {
      llvm::WithColor::error(llvm::errs(), filename)
          << "every proxy training run failed (the first: " << pool[0]->reason
          << "); without --train-steps the search ranks by the plan alone\n";
      return kSpecError;
    }
  }

  // The chosen one: the best held-out loss where trained (among those that
  // reached the last round), else the highest predicted throughput.
  Candidate *chosen = fitting.front();
  int64_t longest = 0;
  for (Candidate *c : fitting)
    longest = std::max(longest, c->trainedSteps);
  if (o.trainSteps > 0)
    for (Candidate *c : fitting)
      if (c->trainedSteps == longest && !std::isnan(c->evalLoss) &&
          (chosen->trainedSteps != longest || std::isnan(chosen->evalLoss) ||
           c->evalLoss < chosen->evalLoss))
        chosen = c;

  // The table: the fastest, every trained one, and the chosen.
  std::vector<Candidate *> rows;
  int64_t fastest = 0;
  for (Candidate *c : fitting)
    if (fastest++ < o.top || c->trainedSteps > 0 || c == chosen)
      rows.push_back(c);
  os << "\n  " << llvm::formatv("{0,-4}", "");
  std::vector<size_t> width;
  for (const Site &s : sites) {
    size_t w = std::max<size_t>(s.label.size(), 6);
    for (const std::string &v : s.values)
      w = std::max(w, v.size());
    width.push_back(w);
    os << " " << std::string(width.back() - s.label.size(), ' ') << s.label;
  }
  os << llvm::formatv(" {0,11} {1,11} {2,6} {3,10} {4,10} {5,18}",
                      "params", "peak", "budget", "step", "samples/s",
                      "plan");
  if (o.trainSteps > 0)
    os << llvm::formatv(" {0,10} {1,6}", "eval loss", "steps");
  os << "\n";
  for (Candidate *c : rows) {
    bool pareto = true;
    for (Candidate *d : fitting)
      if (d != c && dominates(*d, *c)) {
        pareto = false;
        break;
      }
    os << "  " << (c == chosen ? "=>" : "  ") << (pareto ? "* " : "  ");
    for (size_t i = 0; i < sites.size(); ++i) {
      const std::string &v = sites[i].values[c->index[i]];
      os << " " << std::string(width[i] - std::min(width[i], v.size()), ' ')
         << v;
    }
    // What the plan does beyond keeping: checkpoint regions, units re-run
    // at tensor grain, offloaded units.
    std::string plan;
    for (auto [n, what] : {std::pair{c->regions, "ckpt"},
                           std::pair{c->partial, "part"},
                           std::pair{c->offloads, "offl"}})
      if (n)
        plan += (plan.empty() ? "" : " ") + std::to_string(n) + " " + what;
    if (plan.empty())
      plan = "keep all";
    os << llvm::formatv(" {0,11} {1,11} {2,5:f0}% {3,8:f2}ms {4,10:f1} {5,18}",
                        humanCount(c->params), humanBytes(c->peak),
                        100.0 * double(c->peak) / double(c->usable),
                        1e3 * c->stepSeconds, c->samplesPerSecond, plan);
    if (o.trainSteps > 0) {
      if (c->trainedSteps > 0 && std::isnan(c->evalLoss))
        os << llvm::formatv(" {0,10} {1,6}", "failed", c->trainedSteps);
      else if (c->trainedSteps > 0)
        os << llvm::formatv(" {0,10:f4} {1,6}", c->evalLoss, c->trainedSteps);
      else
        os << llvm::formatv(" {0,10} {1,6}", "-", "-");
    }
    os << "\n";
  }
  os << "  (* on the Pareto front of parameters, peak, throughput"
     << (o.trainSteps > 0 ? " and held-out loss" : "")
     << "; => the chosen; step and samples/s: the plan's prediction; plan: "
        "checkpoint regions, units re-run at tensor grain, offloaded units)\n";

  os << "\nchosen: " << assignment(*chosen) << "\n  ";
  if (o.trainSteps > 0 && chosen->trainedSteps == longest &&
      !std::isnan(chosen->evalLoss))
    os << llvm::formatv("the lowest held-out loss ({0:f4}) after {1} steps "
                        "of the {2} fitting candidates trained (the front of "
                        "throughput against parameters), by successive "
                        "halving; ",
                        chosen->evalLoss, chosen->trainedSteps,
                        std::min<size_t>(fitting.size(), o.trainCandidates));
  else if (o.capacity)
    os << llvm::formatv("the most parameters of the {0} that fit, the "
                        "fastest of those; ",
                        fitting.size());
  else
    os << llvm::formatv("the highest predicted throughput of the {0} that "
                        "fit; ",
                        fitting.size());
  os << llvm::formatv("{0:f1} samples/s, peak {1} ({2:f0}% of the usable "
                      "budget), {3} parameters\n",
                      chosen->samplesPerSecond, humanBytes(chosen->peak),
                      100.0 * double(chosen->peak) / double(chosen->usable),
                      humanCount(chosen->params));
  if (chosen->trainedSteps > 0 && !std::isnan(chosen->evalLoss)) {
    if (!chosen->metrics.empty())
      os << "  held-out after " << chosen->trainedSteps
         << " steps: " << chosen->metrics << "\n";
    if (chosen->predictedPeak > 0) {
      const double gap = double(chosen->measuredPeak) /
                             double(chosen->predictedPeak) -
                         1;
      os << "  its proxy run's tracked peak " << humanBytes(chosen->measuredPeak)
         << " against the plan's " << humanBytes(chosen->predictedPeak)
         << llvm::format(" (%+.2f%%)", 100.0 * gap);
      if (std::fabs(gap) > 0.03)
        os << ": beyond the 3% plans aim for (docs/cost-model.md, known gaps)";
      os << "\n";
    }
  }
  if (o.trainSteps == 0 && !o.capacity)
    os << "  (throughput alone favours the smallest model that fits; "
          "--objective=capacity the largest, --train-steps N ranks the front "
          "of throughput against parameters by held-out loss)\n";

  if (!o.output.empty()) {
    std::error_code ec;
    llvm::ToolOutputFile out(o.output, ec, llvm::sys::fs::OF_Text);
    if (ec) {
      llvm::WithColor::error(llvm::errs(), "mtpc search")
          << o.output << ": " << ec.message() << "\n";
      return kUsageError;
    }
    out.os() << candidateText(chosen->index, /*pad=*/false);
    out.keep();
    os << "wrote " << o.output << "\n";
  }
  return kOk;
}

} // namespace

int mtp::runSearch(StringRef filename, StringRef text,
                   const SearchOptions &options, llvm::raw_ostream &os) {
  Search search(filename, text, options);
  return search.run(os);
}
