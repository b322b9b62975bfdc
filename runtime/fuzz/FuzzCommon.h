//===- FuzzCommon.h - what the runtime's reader fuzz targets share -*- C++ -*-===//
//
// A model with every head kind (the demo's three tasks first, so the demo's
// shards and checkpoints seed the targets), and a check that aborts — a
// libFuzzer crash — with what failed.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_FUZZ_FUZZCOMMON_H
#define MTPRT_FUZZ_FUZZCOMMON_H

#include "mtprt/Config.h"
#include "mtprt/DataFormat.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace mtprt::fuzz {

inline ModelConfig model() {
  ModelConfig m;
  m.vocab = 32;
  m.seq = 8;
  return m;
}

inline std::vector<HeadConfig> heads() {
  HeadConfig cls{"cls", HeadKind::Classify, 1};
  cls.classes = 4;
  HeadConfig tag{"tag", HeadKind::Tag, 2};
  tag.classes = 6;
  HeadConfig qa{"qa", HeadKind::Span, 2};
  HeadConfig reg{"reg", HeadKind::Classify, 1};
  reg.loss = LossKind::Mse;
  reg.classes = 3;
  HeadConfig gen{"gen", HeadKind::Decoder, 2};
  gen.targetVocab = 10;
  gen.targetSeq = 4;
  return {cls, tag, qa, reg, gen};
}

#define MTPRT_FUZZ_CHECK(cond, what)                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "invariant broken: %s (%s)\n", #cond,              \
                   std::string(what).c_str());                                 \
      std::abort();                                                            \
    }                                                                          \
  } while (0)

/// A reader's error must name the file it was given.
inline void namesTheFile(const std::string &message, const std::string &prefix) {
  MTPRT_FUZZ_CHECK(message.rfind(prefix, 0) == 0, message);
}

/// Accepted records, written as a shard and read back: the shard reader
/// must accept what the writer wrote (`what` says whose records they were).
inline Records shardRoundTrip(const Records &r, const ModelConfig &model,
                              const std::vector<HeadConfig> &heads,
                              const std::string &what) {
  std::ostringstream out;
  writeShard(out, r, "fuzz.shard", model, heads);
  const std::string shard = out.str();
  std::istringstream back(shard);
  Records s;
  try {
    s = readShard(back, shard.size(), "again.shard", model, heads);
  } catch (const DataError &e) {
    MTPRT_FUZZ_CHECK(false, what + ", written as a shard, are refused: " +
                                e.what());
  }
  MTPRT_FUZZ_CHECK(s.count == r.count && s.tokens == r.tokens &&
                       s.present == r.present,
                   "the shard round trip changed the records");
  return s;
}

} // namespace mtprt::fuzz

#endif // MTPRT_FUZZ_FUZZCOMMON_H
