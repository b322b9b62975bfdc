//===- Parser.h - .mtp text to AST ------------------------------*- C++ -*-===//

#ifndef MTPC_FRONTEND_PARSER_H
#define MTPC_FRONTEND_PARSER_H

#include "frontend/AST.h"

#include <optional>

namespace llvm {
class SourceMgr;
} // namespace llvm

namespace mlir {
class MLIRContext;
} // namespace mlir

namespace mtp {

/// Guards applied before the ANTLR parser sees a file.
struct ParseLimits {
  /// Specs are a page of text; anything far larger is a wrong file.
  size_t maxBytes = 1 << 20;
  /// Bracket nesting; the parser's recursive rules would exhaust the stack.
  unsigned maxDepth = 64;
  /// Errors reported before giving up on a file.
  unsigned maxErrors = 20;
};

/// Parses the main buffer of `sourceMgr`. Every problem is reported through
/// `context`'s diagnostic engine at a FileLineColLoc in that buffer (so a
/// SourceMgrDiagnosticHandler shows the line and a caret); syntax errors are
/// recovered from so that one run reports each independent one. Returns the
/// AST only when there was no error.
std::optional<ast::Model> parseSpec(llvm::SourceMgr &sourceMgr,
                                    mlir::MLIRContext *context,
                                    const ParseLimits &limits = {});

} // namespace mtp

#endif // MTPC_FRONTEND_PARSER_H
