//===- mtp-opt.cpp - mtp optimizer driver ---------------------------------===//
//
// MlirOptMain with the mtp dialect and every mtp pass, plus the upstream
// passes users combine them with (canonicalize, cse, symbol-dce, ...).
//
//===----------------------------------------------------------------------===//

#include "codegen/Passes.h"
#include "dialect/InputGuard.h"
#include "dialect/MTPDialect.h"
#include "passes/Passes.h"
#include "passes/Pipelines.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/EmitC/IR/EmitC.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

int main(int argc, char **argv) {
  mlir::registerTransformsPasses();
  mtp::registerMTPPasses();
  mtp::registerMTPPipelines();
  mtp::registerMTPCodegenPasses();

  mlir::DialectRegistry registry;
  registry.insert<mtp::MTPDialect, mlir::func::FuncDialect,
                  mlir::arith::ArithDialect, mlir::emitc::EmitCDialect>();
  llvm::InitLLVM init(argc, argv);
  auto [inputFile, outputFile] = mlir::registerAndParseCLIOptions(
      argc, argv, "mtp optimizer driver\n", registry);
  mlir::MlirOptMainConfig config = mlir::MlirOptMainConfig::createFromCLOptions();
  if (config.shouldShowDialects())
    return mlir::asMainReturnCode(
        mlir::MlirOptMain(argc, argv, inputFile, outputFile, registry));

  // MlirOptMain's own steps, with the nesting guard between reading the
  // input and parsing it (MLIR's parser would overflow its stack first).
  std::string error;
  std::unique_ptr<llvm::MemoryBuffer> file = mlir::openInputFile(inputFile, &error);
  if (!file) {
    llvm::errs() << "mtp-opt: " << error << "\n";
    return 1;
  }
  llvm::SourceMgr guard;
  guard.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBuffer(
                               file->getBuffer(), file->getBufferIdentifier()),
                           llvm::SMLoc());
  if (mlir::failed(mtp::checkIRNesting(guard, guard.getMainFileID())))
    return 1;
  std::unique_ptr<llvm::ToolOutputFile> output =
      mlir::openOutputFile(outputFile, &error);
  if (!output) {
    llvm::errs() << "mtp-opt: " << error << "\n";
    return 1;
  }
  if (mlir::failed(
          mlir::MlirOptMain(output->os(), std::move(file), registry, config)))
    return 1;
  output->keep();
  return 0;
}
