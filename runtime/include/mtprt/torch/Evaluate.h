//===- Evaluate.h - held-out metrics per task -------------------*- C++ -*-===//
//
// The model on every record of a data file once, without autograd or
// dropout, each task's predictions scored against the records that have its
// labels (EvalMetrics.h): classification accuracy and macro-F1; regression
// MSE, Pearson and Spearman; tagging token accuracy and, where the file
// names its tags B-X / I-X / ... (mtpc prepare), entity precision, recall
// and F1; spans exact match and token F1; every task's mean loss. Decoder
// heads report their loss only (teacher-forced).
//
// Internal API (LibTorch); docs/data.md.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_EVALUATE_H
#define MTPRT_TORCH_EVALUATE_H

#include "mtprt/torch/Data.h"
#include "mtprt/torch/Model.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mtprt {

struct TaskMetrics {
  std::string task;
  int64_t records = 0; ///< records with the task's labels
  std::vector<std::pair<std::string, double>> values; ///< metric -> value
  /// The value of `metric`, NaN when the task has none of that name.
  double get(const std::string &metric) const;
};

struct EvalReport {
  int64_t records = 0;
  std::vector<TaskMetrics> tasks; ///< tasks with labels in the file
  /// The device memory's high-water mark while it ran (-1: not measured),
  /// and the plan's prediction for it (-1: none); both in the record.
  int64_t peakBytes = -1, predictedPeakBytes = -1;
  /// `{"step": S, "eval": {task: {metric: value}}, "eval_records": N,
  /// "peak_bytes": B, "predicted_peak_bytes": P}` (null for NaN; the peaks
  /// where known).
  std::string jsonLine(int64_t step) const;
  /// "nli accuracy 0.990 macro_f1 0.989; ner ..." for the progress line.
  std::string summary() const;
  /// "; peak 1234 B vs 1200 B predicted (+2.8%)" (empty: not measured).
  std::string peakText() const;
  /// TASK.METRIC, or `mean.METRIC` (the mean over tasks that have it);
  /// NaN when nothing has it.
  double value(const std::string &key) const;
};

/// One record's predictions, as evaluate() makes them: per head, the
/// predicted label ids (classify: 1; tag: one per scored position, -1
/// elsewhere; span: start, end) or values (mse), and the record's tokens.
struct RecordPrediction {
  int64_t record = 0;
  std::vector<std::vector<double>> heads;
  /// Per head, the record's labels in the same form (tags: per real
  /// position, -1 where not scored); empty where it has none.
  std::vector<std::vector<double>> gold;
  std::vector<int64_t> tokens; ///< its real tokens (padding cut)
};

/// Evaluates `model` on every record of `data` in batches of `batch`, in
/// eval mode without autograd, under the training's `precision` (autocast,
/// without its cache of weight casts). `each`, when given, sees every
/// record's predictions (--predict).
EvalReport evaluate(Model &model, DataSource &data, int64_t batch,
                    Precision precision,
                    const std::function<void(const RecordPrediction &)>
                        &each = {});

/// --predict: every record of `data` through `model`, one JSON object per
/// line to `path` (written whole, then renamed over it):
///   {"record": i, "TASK": prediction, ..., "gold": {"TASK": label, ...}}
/// classify: the label name (the id where the file names none); mse: the
/// values; tag: one entry per real token, null where it is not scored (a
/// word's later sub-tokens, where the file has the gold tags); span:
/// {"start", "end", "tokens"}. `gold` holds the file's labels where it has
/// them. Prints the metrics over the records with labels and the peak
/// (against `predictedPeakBytes`, the plan's evaluation peak, where > 0).
/// Returns them.
EvalReport writePredictions(Model &model, DataSource &data, int64_t batch,
                            Precision precision, const std::string &path,
                            int64_t step, int64_t predictedPeakBytes = 0);

} // namespace mtprt

#endif // MTPRT_TORCH_EVALUATE_H
