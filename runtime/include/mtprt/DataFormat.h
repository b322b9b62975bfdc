//===- DataFormat.h - JSON Lines and binary shards, read and checked -*- C++ -*-===//
//
// The parsing and validation half of the data sources (torch/Data.h): a JSON
// Lines file or a binary shard becomes plain vectors of records checked
// against the model and its heads, or a DataError naming the file, the line
// (or record) and the field, or the section and what to do. Torch-free, so
// the fuzz targets (runtime/fuzz/) link it without LibTorch.
//
// Bounded by construction: the JSON Lines reader reads a line of at most
// maxJsonLinesLineBytes() and parses it against the record's schema (an
// object of `tokens` and `labels`, at most three levels deep) without
// recursion or a document tree; the shard reader checks every header field
// and the whole layout against the file's length before it allocates.
// The formats are documented in docs/runtime-services.md §4.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_DATAFORMAT_H
#define MTPRT_DATAFORMAT_H

#include "mtprt/Config.h"
#include "mtprt/Errors.h"

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace mtprt {

/// Records as a data file holds them, validated: `count` records of
/// `model.seq` token ids in [0, vocab) and, per head (in the program's
/// order), a presence flag and labelWidth() floats per record (zeros where
/// the record has no label). A tag or a target of kIgnoreLabel takes no
/// part in the loss or the metrics (a word's later sub-tokens, padding).
struct Records {
  int64_t count = 0;
  std::vector<int32_t> tokens;               ///< count × seq
  /// Per record, its real tokens in [1, seq]; the rest is padding, which a
  /// bidirectional backbone's attention masks. Empty: every record is full.
  std::vector<int32_t> lengths;
  /// Token types (BERT's segment ids) in [0, typeVocab), count × seq.
  /// Empty: all 0.
  std::vector<uint8_t> types;
  std::vector<std::vector<uint8_t>> present; ///< per head: count flags (0/1)
  std::vector<std::vector<float>> labels;    ///< per head: count × width
  /// Per head: the label strings by id (`mtpc prepare` writes them), for
  /// metrics and predictions; empty where the file has none.
  std::vector<std::vector<std::string>> labelNames;
};

/// A tag or decoder target that is not scored.
inline constexpr int32_t kIgnoreLabel = -1;

/// The floats a head's label takes per record: 1 for a class, `classes` for
/// mse, `seq` for tags, 2 for a span, `targetSeq` for a decoder.
int64_t labelWidth(const HeadConfig &head, const ModelConfig &model);

/// The longest line a JSON Lines record of this model may take: generous
/// (64 bytes per value the record holds, plus 1 MiB), so only something that
/// is not one record per line reaches it.
size_t maxJsonLinesLineBytes(const ModelConfig &model,
                             const std::vector<HeadConfig> &heads);

/// Reads every record of a JSON Lines stream (one JSON object per line,
/// blank lines allowed; strict JSON: no hex, NaN, leading zeros or comments).
/// `path` names the file in errors.
Records readJsonLines(std::istream &in, const std::string &path,
                      const ModelConfig &model,
                      const std::vector<HeadConfig> &heads);

/// The shard's first bytes.
inline constexpr char kShardMagic[9] = "MTPRTSHD";
/// Version 2 adds the flags word, the label names, lengths and token types;
/// version 1 shards are still read.
inline constexpr uint32_t kShardVersion = 2;
inline constexpr uint32_t kShardHasLengths = 1u, kShardHasTypes = 2u;

/// Reads a binary shard of `size` bytes from `in`. Every header field is
/// range-checked and the layout it describes compared with `size` before
/// anything is allocated; ids and labels are checked like JSON Lines'.
Records readShard(std::istream &in, uint64_t size, const std::string &path,
                  const ModelConfig &model,
                  const std::vector<HeadConfig> &heads);

/// Writes `records` (as readJsonLines returns them) as a shard. `path`
/// names the output in errors.
void writeShard(std::ostream &out, const Records &records,
                const std::string &path, const ModelConfig &model,
                const std::vector<HeadConfig> &heads);

} // namespace mtprt

#endif // MTPRT_DATAFORMAT_H
