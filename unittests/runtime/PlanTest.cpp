//===- PlanTest.cpp - the runtime reads the compiler's plan ---------------===//

#include "mtprt/Driver.h"
#include "mtprt/Errors.h"
#include "mtprt/Plan.h"
#include "mtprt/PlanFrame.h"

#include "schema/plan_generated.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>

using namespace mtprt;
namespace fb = mtp::fb;

namespace {

/// The knobs of a plan as mtpc writes it (2 layers, two tasks; layer 1's
/// attention offloaded, the tag head offloaded, layer 2 a checkpoint
/// region), each settable to what a damaged or forged plan might say.
struct Forge {
  unsigned version = unsigned(fb::PlanVersion::Current);
  std::string kind = "transformer";
  int64_t layers = 2, hidden = 16, heads = 2, ffn = 32, vocab = 40, seq = 12;
  double dropout = 0.1;
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
    auto backbone = fb::CreateBackbone(b, b.CreateString(kind), layers, hidden,
                                       heads, ffn, vocab, seq, dropout);
    std::vector<flatbuffers::Offset<fb::Task>> tasks = {
        fb::CreateTask(b, b.CreateString(clsName), b.CreateString(clsHead), 2,
                       true, clsClasses, 0, 0, 0, 1.0,
                       b.CreateString(clsLoss)),
        fb::CreateTask(b, b.CreateString("tag"), b.CreateString("tag"), tap,
                       false, tagClasses, 0, 0, 0, tagWeight,
                       b.CreateString("cross_entropy"),
                       strategy ? fb::CreateLrSchedule(
                                      b, b.CreateString("linear"), 5e-4,
                                      tagWarmup)
                                : 0)};
    auto unit = [&](const char *name, const char *kind, int64_t layer,
                    int64_t blk, const std::string &task, fb::Decision d) {
      return fb::CreateUnit(b, b.CreateString(name), b.CreateString(kind),
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
                                   b.CreateString(precision), 1 << 20, 1 << 20,
                                   gpus, micro, global);
    flatbuffers::Offset<fb::Strategy> st;
    flatbuffers::Offset<fb::Train> train;
    if (strategy) {
      st = fb::CreateStrategy(b, b.CreateString(scope), 2, gfmKeep, clip,
                              gateHidden, 0.15, 0.4,
                              b.CreateString(collective), topk, block, bits,
                              decay);
      train = fb::CreateTrain(
          b, steps, 7, b.CreateString("synthetic"),
          fb::CreateLrSchedule(b, b.CreateString(lrKind), lr, warmup),
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
  EXPECT_EQ(p.precision, "fp32");
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
            "read version 2: re-plan the spec with `mtpc plan SPEC "
            "--format=fb -o PLAN`");
  std::string v3 = Forge().file();
  v3[8] = 3;
  EXPECT_EQ(errorOf(v3), "mtprt: plan p.mtpplan: plan version 3; this mtpc "
                         "and runtime read version 2: re-plan the spec with "
                         "the matching mtpc");
  EXPECT_NE(errorOf(v1.file()).find("the flatbuffer says plan version 1, its "
                                    "frame version 2"),
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
       "field backbone.kind: 'lstm' is none of transformer"},
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
       "field task 'cls' (tasks[0]).head: 'regress' is none of classify, tag, "
       "span, decoder"},
      {[](Forge &f) { f.clsLoss = "hinge"; },
       "field task 'cls' (tasks[0]).loss: 'hinge' is none of cross_entropy, "
       "mse"},
      {[](Forge &f) { f.clsName = "tag"; },
       "field tasks[1].name: 'tag' names two tasks"},
      {[](Forge &f) { f.clsName = ""; }, "field tasks[0].name: missing or empty"},
      {[](Forge &f) { f.precision = "fp8"; },
       "field target.precision: 'fp8' is none of fp32, bf16, fp16"},
      {[](Forge &f) { f.global = 12; },
       "field target.global_batch: 12 is not a multiple of micro_batch x gpus "
       "= 8"},
      {[](Forge &f) { f.micro = 0; },
       "field target.micro_batch: 0 is out of [1, 1048576]"},
      {[](Forge &f) { f.gpus = 1 << 20; },
       "field target.gpus: 1048576 is out of [1, 4096]"},
      {[](Forge &f) { f.decision = 7; },
       "field units[1].decision: 7 is none of keep, recompute, offload"},
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
       "field strategy.scope: 'all' is none of sum, features, params"},
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
       "field strategy.collective: 'ring' is none of auto, none, compressed"},
      {[](Forge &f) { f.strategy = true, f.lrKind = "step"; },
       "field train.lr.kind: 'step' is none of constant, linear, cosine"},
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
