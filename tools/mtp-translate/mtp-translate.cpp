//===- mtp-translate.cpp - mtp translations -------------------------------===//
//
// MLIR's translation driver with the mtp dialect: `--mtp-to-cpp` turns a
// planned step (what `mtpc FILE --emit=step` prints) into the C++ step
// program (--mtp-lower-step-to-emitc, then MLIR's C++ emitter);
// `--mlir-to-cpp` is upstream's EmitC emitter, for IR already lowered with
// `mtp-opt --mtp-lower-step-to-emitc`.
//
//===----------------------------------------------------------------------===//

#include "codegen/Codegen.h"
#include "dialect/InputGuard.h"
#include "dialect/MTPDialect.h"

#include "mlir/Dialect/EmitC/IR/EmitC.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Tools/ParseUtilities.h"
#include "llvm/Support/SourceMgr.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/Cpp/CppEmitter.h"
#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"
#include "mlir/Tools/mlir-translate/Translation.h"

using namespace mlir;

int main(int argc, char **argv) {
  // --mtp-to-cpp runs a pass: the IR printing and timing flags apply.
  registerPassManagerCLOptions();
  // A TranslateRegistration (not FromMLIR) so the input's nesting is
  // checked before MLIR's recursive parser sees it.
  TranslateRegistration toCpp(
      "mtp-to-cpp", "planned mtp step IR to the C++ step program",
      [](const std::shared_ptr<llvm::SourceMgr> &sourceMgr, raw_ostream &os,
         MLIRContext *context) -> LogicalResult {
        if (failed(mtp::checkIRNesting(*sourceMgr, sourceMgr->getMainFileID())))
          return failure();
        DialectRegistry registry;
        registry.insert<mtp::MTPDialect, emitc::EmitCDialect>();
        context->appendDialectRegistry(registry);
        OwningOpRef<Operation *> op = parseSourceFileForTool(
            sourceMgr, context, /*insertImplicitModule=*/true);
        if (!op || failed(verify(*op)))
          return failure();
        auto module = dyn_cast<ModuleOp>(*op);
        if (!module)
          return (*op)->emitError("expected a module");
        return mtp::emitStepCpp(module, os);
      });
  TranslateRegistration emitcToCpp(
      "mlir-to-cpp", "EmitC IR to C++ (MLIR's emitter)",
      [](const std::shared_ptr<llvm::SourceMgr> &sourceMgr, raw_ostream &os,
         MLIRContext *context) -> LogicalResult {
        if (failed(mtp::checkIRNesting(*sourceMgr, sourceMgr->getMainFileID())))
          return failure();
        context->loadDialect<emitc::EmitCDialect>();
        OwningOpRef<Operation *> op = parseSourceFileForTool(
            sourceMgr, context, /*insertImplicitModule=*/true);
        if (!op || failed(verify(*op)))
          return failure();
        return emitc::translateToCpp(*op, os, /*declareVariablesAtTop=*/false);
      });
  return failed(mlirTranslateMain(argc, argv, "mtp translation driver\n"));
}
