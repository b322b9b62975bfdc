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
#include "dialect/MTPDialect.h"

#include "mlir/Dialect/EmitC/IR/EmitC.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/Cpp/CppEmitter.h"
#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"
#include "mlir/Tools/mlir-translate/Translation.h"

using namespace mlir;

int main(int argc, char **argv) {
  // --mtp-to-cpp runs a pass: the IR printing and timing flags apply.
  registerPassManagerCLOptions();
  TranslateFromMLIRRegistration toCpp(
      "mtp-to-cpp", "planned mtp step IR to the C++ step program",
      [](Operation *op, raw_ostream &os) -> LogicalResult {
        auto module = dyn_cast<ModuleOp>(op);
        if (!module)
          return op->emitError("expected a module");
        return mtp::emitStepCpp(module, os);
      },
      [](DialectRegistry &registry) {
        registry.insert<mtp::MTPDialect, emitc::EmitCDialect>();
      });
  TranslateFromMLIRRegistration emitcToCpp(
      "mlir-to-cpp", "EmitC IR to C++ (MLIR's emitter)",
      [](Operation *op, raw_ostream &os) {
        return emitc::translateToCpp(op, os, /*declareVariablesAtTop=*/false);
      },
      [](DialectRegistry &registry) {
        registry.insert<emitc::EmitCDialect>();
      });
  return failed(mlirTranslateMain(argc, argv, "mtp translation driver\n"));
}
