//===- mtpc.cpp - the mtpc compiler driver --------------------------------===//
//
//   mtpc check FILE            verify a spec; print a summary or located errors
//   mtpc FILE --emit=mlir      print the normalized spec-level IR
//
// Every MLIR flag users know (--mlir-print-ir-after-all, --mlir-timing,
// --mlir-print-debuginfo, ...) works with every subcommand.
//
//===----------------------------------------------------------------------===//

#include "dialect/MTPOps.h"
#include "passes/Passes.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Support/Timing.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

using namespace mlir;
namespace cl = llvm::cl;

namespace {
enum class Command { Compile, Check };
enum class Emit { MLIR };

cl::opt<std::string> inputFilename(cl::Positional, cl::desc("<spec file>"),
                                   cl::Required);
cl::opt<std::string> outputFilename("o", cl::desc("Output file"),
                                    cl::value_desc("filename"),
                                    cl::init("-"));
cl::opt<Emit> emitAction(
    "emit", cl::desc("What to emit"), cl::init(Emit::MLIR),
    cl::values(clEnumValN(Emit::MLIR, "mlir", "the normalized spec-level IR")));
} // namespace

/// One line per fact a user checks first.
static void printSummary(llvm::raw_ostream &os, StringRef file,
                         ModuleOp module) {
  for (auto model : module.getOps<mtp::ModelOp>()) {
    mtp::BackboneOp bb = model.getBackbone();
    os << file << ": OK: model '" << model.getSymName() << "'\n";
    os << "  backbone  " << mtp::stringifyBackboneKind(bb.getKind()) << ": "
       << bb.getLayers() << " layers, hidden " << bb.getHidden() << ", "
       << bb.getHeads() << " heads, ffn " << bb.getFfn() << ", vocab "
       << bb.getVocab() << ", seq " << bb.getSeq() << "\n";
    for (mtp::TaskOp task : model.getTasks())
      os << "  task      " << task.getSymName() << ": "
         << mtp::stringifyHeadKind(task.getHead()) << " head reads "
         << (task.getPooled() ? "pooled " : "") << "layer "
         << task.getTapLayer() << ", loss "
         << mtp::stringifyLossKind(task.getLoss()) << " x "
         << llvm::format("%g", task.getWeight().convertToDouble()) << "\n";
    for (auto corr : model.getBody().getOps<mtp::CorrelateOp>())
      os << "  correlate " << corr.getLhs() << " ~ " << corr.getRhs() << " = "
         << llvm::format("%g", corr.getValue().convertToDouble()) << "\n";
    if (mtp::BudgetOp budget = model.getBudget())
      os << "  budget    " << budget.getDevice() << ": "
         << budget.getMemory() << " bytes, " << budget.getUsableBytes()
         << " usable; " << budget.getGpus() << " device(s); batch "
         << budget.getGlobalBatch() << " = micro " << budget.getMicroBatch()
         << " x " << budget.getGpus() << " x "
         << budget.getAccumulationSteps() << " accumulation; "
         << mtp::stringifyPrecision(budget.getPrecision()) << "\n";
    else
      os << "  budget    none (planning needs one)\n";
  }
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);

  // The subcommand is a leading word, so every MLIR flag (registered on the
  // top-level command line) applies to each of them.
  Command command = Command::Compile;
  SmallVector<char *> args(argv, argv + argc);
  if (args.size() > 1) {
    std::optional<Command> sub =
        llvm::StringSwitch<std::optional<Command>>(args[1])
            .Case("check", Command::Check)
            .Default(std::nullopt);
    if (sub) {
      command = *sub;
      args.erase(args.begin() + 1);
    }
  }

  registerAsmPrinterCLOptions();
  registerMLIRContextCLOptions();
  registerPassManagerCLOptions();
  registerDefaultTimingManagerCLOptions();
  cl::ParseCommandLineOptions(
      args.size(), args.data(),
      "mtpc: multi-task training pipeline compiler\n\n"
      "  mtpc check FILE          verify a spec and summarize it\n"
      "  mtpc FILE --emit=mlir    print the normalized spec-level IR\n");

  if (llvm::sys::path::extension(inputFilename) == ".mtp") {
    llvm::WithColor::error(llvm::errs(), "mtpc")
        << inputFilename
        << ": the .mtp language frontend is not built yet; give the "
           "spec-level IR as a .mlir file (see examples/)\n";
    return 1;
  }

  std::string errorMessage;
  std::unique_ptr<llvm::MemoryBuffer> input =
      openInputFile(inputFilename, &errorMessage);
  if (!input) {
    llvm::WithColor::error(llvm::errs(), "mtpc") << errorMessage << "\n";
    return 1;
  }

  DialectRegistry registry;
  registry.insert<mtp::MTPDialect>();
  MLIRContext context(registry);
  context.loadAllAvailableDialects();

  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(input), SMLoc());
  SourceMgrDiagnosticHandler diagHandler(sourceMgr, &context);

  DefaultTimingManager tm;
  applyDefaultTimingManagerCLOptions(tm);
  TimingScope timing = tm.getRootScope();

  OwningOpRef<ModuleOp> module;
  {
    TimingScope parseTiming = timing.nest("Parse");
    module = parseSourceFile<ModuleOp>(sourceMgr, &context);
  }
  if (!module)
    return 1;
  if (module->getOps<mtp::ModelOp>().empty()) {
    emitError(module->getLoc()) << "no 'mtp.model' in " << inputFilename;
    return 1;
  }

  PassManager pm(&context);
  if (failed(applyPassManagerCLOptions(pm)))
    return 1;
  pm.enableTiming(timing);
  pm.addNestedPass<mtp::ModelOp>(mtp::createNormalizeSpec());
  if (failed(pm.run(*module)))
    return 1;

  std::unique_ptr<llvm::ToolOutputFile> output =
      openOutputFile(outputFilename, &errorMessage);
  if (!output) {
    llvm::WithColor::error(llvm::errs(), "mtpc") << errorMessage << "\n";
    return 1;
  }
  switch (command) {
  case Command::Check:
    printSummary(output->os(), inputFilename, *module);
    break;
  case Command::Compile:
    switch (emitAction) {
    case Emit::MLIR:
      module->print(output->os());
      output->os() << "\n";
      break;
    }
    break;
  }
  output->keep();
  return 0;
}
