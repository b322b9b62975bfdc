//===- FuzzCheckpoint.cpp - libFuzzer target: the checkpoint header -------===//
//
// Any bytes as a checkpoint file: the header parsed strictly, the payload's
// size against the file's, its CRC-32. Nothing may crash, allocate from a
// header field (-malloc_limit_mb), or throw anything but a CheckpointError
// naming the file; an accepted header is the one the writer would write.
//
//===----------------------------------------------------------------------===//

#include "FuzzCommon.h"

#include "mtprt/CheckpointFormat.h"
#include "mtprt/Crc32.h"

#include <string_view>

using namespace mtprt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string_view file(reinterpret_cast<const char *>(data), size);
  CheckpointHeader h;
  try {
    h = verifyCheckpointBytes(file, "fuzz.ckpt");
  } catch (const CheckpointError &e) {
    fuzz::namesTheFile(e.what(), "mtprt: checkpoint fuzz.ckpt: ");
    return 0;
  }
  MTPRT_FUZZ_CHECK(h.headerBytes + h.bytes == size, "sizes");
  MTPRT_FUZZ_CHECK(h.step >= 0 && h.rank >= 0 && h.rank < h.world, "fields");
  MTPRT_FUZZ_CHECK(crc32(data + h.headerBytes, h.bytes) == h.crc, "crc");
  // One spelling per header: the writer's.
  MTPRT_FUZZ_CHECK(checkpointHeaderText(h.step, h.rank, h.world, h.bytes,
                                        h.crc) == file.substr(0, h.headerBytes),
                   std::string(file.substr(0, h.headerBytes)));
  return 0;
}
