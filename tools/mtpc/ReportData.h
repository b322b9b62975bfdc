//===- ReportData.h - `mtpc report`: a run's metrics as structs -*- C++ -*-===//
//
// The metrics JSON Lines a training binary writes with `--metrics FILE`
// (docs/runtime-services.md §5, the names in docs/contracts.md), read into
// one Run: the step records in step order, the events, the task names in the
// runtime's order, and the warnings to show.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_TOOLS_MTPC_REPORTDATA_H
#define MTPC_TOOLS_MTPC_REPORTDATA_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mtp::report {

/// A logged number; nullopt where the run wrote null or nothing.
using Opt = std::optional<double>;

struct Record {
  int64_t step = 0;
  unsigned line = 0;
  std::vector<Opt> loss, alpha; // by task index; nullopt = no labels / NaN
  std::vector<std::vector<double>> cosine; // empty: not measured this step
  Opt reuse, checkpointHitRate, offloadHits, offloadMisses, offloadWaitS,
      measuredPeak, predictedPeak, hostPool, bytesSent, bytesSentUncompressed,
      stepTimeS, samplesPerS;
};

struct Event {
  std::string name;
  int64_t step = 0;
  unsigned line = 0;
  std::string detail;
};

/// A held-out evaluation (`--eval-data`): per task its metrics, in a fixed
/// order (accuracy, macro_f1, ..., loss).
struct EvalRecord {
  int64_t step = 0; ///< optimizer steps taken when it ran
  unsigned line = 0;
  int64_t records = 0;
  struct Task {
    std::string name;
    std::vector<std::pair<std::string, Opt>> metrics;
  };
  std::vector<Task> tasks; // the runtime's task order
};

struct Run {
  std::string file;
  std::vector<std::string> tasks; // the runtime's order (loss keys, matrix)
  std::vector<Record> records;
  std::vector<Event> events;
  std::vector<EvalRecord> evals;
  std::vector<std::string> notes; // warnings: printed and shown on the page
  unsigned lines = 0;
};

/// Reads a metrics file's text (`file` names it in errors). Each line is one
/// JSON object: step records have `step` and `loss`, events have `event` and
/// `step`, evaluations `step` and `eval` (task -> metric -> value); anything
/// else is refused with the file and the line. A last line
/// without its newline that does not parse is a run still being written: it
/// is skipped with a note and the rest is read. A step at or before the
/// previous one (a resumed or appended run) replaces the records from that
/// step on, with a note.
llvm::Expected<Run> readMetrics(llvm::StringRef text, llvm::StringRef file);

} // namespace mtp::report

#endif // MTPC_TOOLS_MTPC_REPORTDATA_H
