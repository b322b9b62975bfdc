//===- CheckpointFormat.h - a checkpoint's header, read and checked -*- C++ -*-===//
//
// The framing of a checkpoint file (torch/Checkpoint.h has the payload):
//
//   MTPRTCKPT 1\n
//   step <n> rank <r> world <w> bytes <payload bytes> crc32 <8 hex>\n
//   <payload>
//
// Every field is parsed strictly (decimal digits, no signs; 8 hex digits)
// and range-checked, and the payload size compared with the file's length
// before anything is allocated or read; the CRC-32 is computed streaming.
// Failures are CheckpointErrors naming the file and the field, so
// `--resume-fallback` can skip them. Torch-free (the fuzz targets link it).
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_CHECKPOINTFORMAT_H
#define MTPRT_CHECKPOINTFORMAT_H

#include "mtprt/Errors.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mtprt {

struct CheckpointHeader {
  int64_t step = 0, rank = 0, world = 1;
  uint64_t bytes = 0;       ///< the payload's
  uint32_t crc = 0;         ///< CRC-32 of the payload
  uint64_t headerBytes = 0; ///< the two header lines'; the payload follows
};

/// A header is at most this long (both lines).
inline constexpr size_t kMaxCheckpointHeaderBytes = 256;

/// The two header lines for a payload.
std::string checkpointHeaderText(int64_t step, int64_t rank, int64_t world,
                                 uint64_t bytes, uint32_t crc);

/// Parses the header at the start of `head` — a file's first
/// min(fileSize, kMaxCheckpointHeaderBytes) bytes or more — of a file of
/// `fileSize` bytes: the fields in range and `bytes` equal to what the file
/// holds after the header. Throws CheckpointError naming `path`.
CheckpointHeader parseCheckpointHeader(std::string_view head,
                                       uint64_t fileSize,
                                       const std::string &path);

/// A whole checkpoint in memory: the header, then the payload's CRC-32.
CheckpointHeader verifyCheckpointBytes(std::string_view file,
                                       const std::string &path);

/// The file at `path`: the header, then the payload's CRC-32, computed
/// while reading it in pieces. With `payload`, the payload is returned in
/// it (allocated once the header and the file's length agree).
CheckpointHeader readCheckpointFile(const std::string &path,
                                    std::string *payload = nullptr);

} // namespace mtprt

#endif // MTPRT_CHECKPOINTFORMAT_H
