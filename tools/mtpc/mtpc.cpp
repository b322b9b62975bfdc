//===- mtpc.cpp - the mtpc compiler driver --------------------------------===//
//
//   mtpc check FILE [-v]          check a spec: errors, or a one-line summary
//   mtpc plan FILE [--format=json] the memory plan against the budget
//   mtpc plan FILE --format=fb -o PLAN  the plan as a flatbuffer
//   mtpc inspect PLAN             verify a flatbuffer plan and print it
//   mtpc FILE --emit=ast|mlir|step print the AST, the spec-level IR, or the
//                                 expanded training step
//
// FILE is a .mtp spec or spec-level IR (.mlir). Every MLIR flag users know
// (--mlir-print-ir-after-all, --mlir-timing, --mlir-print-debuginfo, ...)
// works with every subcommand. Exit codes: 0 ok, 1 the spec has errors,
// 2 the tool was used wrongly (missing file, bad flag).
//
//===----------------------------------------------------------------------===//

#include "dialect/MTPOps.h"
#include "frontend/MLIRGen.h"
#include "frontend/Parser.h"
#include "frontend/Sema.h"
#include "passes/CostModel.h"
#include "passes/MemoryAnalysis.h"
#include "passes/PlanFile.h"
#include "passes/PlanReport.h"
#include "passes/Passes.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Support/Timing.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

using namespace mlir;
namespace cl = llvm::cl;

namespace {
enum class Command { Compile, Check, Plan, Inspect };
enum class Emit { AST, MLIR, Step };
enum class Format { Text, Json, Fb };
enum ExitCode { kOk = 0, kSpecError = 1, kUsageError = 2 };

cl::opt<std::string> inputFilename(cl::Positional, cl::desc("<spec file>"),
                                   cl::Required);
cl::opt<std::string> outputFilename("o", cl::desc("Output file"),
                                    cl::value_desc("filename"),
                                    cl::init("-"));
cl::opt<Emit> emitAction(
    "emit", cl::desc("What to emit"), cl::init(Emit::MLIR),
    cl::values(clEnumValN(Emit::AST, "ast", "the parsed .mtp syntax tree"),
               clEnumValN(Emit::MLIR, "mlir", "the spec-level IR"),
               clEnumValN(Emit::Step, "step",
                          "the training step with its memory analysis")));
cl::opt<Format> format(
    "format", cl::desc("plan: output format"), cl::init(Format::Text),
    cl::values(clEnumValN(Format::Text, "text", "a table for the terminal"),
               clEnumValN(Format::Json, "json",
                          "JSON, schema mtpc.plan/1 (docs/plan-format.md)"),
               clEnumValN(Format::Fb, "fb",
                          "a flatbuffer (runtime/schema/plan.fbs) for the "
                          "runtime and `mtpc inspect`")));
cl::opt<bool> verbose("v", cl::desc("check: print every task, correlation "
                                    "and the budget, not only the summary"));

llvm::raw_ostream &usageError() {
  return llvm::WithColor::error(llvm::errs(), "mtpc");
}

/// 335.2M, 12.4K, 17.
std::string humanCount(int64_t n) {
  if (n >= 1000000000)
    return llvm::formatv("{0:f1}B", n / 1e9);
  if (n >= 1000000)
    return llvm::formatv("{0:f1}M", n / 1e6);
  if (n >= 1000)
    return llvm::formatv("{0:f1}K", n / 1e3);
  return std::to_string(n);
}
} // namespace

static void printSummary(llvm::raw_ostream &os, StringRef file,
                         ModuleOp module) {
  for (auto model : module.getOps<mtp::ModelOp>()) {
    mtp::BackboneOp bb = model.getBackbone();
    mtp::ParameterCount params = mtp::CostModel(model).parameters();
    int64_t tasks = llvm::range_size(model.getTasks());
    os << file << ": OK: model '" << model.getSymName() << "': " << tasks
       << (tasks == 1 ? " task, " : " tasks, ") << bb.getLayers()
       << " layers, " << humanCount(params.total()) << " parameters (backbone "
       << humanCount(params.backbone) << ", heads " << humanCount(params.heads)
       << ", gate " << humanCount(params.gate) << ")\n";
    if (model.getStep()) {
      mtp::MemoryReport memory = mtp::analyzeMemory(model);
      os << "  memory: " << mtp::formatBytes(memory.peakBytes)
         << " peak keeping every activation";
      if (mtp::BudgetOp budget = model.getBudget()) {
        int64_t usable = budget.getUsableBytes();
        os << ", " << mtp::formatBytes(usable) << " usable on "
           << budget.getDevice() << ": ";
        if (memory.peakBytes <= usable)
          os << "fits";
        else
          os << "over by " << mtp::formatBytes(memory.peakBytes - usable)
             << " — `mtpc plan` decides what to recompute or offload";
      }
      os << "\n";
    }
    if (!verbose)
      continue;
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
            .Case("plan", Command::Plan)
            .Case("inspect", Command::Inspect)
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
  if (!cl::ParseCommandLineOptions(
          args.size(), args.data(),
          "mtpc: multi-task training pipeline compiler\n\n"
          "  mtpc check FILE [-v]            check a spec and summarize it\n"
          "  mtpc plan FILE [--format=json]  the memory plan against the budget\n"
          "  mtpc plan FILE --format=fb -o PLAN   the plan as a flatbuffer\n"
          "  mtpc inspect PLAN               verify a flatbuffer plan, print it\n"
          "  mtpc FILE --emit=ast|mlir|step  print the syntax tree or the IR\n\n"
          "FILE is a .mtp spec or spec-level IR (.mlir).\n"
          "Exit codes: 0 ok, 1 the spec has errors, 2 wrong usage.\n",
          &llvm::errs()))
    return kUsageError;

  std::string errorMessage;
  std::unique_ptr<llvm::MemoryBuffer> input =
      openInputFile(inputFilename, &errorMessage);
  if (!input) {
    usageError() << errorMessage << "\n";
    return kUsageError;
  }
  if (command == Command::Inspect) {
    std::unique_ptr<llvm::ToolOutputFile> output =
        openOutputFile(outputFilename, &errorMessage);
    if (!output) {
      usageError() << errorMessage << "\n";
      return kUsageError;
    }
    if (llvm::Error err = mtp::printPlanFile(input->getBuffer(), output->os())) {
      usageError() << inputFilename << ": " << llvm::toString(std::move(err))
                   << "\n";
      return kSpecError;
    }
    output->keep();
    return kOk;
  }
  bool isMlir = llvm::sys::path::extension(inputFilename) == ".mlir";
  if (isMlir && emitAction == Emit::AST) {
    usageError() << "--emit=ast needs a .mtp spec; " << inputFilename
                 << " is IR\n";
    return kUsageError;
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

  std::unique_ptr<llvm::ToolOutputFile> output =
      openOutputFile(outputFilename, &errorMessage);
  if (!output) {
    usageError() << errorMessage << "\n";
    return kUsageError;
  }

  OwningOpRef<ModuleOp> module;
  if (isMlir) {
    TimingScope parseTiming = timing.nest("Parse");
    module = parseSourceFile<ModuleOp>(sourceMgr, &context);
  } else {
    std::optional<mtp::ast::Model> ast;
    {
      TimingScope parseTiming = timing.nest("Parse");
      ast = mtp::parseSpec(sourceMgr, &context);
    }
    if (!ast)
      return kSpecError;
    if (command == Command::Compile && emitAction == Emit::AST) {
      mtp::ast::dump(*ast, output->os());
      output->keep();
      return kOk;
    }
    std::optional<mtp::CheckedSpec> spec;
    {
      TimingScope semaTiming = timing.nest("Sema");
      spec = mtp::checkSpec(*ast, inputFilename, &context);
    }
    if (!spec)
      return kSpecError;
    TimingScope genTiming = timing.nest("MLIRGen");
    module = mtp::mlirGen(*spec, inputFilename, &context);
  }
  if (!module)
    return kSpecError;
  if (module->getOps<mtp::ModelOp>().empty()) {
    emitError(module->getLoc()) << "no 'mtp.model' in " << inputFilename;
    return kSpecError;
  }

  PassManager pm(&context);
  if (failed(applyPassManagerCLOptions(pm)))
    return kUsageError;
  pm.enableTiming(timing);
  pm.addNestedPass<mtp::ModelOp>(mtp::createNormalizeSpec());
  bool wantStep = command == Command::Plan || command == Command::Check ||
                  (command == Command::Compile && emitAction == Emit::Step);
  if (command == Command::Check) {
    // The memory estimate of the summary: the step as written, no plan.
    pm.addNestedPass<mtp::ModelOp>(mtp::createExpandTrainingStep());
    pm.addNestedPass<mtp::ModelOp>(mtp::createFuseTaskGradients());
    pm.addNestedPass<mtp::ModelOp>(mtp::createMemoryAnalysis());
  } else if (wantStep) {
    pm.addNestedPass<mtp::ModelOp>(mtp::createExpandTrainingStep());
    pm.addNestedPass<mtp::ModelOp>(mtp::createFuseTaskGradients());
    pm.addNestedPass<mtp::ModelOp>(mtp::createCompressCollectives());
    if (llvm::all_of(module->getOps<mtp::ModelOp>(),
                     [](mtp::ModelOp m) { return bool(m.getBudget()); }))
      pm.addNestedPass<mtp::ModelOp>(mtp::createPlanMemory());
    // The plan table reads what each unit would keep; the emitted step shows
    // the regions written out (its analysis is then the planned peak).
    if (command == Command::Compile) {
      pm.addNestedPass<mtp::ModelOp>(mtp::createMaterializeOffload());
      pm.addNestedPass<mtp::ModelOp>(mtp::createMaterializeCheckpoints());
    }
    pm.addNestedPass<mtp::ModelOp>(mtp::createMemoryAnalysis());
  }
  if (failed(pm.run(*module)))
    return kSpecError;

  switch (command) {
  case Command::Check:
    printSummary(output->os(), inputFilename, *module);
    break;
  case Command::Plan:
    for (auto model : module->getOps<mtp::ModelOp>()) {
      mtp::MemoryReport report = mtp::analyzeMemory(model);
      if (format == Format::Fb)
        output->os() << mtp::serializePlan(model, report, inputFilename);
      else if (format == Format::Json)
        output->os() << llvm::formatv("{0:2}", mtp::planToJson(model, report))
                     << "\n";
      else
        mtp::printPlan(model, report, output->os());
    }
    break;
  case Command::Inspect: // handled before parsing
    break;
  case Command::Compile:
    module->print(output->os());
    output->os() << "\n";
    break;
  }
  output->keep();
  return kOk;
}
