//===- FuzzFrontend.cpp - libFuzzer target for the .mtp frontend ----------===//
//
// Any bytes: parse, check, generate IR. Nothing may crash, hang or leak, and
// one invariant is checked on top: a spec Sema accepts must produce IR the
// dialect's verifiers accept (otherwise Sema has a gap and users would see an
// internal error instead of a located one).
//
//===----------------------------------------------------------------------===//

#include "dialect/MTPDialect.h"
#include "frontend/MLIRGen.h"
#include "frontend/Parser.h"
#include "frontend/Sema.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"

#include <cstdio>
#include <cstdlib>

// MLIR and LLVM come prebuilt without ASan, while their headers poison
// allocator memory when included from instrumented code; mixing the two
// reports false use-after-poison. Real heap errors are still caught.
extern "C" const char *__asan_default_options() {
  return "allow_user_poisoning=0";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // A fresh context per input: interned names must not accumulate.
  mlir::MLIRContext context(mlir::MLIRContext::Threading::DISABLED);
  context.loadDialect<mtp::MTPDialect>();
  std::string verifierMessage;
  mlir::ScopedDiagnosticHandler quiet(&context, [&](mlir::Diagnostic &diag) {
    verifierMessage = diag.str();
    return mlir::success();
  });

  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(
      llvm::MemoryBuffer::getMemBufferCopy(
          llvm::StringRef(reinterpret_cast<const char *>(data), size),
          "fuzz.mtp"),
      llvm::SMLoc());
  std::optional<mtp::ast::Model> ast = mtp::parseSpec(sourceMgr, &context);
  if (!ast)
    return 0;
  std::optional<mtp::CheckedSpec> spec =
      mtp::checkSpec(*ast, "fuzz.mtp", &context);
  if (!spec)
    return 0;
  verifierMessage.clear();
  if (!mtp::mlirGen(*spec, "fuzz.mtp", &context)) {
    fprintf(stderr, "Sema accepted a spec the verifier rejects: %s\n",
            verifierMessage.c_str());
    abort();
  }
  return 0;
}
