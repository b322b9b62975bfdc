//===- Runtime.h - what an emitted step program calls -----------*- C++ -*-===//
//
// The torch-free facade of the runtime: build the model from plain config
// structs, give it batches as raw arrays (or synthetic ones), run steps as a
// Schedule says, read each step's measurements and write them as one JSON
// Lines record with SPEC.md §5's metric names. Programs that schedule at the
// unit grain themselves use the LibTorch-level API in mtprt/torch/.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_RUNTIME_H
#define MTPRT_RUNTIME_H

#include "mtprt/Config.h"

#include <memory>
#include <string>
#include <vector>

namespace mtprt {

class TrainerCore;

class Trainer {
public:
  /// Throws std::invalid_argument naming the bad field.
  Trainer(const ModelConfig &model, const std::vector<HeadConfig> &heads,
          const TrainConfig &train);
  ~Trainer();
  Trainer(const Trainer &) = delete;
  Trainer &operator=(const Trainer &) = delete;

  /// The built-in synthetic multi-task data: a fixed batch from `seed`.
  void useSyntheticBatch(int64_t batchSize, uint64_t seed);
  /// A batch from raw arrays: tokens [batchSize × seq] int64; labels[h] points
  /// at head h's labels (shapes as in mtprt/torch/Model.h's Batch; int64, or
  /// float for mse) or is null when the batch has none. Copied.
  void setBatch(int64_t batchSize, const int64_t *tokens,
                const std::vector<const void *> &labels);
  /// One optimizer step on the current batch.
  StepStats step(const Schedule &schedule);

  int64_t numParameters() const;
  int64_t numUnits() const;
  std::string unitName(int64_t unit) const;
  std::vector<std::string> taskNames() const;

  TrainerCore &core() { return *core_; }

private:
  std::unique_ptr<TrainerCore> core_;
  struct BatchHolder;
  std::unique_ptr<BatchHolder> batch_;
};

/// One JSON Lines record (no newline) with the metric names of SPEC.md §5.
std::string toJsonLine(const StepStats &stats);

} // namespace mtprt

#endif // MTPRT_RUNTIME_H
