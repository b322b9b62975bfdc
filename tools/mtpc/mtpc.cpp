//===- mtpc.cpp - the mtpc compiler driver --------------------------------===//
//
//   mtpc check FILE [-v]          check a spec: errors, or a one-line summary
//   mtpc plan FILE [--format=json] the memory plan against the budget
//   mtpc plan FILE --format=fb -o PLAN  the plan as a flatbuffer
//   mtpc inspect PLAN             verify a flatbuffer plan and print it
//   mtpc report RUN.jsonl [--plan PLAN|BINARY] -o report.html
//                                 a run's metrics as one HTML page (Report.h)
//   mtpc build FILE -o BINARY     the training binary (--emit-project DIR
//                                 stops at the generated CMake project)
//   mtpc profile FILE -o COSTS    builds it, times its segments on this
//                                 machine (JSON for `mtpc plan --costs`)
//   mtpc FILE --emit=ast|mlir|step|cpp|cuda|plan
//                                 print the AST, the spec-level IR, the
//                                 planned step, the C++ step program, the
//                                 specialized CUDA kernels, the plan file
//
// FILE is a .mtp spec or spec-level IR (.mlir). Every MLIR flag users know
// (--mlir-print-ir-after-all, --mlir-timing, --mlir-print-debuginfo, ...)
// works with every subcommand. Exit codes: 0 ok, 1 the spec has errors,
// 2 the tool was used wrongly (missing file, bad flag).
//
//===----------------------------------------------------------------------===//

#include "codegen/Codegen.h"
#include "dialect/InputGuard.h"
#include "dialect/MTPOps.h"
#include "frontend/MLIRGen.h"
#include "frontend/Parser.h"
#include "frontend/Sema.h"
#include "passes/Bytes.h"
#include "passes/CostModel.h"
#include "passes/MemoryAnalysis.h"
#include "passes/PlanFile.h"
#include "mtprt/PlanFrame.h"
#include "passes/PlanReport.h"
#include "passes/Passes.h"
#include "passes/Pipelines.h"
#include "Report.h"
#include "Search.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Support/Timing.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

#include <mutex>

using namespace mlir;
namespace cl = llvm::cl;

namespace {
enum class Command {
  Compile, Check, Plan, Inspect, Build, Profile, Prepare, Search
};
enum class Emit { AST, MLIR, Step, Cpp, Cuda, Plan };
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
                          "the planned training step with its memory analysis"),
               clEnumValN(Emit::Cpp, "cpp",
                          "the C++ step program (EmitC) of the planned step"),
               clEnumValN(Emit::Cuda, "cuda",
                          "the kernels specialized with the spec's constants "
                          "(CUDA C++)"),
               clEnumValN(Emit::Plan, "plan",
                          "the flatbuffer plan (as `plan --format=fb`)")));
cl::opt<std::string> buildDevice(
    "device", cl::desc("build: plan for and build for this device: cpu, or "
                       "cuda (the spec's GPU; CUDA kernels compiled)"),
    cl::init(""));
cl::opt<std::string> buildPrecision(
    "precision", cl::desc("build: plan for this precision (fp32, bf16, fp16)"),
    cl::init(""));
cl::opt<std::string> emitProjectDir(
    "emit-project",
    cl::desc("build: write the CMake project to DIR and stop (build it on "
             "another machine)"),
    cl::value_desc("DIR"), cl::init(""));
cl::opt<std::string> runtimeDir(
    "runtime-dir",
    cl::desc("build: the runtime's build tree (default: $MTPC_RUNTIME_DIR, "
             "else the one built beside this mtpc)"),
    cl::value_desc("DIR"), cl::init(""));
cl::opt<Format> format(
    "format", cl::desc("plan: output format"), cl::init(Format::Text),
    cl::values(clEnumValN(Format::Text, "text", "a table for the terminal"),
               clEnumValN(Format::Json, "json",
                          "JSON, schema mtpc.plan/1 (docs/plan-format.md)"),
               clEnumValN(Format::Fb, "fb",
                          "a flatbuffer (runtime/schema/plan.fbs) for the "
                          "runtime and `mtpc inspect`")));
cl::opt<std::string> costsFile(
    "costs",
    cl::desc("plan, build: plan with the segment costs `mtpc profile` "
             "measured on the target (JSON) instead of the cost model's "
             "roofline"),
    cl::value_desc("FILE"), cl::init(""));
cl::opt<std::string> profileThreads(
    "profile-threads",
    cl::desc("profile: intra-op threads the program times its segments with "
             "(default: the runtime's)"),
    cl::value_desc("N"), cl::init(""));
cl::opt<int64_t> searchMaxCandidates(
    "max-candidates",
    cl::desc("search: plan every candidate up to this many, else a seeded "
             "sample and a local search of this many"),
    cl::value_desc("N"), cl::init(1000));
cl::opt<double> searchTimeLimit(
    "time-limit", cl::desc("search: stop planning after this many seconds"),
    cl::value_desc("S"), cl::init(300));
cl::opt<uint64_t> searchSeed("seed",
                             cl::desc("search: the sample's seed (a large "
                                      "space's candidates)"),
                             cl::value_desc("N"), cl::init(0));
cl::opt<int64_t> searchTop("top", cl::desc("search: rows of the table"),
                           cl::value_desc("N"), cl::init(10));
cl::opt<int64_t> searchTrainSteps(
    "train-steps",
    cl::desc("search: rank the fastest fitting candidates by held-out loss "
             "after short runs of mtprt-run (successive halving; the last "
             "round N steps)"),
    cl::value_desc("N"), cl::init(0));
cl::opt<int64_t> searchTrainCandidates(
    "train-candidates",
    cl::desc("search: how many of the fastest fitting candidates train"),
    cl::value_desc("K"), cl::init(8));
cl::opt<int64_t> searchJobs(
    "jobs",
    cl::desc("search: candidates planned side by side (default: one per "
             "core; the result is the same for any number)"),
    cl::value_desc("N"), cl::init(0));
cl::opt<int64_t> searchPlanNodes(
    "plan-nodes",
    cl::desc("search: the planner's branch-and-bound nodes for each "
             "candidate's first plan; the best and those it did not fit are "
             "planned again with mtpc plan's (-1: all with mtpc plan's)"),
    cl::value_desc("N"), cl::init(1000));
enum class SearchObjective { Throughput, Capacity };
cl::opt<SearchObjective> searchObjective(
    "objective",
    cl::desc("search: without --train-steps, what ranks the candidates that "
             "fit"),
    cl::values(clEnumValN(SearchObjective::Throughput, "throughput",
                          "the plan's predicted samples per second"),
               clEnumValN(SearchObjective::Capacity, "capacity",
                          "the most parameters, then throughput")),
    cl::init(SearchObjective::Throughput));
cl::opt<std::string> searchEvalData(
    "eval-data",
    cl::desc("search: the held-out data of the proxy runs (default: "
             "synthetic:256)"),
    cl::value_desc("PATH"), cl::init(""));
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

namespace {
/// The reports the pipelines' memory analysis computed, by model: the tool
/// prints and serializes those instead of analyzing the step again.
class MemoryReports {
public:
  mtp::MemoryReportSink sink() {
    return [this](mtp::ModelOp model, const mtp::MemoryReport &report) {
      std::lock_guard<std::mutex> lock(mutex);
      reports[model.getOperation()] = report;
    };
  }
  /// Every pipeline mtpc runs ends in the analysis; a model it did not
  /// reach is analyzed here rather than read out of nothing.
  const mtp::MemoryReport &of(mtp::ModelOp model) {
    auto [it, fresh] = reports.try_emplace(model.getOperation());
    if (fresh)
      it->second = mtp::analyzeMemory(model);
    return it->second;
  }

private:
  std::mutex mutex;
  llvm::DenseMap<Operation *, mtp::MemoryReport> reports;
};
} // namespace

static void printSummary(llvm::raw_ostream &os, StringRef file,
                         ModuleOp module, MemoryReports &reports) {
  for (auto model : module.getOps<mtp::ModelOp>()) {
    mtp::BackboneOp bb = model.getBackbone();
    mtp::ParameterCount params = mtp::CostModel(model).parameters();
    int64_t tasks = llvm::range_size(model.getTasks());
    os << file << ": OK: model '" << model.getSymName() << "': " << tasks
       << (tasks == 1 ? " task, " : " tasks, ") << bb.getLayers()
       << " layers, " << humanCount(params.total()) << " parameters (backbone "
       << humanCount(params.backbone) << ", heads " << humanCount(params.heads)
       << ", gate " << humanCount(params.gate) << ")\n";
    if (std::optional<ArrayRef<int64_t>> f = bb.getFreeze()) {
      const int64_t frozen =
          params.total() - mtp::CostModel(model).trainableParameters();
      os << "  frozen: ";
      if ((*f)[0] == 0)
        os << "embeddings" << ((*f)[1] > 0 ? ", " : "");
      if ((*f)[1] > 0)
        os << "layers " << std::max<int64_t>(1, (*f)[0]) << ".." << (*f)[1];
      os << " (" << humanCount(frozen)
         << " parameters: no gradients, no optimizer state"
         << ((*f)[0] == 0 ? "; run without autograd" : "") << ")\n";
    }
    if (model.getStep()) {
      const mtp::MemoryReport &memory = reports.of(model);
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
    if (mtp::StrategyOp strategy = model.getStrategy()) {
      // As the IR spells each decision (the lowered IR a user tunes with).
      os << "  strategy  ";
      llvm::interleave(
          strategy->getAttrs(), os,
          [&](NamedAttribute a) {
            os << a.getName().getValue() << " = " << a.getValue();
          },
          "\n            ");
      os << "\n";
      // npd(share): which tasks read one adapter.
      if (std::optional<mtprt::AdapterConfig> ad =
              mtp::CostModel(model).adapters();
          ad && !ad->owner.empty()) {
        SmallVector<mtp::TaskOp> tasks(model.getTasks());
        os << "  adapters  ";
        bool first = true;
        for (size_t i = 0; i < tasks.size(); ++i) {
          if (ad->owner[i] != int64_t(i))
            continue;
          SmallVector<StringRef> members;
          for (size_t j = 0; j < tasks.size(); ++j)
            if (ad->owner[j] == int64_t(i))
              members.push_back(tasks[j].getSymName());
          os << (first ? "" : "; ");
          first = false;
          if (members.size() == 1)
            os << members.front() << " its own";
          else
            os << llvm::join(members, ", ") << " share "
               << tasks[i].getSymName() << "'s";
        }
        if (ad->regroup)
          os << " (at the start: split below " << llvm::format("%g", *ad->share)
             << " every " << ad->regroup << " steps)";
        os << "\n";
      }
    }
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

/// --device / --precision: the plan is made for the target the binary will
/// run on, and records it.
static LogicalResult retarget(ModuleOp module) {
  for (mtp::ModelOp model : module.getOps<mtp::ModelOp>()) {
    mtp::BudgetOp budget = model.getBudget();
    if (!budget) {
      if (buildDevice.empty() && buildPrecision.empty())
        continue;
      usageError() << "model '" << model.getSymName()
                   << "' has no budget to retarget; add a `budget { device = "
                      "... }` block\n";
      return failure();
    }
    if (buildDevice == "cpu") {
      budget.setDevice("cpu");
    } else if (buildDevice == "cuda") {
      if (budget.getDevice() == "cpu") {
        usageError() << inputFilename
                     << ": the budget names device cpu; name the GPU it will "
                        "run on (e.g. `device = H100_80GB`) to build for "
                        "CUDA\n";
        return failure();
      }
    } else if (!buildDevice.empty()) {
      usageError() << "--device=" << buildDevice << ": expected cpu or cuda\n";
      return failure();
    }
    if (!buildPrecision.empty()) {
      std::optional<mtp::Precision> p = mtp::symbolizePrecision(buildPrecision);
      if (!p) {
        usageError() << "--precision=" << buildPrecision
                     << ": expected fp32, bf16 or fp16\n";
        return failure();
      }
      budget.setPrecision(*p);
    }
    if (failed(mlir::verify(budget)))
      return failure();
  }
  return success();
}

static std::string runtimeBuildDir() {
  if (!runtimeDir.empty())
    return runtimeDir;
  if (const char *env = std::getenv("MTPC_RUNTIME_DIR"))
    return env;
  return MTPC_DEFAULT_RUNTIME_DIR;
}

/// Runs `args`, its output to `log`; true when it exits 0.
static bool runLogged(ArrayRef<StringRef> args, StringRef log) {
  std::optional<StringRef> redirects[] = {std::nullopt, log, log};
  std::string message;
  int rc = llvm::sys::ExecuteAndWait(args[0], args, std::nullopt, redirects,
                                     /*SecondsToWait=*/0, /*MemoryLimit=*/0,
                                     &message);
  if (rc != 0 && !message.empty()) {
    std::error_code ec;
    llvm::raw_fd_ostream f(log, ec, llvm::sys::fs::OF_Append);
    f << "\nmtpc: " << args[0] << ": " << message << "\n";
  }
  return rc == 0;
}

/// `mtpc build`: the project, then (unless --emit-project) the binary.
static int build(ModuleOp module, StringRef planBytes, StringRef binary,
                 raw_ostream &os) {
  mtp::ModelOp model = *module.getOps<mtp::ModelOp>().begin();
  const bool project = !emitProjectDir.empty();
  if (!project && binary == "-") {
    usageError() << "build: name the binary with -o BINARY (or write the "
                    "project with --emit-project DIR)\n";
    return kUsageError;
  }
  mtp::ProjectFiles files;
  files.modelName = model.getSymName().str();
  files.source = llvm::sys::path::filename(inputFilename).str();
  files.planBytes = planBytes.str();
  files.kernelsCpu = mtp::emitKernelsCpu(model);
  files.kernelsCuda = mtp::emitKernelsCuda(model);
  files.kernelsVec = mtp::emitKernelsVec(model);
  files.cuda = buildDevice == "cuda";
  {
    llvm::raw_string_ostream step(files.stepCpp);
    if (failed(mtp::emitStepCpp(module, step, files.source)))
      return kSpecError;
  }
  std::string runtime = runtimeBuildDir();
  llvm::SmallString<256> configFile(runtime);
  llvm::sys::path::append(configFile, "mtprtConfig.cmake");
  const bool haveRuntime = llvm::sys::fs::exists(configFile);
  llvm::SmallString<256> dir(project ? StringRef(emitProjectDir)
                                     : StringRef((binary + ".project").str()));
  llvm::sys::fs::make_absolute(dir);
  if (llvm::Error err = mtp::writeProject(dir, files, runtime)) {
    usageError() << llvm::toString(std::move(err)) << "\n";
    return kUsageError;
  }
  if (project) {
    os << "mtpc: wrote the project of model '" << files.modelName << "' to "
       << dir << "\n  build it: cmake -G Ninja -S " << dir << " -B " << dir
       << "/build" << (files.cuda ? " -DMTP_CUDA=ON" : "")
       << (haveRuntime ? "" : " -Dmtprt_DIR=<the runtime's build tree>")
       << " && cmake --build " << dir << "/build\n";
    return kOk;
  }
  if (!haveRuntime) {
    usageError() << "build: no runtime at " << runtime
                 << " (no mtprtConfig.cmake); build it with scripts/build.sh, "
                    "or point --runtime-dir / $MTPC_RUNTIME_DIR at its build "
                    "tree\n";
    return kUsageError;
  }
  llvm::ErrorOr<std::string> cmake = llvm::sys::findProgramByName("cmake");
  if (!cmake) {
    usageError() << "build: cmake is not on PATH; install it (scripts/setup.sh) "
                    "or use --emit-project DIR\n";
    return kUsageError;
  }
  llvm::SmallString<256> buildDir(dir), configureLog(dir), buildLog(dir);
  llvm::sys::path::append(buildDir, "build");
  llvm::sys::path::append(configureLog, "configure.log");
  llvm::sys::path::append(buildLog, "build.log");
  SmallVector<std::string> configure = {*cmake, "-S", dir.str().str(), "-B",
                                        buildDir.str().str(), "-Wno-dev"};
  if (llvm::sys::findProgramByName("ninja"))
    configure.insert(configure.begin() + 1, {"-G", "Ninja"});
  configure.push_back(files.cuda ? "-DMTP_CUDA=ON" : "-DMTP_CUDA=OFF");
  SmallVector<StringRef> configureArgs(configure.begin(), configure.end());
  StringRef buildArgs[] = {*cmake, "--build", buildDir};
  StringRef failedLog;
  if (!runLogged(configureArgs, configureLog))
    failedLog = configureLog;
  else if (!runLogged(buildArgs, buildLog))
    failedLog = buildLog;
  if (!failedLog.empty()) {
    usageError() << "build: the generated project of model '"
                 << files.modelName
                 << "' failed to build. This is a bug in mtpc, not in your "
                    "spec: please report it with the project ("
                 << dir << ") and its log (" << failedLog
                 << "). The log ends:\n";
    if (auto text = llvm::MemoryBuffer::getFile(failedLog)) {
      SmallVector<StringRef> lines;
      (*text)->getBuffer().split(lines, '\n');
      for (size_t i = lines.size() > 40 ? lines.size() - 40 : 0;
           i < lines.size(); ++i)
        llvm::errs() << "  " << lines[i] << "\n";
    }
    return kSpecError;
  }
  llvm::SmallString<256> built(buildDir);
  llvm::sys::path::append(built, files.modelName);
  if (std::error_code ec = llvm::sys::fs::copy_file(built, binary)) {
    usageError() << "build: cannot write " << binary << ": " << ec.message()
                 << "\n";
    return kUsageError;
  }
  llvm::sys::fs::setPermissions(binary,
                                llvm::sys::fs::all_read |
                                    llvm::sys::fs::all_exe |
                                    llvm::sys::fs::owner_write);
  mtp::StepPlanAttr plan = model.getStep().getPlanAttr();
  os << "mtpc: built " << binary << " (model '" << files.modelName
     << "', " << (files.cuda ? "cuda" : "cpu") << ", predicted peak "
     << (plan ? plan.getPlannedPeakBytes() : -1) << " B; project in " << dir << ")\n";
  return kOk;
}

/// Where `mtpc prepare` finds Python: $MTPC_PYTHON, the project's venv
/// (scripts/setup.sh: $MTPC_CACHE or ~/.cache/mtpc), python3 on the PATH.
static std::string preparePython() {
  if (const char *env = std::getenv("MTPC_PYTHON"))
    return env;
  llvm::SmallString<256> venv;
  if (const char *cache = std::getenv("MTPC_CACHE")) {
    venv = cache;
  } else if (llvm::sys::path::home_directory(venv)) {
    llvm::sys::path::append(venv, ".cache", "mtpc");
  }
  llvm::sys::path::append(venv, "venv", "bin", "python");
  if (llvm::sys::fs::can_execute(venv))
    return venv.str().str();
  if (auto found = llvm::sys::findProgramByName("python3"))
    return *found;
  return "";
}

/// `mtpc prepare SPEC INPUT -o OUT.shard ...`: the spec's model and tasks
/// as a request file for tools/prepare/mtpc_prepare.py (the tokenizers and
/// sentencepiece packages live in Python), which does the rest.
static int prepare(ModuleOp module, ArrayRef<std::string> rest) {
  mtp::ModelOp model = *module.getOps<mtp::ModelOp>().begin();
  mtp::BackboneOp bb = model.getBackbone();
  llvm::json::Array tasks;
  for (mtp::TaskOp t : model.getTasks()) {
    const bool mse = t.getLoss() == mtp::LossKind::mse;
    tasks.push_back(llvm::json::Object{
        {"name", t.getSymName()},
        {"head", mtp::stringifyHeadKind(t.getHead())},
        {"loss", mse ? "mse" : "cross_entropy"},
        {"classes", int64_t(t.getClasses().value_or(t.getLabels().value_or(0)))},
        {"target_seq", int64_t(t.getTargetSeq().value_or(0))},
        {"target_vocab", int64_t(t.getVocab().value_or(0))}});
  }
  llvm::json::Object backbone{
      {"kind", mtp::stringifyBackboneKind(bb.getKind())},
      {"seq", int64_t(bb.getSeq())},
      {"vocab", int64_t(bb.getVocab())},
      {"type_vocab", bb.isPostNorm() ? int64_t(bb.getTypeVocabRows()) : 0}};
  if (bb.getWeights()) {
    llvm::SmallString<256> dir(llvm::sys::path::parent_path(inputFilename));
    if (llvm::sys::path::is_absolute(*bb.getWeights()))
      dir = *bb.getWeights();
    else
      llvm::sys::path::append(dir, *bb.getWeights());
    backbone["weights"] = dir.str().str();
  }
  llvm::json::Object request{{"spec", inputFilename.getValue()},
                             {"model", model.getSymName()},
                             {"backbone", std::move(backbone)},
                             {"tasks", std::move(tasks)}};
  llvm::SmallString<256> requestFile;
  int fd = -1;
  if (std::error_code ec = llvm::sys::fs::createTemporaryFile(
          "mtpc-prepare", "json", fd, requestFile)) {
    usageError() << "prepare: cannot write a scratch file: " << ec.message()
                 << "\n";
    return kUsageError;
  }
  {
    llvm::raw_fd_ostream f(fd, /*shouldClose=*/true);
    f << llvm::json::Value(std::move(request));
  }
  const std::string python = preparePython();
  llvm::SmallString<256> script(MTPC_SOURCE_DIR);
  llvm::sys::path::append(script, "tools", "prepare", "mtpc_prepare.py");
  if (const char *env = std::getenv("MTPC_PREPARE_SCRIPT"))
    script = env;
  if (python.empty() || !llvm::sys::fs::exists(script)) {
    llvm::sys::fs::remove(requestFile);
    usageError() << "prepare: needs Python with the tokenizers package (run "
                    "scripts/setup.sh, or set MTPC_PYTHON) and "
                 << script << "\n";
    return kUsageError;
  }
  SmallVector<StringRef> args = {python, script, "--request", requestFile};
  for (const std::string &a : rest)
    args.push_back(a);
  std::string message;
  int rc = llvm::sys::ExecuteAndWait(python, args, std::nullopt, {}, 0, 0,
                                     &message);
  llvm::sys::fs::remove(requestFile);
  if (rc < 0) {
    usageError() << "prepare: " << python << ": " << message << "\n";
    return kUsageError;
  }
  return rc;
}

/// `mtpc profile`: the binary, built in a scratch directory, times the
/// spec's segments on this machine and writes them to -o (UnitProfile.h).
static int profile(ModuleOp module, StringRef planBytes, raw_ostream &os) {
  if (outputFilename == "-" || !emitProjectDir.empty()) {
    usageError() << "profile: name the costs file with -o COSTS.json\n";
    return kUsageError;
  }
  // The options before the build (a minute): the program would refuse them
  // only after it.
  if (!profileThreads.empty() && profileThreads != "auto") {
    unsigned threads = 0;
    if (StringRef(profileThreads).getAsInteger(10, threads) || threads < 1 ||
        threads > 1024) {
      usageError() << "profile: --profile-threads expects auto or a whole "
                      "number in [1, 1024], got '"
                   << profileThreads << "'\n";
      return kUsageError;
    }
  }
  {
    llvm::SmallString<256> dir(outputFilename.getValue());
    llvm::sys::fs::make_absolute(dir);
    if (llvm::sys::fs::is_directory(dir)) {
      usageError() << "profile: -o " << outputFilename
                   << " is a directory; name the costs file (COSTS.json)\n";
      return kUsageError;
    }
    llvm::sys::path::remove_filename(dir);
    if (!llvm::sys::fs::is_directory(dir) ||
        llvm::sys::fs::access(dir, llvm::sys::fs::AccessMode::Write)) {
      usageError() << "profile: cannot write -o " << outputFilename << ": "
                   << dir << " is not a writable directory\n";
      return kUsageError;
    }
  }
  llvm::SmallString<256> scratch;
  if (std::error_code ec =
          llvm::sys::fs::createUniqueDirectory("mtpc-profile", scratch)) {
    usageError() << "profile: cannot make a scratch directory: "
                 << ec.message() << "\n";
    return kUsageError;
  }
  llvm::SmallString<256> binary(scratch);
  llvm::sys::path::append(binary, "program");
  std::string ignored;
  llvm::raw_string_ostream quiet(ignored);
  if (int rc = build(module, planBytes, binary, quiet); rc != kOk)
    return rc;
  llvm::SmallString<256> costs(outputFilename.getValue());
  llvm::sys::fs::make_absolute(costs);
  llvm::SmallString<256> log(scratch);
  llvm::sys::path::append(log, "profile.log");
  SmallVector<StringRef> args = {binary, "--steps", "0", "--profile-units",
                                 costs};
  if (!profileThreads.empty())
    args.append({"--threads", profileThreads});
  if (buildDevice == "cuda")
    args.append({"--device", "cuda"});
  if (!runLogged(args, log)) {
    // Its error lines (else its last ones) here; the log kept, the binary
    // (~10 MB) removed.
    usageError() << "profile: the program failed to time its segments (log: "
                 << log << "):\n";
    if (auto text = llvm::MemoryBuffer::getFile(log)) {
      SmallVector<StringRef> lines, errors;
      (*text)->getBuffer().split(lines, '\n', -1, false);
      for (StringRef l : lines)
        if (l.contains_insensitive("error"))
          errors.push_back(l);
      ArrayRef<StringRef> shown = errors;
      if (shown.empty())
        shown = ArrayRef<StringRef>(lines).take_back(10);
      for (StringRef l : shown)
        llvm::errs() << "  " << l << "\n";
    }
    llvm::sys::fs::remove(binary);
    return kSpecError;
  }
  llvm::sys::fs::remove_directories(scratch);
  os << "mtpc: wrote the segments' costs of model '"
     << (*module.getOps<mtp::ModelOp>().begin()).getSymName() << "' to "
     << outputFilename << "; plan with them: mtpc plan " << inputFilename
     << " --costs " << outputFilename << "\n";
  return kOk;
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);

  // The subcommand is a leading word, so every MLIR flag (registered on the
  // top-level command line) applies to each of them.
  Command command = Command::Compile;
  SmallVector<char *> args(argv, argv + argc);
  // `report` reads metrics, not a spec: its own arguments (Report.h).
  if (args.size() > 1 && StringRef(args[1]) == "report")
    return mtp::runReportCommand(ArrayRef<char *>(args).drop_front());
  // `prepare SPEC ...`: the spec is compiled here, the rest is the data
  // tool's (mtpc_prepare.py: --help lists it).
  std::vector<std::string> prepareArgs;
  if (args.size() > 1 && StringRef(args[1]) == "prepare") {
    if (args.size() < 3 || StringRef(args[2]).starts_with("-")) {
      llvm::errs() << "usage: mtpc prepare SPEC INPUT -o OUT.shard [--format "
                      "jsonl|csv|tsv|conll] [--text COL[,COL]] [--task "
                      "TASK=COLUMN]... [--tokenizer PATH] [--label-vocab "
                      "FILE] [--skip-bad]\n       mtpc prepare SPEC --merge "
                      "A.shard B.shard... -o OUT.shard\n";
      return kUsageError;
    }
    for (size_t i = 3; i < args.size(); ++i)
      prepareArgs.push_back(args[i]);
    args.resize(3);
    args.erase(args.begin() + 1);
    command = Command::Prepare;
  }
  if (args.size() > 1) {
    std::optional<Command> sub =
        llvm::StringSwitch<std::optional<Command>>(args[1])
            .Case("check", Command::Check)
            .Case("plan", Command::Plan)
            .Case("inspect", Command::Inspect)
            .Case("build", Command::Build)
            .Case("profile", Command::Profile)
            .Case("search", Command::Search)
            .Default(std::nullopt);
    if (sub && command != Command::Prepare) {
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
          "  mtpc inspect PLAN|BINARY        verify a flatbuffer plan, print it\n"
          "  mtpc report RUN.jsonl [--plan PLAN|BINARY] -o report.html\n"
          "                                  a run's metrics as one HTML page\n"
          "  mtpc build FILE -o BINARY [--device cpu|cuda] [--emit-project DIR]\n"
          "                                  the training binary\n"
          "  mtpc profile FILE -o COSTS [--profile-threads N]\n"
          "                                  its segments timed on this machine,\n"
          "                                  for mtpc plan FILE --costs COSTS\n"
          "  mtpc search FILE [-o BEST.mtp] [--max-candidates N] "
          "[--time-limit S]\n"
          "              [--seed N] [--objective=throughput|capacity]\n"
          "              [--train-steps N [--train-candidates K]]\n"
          "                                  the best candidate of its search\n"
          "                                  ranges (layers = 4..12) that "
          "fits\n"
          "  mtpc prepare FILE DATA -o OUT.shard [...]\n"
          "                                  text data tokenized into a shard\n"
          "                                  (mtpc prepare FILE --help)\n"
          "  mtpc FILE --emit=ast|mlir|step|cpp|cuda|plan\n"
          "                                  the syntax tree, the IR, the step\n"
          "                                  program, the kernels, the plan\n\n"
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
  // What is written must not be what is read (a spec turned into costs, a
  // plan into its text): the same file by any name.
  if (bool same = false; outputFilename != "-" && inputFilename != "-" &&
                         !llvm::sys::fs::equivalent(inputFilename,
                                                    outputFilename, same) &&
                         same) {
    usageError() << "-o " << outputFilename << " is the input file "
                 << inputFilename << "; name another output\n";
    return kUsageError;
  }
  // A spec is a page of text: a far larger file is the wrong one (named
  // here, not at a line of it, which may be megabytes long).
  if (command != Command::Inspect &&
      input->getBufferSize() > mtp::ParseLimits().maxBytes) {
    llvm::WithColor::error(llvm::errs(), inputFilename)
        << "file is " << input->getBufferSize()
        << " bytes; a spec may be at most " << mtp::ParseLimits().maxBytes
        << " bytes (is it a spec?)\n";
    return kSpecError;
  }
  if (command == Command::Inspect) {
    if (format.getNumOccurrences()) {
      usageError() << "inspect prints the plan as text; --format is plan's "
                      "(mtpc plan SPEC --format=json)\n";
      return kUsageError;
    }
    std::unique_ptr<llvm::ToolOutputFile> output =
        openOutputFile(outputFilename, &errorMessage);
    if (!output) {
      usageError() << errorMessage << "\n";
      return kUsageError;
    }
    StringRef bytes = input->getBuffer();
    // A training binary carries its plan after a marker (mtpc build).
    // (Not one: the plan file's own checks say what is wrong with it.)
    if (!mtprt::looksLikePlan(bytes.data(), bytes.size()))
      if (StringRef embedded = mtp::findEmbeddedPlan(bytes); !embedded.empty())
        bytes = embedded;
    if (llvm::Error err = mtp::printPlanFile(bytes, output->os())) {
      usageError() << inputFilename << ": " << llvm::toString(std::move(err))
                   << "\n";
      return kSpecError;
    }
    output->keep();
    return kOk;
  }
  bool isMlir = llvm::sys::path::extension(inputFilename) == ".mlir";
  if (command == Command::Search) {
    if (isMlir) {
      usageError() << "search reads a .mtp spec with search ranges; "
                   << inputFilename << " is IR\n";
      return kUsageError;
    }
    if (searchMaxCandidates < 1 || searchTop < 1 || searchTrainSteps < 0 ||
        searchTrainCandidates < 1 || !(searchTimeLimit > 0) ||
        searchJobs < 0 || searchJobs > 256) {
      usageError() << "search: --max-candidates, --top and "
                      "--train-candidates must be at least 1, --train-steps "
                      "at least 0, --time-limit positive, --jobs 0 to 256\n";
      return kUsageError;
    }
    // What only the training rounds read is refused without them, and a
    // held-out file that is not there now, not after every plan.
    if (searchTrainSteps == 0 && (searchEvalData.getNumOccurrences() ||
                                  searchTrainCandidates.getNumOccurrences())) {
      usageError() << "search: --eval-data and --train-candidates rank by "
                      "training runs, which --train-steps N turns on\n";
      return kUsageError;
    }
    if (!searchEvalData.empty() &&
        !StringRef(searchEvalData).starts_with("synthetic:") &&
        !llvm::sys::fs::exists(searchEvalData)) {
      usageError() << "search: --eval-data " << searchEvalData
                   << " does not exist\n";
      return kUsageError;
    }
    mtp::SearchOptions o;
    o.output = outputFilename == "-" ? "" : outputFilename.getValue();
    o.maxCandidates = searchMaxCandidates;
    o.timeLimit = searchTimeLimit;
    o.seed = searchSeed;
    o.top = searchTop;
    o.trainSteps = searchTrainSteps;
    o.trainCandidates = searchTrainCandidates;
    o.evalData = searchEvalData;
    o.capacity = searchObjective == SearchObjective::Capacity;
    o.jobs = searchJobs;
    o.planNodes = searchPlanNodes < 0 ? -1 : int64_t(searchPlanNodes);
    o.runtimeDir = runtimeBuildDir();
    return mtp::runSearch(inputFilename, input->getBuffer(), o, llvm::outs());
  }
  if (isMlir && emitAction == Emit::AST) {
    usageError() << "--emit=ast needs a .mtp spec; " << inputFilename
                 << " is IR\n";
    return kUsageError;
  }

  DialectRegistry registry;
  registry.insert<mtp::MTPDialect>();
  MLIRContext context(registry);
  // Users read diagnostics against their spec, not the op's generic form.
  context.printOpOnDiagnostic(false);
  context.loadAllAvailableDialects();

  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(input), SMLoc());
  SourceMgrDiagnosticHandler diagHandler(sourceMgr, &context);

  DefaultTimingManager tm;
  applyDefaultTimingManagerCLOptions(tm);
  TimingScope timing = tm.getRootScope();

  // build's -o names the binary, which it writes itself (profile's the costs
  // file, which the binary writes).
  const bool isBuild =
      command == Command::Build || command == Command::Profile;
  std::unique_ptr<llvm::ToolOutputFile> output = openOutputFile(
      isBuild ? std::string("-") : outputFilename.getValue(),
      &errorMessage);
  if (!output) {
    usageError() << errorMessage << "\n";
    return kUsageError;
  }

  OwningOpRef<ModuleOp> module;
  if (isMlir) {
    TimingScope parseTiming = timing.nest("Parse");
    if (failed(mtp::checkIRNesting(sourceMgr, sourceMgr.getMainFileID())))
      return kSpecError;
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
    // The data file is the binary's to read, but `check` says now when it
    // is not there (the others warn: data may come after the build).
    bool missing = false;
    auto checkFile = [&](const std::optional<std::string> &file,
                         mtp::ast::Location at, StringRef what,
                         StringRef flag) {
      if (!file)
        return;
      llvm::SmallString<256> path(*file);
      if (!llvm::sys::path::is_absolute(path)) {
        path = llvm::sys::path::parent_path(inputFilename);
        llvm::sys::path::append(path, *file);
      }
      if (llvm::sys::fs::exists(path))
        return;
      auto loc = FileLineColLoc::get(&context, inputFilename, at.line, at.col);
      const std::string message =
          (what + " file " + path.str() +
           " does not exist; make it with `mtpc prepare` (docs/data.md)")
              .str();
      if (command == Command::Check) {
        emitError(loc) << message
                       << (flag == "--data" ? " or write data = synthetic"
                                            : "");
        missing = true;
      } else {
        emitWarning(loc) << message << " (the binary reads it, or " << flag
                         << ")";
      }
    };
    checkFile(spec->train.dataPath, spec->train.dataLoc, "data", "--data");
    checkFile(spec->train.evalPath, spec->train.evalLoc, "eval data",
              "--eval-data");
    if (missing)
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

  if (isBuild) {
    if (failed(retarget(*module)))
      return kUsageError;
  } else if (!buildDevice.empty() || !buildPrecision.empty() ||
             !emitProjectDir.empty()) {
    usageError() << "--device, --precision and --emit-project go with "
                    "`mtpc build`\n";
    return kUsageError;
  }
  const bool emitsCode = isBuild ||
                         (command == Command::Compile &&
                          (emitAction == Emit::Cpp || emitAction == Emit::Plan));
  if (emitsCode && llvm::range_size(module->getOps<mtp::ModelOp>()) != 1) {
    emitError(module->getLoc())
        << inputFilename << " holds several models; a training program is "
        << "built from one";
    return kSpecError;
  }

  MemoryReports reports;
  PassManager pm(&context);
  if (failed(applyPassManagerCLOptions(pm)))
    return kUsageError;
  pm.enableTiming(timing);
  const bool wantPlanFile = isBuild ||
                            (command == Command::Compile &&
                             emitAction == Emit::Plan);
  const bool wantStep =
      command == Command::Plan || command == Command::Check || emitsCode ||
      (command == Command::Compile &&
       (emitAction == Emit::Step || emitAction == Emit::Cuda));
  if (command == Command::Check) {
    mtp::buildCheckPipeline(pm, reports.sink());
  } else if (wantStep) {
    mtp::PlanPipelineOptions options;
    options.planMemory = llvm::all_of(module->getOps<mtp::ModelOp>(),
                                      [](mtp::ModelOp m) {
                                        return bool(m.getBudget());
                                      });
    options.materialize =
        command == Command::Compile && emitAction != Emit::Plan;
    options.costs = costsFile.getValue();
    mtp::buildPlanPipeline(pm, options, reports.sink());
  } else {
    pm.addNestedPass<mtp::ModelOp>(mtp::createNormalizeSpec());
  }
  if (failed(pm.run(*module)))
    return kSpecError;

  // The plan file is written from the planned step; the program from the
  // same step with the plan materialized (whose analysis is the same peak).
  std::string planBytes;
  if (wantPlanFile) {
    mtp::ModelOp model = *module->getOps<mtp::ModelOp>().begin();
    planBytes =
        mtp::serializePlan(model, reports.of(model), inputFilename);
    if (isBuild) {
      PassManager materializePm(&context);
      if (failed(applyPassManagerCLOptions(materializePm)))
        return kUsageError;
      materializePm.enableTiming(timing);
      mtp::buildMaterializePipeline(materializePm);
      if (failed(materializePm.run(*module)))
        return kSpecError;
    }
  }

  switch (command) {
  case Command::Check:
    printSummary(output->os(), inputFilename, *module, reports);
    break;
  case Command::Plan:
    for (auto model : module->getOps<mtp::ModelOp>()) {
      const mtp::MemoryReport &report = reports.of(model);
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
  case Command::Search:
    break;
  case Command::Prepare:
    return prepare(*module, prepareArgs);
  case Command::Build: {
    TimingScope buildTiming = timing.nest("Build");
    int rc = build(*module, planBytes, outputFilename, output->os());
    if (rc != kOk)
      return rc;
    break;
  }
  case Command::Profile: {
    TimingScope profileTiming = timing.nest("Profile");
    int rc = profile(*module, planBytes, output->os());
    if (rc != kOk)
      return rc;
    break;
  }
  case Command::Compile:
    switch (emitAction) {
    case Emit::Cpp:
      if (failed(mtp::emitStepCpp(*module, output->os(),
                                  llvm::sys::path::filename(inputFilename))))
        return kSpecError;
      break;
    case Emit::Cuda:
      for (auto model : module->getOps<mtp::ModelOp>())
        output->os() << mtp::emitKernelsCuda(model);
      break;
    case Emit::Plan:
      output->os() << planBytes;
      break;
    default:
      module->print(output->os());
      output->os() << "\n";
    }
    break;
  }
  output->keep();
  return kOk;
}
