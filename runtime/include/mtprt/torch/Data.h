//===- Data.h - multi-task data sources --------------------------*- C++
//-*-===//
//
// A source maps a position (the number of global batches consumed so far,
// which checkpoints save) to a global batch, deterministically, so a resumed
// run sees exactly the batches an uninterrupted one would, and every rank
// of a data-parallel run takes its own rows of the same global batch.
//
// Internal API (LibTorch). The file format is documented in
// docs/runtime-services.md.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_DATA_H
#define MTPRT_TORCH_DATA_H

#include "mtprt/torch/Model.h"

#include <memory>
#include <stdexcept>
#include <string>

namespace mtprt {

class DataSource {
public:
  virtual ~DataSource() = default;
  /// The global batch number `position` (size `batchSize`), on the CPU.
  virtual Batch batch(int64_t position, int64_t batchSize) = 0;
  /// The `count` records from record number `first` on, wrapping around a
  /// file (the dynamic batch schedule's steps, whose sizes vary). Synthetic
  /// data draws them from `first`'s stream.
  virtual Batch records(int64_t first, int64_t count) = 0;
  /// Records available (-1: unbounded).
  virtual int64_t size() const = 0;
  /// Records [first, first + count) once each, in file order (evaluation,
  /// prediction). A source without records refuses.
  virtual Batch range(int64_t first, int64_t count) {
    (void)first;
    (void)count;
    throw std::invalid_argument("mtprt: " + describe() +
                                ": evaluation and prediction read a data file "
                                "(synthetic data has no held-out records)");
  }
  virtual std::string describe() const = 0;
  /// Per head, the label strings by id where the file names them (a shard
  /// from `mtpc prepare`); empty otherwise.
  virtual std::vector<std::vector<std::string>> labelNames() const {
    return {};
  }
  /// Per head, how many records carry its labels; empty where every record
  /// does (synthetic data).
  virtual std::vector<int64_t> labelledRecords() const { return {}; }
};

/// The built-in synthetic multi-task data, seeded and learnable: each label is
/// a fixed function of the tokens (a tag: of its token and the one before).
/// `relatedness` in [0, 1] is, per record and task, the probability that the
/// task's label is computed from the feature every task shares (the first
/// token; the token itself for tags) rather than from a feature private to the
/// task (its own token position; a task-specific token map for tags and
/// targets): 1 = all tasks share their structure, 0 = none do.
std::unique_ptr<DataSource> syntheticData(const ModelConfig &model,
                                          const std::vector<HeadConfig> &heads,
                                          uint64_t seed, double relatedness);

/// `--eval-data synthetic:N`: N held-out records of the same synthetic tasks
/// (the same functions of the tokens), drawn from another seed than the
/// training data's and made batch by batch as evaluation reads them (no
/// resident data set). For trying evaluation, its memory and its time
/// without a data file.
std::unique_ptr<DataSource> syntheticHeldOut(const ModelConfig &model,
                                             const std::vector<HeadConfig> &heads,
                                             uint64_t seed, double relatedness,
                                             int64_t records);

/// JSON Lines: one record per line,
///   {"tokens": [ids × seq], "labels": {"<task>": <label> | null, ...}}
/// (label shapes as in Batch). Validates every record (mtprt/DataFormat.h:
/// strict JSON, bounded lines, no recursion); throws DataError naming the
/// file, the line and the field. Batches take
/// records in file order, wrapping around; a task's labels are used in a
/// batch only when every record of it has them (else they are masked).
std::unique_ptr<DataSource> loadJsonLines(const std::string &path,
                                          const ModelConfig &model,
                                          const std::vector<HeadConfig> &heads);

/// The compact binary shard (docs/runtime-services.md §4): the same records
/// as a JSON Lines file, loaded without parsing. Every header field is
/// checked, and the layout against the file's length, before anything is
/// allocated. DataErrors name the file and the field or section (truncated
/// in the tokens, ...) or the record and field.
std::unique_ptr<DataSource> loadShard(const std::string &path,
                                      const ModelConfig &model,
                                      const std::vector<HeadConfig> &heads);
/// A shard or a JSON Lines file, by the file's first bytes.
std::unique_ptr<DataSource> loadData(const std::string &path,
                                     const ModelConfig &model,
                                     const std::vector<HeadConfig> &heads);
/// Validates a JSON Lines file and writes it as a shard.
void writeShard(const std::string &jsonLines, const std::string &out,
                const ModelConfig &model, const std::vector<HeadConfig> &heads);

} // namespace mtprt

#endif // MTPRT_TORCH_DATA_H
