//===- Driver.h - the training program around a step ------------*- C++ -*-===//
//
// Everything a training executable needs besides its step: command line,
// data, the process group (one process, `--nproc N` on this machine, or a
// rank of a launcher's run), compressed gradient exchange, checkpoints and
// resume, metrics, progress and Ctrl-C. A step program (mtpc's generated
// `main`, or a hand-written one) fills in a Program and calls runDriver:
//
//   int main(int argc, char **argv) {
//     mtprt::Program p;
//     p.name = "glue_mt"; p.model = ...; p.heads = ...; p.train = ...;
//     p.schedule = ...;            // or p.step = [](mtprt::Trainer &t) {...}
//     return mtprt::runDriver(argc, argv, p);
//   }
//
// Torch-free.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_DRIVER_H
#define MTPRT_DRIVER_H

#include "mtprt/BatchSchedule.h"
#include "mtprt/Pipeline.h"
#include "mtprt/Config.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace mtprt {

class Trainer;

struct Program {
  std::string name = "mtprt-train";
  ModelConfig model;
  std::vector<HeadConfig> heads;
  TrainConfig train;
  Schedule schedule;
  int64_t batchSize = 16;          ///< the global batch (split over the ranks)
  int64_t steps = 100;             ///< default for --steps
  uint64_t seed = 0;               ///< default for --seed
  int64_t logEvery = 1;            ///< default for --log-every
  int64_t checkpointEvery = 0;     ///< default for --checkpoint-every
  std::string data = "synthetic";  ///< default for --data
  std::string evalData;            ///< default for --eval-data
  int64_t evalEvery = 0;           ///< default for --eval-every
  /// Sequential training (empty: every task at every step): the tasks whose
  /// labels each stretch of steps keeps.
  std::vector<Phase> phases;
  int64_t predictedPeakBytes = -1; ///< the plan's prediction, logged
  /// SAPS: the prediction for steps that do not re-rank (0: the above).
  int64_t predictedSteadyPeakBytes = 0;
  /// npd(regroup): the peak with the adapter groups as the plan formed them
  /// (0: unknown); predictedPeakBytes holds room for every split, and a
  /// step's prediction lies between them by the share of splits made.
  int64_t groupedPeakBytes = 0;
  /// The plan's prediction for held-out evaluation (-1: none), logged with
  /// each evaluation's measured peak.
  int64_t predictedEvalPeakBytes = -1;
  /// Held-out evaluation's batch per process (0: the micro batch).
  int64_t evalBatch = 0;
  /// D15: the global batch per step (default: batchSize at every step);
  /// --batch-size fixes it.
  std::optional<BatchSchedule> dynamicBatch;
  int64_t plannedProcesses = 1;    ///< the processes the plan was made for
  /// docs/pipeline.md: the backbone's stages across processes (inactive:
  /// every process runs the whole model).
  PipelineConfig pipeline;
  /// GSC defaults (docs/techniques.md C10); --compress / --no-compress override.
  bool compress = false;
  double compressTopK = defaults::kTopK,
         compressDecay = defaults::kResidualDecay;
  int64_t compressBlock = defaults::kQuantBlock;
  /// Bits per quantized value; the runtime's GSC kernels are 8-bit, so a
  /// compressed exchange with another width is refused.
  int64_t compressBits = defaults::kQuantBits;
  /// One step at the unit grain, on the batch the driver set (generated
  /// programs); unset = trainer.step(schedule).
  std::function<StepStats(Trainer &)> step;
};

/// Parses argv, runs, and returns the process exit code: 0 done (or already
/// at --steps), 1 runtime error (message on stderr; also a non-finite loss or
/// gradient, which stops the run without saving), 2 bad command line,
/// 130 interrupted (a checkpoint was saved when --checkpoint-dir is set).
/// With --nproc, the first failing rank's code (128 + N for a rank killed by
/// signal N), named on stderr.
int runDriver(int argc, char **argv, const Program &program);

} // namespace mtprt

#endif // MTPRT_DRIVER_H
