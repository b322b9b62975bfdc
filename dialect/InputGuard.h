//===- InputGuard.h - Byte-level checks before MLIR parses a file -*- C++ -*-===//
//
// MLIR's parser recurses once per nested bracket, so a hand-written or
// damaged `.mlir` with 100k nested `[` overflows the stack before any
// diagnostic. Every tool that parses `.mlir` input (mtpc, mtp-opt,
// mtp-translate) scans the buffer first, as the `.mtp` frontend does.
//
//===----------------------------------------------------------------------===//

#ifndef MTP_DIALECT_INPUTGUARD_H
#define MTP_DIALECT_INPUTGUARD_H

#include "mlir/Support/LogicalResult.h"

namespace llvm {
class SourceMgr;
} // namespace llvm

namespace mtp {

/// Deeper than any IR mtpc writes (~10 levels) by far, shallow enough that
/// MLIR's recursive parser stays well inside an 8 MiB stack (sanitizers
/// included).
constexpr unsigned kMaxIRNesting = 512;

/// Fails, with a located error printed through `sourceMgr`, when brackets in
/// buffer `bufferId` nest deeper than `maxDepth` (strings and `//` comments
/// skipped, as MLIR's lexer does).
mlir::LogicalResult checkIRNesting(llvm::SourceMgr &sourceMgr,
                                   unsigned bufferId,
                                   unsigned maxDepth = kMaxIRNesting);

} // namespace mtp

#endif // MTP_DIALECT_INPUTGUARD_H
