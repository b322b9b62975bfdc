//===- mtp-opt.cpp - mtp optimizer driver ---------------------------------===//
//
// MlirOptMain with the mtp dialect and every mtp pass, plus the upstream
// passes users combine them with (canonicalize, cse, symbol-dce, ...).
//
//===----------------------------------------------------------------------===//

#include "codegen/Passes.h"
#include "dialect/MTPDialect.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/EmitC/IR/EmitC.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::registerTransformsPasses();
  mtp::registerMTPPasses();
  mtp::registerMTPCodegenPasses();

  mlir::DialectRegistry registry;
  registry.insert<mtp::MTPDialect, mlir::func::FuncDialect,
                  mlir::arith::ArithDialect, mlir::emitc::EmitCDialect>();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "mtp optimizer driver\n", registry));
}
