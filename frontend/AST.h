//===- AST.h - the .mtp abstract syntax tree --------------------*- C++ -*-===//
//
// What the parser read, with a location on every node and nothing checked
// yet: Sema decides what the keys mean. Plain C++: no ANTLR type leaks out of
// frontend/Parser.cpp.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_FRONTEND_AST_H
#define MTPC_FRONTEND_AST_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mtp::ast {

/// 1-based line and column in the spec file.
struct Location {
  unsigned line = 0, col = 0;
};

struct Entry;
struct Arg;

/// A value on the right of `key =`, or an argument.
struct Value {
  enum class Kind { Number, String, Ident, Call, Block, Range };
  Kind kind = Kind::Ident;
  Location loc;
  /// Number: its value, whether it was written as an integer, its spelling,
  /// and its unit (`GiB`, `ms`, `GB/s`; empty when none).
  double number = 0;
  bool isInteger = false;
  int64_t integer = 0;
  std::string spelling;
  std::string unit;
  Location unitLoc;
  /// Range (a search range, `lo..hi by step`): `integer` is lo; `spelling`
  /// its text; `end` the column just after it (on loc's line).
  int64_t rangeHi = 0, rangeStep = 1;
  Location end;
  /// An alternative of `one_of(...)` (a search choice; the call's `end` is
  /// set): its source text as written.
  std::string source;
  /// String contents, identifier, or call name.
  std::string name;
  /// Call arguments.
  std::vector<Arg> args;
  /// Block entries (a block value, or the block after an ident / call).
  std::vector<Entry> entries;
  bool hasBlock = false;

  llvm::StringRef kindName() const;
};

struct Entry {
  std::string key;
  Location loc;
  Value value;
};

struct Arg {
  /// Empty for a positional argument.
  std::string key;
  Location loc;
  Value value;
};

struct Tap {
  enum class Kind { Layer, Pooled, Embeddings };
  Kind kind = Kind::Layer;
  /// The layer as written (a number, checked by Sema), if any.
  std::optional<Value> layer;
  Location loc;
};

struct Task {
  std::string name;
  Location loc, nameLoc;
  /// The head, as a call: `classify(classes = 3)`.
  Value head;
  /// Clauses in source order; Sema reports repeats.
  std::vector<std::pair<Tap, Location>> taps;
  std::vector<std::pair<std::string, Location>> losses;
  std::vector<std::pair<Value, Location>> weights;
};

struct Correlation {
  std::string a, b;
  Location loc, aLoc, bLoc;
  Value value;
};

struct Backbone {
  /// The kind (`transformer`, `gpt2`), or the call's name (`pretrained`).
  std::string kind;
  Location loc, kindLoc;
  std::vector<Entry> entries;
  /// `backbone pretrained("DIR")`: the call, with its arguments.
  std::optional<Value> source;
};

/// `budget { ... }`, `strategy { ... }`, `train { ... }` or an unknown name.
struct Section {
  std::string name;
  Location loc;
  std::vector<Entry> entries;
};

struct Model {
  std::string name;
  Location loc, nameLoc;
  std::vector<Backbone> backbones;
  std::vector<Task> tasks;
  std::vector<Correlation> correlations;
  std::vector<Section> sections;
};

/// A search range (`lo..hi by step`) in a spec, and where: `backbone.layers`,
/// `budget.micro_batch`, `task pos: from layer`, `task mt: decoder.layers`.
struct RangeSite {
  Value *value;
  std::string where;
};
/// Every search range and search choice (`one_of(A, B, ...)`) in `model`,
/// in source order (mtpc search; Sema refuses them).
std::vector<RangeSite> searchRanges(Model &model);

/// `--emit=ast`: an indented tree with locations.
void dump(const Model &model, llvm::raw_ostream &os);

} // namespace mtp::ast

#endif // MTPC_FRONTEND_AST_H
