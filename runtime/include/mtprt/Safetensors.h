//===- Safetensors.h - safetensors headers, read and checked ----*- C++ -*-===//
//
// The header half of Hugging Face's safetensors format: 8 bytes of
// little-endian header length N, N bytes of JSON ({"name": {"dtype",
// "shape", "data_offsets": [begin, end]}, ..., "__metadata__": {string:
// string}}), then the raw little-endian data the offsets index (relative to
// the byte after the header). Reading checks everything against the file's
// length before anything is allocated from it: N (at most 100 MB, as the
// reference reader), nesting (three levels), every dtype, shape and offset
// pair (the bytes the shape needs, no overlap, no hole: the reference
// format's rules). The data itself is mapped by the torch half
// (torch/Pretrained.h). Also the sharded set's index
// (`model.safetensors.index.json`) and the writer's header.
//
// Torch-free and LLVM-free, so runtime/fuzz/ links it without LibTorch.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_SAFETENSORS_H
#define MTPRT_SAFETENSORS_H

#include "mtprt/Errors.h"

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mtprt::safetensors {

/// The element types the format names (F8 types are refused by name).
enum class Dtype { F64, F32, F16, BF16, I64, I32, I16, I8, U8, Bool };

/// Where `text` first nests JSON arrays and objects deeper than `limit`
/// (strings skipped), or std::string_view::npos: recursive JSON parsers
/// (llvm::json in mtpc, nlohmann's value tree) see only bounded nesting.
inline size_t nestingPast(std::string_view text, int limit) {
  int depth = 0;
  bool inString = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (inString) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '{' || c == '[') {
      if (++depth > limit)
        return i;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return std::string_view::npos;
}

/// "F32", "BF16", ...
const char *name(Dtype dtype);
int64_t elementBytes(Dtype dtype);
std::optional<Dtype> parseDtype(const std::string &name);

/// One tensor of a file: its data is bytes [begin, end) after the header.
struct Entry {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
  int64_t numel() const;
};

/// Refused beyond this (the reference reader's limit).
inline constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;

struct Header {
  /// The data's first byte in the file: 8 + N.
  uint64_t dataStart = 0;
  /// Tensors in data order.
  std::vector<Entry> tensors;
  std::vector<std::pair<std::string, std::string>> metadata;
  const Entry *find(const std::string &name) const;
};

/// Reads and checks the header of a file of `fileSize` bytes from `in`
/// (positioned at its start). Throws PretrainedError naming `path`, the
/// tensor and the field.
Header readHeader(std::istream &in, uint64_t fileSize, const std::string &path);

/// The bytes to write before the data of `tensors` (in order, contiguous
/// from 0): the length and the JSON, padded with spaces to a multiple of 8
/// so the data is aligned. Sets each entry's begin/end.
std::string writeHeader(std::vector<Entry> &tensors,
                        const std::vector<std::pair<std::string, std::string>>
                            &metadata = {});

/// A sharded set's index: tensor name -> the shard's file name (relative to
/// the index's directory; a bare file name, checked). `path` names the
/// index in errors.
std::vector<std::pair<std::string, std::string>>
readIndex(std::istream &in, const std::string &path);

} // namespace mtprt::safetensors

#endif // MTPRT_SAFETENSORS_H
