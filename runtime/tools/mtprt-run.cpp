//===- mtprt-run.cpp - train what a plan describes -------------------------===//
//
//   mtprt-run --plan PLAN [driver flags]
//
// The driver on the model, heads and schedule of a flatbuffer plan
// (`mtpc plan SPEC --format=fb -o PLAN`): every decision the planner made —
// checkpoint regions, offloaded blocks and heads — runs, and the plan's
// predicted peak is logged beside the measured one. The generated binaries of
// `mtpc build` add their own step program to the same path.
//
//===----------------------------------------------------------------------===//

#include "mtprt/Driver.h"
#include "mtprt/Plan.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char **argv) {
  std::string planPath;
  std::vector<char *> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--plan")) {
      if (i + 1 == argc) {
        std::cerr << "mtprt-run: error: --plan needs a file\n";
        return 2;
      }
      planPath = argv[++i];
    }
    else if (!std::strncmp(argv[i], "--plan=", 7))
      planPath = argv[i] + 7;
    else
      rest.push_back(argv[i]);
  }
  // --nproc re-executes this program once per rank with the driver's flags
  // only: the ranks find the plan in the environment.
  if (planPath.empty())
    if (const char *inherited = std::getenv("MTPRT_RUN_PLAN"))
      planPath = inherited;
  if (!planPath.empty())
    setenv("MTPRT_RUN_PLAN", planPath.c_str(), 1);
  bool help = false;
  for (char *a : rest)
    help |= !std::strcmp(a, "--help") || !std::strcmp(a, "-h");
  if (planPath.empty() && !help) {
    std::cerr << "mtprt-run: error: --plan PLAN is required; write one with "
                 "`mtpc plan SPEC --format=fb -o PLAN`\n";
    return 2;
  }
  mtprt::Program program;
  if (!planPath.empty()) {
    try {
      mtprt::Plan plan = mtprt::loadPlan(planPath);
      program = mtprt::programFromPlan(plan);
      std::cerr << "plan " << planPath << ": model '" << plan.modelName
                << "' from " << plan.source << ", " << plan.heads.size()
                << " tasks, " << plan.schedule.regions.size()
                << " checkpoint regions, " << plan.schedule.offloadUnits.size()
                << " offloaded blocks, " << plan.schedule.partialUnits.size()
                << " at tensor grain, "
                << plan.schedule.offloadHeadList.size()
                << " offloaded heads; predicted peak "
                << plan.predictedPeakBytes << " B\n";
    } catch (const std::exception &e) {
      std::cerr << e.what() << "\n";
      return 1;
    }
  }
  rest.push_back(nullptr);
  return mtprt::runDriver(int(rest.size()) - 1, rest.data(), program);
}
