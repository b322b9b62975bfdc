//===- Parser.cpp - .mtp text to AST --------------------------------------===//
//
// Three stages: byte-level guards (size, UTF-8, nesting depth), the ANTLR
// parse with an error listener that turns ANTLR's messages into located MLIR
// diagnostics, and a walk of the parse tree into the AST. ANTLR types stay in
// this file; ANTLR exceptions never leave it.
//
//===----------------------------------------------------------------------===//

#include "frontend/Parser.h"

#include "MtpLexer.h"
#include "MtpParser.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Location.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/ConvertUTF.h"
#include "llvm/Support/SourceMgr.h"

#include <antlr4-runtime.h>

#include <algorithm>
#include <mutex>
#include <cmath>

using namespace mtp;
using namespace mtpgrammar;
using llvm::StringRef;

namespace {

/// Thrown by the error listener once the error cap is reached; caught in
/// parseSpec.
struct TooManyErrors {};

/// Maps positions in the buffer to MLIR locations and counts errors.
class Reporter {
public:
  Reporter(llvm::SourceMgr &sourceMgr, mlir::MLIRContext *context,
           unsigned maxErrors)
      : context(context), maxErrors(maxErrors) {
    const llvm::MemoryBuffer *buffer =
        sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID());
    text = buffer->getBuffer();
    filename = mlir::StringAttr::get(context, buffer->getBufferIdentifier());
  }

  mlir::Location loc(ast::Location l) const {
    return mlir::FileLineColLoc::get(filename, l.line, l.col);
  }

  /// ANTLR counts columns in code points from 0; MLIR's caret counts bytes
  /// from 1.
  ast::Location fromAntlr(size_t line, size_t codePointCol) const {
    StringRef lineText = lineAt(line);
    size_t byte = 0;
    for (size_t cp = 0; cp < codePointCol && byte < lineText.size(); ++cp) {
      ++byte;
      while (byte < lineText.size() && (lineText[byte] & 0xC0) == 0x80)
        ++byte;
    }
    return {static_cast<unsigned>(line), static_cast<unsigned>(byte + 1)};
  }

  ast::Location fromOffset(size_t offset) const {
    StringRef before = text.take_front(offset);
    unsigned line = 1 + before.count('\n');
    size_t lineStart = before.rfind('\n');
    lineStart = lineStart == StringRef::npos ? 0 : lineStart + 1;
    return {line, static_cast<unsigned>(offset - lineStart + 1)};
  }

  mlir::InFlightDiagnostic error(ast::Location l) {
    ++errors;
    return mlir::emitError(loc(l));
  }

  /// Reports one more error unless the cap is reached; throws at the cap.
  void syntaxError(ast::Location l, const llvm::Twine &message) {
    if (errors >= maxErrors) {
      mlir::emitError(loc(l)) << "too many errors (" << maxErrors
                              << "); stopping here";
      throw TooManyErrors();
    }
    error(l) << message;
  }

  unsigned errorCount() const { return errors; }
  StringRef getText() const { return text; }

private:
  StringRef lineAt(size_t line) const {
    StringRef rest = text;
    for (size_t i = 1; i < line && !rest.empty(); ++i)
      rest = rest.split('\n').second;
    return rest.split('\n').first;
  }

  mlir::MLIRContext *context;
  mlir::StringAttr filename;
  StringRef text;
  unsigned maxErrors;
  unsigned errors = 0;
};

//===----------------------------------------------------------------------===//
// Byte-level guards
//===----------------------------------------------------------------------===//

bool checkBytes(Reporter &reporter, const ParseLimits &limits) {
  StringRef text = reporter.getText();
  if (text.size() > limits.maxBytes) {
    // Line 0: no source line echoed (it may be megabytes long).
    reporter.error({0, 0}) << "file is " << text.size()
                           << " bytes; a spec may be at most "
                           << limits.maxBytes << " bytes";
    return false;
  }
  const auto *begin = reinterpret_cast<const llvm::UTF8 *>(text.data());
  const llvm::UTF8 *cursor = begin;
  if (!llvm::isLegalUTF8String(&cursor, begin + text.size())) {
    size_t offset = cursor - begin;
    reporter.error(reporter.fromOffset(offset))
        << "invalid UTF-8 byte 0x" << llvm::utohexstr(text[offset] & 0xFF)
        << "; save the spec as UTF-8 text";
    return false;
  }
  // Control characters (a NUL would cut a name or a path short in every C
  // string it reaches): a spec is plain text.
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = text[i];
    if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f) {
      reporter.error(reporter.fromOffset(i))
          << "control character 0x" << (c < 0x10 ? "0" : "")
          << llvm::utohexstr(c)
          << (c == 0 ? " (a NUL byte)" : "")
          << " in the spec; a spec is plain text";
      return false;
    }
  }
  if (text.find_first_not_of(" \t\r\n") == StringRef::npos) {
    reporter.error({1, 1}) << "the spec is empty: expected 'model NAME { ... }'";
    return false;
  }
  // Bracket depth, skipping strings and comments as the lexer does.
  unsigned depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"' && text[i] != '\n'; ++i)
        if (text[i] == '\\')
          ++i;
    } else if (c == '#' || (c == '/' && text.substr(i, 2) == "//")) {
      i = std::min(text.find('\n', i), text.size());
    } else if (c == '/' && text.substr(i, 2) == "/*") {
      size_t end = text.find("*/", i + 2);
      i = end == StringRef::npos ? text.size() : end + 1;
    } else if (c == '{' || c == '(') {
      if (++depth > limits.maxDepth) {
        reporter.error(reporter.fromOffset(i))
            << "brackets nested deeper than " << limits.maxDepth
            << " levels";
        return false;
      }
    } else if ((c == '}' || c == ')') && depth > 0) {
      --depth;
    }
  }
  return true;
}

//===----------------------------------------------------------------------===//
// ANTLR error listener
//===----------------------------------------------------------------------===//

/// Readable names for ANTLR's token names in messages; an expected-set of
/// more than a handful of alternatives says nothing a person can act on, so
/// it is dropped ("extraneous input '~'" is enough with the caret).
std::string humanize(std::string message) {
  // The set ends the message (and may itself contain '}').
  size_t open = message.find(" expecting {");
  if (open != std::string::npos &&
      std::count(message.begin() + open, message.end(), ',') >= 4)
    message.erase(open);
  for (size_t pos; (pos = message.find("'<EOF>'")) != std::string::npos;)
    message.replace(pos, 7, "end of file");
  static const std::pair<const char *, const char *> names[] = {
      {"<EOF>", "end of file"},     {"ID", "a name"},
      {"NUMBER", "a number"},       {"STRING", "a string"},
      {"RANGE", "a search range"},
      {"STRAY", "a stray character"}};
  for (auto [from, to] : names) {
    // Whole words only: token names appear bare in expected-sets.
    size_t pos = 0;
    while ((pos = message.find(from, pos)) != std::string::npos) {
      size_t end = pos + strlen(from);
      bool wordStart = pos == 0 || !isalnum(message[pos - 1]);
      bool wordEnd = end >= message.size() || !isalnum(message[end]);
      if (wordStart && wordEnd && (pos == 0 || message[pos - 1] != '\'')) {
        message.replace(pos, end - pos, to);
        pos += strlen(to);
      } else {
        pos = end;
      }
    }
  }
  return message;
}

class ErrorListener : public antlr4::BaseErrorListener {
public:
  explicit ErrorListener(Reporter &reporter) : reporter(reporter) {}

  void syntaxError(antlr4::Recognizer *, antlr4::Token *offending,
                   size_t line, size_t col, const std::string &msg,
                   std::exception_ptr) override {
    ast::Location loc = reporter.fromAntlr(line, col);
    if (offending) {
      switch (offending->getType()) {
      case MtpLexer::UNTERMINATED_STRING:
        return reporter.syntaxError(loc, "unterminated string: add the "
                                         "closing '\"' on the same line");
      case MtpLexer::UNTERMINATED_COMMENT:
        return reporter.syntaxError(loc, "unterminated '/*' comment");
      case MtpLexer::STRAY:
        return reporter.syntaxError(
            loc, "unexpected character '" + offending->getText() + "'");
      default:
        break;
      }
    }
    reporter.syntaxError(loc, humanize(msg));
  }

private:
  Reporter &reporter;
};

//===----------------------------------------------------------------------===//
// Parse tree -> AST
//===----------------------------------------------------------------------===//

class Builder {
public:
  explicit Builder(Reporter &reporter) : reporter(reporter) {}

  ast::Location loc(antlr4::ParserRuleContext *ctx) {
    return loc(ctx->getStart());
  }
  ast::Location loc(antlr4::Token *token) {
    return reporter.fromAntlr(token->getLine(), token->getCharPositionInLine());
  }

  ast::Model model(MtpParser::ModelContext *ctx) {
    ast::Model model;
    model.loc = loc(ctx);
    model.name = ctx->name->getText();
    model.nameLoc = loc(ctx->name);
    for (MtpParser::ItemContext *item : ctx->item()) {
      if (auto *bb = item->backbone())
        model.backbones.push_back(backbone(bb));
      else if (auto *t = item->task())
        model.tasks.push_back(task(t));
      else if (auto *c = item->correlate())
        model.correlations.push_back(correlate(c));
      else if (auto *s = item->section())
        model.sections.push_back(
            {s->name->getText(), loc(s), entries(s->block())});
    }
    return model;
  }

private:
  ast::Backbone backbone(MtpParser::BackboneContext *ctx) {
    if (ctx->source) {
      ast::Value source = call(ctx->source);
      return {source.name, loc(ctx), loc(ctx->source->name),
              entries(ctx->block()), std::move(source)};
    }
    return {ctx->kind->getText(), loc(ctx), loc(ctx->kind),
            entries(ctx->block()), std::nullopt};
  }

  ast::Task task(MtpParser::TaskContext *ctx) {
    ast::Task task;
    task.name = ctx->name->getText();
    task.loc = loc(ctx);
    task.nameLoc = loc(ctx->name);
    task.head = call(ctx->head);
    for (MtpParser::TaskClauseContext *clause : ctx->taskClause()) {
      if (auto *from = dynamic_cast<MtpParser::FromClauseContext *>(clause)) {
        ast::Tap tap;
        tap.loc = loc(from->tap());
        if (auto *pooled =
                dynamic_cast<MtpParser::PooledTapContext *>(from->tap())) {
          tap.kind = ast::Tap::Kind::Pooled;
          if (pooled->layer)
            tap.layer = number(pooled->layer, nullptr);
        } else if (auto *layer = dynamic_cast<MtpParser::LayerTapContext *>(
                       from->tap())) {
          tap.kind = ast::Tap::Kind::Layer;
          tap.layer = layer->span ? range(layer->span) : number(layer->layer, nullptr);
        } else {
          tap.kind = ast::Tap::Kind::Embeddings;
        }
        task.taps.push_back({std::move(tap), loc(from)});
      } else if (auto *lossClause =
                     dynamic_cast<MtpParser::LossClauseContext *>(clause)) {
        task.losses.push_back({lossClause->loss->getText(), loc(lossClause->loss)});
      } else if (auto *weight =
                     dynamic_cast<MtpParser::WeightClauseContext *>(clause)) {
        task.weights.push_back({number(weight->number(), nullptr), loc(weight)});
      }
    }
    return task;
  }

  ast::Correlation correlate(MtpParser::CorrelateContext *ctx) {
    ast::Correlation corr;
    corr.loc = loc(ctx);
    corr.a = ctx->a->getText();
    corr.aLoc = loc(ctx->a);
    corr.b = ctx->b->getText();
    corr.bLoc = loc(ctx->b);
    corr.value = number(ctx->number(), nullptr);
    return corr;
  }

  std::vector<ast::Entry> entries(MtpParser::BlockContext *ctx) {
    std::vector<ast::Entry> result;
    if (!ctx)
      return result;
    for (MtpParser::EntryContext *entry : ctx->entry())
      result.push_back({entry->key->getText(), loc(entry->key),
                        value(entry->value())});
    return result;
  }

  ast::Value value(MtpParser::ValueContext *ctx) {
    if (auto *num = dynamic_cast<MtpParser::NumberValueContext *>(ctx))
      return number(num->number(), num->unit());
    if (auto *r = dynamic_cast<MtpParser::RangeValueContext *>(ctx))
      return range(r->range());
    if (auto *str = dynamic_cast<MtpParser::StringValueContext *>(ctx)) {
      ast::Value v;
      v.kind = ast::Value::Kind::String;
      v.loc = loc(ctx);
      v.name = unescape(str->STRING()->getText());
      return v;
    }
    if (auto *c = dynamic_cast<MtpParser::CallValueContext *>(ctx)) {
      ast::Value v = call(c->call());
      attachBlock(v, c->block());
      return v;
    }
    if (auto *id = dynamic_cast<MtpParser::IdentValueContext *>(ctx)) {
      ast::Value v;
      v.kind = ast::Value::Kind::Ident;
      v.loc = loc(ctx);
      v.name = id->ident()->getText();
      attachBlock(v, id->block());
      return v;
    }
    auto *blk = dynamic_cast<MtpParser::BlockValueContext *>(ctx);
    ast::Value v;
    v.kind = ast::Value::Kind::Block;
    v.loc = loc(ctx);
    attachBlock(v, blk ? blk->block() : nullptr);
    return v;
  }

  void attachBlock(ast::Value &v, MtpParser::BlockContext *block) {
    if (!block)
      return;
    v.hasBlock = true;
    v.entries = entries(block);
  }

  ast::Value call(MtpParser::CallContext *ctx) {
    ast::Value v;
    v.kind = ast::Value::Kind::Call;
    v.loc = loc(ctx);
    v.name = ctx->name->getText();
    for (MtpParser::ArgContext *arg : ctx->arg())
      v.args.push_back({arg->key ? arg->key->getText() : std::string(),
                        loc(arg), value(arg->value())});
    if (v.name == "one_of")
      choice(v, ctx);
    return v;
  }

  /// one_of(A, B, ...): a search choice among alternatives written out
  /// (mtpc search writes one in); each alternative's source text kept.
  void choice(ast::Value &v, MtpParser::CallContext *ctx) {
    antlr4::Token *stop = ctx->getStop();
    v.end = loc(stop);
    v.end.col += stop->getText().size();
    if (v.args.size() < 2)
      reporter.error(v.loc) << "one_of needs at least two alternatives, "
                               "e.g. one_of(none, auto)";
    antlr4::CharStream *text = ctx->getStart()->getInputStream();
    for (auto [arg, parsed] : llvm::zip(ctx->arg(), v.args)) {
      if (!parsed.key.empty()) {
        reporter.error(parsed.loc)
            << "one_of's alternatives are values, not '" << parsed.key
            << " = ...'";
        continue;
      }
      antlr4::ParserRuleContext *value = arg->value();
      if (!value || !value->getStart() || !value->getStop())
        continue; // (the builder runs on error-free parses only)
      parsed.value.source = text->getText(antlr4::misc::Interval(
          value->getStart()->getStartIndex(),
          value->getStop()->getStopIndex()));
      if (const ast::Value *inner = nestedSearch(parsed.value))
        reporter.error(inner->loc)
            << "a search choice's alternatives are written out: no range "
               "or one_of inside one";
    }
  }

  static const ast::Value *nestedSearch(const ast::Value &v) {
    if (v.kind == ast::Value::Kind::Range ||
        (v.kind == ast::Value::Kind::Call && v.name == "one_of"))
      return &v;
    for (const ast::Arg &a : v.args)
      if (const ast::Value *inner = nestedSearch(a.value))
        return inner;
    for (const ast::Entry &e : v.entries)
      if (const ast::Value *inner = nestedSearch(e.value))
        return inner;
    return nullptr;
  }

  /// lo..hi [by step]: integers, lo <= hi, step >= 1 (each mistake located).
  ast::Value range(MtpParser::RangeContext *ctx) {
    ast::Value v;
    v.kind = ast::Value::Kind::Range;
    v.loc = loc(ctx);
    antlr4::Token *stop = ctx->getStop();
    v.end = loc(stop);
    v.end.col += stop->getText().size();
    std::string text = ctx->RANGE()->getText();
    v.spelling = text;
    auto parse = [&](StringRef digits, ast::Location at, int64_t &out) {
      std::string clean;
      for (char c : digits)
        if (c != '_')
          clean.push_back(c);
      uint64_t magnitude;
      if (StringRef(clean).getAsInteger(10, magnitude) ||
          magnitude > uint64_t(INT64_MAX)) {
        reporter.error(at) << "integer " << digits << " is too large";
        return false;
      }
      out = int64_t(magnitude);
      return true;
    };
    const size_t dots = text.find("..");
    int64_t lo = 0, hi = 0;
    if (!parse(StringRef(text).take_front(dots), v.loc, lo) ||
        !parse(StringRef(text).drop_front(dots + 2), v.loc, hi))
      return v;
    v.integer = lo;
    v.number = double(lo);
    v.isInteger = true;
    v.rangeHi = hi;
    if (ctx->step) {
      v.spelling += " by " + ctx->step->getText();
      const std::string step = ctx->step->getText();
      ast::Location stepLoc = loc(ctx->step);
      if (step.find_first_of(".eE") != std::string::npos) {
        reporter.error(stepLoc) << "a range's step is a whole number, got "
                                << step;
      } else if (parse(step, stepLoc, v.rangeStep) && v.rangeStep < 1) {
        reporter.error(stepLoc) << "a range's step must be at least 1";
        v.rangeStep = 1;
      }
    }
    if (lo > hi)
      reporter.error(v.loc) << "range " << text << " is empty: its first value "
                            << lo << " is above its last " << hi
                            << " (write " << hi << ".." << lo << ")";
    return v;
  }

  ast::Value number(MtpParser::NumberContext *ctx, MtpParser::UnitContext *unit) {
    ast::Value v;
    v.kind = ast::Value::Kind::Number;
    v.loc = loc(ctx);
    std::string text = ctx->NUMBER()->getText();
    bool negative = ctx->MINUS() != nullptr;
    v.spelling = (negative ? "-" : "") + text;
    std::string digits;
    for (char c : text)
      if (c != '_')
        digits.push_back(c);
    StringRef d(digits);
    v.isInteger = d.find_first_of(".eE") == StringRef::npos;
    if (v.isInteger) {
      uint64_t magnitude;
      if (d.getAsInteger(10, magnitude) ||
          magnitude > uint64_t(INT64_MAX)) {
        reporter.error(v.loc) << "integer " << v.spelling << " is too large";
        magnitude = 0;
      }
      v.integer = negative ? -int64_t(magnitude) : int64_t(magnitude);
      v.number = static_cast<double>(v.integer);
    } else {
      double value = 0;
      if (d.getAsDouble(value) || std::isinf(value)) {
        reporter.error(v.loc) << "number " << v.spelling << " is out of range";
        value = 0;
      }
      v.number = negative ? -value : value;
    }
    if (unit) {
      v.unit = unit->getText();
      v.unitLoc = loc(unit);
    }
    return v;
  }

  static std::string unescape(StringRef quoted) {
    StringRef body = quoted.drop_front().drop_back();
    std::string out;
    for (size_t i = 0; i < body.size(); ++i) {
      char c = body[i];
      if (c != '\\' || i + 1 == body.size()) {
        out.push_back(c);
        continue;
      }
      switch (char e = body[++i]) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      default:
        out.push_back(e);
      }
    }
    return out;
  }

  Reporter &reporter;
};

} // namespace

std::optional<ast::Model> mtp::parseSpec(llvm::SourceMgr &sourceMgr,
                                         mlir::MLIRContext *context,
                                         const ParseLimits &limits) {
  Reporter reporter(sourceMgr, context, limits.maxErrors);
  if (!checkBytes(reporter, limits))
    return std::nullopt;
  // ANTLR 4.9's C++ runtime shares each grammar's DFA cache between parsers
  // and is not safe to run concurrently (fixed upstream in 4.10); mtpc
  // search parses candidates on several threads, so parses take turns.
  static std::mutex antlrMutex;
  std::lock_guard<std::mutex> lock(antlrMutex);
  try {
    antlr4::ANTLRInputStream input(reporter.getText().str());
    MtpLexer lexer(&input);
    lexer.removeErrorListeners(); // STRAY catches every character
    antlr4::CommonTokenStream tokens(&lexer);
    MtpParser parser(&tokens);
    ErrorListener listener(reporter);
    parser.removeErrorListeners();
    parser.addErrorListener(&listener);
    MtpParser::SpecContext *tree = parser.spec();
    if (reporter.errorCount() > 0)
      return std::nullopt;
    Builder builder(reporter);
    ast::Model model = builder.model(tree->model());
    if (reporter.errorCount() > 0)
      return std::nullopt;
    return model;
  } catch (const TooManyErrors &) {
    return std::nullopt;
  } catch (const std::exception &e) {
    reporter.error({1, 1}) << "internal parser error: " << e.what();
    return std::nullopt;
  }
}
