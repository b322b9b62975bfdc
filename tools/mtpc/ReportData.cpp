//===- ReportData.cpp - `mtpc report`: reading the metrics JSON Lines -----===//
//
// Each line of the metrics file is one JSON object (llvm::json); step records
// have `step` and `loss` (docs/contracts.md), events have `event` and `step`.
// Anything else is refused with the file and line. A last line without its
// newline that does not parse is a run still being written: it is skipped
// with a note and the rest is rendered.
//
//===----------------------------------------------------------------------===//

#include "ReportData.h"

#include "mtprt/EvalMetrics.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <algorithm>
#include <cmath>

using llvm::StringRef;
using llvm::Twine;
namespace json = llvm::json;

namespace mtp::report {
namespace {
/// A number as a reader wrote it (%g: -5, 3, 1e+308).
std::string shortNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
} // namespace

namespace {

llvm::Error inputError(const Twine &why) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), why);
}

std::string describeKind(const json::Value &v) {
  switch (v.kind()) {
  case json::Value::Null:
    return "null";
  case json::Value::Boolean:
    return "a boolean";
  case json::Value::Number:
    return "a number";
  case json::Value::String:
    return "a string";
  case json::Value::Array:
    return "an array";
  case json::Value::Object:
    return "an object";
  }
  llvm_unreachable("json kind");
}

/// The deepest `[`/`{` nesting in `text` outside strings. llvm::json parses
/// (and destroys) values recursively, so a line nested 50k deep would
/// overflow the stack: it is measured first.
unsigned jsonDepth(StringRef text) {
  unsigned depth = 0, deepest = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\')
          ++i;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

/// Metrics records nest three levels; anything this deep is not one.
constexpr unsigned kMaxRecordDepth = 64;

/// Parses one step record or event; `line` is the raw text (the key order
/// of `loss` is taken from it: llvm::json::Object does not keep one).
class LineParser {
public:
  LineParser(Run &run, StringRef file) : run(run), file(file) {}

  /// Adds the line's record or event to the run.
  llvm::Error parse(StringRef text, unsigned lineNo) {
    if (unsigned depth = jsonDepth(text); depth > kMaxRecordDepth)
      return inputError(file + ":" + Twine(lineNo) + ": brackets nested " +
                        Twine(depth) + " deep (a metrics record nests at "
                        "most " + Twine(kMaxRecordDepth) +
                        "); is this the binary's --metrics file?");
    llvm::Expected<json::Value> parsed = json::parse(text);
    if (!parsed)
      return inputError(file + ":" + Twine(lineNo) +
                        ": not JSON: " + llvm::toString(parsed.takeError()));
    this->lineNo = lineNo;
    const json::Object *obj = parsed->getAsObject();
    if (!obj)
      return foreign("the line is " + describeKind(*parsed));
    if (const json::Value *ev = obj->get("event"))
      return parseEvent(*obj, *ev);
    if (const json::Value *ev = obj->get("eval"))
      return parseEval(*obj, *ev);
    if (!obj->get("step") || !obj->get("loss")) {
      std::vector<std::string> keys;
      for (const auto &kv : *obj)
        keys.push_back("\"" + kv.first.str() + "\"");
      llvm::sort(keys);
      if (keys.size() > 6) {
        keys.resize(6);
        keys.push_back("...");
      }
      return foreign(keys.empty() ? std::string("it is an empty object")
                                  : "it has " + llvm::join(keys, ", "));
    }
    return parseRecord(*obj, text);
  }

private:
  llvm::Error foreign(const Twine &what) {
    return inputError(
        file + ":" + Twine(lineNo) +
        ": not a metrics record of mtpc's runtime (" + what +
        "; expected an object with \"step\" and \"loss\", as a training "
        "binary's `--metrics FILE` writes: docs/runtime-services.md §5)");
  }
  llvm::Error wrongType(StringRef key, const json::Value &v,
                        StringRef expected) {
    return inputError(file + ":" + Twine(lineNo) + ": \"" + key + "\" is " +
                      describeKind(v) + ", expected " + expected);
  }
  llvm::Expected<int64_t> stepOf(const json::Object &obj) {
    const json::Value *v = obj.get("step");
    if (!v)
      return inputError(file + ":" + Twine(lineNo) + ": no \"step\"");
    std::optional<int64_t> s = v->getAsInteger();
    if (!s || *s < 0)
      return wrongType("step", *v, "a step number (an integer >= 0)");
    return *s;
  }
  /// A number, or nullopt for an absent key or null.
  llvm::Expected<Opt> number(const json::Object &obj, StringRef key) {
    const json::Value *v = obj.get(key);
    if (!v || v->kind() == json::Value::Null)
      return Opt();
    if (std::optional<double> d = v->getAsNumber())
      return Opt(*d);
    return wrongType(key, *v, "a number or null");
  }
  /// Task index, adding the task in the order the runtime writes them.
  unsigned taskIndex(StringRef name) {
    for (unsigned i = 0; i < run.tasks.size(); ++i)
      if (run.tasks[i] == name)
        return i;
    run.tasks.push_back(name.str());
    return run.tasks.size() - 1;
  }
  llvm::Error perTask(const json::Object &obj, StringRef key, StringRef text,
                      std::vector<Opt> &out) {
    const json::Value *v = obj.get(key);
    if (!v || v->kind() == json::Value::Null)
      return llvm::Error::success();
    const json::Object *m = v->getAsObject();
    if (!m)
      return wrongType(key, *v, "an object (task -> value)");
    // The text's order: where each "name": appears after "key":.
    size_t from = text.find(("\"" + key + "\"").str());
    std::vector<std::pair<size_t, std::string>> order;
    for (const auto &kv : *m)
      order.push_back(
          {text.find("\"" + kv.first.str() + "\"", from), kv.first.str()});
    llvm::sort(order);
    for (const auto &[pos, name] : order) {
      const json::Value &val = *m->get(name);
      unsigned t = taskIndex(name);
      if (out.size() <= t)
        out.resize(t + 1);
      if (val.kind() == json::Value::Null)
        continue;
      std::optional<double> d = val.getAsNumber();
      if (!d)
        return wrongType((key + "." + name).str(), val, "a number or null");
      out[t] = *d;
    }
    return llvm::Error::success();
  }

  llvm::Error parseEvent(const json::Object &obj, const json::Value &ev) {
    Event e;
    e.line = lineNo;
    std::optional<StringRef> name = ev.getAsString();
    if (!name)
      return wrongType("event", ev, "a string");
    e.name = name->str();
    llvm::Expected<int64_t> step = stepOf(obj);
    if (!step)
      return step.takeError();
    e.step = *step;
    std::vector<std::string> parts;
    for (const auto &kv : obj) {
      if (kv.first == "event" || kv.first == "step")
        continue;
      std::string value;
      if (std::optional<double> d = kv.second.getAsNumber())
        value = llvm::formatv("{0}", llvm::format("%.4g", *d)).str();
      else
        value = llvm::formatv("{0}", kv.second).str();
      parts.push_back(kv.first.str() + " " + value);
    }
    llvm::sort(parts);
    e.detail = llvm::join(parts, ", ");
    run.events.push_back(std::move(e));
    return llvm::Error::success();
  }

  /// An evaluation record: {"step": S, "eval": {task: {metric: value}}}.
  llvm::Error parseEval(const json::Object &obj, const json::Value &ev) {
    EvalRecord e;
    e.line = lineNo;
    llvm::Expected<int64_t> step = stepOf(obj);
    if (!step)
      return step.takeError();
    e.step = *step;
    if (const json::Value *n = obj.get("eval_records"))
      e.records = n->getAsInteger().value_or(0);
    const json::Object *tasks = ev.getAsObject();
    if (!tasks)
      return wrongType("eval", ev, "an object (task -> metric -> value)");
    auto rank = [](StringRef m) {
      const auto *it = llvm::find(mtprt::metrics::kNames, m);
      return size_t(it - std::begin(mtprt::metrics::kNames));
    };
    for (const auto &kv : *tasks) {
      const json::Object *metrics = kv.second.getAsObject();
      if (!metrics)
        return wrongType(("eval." + kv.first.str()), kv.second,
                         "an object (metric -> value)");
      EvalRecord::Task t;
      t.name = kv.first.str();
      for (const auto &m : *metrics) {
        if (m.second.kind() == json::Value::Null) {
          t.metrics.push_back({m.first.str(), std::nullopt});
          continue;
        }
        std::optional<double> v = m.second.getAsNumber();
        if (!v)
          return wrongType("eval." + kv.first.str() + "." + m.first.str(),
                           m.second, "a number or null");
        t.metrics.push_back({m.first.str(), *v});
      }
      llvm::stable_sort(t.metrics, [&](const auto &a, const auto &b) {
        return std::make_pair(rank(a.first), a.first) <
               std::make_pair(rank(b.first), b.first);
      });
      e.tasks.push_back(std::move(t));
    }
    // The runtime's task order where the loss records give it.
    auto index = [&](const std::string &name) {
      auto it = llvm::find(run.tasks, name);
      return size_t(it - run.tasks.begin());
    };
    llvm::stable_sort(e.tasks, [&](const auto &a, const auto &b) {
      return std::make_pair(index(a.name), a.name) <
             std::make_pair(index(b.name), b.name);
    });
    run.evals.push_back(std::move(e));
    return llvm::Error::success();
  }

  /// The gradient cosine matrix; none where absent or null.
  llvm::Error cosineMatrix(const json::Object &obj,
                           std::vector<std::vector<double>> &cosine) {
    const json::Value *m = obj.get("gradient_cosine_sim_matrix");
    if (!m || m->kind() == json::Value::Null)
      return llvm::Error::success();
    const json::Array *rows = m->getAsArray();
    if (!rows)
      return wrongType("gradient_cosine_sim_matrix", *m,
                       "an array of rows or null");
    for (const json::Value &row : *rows) {
      const json::Array *cells = row.getAsArray();
      if (!cells || cells->size() != rows->size())
        return inputError(file + ":" + Twine(lineNo) +
                          ": \"gradient_cosine_sim_matrix\" is not a "
                          "square matrix of numbers");
      std::vector<double> out;
      for (const json::Value &c : *cells) {
        const double x = c.getAsNumber().value_or(std::nan(""));
        if (std::abs(x) > 1 + 1e-6)
          return inputError(file + ":" + Twine(lineNo) +
                            ": \"gradient_cosine_sim_matrix\" holds " +
                            shortNumber(x) +
                            "; a cosine is in [-1, 1]");
        out.push_back(x);
      }
      cosine.push_back(std::move(out));
    }
    return llvm::Error::success();
  }

  /// The record's single numbers (docs/contracts.md's names).
  llvm::Error scalars(const json::Object &obj, Record &r) {
    struct {
      StringRef key;
      Opt Record::*field;
    } fields[] = {
        {"activation_reuse_ratio", &Record::reuse},
        {"checkpoint_hit_rate", &Record::checkpointHitRate},
        {"offload_hits", &Record::offloadHits},
        {"offload_misses", &Record::offloadMisses},
        {"offload_wait_s", &Record::offloadWaitS},
        {"measured_peak_bytes", &Record::measuredPeak},
        {"predicted_peak_bytes", &Record::predictedPeak},
        {"host_pool_bytes", &Record::hostPool},
        {"bytes_sent", &Record::bytesSent},
        {"bytes_sent_uncompressed", &Record::bytesSentUncompressed},
        {"step_time_s", &Record::stepTimeS},
        {"samples_per_s", &Record::samplesPerS},
    };
    for (const auto &f : fields) {
      llvm::Expected<Opt> v = number(obj, f.key);
      if (!v)
        return v.takeError();
      // Counts, bytes and times are never negative (the ratio neither).
      if (*v && !(**v >= 0))
        return inputError(file + ":" + Twine(lineNo) + ": \"" + f.key +
                          "\" is " + shortNumber(**v) +
                          "; it is a count, bytes or seconds, never negative");
      r.*f.field = *v;
    }
    return llvm::Error::success();
  }

  /// A step at or before the previous one starts another run appended to
  /// the same file, or a resume that repeats steps: the later records win.
  void replaceFrom(int64_t step) {
    if (run.records.empty() || step > run.records.back().step)
      return;
    int64_t previous = run.records.back().step;
    size_t before = run.records.size();
    llvm::erase_if(run.records,
                   [&](const Record &old) { return old.step >= step; });
    llvm::erase_if(run.events,
                   [&](const Event &old) { return old.step >= step; });
    // An evaluation's step counts the steps taken: one after record `step`.
    llvm::erase_if(run.evals,
                   [&](const EvalRecord &old) { return old.step > step; });
    run.notes.push_back(
        llvm::formatv("{0}:{1}: step {2} after step {3} (a resumed or "
                      "appended run): the {4} earlier record(s) from step "
                      "{2} on are replaced by the later ones",
                      file, lineNo, step, previous, before - run.records.size())
            .str());
  }

  llvm::Error parseRecord(const json::Object &obj, StringRef text) {
    Record r;
    r.line = lineNo;
    llvm::Expected<int64_t> step = stepOf(obj);
    if (!step)
      return step.takeError();
    r.step = *step;
    if (llvm::Error err = perTask(obj, "loss", text, r.loss))
      return err;
    if (llvm::Error err = perTask(obj, "alpha", text, r.alpha))
      return err;
    if (llvm::Error err = cosineMatrix(obj, r.cosine))
      return err;
    if (llvm::Error err = scalars(obj, r))
      return err;
    replaceFrom(r.step);
    run.records.push_back(std::move(r));
    return llvm::Error::success();
  }

  Run &run;
  std::string file;
  unsigned lineNo = 0;
};

} // namespace

llvm::Expected<Run> readMetrics(StringRef text, StringRef file) {
  Run run;
  run.file = file.str();
  LineParser parser(run, file);
  bool endsWithNewline = text.ends_with("\n");
  llvm::SmallVector<StringRef> lines;
  text.split(lines, '\n');
  if (endsWithNewline)
    lines.pop_back(); // the empty piece after the last newline
  run.lines = lines.size();
  unsigned nonBlank = 0;
  for (unsigned i = 0; i < lines.size(); ++i) {
    StringRef line = lines[i].rtrim("\r");
    if (line.trim().empty())
      continue;
    ++nonBlank;
    if (llvm::Error err = parser.parse(line, i + 1)) {
      bool unterminatedLast = i + 1 == lines.size() && !endsWithNewline;
      if (!unterminatedLast || !line.trim().starts_with("{"))
        return std::move(err);
      // The run is still writing this line: render what exists.
      llvm::consumeError(std::move(err));
      run.notes.push_back((Twine(file) + ":" + Twine(i + 1) +
                           ": the last line is incomplete (no newline; is the "
                           "run still writing it?): skipped, the " +
                           Twine(run.records.size()) +
                           " records before it are shown")
                              .str());
    }
  }
  if (nonBlank == 0)
    return inputError(file + ": empty: no metrics records (a training binary "
                             "writes them with `--metrics FILE`)");
  if (run.records.empty())
    return inputError(file + ": no step records (" + Twine(run.events.size()) +
                      " event(s) only): nothing to chart");
  for (Record &r : run.records) {
    r.loss.resize(run.tasks.size());
    r.alpha.resize(run.tasks.size());
  }
  return run;
}

} // namespace mtp::report
