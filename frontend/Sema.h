//===- Sema.h - checking a .mtp AST -----------------------------*- C++ -*-===//
//
// Sema gives every key its meaning: types, units, ranges, defaults, names
// that must exist, and knobs that contradict each other. The result is a
// fully resolved spec — every default filled in — that MLIRGen turns into the
// spec-level mtp dialect. Every error is located and, where it helps, hinted.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_FRONTEND_SEMA_H
#define MTPC_FRONTEND_SEMA_H

#include "dialect/MTPOps.h"
#include "frontend/AST.h"
#include "mtprt/BatchSchedule.h"
#include "mtprt/Adapters.h"
#include "mtprt/Ewc.h"
#include "mtprt/Saps.h"
#include "mtprt/Defaults.h"

#include <optional>
#include <string>
#include <vector>

namespace mtp {

struct Schedule {
  ScheduleKind kind = ScheduleKind::cosine;
  double peak = 3e-4;
  int64_t warmup = 0;
};

/// A spec with every value checked and every default resolved.
struct CheckedSpec {
  std::string name;
  ast::Location loc;

  struct Backbone {
    BackboneKind kind = BackboneKind::transformer;
    int64_t layers, hidden, heads, ffn, vocab, seq;
    double dropout;
    std::optional<int64_t> positions;
    std::optional<double> normEps;
    /// A pretrained backbone's directory, as the spec wrote it.
    std::optional<std::string> weights;
    /// Llama's (absent: the family's defaults).
    std::optional<int64_t> kvHeads;
    std::optional<double> ropeTheta;
    std::optional<std::vector<double>> ropeScaling;
    std::optional<bool> attentionBias, mlpBias;
    /// BERT's token types; RoBERTa's padding id (its positions' origin).
    std::optional<int64_t> typeVocab, positionPad;
    /// The token embedding's padding id (a pretrained config's pad_token_id
    /// where its embedding has one).
    std::optional<int64_t> tokenPad;
    /// `freeze`: layers first..last (0: the embeddings) get no gradients
    /// and no optimizer state.
    std::optional<std::pair<int64_t, int64_t>> freeze;
    ast::Location freezeLoc;
    /// Absent: --mtp-normalize-spec picks for the device and dropout.
    std::optional<AttentionKind> attention;
    std::optional<PointwiseKind> pointwise;
    ast::Location loc, attentionLoc, pointwiseLoc;
  } backbone;

  struct Task {
    std::string name;
    HeadKind head;
    std::optional<int64_t> classes, labels, layers, vocab, targetSeq;
    int64_t tapLayer;
    bool pooled;
    LossKind loss;
    double weight;
    Schedule lr;
    ast::Location loc;
  };
  std::vector<Task> tasks;

  struct Correlation {
    std::string a, b;
    double value;
    ast::Location loc;
  };
  std::vector<Correlation> correlations;

  struct Budget {
    std::string device;
    int64_t memory, headroom, link, gpus, globalBatch, microBatch;
    Precision precision;
    std::optional<int64_t> hbm;
    std::optional<double> peakFlops;
    /// Between the devices (the collectives' bus), bytes/s per direction.
    std::optional<int64_t> interconnect;
    /// ZeRO stage; zeroAuto: the planner chooses.
    int64_t zero = 0;
    bool zeroAuto = false;
    ast::Location zeroLoc;
    /// docs/pipeline.md: backbone stages, one process each (1: none);
    /// gpus = pipeline × data-parallel replicas.
    int64_t pipeline = 1;
    /// pipeline = auto: the planner chooses among the divisors of gpus.
    bool pipelineAuto = false;
    ast::Location pipelineLoc;
    ast::Location loc;
  } budget;

  struct Strategy {
    /// docs/zero.md: AdamW's state and update on the host; auto: the
    /// planner's choice (when nothing else fits).
    bool optimizerOffload = false, optimizerOffloadAuto = false;
    ast::Location optimizerOffloadLoc;
    /// docs/pipeline.md: every forward before any backward (else 1F1B).
    bool gpipe = false;
    ast::Location pipelineScheduleLoc;
    CheckpointPolicy checkpoint = CheckpointPolicy::automatic;
    int64_t checkpointEvery = 1;
    double groupThreshold = mtprt::defaults::kGroupThreshold;
    OffloadPolicy offload = OffloadPolicy::automatic;
    double maxOffloadLatency = mtprt::defaults::kMaxOffloadLatency;
    std::optional<double> gfmKeep = mtprt::defaults::kGfmKeep;
    GradientScope scope = GradientScope::features;
    int64_t scopeLayers = 1;
    std::optional<int64_t> dgfgHidden = mtprt::defaults::kGateHidden;
    double reuseThreshold = mtprt::defaults::kReuseThreshold,
           simStdThreshold = mtprt::defaults::kSimStdThreshold;
    ClipPolicy clip = ClipPolicy::per_task;
    double clipMaxNorm = mtprt::defaults::kClipMaxNorm;
    CollectivePolicy collective = CollectivePolicy::automatic;
    double topk = mtprt::defaults::kTopK;
    int64_t quantBlock = mtprt::defaults::kQuantBlock,
            quantBits = mtprt::defaults::kQuantBits;
    double residualDecay = mtprt::defaults::kResidualDecay;
    /// D15: the global batch per step (none: the budget's, fixed).
    std::optional<mtprt::BatchSchedule> dynamicBatch;
    ast::Location dynamicBatchLoc;
    /// D12: sparse updates of the backbone (none: dense).
    std::optional<mtprt::SapsConfig> saps;
    ast::Location sapsLoc;
    /// D14: elastic weight consolidation across train { phases }.
    std::optional<mtprt::EwcConfig> ewc;
    ast::Location ewcLoc;
    /// D13: per-task gated adapters (none: plain heads).
    std::optional<mtprt::AdapterConfig> adapters;
    ast::Location adaptersLoc;
    ast::Location loc;
  } strategy;

  /// A stretch of training on some of the tasks (train { phases }).
  struct Phase {
    int64_t steps = 0;
    std::vector<std::string> tasks;
    ast::Location loc;
  };
  struct Train {
    /// Sequential training (none: every task at every step).
    std::vector<Phase> phases;
    ast::Location phasesLoc;
    int64_t steps = mtprt::defaults::kSteps, seed = 0;
    std::optional<std::string> dataPath; // none = synthetic
    ast::Location dataLoc;
    std::optional<std::string> evalPath; // held-out data, if any
    ast::Location evalLoc;
    int64_t evalEvery = 0; // 0: at the end only
    Schedule lr;
    double weightDecay = mtprt::defaults::kWeightDecay,
           beta1 = mtprt::defaults::kBeta1, beta2 = mtprt::defaults::kBeta2,
           eps = mtprt::defaults::kEps;
    int64_t logEvery = mtprt::defaults::kLogEvery, saveEvery = 0;
    ast::Location loc;
  } train;
};

/// Checks `model` from the file `filename`, reporting every problem through
/// `context`'s diagnostic engine (up to `maxErrors`). Returns the resolved
/// spec only when there was no error (warnings do not count).
std::optional<CheckedSpec> checkSpec(const ast::Model &model,
                                     llvm::StringRef filename,
                                     mlir::MLIRContext *context,
                                     unsigned maxErrors = 20);

} // namespace mtp

#endif // MTPC_FRONTEND_SEMA_H
