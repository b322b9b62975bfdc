//===- Zero.h - ZeRO's sharded and offloaded AdamW --------------*- C++ -*-===//
//
// The layout is mtprt/Zero.h's. Stage 1: the gradients are averaged whole
// (GradExchange, compressed or not); each rank updates its run of the
// parameters with its run of the moments, frees the gradients, and the
// owners broadcast the updated values in place — begun at the update,
// waited for unit by unit as the next forward reads them
// (setForwardOrder). Stage 2: sumGradients() replaces the
// exchange — each rank receives the averaged gradient of its run only and the
// full gradients are freed before the update. The update is ATen's
// _fused_adamw_ on views of the parameters, so stage 1 gives the bits plain
// data parallelism gives; stage 2's sums may be ordered otherwise.
//
// Optimizer offload (ZeRO-Offload's update on the host): the moments in the
// host pool, each bucket of this rank's parameters and gradients copied
// there, updated by the same fused AdamW on the CPU, the parameters copied
// back; the device holds none of the state. With setForwardOrder (or at
// stage 3) the update runs on a thread of its own in the order the next
// forward reads the parameters, and the forward waits for each unit's as it
// reaches it (stage 3: each unit's gather waits for this rank's run of it).
//
// Stage 3 (FSDP's layout on ZeRO's run): the backbone units' parameters are
// sharded too. Each unit's parameters become views of one flat buffer (the
// unit's span of the layout); the buffer's storage is freed between uses,
// so the device holds this rank's run of every value (the update works on
// it) and, for a unit's forward or backward, that unit whole: gatherUnits()
// fills it from the runs' owners before the forward, a hook on the unit's
// output before its backward, and the unit is freed once its gradients are
// released. Heads and frozen layers stay whole on every rank.
//
// Internal API (LibTorch).
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_ZERO_H
#define MTPRT_TORCH_ZERO_H

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mtprt {

class Communicator;

struct AdamWHyper {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.01;
};

class ZeroOptimizer {
public:
  /// `groups[g]`: the parameters of learning-rate group g, in the order
  /// the flat layout lays them. `comm` may be null or inactive (one rank).
  /// `offload`: the moments live in the host pool and the update runs on
  /// the host, a bucket of parameters and gradients copied over and the
  /// parameters back (stage 0 with offload: every value, not sharded).
  /// `half` (with `offload` only; mtprt/Zero.h halfProjections): these
  /// parameters of the layout are cut to `halfType` on the device, and the
  /// fp32 values of this rank's run become masters in the host pool, which
  /// the update works on (ZeRO-Offload's 16-bit weights).
  ZeroOptimizer(Communicator *comm, int stage,
                std::vector<std::vector<at::Tensor>> groups, AdamWHyper hyper,
                bool offload = false, const std::vector<at::Tensor> &half = {},
                at::ScalarType halfType = at::kBFloat16);
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer &) = delete;
  ZeroOptimizer &operator=(const ZeroOptimizer &) = delete;

  int stage() const { return stage_; }
  /// The ranks the state is cut over (1 for the offload alone).
  int64_t worldSize() const { return world_; }
  bool offloaded() const { return offload_; }
  int64_t totalValues() const { return total_; }
  int64_t shardValues() const { return shard_; }

  /// Stage 2, before a step's first backward: whether this step releases
  /// its gradients during the backward — every rank has labels for the same
  /// tasks (`present`, one small all-reduce; collective). A step that does
  /// not keeps them to sumGradients(). At every stage: drops the sums
  /// foldHalfGradients left from a step that ended without its update.
  void beginStep(const std::vector<bool> &present);
  /// The group beginStep's agreement runs over (else the optimizer's): one
  /// of the same ranks whose collectives do not queue behind the updated
  /// values' broadcasts still in flight.
  void setControl(Communicator *control) { control_ = control; }
  bool releasing() const { return release_; }
  /// After each micro-batch's backward (collective when releasing): what
  /// its last hooks left pending is reduced, so the next micro-batch's
  /// gradients start afresh.
  void endBackward();
  /// A released parameter's fresh gradient (the hook's entry point).
  void release(int64_t param);
  /// With 16-bit weights at one process, after each micro-batch's backward
  /// when the step accumulates several (DeepSpeed's ZeRO-Offload): each
  /// 16-bit gradient is added into an fp32 buffer of its own in the host
  /// pool and freed on the device, so the update reads the sum autograd
  /// would have made of fp32 gradients, not one accumulated in 16 bits.
  /// More ranks keep the 16-bit gradients (the exchange averages .grad).
  void foldHalfGradients();
  /// Whether foldHalfGradients folds anything here (mtprt/Zero.h
  /// foldsHalfGradients).
  bool foldsHalfGradients() const;

  /// Stage 2's exchange, after the backward: this rank's run of the
  /// gradients averaged over ranks; every parameter's .grad freed. Returns
  /// the bytes this rank sent.
  int64_t sumGradients();
  /// Whether every gradient this rank updates from is finite, agreed over
  /// ranks (fp16's overflow check).
  bool finite();
  /// The update with group g's learning rate lr[g]; parameters no rank had a
  /// gradient for keep their values and step counts. Frees the gradients,
  /// then the updated values go to every rank (stages 1–2: the owners'
  /// broadcasts, waited for here unless setForwardOrder defers them; stage
  /// 3: the whole parameters'). With the offload and setForwardOrder the
  /// host update itself is only begun (each broadcast begins once its
  /// values are updated). Returns the bytes this rank sent.
  int64_t step(const std::vector<double> &lr);

  //===--- Stages 1–2: the updated values beside the next forward ---------===//

  /// The groups of parameters the step's forward reads, in its order (each
  /// unit's; each head's after its tap's). From then on step() only begins
  /// the broadcasts that bring every rank the values the others updated —
  /// each parameter's parts from their owners, in place, the parameters of
  /// no group first, then the groups' in order — and awaitGroup(g) waits
  /// for those of group g and everything begun before them, as the forward
  /// reaches it (DeepSpeed's stages 1–2 all-gather every parameter before
  /// the next forward starts). With the offload the host update runs in
  /// that order on a thread of its own, and awaitGroup(g) waits for group
  /// g's values first (DeepSpeed's ZeRO-Offload updates everything before
  /// the next forward, or a step late). Stages 0–2 with the offload, 1–2
  /// beyond one rank; else nothing.
  void setForwardOrder(const std::vector<std::vector<at::Tensor>> &groups);
  void awaitGroup(int64_t g);
  /// Model::setBeforeRead's hook: key k waits for group `groupOf[k]`; a key
  /// without one (-1: every parameter) waits for every broadcast.
  std::function<void(int64_t)> beforeRead(std::vector<int64_t> groupOf);
  /// The host update finished and every broadcast begun and waited for:
  /// what reads or writes parameters or the optimizer's state outside the
  /// forward (the next update, a checkpoint, an evaluation). A failure is
  /// rethrown at once (the run ends; the rest are dropped).
  void settleParameters();
  /// Broadcasts begun and not yet waited for (tests).
  int64_t parametersInFlight() const {
    return int64_t(paramTickets_.size() - paramWaited_);
  }
  /// Parameters whose host update has not finished (tests).
  int64_t hostUpdatesInFlight() const;
  /// Called on the host update's thread before each parameter's update
  /// (tests: a test holds one back to see the forward run beside it).
  void setBeforeHostUpdate(std::function<void(int64_t)> f) {
    settleParameters(); // the update in flight keeps the one it began with
    beforeHostUpdate_ = std::move(f);
  }
  /// Whether the host update runs beside the next forward (after
  /// setForwardOrder). Unset: beside a CUDA device, or on the CPU when the
  /// forward's threads leave a core free.
  void setUpdateBeside(std::optional<bool> on) { updateBeside_ = on; }
  //===--- Stage 3: the parameters sharded --------------------------------===//

  /// Shards `units[u]`'s parameters (each unit's consecutive in the layout
  /// and in this order; an empty unit stays whole) and frees them. Needs
  /// stage 3 and more than one rank; the values are every rank's current
  /// ones (the same on every rank).
  void shardParameters(const std::vector<std::vector<at::Tensor>> &units);
  bool shardsParameters() const { return !units_.empty(); }
  /// Whether some parameter's values are this optimizer's to give
  /// (hostValues) and set (setValues): stage 3's runs or the 16-bit
  /// weights' fp32 masters.
  bool holdsValues() const { return shardsParameters() || masters_.defined(); }
  /// The 16-bit parameters (empty without masters).
  int64_t halfValues() const { return halfValues_; }
  /// Units [first, last]'s parameters whole (collective: every rank gathers
  /// the same units in the same order). Those already whole stay; one
  /// prefetched is waited for.
  void gatherUnits(int64_t first, int64_t last);
  /// The training step's forward (FSDP's forward prefetch): units [first,
  /// last] whole, then unit `next`'s gather begun (-1: none), to be
  /// waited for at its own gather, so it arrives while these compute. Only
  /// in a step that releases (beginStep) and while prefetching is on. The
  /// backward's gather hook likewise begins the one below (the top unit of
  /// the region under it) when that unit's backward will read it. The plan
  /// counts the one extra unit (StepTimeline::sweep).
  void gatherForward(int64_t first, int64_t last, int64_t next);
  /// Off while a partial backward (the cosine probe) runs: it stops at a
  /// tap, and its plan holds one unit of its path at a time.
  void setPrefetch(bool on) { *prefetch_ = on; }
  /// After units [first, last]'s forward made `out`: freed, and (when
  /// their backward reads them) gathered again when the backward reaches
  /// `out` (a hook; quiet while backwardGathers is off). A step that does not release (beginStep)
  /// keeps them.
  void forwardDone(int64_t first, int64_t last, const at::Tensor &out,
                   bool backwardReads = true);
  /// After a partial backward (the cosine probe): what it gathered freed,
  /// unless the step keeps every unit.
  void dropGathered() {
    if (release_)
      freeGathered();
  }
  /// Off while a head's own backward runs: it stops at the tap, so the
  /// units below it need nothing.
  void setBackwardGathers(bool on) { *gatherHooks_ = on; }
  /// Every sharded unit whole (an export, a prediction, a dump), then
  /// freed (read only: a load writes the runs, setValues). Nested scopes
  /// keep them whole to the outermost. With masters: the 16-bit parameters
  /// hold their fp32 masters' values for the time (collective beyond one
  /// rank), then their 16-bit values again.
  void gatherAll();
  void freeAll();
  /// Model::setAroundUnit's hook: a unit run without autograd (an
  /// evaluation, a checkpoint region's first pass) is gathered before and
  /// freed after, unless everything is kept whole now; the pass's next unit
  /// (an evaluation's) is begun while it runs, as the step's forward does.
  std::function<void(int64_t, bool, int64_t)> aroundUnit();
  /// A parameter's values, whole, in a tensor of its own on the host (a
  /// checkpoint's save: collective for a sharded one, one parameter's
  /// values on the device at a time).
  at::Tensor hostValues(const at::Tensor &param);
  /// Whether every value of this rank's run is finite, agreed over the
  /// ranks (collective).
  bool runFinite();
  /// Sets a parameter's values (a checkpoint's load): a sharded one's run
  /// on this rank, a whole one's in place. No collective.
  void setValues(const at::Tensor &param, const at::Tensor &values);
  /// Bytes of the parameters gathered whole now (tests).
  int64_t gatheredBytes() const { return gatheredBytes_; }

  /// Stage 2's averaged gradient run after sumGradients() (tests).
  const at::Tensor &gradientShard() const { return gradShard_; }
  /// A skipped update (fp16 overflow): stage 2's gradient run dropped.
  void discardGradients() {
    gradShard_ = at::Tensor();
    folded_.assign(folded_.size(), at::Tensor());
    halfScale_ = 1.0;
  }
  /// fp16 with 16-bit weights (one process): their gradients (and folded
  /// sums) are still at the loss scale `scale`; this step's update divides
  /// it out on the host, in fp32.
  void setHalfGradientScale(double scale) { halfScale_ = scale; }
  /// fp16's loss scale divided out of what this step released (stage 2:
  /// the run autograd's hooks summed, at the scale the backward ran with;
  /// the gradients not released are the trainer's to unscale). Before
  /// sumGradients, which adds unscaled ones.
  void unscaleReleased(double scale) {
    if (gradShard_.defined() && scale != 1.0)
      gradShard_.div_(scale);
  }

  /// For checkpoints: [layout (stage, world, total, shard), steps per
  /// parameter, exp_avg run, exp_avg_sq run] (after the host update).
  std::vector<at::Tensor> state();
  /// Restores state(); throws std::runtime_error naming what differs.
  void loadState(const std::vector<at::Tensor> &state);
  /// Restores this rank's run of a whole state (a checkpoint written at
  /// another world size or layout, put together): every parameter's step
  /// count and the two moments laid end to end in the layout's order.
  void loadWhole(const std::vector<int64_t> &steps, const at::Tensor &expAvg,
                 const at::Tensor &expAvgSq);

private:
  struct Segment {
    int64_t param, group, begin, length, shardOffset;
  };
  at::Tensor flatParam(int64_t i) const;
  /// f(i, a, e) for every parameter i with values [a, e) of the flat
  /// layout inside [lo, hi).
  template <typename F> void forEachOverlap(int64_t lo, int64_t hi, F f) const;
  /// Copies [lo, hi) of the flat layout's parameter values into dst; zeros
  /// past the end.
  void gather(int64_t lo, int64_t hi, at::Tensor dst) const;
  /// The gradient segment `s` updates from: stage 2's run, else the
  /// parameter's own.
  at::Tensor gradientOf(const Segment &s) const;
  void agreeOnGradients();
  /// Sums the gradients of `params` (layout order on every rank; zeros
  /// where this rank has none) over the ranks, adds this rank's run of them
  /// to gradShard_, and frees them. A bucket carries a signature of its
  /// parameters, so ranks that reduced different ones fail loudly.
  void reduceBucket(const std::vector<int64_t> &params);
  /// Begins the sum of the release's bucket (finished by the next one or
  /// endRelease).
  void flushPending();
  /// Adds this rank's run of parameter i's summed gradient (flat).
  void addToShard(int64_t i, const at::Tensor &flat);

  Communicator *comm_, *control_ = nullptr;
  /// One parameter's segment updated on the host through the bucket-sized
  /// host buffers `hostParam` (unused with masters) and `hostGrad`.
  void updateOnHost(double lr, const at::Tensor &param, const at::Tensor &grad,
                    int64_t shardOffset, double step,
                    const at::Tensor &hostParam, const at::Tensor &hostGrad,
                    double unscale);
  double halfScale_ = 1.0;
  /// The parameters' device options (fp32): the gradient and parameter
  /// runs live there, the offloaded moments and masters in the host pool.
  at::TensorOptions options_;
  /// Whether parameter i is a 16-bit weight (its dtype is fp32 inside
  /// gatherAll).
  std::vector<bool> isHalf_;

  int stage_, world_ = 1, rank_ = 0;
  bool offload_ = false;
  AdamWHyper hyper_;
  std::vector<at::Tensor> params_;
  std::vector<int64_t> groupOf_, offset_, steps_;
  std::vector<bool> has_;
  std::vector<Segment> segments_;
  int64_t total_ = 0, shard_ = 0;
  at::Tensor expAvg_, expAvgSq_, gradShard_;
  /// Offloaded beside a CUDA device: host buffers pinned.
  bool pinned_ = false;
  /// Gradient release (stage 2, more than one rank).
  bool release_ = false;
  std::vector<bool> released_, held_;
  int64_t signature_ = 0, signatureCount_ = 0;
  /// The release's buckets (fp32, one bucket of values each): one fills
  /// with the pending small gradients' copies, each (parameter, offset),
  /// while the other's sum may be in flight; freed at endBackward.
  at::Tensor releaseBuckets_[2];
  int current_ = 0;
  std::vector<std::pair<int64_t, int64_t>> pending_;
  /// The release's sum in flight (a bucket, or a large gradient alone):
  /// what to add to this rank's run once it is done.
  struct InFlight {
    int64_t ticket = 0;
    at::Tensor buf;
    std::vector<std::pair<int64_t, int64_t>> params;
    int bucket = -1; ///< which of releaseBuckets_ (-1: a gradient alone)
  };
  InFlight inFlight_;
  /// Begins buf's sum over the ranks (after finishing the one in flight).
  void startSum(at::Tensor buf,
                std::vector<std::pair<int64_t, int64_t>> params,
                int bucket = -1);
  void finishInFlight();
  /// The backward's end: every release summed into the run, the buckets
  /// freed.
  void endRelease();
  int64_t pendingValues_ = 0, sentBytes_ = 0;
  /// Stages 1–2's broadcasts of the updated values (setForwardOrder): per
  /// group, the parameters it reads, those it broadcasts (the first group
  /// to read them), and their buffer and its span of the layout when they
  /// share one; what no group reads (broadcast first).
  struct Group {
    std::vector<int64_t> reads, own;
    at::Tensor flat;
    int64_t begin = 0, end = 0;
  };

  bool deferred_ = false;
  std::vector<Group> groups_;
  std::vector<int64_t> ungrouped_;
  /// Tickets of the broadcasts begun; those before paramWaited_ are waited
  /// for. Ticket n of the step is paramTickets_[n - ticketBase_] (the
  /// vector is emptied once every ticket in it is waited for).
  std::vector<int64_t> paramTickets_;
  size_t paramWaited_ = 0, ticketBase_ = 0;
  /// Waits for the step's tickets before number `upTo`.
  void waitParameterTickets(size_t upTo);
  size_t ticketsBegun() const { return ticketBase_ + paramTickets_.size(); }
  /// The broadcasts' items in order: each ungrouped parameter, then each
  /// group. begunItems_: those begun this step; paramEnd_[i]: the ticket
  /// count once parameter i's are begun; restEnd_: once the ungrouped are.
  size_t begunItems_ = 0, restEnd_ = 0;
  std::vector<size_t> paramEnd_;
  size_t numItems() const { return ungrouped_.size() + groups_.size(); }
  void beginItem(size_t k);
  /// Begins the items before `upTo`, each once its values are updated.
  void beginItems(size_t upTo);
  /// Whether something of the last update has not arrived yet.
  bool inFlight() const {
    return hostUpdate_ || begunItems_ < numItems() ||
           paramWaited_ < paramTickets_.size();
  }
  /// The offload's update on its own thread (setForwardOrder): its jobs in
  /// the forward's order; itemJobs_[k]: the jobs done once item k's
  /// parameters are updated.
  struct HostUpdate;
  std::unique_ptr<HostUpdate> hostUpdate_;
  std::vector<size_t> itemJobs_;
  /// Stage 3: the jobs done once the whole parameters are updated, and
  /// once unit u's run is.
  size_t wholeJobs_ = 0;
  std::vector<size_t> unitJobs_;
  std::function<void(int64_t)> beforeHostUpdate_;
  std::optional<bool> updateBeside_;
  /// Waits until `jobs` of the host update are done (all of them and the
  /// thread joined with -1); rethrows its failure.
  void awaitHostUpdate(size_t jobs);
  /// Stage 3: each sharded unit's flat buffer and its span of the layout;
  /// the unit of each parameter (-1: whole on every rank) and how many of a
  /// unit's gradients this micro-batch has released.
  struct Unit {
    at::Tensor flat;
    int64_t begin = 0, end = 0, params = 0, released = 0;
    bool gathered = false;
    /// Its output's hook this micro-batch gathers it for its backward.
    bool hooked = false;
    /// A prefetch's broadcasts not yet waited for (Communicator tickets).
    std::vector<int64_t> tickets;
  };
  /// Freeing waits for a prefetch in flight (it writes into the buffer).
  void allocateUnit(Unit &unit, bool allocate);
  /// Begins unit u's gather without waiting (nothing if it is whole).
  void prefetchUnit(int64_t u);
  /// Waits for unit's prefetch, if one is in flight.
  void settle(Unit &unit);
  void freeGathered();
  std::vector<Unit> units_;
  std::vector<int64_t> unitOf_;
  at::Tensor paramShard_;
  /// 16-bit weights: the fp32 masters of this rank's run (host pool), the
  /// 16-bit parameters and, inside gatherAll, their 16-bit values.
  at::Tensor masters_;
  std::vector<int64_t> half_;
  std::vector<at::Tensor> halfKept_;
  /// foldHalfGradients' fp32 sums, per parameter (undefined: none yet).
  std::vector<at::Tensor> folded_;
  int64_t halfValues_ = 0;
  /// Copies parameter i's values [its part of this rank's run] into `run`.
  void copyIntoRun(at::Tensor run, int64_t i, const at::Tensor &values) const;
  /// Parameter i whole from the ranks' runs of `run` (collective beyond
  /// one rank), on the collectives' device.
  at::Tensor wholeFromRuns(const at::Tensor &run, int64_t i);
  int64_t gatheredBytes_ = 0, gatherSent_ = 0;
  /// gatherAll scopes open; a step that keeps every unit whole (beginStep).
  int wholeDepth_ = 0;
  bool stepKeepsWhole_ = false;
  int64_t indexOf(const at::Tensor &param) const;
  /// Whether `bad` (1: this rank found a non-finite value) is 0 on every
  /// rank (collective).
  bool noRankBad(double bad);
  std::shared_ptr<bool> gatherHooks_ = std::make_shared<bool>(true);
  std::shared_ptr<bool> prefetch_ = std::make_shared<bool>(true);
  /// The hooks' way back here (null once destroyed).
  std::shared_ptr<ZeroOptimizer *> self_;
};

} // namespace mtprt

#endif // MTPRT_TORCH_ZERO_H
