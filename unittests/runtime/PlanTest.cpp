//===- PlanTest.cpp - the runtime reads the compiler's plan ---------------===//

#include "mtprt/Plan.h"
#include "mtprt/Driver.h"
#include "mtprt/Errors.h"
#include "mtprt/Memory.h"
#include "mtprt/PlanFrame.h"

#include "schema/plan_generated.h"

#include "Fixtures.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

using namespace mtprt;
using namespace fixtures;
namespace fb = mtp::fb;

namespace {

/// A plan kind by the name the spec uses (`auto` included); an unknown name
/// is 99, outside every enum's range, as a forged plan might say.
template <typename E> E kindNamed(const std::string &name,
                                  const char *const *names) {
  const std::string n = name == "auto" ? "automatic" : name;
  for (int i = 0; names[i]; ++i)
    if (n == names[i])
      return static_cast<E>(i);
  return static_cast<E>(99);
}
#define KIND(E, name) kindNamed<fb::E>(name, fb::EnumNames##E())

/// The knobs of a plan as mtpc writes it (2 layers, two tasks; layer 1's
/// attention offloaded, the tag head offloaded, layer 2 a checkpoint
/// region), each settable to what a damaged or forged plan might say.
struct Forge {
  unsigned version = unsigned(fb::PlanVersion::Current);
  std::string kind = "transformer";
  int64_t layers = 2, hidden = 16, heads = 2, ffn = 32, vocab = 40, seq = 12;
  double dropout = 0.1;
  std::string attention = "math";
  std::string pointwise = "aten";
  std::string clsName = "cls", clsHead = "classify", clsLoss = "cross_entropy";
  int64_t clsClasses = 4, tagClasses = 6, tap = 1;
  double tagWeight = 0.5;
  std::string precision = "fp32";
  int64_t gpus = 1, micro = 8, global = 16;
  int8_t decision = int8_t(fb::Decision::Offload);
  int64_t offloadBlock = 1;
  std::string unitTask = "tag";
  std::vector<fb::Region> regions = {fb::Region(3, 4)};
  int64_t predicted = 123456;
  bool strategy = false; // the strategy and train tables, and the tag's lr
  std::string scope = "params", collective = "compressed", lrKind = "cosine";
  double gfmKeep = 0.5, clip = 1.5, topk = 0.1, decay = 0.9;
  int64_t bits = 8, block = 128, gateHidden = 16;
  int64_t steps = 300, warmup = 20, tagWarmup = 3;
  double lr = 1e-3, weightDecay = 0.05, beta1 = 0.9, beta2 = 0.999,
         eps = 1e-8;

  /// The bare flatbuffer.
  std::string flatbuffer() const {
    flatbuffers::FlatBufferBuilder b;
    auto backbone = fb::CreateBackbone(
        b, KIND(BackboneKind, kind), layers, hidden, heads, ffn, vocab, seq,
        dropout, KIND(AttentionKind, attention),
        KIND(PointwiseKind, pointwise));
    std::vector<flatbuffers::Offset<fb::Task>> tasks = {
        fb::CreateTask(b, b.CreateString(clsName), KIND(HeadKind, clsHead), 2,
                       true, clsClasses, 0, 0, 0, 1.0,
                       KIND(LossKind, clsLoss)),
        fb::CreateTask(b, b.CreateString("tag"), fb::HeadKind::tag, tap,
                       false, tagClasses, 0, 0, 0, tagWeight,
                       fb::LossKind::cross_entropy,
                       strategy ? fb::CreateLrSchedule(
                                      b, fb::ScheduleKind::linear, 5e-4,
                                      tagWarmup)
                                : 0)};
    auto unit = [&](const char *name, const char *kind, int64_t layer,
                    int64_t blk, const std::string &task, fb::Decision d) {
      return fb::CreateUnit(b, b.CreateString(name), KIND(UnitKind, kind),
                            layer, blk, b.CreateString(task), 100, 1000, d);
    };
    const auto off = static_cast<fb::Decision>(decision);
    std::vector<flatbuffers::Offset<fb::Unit>> units = {
        unit("embed", "embed", 0, 0, "", fb::Decision::Keep),
        unit("attn_norm1", "attn_norm", 1, offloadBlock, "", off),
        unit("attn_core1", "attn_core", 1, offloadBlock, "", off),
        unit("mlp_up1", "mlp_up", 1, 2, "", fb::Decision::Keep),
        unit("head_tag", "head", 0, -1, unitTask, fb::Decision::Offload),
        unit("loss_tag", "loss", 0, -1, unitTask, fb::Decision::Offload),
        unit("attn_core2", "attn_core", 2, 3, "", fb::Decision::Recompute),
        unit("head_cls", "head", 0, -1, "cls", fb::Decision::Keep)};
    auto target = fb::CreateTarget(b, b.CreateString("cpu"),
                                   KIND(Precision, precision), 1 << 20, 1 << 20,
                                   gpus, micro, global);
    flatbuffers::Offset<fb::Strategy> st;
    flatbuffers::Offset<fb::Train> train;
    if (strategy) {
      st = fb::CreateStrategy(b, KIND(GradientScope, scope), 2, gfmKeep, clip,
                              gateHidden, 0.15, 0.4,
                              KIND(CollectivePolicy, collective), topk, block, bits,
                              decay);
      train = fb::CreateTrain(
          b, steps, 7, b.CreateString("synthetic"),
          fb::CreateLrSchedule(b, KIND(ScheduleKind, lrKind), lr, warmup),
          weightDecay, beta1, beta2, eps, 10, 0);
    }
    auto plan = fb::CreatePlan(
        b, version, b.CreateString("m"), b.CreateString("m.mtp"), target,
        backbone, b.CreateVector(tasks), b.CreateVector(units),
        b.CreateVectorOfStructs(regions), 0, 0, predicted, 200000, 100000,
        1e-4, st, train);
    fb::FinishPlanBuffer(b, plan);
    return std::string(reinterpret_cast<const char *>(b.GetBufferPointer()),
                       b.GetSize());
  }
  /// The plan file: framed, with a CRC that matches (a forged plan).
  std::string file() const {
    const std::string f = flatbuffer();
    return framePlan(f.data(), f.size());
  }
};

std::string errorOf(const std::string &bytes) {
  try {
    readPlan(bytes.data(), bytes.size(), "p.mtpplan");
  } catch (const PlanError &e) {
    return e.what();
  }
  return "";
}

/// The error a forged plan (a valid frame around `f`) gives.
std::string errorOf(const Forge &f) { return errorOf(f.file()); }

TEST(Plan, DecisionsBecomeTheSchedule) {
  std::string bytes = Forge().file();
  Plan p = readPlan(bytes.data(), bytes.size(), "p.mtpplan");
  EXPECT_EQ(p.model.layers, 2);
  EXPECT_EQ(p.model.hidden, 16);
  EXPECT_DOUBLE_EQ(p.model.dropout, 0.1);
  ASSERT_EQ(p.heads.size(), 2u);
  EXPECT_EQ(p.heads[0].kind, HeadKind::Classify);
  EXPECT_EQ(p.heads[0].classes, 4);
  EXPECT_EQ(p.heads[1].tap, 1);
  EXPECT_EQ(p.heads[1].weight, 0.5);
  EXPECT_EQ(p.schedule.offloadUnits, std::vector<int64_t>({1}));
  EXPECT_EQ(p.schedule.offloadHeadList, std::vector<int64_t>({1}));
  ASSERT_EQ(p.schedule.regions.size(), 1u);
  EXPECT_EQ(p.schedule.regions[0], std::make_pair(int64_t(3), int64_t(4)));
  EXPECT_EQ(p.predictedPeakBytes, 123456);
  EXPECT_EQ(p.microBatch, 8);
  EXPECT_EQ(p.precision, Precision::Fp32);
  Program program = programFromPlan(p);
  EXPECT_EQ(program.batchSize, 16);
  EXPECT_EQ(program.train.microBatches, 2);
  EXPECT_EQ(program.predictedPeakBytes, 123456);
  EXPECT_EQ(program.schedule.offloadHeadList, p.schedule.offloadHeadList);
}

TEST(Plan, StrategyAndTrainingReachTheProgram) {
  Forge f;
  f.strategy = true;
  std::string bytes = f.file();
  Program p = programFromPlan(readPlan(bytes.data(), bytes.size(), "p"));
  EXPECT_EQ(p.train.scope, GradScope::Params);
  EXPECT_EQ(p.train.paramsTopK, 2);
  EXPECT_DOUBLE_EQ(p.train.gfmKeep, 0.5);
  EXPECT_DOUBLE_EQ(p.train.clipNorm, 1.5);
  EXPECT_TRUE(p.train.gate);
  EXPECT_EQ(p.train.cosineEvery, 1); // the gate reads the cosine matrix
  EXPECT_DOUBLE_EQ(p.train.weightDecay, 0.05);
  EXPECT_EQ(p.train.backboneLr.schedule, LrSchedule::Cosine);
  EXPECT_EQ(p.train.backboneLr.warmupSteps, 20);
  EXPECT_EQ(p.train.backboneLr.totalSteps, 300);
  ASSERT_EQ(p.train.headLr.size(), 2u);
  EXPECT_EQ(p.train.headLr[0].schedule, LrSchedule::Cosine); // the train's
  EXPECT_EQ(p.train.headLr[1].schedule, LrSchedule::Linear); // its own
  EXPECT_DOUBLE_EQ(p.train.headLr[1].lr, 5e-4);
  EXPECT_DOUBLE_EQ(p.heads[1].weight, 0.5);
  EXPECT_EQ(p.steps, 300);
  EXPECT_EQ(p.seed, 7u);
  EXPECT_EQ(p.logEvery, 10);
  EXPECT_EQ(p.data, "synthetic");
  EXPECT_TRUE(p.compress);
  EXPECT_DOUBLE_EQ(p.compressTopK, 0.1);
  EXPECT_EQ(p.compressBlock, 128);
  EXPECT_DOUBLE_EQ(p.compressDecay, 0.9);
  EXPECT_EQ(p.compressBits, 8);
  EXPECT_EQ(p.train.gateHidden, 16);
  EXPECT_DOUBLE_EQ(p.train.recalibrateReuse, 0.15);
  EXPECT_DOUBLE_EQ(p.train.recalibrateStd, 0.4);
  EXPECT_DOUBLE_EQ(p.train.beta1, 0.9);
  EXPECT_DOUBLE_EQ(p.train.beta2, 0.999);
  EXPECT_DOUBLE_EQ(p.train.eps, 1e-8);
  EXPECT_EQ(p.checkpointEvery, 0);
}

TEST(Plan, APlanWithoutStrategyRunsWithTheDefaults) {
  std::string bytes = Forge().file();
  Program p = programFromPlan(readPlan(bytes.data(), bytes.size(), "p"));
  TrainConfig defaults;
  EXPECT_EQ(p.train.scope, defaults.scope);
  EXPECT_DOUBLE_EQ(p.train.gfmKeep, defaults.gfmKeep);
  EXPECT_TRUE(p.train.headLr.empty());
}

TEST(Plan, TheFrameRefusesEveryDamagedByte) {
  // Issue #15 item 6: `mtpc inspect` accepted 62% of single-byte flips and
  // 104 of 110 binaries with a flipped byte in their plan trained. Now the
  // frame's fields and the CRC-32 refuse every one, and every prefix.
  Forge f;
  f.strategy = true;
  const std::string bytes = f.file();
  ASSERT_EQ(errorOf(bytes), "");
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_NE(errorOf(bytes.substr(0, n)), "") << n << "-byte prefix accepted";
  for (size_t i = 0; i < bytes.size(); ++i)
    for (int x : {0x01, 0x5a, 0x80}) {
      std::string flipped = bytes;
      flipped[i] = char(flipped[i] ^ x);
      EXPECT_NE(errorOf(flipped), "") << "byte " << i << " ^ " << x;
    }
  std::string flipped = bytes;
  flipped[bytes.size() - 5] ^= 0x10;
  EXPECT_NE(errorOf(flipped).find("plan p.mtpplan: checksum mismatch (crc32 "),
            std::string::npos)
      << errorOf(flipped);
  EXPECT_NE(errorOf(bytes + "x").find("trailing bytes after the plan"),
            std::string::npos);
  EXPECT_NE(errorOf(bytes.substr(0, 100)).find("truncated: the header says"),
            std::string::npos);
}

TEST(Plan, OldAndOtherVersionsAreRefusedByName) {
  // Version 1: the bare flatbuffer, no frame.
  Forge v1;
  v1.version = 1;
  EXPECT_EQ(errorOf(v1.flatbuffer()),
            "mtprt: plan p.mtpplan: plan version 1 (a bare flatbuffer, "
            "written before plans carried a checksum); this mtpc and runtime "
            "read version 4: re-plan the spec with `mtpc plan SPEC "
            "--format=fb -o PLAN`");
  // Version 2 wrote the kinds as strings.
  std::string v2 = Forge().file();
  v2[8] = 2;
  EXPECT_EQ(errorOf(v2), "mtprt: plan p.mtpplan: plan version 2; this mtpc "
                         "and runtime read version 4: re-plan the spec with "
                         "the matching mtpc");
  // Version 3 had no attention kind.
  std::string v3 = Forge().file();
  v3[8] = 3;
  EXPECT_EQ(errorOf(v3), "mtprt: plan p.mtpplan: plan version 3; this mtpc "
                         "and runtime read version 4: re-plan the spec with "
                         "the matching mtpc");
  std::string v5 = Forge().file();
  v5[8] = 5;
  EXPECT_EQ(errorOf(v5), "mtprt: plan p.mtpplan: plan version 5; this mtpc "
                         "and runtime read version 4: re-plan the spec with "
                         "the matching mtpc");
  EXPECT_NE(errorOf(v1.file()).find("the flatbuffer says plan version 1, its "
                                    "frame version 4"),
            std::string::npos);
  EXPECT_NE(errorOf("layers = 2").find("not an mtpc plan (no 'MTPPLAN' "
                                       "header)"),
            std::string::npos);
}

TEST(Plan, EveryFieldTheRuntimeUsesIsChecked) {
  // Forged plans (the CRC matches): each names the field.
  struct Case {
    std::function<void(Forge &)> change;
    std::string error;
  };
  const double inf = std::numeric_limits<double>::infinity(),
               nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<Case> cases = {
      // Issue #15 item 6's findings.
      {[](Forge &f) { f.layers = 1 << 20; },
       "field backbone.layers: 1048576 is out of [1, 1024]"},
      {[](Forge &f) { f.clsClasses = 0; },
       "field task 'cls' (tasks[0]).classes: 0 is out of [1, 1048576]"},
      {[](Forge &f) { f.vocab = 1; },
       "field backbone.vocab: 1 is out of [2, 16777216]"},
      {[](Forge &f) { f.strategy = true, f.warmup = 301; },
       "field train.lr.warmup: 301 exceeds the 300 training steps"},
      {[](Forge &f) { f.strategy = true, f.tagWarmup = 400; },
       "field task 'tag' (tasks[1]).lr.warmup: 400 exceeds the 300 training "
       "steps"},
      {[](Forge &f) { f.strategy = true, f.beta1 = 2; },
       "field train.beta1: 2 is out of [0, 1)"},
      {[](Forge &f) { f.strategy = true, f.beta2 = 1; },
       "field train.beta2: 1 is out of [0, 1)"},
      {[=](Forge &f) { f.strategy = true, f.lr = inf; },
       "field train.lr.peak: inf is out of (0, 10]"},
      {[=](Forge &f) { f.strategy = true, f.weightDecay = nan; },
       "field train.weight_decay: nan is out of [0, 10]"},
      {[](Forge &f) { f.strategy = true, f.eps = 0; },
       "field train.eps: 0 is out of (0, 1]"},
      {[](Forge &f) { f.strategy = true, f.eps = -1e-8; },
       "field train.eps: -1e-08 is out of (0, 1]"},
      // The rest of what the runtime reads.
      {[](Forge &f) { f.kind = "lstm"; },
       "field backbone.kind: 99 is none of transformer"},
      {[](Forge &f) { f.attention = "flash"; },
       "field backbone.attention: 99 is none of math, fused"},
      {[](Forge &f) { f.pointwise = "jit"; },
       "field backbone.pointwise: 99 is none of aten, fused"},
      {[](Forge &f) { f.heads = 3; },
       "field backbone.heads: 3 attention heads do not divide hidden 16"},
      {[](Forge &f) { f.seq = 0; }, "field backbone.seq: 0 is out of [1, "},
      {[](Forge &f) { f.ffn = -1; }, "field backbone.ffn: -1 is out of [1, "},
      {[](Forge &f) { f.hidden = int64_t(1) << 40; },
       "field backbone.hidden: 1099511627776 is out of [1, 1048576]"},
      {[](Forge &f) { f.dropout = 1; },
       "field backbone.dropout: 1 is out of [0, 1)"},
      {[](Forge &f) { f.tap = 7; },
       "field task 'tag' (tasks[1]).tap_layer: 7 is out of [0, 2]"},
      {[](Forge &f) { f.tagClasses = 1; },
       "field task 'tag' (tasks[1]).classes: 1 is out of [2, 1048576]"},
      {[=](Forge &f) { f.tagWeight = nan; },
       "field task 'tag' (tasks[1]).weight: nan is out of [0, 1e+06]"},
      {[](Forge &f) { f.clsHead = "regress"; },
       "field task 'cls' (tasks[0]).head: 99 is none of classify, tag, "
       "span, decoder"},
      {[](Forge &f) { f.clsLoss = "hinge"; },
       "field task 'cls' (tasks[0]).loss: 99 is none of cross_entropy, "
       "mse"},
      {[](Forge &f) { f.clsName = "tag"; },
       "field tasks[1].name: 'tag' names two tasks"},
      {[](Forge &f) { f.clsName = ""; }, "field tasks[0].name: missing or empty"},
      {[](Forge &f) { f.precision = "fp8"; },
       "field target.precision: 99 is none of fp32, bf16, fp16"},
      {[](Forge &f) { f.global = 12; },
       "field target.global_batch: 12 is not a multiple of micro_batch x gpus "
       "= 8"},
      {[](Forge &f) { f.micro = 0; },
       "field target.micro_batch: 0 is out of [1, 1048576]"},
      {[](Forge &f) { f.gpus = 1 << 20; },
       "field target.gpus: 1048576 is out of [1, 4096]"},
      {[](Forge &f) { f.decision = 7; },
       "field units[1].decision: 7 is none of Keep, Recompute, Offload"},
      {[](Forge &f) { f.offloadBlock = 9; },
       "field units[1].block: 9 is out of [0, 4]"},
      {[](Forge &f) { f.unitTask = "ner"; },
       "field units[4].task: 'ner' is no task"},
      {[](Forge &f) { f.regions = {fb::Region(1, 4), fb::Region(3, 3)}; },
       "its decisions are not a schedule this runtime runs "
       "(Schedule.regions[0]: contains a head's tap (unit 2) before its end"},
      {[](Forge &f) { f.regions = {fb::Region(3, 9)}; },
       "(Schedule.regions[0]: must be a unit range [first, last] within [0, "
       "4])"},
      {[](Forge &f) { f.predicted = -5; },
       "field predicted_peak_bytes: -5 is out of [0, "},
      {[](Forge &f) { f.strategy = true, f.scope = "all"; },
       "field strategy.scope: 99 is none of features, params, sum"},
      {[](Forge &f) { f.strategy = true, f.gfmKeep = 0; },
       "field strategy.gfm_keep: 0 is out of (0, 1]"},
      {[=](Forge &f) { f.strategy = true, f.clip = -inf; },
       "field strategy.clip_max_norm: -inf is out of (0, 1e+09]"},
      {[](Forge &f) { f.strategy = true, f.topk = 1.5; },
       "field strategy.topk: 1.5 is out of (0, 1]"},
      {[](Forge &f) { f.strategy = true, f.decay = -0.1; },
       "field strategy.decay: -0.1 is out of [0, 1]"},
      {[](Forge &f) { f.strategy = true, f.bits = 6; },
       "field strategy.bits: 6 is not a power of two"},
      {[](Forge &f) { f.strategy = true, f.block = 0; },
       "field strategy.block: 0 is out of [1, 1048576]"},
      {[](Forge &f) { f.strategy = true, f.gateHidden = -1; },
       "field strategy.gate_hidden: -1 is out of [1, 65536]"},
      {[](Forge &f) { f.strategy = true, f.collective = "ring"; },
       "field strategy.collective: 99 is none of automatic, none, compressed"},
      {[](Forge &f) { f.strategy = true, f.lrKind = "step"; },
       "field train.lr.kind: 99 is none of constant, linear, cosine"},
      {[](Forge &f) { f.strategy = true, f.steps = 0; },
       "field train.steps: 0 is out of [1, 1099511627776]"},
  };
  for (const Case &c : cases) {
    Forge f;
    c.change(f);
    const std::string e = errorOf(f);
    EXPECT_NE(e.find("mtprt: plan p.mtpplan: "), std::string::npos) << e;
    EXPECT_NE(e.find(c.error), std::string::npos) << e;
  }
}

TEST(Plan, AFileIsReadOnlyWhenItCanBeAPlan) {
  try {
    loadPlan("/nonexistent/p.mtpplan");
    ADD_FAILURE() << "a missing file was read";
  } catch (const PlanError &e) {
    EXPECT_NE(std::string(e.what()).find("cannot open it"), std::string::npos);
  }
  try {
    loadPlan("/tmp");
    ADD_FAILURE() << "a directory was read";
  } catch (const PlanError &e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"),
              std::string::npos);
  }
  // checkPlan: the same verdict without exceptions (mtpc inspect's).
  Forge f;
  f.layers = 1 << 20;
  const std::string forged = f.file(), good = Forge().file();
  EXPECT_EQ(checkPlan(good.data(), good.size(), "p"), "");
  EXPECT_NE(checkPlan(forged.data(), forged.size(), "p")
                .find("field backbone.layers: 1048576 is out of [1, 1024]"),
            std::string::npos);
}

} // namespace

//===----------------------------------------------------------------------===//
// Every field of the plan either changes the run or is a description
//===----------------------------------------------------------------------===//
//
// A plan built field by field (as mtpc writes one), run by the driver as
// mtprt-run would (programFromPlan, runDriver), once as written and once per
// changed field: a field the runtime honours changes what the run does —
// losses, the measured peak, the host pool, the metrics records, the
// checkpoints, the events, the summary — or makes the plan refuse to run; a
// descriptive field (the planner's predictions and cost-model figures)
// changes nothing. (Before #15 item 8, AdamW's betas and eps, the gate's
// width, its recalibration thresholds, save_every and the collective's bits
// were written into the plan and ignored.) The list of fields is checked
// against runtime/schema/plan.fbs, so a new field must be classified here.

namespace {

struct TaskFields {
  std::string name, head;
  int64_t tap = 1;
  bool pooled = false;
  int64_t classes = 0, decoderLayers = 0, targetVocab = 0, targetSeq = 0;
  double weight = 1.0;
  std::string loss = "cross_entropy";
  std::string lrKind; ///< empty: no schedule of its own
  double lrPeak = 0;
  int64_t lrWarmup = 0;
};

/// Every field of plan.fbs, with a small valid plan as the defaults.
struct PlanFields {
  std::string model = "knobs", source = "knobs.mtp";
  // Target
  std::string device = "cpu", precision = "fp32";
  int64_t memory = 1 << 30, usable = 1 << 30, gpus = 1, micro = 8, global = 8;
  // Backbone
  std::string kind = "transformer";
  int64_t layers = 2, hidden = 16, heads = 2, ffn = 32, vocab = 40, seq = 12;
  double dropout = 0.1;
  std::string attention = "math";
  std::string pointwise = "aten";
  int64_t positions = 0;
  double normEps = 1e-5;
  std::string weights;
  int64_t kvHeads = 0;
  double ropeTheta = 10000;
  std::vector<double> ropeScaling;
  bool noAttentionBias = false, noMlpBias = false;
  int64_t typeVocab = 0, positionPad = -1, tokenPad = -1;
  int64_t freezeFirst = -1, freezeLast = -1;
  std::vector<TaskFields> tasks = {{"cls", "classify", 1, true, 4},
                                   {"tag", "tag", 1, false, 6, 0, 0, 0, 0.5},
                                   {"gen", "decoder", 2, false, 0, 1, 0, 4}};
  // Units: the decisions (a unit per backbone block and head, kept unless
  // listed), regions, the offload and bucket tables.
  std::vector<int64_t> offloadBlocks;
  std::vector<std::string> offloadHeads;
  int64_t unitSavedBytes = 100, unitFlops = 1000;
  std::vector<std::pair<int64_t, int64_t>> regions;
  int64_t offloadTableBytes = 0; ///< one Offload entry when > 0
  int64_t bucketElements = 0;    ///< one Bucket entry when > 0
  int64_t predicted = 123456, keepPeak = 200000, uniformPeak = 100000;
  double addedSeconds = 1e-4;
  // Strategy
  std::string scope = "features";
  int64_t scopeLayers = 1;
  double gfmKeep = 1.0, clip = 0.0;
  int64_t gateHidden = 32;
  double reuse = 0.15, stdThreshold = 0.4;
  std::string collective = "auto";
  double topk = 0.15;
  int64_t block = 256, bits = 8;
  double decay = 0.8;
  /// Strategy.dynamic_batch, written when `dynamic`.
  bool dynamic = false;
  BatchSchedule schedule{/*start=*/8, /*max=*/24, /*rate=*/1.0,
                         /*rampSteps=*/3, /*decay=*/0.5, /*every=*/1,
                         /*floor=*/8};
  /// Strategy.saps, written when `sparse`; Plan.steady_peak_bytes with it.
  bool sparse = false;
  SapsConfig saps{/*fraction=*/0.2, /*every=*/1000, /*lambda=*/1.0};
  int64_t steady = 0;
  /// Train.phases (none when empty) and Strategy.ewc, written when `ewcOn`.
  std::vector<Phase> phases;
  bool ewcOn = false;
  EwcConfig ewc{/*lambda=*/1e6, /*fisherBatches=*/2};
  /// Strategy.adapters, written when `adapted`.
  bool adapted = false;
  /// Plan.pipeline (docs/pipeline.md), written when `piped`: two stages,
  /// units 0–2 with the heads on tap 1, units 3–4 with the one on tap 2;
  /// `pipeStages` overrides the first stage's units.
  bool piped = false;
  std::pair<int64_t, int64_t> pipeFirst{0, 2};
  /// Every head listed on the last stage, whatever its tap (a forged plan).
  bool pipeHeadsLast = false;
  /// Target.zero and Strategy.optimizer_offload (docs/zero.md).
  int64_t zero = 0;
  bool optimizerOffload = false;
  AdapterConfig adapters{/*bottleneck=*/4, /*separation=*/10.0};
  /// Adapters.grouped_peak_bytes (npd(regroup): the unsplit groups' peak).
  int64_t groupedPeak = 0;
  // Train
  int64_t steps = 3;
  uint64_t seed = 0;
  std::string data = "synthetic";
  std::string evalData;
  int64_t evalEvery = 0;
  std::string lrKind = "constant";
  double lrPeak = 3e-3;
  int64_t lrWarmup = 0;
  double weightDecay = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int64_t logEvery = 1, saveEvery = 0;
};

std::string build(const PlanFields &f) {
  flatbuffers::FlatBufferBuilder b;
  auto lr = [&](const std::string &kind, double peak, int64_t warmup) {
    return kind.empty()
               ? flatbuffers::Offset<fb::LrSchedule>()
               : fb::CreateLrSchedule(b, KIND(ScheduleKind, kind), peak, warmup);
  };
  auto backbone =
      fb::CreateBackbone(b, KIND(BackboneKind, f.kind), f.layers, f.hidden,
                         f.heads, f.ffn, f.vocab, f.seq, f.dropout,
                         KIND(AttentionKind, f.attention),
                         KIND(PointwiseKind, f.pointwise), f.positions,
                         f.normEps,
                         f.weights.empty() ? 0 : b.CreateString(f.weights),
                         f.kvHeads, f.ropeTheta,
                         f.ropeScaling.empty()
                             ? 0
                             : b.CreateVector(f.ropeScaling),
                         f.noAttentionBias, f.noMlpBias, f.typeVocab,
                         f.positionPad, f.tokenPad, f.freezeFirst,
                         f.freezeLast);
  std::vector<flatbuffers::Offset<fb::Task>> tasks;
  for (const TaskFields &t : f.tasks)
    tasks.push_back(fb::CreateTask(
        b, b.CreateString(t.name), KIND(HeadKind, t.head), t.tap, t.pooled,
        t.classes, t.decoderLayers, t.targetVocab, t.targetSeq, t.weight,
        KIND(LossKind, t.loss), lr(t.lrKind, t.lrPeak, t.lrWarmup)));
  std::vector<flatbuffers::Offset<fb::Unit>> units;
  for (int64_t block = 0; block <= 2 * f.layers; ++block) {
    const bool off =
        std::count(f.offloadBlocks.begin(), f.offloadBlocks.end(), block) > 0;
    const std::string name = "block" + std::to_string(block);
    units.push_back(fb::CreateUnit(
        b, b.CreateString(name),
        block ? fb::UnitKind::mlp_up : fb::UnitKind::embed,
        (block + 1) / 2, block, b.CreateString(""), f.unitSavedBytes,
        f.unitFlops, off ? fb::Decision::Offload : fb::Decision::Keep));
  }
  for (const TaskFields &t : f.tasks) {
    const bool off =
        std::count(f.offloadHeads.begin(), f.offloadHeads.end(), t.name) > 0;
    units.push_back(fb::CreateUnit(
        b, b.CreateString("head_" + t.name), fb::UnitKind::head, t.tap, -1,
        b.CreateString(t.name), f.unitSavedBytes, f.unitFlops,
        off ? fb::Decision::Offload : fb::Decision::Keep));
  }
  std::vector<fb::Region> regions;
  for (auto [first, last] : f.regions)
    regions.emplace_back(first, last);
  std::vector<flatbuffers::Offset<fb::Offload>> offloads;
  if (f.offloadTableBytes > 0)
    offloads.push_back(fb::CreateOffload(b, b.CreateString("block1"),
                                         f.offloadTableBytes, 1, 1e-5));
  std::vector<flatbuffers::Offset<fb::Bucket>> buckets;
  if (f.bucketElements > 0)
    buckets.push_back(fb::CreateBucket(b, f.bucketElements, true, f.topk,
                                       f.block, f.bits, f.decay));
  auto target =
      fb::CreateTarget(b, b.CreateString(f.device), KIND(Precision, f.precision),
                       f.memory, f.usable, f.gpus, f.micro, f.global, f.zero);
  auto strategy = fb::CreateStrategy(
      b, KIND(GradientScope, f.scope), f.scopeLayers, f.gfmKeep, f.clip,
      f.gateHidden, f.reuse, f.stdThreshold, KIND(CollectivePolicy, f.collective),
      f.topk, f.block, f.bits, f.decay,
      f.dynamic ? fb::CreateBatchSchedule(
                      b, f.schedule.start, f.schedule.max, f.schedule.rate,
                      f.schedule.rampSteps, f.schedule.decay, f.schedule.every,
                      f.schedule.floor)
                : flatbuffers::Offset<fb::BatchSchedule>(),
      f.sparse ? fb::CreateSaps(b, f.saps.fraction, f.saps.every, f.saps.lambda)
               : flatbuffers::Offset<fb::Saps>(),
      f.ewcOn ? fb::CreateEwc(b, f.ewc.lambda, f.ewc.fisherBatches,
                              f.ewc.threshold)
              : flatbuffers::Offset<fb::Ewc>(),
      f.adapted ? fb::CreateAdapters(
                      b, f.adapters.bottleneck, f.adapters.separation,
                      f.adapters.owner.empty()
                          ? flatbuffers::Offset<flatbuffers::Vector<int64_t>>()
                          : b.CreateVector(f.adapters.owner),
                      f.adapters.share.value_or(0.0), f.adapters.regroup,
                      f.groupedPeak)
                : flatbuffers::Offset<fb::Adapters>(),
      f.optimizerOffload);
  std::vector<flatbuffers::Offset<fb::Phase>> phases;
  for (const Phase &p : f.phases)
    phases.push_back(fb::CreatePhase(b, p.steps, b.CreateVector(p.tasks),
                                     p.predictedPeakBytes,
                                     p.groupedPeakBytes));
  auto train =
      fb::CreateTrain(b, f.steps, f.seed, b.CreateString(f.data),
                      lr(f.lrKind, f.lrPeak, f.lrWarmup), f.weightDecay,
                      f.beta1, f.beta2, f.eps, f.logEvery, f.saveEvery,
                      f.evalData.empty()
                          ? flatbuffers::Offset<flatbuffers::String>()
                          : b.CreateString(f.evalData),
                      f.evalEvery,
                      f.phases.empty() ? 0 : b.CreateVector(phases));
  flatbuffers::Offset<fb::Pipeline> pipeline;
  if (f.piped) {
    std::vector<int64_t> low, high;
    for (size_t t = 0; t < f.tasks.size(); ++t)
      (2 * f.tasks[t].tap <= f.pipeFirst.second && !f.pipeHeadsLast ? low
                                                                    : high)
          .push_back(int64_t(t));
    std::vector<flatbuffers::Offset<fb::PipelineStage>> stages = {
        fb::CreatePipelineStage(b, f.pipeFirst.first, f.pipeFirst.second,
                                b.CreateVector(low), 100, f.predicted, 2,
                                1e-3, 2e-3),
        fb::CreatePipelineStage(b, f.pipeFirst.second + 1, 2 * f.layers,
                                b.CreateVector(high), 100, f.predicted, 1,
                                1e-3, 2e-3)};
    pipeline = fb::CreatePipeline(b, b.CreateVector(stages), false,
                                  f.global / f.micro, 0.2);
  }
  auto plan = fb::CreatePlan(
      b, unsigned(fb::PlanVersion::Current), b.CreateString(f.model),
      b.CreateString(f.source), target, backbone, b.CreateVector(tasks),
      b.CreateVector(units), b.CreateVectorOfStructs(regions),
      b.CreateVector(offloads), b.CreateVector(buckets), f.predicted,
      f.keepPeak, f.uniformPeak, f.addedSeconds, strategy, train,
      /*eval_peak_bytes=*/0, /*eval_batch=*/0, f.steady,
      f.piped ? pipeline : flatbuffers::Offset<fb::Pipeline>());
  fb::FinishPlanBuffer(b, plan);
  // Framed with its checksum, as mtpc writes a plan file.
  return framePlan(b.GetBufferPointer(), b.GetSize());
}

/// The JSON value after `key` in a metrics record (an object or a number).
std::string value(const std::string &line, const std::string &key) {
  const size_t at = line.find("\"" + key + "\":");
  if (at == std::string::npos)
    return "";
  size_t i = at + key.size() + 3, depth = 0;
  const size_t from = i;
  for (; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '{' || c == '[')
      ++depth;
    else if (c == '}' || c == ']') {
      if (depth == 0)
        break;
      --depth;
    } else if (c == ',' && depth == 0)
      break;
  }
  return line.substr(from, i - from);
}

/// What one run did.
struct PlanRun {
  int rc = -1;
  std::string output;    ///< stdout and stderr
  std::string losses;    ///< every record's loss and alpha objects
  int64_t peak = 0;      ///< largest measured_peak_bytes
  int64_t hostPool = 0;  ///< largest host_pool_bytes
  std::string predicted; ///< predicted_peak_bytes as logged, every step's
  int records = 0, events = 0;
  std::vector<std::string> checkpoints;             ///< file names
  std::string metrics;                              ///< the file
  std::vector<std::pair<int64_t, int64_t>> regions; ///< the step's
};

PlanRun runPlan(const PlanFields &f, const TempDir &dir,
                std::vector<std::string> args = {}) {
  static int n = 0;
  const std::string tag = std::to_string(n++);
  const std::string planFile = dir.path + "/p" + tag + ".mtpplan";
  const std::string metrics = dir.path + "/m" + tag + ".jsonl";
  const std::string ckpt = dir.path + "/c" + tag;
  { std::ofstream(planFile, std::ios::binary) << build(f); }
  PlanRun r;
  const std::string log = dir.path + "/out" + tag + ".txt";
  r.rc = captured(log, [&] {
    try {
      Program p = programFromPlan(loadPlan(planFile));
      r.regions = p.schedule.regions;
      // --nproc 1: in this process, never the launcher (which a pipeline
      // plan would start, re-running this test binary as its ranks).
      args.insert(args.begin(),
                  {"mtprt-run", "--threads", "1", "--progress", "off",
                   "--metrics", metrics, "--checkpoint-dir", ckpt, "--nproc",
                   "1"});
      return runDriverWith(args, p);
    } catch (const std::exception &e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
  });
  r.output = readFile(log);
  r.metrics = readFile(metrics);
  std::istringstream in(r.metrics);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"event\"") != std::string::npos) {
      ++r.events;
      continue;
    }
    ++r.records;
    r.losses += value(line, "loss") + value(line, "alpha") + "\n";
    r.peak = std::max<int64_t>(
        r.peak, std::atoll(value(line, "measured_peak_bytes").c_str()));
    r.hostPool = std::max<int64_t>(
        r.hostPool, std::atoll(value(line, "host_pool_bytes").c_str()));
    // Every step's (a regroup's split changes it mid-run).
    r.predicted += value(line, "predicted_peak_bytes") + " ";
  }
  if (DIR *d = opendir(ckpt.c_str())) {
    while (dirent *e = readdir(d))
      if (std::string(e->d_name).rfind("step-", 0) == 0)
        r.checkpoints.push_back(e->d_name);
    closedir(d);
  }
  std::sort(r.checkpoints.begin(), r.checkpoints.end());
  return r;
}

/// How a changed field shows.
enum class Shows {
  Losses,      ///< the losses (or α) of some step differ
  Peak,        ///< the measured peak differs
  HostPool,    ///< the host pool's peak differs
  Records,     ///< the number of metrics records differs
  Checkpoints, ///< other checkpoint files
  Regions,     ///< the step runs other checkpoint regions
  Events,      ///< DGFG recalibration events appear
  Predicted,   ///< the logged prediction
  Output,      ///< the output says so (`text`)
  Refused,     ///< the run refuses, saying `text`
  Nothing,     ///< a description: the run is the same
};

struct Change {
  const char *field; ///< Table.field as in plan.fbs
  std::function<void(PlanFields &)> apply;
  Shows shows;
  std::string text = {};
  /// Applied to the reference too (then it runs again), so that the change
  /// is of this field alone.
  std::function<void(PlanFields &)> prepare = {};
};

/// The fields of every table and struct of plan.fbs, as "Table.field".
std::set<std::string> schemaFields() {
  std::istringstream in(readFile(MTPRT_PLAN_SCHEMA));
  std::set<std::string> out;
  std::string line, table;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find("//"));
    std::istringstream words(line);
    std::string first, second;
    words >> first >> second;
    if (first == "table" || first == "struct") {
      table = second;
      const size_t open = line.find('{');
      line = open == std::string::npos ? "" : line.substr(open + 1);
    }
    if (table.empty())
      continue;
    const size_t close = line.find('}');
    // "layers: long; hidden: long; ..." declares several on one line.
    std::istringstream decls(line.substr(0, close));
    std::string decl;
    while (std::getline(decls, decl, ';')) {
      const size_t c = decl.find(':');
      if (c == std::string::npos)
        continue;
      std::string n = decl.substr(0, c);
      n.erase(0, n.find_first_not_of(" \t"));
      n.erase(n.find_last_not_of(" \t") + 1);
      if (!n.empty())
        out.insert(table + "." + n);
    }
    if (close != std::string::npos)
      table.clear();
  }
  return out;
}

} // namespace

namespace {

/// A JSON Lines file for train.data with the synthetic batches' shapes.
void writeData(const std::string &jsonl) {
  std::ofstream o(jsonl);
  for (int r = 0; r < 16; ++r) {
    o << "{\"tokens\": [";
    for (int i = 0; i < 12; ++i)
      o << (i ? ", " : "") << (r * 7 + i * 3) % 40;
    o << "], \"labels\": {\"cls\": " << r % 4 << ", \"tag\": [";
    for (int i = 0; i < 12; ++i)
      o << (i ? ", " : "") << (r + i) % 6;
    o << "], \"gen\": [";
    for (int i = 0; i < 4; ++i)
      o << (i ? ", " : "") << (r * 3 + i) % 40;
    o << "]}}\n";
  }
}

/// Every field of plan.fbs and how changing it shows.
std::vector<Change> allChanges(const std::string &jsonl) {
  using F = PlanFields;
  auto task = [](int t, std::function<void(TaskFields &)> fn) {
    return [t, fn](F &f) { fn(f.tasks[t]); };
  };
  // Five steps of the dynamic batch: the ramp's three, then the decay's.
  const std::function<void(F &)> dynamicBatch = [](F &f) {
    f.dynamic = true;
    f.global = 24;
    f.steps = 5;
  };
  const std::function<void(F &)> sparse = [](F &f) { f.sparse = true; };
  // Two phases: cls for two steps, then tag and gen for three (the
  // penalty is 0 at the second phase's first update, θ = θ*; λ shows in the
  // last step's losses).
  const std::function<void(F &)> phased = [](F &f) {
    f.steps = 5;
    f.phases = {{2, {0}}, {3, {1, 2}}};
  };
  const std::function<void(F &)> withEwc = [phased](F &f) {
    phased(f);
    f.ewcOn = true;
  };
  const std::function<void(F &)> adapted = [](F &f) { f.adapted = true; };
  // Every task reads the first's adapter, split below 0.99 (npd(share));
  // `regrouping` measures after every step, so the first one splits.
  const std::function<void(F &)> shared = [](F &f) {
    f.adapted = true;
    f.adapters.owner.assign(f.tasks.size(), 0);
    f.adapters.share = 0.99;
  };
  const std::function<void(F &)> regrouping = [shared](F &f) {
    shared(f);
    f.adapters.regroup = 1;
  };
  const std::function<void(F &)> bert = [](F &f) {
    f.kind = "bert";
    f.typeVocab = 2;
  };
  const std::function<void(F &)> llama = [](F &f) {
    f.kind = "llama";
    f.attention = "fused";
    f.dropout = 0.0;
  };
  return {
      {"Plan.version", [](F &) {}, Shows::Nothing}, // checked: PlanTest above
      {"Plan.model", [](F &f) { f.model = "renamed"; }, Shows::Output,
       "summary: model 'renamed'"},
      {"Plan.source", [](F &f) { f.source = "other.mtp"; }, Shows::Nothing},
      {"Plan.target", [](F &) {}, Shows::Nothing},   // its fields below
      {"Plan.backbone", [](F &) {}, Shows::Nothing}, // its fields below
      {"Plan.tasks", [](F &f) { f.tasks.pop_back(); }, Shows::Losses},
      {"Plan.units", [](F &f) { f.offloadBlocks = {1}; }, Shows::HostPool},
      {"Plan.regions",
       [](F &f) {
         f.regions = {{1, 2}};
       },
       Shows::Peak},
      {"Plan.offloads", [](F &f) { f.offloadTableBytes = 4096; },
       Shows::Nothing},
      {"Plan.buckets", [](F &f) { f.bucketElements = 1000; }, Shows::Nothing},
      {"Plan.predicted_peak_bytes", [](F &f) { f.predicted = 654321; },
       Shows::Predicted},
      {"Plan.keep_peak_bytes", [](F &f) { f.keepPeak = 1; }, Shows::Nothing},
      {"Plan.uniform_peak_bytes", [](F &f) { f.uniformPeak = 1; },
       Shows::Nothing},
      {"Plan.added_seconds", [](F &f) { f.addedSeconds = 9; }, Shows::Nothing},
      {"Plan.strategy", [](F &) {}, Shows::Nothing}, // its fields below
      {"Plan.train", [](F &) {}, Shows::Nothing},    // its fields below
      // The evaluation's batch and its predicted peak (no evaluation here;
      // test/tools/examples-peaks.test and evaluate.test check both).
      {"Plan.eval_peak_bytes", [](F &) {}, Shows::Nothing},
      {"Plan.eval_batch", [](F &) {}, Shows::Nothing},
      // Under SAPS, the prediction of the steps that do not re-rank (the
      // last one here).
      {"Plan.steady_peak_bytes", [](F &f) { f.steady = 100000; },
       Shows::Predicted, "", sparse},

      {"Target.device", [](F &f) { f.device = "cuda"; },
       cudaMemoryStatsAvailable() ? Shows::Peak : Shows::Refused,
       "no usable CUDA device"},
      {"Target.precision", [](F &f) { f.precision = "bf16"; }, Shows::Losses},
      {"Target.memory_bytes", [](F &f) { f.memory = int64_t(2) << 30; },
       Shows::Nothing},
      {"Target.usable_bytes", [](F &f) { f.usable = 1 << 20; }, Shows::Nothing},
      {"Target.gpus", [](F &f) { f.gpus = 2; f.global = 16; }, Shows::Output,
       "(the plan is for 2 process(es), this run has 1"},
      {"Target.micro_batch", [](F &f) { f.micro = 4; }, Shows::Peak},
      {"Target.global_batch", [](F &f) { f.global = 16; }, Shows::Losses},
      // One process holds every shard: the same run (test/tools/zero.test
      // runs it on two and four).
      {"Target.zero", [](F &f) { f.zero = 1; }, Shows::Nothing},

      // A pipeline's stages need as many processes (test/tools/pipeline.test
      // runs them: the split, each stage's heads, its prediction and
      // micro-batches in flight, the schedule); its fields are checked as
      // the plan is read (PlanTest.PipelineStagesAreChecked).
      {"Plan.pipeline", [](F &f) { f.piped = true; f.gpus = 2; },
       Shows::Refused, "the plan cuts the backbone into 2 pipeline stages"},
      {"Pipeline.stages", [](F &) {}, Shows::Nothing},
      {"Pipeline.gpipe", [](F &) {}, Shows::Nothing},
      {"Pipeline.micro_batches", [](F &) {}, Shows::Nothing},
      {"Pipeline.bubble", [](F &) {}, Shows::Nothing},
      {"PipelineStage.first_unit", [](F &) {}, Shows::Nothing},
      {"PipelineStage.last_unit", [](F &) {}, Shows::Nothing},
      {"PipelineStage.tasks", [](F &) {}, Shows::Nothing},
      {"PipelineStage.parameters", [](F &) {}, Shows::Nothing},
      {"PipelineStage.predicted_peak_bytes", [](F &) {}, Shows::Nothing},
      {"PipelineStage.in_flight", [](F &) {}, Shows::Nothing},
      {"PipelineStage.forward_s", [](F &) {}, Shows::Nothing},
      {"PipelineStage.backward_s", [](F &) {}, Shows::Nothing},

      {"Backbone.kind", [](F &f) { f.kind = "rnn"; }, Shows::Refused,
       "field backbone.kind: 99 is none of transformer"},
      {"Backbone.layers", [](F &f) { f.layers = 3; }, Shows::Losses},
      {"Backbone.hidden", [](F &f) { f.hidden = 24; }, Shows::Losses},
      {"Backbone.heads", [](F &f) { f.heads = 4; }, Shows::Losses},
      {"Backbone.ffn", [](F &f) { f.ffn = 48; }, Shows::Losses},
      {"Backbone.vocab", [](F &f) { f.vocab = 50; }, Shows::Losses},
      {"Backbone.seq", [](F &f) { f.seq = 10; }, Shows::Losses},
      {"Backbone.dropout", [](F &f) { f.dropout = 0.0; }, Shows::Losses},
      // Fused attention keeps no S×S tensors (at dropout 0: on the CPU a
      // fused config with dropout runs the math path).
      {"Backbone.attention", [](F &f) { f.attention = "fused"; }, Shows::Peak,
       "", [](F &f) { f.dropout = 0.0; }},
      // The fused norm and GELU kernels keep neither's output.
      {"Backbone.pointwise", [](F &f) { f.pointwise = "fused"; }, Shows::Peak},
      // More position rows draw more of the initialization's numbers.
      {"Backbone.positions", [](F &f) { f.positions = 20; }, Shows::Losses},
      {"Backbone.norm_eps", [](F &f) { f.normEps = 0.1; }, Shows::Losses},
      {"Backbone.weights", [](F &f) { f.weights = "/nonexistent"; },
       Shows::Refused, "has no Hugging Face names"},
      // Llama's fields, on a llama backbone (fused attention, dropout 0).
      {"Backbone.kv_heads", [](F &f) { f.kvHeads = 1; }, Shows::Losses, "",
       llama},
      {"Backbone.rope_theta", [](F &f) { f.ropeTheta = 100; }, Shows::Losses,
       "", llama},
      {"Backbone.rope_scaling",
       [](F &f) { f.ropeScaling = {8, 1, 4, 4}; }, Shows::Losses, "", llama},
      {"Backbone.no_attention_bias", [](F &f) { f.noAttentionBias = true; },
       Shows::Losses, "", llama},
      {"Backbone.no_mlp_bias", [](F &f) { f.noMlpBias = true; },
       Shows::Losses, "", llama},
      // BERT's, on a bert backbone.
      {"Backbone.type_vocab", [](F &f) { f.typeVocab = 3; }, Shows::Losses,
       "", bert},
      {"Backbone.position_pad", [](F &f) { f.positionPad = 1; },
       Shows::Losses, "",
       [bert](F &f) {
         bert(f);
         f.positions = 14; // room for positions from the padding id + 1
       }},
      {"Backbone.token_pad", [](F &f) { f.tokenPad = 1; }, Shows::Losses, "",
       bert},
      // Frozen embeddings: no update, nothing kept for their backward.
      {"Backbone.freeze_first",
       [](F &f) {
         f.freezeFirst = 0;
         f.freezeLast = 0;
       },
       Shows::Losses},
      {"Backbone.freeze_last",
       [](F &f) {
         f.freezeFirst = 1;
         f.freezeLast = 2;
       },
       Shows::Losses},

      {"Task.name", task(0, [](TaskFields &t) { t.name = "klass"; }),
       Shows::Losses},
      {"Task.head", task(1, [](TaskFields &t) { t.head = "span"; }),
       Shows::Losses},
      {"Task.tap_layer", task(0, [](TaskFields &t) { t.tap = 2; }),
       Shows::Losses},
      // A classify head always reads the pooled (first-token) vector; the
      // flag records how the spec said it (docs/language.md).
      {"Task.pooled", task(0, [](TaskFields &t) { t.pooled = false; }),
       Shows::Nothing},
      {"Task.classes", task(0, [](TaskFields &t) { t.classes = 5; }),
       Shows::Losses},
      {"Task.decoder_layers",
       task(2, [](TaskFields &t) { t.decoderLayers = 2; }), Shows::Losses},
      {"Task.target_vocab", task(2, [](TaskFields &t) { t.targetVocab = 20; }),
       Shows::Losses},
      {"Task.target_seq", task(2, [](TaskFields &t) { t.targetSeq = 3; }),
       Shows::Losses},
      {"Task.weight", task(1, [](TaskFields &t) { t.weight = 1.0; }),
       Shows::Losses},
      {"Task.loss", task(0, [](TaskFields &t) { t.loss = "mse"; }),
       Shows::Losses},
      {"Task.lr",
       task(1,
            [](TaskFields &t) {
              t.lrKind = "constant";
              t.lrPeak = 3e-2;
            }),
       Shows::Losses},
      {"LrSchedule.kind", [](F &f) { f.lrKind = "linear"; }, Shows::Losses},
      {"LrSchedule.peak", [](F &f) { f.lrPeak = 1e-2; }, Shows::Losses},
      {"LrSchedule.warmup", [](F &f) { f.lrWarmup = 2; }, Shows::Losses},

      {"Strategy.scope", [](F &f) { f.scope = "sum"; }, Shows::Losses},
      {"Strategy.scope_layers", [](F &f) { f.scopeLayers = 2; }, Shows::Losses,
       "", [](F &f) { f.scope = "params"; }},
      {"Strategy.gfm_keep", [](F &f) { f.gfmKeep = 0.5; }, Shows::Losses},
      {"Strategy.clip_max_norm", [](F &f) { f.clip = 0.01; }, Shows::Losses},
      {"Strategy.gate_hidden", [](F &f) { f.gateHidden = 64; }, Shows::Losses},
      // (Layer 2 serves only gen: the reuse ratio is below 1, the largest
      // threshold a plan may carry; every cosine matrix spreads above 0.)
      {"Strategy.recalibrate_reuse", [](F &f) { f.reuse = 1.0; }, Shows::Events,
       "", [](F &f) { f.stdThreshold = 0.0; }},
      {"Strategy.recalibrate_std", [](F &f) { f.stdThreshold = 0.0; },
       Shows::Events, "",
       [](F &f) {
         f.reuse = 1.0;
         f.stdThreshold = 1.0;
       }},
      // The collective's fields act between processes (the two-process test
      // below): one process exchanges nothing.
      {"Strategy.collective", [](F &f) { f.collective = "none"; },
       Shows::Nothing},
      {"Strategy.topk", [](F &f) { f.topk = 0.5; }, Shows::Nothing},
      {"Strategy.block", [](F &f) { f.block = 64; }, Shows::Nothing},
      {"Strategy.bits", [](F &f) { f.bits = 4; }, Shows::Nothing},
      {"Strategy.decay", [](F &f) { f.decay = 0.2; }, Shows::Nothing},
      // The dynamic batch (D15): steps of 8, 16, 24, 24, then 12 → 8 (micro
      // batch 8); the plan is for the largest, 24. A changed field changes
      // some step's batch, so its losses.
      {"Strategy.dynamic_batch",
       [](F &f) {
         f.dynamic = true;
         f.global = 24;
       },
       Shows::Output, "batches of 8 to 24"},
      {"BatchSchedule.start", [](F &f) { f.schedule.start = 16; },
       Shows::Losses, "", dynamicBatch},
      {"BatchSchedule.max",
       [](F &f) {
         f.schedule.max = 16;
         f.global = 16;
       },
       Shows::Losses, "", dynamicBatch},
      {"BatchSchedule.rate",
       [](F &f) {
         f.schedule.rate = 0.5;
         f.global = 16;
       },
       Shows::Losses, "", dynamicBatch},
      {"BatchSchedule.ramp_steps",
       [](F &f) {
         f.schedule.rampSteps = 2;
         f.global = 16;
       },
       Shows::Losses, "", dynamicBatch},
      {"BatchSchedule.decay", [](F &f) { f.schedule.decay = 0.9; },
       Shows::Losses, "", dynamicBatch},
      {"BatchSchedule.every", [](F &f) { f.schedule.every = 2; },
       Shows::Losses, "", dynamicBatch},
      {"BatchSchedule.floor", [](F &f) { f.schedule.floor = 16; },
       Shows::Losses, "", dynamicBatch},

      // SAPS (D12): sparse updates of the backbone; each field changes the
      // selection or the update, so the losses.
      {"Strategy.saps", [](F &f) { f.sparse = true; }, Shows::Losses},
      {"Saps.fraction", [](F &f) { f.saps.fraction = 0.5; }, Shows::Losses, "",
       sparse},
      {"Saps.every", [](F &f) { f.saps.every = 1; }, Shows::Losses, "", sparse},
      {"Saps.lambda", [](F &f) { f.saps.lambda = 1e6; }, Shows::Losses, "",
       sparse},

      // Sequential training: each phase keeps its tasks' labels.
      {"Train.phases", [](F &f) { f.phases = {{1, {0}}, {2, {1, 2}}}; },
       Shows::Losses},
      {"Phase.steps", [](F &f) { f.phases = {{1, {0}}, {4, {1, 2}}}; },
       Shows::Losses, "", phased},
      {"Phase.tasks", [](F &f) { f.phases[0].tasks = {1}; }, Shows::Losses,
       "", phased},
      {"Phase.predicted_peak_bytes",
       [](F &f) { f.phases[1].predictedPeakBytes = 100000; },
       Shows::Predicted, "", phased},
      // EWC (D14): from the second phase the penalty pulls the backbone.
      {"Strategy.ewc", [](F &f) { f.ewcOn = true; }, Shows::Losses, "",
       phased},
      {"Ewc.lambda", [](F &f) { f.ewc.lambda = 1e2; }, Shows::Losses, "",
       withEwc},
      {"Ewc.fisher_batches", [](F &f) { f.ewc.fisherBatches = 1; },
       Shows::Losses, "", withEwc},
      // No pair of tasks is more similar than 1: never protected.
      {"Ewc.threshold", [](F &f) { f.ewc.threshold = 1.0; }, Shows::Losses,
       "", withEwc},

      // Adapters (D13): the heads read their taps through them; the
      // separation loss moves the gates, so the later losses.
      {"Strategy.adapters", [](F &f) { f.adapted = true; }, Shows::Losses},
      // AdamW's moments in the host pool (docs/zero.md).
      {"Strategy.optimizer_offload", [](F &f) { f.optimizerOffload = true; },
       Shows::HostPool},
      {"Adapters.bottleneck", [](F &f) { f.adapters.bottleneck = 8; },
       Shows::Losses, "", adapted},
      {"Adapters.separation", [](F &f) { f.adapters.separation = 1e3; },
       Shows::Losses, "", adapted},
      // The second task reads the first's adapter (npd(share)).
      {"Adapters.owners",
       [](F &f) { f.adapters.owner.assign(f.tasks.size(), 0); },
       Shows::Losses, "", adapted},
      // npd(regroup): the groups split after the first step (their
      // gradients on the shared adapter are not 0.99 alike), so the later
      // steps' adapters learn apart; share -1 keeps every pair together.
      {"Adapters.regroup", [](F &f) { f.adapters.regroup = 1; },
       Shows::Losses, "", shared},
      {"Adapters.share", [](F &f) { f.adapters.share = -1.0; },
       Shows::Losses, "", regrouping},
      // Before the split the prediction is the unsplit groups'.
      {"Adapters.grouped_peak_bytes", [](F &f) { f.groupedPeak = 1000; },
       Shows::Predicted, "", regrouping},
      {"Phase.grouped_peak_bytes",
       [](F &f) { f.phases[0].groupedPeakBytes = 1000; }, Shows::Predicted,
       "", [phased, regrouping](F &f) {
         phased(f);
         regrouping(f);
         for (Phase &p : f.phases)
           p.predictedPeakBytes = 100000;
       }},

      {"Train.steps", [](F &f) { f.steps = 4; }, Shows::Records},
      {"Train.seed", [](F &f) { f.seed = 3; }, Shows::Losses},
      {"Train.data", [jsonl](F &f) { f.data = jsonl; }, Shows::Losses},
      {"Train.lr", [](F &f) { f.lrPeak = 1e-2; }, Shows::Losses},
      {"Train.weight_decay", [](F &f) { f.weightDecay = 0.5; }, Shows::Losses},
      {"Train.beta1", [](F &f) { f.beta1 = 0.5; }, Shows::Losses},
      {"Train.beta2", [](F &f) { f.beta2 = 0.9; }, Shows::Losses},
      {"Train.eps", [](F &f) { f.eps = 0.1; }, Shows::Losses},
      {"Train.log_every", [](F &f) { f.logEvery = 2; }, Shows::Records},
      {"Train.save_every", [](F &f) { f.saveEvery = 2; }, Shows::Checkpoints},
      // Held-out data: an "eval" record at the end (and every N steps).
      {"Train.eval_data", [jsonl](F &f) { f.evalData = jsonl; },
       Shows::Records},
      {"Train.eval_every", [](F &f) { f.evalEvery = 1; }, Shows::Records, "",
       [jsonl](F &f) { f.evalData = jsonl; }},

      {"Unit.decision", [](F &f) { f.offloadHeads = {"tag"}; },
       Shows::HostPool},
      {"Unit.block", [](F &f) { f.offloadBlocks = {2}; }, Shows::HostPool, "",
       [](F &f) { f.offloadBlocks = {1}; }},
      {"Unit.task", [](F &f) { f.offloadHeads = {"cls"}; }, Shows::HostPool, "",
       [](F &f) { f.offloadHeads = {"tag"}; }},
      {"Unit.name", [](F &) {}, Shows::Nothing},
      {"Unit.kind", [](F &) {}, Shows::Nothing},
      {"Unit.layer", [](F &) {}, Shows::Nothing},
      {"Unit.saved_bytes", [](F &f) { f.unitSavedBytes = 7; }, Shows::Nothing},
      {"Unit.fwd_flops", [](F &f) { f.unitFlops = 7; }, Shows::Nothing},
      // (Recomputing layer 1 or only its MLP peaks alike: the bottom
      // layer's backward holds both units either way. The run's schedule
      // shows it.)
      {"Region.first_block",
       [](F &f) {
         f.regions = {{2, 2}};
       },
       Shows::Regions, "",
       [](F &f) {
         f.regions = {{1, 2}};
       }},
      {"Region.last_block",
       [](F &f) {
         f.regions = {{1, 1}};
       },
       Shows::Peak, "",
       [](F &f) {
         f.regions = {{1, 2}};
       }},
      {"Offload.unit", [](F &) {}, Shows::Nothing},
      {"Offload.bytes", [](F &f) { f.offloadTableBytes = 4096; },
       Shows::Nothing},
      {"Offload.stream", [](F &) {}, Shows::Nothing},
      {"Offload.exposed_wait_s", [](F &) {}, Shows::Nothing},
      {"Bucket.elements", [](F &f) { f.bucketElements = 1000; },
       Shows::Nothing},
      {"Bucket.compressed", [](F &) {}, Shows::Nothing},
      {"Bucket.topk", [](F &) {}, Shows::Nothing},
      {"Bucket.block", [](F &) {}, Shows::Nothing},
      {"Bucket.bits", [](F &) {}, Shows::Nothing},
      {"Bucket.decay", [](F &) {}, Shows::Nothing},
  };
}

/// Runs the plan as written and once per change of a field of `table`.
void checkTable(const std::string &table) {
  TempDir dir;
  const std::string jsonl = dir.path + "/d.jsonl";
  writeData(jsonl);
  const PlanFields base;
  const PlanRun ref = runPlan(base, dir);
  ASSERT_EQ(ref.rc, 0) << ref.output;
  ASSERT_EQ(ref.records, 3) << ref.output;
  // The baseline is deterministic, so any difference below is the field's.
  const PlanRun again = runPlan(base, dir);
  ASSERT_EQ(again.losses, ref.losses);
  ASSERT_EQ(again.peak, ref.peak);
  EXPECT_EQ(ref.hostPool, 0);
  EXPECT_EQ(ref.events, 0);

  int checked = 0;
  for (const Change &c : allChanges(jsonl)) {
    if (std::string(c.field).rfind(table + ".", 0) != 0)
      continue;
    ++checked;
    PlanFields f = base;
    PlanRun prepared;
    if (c.prepare) {
      c.prepare(f);
      prepared = runPlan(f, dir);
      ASSERT_EQ(prepared.rc, 0) << c.field << ":\n" << prepared.output;
    }
    const PlanRun &ref0 = c.prepare ? prepared : ref;
    c.apply(f);
    const PlanRun r = runPlan(f, dir);
    const std::string what = std::string(c.field) + ":\n" + r.output;
    if (c.shows == Shows::Refused) {
      EXPECT_NE(r.rc, 0) << what;
      EXPECT_NE(r.output.find(c.text), std::string::npos) << what;
      continue;
    }
    ASSERT_EQ(r.rc, 0) << what;
    switch (c.shows) {
    case Shows::Losses:
      EXPECT_NE(r.losses, ref0.losses) << what;
      break;
    case Shows::Peak:
      EXPECT_NE(r.peak, ref0.peak) << what;
      break;
    case Shows::HostPool:
      EXPECT_NE(r.hostPool, ref0.hostPool) << what;
      break;
    case Shows::Records:
      EXPECT_NE(r.records, ref0.records) << what;
      break;
    case Shows::Regions:
      EXPECT_NE(r.regions, ref0.regions) << what;
      break;
    case Shows::Checkpoints:
      EXPECT_NE(r.checkpoints, ref0.checkpoints) << what;
      break;
    case Shows::Events:
      EXPECT_EQ(ref0.events, 0) << what << ref0.metrics;
      EXPECT_GT(r.events, 0) << what << r.metrics;
      break;
    case Shows::Predicted:
      EXPECT_NE(r.predicted, ref0.predicted) << what;
      break;
    case Shows::Output:
      EXPECT_NE(r.output.find(c.text), std::string::npos) << what;
      EXPECT_EQ(ref0.output.find(c.text), std::string::npos) << what;
      break;
    case Shows::Nothing:
      EXPECT_EQ(r.losses, ref0.losses) << what;
      EXPECT_EQ(r.peak, ref0.peak) << what;
      EXPECT_EQ(r.records, ref0.records) << what;
      break;
    case Shows::Refused:
      break;
    }
  }
  EXPECT_GT(checked, 0) << table;
}

} // namespace

TEST(PlanFields, PlanAndTarget) {
  checkTable("Plan");
  checkTable("Target");
}
TEST(PlanFields, Backbone) { checkTable("Backbone"); }
TEST(PlanFields, TaskAndLrSchedule) {
  checkTable("Task");
  checkTable("LrSchedule");
}
TEST(PlanFields, Strategy) {
  checkTable("Strategy");
  checkTable("BatchSchedule");
  checkTable("Saps");
  checkTable("Ewc");
  checkTable("Adapters");
}
TEST(PlanFields, Train) {
  checkTable("Train");
  checkTable("Phase");
}
TEST(PlanFields, UnitRegionOffloadBucket) {
  checkTable("Unit");
  checkTable("Region");
  checkTable("Offload");
  checkTable("Bucket");
}

TEST(PlanFields, EveryFieldOfTheSchemaIsClassified) {
  std::set<std::string> covered;
  for (const Change &c : allChanges(""))
    covered.insert(c.field);
  const std::set<std::string> schema = schemaFields();
  EXPECT_GT(schema.size(), 80u);
  for (const std::string &field : schema)
    EXPECT_TRUE(covered.count(field))
        << field
        << " (runtime/schema/plan.fbs) is not classified in "
           "unittests/runtime/PlanTest.cpp: does the runtime honour "
           "it (a change shows in the run) or is it a description?";
  for (const std::string &field : covered)
    EXPECT_TRUE(schema.count(field))
        << field << " is not in runtime/schema/plan.fbs";
}

//===----------------------------------------------------------------------===//
// Two processes: mtprt-run --plan --nproc 2
//===----------------------------------------------------------------------===//

namespace {

/// mtprt-run as a child process (output to `log`); its exit code, -1 after
/// `timeoutS`.
int runTool(const std::vector<std::string> &args, const std::string &log,
            int timeoutS = 90) {
  std::vector<std::string> argv = {MTPRT_RUN, "--threads", "1", "--progress",
                                   "off"};
  argv.insert(argv.end(), args.begin(), args.end());
  // (Not the test's own MTPRT_RUN_PLAN: the child reads --plan.)
  return Child(argv, log, {}, 0, {"MTPRT_RUN_PLAN"}).wait(timeoutS);
}

/// The last metrics record's value of `key`.
std::string lastValue(const std::string &metrics, const std::string &key) {
  std::istringstream in(readFile(metrics));
  std::string line, last;
  while (std::getline(in, line))
    if (line.find("\"event\"") == std::string::npos)
      last = line;
  return value(last, key);
}

PlanFields twoRanks() {
  PlanFields f;
  f.gpus = 2;
  f.global = 16; // 8 rows per rank
  f.collective = "compressed";
  f.dropout = 0.0;
  return f;
}

} // namespace

namespace {

struct Exchanged {
  int rc = -1;
  std::string sent, full, losses, output;
};

/// The plan on two ranks: the last record's bytes, every record's losses.
Exchanged exchange(const TempDir &dir, const PlanFields &f) {
  static int n = 0;
  const std::string tag = std::to_string(n++);
  const std::string plan = dir.path + "/p" + tag + ".mtpplan",
                    m = dir.path + "/m" + tag + ".jsonl",
                    log = dir.path + "/log" + tag + ".txt";
  { std::ofstream(plan, std::ios::binary) << build(f); }
  Exchanged r;
  r.rc = runTool({"--plan", plan, "--nproc", "2", "--metrics", m}, log);
  r.output = readFile(log);
  r.sent = lastValue(m, "bytes_sent");
  r.full = lastValue(m, "bytes_sent_uncompressed");
  std::istringstream in(readFile(m));
  std::string line;
  while (std::getline(in, line))
    r.losses += value(line, "loss");
  return r;
}

int64_t bytes(const std::string &v) { return std::atoll(v.c_str()); }

} // namespace

TEST(PlanFields, TheCollectiveAndItsTopkReachTheExchange) {
  TempDir dir;
  PlanFields f = twoRanks();
  f.steps = 1;
  const Exchanged base = exchange(dir, f);
  ASSERT_EQ(base.rc, 0) << base.output;
  ASSERT_FALSE(base.sent.empty()) << base.output;
  EXPECT_LT(bytes(base.sent), bytes(base.full) / 3);
  f.collective = "none";
  Exchanged r = exchange(dir, f);
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(r.sent, r.full) << "Strategy.collective";
  f = twoRanks();
  f.steps = 1;
  f.topk = 0.3;
  r = exchange(dir, f);
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_GT(bytes(r.sent), bytes(base.sent)) << "Strategy.topk";
}

TEST(PlanFields, TheBlockAndTheDecayReachTheExchange) {
  TempDir dir;
  // Three steps: the residual of step 1 feeds step 2's exchange, whose
  // update shows in step 3's losses.
  const Exchanged base = exchange(dir, twoRanks());
  ASSERT_EQ(base.rc, 0) << base.output;
  PlanFields f = twoRanks();
  f.block = 32;
  Exchanged r = exchange(dir, f);
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_GT(bytes(r.sent), bytes(base.sent))
      << "Strategy.block (more blocks, more scales)";
  f = twoRanks();
  f.decay = 0.1;
  r = exchange(dir, f);
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_EQ(r.sent, base.sent);
  EXPECT_NE(r.losses, base.losses) << "Strategy.decay";
}

TEST(PlanFields, BitsOtherThanEightAreRefusedWhereTheyWouldRun) {
  TempDir dir;
  PlanFields f = twoRanks();
  f.bits = 4;
  const Exchanged r = exchange(dir, f);
  EXPECT_EQ(r.rc, 1) << r.output;
  // Said once, by the launcher, before any rank starts.
  EXPECT_NE(r.output.find(std::string(MTPRT_RUN) +
                          ": error: the plan's collective quantizes to 4 "
                          "bits per value; this runtime's GSC kernels "
                          "quantize to 8 bits only: re-plan with "
                          "compressed(bits = 8), or run with --no-compress\n"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("error:"), r.output.rfind("error:")) << r.output;
  EXPECT_EQ(r.output.find("rank"), std::string::npos) << r.output;
}

TEST(PlanFields, ANonFiniteLossOnOneRankStopsBothRanks) {
  // An mse task whose label no float can square, in one row of rank 1's
  // half of the second global batch: rank 1's loss is infinite, rank 0's
  // finite. The per-step all-reduce makes both ranks stop at step 2; rank 0
  // says so once; step 1's checkpoints stay.
  TempDir dir;
  PlanFields f = twoRanks();
  f.collective = "none";
  f.steps = 10;
  f.tasks = {{"cls", "classify", 1, true, 4},
             {"reg", "classify", 2, true, 1, 0, 0, 0, 1.0, "mse"}};
  f.data = dir.path + "/d.jsonl";
  {
    std::ofstream o(f.data);
    for (int r = 0; r < 32; ++r) {
      o << "{\"tokens\": [";
      for (int i = 0; i < 12; ++i)
        o << (i ? ", " : "") << (r * 5 + i) % 40;
      o << "], \"labels\": {\"cls\": " << r % 4 << ", \"reg\": ["
        << (r == 24 ? "1e30" : "0.5") << "]}}\n";
    }
  }
  const std::string plan = dir.path + "/p.mtpplan", c = dir.path + "/c",
                    log = dir.path + "/log.txt";
  { std::ofstream(plan, std::ios::binary) << build(f); }
  EXPECT_EQ(runTool({"--plan", plan, "--nproc", "2", "--checkpoint-dir", c,
                     "--checkpoint-every", "1"},
                    log),
            1);
  const std::string out = readFile(log);
  const std::string said = ": error: step 2 of 10 (metrics \"step\": 1) is not "
                           "finite: task 'reg': loss not finite on another "
                           "rank";
  EXPECT_NE(out.find(said), std::string::npos) << out;
  EXPECT_EQ(out.find("is not finite"), out.rfind("is not finite")) << out;
  EXPECT_NE(out.find("exited with code 1; stopping the other ranks"),
            std::string::npos)
      << out;
  for (int r = 0; r < 2; ++r) {
    const std::string rank = ".rank" + std::to_string(r) + ".ckpt";
    EXPECT_EQ(readFile(c + "/step-000000001" + rank).substr(0, 12),
              "MTPRTCKPT 1\n");
    EXPECT_TRUE(readFile(c + "/step-000000002" + rank).empty()) << out;
  }
}

TEST(Plan, PipelineStagesAreChecked) {
  auto read = [](const PlanFields &f) {
    const std::string bytes = build(f);
    return readPlan(bytes.data(), bytes.size(), "p.mtpplan");
  };
  auto error = [](const PlanFields &f) { return errorOf(build(f)); };
  PlanFields f;
  f.piped = true;
  f.gpus = 2;
  f.global = 16;
  const Plan p = read(f);
  ASSERT_EQ(p.pipeline.size(), 2);
  EXPECT_EQ(p.pipeline.stages[0].tasks, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p.pipeline.stages[1].tasks, (std::vector<int64_t>{2}));
  EXPECT_EQ(p.pipeline.stages[1].firstUnit, 3);
  EXPECT_EQ(p.pipeline.stages[1].lastUnit, 4);
  EXPECT_EQ(p.pipeline.stages[0].inFlight, 2);
  // Two stages of one replica: the batch is the replica's, in two
  // micro-batches of 8.
  const Program prog = programFromPlan(p);
  EXPECT_EQ(prog.train.microBatches, 2);
  EXPECT_TRUE(prog.pipeline.active());

  PlanFields gap = f;
  gap.pipeFirst = {1, 2};
  EXPECT_NE(error(gap).find("field pipeline.stages[0].first_unit: 1 is out of "
                            "[0, 0]"),
            std::string::npos)
      << error(gap);
  PlanFields wrongHead = f;
  wrongHead.pipeHeadsLast = true; // cls (tap 1, unit 2) listed on stage 1
  EXPECT_NE(error(wrongHead).find("field pipeline.stages[1].tasks: head 0 is "
                                  "not this stage's (its tap is unit 2)"),
            std::string::npos)
      << error(wrongHead);
  // Each checkpoint region goes to the stage it lies in; one across a
  // stage's boundary is refused.
  PlanFields recomputed = f;
  recomputed.regions = {{1, 1}, {3, 3}};
  const Plan r = read(recomputed);
  EXPECT_EQ(r.pipeline.stages[0].regions,
            (std::vector<std::pair<int64_t, int64_t>>{{1, 1}}));
  EXPECT_EQ(r.pipeline.stages[1].regions,
            (std::vector<std::pair<int64_t, int64_t>>{{3, 3}}));
  PlanFields crossed = f;
  crossed.regions = {{2, 3}};
  EXPECT_NE(error(crossed).find("field regions: region 2..3 crosses a "
                                "pipeline stage's boundary"),
            std::string::npos)
      << error(crossed);
  PlanFields odd = f;
  odd.gpus = 3;
  odd.global = 24;
  EXPECT_NE(error(odd).find("2 stages do not divide target.gpus 3"),
            std::string::npos)
      << error(odd);
}

// A plan whose adapter owners do not form groups (a head reading a later
// head's adapter, or one that reads another's) is refused, naming the field.
TEST(PlanFields, AdapterOwnersMustFormGroups) {
  TempDir dir;
  for (const std::vector<int64_t> &owners :
       {std::vector<int64_t>{0, 2, 2}, std::vector<int64_t>{0, 0, 1},
        std::vector<int64_t>{0, 0}}) {
    PlanFields f;
    f.adapted = true;
    f.adapters.owner = owners;
    const std::string plan = dir.path + "/owners.mtpplan";
    { std::ofstream(plan, std::ios::binary) << build(f); }
    try {
      loadPlan(plan);
      ADD_FAILURE() << "owners accepted: " << owners.size();
    } catch (const PlanError &e) {
      EXPECT_NE(std::string(e.what()).find("strategy.adapters.owners"),
                std::string::npos)
          << e.what();
    }
  }
}
