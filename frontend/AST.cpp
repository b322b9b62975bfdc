//===- AST.cpp - dumping the .mtp AST -------------------------------------===//

#include "frontend/AST.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

using namespace mtp::ast;

namespace {
void collectRanges(Value &v, const std::string &where,
                   std::vector<RangeSite> &out) {
  if (v.kind == Value::Kind::Range)
    out.push_back({&v, where});
  if (v.kind == Value::Kind::Call && v.name == "one_of") {
    out.push_back({&v, where});
    return; // its alternatives are written out
  }
  for (Arg &a : v.args)
    collectRanges(a.value, where + (v.name.empty() ? "" : "." + v.name) + "." +
                               (a.key.empty() ? "<arg>" : a.key),
                  out);
  for (Entry &e : v.entries)
    collectRanges(e.value, where + "." + e.key, out);
}
} // namespace

std::vector<RangeSite> mtp::ast::searchRanges(Model &model) {
  std::vector<RangeSite> out;
  for (Backbone &b : model.backbones) {
    if (b.source)
      collectRanges(*b.source, "backbone", out);
    for (Entry &e : b.entries)
      collectRanges(e.value, "backbone." + e.key, out);
  }
  for (Task &t : model.tasks) {
    for (Arg &a : t.head.args)
      collectRanges(a.value, "task " + t.name + ": " + t.head.name + "." +
                                 (a.key.empty() ? "<arg>" : a.key),
                    out);
    for (auto &[tap, loc] : t.taps)
      if (tap.layer)
        collectRanges(*tap.layer, "task " + t.name + ": from layer", out);
    for (auto &[w, loc] : t.weights)
      collectRanges(w, "task " + t.name + ": weight", out);
  }
  for (Correlation &c : model.correlations)
    collectRanges(c.value, "correlate " + c.a + " ~ " + c.b, out);
  for (Section &s : model.sections)
    for (Entry &e : s.entries)
      collectRanges(e.value, s.name + "." + e.key, out);
  std::stable_sort(out.begin(), out.end(),
                   [](const RangeSite &a, const RangeSite &b) {
                     return std::make_pair(a.value->loc.line, a.value->loc.col) <
                            std::make_pair(b.value->loc.line, b.value->loc.col);
                   });
  return out;
}

llvm::StringRef Value::kindName() const {
  switch (kind) {
  case Kind::Number:
    return "a number";
  case Kind::String:
    return "a string";
  case Kind::Ident:
    return hasBlock ? "a name with a block" : "a name";
  case Kind::Call:
    return "a call";
  case Kind::Block:
    return "a block";
  case Kind::Range:
    return "a search range";
  }
  return "a value";
}

namespace {
struct Dumper {
  llvm::raw_ostream &os;
  unsigned indent = 0;

  llvm::raw_ostream &line(Location loc) {
    os.indent(indent * 2);
    return os << llvm::formatv("@{0}:{1} ", loc.line, loc.col);
  }

  void value(const Value &v) {
    switch (v.kind) {
    case Value::Kind::Number:
      os << "number " << v.spelling;
      if (!v.unit.empty())
        os << " unit " << v.unit;
      break;
    case Value::Kind::String:
      os << "string \"";
      os.write_escaped(v.name);
      os << '"';
      break;
    case Value::Kind::Ident:
      os << "name " << v.name;
      break;
    case Value::Kind::Call:
      os << "call " << v.name << " (" << v.args.size() << " args)";
      break;
    case Value::Kind::Block:
      os << "block";
      break;
    case Value::Kind::Range:
      os << "range " << v.integer << ".." << v.rangeHi << " by " << v.rangeStep;
      break;
    }
    os << '\n';
    ++indent;
    for (const Arg &arg : v.args) {
      line(arg.loc) << "arg " << (arg.key.empty() ? "<positional>" : arg.key)
                    << " = ";
      value(arg.value);
    }
    entries(v.entries);
    --indent;
  }

  void entries(const std::vector<Entry> &list) {
    for (const Entry &e : list) {
      line(e.loc) << "entry " << e.key << " = ";
      value(e.value);
    }
  }
};
} // namespace

void mtp::ast::dump(const Model &model, llvm::raw_ostream &os) {
  Dumper d{os};
  d.line(model.loc) << "model " << model.name << '\n';
  d.indent = 1;
  for (const Backbone &bb : model.backbones) {
    d.line(bb.loc) << "backbone ";
    if (bb.source)
      d.value(*bb.source);
    else
      d.os << bb.kind;
    d.os << '\n';
    ++d.indent;
    d.entries(bb.entries);
    --d.indent;
  }
  for (const Task &task : model.tasks) {
    d.line(task.loc) << "task " << task.name << " head ";
    d.value(task.head);
    ++d.indent;
    for (const auto &[tap, loc] : task.taps) {
      d.line(loc) << "from "
                  << (tap.kind == Tap::Kind::Pooled       ? "pooled"
                      : tap.kind == Tap::Kind::Embeddings ? "embeddings"
                                                          : "layer");
      if (tap.layer)
        os << ' ' << tap.layer->spelling;
      os << '\n';
    }
    for (const auto &[loss, loc] : task.losses)
      d.line(loc) << "loss " << loss << '\n';
    for (const auto &[weight, loc] : task.weights)
      d.line(loc) << "weight " << weight.spelling << '\n';
    --d.indent;
  }
  for (const Correlation &c : model.correlations)
    d.line(c.loc) << "correlate " << c.a << " ~ " << c.b << " = "
                  << c.value.spelling << '\n';
  for (const Section &s : model.sections) {
    d.line(s.loc) << "section " << s.name << '\n';
    ++d.indent;
    d.entries(s.entries);
    --d.indent;
  }
}
