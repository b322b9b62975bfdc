//===- InputGuard.cpp - Byte-level checks before MLIR parses a file -------===//

#include "dialect/InputGuard.h"

#include "llvm/ADT/Twine.h"
#include "llvm/Support/SMLoc.h"
#include "llvm/Support/SourceMgr.h"

mlir::LogicalResult mtp::checkIRNesting(llvm::SourceMgr &sourceMgr,
                                        unsigned bufferId, unsigned maxDepth) {
  llvm::StringRef text = sourceMgr.getMemoryBuffer(bufferId)->getBuffer();
  unsigned depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\')
          ++i;
    } else if (c == '/' && text.substr(i, 2) == "//") {
      i = std::min(text.find('\n', i), text.size());
    } else if (c == '(' || c == '[' || c == '{' || c == '<') {
      if (++depth > maxDepth) {
        sourceMgr.PrintMessage(
            llvm::SMLoc::getFromPointer(text.data() + i),
            llvm::SourceMgr::DK_Error,
            llvm::Twine("brackets nested deeper than ") + llvm::Twine(maxDepth) +
                " levels, far past any IR mtpc or MLIR writes; is the file "
                "damaged?");
        return mlir::failure();
      }
    } else if ((c == ')' || c == ']' || c == '}' ||
                (c == '>' && (i == 0 || text[i - 1] != '-'))) &&
               depth > 0) { // `->` closes nothing
      --depth;
    }
  }
  return mlir::success();
}
