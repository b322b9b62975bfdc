//===- Sema.cpp - checking a .mtp AST -------------------------------------===//
//
// Each section has a table of keys; Fields checks a block against it
// (repeats, unknown keys with a suggestion, keys that belong to another
// section, knobs of deferred techniques), and typed readers check each value
// (kind, unit, range). Sema keeps going after an error so one run reports
// every independent problem, up to a cap.
//
//===----------------------------------------------------------------------===//

#include "frontend/Sema.h"

#include "dialect/Devices.h"
#include "frontend/Pretrained.h"
#include "mtprt/Limits.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Location.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"

#include <cmath>
#include <cstdio>
#include <map>

using namespace mtp;
using ast::Location;
using llvm::ArrayRef;
using llvm::SmallVector;
using llvm::StringRef;

namespace limits = mtprt::limits;

namespace {

/// Closest candidate by edit distance, if close enough to be a likely typo.
std::optional<StringRef> closest(StringRef word, ArrayRef<StringRef> options) {
  std::optional<StringRef> best;
  unsigned bestDistance = ~0u;
  for (StringRef option : options) {
    unsigned distance = word.lower() == option.lower()
                            ? 0
                            : word.edit_distance(option, true, 4);
    if (distance < bestDistance) {
      bestDistance = distance;
      best = option;
    }
  }
  // Short names are too alike to guess between: only case differences.
  unsigned allowed = word.size() < 3 ? 0 : std::max<size_t>(1, word.size() / 3);
  if (best && bestDistance <= allowed)
    return best;
  return std::nullopt;
}

/// 0.5, 1e-08, 100: how people write range ends.
std::string shortest(double value) {
  char buffer[32];
  snprintf(buffer, sizeof(buffer), "%g", value);
  return buffer;
}

std::string joined(ArrayRef<StringRef> words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i)
      out += i + 1 == words.size() ? " or " : ", ";
    out += words[i];
  }
  return out;
}

struct TooManyErrors {};

/// Knobs of the deferred techniques (docs/techniques.md, "Deferred"): known, rejected.
struct Deferred {
  StringRef key, technique;
};
constexpr Deferred kDeferredStrategy[] = {
    {"cuda_graphs", "CUDA Graph capture (docs/techniques.md A3)"},
};
constexpr Deferred kDeferredBudget[] = {
    {"param_offload", "ZeRO-3 parameter offload (docs/techniques.md D16)"},
};

// Keys per section, so a key written in the wrong section gets pointed home.
constexpr StringRef kBackboneKeys[] = {
    "layers",    "hidden",    "heads",     "ffn",       "vocab",
    "seq",       "dropout",   "attention", "pointwise", "positions",
    "norm_eps",  "kv_heads",  "rope_theta", "type_vocab", "freeze",
    "rope_scaling", "attention_bias", "mlp_bias"};
/// What a pretrained backbone's config.json fixes (and its name there:
/// GPT-2's, Llama's).
constexpr std::tuple<StringRef, StringRef, StringRef> kFixedByCheckpoint[] = {
    {"layers", "n_layer", "num_hidden_layers"},
    {"hidden", "n_embd", "hidden_size"},
    {"heads", "n_head", "num_attention_heads"},
    {"ffn", "n_inner", "intermediate_size"},
    {"vocab", "vocab_size", "vocab_size"},
    {"positions", "n_positions", "max_position_embeddings"},
    {"norm_eps", "layer_norm_epsilon", "rms_norm_eps"},
    {"kv_heads", "", "num_key_value_heads"},
    {"rope_theta", "", "rope_theta"},
    {"rope_scaling", "", "rope_scaling"},
    {"attention_bias", "", "attention_bias"},
    {"mlp_bias", "", "mlp_bias"},
    {"type_vocab", "", "type_vocab_size"}};
constexpr StringRef kBudgetKeys[] = {
    "device",       "memory",      "headroom",     "host_link",
    "gpus",         "global_batch", "micro_batch", "accumulation",
    "precision",    "hbm_bandwidth", "peak_tflops", "zero",
    "pipeline",     "interconnect"};
constexpr StringRef kStrategyKeys[] = {
    "checkpoint", "offload", "gfm",  "gradient_scope",
    "dgfg",       "clip",    "lr",   "collective", "dynamic_batch", "saps", "ewc",
    "adapters", "optimizer_offload", "pipeline_schedule"};
constexpr StringRef kTrainKeys[] = {"steps",      "seed",      "data",
                                    "optimizer",  "log_every", "save_every",
                                    "eval",       "eval_every", "phases"};
constexpr StringRef kSections[] = {"budget", "strategy", "train"};

class Fields;

class Sema {
public:
  Sema(StringRef filename, mlir::MLIRContext *context, unsigned maxErrors)
      : context(context), maxErrors(maxErrors) {
    file = mlir::StringAttr::get(context, filename);
  }

  std::optional<CheckedSpec> run(const ast::Model &model);

  //===--------------------------------------------------------------------===//
  // Diagnostics
  //===--------------------------------------------------------------------===//

  mlir::Location loc(Location l) {
    return mlir::FileLineColLoc::get(file, l.line, l.col);
  }

  mlir::InFlightDiagnostic error(Location l) {
    if (errors >= maxErrors) {
      mlir::emitError(loc(l)) << "too many errors (" << maxErrors
                              << "); stopping here";
      throw TooManyErrors();
    }
    ++errors;
    return mlir::emitError(loc(l));
  }

  void note(mlir::InFlightDiagnostic &diag, Location l, const llvm::Twine &msg) {
    diag.attachNote(loc(l)) << msg;
  }

  void warning(Location l, const llvm::Twine &msg) {
    mlir::emitWarning(loc(l)) << msg;
  }

  unsigned errors = 0;

  //===--------------------------------------------------------------------===//
  // Typed readers. Each reports and returns nullopt on a bad value.
  //===--------------------------------------------------------------------===//

  std::optional<int64_t> integer(const ast::Value &v, StringRef what,
                                 mtprt::limits::Range range) {
    return integer(v, what, range.lo, range.hi);
  }
  std::optional<int64_t> integer(const ast::Value &v, StringRef what,
                                 int64_t lo, int64_t hi) {
    if (v.kind != ast::Value::Kind::Number || !v.isInteger) {
      error(v.loc) << "'" << what << "' expects a whole number, got "
                   << describe(v);
      return std::nullopt;
    }
    if (!v.unit.empty()) {
      error(v.unitLoc) << "'" << what << "' takes no unit, got '" << v.unit
                       << "'";
      return std::nullopt;
    }
    if (v.integer < lo || v.integer > hi) {
      auto diag = error(v.loc);
      diag << "'" << what << "' must be ";
      if (hi == INT64_MAX)
        diag << "at least " << lo;
      else
        diag << "between " << lo << " and " << hi;
      diag << ", got " << v.spelling;
      return std::nullopt;
    }
    return v.integer;
  }

  /// A real in one of the shared ranges (mtprt/Limits.h).
  std::optional<double> real(const ast::Value &v, StringRef what,
                             mtprt::limits::RealRange r) {
    return real(v, what, r.lo, r.hi, r.openLo, r.openHi);
  }
  /// A real in [lo, hi]; openLo/openHi exclude the ends.
  std::optional<double> real(const ast::Value &v, StringRef what, double lo,
                             double hi, bool openLo = false,
                             bool openHi = false) {
    if (v.kind != ast::Value::Kind::Number) {
      error(v.loc) << "'" << what << "' expects a number, got " << describe(v);
      return std::nullopt;
    }
    if (!v.unit.empty()) {
      error(v.unitLoc) << "'" << what << "' takes no unit, got '" << v.unit
                       << "'";
      return std::nullopt;
    }
    bool ok = (openLo ? v.number > lo : v.number >= lo) &&
              (openHi ? v.number < hi : v.number <= hi);
    if (!ok) {
      auto diag = error(v.loc);
      diag << "'" << what << "' must lie in " << (openLo ? "(" : "[")
           << shortest(lo) << ", ";
      if (std::isinf(hi))
        diag << "inf)";
      else
        diag << shortest(hi) << (openHi ? ")" : "]");
      diag << ", got " << v.spelling;
      return std::nullopt;
    }
    return v.number;
  }

  /// A number with a unit from `units` (name -> scale); the result is in
  /// the base unit (bytes, seconds, bytes/s).
  std::optional<double>
  quantity(const ast::Value &v, StringRef what,
           ArrayRef<std::pair<StringRef, double>> units, StringRef example) {
    if (v.kind != ast::Value::Kind::Number) {
      error(v.loc) << "'" << what << "' expects a quantity such as " << example
                   << ", got " << describe(v);
      return std::nullopt;
    }
    SmallVector<StringRef> names;
    for (auto [name, scale] : units)
      names.push_back(name);
    if (v.unit.empty()) {
      auto diag = error(v.loc);
      diag << "'" << what << "' needs a unit, e.g. " << example;
      note(diag, v.loc, "units: " + joined(names));
      return std::nullopt;
    }
    for (auto [name, scale] : units)
      if (name == v.unit) {
        if (v.number < 0) {
          error(v.loc) << "'" << what << "' must not be negative, got "
                       << v.spelling << v.unit;
          return std::nullopt;
        }
        return v.number * scale;
      }
    auto diag = error(v.unitLoc);
    diag << "unknown unit '" << v.unit << "' for '" << what << "'";
    if (std::optional<StringRef> guess = closest(v.unit, names))
      diag << "; did you mean '" << *guess << "'?";
    else
      note(diag, v.unitLoc, "units: " + joined(names));
    return std::nullopt;
  }

  std::optional<int64_t> bytes(const ast::Value &v, StringRef what) {
    static const std::pair<StringRef, double> units[] = {
        {"B", 1},          {"KiB", 0x1p10}, {"MiB", 0x1p20},
        {"GiB", 0x1p30},   {"TiB", 0x1p40}, {"KB", 1e3},
        {"MB", 1e6},       {"GB", 1e9},     {"TB", 1e12}};
    std::optional<double> value = quantity(v, what, units, "32GiB");
    if (!value)
      return std::nullopt;
    if (*value >= 0x1p62) {
      error(v.loc) << "'" << what << "' is out of range";
      return std::nullopt;
    }
    return static_cast<int64_t>(std::llround(*value));
  }

  std::optional<double> seconds(const ast::Value &v, StringRef what) {
    static const std::pair<StringRef, double> units[] = {
        {"s", 1}, {"ms", 1e-3}, {"us", 1e-6}};
    return quantity(v, what, units, "1.2ms");
  }

  std::optional<int64_t> bandwidth(const ast::Value &v, StringRef what) {
    static const std::pair<StringRef, double> units[] = {
        {"B/s", 1},      {"KB/s", 1e3},      {"MB/s", 1e6},
        {"GB/s", 1e9},   {"TB/s", 1e12},     {"MiB/s", 0x1p20},
        {"GiB/s", 0x1p30}};
    std::optional<double> value = quantity(v, what, units, "32GB/s");
    if (!value)
      return std::nullopt;
    if (*value < 1 || *value >= 0x1p62) {
      error(v.loc) << "'" << what << "' must be a positive bandwidth";
      return std::nullopt;
    }
    return static_cast<int64_t>(std::llround(*value));
  }

  /// A bare name from `options`.
  std::optional<StringRef> choice(const ast::Value &v, StringRef what,
                                  ArrayRef<StringRef> options) {
    if (v.kind != ast::Value::Kind::Ident || v.hasBlock) {
      error(v.loc) << "'" << what << "' expects one of " << joined(options)
                   << ", got " << describe(v);
      return std::nullopt;
    }
    for (StringRef option : options)
      if (option == v.name)
        return option;
    auto diag = error(v.loc);
    diag << "unknown " << what << " '" << v.name << "'";
    if (std::optional<StringRef> guess = closest(v.name, options))
      diag << "; did you mean '" << *guess << "'?";
    else
      diag << "; expected " << joined(options);
    return std::nullopt;
  }

  /// A knob written as a bare name or a call of one: `none`, `uniform(...)`.
  std::optional<StringRef> policy(const ast::Value &v, StringRef what,
                                  ArrayRef<StringRef> options) {
    ast::Value name = v;
    if (v.kind == ast::Value::Kind::Call)
      name.kind = ast::Value::Kind::Ident;
    return choice(name, what, options);
  }

  static std::string describe(const ast::Value &v) {
    switch (v.kind) {
    case ast::Value::Kind::Number:
      return "'" + v.spelling + v.unit + "'";
    case ast::Value::Kind::String:
      return "a string";
    case ast::Value::Kind::Ident:
      return "'" + v.name + "'";
    case ast::Value::Kind::Call:
      return "'" + v.name + "(...)'";
    case ast::Value::Kind::Block:
      return "a block";
    }
    return "a value";
  }

private:
  void checkBackbone(const ast::Model &model, CheckedSpec &spec);
  void checkPretrained(const ast::Backbone &bb, CheckedSpec::Backbone &out);
  /// `attention` and `pointwise` (a pretrained family's: aten only).
  void checkKernels(Fields &f, CheckedSpec::Backbone &out, bool pretrained);
  void checkTasks(const ast::Model &model, CheckedSpec &spec);
  void checkFreeze(Fields &f, CheckedSpec::Backbone &out);
  void checkCorrelations(const ast::Model &model, CheckedSpec &spec);
  void checkBudget(const ast::Section *section, CheckedSpec &spec,
                   Location modelLoc);
  void checkStrategy(const ast::Section *section, CheckedSpec &spec);
  void checkTrain(const ast::Section *section, CheckedSpec &spec);
  std::optional<Schedule> schedule(const ast::Value &v, StringRef what);
  void checkLr(const ast::Value &v, CheckedSpec &spec);
  void crossChecks(CheckedSpec &spec);

  mlir::MLIRContext *context;
  mlir::StringAttr file;
  unsigned maxErrors;
  /// Where each task was given an explicit lr (for warm-up checks).
  llvm::StringMap<Location> taskLrLocs;
  Location trainLrLoc;
};

/// The entries of one block, checked against the keys it may hold.
class Fields {
public:
  Fields(Sema &sema, StringRef where, const std::vector<ast::Entry> &entries,
         ArrayRef<StringRef> keys, ArrayRef<Deferred> deferred = {})
      : sema(sema) {
    for (const ast::Entry &entry : entries) {
      if (const ast::Entry *first = byKey.lookup(entry.key)) {
        auto diag = sema.error(entry.loc);
        diag << "'" << entry.key << "' is given twice in " << where;
        sema.note(diag, first->loc, "first given here");
        continue;
      }
      if (llvm::is_contained(keys, entry.key)) {
        byKey[entry.key] = &entry;
        continue;
      }
      if (entry.key == "search" && where == "strategy { }") {
        auto diag = sema.error(entry.loc);
        diag << "'search' is not a strategy knob: write the values to search "
                "as ranges where they are set (layers = 4..12, micro_batch = "
                "4..32 by 4, from layer 2..6) and run `mtpc search` "
                "(docs/search.md)";
        continue;
      }
      if (const Deferred *d = llvm::find_if(
              deferred, [&](const Deferred &d) { return d.key == entry.key; });
          d != deferred.end()) {
        sema.error(entry.loc) << "'" << entry.key << "' is not yet supported: "
                              << d->technique
                              << " is deferred to a later release; remove it";
        continue;
      }
      auto diag = sema.error(entry.loc);
      diag << "unknown key '" << entry.key << "' in " << where;
      if (StringRef home = homeOf(entry.key); !home.empty())
        diag << "; '" << entry.key << "' belongs in " << home;
      else if (std::optional<StringRef> guess = closest(entry.key, keys)) {
        diag << "; did you mean '" << *guess << "'?";
        guessed.insert(*guess);
      } else {
        sema.note(diag, entry.loc, "known keys: " + joined(keys));
      }
    }
  }

  const ast::Value *get(StringRef key) const {
    const ast::Entry *entry = byKey.lookup(key);
    return entry ? &entry->value : nullptr;
  }
  Location locOf(StringRef key) const { return byKey.lookup(key)->loc; }
  /// True when a misspelt key was already reported as probably `key`: a
  /// "missing key" error would only repeat it.
  bool wasGuessed(StringRef key) const { return guessed.contains(key); }

private:
  static StringRef homeOf(StringRef key) {
    if (llvm::is_contained(kBudgetKeys, key))
      return "budget { }";
    if (llvm::is_contained(kStrategyKeys, key))
      return "strategy { }";
    if (llvm::is_contained(kTrainKeys, key))
      return "train { }";
    if (llvm::is_contained(kBackboneKeys, key))
      return "backbone transformer { }";
    return "";
  }

  Sema &sema;
  llvm::StringMap<const ast::Entry *> byKey;
  llvm::StringSet<> guessed;
};

/// The named arguments of a call, checked like Fields; `positional` names
/// the parameter a single unnamed argument stands for (empty: none allowed).
class Args {
public:
  Args(Sema &sema, const ast::Value &call, ArrayRef<StringRef> params,
       StringRef positional = "")
      : sema(sema) {
    for (size_t i = 0; i < call.args.size(); ++i) {
      const ast::Arg &arg = call.args[i];
      StringRef key = arg.key;
      if (params.empty()) {
        sema.error(arg.loc) << "'" << call.name << "' takes no arguments";
        continue;
      }
      if (key.empty()) {
        if (positional.empty() || i != 0) {
          auto diag = sema.error(arg.loc);
          diag << "name the argument of '" << call.name << "(...)'";
          if (!params.empty())
            diag << ", e.g. " << call.name << "(" << params.front()
                 << " = ...)";
          continue;
        }
        key = positional;
      }
      if (const ast::Arg *first = byKey.lookup(key)) {
        auto diag = sema.error(arg.loc);
        diag << "'" << key << "' is given twice";
        sema.note(diag, first->loc, "first given here");
        continue;
      }
      if (!llvm::is_contained(params, key)) {
        auto diag = sema.error(arg.loc);
        diag << "'" << call.name << "' has no parameter '" << key << "'";
        if (std::optional<StringRef> guess = closest(key, params)) {
          diag << "; did you mean '" << *guess << "'?";
          guessed.insert(*guess);
        } else {
          diag << "; its parameters: " << joined(params);
        }
        continue;
      }
      byKey[key] = &arg;
    }
  }

  const ast::Value *get(StringRef key) const {
    const ast::Arg *arg = byKey.lookup(key);
    return arg ? &arg->value : nullptr;
  }
  bool wasGuessed(StringRef key) const { return guessed.contains(key); }

private:
  Sema &sema;
  llvm::StringMap<const ast::Arg *> byKey;
  llvm::StringSet<> guessed;
};

//===----------------------------------------------------------------------===//
// Backbone
//===----------------------------------------------------------------------===//

void Sema::checkBackbone(const ast::Model &model, CheckedSpec &spec) {
  if (model.backbones.empty()) {
    auto diag = error(model.nameLoc);
    diag << "model '" << model.name << "' has no backbone";
    note(diag, model.nameLoc,
         "add e.g. backbone transformer { layers = 12  hidden = 768  "
         "heads = 12  vocab = 32000  seq = 512 }");
    return;
  }
  for (size_t i = 1; i < model.backbones.size(); ++i) {
    auto diag = error(model.backbones[i].loc);
    diag << "a model has one backbone";
    note(diag, model.backbones[0].loc, "first backbone here");
  }
  const ast::Backbone &bb = model.backbones.front();
  auto &out = spec.backbone;
  out.loc = bb.loc;
  if (bb.source) {
    checkPretrained(bb, out);
    return;
  }
  static const StringRef kinds[] = {"transformer", "gpt2", "llama", "bert"};
  if (std::optional<BackboneKind> k = symbolizeBackboneKind(bb.kind)) {
    out.kind = *k;
  } else {
    auto diag = error(bb.kindLoc);
    diag << "unknown backbone '" << bb.kind << "'";
    if (auto guess = closest(bb.kind, kinds))
      diag << "; did you mean '" << *guess << "'?";
    else
      diag << "; the backbone kinds: transformer, gpt2, llama, bert, or "
              "pretrained(\"DIR\")";
  }
  const std::string where = "backbone " + bb.kind + " { }";
  Fields f(*this, where, bb.entries, kBackboneKeys);
  auto required = [&](StringRef key, mtprt::limits::Range range) -> int64_t {
    const ast::Value *v = f.get(key);
    if (!v) {
      if (!f.wasGuessed(key))
        error(bb.loc) << "backbone needs '" << key << "'";
      return 0;
    }
    return integer(*v, key, range).value_or(0);
  };
  out.layers = required("layers", limits::kLayers);
  out.hidden = required("hidden", limits::kHidden);
  out.heads = required("heads", limits::kHeads);
  out.vocab = required("vocab", limits::kVocab);
  out.seq = required("seq", limits::kSeq);
  out.ffn = 4 * out.hidden;
  if (const ast::Value *v = f.get("ffn"))
    out.ffn = integer(*v, "ffn", limits::kFfn).value_or(0);
  out.dropout = 0.1;
  if (const ast::Value *v = f.get("dropout"))
    out.dropout = real(*v, "dropout", limits::kDropout).value_or(0.0);
  checkKernels(f, out, /*pretrained=*/false);
  checkFreeze(f, out);
  if (const ast::Value *v = f.get("positions")) {
    out.positions = integer(*v, "positions", limits::kPositions).value_or(0);
    if (*out.positions && *out.positions < out.seq)
      error(v->loc) << "'positions' = " << *out.positions
                    << " is fewer than 'seq' = " << out.seq;
  }
  if (const ast::Value *v = f.get("norm_eps"))
    out.normEps = real(*v, "norm_eps", limits::kNormEps).value_or(1e-5);
  for (StringRef key :
       {"kv_heads", "rope_theta", "rope_scaling", "attention_bias", "mlp_bias"})
    if (const ast::Value *v = f.get(key); v && out.kind != BackboneKind::llama)
      error(v->loc) << "'" << key << "' is a llama backbone's";
  // attention_bias = true | false, mlp_bias = true | false (default false).
  for (auto [key, slot] : {std::pair{StringRef("attention_bias"),
                                     &out.attentionBias},
                           std::pair{StringRef("mlp_bias"), &out.mlpBias}})
    if (const ast::Value *v = f.get(key)) {
      static const StringRef truth[] = {"true", "false"};
      if (std::optional<StringRef> c = choice(*v, key, truth))
        *slot = *c == "true";
    }
  // rope_scaling = llama3(factor = 8, low_freq_factor = 1,
  //                       high_freq_factor = 4, original_positions = 8192)
  if (const ast::Value *v = f.get("rope_scaling")) {
    static const StringRef params[] = {"factor", "low_freq_factor",
                                       "high_freq_factor",
                                       "original_positions"};
    if (v->kind != ast::Value::Kind::Call || v->name != "llama3") {
      auto diag = error(v->loc);
      diag << "'rope_scaling' expects llama3(...)";
      note(diag, v->loc,
           "write rope_scaling = llama3(factor = 8, low_freq_factor = 1, "
           "high_freq_factor = 4, original_positions = 8192)");
    } else {
      Args a(*this, *v, params);
      std::vector<double> r;
      for (StringRef p : params) {
        const ast::Value *x = a.get(p);
        if (!x) {
          if (!a.wasGuessed(p))
            error(v->loc) << "llama3(...) needs '" << p << "'";
          continue;
        }
        std::optional<double> value =
            p == "original_positions"
                ? std::optional<double>(
                      integer(*x, p, 1, int64_t(1) << 30).value_or(0))
                : real(*x, p, 0.0, 1e6, /*openLo=*/true);
        if (value)
          r.push_back(*value);
      }
      if (r.size() == 4 && !(r[2] > r[1]))
        error(v->loc) << "llama3(...): high_freq_factor (" << r[2]
                      << ") must exceed low_freq_factor (" << r[1] << ")";
      else if (r.size() == 4 && r[3] > 0)
        out.ropeScaling = r;
    }
  }
  if (const ast::Value *v = f.get("kv_heads")) {
    out.kvHeads = integer(*v, "kv_heads", limits::kHeads).value_or(1);
    if (out.heads > 0 && *out.kvHeads > 0 && out.heads % *out.kvHeads)
      error(v->loc) << "'kv_heads' = " << *out.kvHeads
                    << " does not divide 'heads' = " << out.heads;
  }
  if (const ast::Value *v = f.get("rope_theta"))
    out.ropeTheta =
        real(*v, "rope_theta", {0.0, 1e12, true, false}).value_or(1e4);
  if (const ast::Value *v = f.get("type_vocab")) {
    if (out.kind != BackboneKind::bert)
      error(v->loc) << "'type_vocab' is a bert backbone's";
    out.typeVocab = integer(*v, "type_vocab", {1, 1 << 20}).value_or(2);
  }
  if (out.kind == BackboneKind::bert && out.pointwise == PointwiseKind::fused)
    error(out.pointwiseLoc)
        << "pointwise fused: a post-norm (bert) backbone runs ATen's "
           "pointwise ops; use pointwise = aten, or leave it out";
  if (out.kind == BackboneKind::llama) {
    if (out.pointwise == PointwiseKind::fused)
      error(out.pointwiseLoc)
          << "pointwise fused: llama's RMSNorm and SwiGLU run on ATen's "
             "pointwise ops; use pointwise = aten, or leave it out";
    if (out.attention == AttentionKind::math)
      error(out.attentionLoc)
          << "attention math: llama runs the fused attention only";
    if (out.hidden > 0 && out.heads > 0 && (out.hidden / out.heads) % 2)
      error(f.locOf("heads")) << "rotary positions need an even head size; "
                              << out.hidden << " / " << out.heads << " is odd";
  }
  if (out.kind == BackboneKind::gpt2 && out.pointwise == PointwiseKind::fused)
    error(out.pointwiseLoc)
        << "pointwise fused computes GELU's erf form; gpt2's GELU is the "
           "tanh form (gelu_new): use pointwise = aten, or leave it out";
  if (out.hidden > 0 && out.heads > 0 && out.hidden % out.heads != 0) {
    auto diag = error(f.locOf("heads"));
    diag << "'heads' = " << out.heads << " does not divide 'hidden' = "
         << out.hidden;
    SmallVector<std::string> divisors;
    for (int64_t d = std::max<int64_t>(1, out.heads / 2);
         d <= out.heads * 2 && divisors.size() < 4; ++d)
      if (out.hidden % d == 0)
        divisors.push_back(std::to_string(d));
    if (!divisors.empty())
      note(diag, f.locOf("heads"),
           "head counts that divide " + std::to_string(out.hidden) +
               " nearby: " + llvm::join(divisors, ", "));
  }
}

void Sema::checkKernels(Fields &f, CheckedSpec::Backbone &out,
                        bool pretrained) {
  if (const ast::Value *v = f.get("attention")) {
    static const StringRef kinds[] = {"fused", "math"};
    if (std::optional<StringRef> k = choice(*v, "attention", kinds))
      out.attention = *symbolizeAttentionKind(*k);
    out.attentionLoc = v->loc;
  }
  if (const ast::Value *v = f.get("pointwise")) {
    static const StringRef all[] = {"fused", "aten"}, aten[] = {"aten"};
    if (std::optional<StringRef> k =
            choice(*v, "pointwise", pretrained ? ArrayRef<StringRef>(aten)
                                               : ArrayRef<StringRef>(all)))
      out.pointwise = *symbolizePointwiseKind(*k);
    out.pointwiseLoc = v->loc;
  }
}

/// freeze = none | embeddings | all | layers(first, last), 0 the embeddings.
void Sema::checkFreeze(Fields &f, CheckedSpec::Backbone &out) {
  const ast::Value *v = f.get("freeze");
  if (!v)
    return;
  out.freezeLoc = v->loc;
  const int64_t layers = out.layers;
  auto forms = [&](mlir::InFlightDiagnostic &diag) {
    note(diag, v->loc,
         "write freeze = embeddings, freeze = all, or freeze = layers(first, "
         "last) with 0 <= first <= last <= " +
             std::to_string(layers) + " (0: the embeddings)");
  };
  if (v->kind == ast::Value::Kind::Ident && !v->hasBlock) {
    if (v->name == "none")
      return;
    if (v->name == "embeddings") {
      out.freeze = {0, 0};
      return;
    }
    if (v->name == "all") {
      out.freeze = {0, layers};
      return;
    }
  }
  if (v->kind != ast::Value::Kind::Call || v->name != "layers" ||
      v->hasBlock) {
    auto diag = error(v->loc);
    diag << "'freeze' expects none, embeddings, all or layers(first, last), "
            "got "
         << v->kindName();
    if (!v->name.empty())
      diag << " '" << v->name << "'";
    forms(diag);
    return;
  }
  if (v->args.size() != 2 || !v->args[0].key.empty() ||
      !v->args[1].key.empty()) {
    auto diag = error(v->loc);
    diag << "layers(...) takes two positional layer numbers, the first and "
            "the last frozen layer";
    forms(diag);
    return;
  }
  std::optional<int64_t> first =
      integer(v->args[0].value, "first", 0, std::max<int64_t>(0, layers));
  std::optional<int64_t> last =
      integer(v->args[1].value, "last", 0, std::max<int64_t>(0, layers));
  if (!first || !last)
    return;
  if (*first > *last) {
    error(v->args[1].loc) << "layers(" << *first << ", " << *last
                          << "): the last frozen layer is below the first";
    return;
  }
  out.freeze = {*first, *last};
}

/// `backbone pretrained("DIR") { overrides }`: the family and dimensions
/// from DIR/config.json, the weights' names and shapes checked against them.
void Sema::checkPretrained(const ast::Backbone &bb, CheckedSpec::Backbone &out) {
  const ast::Value &call = *bb.source;
  if (call.name != "pretrained") {
    auto diag = error(bb.kindLoc);
    diag << "unknown backbone '" << call.name << "(...)'";
    note(diag, bb.kindLoc,
         "a pretrained backbone is written backbone pretrained(\"DIR\")");
    return;
  }
  if (call.args.size() != 1 || !call.args[0].key.empty() ||
      call.args[0].value.kind != ast::Value::Kind::String) {
    error(call.loc) << "pretrained takes one argument, the model directory "
                       "as a string: pretrained(\"models/gpt2\")";
    return;
  }
  const ast::Value &dirValue = call.args[0].value;
  // Relative to the spec's folder, as the data path is.
  llvm::SmallString<256> dir(dirValue.name);
  if (!llvm::sys::path::is_absolute(dir)) {
    llvm::SmallString<256> joined(
      llvm::sys::path::parent_path(file.getValue()));
    llvm::sys::path::append(joined, dir);
    dir = joined;
  }
  llvm::Expected<PretrainedConfig> config = readPretrainedConfig(dir);
  if (!config) {
    error(dirValue.loc) << llvm::toString(config.takeError());
    return;
  }
  const mtprt::ModelConfig &m = config->model;
  const bool llama = m.kind == mtprt::BackboneKind::Llama;
  const bool bert = m.kind == mtprt::BackboneKind::Bert;
  out.kind = llama  ? BackboneKind::llama
             : bert ? BackboneKind::bert
                    : BackboneKind::gpt2;
  if (m.tokenPad >= 0)
    out.tokenPad = m.tokenPad;
  if (bert) {
    out.typeVocab = m.typeVocab;
    if (m.positionPad >= 0)
      out.positionPad = m.positionPad;
  }
  if (llama) {
    out.kvHeads = m.kvHeadCount();
    out.ropeTheta = m.ropeTheta;
    if (m.ropeScaling.factor > 0)
      out.ropeScaling = std::vector<double>{
          m.ropeScaling.factor, m.ropeScaling.lowFreqFactor,
          m.ropeScaling.highFreqFactor,
          double(m.ropeScaling.originalPositions)};
    out.attentionBias = m.attentionBias;
    out.mlpBias = m.mlpBias;
  }
  out.layers = m.layers;
  out.hidden = m.hidden;
  out.heads = m.heads;
  out.ffn = m.ffn;
  out.vocab = m.vocab;
  out.positions = m.positions;
  out.normEps = m.normEps;
  out.weights = dirValue.name;
  out.dropout = config->dropout;
  // RoBERTa's positions start after its padding id.
  const int64_t usable =
      m.positions - (m.positionPad >= 0 ? m.positionPad + 1 : 0);
  out.seq = std::min<int64_t>(usable, 512);

  const std::string where = "backbone pretrained(...) { }";
  Fields f(*this, where, bb.entries, kBackboneKeys);
  for (auto [key, gpt2, llamaField] : kFixedByCheckpoint)
    if (const ast::Value *v = f.get(key)) {
      auto diag = error(v->loc);
      diag << "'" << key << "' is fixed by the checkpoint ("
           << (llama || bert ? llamaField : gpt2) << " in " << dirValue.name
           << "/config.json)";
      note(diag, v->loc, "a pretrained backbone overrides seq, dropout, "
                         "attention and pointwise, and takes freeze");
    }
  if (const ast::Value *v = f.get("seq")) {
    out.seq = integer(*v, "seq", limits::kSeq).value_or(out.seq);
    if (out.seq > usable)
      error(v->loc) << "'seq' = " << out.seq << " exceeds the checkpoint's "
                    << usable << " positions";
  }
  if (const ast::Value *v = f.get("dropout"))
    out.dropout = real(*v, "dropout", limits::kDropout).value_or(out.dropout);
  checkKernels(f, out, /*pretrained=*/true);
  checkFreeze(f, out);
  if (llvm::Error e = checkPretrainedWeights(dir, m))
    error(dirValue.loc) << llvm::toString(std::move(e));
}

//===----------------------------------------------------------------------===//
// Tasks
//===----------------------------------------------------------------------===//

void Sema::checkTasks(const ast::Model &model, CheckedSpec &spec) {
  if (model.tasks.empty()) {
    auto diag = error(model.nameLoc);
    diag << "model '" << model.name << "' has no tasks";
    note(diag, model.nameLoc,
         "add e.g. task sst : classify(classes = 2) from pooled");
  }
  int64_t layers = spec.backbone.layers;
  llvm::StringMap<Location> seen;
  static const StringRef heads[] = {"classify", "tag", "span", "decoder"};
  for (const ast::Task &t : model.tasks) {
    if (auto [it, inserted] = seen.try_emplace(t.name, t.nameLoc); !inserted) {
      auto diag = error(t.nameLoc);
      diag << "task '" << t.name << "' is defined twice";
      note(diag, it->second, "first defined here");
      continue;
    }
    if (t.name == "default") {
      error(t.nameLoc) << "'default' is reserved (it names the default "
                          "schedule in lr = per_task { }); rename the task";
      continue;
    }
    CheckedSpec::Task task;
    task.name = t.name;
    task.loc = t.loc;

    // Head kind and its parameters.
    const ast::Value &head = t.head;
    std::optional<HeadKind> kind = symbolizeHeadKind(head.name);
    if (!kind) {
      auto diag = error(head.loc);
      diag << "unknown head '" << head.name << "'";
      if (auto guess = closest(head.name, heads))
        diag << "; did you mean '" << *guess << "'?";
      else
        diag << "; the heads: " << joined(heads);
      continue;
    }
    task.head = *kind;
    switch (*kind) {
    case HeadKind::classify: {
      Args a(*this, head, {"classes"}, "classes");
      if (const ast::Value *v = a.get("classes"))
        task.classes = integer(*v, "classes", limits::kClasses);
      else if (!a.wasGuessed("classes"))
        error(head.loc) << "'classify' needs the number of classes, e.g. "
                           "classify(classes = 3)";
      break;
    }
    case HeadKind::tag: {
      Args a(*this, head, {"labels"}, "labels");
      if (const ast::Value *v = a.get("labels"))
        task.labels = integer(*v, "labels", limits::kLabels);
      else if (!a.wasGuessed("labels"))
        error(head.loc)
            << "'tag' needs the number of labels, e.g. tag(labels = 9)";
      break;
    }
    case HeadKind::span: {
      Args a(*this, head, {});
      break;
    }
    case HeadKind::decoder: {
      Args a(*this, head, {"layers", "vocab", "target_seq"});
      if (const ast::Value *v = a.get("layers"))
        task.layers = integer(*v, "layers", limits::kDecoderLayers);
      else if (!a.wasGuessed("layers"))
        error(head.loc) << "'decoder' needs its depth, e.g. decoder(layers = "
                           "6, vocab = 32000)";
      task.vocab = spec.backbone.vocab;
      if (const ast::Value *v = a.get("vocab"))
        task.vocab = integer(*v, "vocab", limits::kVocab);
      // Target tokens per sequence, teacher-forced; at most the backbone's.
      task.targetSeq = spec.backbone.seq;
      if (const ast::Value *v = a.get("target_seq"))
        task.targetSeq = integer(*v, "target_seq", 1,
                                 std::max<int64_t>(1, spec.backbone.seq));
      break;
    }
    }

    // Tap.
    task.pooled = *kind == HeadKind::classify;
    task.tapLayer = layers;
    for (size_t i = 1; i < t.taps.size(); ++i) {
      auto diag = error(t.taps[i].second);
      diag << "task '" << t.name << "' reads one layer";
      note(diag, t.taps[0].second, "first 'from' here");
    }
    if (!t.taps.empty()) {
      const ast::Tap &tap = t.taps.front().first;
      task.pooled = tap.kind == ast::Tap::Kind::Pooled;
      if (tap.kind == ast::Tap::Kind::Embeddings)
        task.tapLayer = 0;
      if (tap.layer) {
        const ast::Value &lv = *tap.layer;
        if (lv.kind == ast::Value::Kind::Number && lv.isInteger &&
            layers > 0 && (lv.integer < 0 || lv.integer > layers)) {
          auto diag = error(lv.loc);
          diag << "task '" << t.name << "' reads layer " << lv.spelling
               << ", but the backbone has " << layers << " layers";
          note(diag, spec.backbone.loc,
               "layers are 0 (embeddings) to " + std::to_string(layers) +
                   "; the backbone is declared here");
        } else if (layers > 0) {
          task.tapLayer =
              integer(lv, "layer", 0, layers).value_or(task.tapLayer);
        }
      }
      if (task.pooled && *kind != HeadKind::classify)
        error(tap.loc) << "only a 'classify' head reads a pooled tap; '"
                       << head.name << "' reads every token (use 'from layer "
                       << task.tapLayer << "')";
    }

    // Loss and weight.
    task.loss = *kind == HeadKind::classify && task.classes == 1
                    ? LossKind::mse
                    : LossKind::cross_entropy;
    for (size_t i = 1; i < t.losses.size(); ++i) {
      auto diag = error(t.losses[i].second);
      diag << "task '" << t.name << "' has one loss";
      note(diag, t.losses[0].second, "first 'loss' here");
    }
    if (!t.losses.empty()) {
      static const StringRef losses[] = {"cross_entropy", "mse"};
      ast::Value lossName;
      lossName.kind = ast::Value::Kind::Ident;
      lossName.name = t.losses[0].first;
      lossName.loc = t.losses[0].second;
      if (std::optional<StringRef> l = choice(lossName, "loss", losses)) {
        task.loss = *symbolizeLossKind(*l);
        if (task.loss == LossKind::mse && *kind != HeadKind::classify)
          error(lossName.loc) << "'mse' needs a 'classify' head (regression); '"
                              << head.name << "' predicts classes per token";
      }
    }
    task.weight = 1.0;
    for (size_t i = 1; i < t.weights.size(); ++i) {
      auto diag = error(t.weights[i].second);
      diag << "task '" << t.name << "' has one weight";
      note(diag, t.weights[0].second, "first 'weight' here");
    }
    if (!t.weights.empty())
      task.weight =
          real(t.weights[0].first, "weight", limits::kLossWeight).value_or(1.0);
    spec.tasks.push_back(std::move(task));
  }
}

//===----------------------------------------------------------------------===//
// Correlations
//===----------------------------------------------------------------------===//

void Sema::checkCorrelations(const ast::Model &model, CheckedSpec &spec) {
  SmallVector<StringRef> names;
  for (const ast::Task &t : model.tasks)
    if (!llvm::is_contained(names, t.name))
      names.push_back(t.name);
  std::map<std::pair<std::string, std::string>, Location> seen;
  for (const ast::Correlation &c : model.correlations) {
    bool ok = true;
    for (auto [name, l] : {std::pair{StringRef(c.a), c.aLoc}, {StringRef(c.b), c.bLoc}}) {
      if (llvm::is_contained(names, name))
        continue;
      ok = false;
      auto diag = error(l);
      diag << "unknown task '" << name << "'";
      if (auto guess = closest(name, names))
        diag << "; did you mean '" << *guess << "'?";
      note(diag, l,
           names.empty() ? std::string("no tasks are defined")
                         : "defined tasks: " + llvm::join(names, ", "));
    }
    if (ok && c.a == c.b) {
      error(c.bLoc) << "task '" << c.a
                    << "' is correlated with itself; name two distinct tasks";
      ok = false;
    }
    std::optional<double> value =
        real(c.value, "correlation", -1.0, 1.0);
    if (!ok || !value)
      continue;
    auto key = c.a < c.b ? std::make_pair(c.a, c.b) : std::make_pair(c.b, c.a);
    if (auto [it, inserted] = seen.try_emplace(key, c.loc); !inserted) {
      auto diag = error(c.loc);
      diag << "'" << c.a << "' and '" << c.b << "' are correlated twice";
      note(diag, it->second, "first given here");
      continue;
    }
    spec.correlations.push_back({c.a, c.b, *value, c.loc});
  }
}

//===----------------------------------------------------------------------===//
// Budget
//===----------------------------------------------------------------------===//

void Sema::checkBudget(const ast::Section *section, CheckedSpec &spec,
                       Location modelLoc) {
  auto &out = spec.budget;
  if (!section) {
    auto diag = error(modelLoc);
    diag << "model '" << spec.name << "' has no budget";
    note(diag, modelLoc,
         "add e.g. budget { device = A100_40GB  micro_batch = 8  precision = "
         "bf16 } (or device = cpu)");
    return;
  }
  out.loc = section->loc;
  Fields f(*this, "budget { }", section->entries, kBudgetKeys,
           kDeferredBudget);

  SmallVector<StringRef> presetNames;
  for (const DevicePreset &p : devicePresets())
    presetNames.push_back(p.name);
  const DevicePreset *preset = nullptr;
  if (const ast::Value *v = f.get("device")) {
    if (std::optional<StringRef> name = choice(*v, "device", presetNames)) {
      preset = lookupDevicePreset(*name);
      out.device = name->str();
    }
  } else if (f.get("memory")) {
    out.device = "custom";
  } else {
    error(section->loc) << "budget needs a 'device' (" << joined(presetNames)
                        << ") or an explicit 'memory'";
  }
  out.memory = preset ? preset->memoryBytes : 0;
  out.headroom = preset ? preset->headroomBytes : 0;
  out.link = preset ? preset->linkBandwidth : 32000000000;
  bool gpu = !preset || preset->isGpu;
  if (!preset && f.get("memory"))
    out.headroom = int64_t(2) << 30;
  if (const ast::Value *v = f.get("memory"))
    if (std::optional<int64_t> b = bytes(*v, "memory")) {
      if (*b <= 0)
        error(v->loc) << "'memory' must be positive";
      out.memory = *b;
    }
  if (const ast::Value *v = f.get("headroom"))
    out.headroom = bytes(*v, "headroom").value_or(out.headroom);
  if (const ast::Value *v = f.get("host_link"))
    out.link = bandwidth(*v, "host_link").value_or(out.link);
  if (const ast::Value *v = f.get("hbm_bandwidth"))
    out.hbm = bandwidth(*v, "hbm_bandwidth");
  if (const ast::Value *v = f.get("interconnect"))
    out.interconnect = bandwidth(*v, "interconnect");
  if (const ast::Value *v = f.get("peak_tflops"))
    if (std::optional<double> t = real(*v, "peak_tflops", 0.0, 1e6, true))
      out.peakFlops = *t * 1e12;
  if (out.memory > 0 && out.headroom >= out.memory) {
    Location l = f.get("headroom") ? f.locOf("headroom") : section->loc;
    error(l) << "headroom of " << out.headroom
             << " bytes leaves nothing of the device's " << out.memory
             << " bytes";
  }

  out.gpus = 1;
  if (const ast::Value *v = f.get("gpus"))
    out.gpus = integer(*v, "gpus", limits::kGpus).value_or(1);
  // On 'cpu', gpus counts data-parallel processes (the runtime's --nproc
  // ranks over gloo); the plan predicts one of them, exchange included.

  // ZeRO (docs/zero.md): 0 replicated; 1 the optimizer state sharded; 2 the
  // gradients too; auto the lowest stage whose plan fits (the planner's).
  if (const ast::Value *v = f.get("zero")) {
    out.zeroLoc = f.locOf("zero");
    if (v->kind == ast::Value::Kind::Ident && v->name == "auto") {
      out.zeroAuto = true;
    } else if (v->kind == ast::Value::Kind::Number) {
      out.zero = integer(*v, "zero", {0, 3}).value_or(0);
    } else {
      error(v->loc) << "'zero' expects 0, 1, 2, 3 or auto, got "
                    << describe(*v);
    }
  }

  // docs/pipeline.md: gpus = stages × data-parallel replicas; the batch
  // splits over the replicas.
  if (const ast::Value *v = f.get("pipeline")) {
    out.pipelineLoc = f.locOf("pipeline");
    // auto: the batch is set up as for data parallelism over every gpu,
    // which splits as evenly over the replicas of any divisor.
    if (v->kind == ast::Value::Kind::Ident && v->name == "auto")
      out.pipelineAuto = true;
    else if (v->kind == ast::Value::Kind::Number)
      out.pipeline =
          integer(*v, "pipeline", limits::kPipelineStages).value_or(1);
    else
      error(v->loc) << "'pipeline' expects a number of stages or auto, got "
                    << describe(*v);
    if (out.gpus % out.pipeline != 0) {
      auto diag = error(out.pipelineLoc);
      diag << "'pipeline' = " << out.pipeline << " does not divide gpus = "
           << out.gpus;
      note(diag, out.pipelineLoc,
           "gpus counts every process: pipeline stages x data-parallel "
           "replicas; use gpus = " +
               std::to_string(out.pipeline *
                              std::max<int64_t>(1, out.gpus / out.pipeline)));
      out.pipeline = 1;
    }
  }
  const int64_t replicas = out.gpus / out.pipeline;
  const char *perStepWhat = out.pipeline > 1 ? "replicas" : "gpus";

  std::optional<int64_t> micro, global, accumulation;
  if (const ast::Value *v = f.get("micro_batch"))
    micro = integer(*v, "micro_batch", limits::kMicroBatch);
  if (const ast::Value *v = f.get("global_batch"))
    global = integer(*v, "global_batch", limits::kGlobalBatch);
  if (const ast::Value *v = f.get("accumulation"))
    accumulation = integer(*v, "accumulation", limits::kAccumulation);
  int64_t perStep = micro.value_or(0) * replicas;
  if (!micro && !global) {
    micro = 8;
    perStep = 8 * replicas;
  } else if (!micro && global) {
    int64_t acc = accumulation.value_or(1);
    if (*global % (replicas * acc) != 0)
      error(f.locOf("global_batch"))
          << "'global_batch' = " << *global
          << " does not split evenly over " << perStepWhat
          << " x accumulation = "
          << replicas * acc;
    micro = std::max<int64_t>(1, *global / (replicas * acc));
    perStep = *micro * replicas;
  }
  out.microBatch = *micro;
  out.globalBatch = global.value_or(perStep * accumulation.value_or(1));
  if (global && micro && perStep > 0 && *global % perStep != 0) {
    auto diag = error(f.locOf("global_batch"));
    diag << "'global_batch' = " << *global
         << " is not a multiple of micro_batch x " << perStepWhat
         << " = " << perStep;
    note(diag, f.locOf("global_batch"),
         "use a global batch of " + std::to_string((*global / perStep + 1) * perStep) +
             " or a micro batch that divides it");
  }
  if (const std::optional<mtprt::BatchSchedule> &schedule =
          spec.strategy.dynamicBatch) {
    // The schedule sets each step's global batch; the plan is for the
    // largest it reaches (the most micro-batches per step).
    for (StringRef key : {"global_batch", "accumulation"})
      if (f.get(key)) {
        auto diag = error(f.locOf(key));
        diag << "'" << key << "' contradicts strategy { dynamic_batch }, "
             << "which sets the global batch of every step";
        note(diag, spec.strategy.dynamicBatchLoc,
             "the schedule is here; give micro_batch alone");
      }
    out.globalBatch = schedule->largestBatch(perStep);
  }
  if (accumulation && global && micro && perStep > 0 &&
      *global != perStep * *accumulation) {
    auto diag = error(f.locOf("accumulation"));
    diag << "'accumulation' = " << *accumulation
         << " contradicts global_batch / (micro_batch x " << perStepWhat
         << ") = " << *global
         << " / " << perStep;
    note(diag, f.locOf("accumulation"),
         "give two of global_batch, micro_batch and accumulation");
  }

  out.precision = Precision::fp32;
  if (const ast::Value *v = f.get("precision")) {
    static const StringRef precisions[] = {"fp32", "bf16", "fp16"};
    if (std::optional<StringRef> p = choice(*v, "precision", precisions))
      out.precision = *symbolizePrecision(*p);
    if (!gpu && out.precision == Precision::fp16)
      error(v->loc) << "fp16 needs a GPU (loss scaling); use bf16 or fp32 on "
                       "device 'cpu'";
  }
}

//===----------------------------------------------------------------------===//
// Strategy
//===----------------------------------------------------------------------===//

std::optional<Schedule> Sema::schedule(const ast::Value &v, StringRef what) {
  static const StringRef kinds[] = {"constant", "linear", "cosine"};
  if (v.kind != ast::Value::Kind::Call) {
    error(v.loc) << "'" << what
                 << "' expects a schedule such as cosine(3e-4, warmup = 500), "
                    "got "
                 << describe(v);
    return std::nullopt;
  }
  std::optional<ScheduleKind> kind = symbolizeScheduleKind(v.name);
  if (!kind) {
    auto diag = error(v.loc);
    diag << "unknown schedule '" << v.name << "'";
    if (auto guess = closest(v.name, kinds))
      diag << "; did you mean '" << *guess << "'?";
    else
      diag << "; the schedules: " << joined(kinds);
    return std::nullopt;
  }
  Args a(*this, v, {"peak", "warmup"}, "peak");
  Schedule s;
  s.kind = *kind;
  if (const ast::Value *p = a.get("peak")) {
    std::optional<double> peak = real(*p, "peak", limits::kLearningRate);
    if (!peak)
      return std::nullopt;
    s.peak = *peak;
  } else {
    error(v.loc) << "'" << v.name << "' needs its peak learning rate, e.g. "
                 << v.name << "(3e-4)";
    return std::nullopt;
  }
  if (const ast::Value *w = a.get("warmup")) {
    std::optional<int64_t> warmup = integer(*w, "warmup", limits::kWarmup);
    if (!warmup)
      return std::nullopt;
    s.warmup = *warmup;
  }
  return s;
}

void Sema::checkLr(const ast::Value &v, CheckedSpec &spec) {
  // lr = cosine(...)  or  lr = per_task { default = ...  mt = ... }
  if (v.kind == ast::Value::Kind::Ident && v.name == "per_task" &&
      v.hasBlock) {
    SmallVector<StringRef> keys{"default"};
    for (const CheckedSpec::Task &t : spec.tasks)
      keys.push_back(t.name);
    llvm::StringMap<Location> seen;
    for (const ast::Entry &e : v.entries) {
      if (auto [it, inserted] = seen.try_emplace(e.key, e.loc); !inserted) {
        auto diag = error(e.loc);
        diag << "'" << e.key << "' is given twice in lr = per_task { }";
        note(diag, it->second, "first given here");
        continue;
      }
      if (!llvm::is_contained(keys, e.key)) {
        auto diag = error(e.loc);
        diag << "unknown task '" << e.key << "' in lr = per_task { }";
        if (auto guess = closest(e.key, keys))
          diag << "; did you mean '" << *guess << "'?";
        note(diag, e.loc, "keys: default or a task: " +
                              joined(ArrayRef(keys).drop_front()));
        continue;
      }
      std::optional<Schedule> s = schedule(e.value, "lr");
      if (!s)
        continue;
      if (e.key == "default") {
        spec.train.lr = *s;
        trainLrLoc = e.loc;
        continue;
      }
      for (CheckedSpec::Task &t : spec.tasks)
        if (t.name == e.key) {
          t.lr = *s;
          taskLrLocs[t.name] = e.loc;
        }
    }
    return;
  }
  if (v.kind == ast::Value::Kind::Ident && v.name == "per_task") {
    error(v.loc) << "'per_task' needs a block: lr = per_task { default = "
                    "cosine(3e-4)  <task> = linear(1e-4) }";
    return;
  }
  if (std::optional<Schedule> s = schedule(v, "lr")) {
    spec.train.lr = *s;
    trainLrLoc = v.loc;
  }
}

void Sema::checkStrategy(const ast::Section *section, CheckedSpec &spec) {
  auto &out = spec.strategy;
  if (!section)
    return;
  out.loc = section->loc;
  Fields f(*this, "strategy { }", section->entries, kStrategyKeys,
           kDeferredStrategy);

  // checkpoint = auto | none | uniform(every = k) | task_granular(threshold = t)
  if (const ast::Value *v = f.get("checkpoint")) {
    static const StringRef policies[] = {"auto", "none", "uniform",
                                         "task_granular"};
    if (std::optional<StringRef> p = policy(*v, "checkpoint policy", policies)) {
      out.checkpoint = *symbolizeCheckpointPolicy(*p);
      if (v->kind == ast::Value::Kind::Call) {
        if (out.checkpoint == CheckpointPolicy::uniform) {
          Args a(*this, *v, {"every"}, "every");
          if (const ast::Value *e = a.get("every"))
            out.checkpointEvery =
                integer(*e, "every", 1, std::max<int64_t>(1, spec.backbone.layers))
                    .value_or(1);
        } else if (out.checkpoint == CheckpointPolicy::task_granular) {
          Args a(*this, *v, {"threshold"}, "threshold");
          if (const ast::Value *t = a.get("threshold"))
            out.groupThreshold =
                real(*t, "threshold", -1.0, 1.0).value_or(out.groupThreshold);
        } else {
          Args a(*this, *v, {});
        }
      }
    }
  }

  // pipeline_schedule = 1f1b | gpipe (docs/pipeline.md); 1f1b lexes as the
  // number 1 with the unit "f1b", and "1f1b" as a string is taken too.
  if (const ast::Value *v = f.get("pipeline_schedule")) {
    out.pipelineScheduleLoc = f.locOf("pipeline_schedule");
    std::string name;
    if (v->kind == ast::Value::Kind::String ||
        v->kind == ast::Value::Kind::Ident)
      name = v->name;
    else if (v->kind == ast::Value::Kind::Number)
      name = v->spelling + v->unit;
    if (name == "1f1b")
      out.gpipe = false;
    else if (name == "gpipe")
      out.gpipe = true;
    else
      error(v->loc) << "'pipeline_schedule' expects 1f1b or gpipe, got "
                    << describe(*v);
  }

  // optimizer_offload = none | cpu | auto (docs/zero.md)
  if (const ast::Value *v = f.get("optimizer_offload")) {
    static const StringRef where[] = {"none", "cpu", "auto"};
    out.optimizerOffloadLoc = f.locOf("optimizer_offload");
    if (std::optional<StringRef> p = choice(*v, "optimizer_offload", where)) {
      out.optimizerOffload = *p == "cpu";
      out.optimizerOffloadAuto = *p == "auto";
    }
  }

  // offload = auto | none | cpu_pinned(max_latency = 1.2ms)
  if (const ast::Value *v = f.get("offload")) {
    static const StringRef policies[] = {"auto", "none", "cpu_pinned"};
    if (std::optional<StringRef> p = policy(*v, "offload policy", policies)) {
      out.offload = *symbolizeOffloadPolicy(*p);
      if (v->kind == ast::Value::Kind::Call) {
        Args a(*this, *v,
               out.offload == OffloadPolicy::none
                   ? ArrayRef<StringRef>()
                   : ArrayRef<StringRef>({"max_latency"}));
        if (const ast::Value *l = a.get("max_latency"))
          if (std::optional<double> s = seconds(*l, "max_latency")) {
            if (*s <= 0)
              error(l->loc) << "'max_latency' must be positive";
            else
              out.maxOffloadLatency = *s;
          }
      }
    }
  }

  // gfm = none | { keep = 0.3 }
  if (const ast::Value *v = f.get("gfm")) {
    if (v->kind == ast::Value::Kind::Ident && !v->hasBlock && v->name == "none") {
      out.gfmKeep.reset();
    } else if (v->kind == ast::Value::Kind::Block) {
      Fields g(*this, "gfm = { }", v->entries, {"keep"});
      if (const ast::Value *k = g.get("keep"))
        out.gfmKeep = real(*k, "keep", limits::kGfmKeep).value_or(mtprt::defaults::kGfmKeep);
    } else {
      error(v->loc) << "'gfm' expects none or { keep = 0.3 }, got "
                    << describe(*v);
    }
  }

  // gradient_scope = features | params(layers = k)
  if (const ast::Value *v = f.get("gradient_scope")) {
    static const StringRef scopes[] = {"features", "params"};
    if (std::optional<StringRef> s = policy(*v, "gradient scope", scopes)) {
      out.scope = *symbolizeGradientScope(*s);
      if (v->kind == ast::Value::Kind::Call) {
        Args a(*this, *v,
               out.scope == GradientScope::params
                   ? ArrayRef<StringRef>({"layers"})
                   : ArrayRef<StringRef>(),
               "layers");
        if (const ast::Value *l = a.get("layers"))
          out.scopeLayers =
              integer(*l, "layers", 1,
                      std::max<int64_t>(1, spec.backbone.layers))
                  .value_or(1);
      }
    }
  }

  // dgfg = none | { hidden = 32  reuse_threshold = 0.15  std_threshold = 0.4 }
  if (const ast::Value *v = f.get("dgfg")) {
    if (v->kind == ast::Value::Kind::Ident && !v->hasBlock && v->name == "none") {
      out.dgfgHidden.reset();
    } else if (v->kind == ast::Value::Kind::Block) {
      Fields g(*this, "dgfg = { }", v->entries,
               {"hidden", "reuse_threshold", "std_threshold"});
      if (const ast::Value *h = g.get("hidden"))
        out.dgfgHidden = integer(*h, "hidden", limits::kDgfgHidden).value_or(mtprt::defaults::kGateHidden);
      if (const ast::Value *r = g.get("reuse_threshold"))
        out.reuseThreshold =
            real(*r, "reuse_threshold", limits::kRecalibration).value_or(out.reuseThreshold);
      if (const ast::Value *s = g.get("std_threshold"))
        out.simStdThreshold =
            real(*s, "std_threshold", limits::kRecalibration).value_or(out.simStdThreshold);
    } else {
      error(v->loc) << "'dgfg' expects none or { hidden = 32 }, got "
                    << describe(*v);
    }
  }

  // clip = none | per_task(max_norm = 1.0) | global(max_norm = 1.0)
  if (const ast::Value *v = f.get("clip")) {
    static const StringRef policies[] = {"none", "per_task", "global"};
    if (std::optional<StringRef> p = policy(*v, "clip policy", policies)) {
      out.clip = *symbolizeClipPolicy(*p);
      if (v->kind == ast::Value::Kind::Call) {
        Args a(*this, *v,
               out.clip == ClipPolicy::none ? ArrayRef<StringRef>()
                                            : ArrayRef<StringRef>({"max_norm"}),
               "max_norm");
        if (const ast::Value *m = a.get("max_norm"))
          out.clipMaxNorm =
              real(*m, "max_norm", limits::kClipNorm).value_or(out.clipMaxNorm);
      }
    }
  }

  if (const ast::Value *v = f.get("lr"))
    checkLr(*v, spec);

  // collective = auto | none | compressed(topk = 0.15, block = 256, bits = 8,
  //                                       residual = 0.8)
  if (const ast::Value *v = f.get("collective")) {
    static const StringRef policies[] = {"auto", "none", "compressed"};
    if (std::optional<StringRef> p = policy(*v, "collective", policies)) {
      out.collective = *symbolizeCollectivePolicy(*p);
      if (v->kind == ast::Value::Kind::Call) {
        Args a(*this, *v,
               out.collective == CollectivePolicy::none
                   ? ArrayRef<StringRef>()
                   : ArrayRef<StringRef>({"topk", "block", "bits", "residual"}));
        if (const ast::Value *t = a.get("topk"))
          out.topk = real(*t, "topk", limits::kTopK).value_or(out.topk);
        if (const ast::Value *b = a.get("block"))
          out.quantBlock = integer(*b, "block", limits::kQuantBlock).value_or(out.quantBlock);
        if (const ast::Value *b = a.get("bits")) {
          std::optional<int64_t> bits = integer(*b, "bits", 1, 64);
          if (bits && *bits != 2 && *bits != 4 && *bits != 8 && *bits != 16)
            error(b->loc) << "'bits' must be 2, 4, 8 or 16, got "
                          << b->spelling;
          else if (bits)
            out.quantBits = *bits;
        }
        if (const ast::Value *r = a.get("residual"))
          out.residualDecay = real(*r, "residual", limits::kResidualDecay).value_or(out.residualDecay);
      }
    }
  }

  // dynamic_batch = none | source | schedule(start = 32, max = 512,
  //   rate = 0.01, ramp = 2000, decay = 0.98, every = 500, floor = 32)
  if (const ast::Value *v = f.get("dynamic_batch")) {
    static const StringRef kinds[] = {"none", "source", "schedule"};
    std::optional<StringRef> k = policy(*v, "dynamic batch", kinds);
    if (k && *k != "none") {
      mtprt::BatchSchedule s; // the source's numbers
      out.dynamicBatchLoc = v->loc;
      if (*k == "schedule" && v->kind == ast::Value::Kind::Call) {
        Args a(*this, *v,
               {"start", "max", "rate", "ramp", "decay", "every", "floor"});
        if (const ast::Value *x = a.get("start"))
          s.start = integer(*x, "start", limits::kGlobalBatch).value_or(s.start);
        if (const ast::Value *x = a.get("max"))
          s.max = integer(*x, "max", limits::kGlobalBatch).value_or(s.max);
        if (const ast::Value *x = a.get("rate"))
          s.rate = real(*x, "rate", limits::kBatchRate).value_or(s.rate);
        if (const ast::Value *x = a.get("ramp"))
          s.rampSteps = integer(*x, "ramp", limits::kBatchSteps).value_or(s.rampSteps);
        if (const ast::Value *x = a.get("decay"))
          s.decay = real(*x, "decay", limits::kBatchDecay).value_or(s.decay);
        if (const ast::Value *x = a.get("every"))
          s.every = integer(*x, "every", limits::kBatchEvery).value_or(s.every);
        if (const ast::Value *x = a.get("floor"))
          s.floor = integer(*x, "floor", limits::kGlobalBatch).value_or(s.floor);
        if (const char *why = s.inconsistency())
          error(v->loc) << "dynamic_batch: " << why << " (start " << s.start
                        << ", max " << s.max << ", floor " << s.floor << ")";
      } else if (v->kind == ast::Value::Kind::Call) {
        Args a(*this, *v, {});
      }
      out.dynamicBatch = s;
    } else if (k && v->kind == ast::Value::Kind::Call) {
      Args a(*this, *v, {});
    }
  }

  // saps = none | source | top(fraction = 0.03, every = 1000, lambda = 1)
  if (const ast::Value *v = f.get("saps")) {
    static const StringRef kinds[] = {"none", "source", "top"};
    std::optional<StringRef> k = policy(*v, "saps", kinds);
    if (k && *k != "none") {
      mtprt::SapsConfig c; // the source's numbers
      out.sapsLoc = v->loc;
      if (*k == "top" && v->kind == ast::Value::Kind::Call) {
        Args a(*this, *v, {"fraction", "every", "lambda"});
        if (const ast::Value *x = a.get("fraction"))
          c.fraction = real(*x, "fraction", mtprt::limits::kSapsFraction)
                           .value_or(c.fraction);
        if (const ast::Value *x = a.get("every"))
          c.every = integer(*x, "every", mtprt::limits::kSapsEvery)
                        .value_or(c.every);
        if (const ast::Value *x = a.get("lambda"))
          c.lambda = real(*x, "lambda", mtprt::limits::kSapsLambda)
                         .value_or(c.lambda);
      } else if (v->kind == ast::Value::Kind::Call) {
        Args a(*this, *v, {});
      }
      out.saps = c;
    } else if (k && v->kind == ast::Value::Kind::Call) {
      Args a(*this, *v, {});
    }
  }

  // adapters = none | source |
  //            npd(bottleneck = r, separation = 0.1, share = T, regroup = N)
  if (const ast::Value *v = f.get("adapters")) {
    static const StringRef kinds[] = {"none", "source", "npd"};
    std::optional<StringRef> k = policy(*v, "adapters", kinds);
    if (k && *k != "none") {
      mtprt::AdapterConfig c; // bottleneck 0: about 0.1% of the backbone
      out.adaptersLoc = v->loc;
      if (*k == "npd" && v->kind == ast::Value::Kind::Call) {
        Args a(*this, *v, {"bottleneck", "separation", "share", "regroup"});
        if (const ast::Value *x = a.get("bottleneck"))
          c.bottleneck =
              integer(*x, "bottleneck", mtprt::limits::kAdapterBottleneck)
                  .value_or(c.bottleneck);
        if (const ast::Value *x = a.get("separation"))
          c.separation =
              real(*x, "separation", mtprt::limits::kAdapterSeparation)
                  .value_or(c.separation);
        if (const ast::Value *x = a.get("share"))
          c.share = real(*x, "share", mtprt::limits::kAdapterShare);
        if (const ast::Value *x = a.get("regroup")) {
          c.regroup = integer(*x, "regroup", mtprt::limits::kAdapterRegroup)
                          .value_or(0);
          // Only groups split: without share every task has its own.
          if (!a.get("share"))
            error(x->loc) << "adapters: 'regroup' splits the groups 'share' "
                             "forms: give share = T too (tasks whose "
                             "correlate reaches T start with one adapter)";
        }
      } else if (v->kind == ast::Value::Kind::Call) {
        Args a(*this, *v, {});
      }
      out.adapters = c;
    } else if (k && v->kind == ast::Value::Kind::Call) {
      Args a(*this, *v, {});
    }
  }

  // ewc = none | source | on(lambda = 1e4, batches = 8, threshold = T)
  if (const ast::Value *v = f.get("ewc")) {
    static const StringRef kinds[] = {"none", "source", "on"};
    std::optional<StringRef> k = policy(*v, "ewc", kinds);
    if (k && *k != "none") {
      mtprt::EwcConfig c; // the source's λ
      if (*k == "source")
        c.threshold = mtprt::EwcConfig::kSourceThreshold;
      out.ewcLoc = v->loc;
      if (*k == "on" && v->kind == ast::Value::Kind::Call) {
        Args a(*this, *v, {"lambda", "batches", "threshold"});
        if (const ast::Value *x = a.get("threshold"))
          c.threshold = real(*x, "threshold", mtprt::limits::kEwcThreshold)
                            .value_or(c.threshold);
        if (const ast::Value *x = a.get("lambda"))
          c.lambda = real(*x, "lambda", mtprt::limits::kEwcLambda)
                         .value_or(c.lambda);
        if (const ast::Value *x = a.get("batches"))
          c.fisherBatches = integer(*x, "batches", mtprt::limits::kEwcBatches)
                                .value_or(c.fisherBatches);
      } else if (v->kind == ast::Value::Kind::Call) {
        Args a(*this, *v, {});
      }
      out.ewc = c;
    } else if (k && v->kind == ast::Value::Kind::Call) {
      Args a(*this, *v, {});
    }
  }
}

//===----------------------------------------------------------------------===//
// Train
//===----------------------------------------------------------------------===//

void Sema::checkTrain(const ast::Section *section, CheckedSpec &spec) {
  auto &out = spec.train;
  if (!section)
    return;
  out.loc = section->loc;
  Fields f(*this, "train { }", section->entries, kTrainKeys);
  if (const ast::Value *v = f.get("steps"))
    out.steps = integer(*v, "steps", limits::kSteps).value_or(out.steps);
  if (const ast::Value *v = f.get("seed"))
    out.seed = integer(*v, "seed", 0, INT64_MAX).value_or(0);
  // phases = sequence(phase(a, b, steps = 200), phase(c, steps = 200)):
  // the tasks trained in each stretch of steps, in order.
  if (const ast::Value *v = f.get("phases")) {
    out.phasesLoc = v->loc;
    if (v->kind != ast::Value::Kind::Call || v->name != "sequence" ||
        v->args.empty()) {
      error(v->loc) << "'phases' expects sequence(phase(TASK, ..., steps = N), "
                       "...), e.g. phases = sequence(phase(a, steps = 200), "
                       "phase(b, steps = 200))";
    } else {
      int64_t total = 0;
      for (const ast::Arg &arg : v->args) {
        const ast::Value &p = arg.value;
        if (!arg.key.empty() || p.kind != ast::Value::Kind::Call ||
            p.name != "phase") {
          error(arg.loc) << "each phase is phase(TASK, ..., steps = N)";
          continue;
        }
        CheckedSpec::Phase phase;
        phase.loc = p.loc;
        for (const ast::Arg &pa : p.args) {
          if (pa.key == "steps") {
            phase.steps =
                integer(pa.value, "steps", limits::kSteps).value_or(0);
            continue;
          }
          if (!pa.key.empty()) {
            error(pa.loc) << "'phase' has no parameter '" << pa.key
                          << "'; name its tasks and give steps = N";
            continue;
          }
          if (pa.value.kind != ast::Value::Kind::Ident) {
            error(pa.loc) << "a phase names its tasks, e.g. phase(a, b, "
                             "steps = 200)";
            continue;
          }
          const std::string &name = pa.value.name;
          auto known = llvm::find_if(spec.tasks, [&](const auto &t) {
            return t.name == name;
          });
          if (known == spec.tasks.end()) {
            auto diag = error(pa.loc);
            diag << "no task '" << name << "' in this model";
            std::vector<StringRef> names;
            for (const auto &t : spec.tasks)
              names.push_back(t.name);
            if (std::optional<StringRef> guess = closest(name, names))
              diag << "; did you mean '" << *guess << "'?";
            continue;
          }
          if (llvm::is_contained(phase.tasks, name)) {
            error(pa.loc) << "task '" << name << "' is named twice in this "
                                                 "phase";
            continue;
          }
          phase.tasks.push_back(name);
        }
        if (phase.tasks.empty())
          error(p.loc) << "a phase trains at least one task";
        if (!phase.steps)
          error(p.loc) << "a phase needs its steps = N";
        total += phase.steps;
        out.phases.push_back(std::move(phase));
      }
      if (const ast::Value *s = f.get("steps"); s && total != out.steps) {
        auto diag = error(s->loc);
        diag << "'steps' = " << out.steps << " but the phases take " << total;
        note(diag, v->loc, "give steps = " + std::to_string(total) +
                               ", or leave it out");
      }
      out.steps = total;
      for (const auto &t : spec.tasks)
        if (llvm::none_of(out.phases, [&](const CheckedSpec::Phase &p) {
              return llvm::is_contained(p.tasks, t.name);
            }))
          warning(v->loc, "task '" + t.name + "' is in no phase: it is "
                                              "never trained");
    }
  }
  if (const ast::Value *v = f.get("data")) {
    if (v->kind == ast::Value::Kind::String) {
      if (v->name.empty())
        error(v->loc) << "'data' path is empty";
      else
        out.dataPath = v->name;
      out.dataLoc = v->loc;
    } else if (v->kind != ast::Value::Kind::Ident || v->hasBlock ||
               v->name != "synthetic") {
      error(v->loc) << "'data' expects synthetic or a path in quotes, e.g. "
                       "data = \"data/glue\"; got "
                    << describe(*v);
    }
  }
  if (const ast::Value *v = f.get("eval")) {
    if (v->kind != ast::Value::Kind::String || v->name.empty())
      error(v->loc) << "'eval' expects the held-out data's path in quotes "
                       "(a shard from mtpc prepare), e.g. eval = "
                       "\"data/dev.shard\"; got "
                    << describe(*v);
    else {
      out.evalPath = v->name;
      out.evalLoc = v->loc;
    }
  }
  if (const ast::Value *v = f.get("eval_every")) {
    out.evalEvery =
        integer(*v, "eval_every", 0, limits::kSteps.hi).value_or(0);
    if (!f.get("eval"))
      error(v->loc) << "'eval_every' needs eval = \"PATH\" (the held-out "
                       "data)";
  }
  if (const ast::Value *v = f.get("optimizer")) {
    if ((v->kind == ast::Value::Kind::Ident || v->kind == ast::Value::Kind::Call) &&
        v->name == "adamw") {
      if (v->kind == ast::Value::Kind::Call) {
        Args a(*this, *v, {"weight_decay", "beta1", "beta2", "eps"});
        if (const ast::Value *x = a.get("weight_decay"))
          out.weightDecay = real(*x, "weight_decay", limits::kWeightDecay).value_or(out.weightDecay);
        if (const ast::Value *x = a.get("beta1"))
          out.beta1 = real(*x, "beta1", limits::kBeta).value_or(out.beta1);
        if (const ast::Value *x = a.get("beta2"))
          out.beta2 = real(*x, "beta2", limits::kBeta).value_or(out.beta2);
        if (const ast::Value *x = a.get("eps"))
          out.eps = real(*x, "eps", limits::kEps).value_or(out.eps);
      }
    } else {
      auto diag = error(v->loc);
      diag << "unknown optimizer " << describe(*v);
      static const StringRef optimizers[] = {"adamw"};
      if (auto guess = closest(v->name, optimizers))
        diag << "; did you mean '" << *guess << "'?";
      else
        diag << "; the optimizer is adamw(weight_decay = 0.01)";
    }
  }
  if (const ast::Value *v = f.get("log_every"))
    out.logEvery = integer(*v, "log_every", 1, INT64_MAX).value_or(out.logEvery);
  if (const ast::Value *v = f.get("save_every"))
    out.saveEvery = integer(*v, "save_every", 0, INT64_MAX).value_or(0);
}

//===----------------------------------------------------------------------===//
// Knobs that contradict each other
//===----------------------------------------------------------------------===//

void Sema::crossChecks(CheckedSpec &spec) {
  const auto &train = spec.train;
  const auto &bb = spec.backbone;
  const DevicePreset *preset = lookupDevicePreset(spec.budget.device);
  if (bb.attention == AttentionKind::fused &&
      !fusedAttentionServes(!preset || preset->isGpu, bb.dropout)) {
    auto diag = error(bb.attentionLoc);
    diag << "attention = fused needs dropout = 0 on device '"
         << spec.budget.device << "': the fused CPU kernel has no dropout";
    note(diag, bb.attentionLoc,
         "set dropout = 0, or write attention = math (or leave attention out: "
         "mtpc then picks)");
  }
  if (bb.pointwise == PointwiseKind::fused &&
      !fusedPointwiseServes(spec.budget.precision != Precision::fp32)) {
    auto diag = error(bb.pointwiseLoc);
    diag << "pointwise = fused needs precision = fp32: the fused norm and "
            "GELU kernels do not run under autocast";
    note(diag, bb.pointwiseLoc,
         "write pointwise = aten (or leave pointwise out: mtpc then picks)");
  }
  auto warmupCheck = [&](const Schedule &s, Location l, StringRef who) {
    if (s.warmup > train.steps)
      error(l) << "the warm-up of " << s.warmup << " steps for " << who
               << " exceeds the " << train.steps << " training steps";
  };
  warmupCheck(train.lr, trainLrLoc.line ? trainLrLoc : spec.strategy.loc,
              "the backbone");
  for (const CheckedSpec::Task &t : spec.tasks)
    if (auto it = taskLrLocs.find(t.name); it != taskLrLocs.end())
      warmupCheck(t.lr, it->second, "task '" + t.name + "'");

  const auto &s = spec.strategy;
  if (bb.freeze && s.scope == GradientScope::params &&
      bb.freeze->second > bb.layers - s.scopeLayers) {
    auto diag = error(bb.freezeLoc);
    diag << "freeze keeps layer " << bb.freeze->second
         << " frozen, but gradient_scope = params(layers = " << s.scopeLayers
         << ") takes per-task gradients of layers "
         << bb.layers - s.scopeLayers + 1 << ".." << bb.layers;
    note(diag, s.loc,
         "freeze fewer layers, or use gradient_scope = features");
  }
  if (s.ewc) {
    if (spec.train.phases.size() < 2) {
      auto diag = error(s.ewcLoc);
      diag << "ewc protects what earlier phases learned: it needs train { "
              "phases = sequence(...) } with two phases or more";
      note(diag, s.ewcLoc, "e.g. phases = sequence(phase(a, steps = 200), "
                           "phase(b, steps = 200))");
    }
    if (s.saps)
      error(s.ewcLoc) << "ewc with saps is not yet supported: the penalty's "
                         "gradient is dense and saps folds the backbone's "
                         "away";
    if (bb.freeze && bb.freeze->first == 0 && bb.freeze->second == bb.layers)
      warning(s.ewcLoc, "ewc has no effect: freeze keeps the whole backbone "
                        "frozen, and ewc protects only the trainable "
                        "backbone");
  }
  if (s.adapters && s.adapters->share &&
      llvm::none_of(spec.correlations, [&](const CheckedSpec::Correlation &c) {
        return c.value >= *s.adapters->share;
      }))
    warning(s.adaptersLoc,
            "adapters: no correlate pair reaches share = " +
                llvm::Twine(llvm::formatv("{0}", llvm::format(
                                                     "%g", *s.adapters->share))
                                .str()) +
                ": every task keeps its own adapter; write correlate A ~ B "
                "= R with R at or above it");
  if (s.adapters && s.adapters->bottleneck > bb.hidden)
    error(s.adaptersLoc) << "adapters: bottleneck " << s.adapters->bottleneck
                         << " is wider than the hidden size (" << bb.hidden
                         << "); an adapter narrows it";
  if (s.saps) {
    if (s.scope == GradientScope::params) {
      auto diag = error(s.sapsLoc);
      diag << "saps folds the backbone's gradients as autograd makes them; "
              "gradient_scope = params fuses its top layers' after the "
              "backward";
      note(diag, s.loc, "use gradient_scope = features with saps");
    }
    if (spec.budget.gpus > 1 && s.collective == CollectivePolicy::compressed)
      error(s.sapsLoc)
          << "saps with collective = compressed: the ranks exchange the "
             "selected entries uncompressed (GSC's residual is per value); "
             "write collective = none or auto";
    if (bb.freeze && bb.freeze->first == 0 && bb.freeze->second == bb.layers)
      warning(s.sapsLoc, "saps has no effect: freeze keeps the whole backbone "
                         "frozen, and saps updates only the backbone");
  }
  if (s.dgfgHidden && !spec.tasks.empty()) {
    int64_t tasks = spec.tasks.size();
    int64_t params = dgfgParameterCount(tasks, *s.dgfgHidden);
    if (params >= kDgfgMaxParameters)
      error(s.loc) << "the DGFG gate (hidden = " << *s.dgfgHidden << ", "
                   << tasks << " tasks) would have " << params
                   << " parameters; it must stay under " << kDgfgMaxParameters
                   << " (lower dgfg = { hidden = ... })";
  }
  const auto &bu = spec.budget;
  if ((s.optimizerOffload || s.optimizerOffloadAuto) && (s.saps || s.ewc))
    error(s.optimizerOffloadLoc)
        << "optimizer_offload with " << (s.saps ? "saps" : "ewc")
        << " is not supported: their state stays on the device";
  if (s.adapters && s.adapters->regroup &&
      (bu.zero || bu.zeroAuto || s.optimizerOffload || s.optimizerOffloadAuto))
    error(s.adaptersLoc)
        << "adapters regroup with "
        << (bu.zero || bu.zeroAuto ? "zero" : "optimizer_offload")
        << " is not supported: a split adds parameters to a task's optimizer "
           "state, whose "
        << (bu.zero || bu.zeroAuto ? "sharded" : "host") << " layout is fixed "
        << "when training starts; drop regroup (the groups stay as share "
           "forms them)";
  if (bu.zero || bu.zeroAuto) {
    const std::string z = bu.zeroAuto ? "auto" : std::to_string(bu.zero);
    if (s.saps || s.ewc)
      error(bu.zeroLoc) << "zero = " << z << " with "
                        << (s.saps ? "saps" : "ewc")
                        << " is not supported: their state is not sharded";
    else if (bu.gpus == 1)
      warning(bu.zeroLoc, "zero = " + z + " has no effect with gpus = 1: "
                          "one process holds every shard");
    if (bu.zero == 3 && s.scope == GradientScope::params)
      error(bu.zeroLoc)
          << "zero = 3 with gradient_scope = params is not supported: each "
             "task's backward through the top layers would gather their "
             "parameters again; use features or sum, or zero = 2";
    if (bu.zero == 3 && s.offload == OffloadPolicy::cpu_pinned)
      error(bu.zeroLoc)
          << "zero = 3 with offload = cpu_pinned is not supported: the "
             "offloaded blocks' saved tensors would hold their gathered "
             "parameters; write offload = none (or auto, which plans none), "
             "or zero = 2";
    if (bu.zero >= 2 && s.collective == CollectivePolicy::compressed)
      error(bu.zeroLoc)
          << "zero = " << bu.zero << " sums the gradients uncompressed as the backward makes them; "
             "collective = compressed needs every rank's whole gradient "
             "(its error feedback): use zero = 1 with compression, or "
             "collective = none";
  }
  // docs/pipeline.md: what a stage runs today; the rest is refused by name.
  if (bu.pipelineAuto && bu.gpus == 1)
    warning(bu.pipelineLoc, "pipeline = auto has nothing to choose with "
                            "gpus = 1: one process holds every stage");
  if (bu.pipeline > 1 || bu.pipelineAuto) {
    const int64_t units = 2 * spec.backbone.layers + 1;
    const std::string stages =
        bu.pipelineAuto ? "auto" : std::to_string(bu.pipeline);
    auto refuse = [&](const char *what, const char *why) {
      error(bu.pipelineLoc) << "pipeline = " << stages << " with " << what
                            << " is not supported yet: " << why
                            << " (docs/pipeline.md)";
    };
    if (bu.pipeline > units)
      error(bu.pipelineLoc)
          << "pipeline = " << bu.pipeline << " stages for "
          << spec.backbone.layers << " layers: a stage needs one unit at least ("
          << units << " units: the embeddings, each layer's attention and MLP)";
    if (s.scope == GradientScope::params)
      refuse("gradient_scope = params",
             "its top-k layers' gradients span stages; use features or sum");
    if (bu.zero || bu.zeroAuto)
      refuse("zero", "each stage's optimizer state is not sharded over its "
                     "replicas");
    if (s.optimizerOffload || s.optimizerOffloadAuto)
      refuse("optimizer_offload", "a stage keeps its optimizer state");
    if (s.saps || s.ewc || s.adapters || s.dynamicBatch)
      refuse(s.saps     ? "saps"
             : s.ewc    ? "ewc"
             : s.adapters ? "adapters"
                        : "dynamic_batch",
             "a stage runs the plain per-task pipeline (GFM, clip, DGFG)");
    if (!train.phases.empty())
      refuse("train { phases }", "a stage trains every task at every step");
    if (s.checkpoint != CheckpointPolicy::none &&
        s.checkpoint != CheckpointPolicy::automatic)
      refuse("checkpoint", "a stage keeps its activations, or with "
                           "checkpoint = auto recomputes blocks until it "
                           "fits (write none or auto)");
    if (s.offload != OffloadPolicy::none &&
        s.offload != OffloadPolicy::automatic)
      refuse("offload", "a stage keeps its activations on the device, or "
                        "with offload = auto offloads blocks until it fits "
                        "(write none or auto)");
  } else if (s.pipelineScheduleLoc.line != 0) {
    warning(s.pipelineScheduleLoc,
            "pipeline_schedule has no effect without budget { pipeline = 2 "
            "or more }");
  }
  if (s.collective == CollectivePolicy::compressed && spec.budget.gpus == 1)
    warning(s.loc, "collective = compressed has no effect with gpus = 1: "
                   "there is nothing to exchange");
  // Only where the user wrote a strategy: the default gate is no mistake.
  if (s.dgfgHidden && spec.tasks.size() == 1 && s.loc.line != 0)
    warning(s.loc, "dgfg has nothing to weigh with a single task");
}

std::optional<CheckedSpec> Sema::run(const ast::Model &model) {
  CheckedSpec spec;
  spec.name = model.name;
  spec.loc = model.loc;
  spec.train.lr = Schedule();
  try {
    const ast::Section *budget = nullptr, *strategy = nullptr,
                       *train = nullptr;
    for (const ast::Section &section : model.sections) {
      const ast::Section **slot = section.name == "budget"     ? &budget
                                  : section.name == "strategy" ? &strategy
                                  : section.name == "train"    ? &train
                                                               : nullptr;
      if (!slot) {
        auto diag = error(section.loc);
        diag << "unknown section '" << section.name << "'";
        if (auto guess = closest(section.name, kSections))
          diag << "; did you mean '" << *guess << "'?";
        else
          diag << "; sections: budget, strategy, train";
        continue;
      }
      if (*slot) {
        auto diag = error(section.loc);
        diag << "'" << section.name << "' is given twice";
        note(diag, (*slot)->loc, "first given here");
        continue;
      }
      *slot = &section;
    }
    checkBackbone(model, spec);
    checkTasks(model, spec);
    // Heads follow the backbone's schedule unless lr says otherwise.
    checkTrain(train, spec);
    checkStrategy(strategy, spec);
    for (CheckedSpec::Task &t : spec.tasks)
      if (!taskLrLocs.count(t.name))
        t.lr = spec.train.lr;
    checkCorrelations(model, spec);
    checkBudget(budget, spec, model.nameLoc);
    if (errors == 0)
      crossChecks(spec);
  } catch (const TooManyErrors &) {
    return std::nullopt;
  }
  if (errors > 0)
    return std::nullopt;
  return spec;
}

} // namespace

std::optional<CheckedSpec> mtp::checkSpec(const ast::Model &model,
                                          StringRef filename,
                                          mlir::MLIRContext *context,
                                          unsigned maxErrors) {
  // Sema checks section by section; users read a file top to bottom. Hold
  // the diagnostics back and emit them in source order (the cap last).
  std::vector<mlir::Diagnostic> held;
  std::optional<CheckedSpec> result;
  {
    mlir::ScopedDiagnosticHandler hold(context, [&](mlir::Diagnostic &diag) {
      held.push_back(std::move(diag));
      return mlir::success();
    });
    // Search ranges are mtpc search's: each is refused here, and the rest is
    // checked with its first value so that no other error follows from it.
    ast::Model clean = model;
    bool ranged = false;
    for (const ast::RangeSite &site : ast::searchRanges(clean)) {
      ranged = true;
      auto at = mlir::FileLineColLoc::get(context, filename,
                                          site.value->loc.line,
                                          site.value->loc.col);
      if (site.value->kind == ast::Value::Kind::Call) {
        mlir::emitError(at)
            << "'one_of(...)' is a search choice (" << site.where
            << "): `mtpc search` picks one of its alternatives; check, plan "
               "and build need one written";
        if (!site.value->args.empty()) {
          ast::Value first = site.value->args.front().value;
          *site.value = std::move(first);
        }
        continue;
      }
      mlir::emitError(at)
          << "'" << site.value->spelling << "' is a search range ("
          << site.where << "): `mtpc search` picks one of its values; check, "
          << "plan and build need one written";
      site.value->kind = ast::Value::Kind::Number;
      site.value->spelling = std::to_string(site.value->integer);
    }
    result = Sema(filename, context, maxErrors).run(clean);
    if (ranged)
      result.reset();
  }
  auto key = [](const mlir::Diagnostic &diag) {
    if (StringRef(diag.str()).starts_with("too many errors"))
      return std::make_pair(~0u, ~0u);
    auto loc = llvm::dyn_cast<mlir::FileLineColLoc>(diag.getLocation());
    return loc ? std::make_pair(loc.getLine(), loc.getColumn())
               : std::make_pair(0u, 0u);
  };
  std::stable_sort(held.begin(), held.end(),
                   [&](const mlir::Diagnostic &a, const mlir::Diagnostic &b) {
                     return key(a) < key(b);
                   });
  for (mlir::Diagnostic &diag : held)
    context->getDiagEngine().emit(std::move(diag));
  return result;
}
