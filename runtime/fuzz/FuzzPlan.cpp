//===- FuzzPlan.cpp - libFuzzer target: the plan loader -------------------===//
//
// Any bytes as a plan file, twice: as they are (the frame's checks), and
// with the frame's length and CRC-32 made to match whatever follows it, so
// mutations reach the flatbuffers verifier and the field checks behind the
// checksum (a forged plan). Nothing may crash, read outside the buffer, or
// throw anything but a PlanError naming the file; an accepted plan holds
// every bound of mtprt/Limits.h and makes a program.
//
//===----------------------------------------------------------------------===//

#include "FuzzCommon.h"

#include "mtprt/Driver.h"
#include "mtprt/Limits.h"
#include "mtprt/Plan.h"
#include "mtprt/PlanFrame.h"

#include <cstring>

using namespace mtprt;

namespace {

void readOne(const void *data, size_t size) {
  Plan p;
  try {
    p = readPlan(data, size, "fuzz.mtpplan");
  } catch (const PlanError &e) {
    fuzz::namesTheFile(e.what(), "mtprt: plan fuzz.mtpplan: ");
    return;
  }
  namespace l = limits;
  const ModelConfig &m = p.model;
  MTPRT_FUZZ_CHECK(l::kLayers.contains(m.layers) && l::kHidden.contains(m.hidden) &&
                       l::kHeads.contains(m.heads) && l::kFfn.contains(m.ffn) &&
                       l::kVocab.contains(m.vocab) && l::kSeq.contains(m.seq) &&
                       m.hidden % m.heads == 0 && l::kDropout.contains(m.dropout),
                   "backbone");
  MTPRT_FUZZ_CHECK(!p.heads.empty() && p.heads.size() <= size_t(l::kMaxTasks),
                   "tasks");
  for (const HeadConfig &h : p.heads) {
    MTPRT_FUZZ_CHECK(h.tap >= 0 && h.tap <= m.layers, h.name);
    MTPRT_FUZZ_CHECK(l::kLossWeight.contains(h.weight), h.name);
    if (h.kind == HeadKind::Classify)
      MTPRT_FUZZ_CHECK(l::kClasses.contains(h.classes), h.name);
    if (h.kind == HeadKind::Tag)
      MTPRT_FUZZ_CHECK(l::kLabels.contains(h.classes), h.name);
    if (h.kind == HeadKind::Decoder)
      MTPRT_FUZZ_CHECK(h.targetSeq >= 1 && h.targetSeq <= m.seq, h.name);
  }
  const TrainConfig &t = p.train;
  MTPRT_FUZZ_CHECK(l::kLearningRate.contains(t.backboneLr.lr) &&
                       t.backboneLr.warmupSteps <= p.steps &&
                       l::kWeightDecay.contains(t.weightDecay) &&
                       l::kGfmKeep.contains(t.gfmKeep) && t.clipNorm >= 0 &&
                       l::kSteps.contains(p.steps),
                   "train");
  for (const LrConfig &c : t.headLr)
    MTPRT_FUZZ_CHECK(l::kLearningRate.contains(c.lr) &&
                         c.warmupSteps <= c.totalSteps,
                     "head lr");
  validateSchedule(p.schedule, m.layers, p.heads); // must not throw
  const Program program = programFromPlan(p);
  MTPRT_FUZZ_CHECK(program.batchSize >= 1 && program.train.microBatches >= 1 &&
                       l::kGlobalBatch.contains(program.batchSize),
                   "program");
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  readOne(data, size);
  if (size >= kPlanFrameBytes && std::memcmp(data, kPlanMagic, 8) == 0) {
    std::string fixed(reinterpret_cast<const char *>(data), size);
    const std::string framed =
        framePlan(data + kPlanFrameBytes, size - kPlanFrameBytes);
    // The input's version, the matching CRC-32 and length.
    std::memcpy(fixed.data() + 12, framed.data() + 12, 12);
    readOne(fixed.data(), fixed.size());
  }
  return 0;
}
