//===- FuzzSafetensors.cpp - libFuzzer target: safetensors headers --------===//
//
// Any bytes as a safetensors file (the reader of pretrained weights) and as
// a sharded set's index. Nothing may crash, recurse without bound, allocate
// from a header field (-malloc_limit_mb), or throw anything but a
// PretrainedError naming the file; an accepted header tiles the data, and
// the writer's header for its tensors reads back the same.
//
//===----------------------------------------------------------------------===//

#include "FuzzCommon.h"

#include "mtprt/Safetensors.h"

#include <sstream>

using namespace mtprt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string file(reinterpret_cast<const char *>(data), size);
  {
    std::istringstream in(file);
    try {
      safetensors::readIndex(in, "fuzz.json");
    } catch (const PretrainedError &e) {
      fuzz::namesTheFile(e.what(), "mtprt: pretrained fuzz.json: ");
    }
  }
  std::istringstream in(file);
  safetensors::Header h;
  try {
    h = safetensors::readHeader(in, size, "fuzz.safetensors");
  } catch (const PretrainedError &e) {
    fuzz::namesTheFile(e.what(), "mtprt: pretrained fuzz.safetensors: ");
    return 0;
  }
  uint64_t next = 0;
  for (const safetensors::Entry &e : h.tensors) {
    MTPRT_FUZZ_CHECK(e.begin == next && e.end >= e.begin, e.name);
    MTPRT_FUZZ_CHECK(e.end - e.begin == uint64_t(e.numel()) *
                                            uint64_t(safetensors::elementBytes(
                                                e.dtype)),
                     e.name);
    next = e.end;
  }
  MTPRT_FUZZ_CHECK(h.dataStart + next == size, "tiles the data");
  // The writer's header for the same tensors reads back alike.
  std::vector<safetensors::Entry> entries = h.tensors;
  const std::string written = safetensors::writeHeader(entries, h.metadata);
  const std::string again = written + file.substr(h.dataStart);
  std::istringstream in2(again);
  const safetensors::Header h2 =
      safetensors::readHeader(in2, again.size(), "fuzz.safetensors");
  MTPRT_FUZZ_CHECK(h2.tensors.size() == h.tensors.size(), "round trip");
  for (size_t i = 0; i < h.tensors.size(); ++i)
    MTPRT_FUZZ_CHECK(h2.tensors[i].name == h.tensors[i].name &&
                         h2.tensors[i].shape == h.tensors[i].shape &&
                         h2.tensors[i].begin == h.tensors[i].begin,
                     h.tensors[i].name);
  return 0;
}
