//===- Search.h - `mtpc search`: the best shape that fits ------*- C++ -*-===//
//
// A spec with search ranges (`layers = 4..12`, `micro_batch = 4..32 by 4`,
// `from layer 2..6`: docs/search.md) names a space of specs. `mtpc search`
// plans each candidate with the full pipeline — the plan, not an estimate —
// keeps those whose plan fits the budget, ranks them by predicted
// throughput (or, with --train-steps, by held-out loss from short runs of
// mtprt-run, pruned by successive halving), prints the best with the Pareto
// front, and writes the chosen spec: the input with each range replaced by
// its value, which `mtpc check` accepts unchanged.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_TOOLS_SEARCH_H
#define MTPC_TOOLS_SEARCH_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <string>

namespace mtp {

struct SearchOptions {
  std::string output;         ///< the chosen spec ("": not written)
  int64_t maxCandidates = 1000; ///< exhaustive up to this many, else sampled
  double timeLimit = 300;     ///< seconds for the whole search
  uint64_t seed = 0;          ///< the sample's and the local search's
  int64_t top = 10;           ///< rows of the table
  int64_t trainSteps = 0;     ///< proxy training's final steps (0: none)
  int64_t trainCandidates = 8; ///< the fastest fitting ones trained
  std::string evalData;       ///< mtprt-run --eval-data ("": synthetic:256)
  std::string runtimeDir;     ///< where mtprt-run is (tools/mtprt-run)
  /// Without training, what ranks the fitting candidates: the plan's
  /// throughput, or capacity (the most parameters, then throughput) — the
  /// source's "spend the budget on the model" reading.
  bool capacity = false;
  int64_t jobs = 0; ///< workers planning candidates (0: one per core)
  /// The planner's branch-and-bound nodes for each candidate's first plan
  /// (then those that found none and the best are planned with mtpc plan's
  /// budget); -1: every plan with mtpc plan's.
  int64_t planNodes = 1000;
};

/// Runs the search over `text` (the spec `filename` holds); the report on
/// `os`, diagnostics on stderr. Exit codes as mtpc's: 0, 1 (the spec or no
/// candidate fits), 2 (usage).
int runSearch(llvm::StringRef filename, llvm::StringRef text,
              const SearchOptions &options, llvm::raw_ostream &os);

} // namespace mtp

#endif // MTPC_TOOLS_SEARCH_H
