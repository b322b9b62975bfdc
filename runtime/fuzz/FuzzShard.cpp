//===- FuzzShard.cpp - libFuzzer target: the binary shard reader ----------===//
//
// Any bytes as a shard. Nothing may crash, allocate more than the file
// holds (run with -malloc_limit_mb), leak or throw anything but a DataError
// naming the file; what is accepted holds the batches' invariants and writes
// back to a shard that reads the same.
//
//===----------------------------------------------------------------------===//

#include "FuzzCommon.h"

#include "mtprt/DataFormat.h"

#include <cmath>
#include <sstream>

using namespace mtprt;

namespace {
const ModelConfig kModel = fuzz::model();
const std::vector<HeadConfig> kHeads = fuzz::heads();
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char *>(data), size));
  Records r;
  try {
    r = readShard(in, size, "fuzz.shard", kModel, kHeads);
  } catch (const DataError &e) {
    fuzz::namesTheFile(e.what(), "mtprt: data file fuzz.shard");
    return 0;
  }
  MTPRT_FUZZ_CHECK(r.count > 0, "no records accepted");
  MTPRT_FUZZ_CHECK(r.tokens.size() == size_t(r.count * kModel.seq), "tokens");
  for (int32_t t : r.tokens)
    MTPRT_FUZZ_CHECK(t >= 0 && t < kModel.vocab, std::to_string(t));
  for (size_t h = 0; h < kHeads.size(); ++h) {
    const int64_t width = labelWidth(kHeads[h], kModel);
    MTPRT_FUZZ_CHECK(r.present[h].size() == size_t(r.count), kHeads[h].name);
    MTPRT_FUZZ_CHECK(r.labels[h].size() == size_t(r.count * width),
                     kHeads[h].name);
    for (int64_t i = 0; i < r.count; ++i) {
      MTPRT_FUZZ_CHECK(r.present[h][i] <= 1, kHeads[h].name);
      if (r.present[h][i])
        for (int64_t k = 0; k < width; ++k)
          MTPRT_FUZZ_CHECK(std::isfinite(r.labels[h][i * width + k]),
                           kHeads[h].name);
    }
  }
  const Records s =
      fuzz::shardRoundTrip(r, kModel, kHeads, "an accepted shard's records");
  // Labels of absent records are not read: compare only present ones.
  for (size_t h = 0; h < kHeads.size(); ++h) {
    const int64_t width = labelWidth(kHeads[h], kModel);
    for (int64_t i = 0; i < r.count; ++i)
      if (r.present[h][i])
        for (int64_t k = 0; k < width; ++k)
          MTPRT_FUZZ_CHECK(r.labels[h][i * width + k] ==
                               s.labels[h][i * width + k],
                           kHeads[h].name);
  }
  return 0;
}
