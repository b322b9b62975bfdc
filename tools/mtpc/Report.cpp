//===- Report.cpp - `mtpc report`: the command ----------------------------===//
//
// The words after `mtpc report`, the metrics file (ReportData), the plan (a
// plan file, or the one a binary built by `mtpc build` embeds, checked as
// `mtpc inspect` checks it), the page (ReportPage) and where it goes.
//
//===----------------------------------------------------------------------===//

#include "Report.h"
#include "ReportData.h"
#include "ReportPage.h"

#include "codegen/Codegen.h"
#include "mtprt/PlanFrame.h"
#include "passes/PlanFile.h"
#include "schema/plan_generated.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FileSystem.h"

#include <set>
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"
#include "llvm/Support/raw_ostream.h"

#include <memory>
#include <optional>
#include <string>

using llvm::StringRef;
using namespace mtp::report;

namespace {
enum ExitCode { kOk = 0, kBadInput = 1, kUsageError = 2 };

const char *const kUsage =
    "usage: mtpc report RUN.jsonl [--plan PLAN|BINARY] [-o report.html]\n"
    "\n"
    "Renders a training run's metrics (the JSON Lines a training binary\n"
    "writes with --metrics FILE) as one self-contained HTML page: loss per\n"
    "task, the gradient cosine heat map, DGFG weights, device memory against\n"
    "the plan, offload, bytes sent, throughput, events. --plan adds the\n"
    "plan's decisions per layer (a plan file from `mtpc plan --format=fb`,\n"
    "or a binary from `mtpc build`, which embeds its plan). -o - (the\n"
    "default) writes to stdout. See docs/report.md.\n";

const char *const kUsageLine =
    "usage: mtpc report RUN.jsonl [--plan PLAN|BINARY] [-o report.html] "
    "(--help for more)\n";
llvm::raw_ostream &error() {
  return llvm::WithColor::error(llvm::errs(), "mtpc report");
}

struct Options {
  std::string input, planPath, output = "-";
};

/// Reads the words after `report`; an exit code where the command ends here
/// (--help, wrong usage).
std::optional<int> parseArgs(llvm::ArrayRef<char *> args, Options &o) {
  std::set<std::string *> given;
  for (size_t i = 1; i < args.size(); ++i) {
    StringRef a = args[i];
    if (a == "-h" || a == "--help" || a == "-help") {
      llvm::outs() << kUsage;
      return kOk;
    }
    std::string *into = nullptr;
    StringRef flag = a.split('=').first;
    if (flag == "--plan" || flag == "-plan")
      into = &o.planPath;
    else if (flag == "-o" || flag == "--o")
      into = &o.output;
    if (into) {
      std::string value;
      if (a.contains('=')) {
        value = a.split('=').second.str();
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        error() << a << " needs a value\n" << kUsageLine;
        return kUsageError;
      }
      if (!given.insert(into).second) {
        error() << flag << " given twice ('" << *into << "' and '" << value
                << "')\n"
                << kUsageLine;
        return kUsageError;
      }
      *into = std::move(value);
      continue;
    }
    if (a.starts_with("-") && a != "-") {
      error() << "unknown option '" << a << "'\n" << kUsageLine;
      return kUsageError;
    }
    if (!o.input.empty()) {
      error() << "one metrics file at a time ('" << o.input << "' and '" << a
              << "')\n"
              << kUsageLine;
      return kUsageError;
    }
    o.input = a.str();
  }
  if (o.input.empty()) {
    error() << "no metrics file\n" << kUsageLine;
    return kUsageError;
  }
  // The page must not replace what it reads.
  for (const std::string *read : {&o.input, &o.planPath})
    if (bool same = false; !read->empty() && !o.output.empty() &&
                           o.output != "-" &&
                           !llvm::sys::fs::equivalent(*read, o.output, same) &&
                           same) {
      error() << "-o " << o.output << " is the input file " << *read
              << "; name another output\n"
              << kUsageLine;
      return kUsageError;
    }
  return std::nullopt;
}

struct PlanInput {
  std::unique_ptr<llvm::MemoryBuffer> buffer;
  StringRef bytes;
  const mtp::fb::Plan *plan = nullptr;
};

/// Reads and verifies the plan at `path`: a plan file, or a training binary
/// carrying one after a marker (mtpc build). An exit code where it cannot.
std::optional<int> loadPlan(StringRef path, PlanInput &plan) {
  auto buf = llvm::MemoryBuffer::getFile(path, /*IsText=*/false,
                                         /*RequiresNullTerminator=*/false);
  if (!buf) {
    error() << "cannot read the plan '" << path
            << "': " << buf.getError().message() << "\n";
    return kUsageError;
  }
  plan.buffer = std::move(*buf);
  plan.bytes = plan.buffer->getBuffer();
  if (!mtprt::looksLikePlan(plan.bytes.data(), plan.bytes.size())) {
    StringRef embedded = mtp::findEmbeddedPlan(plan.bytes);
    if (embedded.empty()) {
      error() << path
              << ": neither a plan (no 'MTPPLAN' header) nor a binary "
                 "carrying one; pass `mtpc plan SPEC --format=fb -o PLAN`'s "
                 "file or the binary `mtpc build` wrote\n";
      return kBadInput;
    }
    plan.bytes = embedded;
  }
  if (llvm::Error err = mtp::verifyPlanFile(plan.bytes)) {
    error() << path << ": " << llvm::toString(std::move(err)) << "\n";
    return kBadInput;
  }
  plan.plan = mtp::getPlan(plan.bytes);
  return std::nullopt;
}

} // namespace

int mtp::runReportCommand(llvm::ArrayRef<char *> args) {
  Options o;
  if (std::optional<int> code = parseArgs(args, o))
    return *code;

  auto inputBuffer =
      llvm::MemoryBuffer::getFileOrSTDIN(o.input, /*IsText=*/true);
  if (!inputBuffer) {
    error() << "cannot read '" << o.input
            << "': " << inputBuffer.getError().message() << "\n";
    return kUsageError;
  }
  llvm::Expected<Run> run = readMetrics((*inputBuffer)->getBuffer(), o.input);
  if (!run) {
    error() << llvm::toString(run.takeError()) << "\n";
    return kBadInput;
  }
  for (const std::string &note : run->notes)
    llvm::WithColor::warning(llvm::errs(), "mtpc report") << note << "\n";

  PlanInput plan;
  if (!o.planPath.empty())
    if (std::optional<int> code = loadPlan(o.planPath, plan))
      return *code;

  std::string page = renderPage(*run, plan.plan, o.planPath);
  std::error_code ec;
  llvm::ToolOutputFile out(o.output, ec, llvm::sys::fs::OF_None);
  if (ec) {
    error() << "cannot write '" << o.output << "': " << ec.message() << "\n";
    return kUsageError;
  }
  out.os() << page;
  out.keep();
  if (o.output != "-")
    llvm::errs() << "mtpc report: wrote " << o.output << " (" << page.size()
                 << " bytes; " << run->records.size() << " steps, "
                 << run->tasks.size() << " tasks, " << run->events.size()
                 << " events" << (plan.plan ? ", plan" : "") << ")\n";
  return kOk;
}
