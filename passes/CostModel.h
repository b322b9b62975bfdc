//===- CostModel.h - the one source of bytes, FLOPs and time ----*- C++ -*-===//
//
// Every pass, the plan report and the driver ask this model; no pass keeps
// its own arithmetic. Its figures describe the runtime's model (runtime/
// src/Model.cpp, docs/runtime.md): the same parameters, and for every unit
// the tensors LibTorch's kernels really keep for backward — norm statistics,
// dropout masks, softmax outputs, the contiguous copies batched matmuls make
// of strided views — because predictions are checked against the runtime's
// tracking allocator, without fitted constants (docs/cost-model.md).
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_PASSES_COSTMODEL_H
#define MTPC_PASSES_COSTMODEL_H

#include "dialect/Devices.h"
#include "dialect/MTPOps.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/SmallVector.h"

#include <string>

namespace mtp {

/// Parameter counts of a spec-level model, by part.
struct ParameterCount {
  int64_t embeddings = 0; ///< token + position embeddings
  int64_t perLayer = 0;   ///< one transformer layer
  int64_t backbone = 0;   ///< embeddings + layers
  int64_t heads = 0;      ///< every task head
  int64_t gate = 0;       ///< the DGFG gate (0 when off)
  int64_t total() const { return backbone + heads + gate; }
};

/// A tensor a unit allocates to keep for its backward.
struct SavedTensor {
  std::string name;
  mlir::RankedTensorType type;
};

/// What one forward unit costs.
struct UnitCost {
  /// The unit's result.
  mlir::RankedTensorType output;
  /// Tensors allocated only to be kept for backward (beyond its inputs and
  /// output, which the backward takes as operands when it needs them).
  llvm::SmallVector<SavedTensor> saved;
  /// Whether the backward needs the unit's input / output tensors.
  bool backwardNeedsInput = false, backwardNeedsOutput = false;
  /// How many of the backward's input gradients (the first ones) are its
  /// incoming gradient itself: no buffer of their own.
  int backwardAliases = 0;
  /// Floating-point operations of the forward and of the backward.
  int64_t fwdFlops = 0, bwdFlops = 0;
  /// Transient bytes alive at the unit's internal peak beyond its inputs,
  /// output and saved tensors (temporaries held until the call returns).
  int64_t fwdWorkspace = 0, bwdWorkspace = 0;
  /// At the backward's internal peak (where bwdWorkspace is counted): bytes
  /// of the saved tensors autograd has already freed, and of the unit's
  /// parameter gradients it has not created yet. Autograd frees a node's
  /// saved tensors once the node has run and creates a weight's gradient when
  /// it reaches it; that matters only for a unit of many layers (the decoder
  /// head).
  int64_t bwdFreed = 0, bwdPending = 0;
  /// Run without autograd, the transient beyond its inputs and output where
  /// the unit frees its own intermediates as it goes (the decoder head's
  /// layers, the math attention); -1: everything it would keep, made all
  /// the same, beside fwdWorkspace.
  int64_t noGradWorkspace = -1;
};

/// Memory categories of the breakdown.
enum class MemoryKind { Parameters, Gradients, OptimizerState, Activations,
                        Workspace };

class CostModel {
public:
  /// Reads the backbone, the budget (micro batch, precision, device) and the
  /// device preset of `model`. Without a budget: micro batch 1, fp32, cpu.
  explicit CostModel(ModelOp model);
  /// The same model at another micro batch (the evaluation's).
  CostModel(ModelOp model, int64_t microBatch) : CostModel(model) {
    batch = microBatch;
  }

  /// The attention kind a model without one gets: fused wherever one
  /// scaled-dot-product-attention kernel serves its dropout on the budget's
  /// device (a GPU, or a custom device, which is one; the CPU at dropout 0;
  /// a model without a budget is the CPU's), else math.
  static AttentionKind fittingAttention(ModelOp model);
  /// The backbone's attention kind (fittingAttention where it has none).
  AttentionKind attention() const { return attentionKind; }
  /// The pointwise kind a model without one gets: fused at fp32.
  static PointwiseKind fittingPointwise(ModelOp model);
  /// The backbone's pointwise kind (fittingPointwise where it has none).
  PointwiseKind pointwise() const { return pointwiseKind; }
  /// The units a block's tensor-grain recompute (Decision::Partial) re-runs
  /// from the block's kept input — the norm and the projection after it (the
  /// QKV projection, or the up-projection and, with ATen pointwise ops, the
  /// GELU) — whose outputs the backward then reads re-created; empty where
  /// the runtime has no such path (the fused pointwise kernels under
  /// autocast; the math attention's own copies of q, k, v). The runtime's Model::projections re-runs the same units.
  llvm::SmallVector<UnitKind, 3> projectionChain(bool attention) const;
  /// Whether `unit` of backbone block `block` is in its projection chain.
  bool inProjectionChain(int64_t block, UnitKind unit) const {
    return block > 0 &&
           llvm::is_contained(projectionChain(block % 2 == 1), unit);
  }

  //===--- Shapes and bytes ------------------------------------------------===//

  /// Bytes of a ranked tensor (an i1 element is one byte, as in LibTorch).
  static int64_t bytes(mlir::Type type);
  int64_t microBatch() const { return batch; }
  mlir::Type activationElementType() const;
  /// [micro batch, seq, hidden] of the residual stream (fp32 throughout).
  mlir::RankedTensorType hiddenType() const;
  mlir::RankedTensorType tokensType() const;
  /// The labels a task's loss consumes.
  mlir::RankedTensorType labelsType(TaskOp task) const;
  mlir::RankedTensorType lossType() const;

  //===--- Units -----------------------------------------------------------===//

  /// A backbone unit (embed, the attention and MLP sub-blocks), or a task's
  /// head or loss. `layer` (0 the embeddings, L the final norm's) says
  /// whether `freeze` covers the unit: below the no-grad top it keeps
  /// nothing and has no backward; a frozen unit above trainable ones keeps
  /// only what its input's gradient needs (LibTorch saves a linear's input,
  /// and RMSNorm's normalized x, only for their weights' gradients).
  UnitCost unit(UnitKind kind, TaskOp task = {}, int64_t layer = -1) const;

  /// A unit as the held-out evaluation runs it (eval mode under
  /// NoGradGuard): no dropout, nothing kept, no backward; what training
  /// would keep is made all the same and dies with the call.
  UnitCost evalUnit(UnitKind kind, TaskOp task = {}) const;

  /// Whether `freeze` keeps layer `layer`'s parameters (0: the embeddings)
  /// out of the optimizer.
  bool frozen(int64_t layer) const { return backbone.isFrozen(layer); }
  /// The top of the frozen run from the embeddings up, which runs without
  /// autograd (-1: none).
  int64_t noGradTop() const { return backbone.getNoGradTop(); }

  /// Bytes one re-run of backbone block `block` (runtime numbering: 2l-1
  /// the attention, 2l the MLP of layer l) holds for its backward: every
  /// unit's saved tensors and each output a backward reads (the next unit's
  /// input, the block's output) — what a checkpoint region's recompute
  /// re-creates, its input excepted.
  int64_t blockRecomputeBytes(int64_t block) const;

  /// The features-scope gradient pipeline's transient beyond the tap
  /// gradients, before the fused ones exist: with two or more tasks the
  /// runtime measures the cosine matrix every step by pushing each task's
  /// processed tap gradient down to the parameters of layer c, the topmost
  /// layer every task back-propagates through (min tap), one partial
  /// backward per task, in task order. While the k-th runs, the k earlier
  /// tasks' layer-c gradients are held, and it holds its own chain through
  /// layer c's MLP (the residual branch's gradient, the down-projection's
  /// input and GELU gradients [B,S,F], the down-projection's weight
  /// gradient); then the Gram matrix widens one parameter tensor of every
  /// task to fp64 at a time.
  ///
  /// `regions` are the plan's checkpoint regions in block numbers
  /// (inclusive). A region on a task's probe path (blocks 2c-1 .. 2·tap)
  /// is re-run by that task's probe (the checkpoint's backward), holding
  /// blockRecomputeBytes of all its blocks plus the inner backward's chain
  /// through an MLP, one [B,S,F] less than the kept chain's (the inner
  /// backward frees each recomputed tensor after its use). The regions on a
  /// path re-run one after another. The memory analysis, the planner's
  /// simulator and --mtp-fuse-task-gradients (no regions yet) all ask this.
  /// Offloaded tensors the probe reads come back one at a time (ignored).
  /// Zero without the DGFG gate (the runtime then measures no cosines).
  /// A tensor-grain block on a path (`partials`: block numbers) re-creates
  /// its projection outputs there too (partialProbePath).
  int64_t cosineProbeWorkspace(
      llvm::ArrayRef<std::pair<int64_t, int64_t>> regions = {},
      llvm::ArrayRef<int64_t> partials = {}) const;
  /// The probe's backward through tensor-grain block `block`, beyond the
  /// task gradients it holds: the re-run's outputs beside the block's
  /// backward chain.
  int64_t partialProbePath(int64_t block) const;
  /// The probe's backward through layer `layer`'s MLP kept whole: the
  /// stream's gradient, the MLP's inner ones, the up-projection's weight
  /// gradient.
  int64_t probeMlpChain(int64_t layer) const;

  /// The gradient pipeline over each task's tap gradient (`grads`): GFM's
  /// rfft and irfft along the channels (about 5·n·log2 c each, with `gfm`),
  /// the mask, the clip's norm and scale, the weighted accumulate; its
  /// workspace before the fused results exist: GFM's (gfmWorkspace), the
  /// cosine probe's at the features scope; at the params scope the
  /// processed copies of the per-task parameter gradients (GFM or `clip`
  /// makes them) beside GFM's spectrum of the widest weight.
  struct PipelineCost {
    int64_t flops = 0, workspace = 0;
  };
  PipelineCost gradientPipeline(llvm::ArrayRef<mlir::Type> grads, bool gfm,
                                GradientScope scope, int64_t scopeLayers,
                                bool clip) const;
  /// GFM's elementwise part: the complex spectrum (n/2+1 pairs per row)
  /// beside the processed copy of the widest gradient.
  static int64_t gfmWorkspace(llvm::ArrayRef<mlir::Type> grads);
  /// The params scope's per-task gradients of the top `layers` shared
  /// layers, for `tasks` tasks.
  int64_t perTaskParameterGradientBytes(int64_t tasks, int64_t layers) const;

  //===--- Parameters ------------------------------------------------------===//

  int64_t embeddingParameters() const;
  /// One transformer layer (pre-norm: two LayerNorms, QKV, output
  /// projection, MLP).
  int64_t layerParameters() const;
  /// The final LayerNorm's (weight + bias), where the backbone has one.
  int64_t finalNormParameters() const;
  /// A task's head's, its adapter's included (D13).
  int64_t headParameters(TaskOp task) const;
  /// The head without its adapter.
  int64_t plainHeadParameters(TaskOp task) const;
  ParameterCount parameters() const;
  /// Parameters the optimizer updates: all but the frozen layers'.
  int64_t trainableParameters() const;
  /// The parameter gradients backward unit `bwd` creates (autograd makes a
  /// weight's gradient when its node runs): its unit's parameters, none
  /// for a frozen unit.
  int64_t gradientBytes(BwdOp bwd) const;
  /// Parameters unit `kind` (of `task`, for a head) owns.
  int64_t unitParameters(UnitKind kind, TaskOp task = {}) const;
  /// Persistent bytes per fp32 parameter: the weight, its gradient and
  /// AdamW's two moments.
  static constexpr int64_t kWeightBytes = 4, kGradientBytes = 4,
                           kOptimizerBytes = 8;
  /// D13's adapters, the bottleneck resolved and, with `share`, each task's
  /// adapter owner (model.getTasks() order) (none: plain heads).
  std::optional<mtprt::AdapterConfig> adapters() const;
  /// With adapters shared (`share`): `task` reads its group's first task's
  /// adapter, which that task's head holds; `task`'s own is its gate alone.
  /// With `regroup` false for every task: a group may split, and the plan
  /// holds room for each task's own adapter.
  bool readsSharedAdapter(TaskOp task) const;
  /// The index (model.getTasks() order) of the task whose adapter `task`
  /// reads (its own without share; -1: not this model's task).
  int64_t adapterOwnerIndex(TaskOp task) const;
  /// The fp32 gradient of the adapter `task`'s group shares (0: its own or
  /// none). It arrives with the first of the group's heads' backwards the
  /// step runs — not necessarily the owner's, which gradientBytes leaves it
  /// out of.
  int64_t sharedAdapterGradientBytes(TaskOp task) const;
  /// With `regroup`: the weights and AdamW state every split the groups
  /// could make holds (the step's heads hold each task's own adapter
  /// throughout); 0 without. What the unsplit prediction leaves out.
  int64_t adapterSplitsBytes() const;
  /// SAPS (D12; none: dense updates).
  std::optional<mtprt::SapsConfig> saps() const;
  /// What folding a backbone unit's dense gradient of `gradientBytes` into
  /// SAPS's compact one holds at once, at a re-ranking step (the plan's
  /// worst): the gradient, its importance and the top-k's values and
  /// indices (mtprt::SparseUpdate::rerank frees the importance before the
  /// smaller rest).
  /// `rerank` false: a step that only gathers.
  int64_t sapsFoldTransient(int64_t gradientBytes, bool rerank = true) const;
  /// AdamW's update: about a dozen FLOPs per parameter.
  int64_t optimizerFlops() const;

  //===--- Collectives -----------------------------------------------------===//

  /// A gradient bucket holds at most 25 MiB of fp32 values, like DDP's.
  static constexpr int64_t kBucketElements = (int64_t(25) << 20) / 4;

  /// Bytes one process sends per step for a bucket of `elements` fp32
  /// gradients over `world` processes: a ring all-reduce sends
  /// 2·(W−1)/W of the bucket; a compressed bucket is all-gathered, each
  /// process sending (W−1) payloads of top-k values at `bits`, an fp32 scale
  /// per `block` kept values, and int32 indices or a bitmap, whichever is
  /// smaller. Zero at world size 1.
  static int64_t allReduceBytes(int64_t elements, int64_t world);
  static int64_t compressedPayloadBytes(int64_t elements, double topk,
                                        int64_t block, int64_t bits);
  static int64_t allGatherBytes(int64_t payload, int64_t world);

  /// Between the devices: bytes/s per direction (the budget's
  /// `interconnect`, else the preset's) and the seconds one message step
  /// costs however small (the preset's).
  double interconnectBandwidth() const;
  double messageLatency() const;
  /// A broadcast's message step (the preset's broadcastLatency).
  double broadcastLatency() const;
  /// What one rank's collectives and sends cost in a step (docs/
  /// cost-model.md, "Communication"): each is `steps` message steps of
  /// latency plus the bytes it puts on the wire over the interconnect — a
  /// ring all-reduce of B over W ranks 2(W−1) steps and 2(W−1)/W·B, an
  /// all-gather of a part p (W−1) steps and (W−1)·p, a broadcast of B
  /// ⌈log2 W⌉ steps and B, a send B in one. Their seconds add to the
  /// step's: the runtime blocks on them, except ZeRO's release sums and
  /// stage 3's gathers, which overlap compute (an upper bound there).
  struct Communication {
    int64_t bytes = 0;    ///< this rank's, on the wire per step
    int64_t messages = 0; ///< message steps per step
    double seconds = 0;
    /// The parts, in the order they run: (what, seconds).
    llvm::SmallVector<std::pair<std::string, double>> parts;
    void add(std::string what, int64_t wireBytes, int64_t steps, double bw,
             double latency);
  };
  /// The data-parallel exchange of a step (the mtp.allreduce buckets,
  /// compressed or not, ZeRO's sums and gathers) over processes() ranks;
  /// a pipeline's boundary sends are PipelinePlan's.
  Communication stepCommunication() const;
  /// One gradient exchange of `values` fp32 values over processes() ranks,
  /// as the bucket `like` goes (GSC's all-gather of the compressed
  /// payload, else a ring all-reduce); a pipeline stage's with its replicas.
  void addGradientExchange(Communication &c, int64_t values,
                           AllReduceOp like) const;

  //===--- The data-parallel gradient exchange's memory ------------------===//

  /// Processes the plan is for: the budget's gpus (on `cpu`, the runtime's
  /// --nproc ranks); 1 without a budget.
  int64_t processes() const;
  /// The budget's ZeRO stage (mtprt/Zero.h; 0: none; at one process 2 runs
  /// as 1). It shards the values
  /// the gradient exchange sums (every trainable parameter but the gate's).
  int64_t zeroStage() const;
  /// ZeRO 3 (mtprt/torch/Zero.h): the fp32 bytes of backbone block
  /// `block`'s parameters (runtime numbering: 0 the embeddings, 2l−1 / 2l
  /// layer l's attention / MLP, the last with the final norm), which the
  /// runtime gathers whole around the block's forward and backward and
  /// otherwise holds a 1/W run of. 0 for a frozen block (kept whole) or
  /// below stage 3.
  int64_t shardedBlockBytes(int64_t block) const;
  /// Over every block: the bytes ZeRO 3 shards, and the largest block's.
  struct ShardedBlocks {
    int64_t total = 0, largest = 0;
  };
  ShardedBlocks shardedBlocks() const;
  /// Whether block `block`'s backward reads its parameters (so ZeRO 3
  /// gathers them for it): the embeddings' does only through BERT's
  /// LayerNorm — a lookup's gradient needs the indices alone.
  bool backwardReadsParameters(int64_t block) const {
    return block != 0 || backbone.isPostNorm();
  }
  /// strategy { optimizer_offload = cpu }: AdamW's state (of the values
  /// ZeRO would shard) and its update on the host (docs/zero.md).
  bool optimizerOffload() const;
  /// ZeRO-Offload's 16-bit weights (mtprt/Zero.h halfProjections: the
  /// offload at bf16, below ZeRO stage 3): the trainable layers'
  /// projections (weights and biases) are held at 2 bytes a value on the
  /// device, their gradients too, and autocast makes no copy of them; the
  /// fp32 masters are the host's.
  bool halfProjections() const;
  /// The values halfProjections holds at 16 bits (0 without it).
  int64_t halfProjectionValues() const;
  /// The host pool's fp32 sums of those values' gradients where a step
  /// accumulates several micro-batches at one process (mtprt/Zero.h
  /// foldsHalfGradients); 0 elsewhere.
  int64_t foldedGradientBytes() const;
  /// Bytes a value of unit `kind`'s parameters (and of their gradients) takes
  /// on the device in backbone layer `layer` (task units: 4).
  int64_t parameterBytes(UnitKind kind, TaskOp task, int64_t layer) const;
  /// The budget's device is the CPU (the processes exchange over gloo).
  bool onCpu() const;
  /// The runtime's GSC bucket: GradExchange encodes the flattened gradients
  /// in runs of this many values (GscOptions::bucket, the driver's
  /// --compress-bucket default), one run at a time.
  static constexpr int64_t kGscBucketValues = int64_t(1) << 20;
  struct ExchangeMemory {
    /// Held through every step (from the first, as the runtime creates it
    /// with the trainer): the error-feedback residual, 4 B per value.
    int64_t resident = 0;
    /// The exchange's own peak beyond the resident state, at the step's
    /// mtp.allreduce ops (after the backward, before AdamW).
    int64_t transient = 0;
  };
  /// What the gradient exchange of the step's `buckets` (its mtp.allreduce
  /// ops; compression as they carry it) holds on one process, as
  /// runtime/src/Distributed.cpp allocates it (docs/cost-model.md, "The
  /// gradient exchange"). Zero at one process. The memory analysis and the
  /// planner's simulator both ask this.
  ExchangeMemory gradientExchange(llvm::ArrayRef<AllReduceOp> buckets) const;
  /// The same for `values` gradient values exchanged as `like` is (its
  /// compression; none: no exchange): a pipeline stage's own, over its
  /// replicas.
  ExchangeMemory gradientExchange(int64_t values, AllReduceOp like) const;
  /// The transient of one GSC bucket of n values at `world` processes: the
  /// largest of its encode (|g| and top-k's values and positions; sorting
  /// the positions; the kept values beside them and, for a bitmap, a byte
  /// per position), the all-gather and the decodes, each beside the bucket's
  /// padded payload(s).
  static int64_t gscBucketTransient(int64_t n, double topk, int64_t block,
                                    int64_t world);

  //===--- Time ------------------------------------------------------------===//

  const DevicePreset &device() const { return *preset; }
  /// The device's peak FLOP/s for the training precision (the budget's
  /// peak_tflops, else the preset's).
  double peakFlops() const;
  /// Seconds for `flops` at that peak.
  double computeSeconds(int64_t flops) const {
    return double(flops) / peakFlops();
  }
  /// Device memory bandwidth, bytes/s (the budget's hbm_bandwidth, else the
  /// preset's).
  double memoryBandwidth() const;
  /// The roofline: the larger of `flops` at the peak and `bytes` of memory
  /// traffic at the bandwidth, plus `kernels` launches (docs/planning.md,
  /// "Added time"). Matmuls land on the compute side, norms, GELU, residual
  /// adds and the optimizer's update on the bandwidth side.
  double rooflineSeconds(int64_t flops, int64_t bytes,
                         int64_t kernels = 1) const;
  /// Bytes a step op moves through device memory: its operands and results;
  /// a unit also reads its weights (its backward: reads them and writes
  /// their gradients); the gradient pipeline passes over each tap gradient a
  /// few times; the optimizer reads and writes each weight and both moments
  /// and reads the gradient (28 B per parameter).
  int64_t trafficBytes(mlir::Operation *op) const;
  /// A step op's seconds on the roofline (its FLOPs, traffic and kernels:
  /// one per forward unit, two per backward, one per parameter group for
  /// the runtime's fused AdamW update). Zero for an op that computes
  /// nothing.
  double opSeconds(mlir::Operation *op) const;
  /// The blocks the cosine probe's partial backwards run through, per task
  /// (runtime numbering, inclusive; block 0 is the embeddings): empty
  /// without the DGFG gate or with fewer than two tasks. cosineProbeWorkspace
  /// and the planner's step time both walk these.
  llvm::SmallVector<std::pair<int64_t, int64_t>> cosineProbePaths() const;
  /// Seconds to move `bytes` one way over the host link.
  double transferSeconds(int64_t bytes) const;
  /// Offloaded groups the runtime's backward asks back at once (the
  /// group reached and those below it: mtprt's Schedule::prefetchAhead).
  static constexpr int64_t kPrefetchAhead = 2;
  /// The budget a plan may use (memory minus headroom); INT64_MAX without a
  /// budget.
  int64_t usableBytes() const;
  /// Whether every parameter gradient is resident through the step: with
  /// more than one micro-batch per optimizer step, gradients accumulate in
  /// place, so from the second micro-batch on all of them are live while its
  /// activations are.
  bool gradientsResidentThroughStep() const;

  /// Costs of a step that runs only these tasks (a train { phases } phase):
  /// the cosine probe compares them alone. Empty: every task.
  void onlyTasks(llvm::ArrayRef<mlir::FlatSymbolRefAttr> tasks) {
    taskFilter.assign(tasks.begin(), tasks.end());
  }

private:
  llvm::SmallVector<mlir::FlatSymbolRefAttr> taskFilter;
  mlir::RankedTensorType tensor(llvm::ArrayRef<int64_t> shape,
                                mlir::Type element) const;
  UnitCost headCost(TaskOp task) const;
  /// What a task's adapter adds to its head unit (see headCost).
  struct AdapterCost {
    llvm::SmallVector<SavedTensor> saved;
    int64_t params = 0, fwdFlops = 0, fwdWorkspace = 0, bwdWorkspace = 0;
  };
  UnitCost unfrozenUnit(UnitKind kind, TaskOp task) const;
  /// `cost` under NoGradGuard (see unit()).
  static UnitCost withoutBackward(UnitCost cost);
  /// The fused attention kernel's own transient buffers for `queries` rows
  /// attending to `keys` (CPU; zero on a GPU).
  int64_t flashAttentionBuffers(int64_t queries, int64_t keys,
                                bool backward) const;
  UnitCost lossCost(TaskOp task) const;

  // Op handles are cheap copies whose accessors are not const-qualified.
  mutable ModelOp model;
  mutable BackboneOp backbone;
  mutable BudgetOp budget;
  const DevicePreset *preset;
  int64_t batch = 1;
  Precision precision = Precision::fp32;
  bool dropout = false;
  AttentionKind attentionKind = AttentionKind::math;
  PointwiseKind pointwiseKind = PointwiseKind::aten;
};

} // namespace mtp

#endif // MTPC_PASSES_COSTMODEL_H
