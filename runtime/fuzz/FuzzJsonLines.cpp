//===- FuzzJsonLines.cpp - libFuzzer target: the JSON Lines reader --------===//
//
// Any bytes as a JSON Lines file. Nothing may crash, recurse without bound,
// leak or throw anything but a DataError naming the file; what is accepted
// must hold every invariant the batches rely on, and write and read back as
// a shard to the same records.
//
//===----------------------------------------------------------------------===//

#include "FuzzCommon.h"

#include "mtprt/DataFormat.h"

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
    r = readJsonLines(in, "fuzz.jsonl", kModel, kHeads);
  } catch (const DataError &e) {
    fuzz::namesTheFile(e.what(), "mtprt: data file fuzz.jsonl");
    return 0;
  }
  MTPRT_FUZZ_CHECK(r.count > 0, "no records accepted");
  MTPRT_FUZZ_CHECK(r.tokens.size() == size_t(r.count * kModel.seq), "tokens");
  for (int32_t t : r.tokens)
    MTPRT_FUZZ_CHECK(t >= 0 && t < kModel.vocab, std::to_string(t));
  for (size_t h = 0; h < kHeads.size(); ++h) {
    MTPRT_FUZZ_CHECK(r.present[h].size() == size_t(r.count), kHeads[h].name);
    MTPRT_FUZZ_CHECK(r.labels[h].size() ==
                         size_t(r.count * labelWidth(kHeads[h], kModel)),
                     kHeads[h].name);
  }
  // The shard of what was accepted reads back the same.
  const Records s = fuzz::shardRoundTrip(r, kModel, kHeads, "accepted records");
  MTPRT_FUZZ_CHECK(s.labels == r.labels,
                   "the shard round trip changed the labels");
  return 0;
}
