//===- Model.h - the multi-task transformer, one entry per unit -*- C++ -*-===//
//
// The backbone and heads as plain parameter tensors and functional ATen ops,
// so every unit of docs/contracts.md#granularity is one call a schedule can keep,
// recompute (inside a checkpoint region) or offload. What each unit saves for
// backward is documented in docs/runtime.md and is the cost model's contract.
//
// Internal API: includes LibTorch. Generated programs use mtprt/Runtime.h.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_MODEL_H
#define MTPRT_TORCH_MODEL_H

#include "mtprt/Config.h"

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mtprt {

/// One step's inputs. labels[h] undefined = the batch has no labels for head
/// h (its loss and gradient are masked). Label shapes: classify [B] int64
/// (ce) or [B, classes] float (mse); tag [B, S] int64; span [B, 2] int64
/// (start, end); decoder [B, targetSeq] int64 target tokens (teacher forcing
/// feeds them shifted right after a BOS token 0).
struct Batch {
  at::Tensor tokens; ///< [B, S] int64
  /// [B] int64, each record's real tokens (the rest is padding, masked as
  /// keys by a bidirectional backbone); undefined: every record is full.
  at::Tensor lengths;
  at::Tensor types; ///< [B, S] int64 token types; undefined: all 0
  /// Per head; undefined: no record of the batch has the task's labels. A
  /// record without them has kIgnoreLabel (NaN for an mse target) there.
  std::vector<at::Tensor> labels;
  /// Per head (or empty): some records lack the task's labels (Model::loss).
  std::vector<bool> partial;
  int64_t size() const { return tokens.size(0); }
  /// Rows [begin, end) of every tensor (micro-batches).
  Batch slice(int64_t begin, int64_t end) const;
  Batch to(const at::Device &device) const;
};

/// A linear layer's parameters (weight [out, in], bias [out]).
struct LinearParams {
  at::Tensor weight, bias;
};
/// A layer norm's affine parameters (an RMSNorm: a weight only).
struct NormParams {
  at::Tensor weight, bias;
  bool rms = false;
  /// The backbone's: its config's normEps; the heads' (mtpc's own): 1e-5.
  double eps = 1e-5;
};

/// Pre-norm attention (norm, fused QKV projection, core, output projection).
/// Llama's: `kvHeads` key/value heads (the QKV projection's rows: the
/// queries', then the keys' and the values'), rotary positions.
struct AttentionParams {
  NormParams norm;
  LinearParams qkv, out;
  int64_t kvHeads = 0; ///< 0: as many as the query heads
  bool rotary = false;
  bool postNorm = false; ///< BERT's: norm(x + attention(x))
};
/// Pre-norm MLP (norm, up-projection, GELU, down-projection); gated
/// (Llama's SwiGLU): the up-projection's rows are the gate's then the up's,
/// down(silu(gate) * up).
struct MlpParams {
  NormParams norm;
  LinearParams up, down;
  bool gated = false;
  bool postNorm = false; ///< BERT's: norm(x + mlp(x))
};

class Model {
public:
  /// Builds and initializes (N(0, 0.02) weights, zero biases, unit norms)
  /// from `config.seed`, independent of the global RNG. Throws
  /// std::invalid_argument naming the bad field.
  Model(ModelConfig config, std::vector<HeadConfig> heads);

  const ModelConfig &config() const { return config_; }
  const std::vector<HeadConfig> &heads() const { return headConfigs_; }
  int64_t numHeads() const { return static_cast<int64_t>(headConfigs_.size()); }
  at::Device device() const { return device_; }

  /// What loading config().weights did ("" when the config has none): the
  /// tensors loaded and those skipped, for the driver to print.
  const std::string &pretrainedSummary() const { return pretrained_; }

  /// Dropout on (training) or off.
  void setTraining(bool training) { training_ = training; }
  bool training() const { return training_; }
  /// The micro-batch's padding and token types (Batch::lengths, types):
  /// bidirectional attention masks the padding keys, BERT adds each token's
  /// type embedding. Undefined: full records, type 0.
  void setInputs(const at::Tensor &lengths, const at::Tensor &types);

  //===--- Units (docs/contracts.md#granularity) ---------------------------------------------===//

  /// Unit "embed": token + position embeddings, dropout. tokens [B, S].
  at::Tensor embed(const at::Tensor &tokens) const;
  /// Unit "layer<l>.attn" (l in 1..L): x + dropout(out(core(qkv(norm(x))))).
  at::Tensor attention(int64_t layer, const at::Tensor &x) const;
  /// The score–softmax–dropout–value core alone, for finer plans.
  /// q: [B, heads, T, d], k, v: [B, heads, S, d]. `causal` hides the keys
  /// after each query; the math path then takes `mask` (causalMask(T)) if
  /// given, else makes it. Fused (one scaled_dot_product_attention kernel)
  /// where fusedAttention(), else the math path (docs/runtime.md §2).
  at::Tensor attentionCore(const at::Tensor &q, const at::Tensor &k,
                           const at::Tensor &v, bool causal = false,
                           const at::Tensor &mask = {}) const;
  /// Whether attentionCore runs the fused kernel: the config asks for it
  /// and a fused kernel takes the dropout here (CUDA, eval, or dropout 0).
  bool fusedAttention() const;
  /// The math path's causal mask (bool [T, T], true = hidden); undefined
  /// where the fused kernel runs, which needs none.
  at::Tensor causalMask(int64_t t) const;
  /// Unit "layer<l>.mlp": x + dropout(down(gelu(up(norm(x))))).
  at::Tensor mlp(int64_t layer, const at::Tensor &x) const;
  /// Backbone chain unit u: 0 = embed (x = tokens), 2l-1 = attention of layer
  /// l, 2l = its MLP. numUnits() = 2L + 1. `next`: the unit this pass runs
  /// after u, where known (an evaluation), which setAroundUnit's hook may
  /// fetch while u runs.
  at::Tensor unit(int64_t u, const at::Tensor &x, int64_t next = -1) const;
  /// Unit u >= 1 at tensor grain (the plan's Decision::Partial): as unit(),
  /// but its projection outputs — the QKV projection's, or the
  /// up-projection's (and with ATen pointwise ops the norm's and the GELU's:
  /// mtpc's CostModel::projectionChain) — are not kept; the backward
  /// re-creates them from the block's input (mtprt::Recomputed), under the
  /// autocast state the forward ran in. An attention block needs the fused
  /// attention kernel; under autocast, ATen pointwise ops.
  at::Tensor unitPartial(int64_t u, const at::Tensor &x) const;
  /// Whether unitPartial can run unit u now (partialRefusal says why not).
  bool partialServes(int64_t u) const;
  /// Why unit u >= 1 cannot run at tensor grain now ("" when it can).
  std::string partialRefusal(int64_t u) const;
  /// What unitPartial's backward re-creates, computed from the block's input
  /// (without grad): the registered tensors, in order.
  std::vector<at::Tensor> projections(int64_t u, const at::Tensor &x) const;
  int64_t numUnits() const { return 2 * config_.layers + 1; }
  /// Units [first, last] in order.
  at::Tensor runUnits(int64_t first, int64_t last, at::Tensor x) const;
  /// The unit name the step IR uses ("embed", "layer2.attn", ...).
  std::string unitName(int64_t u) const;
  /// The unit whose output is tap t (0 = embed, l = layer l's MLP = 2l).
  static int64_t tapUnit(int64_t tap) { return 2 * tap; }

  /// Unit "head.<name>": the head's outputs from its tap activation [B, S, H]
  /// (classify: {logits [B, C]}; tag: {logits [B, S, T]}; span: {start
  /// [B, S], end [B, S]}; decoder: {logits [B, targetSeq, V]}, which needs the
  /// decoder labels for teacher forcing).
  std::vector<at::Tensor> head(int64_t h, const at::Tensor &tap,
                               const at::Tensor &labels = {}) const;
  /// D13: task h's gate averaged over the batch, G_h [H] =
  /// mean_b σ(a_h + w_h ⊙ mean_seq(x)) with x what the head reads from `tap`
  /// taken as a constant — the gate-separation loss's input, whose gradient
  /// reaches a_h and w_h only. Undefined without adapters.
  at::Tensor gateMean(int64_t h, const at::Tensor &tap) const;
  /// The gate-separation loss over `gates` (gateMean of two tasks or more):
  /// the mean over pairs i < j of cos(G_i, G_j), unweighted.
  static at::Tensor gateSeparation(const std::vector<at::Tensor> &gates);
  /// Task h's gate parameters (a_h, w_h; empty without adapters); they are
  /// among headParameters(h).
  std::vector<at::Tensor> gateParameters(int64_t h) const;
  /// The adapter task h reads but does not hold (AdapterConfig::owner: its
  /// group's first task's, among that head's parameters); empty when its own.
  std::vector<at::Tensor> sharedAdapterParameters(int64_t h) const;
  /// The down- and up-projection task h reads (its own or its group's):
  /// what a regroup measures the members' gradients on. Empty without
  /// adapters.
  std::vector<at::Tensor> adapterParameters(int64_t h) const;
  /// npd(regroup): the groups split to `owner` (AdapterConfig::
  /// regroupedOwners: every new group within an old one). Each task that
  /// now holds its group's adapter gets a copy of the one it read, named
  /// head.<task>.adapter.*, among its head's parameters before its gate
  /// (where a model built with that owner has it); every member then reads
  /// its new owner's. Returns each copy beside the tensor it copies, for
  /// the optimizer state to follow.
  std::vector<std::pair<at::Tensor, at::Tensor>>
  splitAdapters(const std::vector<int64_t> &owner);

  /// Unit "loss.<name>": mean loss (fp32 scalar) over the scored labels
  /// (not kIgnoreLabel, not NaN). `partial`: some records of the batch lack
  /// the task's labels, so a micro-batch may have none scored; the mean
  /// then divides by a count that is at least 1 (0, not NaN) and keeps that
  /// count (4 bytes) for the backward.
  at::Tensor loss(int64_t h, const std::vector<at::Tensor> &outputs,
                  const at::Tensor &labels, bool partial = false) const;

  //===--- Pipeline stages (docs/pipeline.md) ------------------------------===//

  /// Keeps the parameters of units [first, last] and of the heads `tasks`
  /// marks, and drops the rest (their tensors freed): a pipeline stage
  /// holds its own. Initialization stays the whole model's (the same values
  /// as one process). Running a dropped unit or head throws.
  void keepStage(int64_t first, int64_t last, const std::vector<bool> &tasks);
  /// The units this model holds (all of them unless keepStage ran).
  int64_t firstUnit() const { return firstUnit_; }
  int64_t lastUnit() const { return lastUnit_ < 0 ? numUnits() - 1 : lastUnit_; }
  bool holdsHead(int64_t h) const {
    return heldHeads_.empty() || heldHeads_.at(h);
  }

  //===--- Parameters -----------------------------------------------------===//

  /// Layer l's parameters (0 = the embedding tables).
  std::vector<at::Tensor> layerParameters(int64_t layer) const;
  /// Unit u's parameters (0: the embeddings; 2l−1 / 2l: layer l's
  /// attention / MLP, the last MLP with the final norm).
  std::vector<at::Tensor> unitParameters(int64_t u) const;
  /// Called as (u, true, next) before and (u, false, -1) after unit u runs
  /// without autograd (an evaluation, a checkpoint region's first pass;
  /// `next` as unit() was given it): ZeRO 3 gathers the unit's parameters
  /// there, begins the next one's, and frees u's after.
  void setAroundUnit(std::function<void(int64_t, bool, int64_t)> f) {
    aroundUnit_ = std::move(f);
  }
  /// Called before parameters are read: with unit u before unit u's run
  /// (embed, attention, mlp, unitPartial, projections), with numUnits() + h
  /// before head h's (head, gateMean), and with -1 before the parameters
  /// are handed out by name to be read (namedParameters: a checkpoint, an
  /// export; parameters() and trainableParameters() hand out the tensors
  /// for their gradients and wait for nothing): ZeRO 1–2 waits there for
  /// updated values still arriving.
  void setBeforeRead(std::function<void(int64_t)> f) {
    beforeRead_ = std::move(f);
  }
  std::vector<at::Tensor> backboneParameters() const;
  /// The backbone's projections' weights and biases (every layer's QKV,
  /// attention output, up- and down-projection).
  std::vector<at::Tensor> projectionParameters() const;
  std::vector<at::Tensor> headParameters(int64_t h) const;
  std::vector<at::Tensor> parameters() const;
  /// The parameters the optimizer updates: all but the frozen layers'.
  std::vector<at::Tensor> trainableParameters() const;
  std::vector<std::pair<std::string, at::Tensor>> namedParameters() const;
  int64_t numParameters() const;

  /// A random batch for tests and the synthetic data of emitted programs:
  /// tokens and labels for every head, deterministic in `seed`.
  Batch syntheticBatch(int64_t batchSize, uint64_t seed) const;

private:
  struct DecoderLayer {
    AttentionParams self;
    NormParams crossNorm, memNorm;
    LinearParams crossQ, crossKv, crossOut;
    MlpParams mlp;
  };
  /// D13: a task's adapter on what its head reads and the adapter's gate.
  struct Adapter {
    LinearParams down, up;
    at::Tensor gateBias, gateWeight; ///< a_t, w_t [H]
  };
  struct Head {
    Adapter adapter; ///< undefined without adapters
    NormParams norm;
    LinearParams pool, out;           ///< pool: classify only
    at::Tensor tokEmb, posEmb;        ///< decoder only
    std::vector<DecoderLayer> layers; ///< decoder only
  };

  at::Tensor dropout(const at::Tensor &x) const;
  /// GELU in the config's form (erf, or tanh for GPT-2's gelu_new).
  at::Tensor gelu(const at::Tensor &u) const;
  /// A LayerNorm or an RMSNorm, as `n` is.
  at::Tensor norm(const NormParams &n, const at::Tensor &x) const;
  /// Rotary positions on q or k [B, heads, S, d] (cos_/sin_'s first S rows).
  at::Tensor rotate(const at::Tensor &x) const;
  /// Unit u's output as the next unit (or a head) reads it: the last
  /// layer's through the final norm where the backbone has one.
  at::Tensor finish(int64_t u, const at::Tensor &y) const;
  /// linear(norm(x)) and linear(gelu(u)), fused where the config says.
  at::Tensor normLinear(const NormParams &n, const LinearParams &l,
                        const at::Tensor &x) const;
  at::Tensor geluLinear(const at::Tensor &u, const LinearParams &l) const;
  /// Receives a block's projection outputs as they are made (tensor grain).
  using Sink = std::function<void(const at::Tensor &)>;
  /// The projections a block's tensor-grain recompute re-runs from its input
  /// x: the QKV projection; the up-projection, and with ATen pointwise ops
  /// the GELU (returned: what the down-projection reads). Each output, and
  /// with ATen pointwise ops the norm's, goes to `sink` before any op reads it.
  at::Tensor attentionProjections(const AttentionParams &p, const at::Tensor &x,
                                  const Sink *sink) const;
  /// A norm's output given to `sink` (none: as it is) — under autocast
  /// its 16-bit copy, the tensor the next linear keeps.
  at::Tensor sinkable(at::Tensor normed, const Sink *sink) const;
  at::Tensor mlpProjections(const MlpParams &p, const at::Tensor &x,
                            const Sink *sink) const;
  at::Tensor attentionBlock(const AttentionParams &p, const at::Tensor &x,
                            bool causal, const at::Tensor &mask = {},
                            const Sink *sink = nullptr) const;
  at::Tensor mlpBlock(const MlpParams &p, const at::Tensor &x,
                      const Sink *sink = nullptr) const;
  /// What a head reads from its tap: the first token for classify, else
  /// the tap itself.
  static at::Tensor headInput(const HeadConfig &c, const at::Tensor &tap);
  /// x + (1 − g)·up(relu(down(x))), g = σ(a + w ⊙ mean_seq(x)); x itself
  /// without adapters.
  at::Tensor adapt(const Head &p, const at::Tensor &x) const;
  at::Tensor decoderHead(const Head &p, const HeadConfig &c,
                         const at::Tensor &memory,
                         const at::Tensor &targets) const;

  ModelConfig config_;
  std::vector<HeadConfig> headConfigs_;
  at::Device device_;
  bool training_ = true;
  /// setInputs(): [B, 1, 1, S] true where a key is a real token; [B, S].
  at::Tensor keyMask_, types_;
  at::Tensor tokEmb_, posEmb_;
  std::vector<AttentionParams> attn_;
  std::vector<MlpParams> mlp_;
  NormParams finalNorm_; ///< finalNorm() only
  /// Rotary tables [seq, headDim] (fp32, on the device): Llama only.
  at::Tensor cos_, sin_;
  /// BERT / RoBERTa: the token-type table and the embeddings' LayerNorm.
  at::Tensor typeEmb_;
  NormParams embedNorm_;
  std::string pretrained_;
  std::vector<Head> heads_;
  std::vector<std::vector<std::pair<std::string, at::Tensor>>>
      groups_; ///< [0]=backbone, 1+h = head h
  /// keepStage: the units and heads held (lastUnit_ -1: all).
  int64_t firstUnit_ = 0, lastUnit_ = -1;
  std::function<void(int64_t, bool, int64_t)> aroundUnit_;
  std::function<void(int64_t)> beforeRead_;
  void beforeRead(int64_t key) const {
    if (beforeRead_)
      beforeRead_(key);
  }
  /// unit() past its checks and aroundUnit_.
  at::Tensor runUnit(int64_t u, const at::Tensor &x) const;
  std::vector<bool> heldHeads_;
};

} // namespace mtprt

#endif // MTPRT_TORCH_MODEL_H
