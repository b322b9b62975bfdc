//===- Config.h - model, head, training and schedule settings ---*- C++ -*-===//
//
// Plain structs (ints, doubles, strings, vectors) an emitted step program fills
// in from the plan; the runtime validates them at construction and throws
// std::invalid_argument naming the offending field. Torch-free.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_CONFIG_H
#define MTPRT_CONFIG_H

#include "mtprt/Defaults.h"
#include "mtprt/Adapters.h"
#include "mtprt/Ewc.h"
#include "mtprt/Saps.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mtprt {

/// plan.fbs's AttentionKind, value for value.
enum class AttentionKind { Math, Fused };
/// plan.fbs's PointwiseKind, value for value.
enum class PointwiseKind { Aten, Fused };

/// plan.fbs's BackboneKind, value for value: mtpc's own pre-norm transformer,
/// or a Hugging Face family whose weights load by their names
/// (mtprt/HfNames.h; docs/pretrained.md).
enum class BackboneKind { Transformer, Gpt2, Llama, Bert };

/// Llama 3's rotary frequency scaling (`rope_type = "llama3"`): factor 0 =
/// none (plain rotary positions).
struct RopeScaling {
  double factor = 0.0, lowFreqFactor = 1.0, highFreqFactor = 4.0;
  int64_t originalPositions = 8192;
};

/// The shared transformer backbone: token + position embeddings and `layers`
/// pre-norm layers (attention block, then MLP block). GPT-2 adds causal
/// attention, GELU's tanh form and a final LayerNorm on layer L's output;
/// Llama has RMSNorm (no biases), rotary positions (no position table),
/// grouped-query attention, a SwiGLU MLP, causal attention and a final norm;
/// BERT / RoBERTa are post-norm (each block's LayerNorm after its residual
/// add) with token-type embeddings and a LayerNorm on the embeddings.
struct ModelConfig {
  BackboneKind kind = BackboneKind::Transformer;
  int64_t vocab = 128;
  int64_t seq = 16; ///< maximum (and batch) sequence length
  int64_t layers = 2;
  int64_t hidden = 32;
  int64_t heads = 4;
  int64_t ffn = 64;
  double dropout =
      0.0;           ///< embedding, attention-probability and residual dropout
  uint64_t seed = 0; ///< deterministic initialization
  std::string device = "cpu"; ///< "cpu" or "cuda[:N]"
  /// How the attention core runs (docs/runtime.md §2). Fused falls back to
  /// Math where no fused kernel takes the dropout (training on the CPU
  /// with dropout > 0).
  AttentionKind attention = AttentionKind::Fused;
  /// Whether a linear after a norm or a GELU keeps that op's output (Aten)
  /// or recomputes it in backward in the fused pointwise kernels (Fused;
  /// fp32 without autocast, else Aten). docs/runtime.md §2.
  PointwiseKind pointwise = PointwiseKind::Fused;
  /// Rows of the position table (a pretrained model's maximum positions);
  /// 0 = seq.
  int64_t positions = 0;
  double normEps = 1e-5; ///< every LayerNorm's epsilon
  /// A Hugging Face model directory (config.json + model.safetensors or a
  /// sharded set) whose weights replace the initialization; "" = none.
  std::string weights;

  /// Llama: key/value heads (grouped-query attention; 0 = heads), the
  /// rotary base and scaling, and whether the attention's and the MLP's
  /// linears have biases (mtpc's transformer and GPT-2: both).
  int64_t kvHeads = 0;
  double ropeTheta = 10000.0;
  RopeScaling ropeScaling;
  bool attentionBias = true, mlpBias = true;

  /// BERT / RoBERTa: token types (every token type 0; 0 = no table), and
  /// RoBERTa's positions counted from its padding id + 1 (-1: BERT's, from 0).
  int64_t typeVocab = 0;
  int64_t positionPad = -1;
  /// The token embedding's padding id, whose row gets no gradient (as
  /// nn.Embedding's padding_idx: BERT's, RoBERTa's, a Llama's pad token);
  /// -1: none.
  int64_t tokenPad = -1;
  /// Layers freezeFirst..freezeLast (0: the embeddings; `layers`: the last
  /// layer with the final norm) are frozen: no gradients, no optimizer
  /// state. Frozen from the embeddings up they run without autograd.
  /// -1: none.
  int64_t freezeFirst = -1, freezeLast = -1;

  /// D13: every head reads its tap through its own gated adapter
  /// (mtprt/Adapters.h; bottleneck resolved, > 0); none: plain heads.
  std::optional<AdapterConfig> adapters;

  bool frozen(int64_t layer) const {
    return freezeFirst >= 0 && layer >= freezeFirst && layer <= freezeLast;
  }
  /// The top layer of the frozen run from the embeddings (-1: none).
  int64_t noGradTop() const { return freezeFirst == 0 ? freezeLast : -1; }

  bool llama() const { return kind == BackboneKind::Llama; }
  bool postNorm() const { return kind == BackboneKind::Bert; }
  bool causal() const {
    return kind == BackboneKind::Gpt2 || kind == BackboneKind::Llama;
  }
  /// GELU's tanh approximation (GPT-2's gelu_new) instead of erf.
  bool geluTanh() const { return kind == BackboneKind::Gpt2; }
  /// A norm on the last layer's output (GPT-2's ln_f, Llama's norm).
  bool finalNorm() const {
    return kind == BackboneKind::Gpt2 || kind == BackboneKind::Llama;
  }
  int64_t kvHeadCount() const { return kvHeads > 0 ? kvHeads : heads; }
  int64_t positionRows() const { return positions > 0 ? positions : seq; }
};

enum class HeadKind { Classify, Tag, Span, Decoder };
enum class LossKind { CrossEntropy, Mse };

/// One task: a head reading backbone layer `tap` (0 = embeddings, 1..L = the
/// output of layer L) and its loss.
struct HeadConfig {
  std::string name;
  HeadKind kind = HeadKind::Classify;
  int64_t tap = 1;
  LossKind loss = LossKind::CrossEntropy; ///< classify only: ce or mse
  int64_t classes = 2;       ///< classify (mse: outputs), tag: number of tags
  int64_t decoderLayers = 1; ///< decoder only
  int64_t targetVocab = 0;   ///< decoder only; 0 means the backbone's vocab
  int64_t targetSeq = 8;     ///< decoder only: teacher-forced target length
  double weight = 1.0;       ///< the spec's loss weight: scales the loss's gradient
};

enum class Precision { Fp32, Bf16, Fp16 };
enum class GradScope { Sum, Features, Params };
enum class LrSchedule { Constant, Linear, Cosine };

/// A learning-rate schedule: linear warmup over `warmupSteps`, then constant,
/// linear decay to 0, or cosine decay to 0 at `totalSteps`.
struct LrConfig {
  double lr = 1e-3;
  LrSchedule schedule = LrSchedule::Constant;
  int64_t warmupSteps = 0;
  int64_t totalSteps = 1000;
};

/// How one optimizer step trains (docs/contracts.md).
/// A stretch of training on some tasks (train { phases }).
struct Phase {
  int64_t steps = 0;
  std::vector<int64_t> tasks; ///< head indices
  /// The plan's prediction for its steps (0: the plan's whole-step one).
  int64_t predictedPeakBytes = 0;
  /// npd(regroup): its steps' peak with the adapter groups unsplit (0:
  /// unknown; Program::groupedPeakBytes).
  int64_t groupedPeakBytes = 0;
};

struct TrainConfig {
  Precision precision = Precision::Fp32;
  int64_t microBatches = 1;
  /// Sum: plain Σ loss backward (no per-task pipeline). Features / Params: the
  /// per-task gradient pipeline at that scope.
  GradScope scope = GradScope::Features;
  int64_t paramsTopK = 1; ///< Params scope: the top k shared layers
  double gfmKeep = 1.0;   ///< GFM: kept fraction of rfft bins; 1 = off
  double clipNorm = 0.0;  ///< per-task clip; 0 = off
  bool gate = true;       ///< DGFG; false = uniform α over present tasks
  int64_t gateHidden = defaults::kGateHidden; ///< DGFG gate MLP width (4 → gateHidden → 1)
  double gateLr = 1e-2;
  double gateEntropy = 0.2; ///< entropy bonus weight τ in the gate objective
  int64_t cosineEvery =
      1; ///< measure the cosine matrix every m steps (0 = never)
  /// docs/techniques.md B8: the gate is reset after a measured step whose
  /// activation_reuse_ratio is below recalibrateReuse and whose cosine
  /// matrix's standard deviation is above recalibrateStd.
  double recalibrateReuse = defaults::kReuseThreshold,
         recalibrateStd = defaults::kSimStdThreshold;
  LrConfig backboneLr;
  std::vector<LrConfig> headLr; ///< one per head; empty = backboneLr for all
  double weightDecay = defaults::kWeightDecay;
  double beta1 = defaults::kBeta1, beta2 = defaults::kBeta2,
         eps = defaults::kEps; ///< AdamW
  double initialLossScale = 65536.0; ///< fp16 only
  /// ZeRO (mtprt/Zero.h): 0 every rank keeps AdamW's whole state; 1 and 2
  /// shard it (TrainerCore::shardOptimizer, once the process group exists).
  int zeroStage = 0;
  /// AdamW's state (this rank's run of it under ZeRO) and its update on the
  /// host: pinned memory beside a CUDA device; on the CPU outside the
  /// tracking allocator, i.e. not device bytes (docs/zero.md).
  bool optimizerOffload = false;
  /// SAPS (D12): sparse updates of the backbone; none = dense.
  std::optional<SapsConfig> saps;
  /// EWC (D14) across phases; none = no protection.
  std::optional<EwcConfig> ewc;
};

/// Where the step keeps, recomputes or offloads. Units are numbered along the
/// backbone chain: 0 = embeddings, 2l-1 = layer l's attention block, 2l = its
/// MLP block (so layer l's output is unit 2l's output).
struct Schedule {
  /// Checkpoint regions: inclusive unit ranges [first, last], disjoint.
  std::vector<std::pair<int64_t, int64_t>> regions;
  /// Offload every tensor a head (and its loss) saves for backward to the host
  /// pool, and prefetch it before the head's backward.
  bool offloadHeads = false;
  /// The same for these heads only (head indices): the compiler's per-head
  /// offload decision.
  std::vector<int64_t> offloadHeadList;
  /// Offload the saved boundary input of every checkpoint region (except the
  /// token ids and boundaries that are taps, which stay on the device).
  bool offloadRegionBoundaries = false;
  /// Backbone units (outside regions) whose saved tensors go to the host pool
  /// after their forward — all but their input, which the unit before owns —
  /// and come back when the backward reaches them (prefetchAhead applies):
  /// the compiler's per-block offload decision.
  std::vector<int64_t> offloadUnits;
  /// Backbone units (outside regions, not offloaded) run at tensor grain:
  /// their projection outputs are re-created from the unit's input in the
  /// backward, the rest kept (Model::unitPartial; the compiler's
  /// Decision::Partial, a plan's units planned recompute outside a region).
  std::vector<int64_t> partialUnits;
  /// Heads run their backward in this order (head indices; empty = the
  /// reverse of their forward order, autograd's natural order). With the heads
  /// offloaded, the largest head first keeps only its own tensors on the device
  /// at the step's peak.
  std::vector<int64_t> headOrder;
  /// Before head i's backward (in headOrder), request the saved tensors of the
  /// heads up to i + prefetchAhead - 1: 1 = just in time for head i itself,
  /// 2 = also the next one; 0 = no prefetch (every use fetches and waits).
  /// An offloaded region boundary is requested when the backward reaches the
  /// region's output (a gradient hook), with the prefetchAhead - 1 offloaded
  /// boundaries below it.
  int64_t prefetchAhead = 2;
};

/// Checks a schedule against a backbone of `layers` layers and its heads:
/// regions are disjoint unit ranges that end at any tap they hold, offloaded
/// units lie outside them, head indices are in range. Throws
/// std::invalid_argument naming the field (`Schedule.regions[1]`).
void validateSchedule(const Schedule &schedule, int64_t layers,
                      const std::vector<HeadConfig> &heads);

/// A handle to an activation inside a step driven unit by unit (0 = the
/// micro-batch's token ids).
using ValueId = int64_t;

/// How a forward range of units runs: kept (every unit's saved tensors stay),
/// as one checkpoint region, as a checkpoint region whose saved boundary
/// input goes to the host pool, or kept with each unit's saved tensors (but
/// its input) on the host pool until its backward.
enum class RegionMode { Keep, Checkpoint, CheckpointOffload, KeepOffload, Partial };

/// One step's measurements, named as docs/contracts.md#metric-names.
struct StepStats {
  int64_t step = 0;
  std::vector<std::string> tasks;
  std::vector<double> loss;  ///< per task; NaN where the batch had no labels
  std::vector<bool> present; ///< per task: the batch had its labels
  /// Per task: the norm of its processed gradient (after GFM, before the
  /// clip; the largest over micro-batches), where the per-task pipeline
  /// computes it (scopes features and params); 0 at scope sum and for absent
  /// tasks. Non-finite when the task's gradient is.
  std::vector<double> gradNorm;
  std::vector<double> alpha; ///< per task; 0 where absent
  std::vector<std::vector<double>>
      gradientCosineSimMatrix; ///< T×T; empty when not measured
  /// Of the activation bytes each present task depends on (the backbone
  /// units up to its tap, as measured in the forward, counted per task), the
  /// share another present task depends on too.
  double activationReuseRatio = 0.0;
  double checkpointHitRate = 1.0; ///< prefetches ready at use / offloaded uses
  int64_t offloadHits = 0, offloadMisses = 0;
  double offloadWaitS = 0.0;
  int64_t measuredPeakBytes =
      0; ///< device (CPU: tracking allocator) peak in the step
  int64_t measuredCurrentBytes = 0; ///< device bytes at the end of the step
  int64_t measuredStartBytes = 0;   ///< device bytes when the step began
  int64_t hostPoolBytes = 0;        ///< host-pool peak in the step
  /// More than one process: every rank's measuredPeakBytes, in rank order
  /// (the driver gathers them with the step's agreement).
  std::vector<int64_t> rankPeakBytes;
  /// A pipeline (docs/pipeline.md): each rank's predicted peak (its stage's),
  /// in rank order; and the seconds this rank waited for its neighbours.
  std::vector<int64_t> rankPredictedPeakBytes;
  double pipelineWaitS = -1.0; ///< -1: no pipeline
  /// Seconds this rank was blocked on the other ranks in the step
  /// (collectives, receives, sends' waits); -1: one process.
  double commS = -1.0;
  /// Gradient exchange (data parallel): this rank's bytes handed to the
  /// collectives, and the same gradients' fp32 size; 0 at world size 1.
  int64_t bytesSent = 0, bytesSentUncompressed = 0;
  /// ZeRO: the updated values this rank's broadcasts hand to the W − 1
  /// others, (W − 1) · 4 · S (2 B a 16-bit weight; stage 3: its runs' share
  /// of the whole parameters' broadcasts; the driver adds it to bytesSent and
  /// bytesSentUncompressed; stage 2's sums count the 4 B per value they hand
  /// over, once per micro-batch, as the plain exchange counts its 4·N).
  int64_t bytesSentParameters = 0;
  /// The plan's predicted peak (set by the driver from the plan); -1 unknown.
  int64_t predictedPeakBytes = -1;
  double stepTimeS = 0.0;
  double samplesPerS = 0.0;
  /// The step's global batch (the dynamic batch schedule's, D15); 0 unknown
  /// (set by the driver).
  int64_t batchSize = 0;
  double lossScale = 1.0; ///< fp16 only
  bool skipped = false;   ///< fp16 overflow: the step was skipped
  /// train { phases }: the step's phase (0-based; -1: no phases).
  int64_t phase = -1;
  /// EWC's penalty λ·Σ F·(θ − θ*)² at the step's weights (-1: no ewc).
  double ewcPenalty = -1.0;
  /// SAPS at a re-ranking step: the share of the selection that is new
  /// (-1: not a re-ranking step, or no saps).
  double sapsTurnover = -1.0;
  /// D13: the gate-separation loss (mean pairwise cosine of the tasks'
  /// gates, before its weight) over the step's micro-batches (-1: no
  /// adapters, or fewer than two tasks with labels).
  double gateSeparation = -1.0;
};

/// The names the spec, the IR and the plan file use (flatc's tables for the
/// enums the plan schema shares, value for value: runtime/src/Plan.cpp).
const char *toString(HeadKind kind);
const char *toString(LossKind loss);
const char *toString(AttentionKind kind);
const char *toString(PointwiseKind kind);
const char *toString(LrSchedule schedule);
const char *toString(GradScope scope);
const char *toString(Precision precision);

} // namespace mtprt

#endif // MTPRT_CONFIG_H
