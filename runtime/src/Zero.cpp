//===- Zero.cpp - the sharded AdamW of ZeRO stages 1 to 3 -----------------===//

#include "mtprt/torch/Zero.h"

#include "mtprt/Zero.h"
#include "mtprt/torch/Distributed.h"
#include "mtprt/torch/Regions.h"

#include <ATen/ops/_fused_adamw.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <ATen/Parallel.h>

#ifdef MTPRT_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <sched.h>

namespace mtprt {

namespace {
/// Spans [begin, end) of the layout from the runs that own them (rank q
/// owns [q·shard, (q+1)·shard)) into `dst`, one broadcast per owner: each
/// rank receives exactly the values it lacks, as FSDP's all-gather does.
/// Returns the bytes this rank contributed. With `tickets` the broadcasts
/// are only begun (ZeRO 3's prefetch), their tickets appended there.
int64_t fillFromRuns(Communicator *comm, int rank, int64_t shard,
                     int64_t begin, int64_t end, const at::Tensor &run,
                     const at::Tensor &dst,
                     std::vector<int64_t> *tickets = nullptr) {
  int64_t sent = 0;
  for (int64_t q = begin / shard; q * shard < end; ++q) {
    const int64_t a = std::max(begin, q * shard);
    const int64_t e = std::min(end, (q + 1) * shard);
    if (a >= e)
      continue;
    at::Tensor part = dst.narrow(0, a - begin, e - a);
    if (q == rank) {
      // Without `run` the owner's part holds its values already.
      if (run.defined())
        part.copy_(run.narrow(0, a - q * shard, e - a));
      sent += int64_t(part.element_size()) * (e - a);
    }
    if (tickets)
      tickets->push_back(comm->broadcastAsync(part, int(q)));
    else
      comm->broadcast(part, int(q));
  }
  return sent;
}

/// Parameters `run` (consecutive in the layout, at `offset`) made views of
/// one new buffer holding their values (FSDP's flat parameter); set_data
/// keeps each tensor, autograd's and every holder's. Returns the buffer.
at::Tensor viewsOfOneBuffer(const std::vector<at::Tensor> &params,
                            const std::vector<int64_t> &offset,
                            const std::vector<int64_t> &run,
                            const at::TensorOptions &options) {
  const int64_t begin = offset[run.front()];
  at::Tensor flat = at::empty(
      {offset[run.back()] + params[run.back()].numel() - begin}, options);
  for (int64_t i : run) {
    at::Tensor view = flat.narrow(0, offset[i] - begin, params[i].numel());
    view.copy_(params[i].detach().view({-1}));
    params[i].set_data(view.view(params[i].sizes()));
  }
  return flat;
}

/// Hands a parameter's freshly accumulated gradient to stage 2's release
/// (what DeepSpeed's stage 2 does with its gradient hooks).
struct ReleaseHook : torch::autograd::PostAccumulateGradHook {
  ReleaseHook(std::shared_ptr<ZeroOptimizer *> owner, int64_t i)
      : owner(std::move(owner)), i(i) {}
  void operator()(const torch::autograd::Variable &p) override {
    ZeroOptimizer *z = *owner;
    if (z && z->releasing() && p.grad().defined())
      z->release(i);
  }
  std::shared_ptr<ZeroOptimizer *> owner;
  int64_t i;
};

/// Ranks that release different parameters, or in another order, must not
/// sum each other's gradients silently: an order-sensitive hash of what a
/// micro-batch released, compared over the ranks at its end. Small enough
/// that its sum over 256 ranks is exact in fp32.
constexpr int64_t kSignatureModulus = 65521;
} // namespace

namespace {
/// This process's share of the cores it may run on, one per core where SMT
/// pairs them (LibTorch's default thread count is one per physical core),
/// divided among the ranks on this machine (LOCAL_WORLD_SIZE, as torchrun
/// and `--nproc` set it).
int physicalCores() {
  int logical = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    logical = CPU_COUNT(&set);
  if (logical <= 0)
    logical = int(std::max(1u, std::thread::hardware_concurrency()));
  std::ifstream smt("/sys/devices/system/cpu/smt/active");
  int active = 0;
  if (smt >> active && active == 1)
    logical = std::max(1, logical / 2);
  const char *local = std::getenv("LOCAL_WORLD_SIZE");
  const int ranks = local ? std::atoi(local) : 1;
  return ranks > 1 ? std::max(1, logical / ranks) : logical;
}
} // namespace

/// The offload's update beside the next forward: one job per parameter
/// segment, run in order on `thread`; `done` counts those finished.
struct ZeroOptimizer::HostUpdate {
  struct Job {
    int64_t param;
    at::Tensor values, grad;
    int64_t shardOffset;
    double lr, step, unscale;
  };
  std::vector<Job> jobs;
  at::Tensor hostParam, hostGrad;
  std::mutex mutex;
  std::condition_variable cv;
  size_t done = 0;
  std::exception_ptr error;
  std::function<void(int64_t)> before;
  std::thread thread;
#ifdef MTPRT_TORCH_CUDA
  /// The gradients' producer on the compute stream: the jobs' copies run
  /// on a side stream after it.
  std::unique_ptr<at::cuda::CUDAEvent> produced;
#endif
};

ZeroOptimizer::ZeroOptimizer(Communicator *comm, int stage,
                             std::vector<std::vector<at::Tensor>> groups,
                             AdamWHyper hyper, bool offload,
                             const std::vector<at::Tensor> &half,
                             at::ScalarType halfType)
    : comm_(comm), stage_(stage), hyper_(hyper), offload_(offload) {
  if (stage < (offload ? 0 : 1) || stage > 3)
    throw std::invalid_argument("mtprt: ZeRO stage " + std::to_string(stage) +
                                " is not 1, 2 or 3");
  if (stage >= 1 && comm && comm->active()) {
    world_ = comm->worldSize();
    rank_ = comm->rank();
  }
  // One process has nothing to scatter: stage 2 would only copy the
  // gradients.
  if (world_ == 1)
    stage_ = std::min(stage_, 1);
  for (size_t g = 0; g < groups.size(); ++g)
    for (at::Tensor &p : groups[g]) {
      if (!p.is_contiguous() || p.scalar_type() != at::kFloat)
        throw std::invalid_argument(
            "mtprt: ZeRO shards contiguous fp32 parameters only");
      params_.push_back(p);
      groupOf_.push_back(int64_t(g));
      offset_.push_back(total_);
      total_ += p.numel();
    }
  steps_.assign(params_.size(), 0);
  has_.assign(params_.size(), false);
  folded_.assign(params_.size(), at::Tensor());
  shard_ = ZeroLayout::shardValues(total_, world_);
  const int64_t lo = rank_ * shard_, hi = std::min(total_, lo + shard_);
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t a = std::max(lo, offset_[i]);
    const int64_t e = std::min(hi, offset_[i] + params_[i].numel());
    if (a < e)
      segments_.push_back(
          {int64_t(i), groupOf_[i], a - offset_[i], e - a, a - lo});
  }
  released_.assign(params_.size(), false);
  self_ = std::make_shared<ZeroOptimizer *>(this);
  if (stage_ >= 2) {
    for (size_t i = 0; i < params_.size(); ++i)
      if (params_[i].requires_grad())
        torch::autograd::impl::set_post_acc_grad_hooks(
            params_[i], std::make_unique<ReleaseHook>(self_, int64_t(i)));
  }
  const at::TensorOptions o =
      params_.empty() ? at::TensorOptions().dtype(at::kFloat)
                      : params_.front().options().requires_grad(false);
  // The runs of gradients and parameters live beside the parameters (the
  // device), whatever the moments' home.
  options_ = o;
  isHalf_.assign(params_.size(), false);
  pinned_ = offload_ && o.device().is_cuda();
  if (offload_) {
    expAvg_ = hostPoolTensor(shard_, at::kFloat, pinned_).zero_();
    expAvgSq_ = hostPoolTensor(shard_, at::kFloat, pinned_).zero_();
  } else {
    expAvg_ = at::zeros({shard_}, o);
    expAvgSq_ = at::zeros({shard_}, o);
  }
  if (half.empty())
    return;
  if (!offload_ || stage_ >= 3)
    throw std::invalid_argument(
        "mtprt: 16-bit device weights need the optimizer offload below ZeRO "
        "stage 3 (their fp32 masters live on the host)");
  if (halfType != at::kBFloat16 && halfType != at::kHalf)
    throw std::invalid_argument("mtprt: 16-bit device weights are bf16 or fp16");
  // The masters from the fp32 values, before the device's are cut.
  at::NoGradGuard noGrad;
  masters_ = hostPoolTensor(shard_, at::kFloat, pinned_);
  gather(lo, lo + shard_, masters_);
  // Every one found before any is cut: a refusal leaves the model as it was.
  for (const at::Tensor &p : half) {
    const int64_t i = indexOf(p);
    if (i < 0)
      throw std::invalid_argument(
          "mtprt: a 16-bit device weight the optimizer does not update");
    half_.push_back(i);
    halfValues_ += p.numel();
  }
  for (int64_t i : half_)
    isHalf_[size_t(i)] = true;
  for (int64_t i : half_) {
    // set_data keeps the tensor (and every holder of it, autograd's
    // included) and changes what it holds, as Module::to does.
    at::Tensor t = params_[i];
    t.set_data(t.detach().to(halfType));
  }
}

ZeroOptimizer::~ZeroOptimizer() {
  // The host update's thread reads this optimizer's state: it ends first
  // (its failure, if any, is the run's to have reported already).
  if (hostUpdate_ && hostUpdate_->thread.joinable())
    hostUpdate_->thread.join();
  // A prefetch or a sum still in flight (a step that threw) needs no wait
  // here: its work holds its tensors, so their bytes outlive this; and the
  // communicator may be gone already.
  if (!self_)
    return;
  *self_ = nullptr;
  if (stage_ < 2) // no release hooks of its own
    return;
  for (const at::Tensor &p : params_)
    if (torch::autograd::impl::post_acc_grad_hooks(p))
      torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

void ZeroOptimizer::updateOnHost(double lr, const at::Tensor &param,
                                 const at::Tensor &grad, int64_t shardOffset,
                                 double step, const at::Tensor &hostParam,
                                 const at::Tensor &hostGrad, double unscale) {
  const int64_t bucket = ZeroLayout::bucketValues(total_, world_);
  for (int64_t c = 0; c < param.numel(); c += bucket) {
    const int64_t len = std::min(bucket, param.numel() - c);
    // With masters the update works on them and only the result goes back
    // (cut to the parameter's dtype); otherwise on a copy of the parameter.
    at::Tensor p = masters_.defined() ? masters_.narrow(0, shardOffset + c, len)
                                      : hostParam.narrow(0, 0, len);
    at::Tensor g = hostGrad.narrow(0, 0, len);
    if (!masters_.defined())
      p.copy_(param.narrow(0, c, len));
    g.copy_(grad.narrow(0, c, len));
    if (unscale != 1.0) // fp16's loss scale, divided out in fp32
      g.div_(unscale);
    std::vector<at::Tensor> steps{
        at::full({}, step, at::TensorOptions().dtype(at::kFloat))};
    at::_fused_adamw_({p}, {g}, {expAvg_.narrow(0, shardOffset + c, len)},
                      {expAvgSq_.narrow(0, shardOffset + c, len)},
                      /*max_exp_avg_sqs=*/{}, steps, lr, hyper_.beta1,
                      hyper_.beta2, hyper_.weightDecay, hyper_.eps,
                      /*amsgrad=*/false, /*maximize=*/false);
    param.narrow(0, c, len).copy_(p);
  }
}

at::Tensor ZeroOptimizer::flatParam(int64_t i) const {
  return params_[i].detach().view({-1});
}

template <typename F>
void ZeroOptimizer::forEachOverlap(int64_t lo, int64_t hi, F f) const {
  // The last parameter that starts at or before lo, then on.
  auto it = std::upper_bound(offset_.begin(), offset_.end(), lo);
  size_t i = it == offset_.begin() ? 0 : size_t(it - offset_.begin() - 1);
  for (; i < params_.size() && offset_[i] < hi; ++i) {
    const int64_t a = std::max(lo, offset_[i]);
    const int64_t e = std::min(hi, offset_[i] + params_[i].numel());
    if (a < e)
      f(int64_t(i), a, e);
  }
}

void ZeroOptimizer::gather(int64_t lo, int64_t hi, at::Tensor dst) const {
  dst.zero_();
  forEachOverlap(lo, hi, [&](int64_t i, int64_t a, int64_t e) {
    dst.narrow(0, a - lo, e - a)
        .copy_(flatParam(i).narrow(0, a - offset_[i], e - a));
  });
}

at::Tensor ZeroOptimizer::gradientOf(const Segment &s) const {
  if (stage_ >= 2)
    return gradShard_.narrow(0, s.shardOffset, s.length);
  const at::Tensor &folded = folded_[s.param];
  return (folded.defined() ? folded : params_[s.param].grad().reshape({-1}))
      .narrow(0, s.begin, s.length);
}

bool ZeroOptimizer::foldsHalfGradients() const {
  // Data parallelism without sharding runs this optimizer at world 1 while
  // the exchange averages every rank's .grad: nothing folded there.
  const int ranks = comm_ && comm_->active() ? comm_->worldSize() : 1;
  return ZeroLayout::foldsHalfGradients(masters_.defined(), ranks, 2);
}

void ZeroOptimizer::foldHalfGradients() {
  if (!foldsHalfGradients())
    return;
  at::NoGradGuard noGrad;
  for (int64_t i : half_) {
    at::Tensor &g = params_[i].mutable_grad();
    if (!g.defined())
      continue;
    // The first as autocast's fp32 copy would be, then fp32 sums: the
    // arithmetic of accumulating fp32 gradients.
    at::Tensor &sum = folded_[i];
    if (!sum.defined())
      sum = hostPoolTensor(g.numel(), at::kFloat, pinned_)
                .copy_(g.reshape({-1}));
    else // fp32 + the bf16 value promoted, as fp32 accumulation adds
      sum.add_(g.device() == sum.device() ? g.reshape({-1})
                                          : g.reshape({-1}).to(sum.device()));
    g = at::Tensor();
  }
}

void ZeroOptimizer::agreeOnGradients() {
  at::Tensor has = at::empty({int64_t(params_.size())}, at::kFloat);
  for (size_t i = 0; i < params_.size(); ++i)
    has[int64_t(i)] = params_[i].grad().defined() ? 1.0 : 0.0;
  if (comm_ && comm_->active() && !params_.empty()) {
    std::vector<at::Tensor> flags{has.to(comm_->device())};
    comm_->allReduceSum(flags);
    has = flags[0].cpu();
  }
  auto a = has.accessor<float, 1>();
  // Released ones were released on every rank (the ranks agreed to).
  for (size_t i = 0; i < params_.size(); ++i)
    has_[i] = a[int64_t(i)] > 0 || released_[i];
  held_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i)
    held_[i] = a[int64_t(i)] > 0;
}

void ZeroOptimizer::beginStep(const std::vector<bool> &present) {
  // A step that ended without the update (or threw) leaves no sums behind.
  folded_.assign(params_.size(), at::Tensor());
  if (stage_ < 2)
    return;
  released_.assign(params_.size(), false);
  // A step that threw mid-backward may have left a sum in flight: it
  // writes into its buffer until it is done.
  if (inFlight_.buf.defined()) {
    const int64_t ticket = inFlight_.ticket;
    inFlight_ = InFlight(); // cleared first: a failed wait is not waited again
    comm_->wait(ticket);
  }
  pending_.clear();
  releaseBuckets_[0] = releaseBuckets_[1] = at::Tensor();
  current_ = 0;
  pendingValues_ = sentBytes_ = gatherSent_ = 0;
  signatureCount_ = signature_ = 0;
  gradShard_ = at::Tensor();
  release_ = false;
  if (!comm_ || !comm_->active() || world_ <= 1)
    return;
  at::Tensor flags = at::zeros({int64_t(present.size())}, at::kFloat);
  for (size_t t = 0; t < present.size(); ++t)
    flags[int64_t(t)] = present[t] ? 1.0f : 0.0f;
  Communicator *agree = control_ ? control_ : comm_;
  std::vector<at::Tensor> v{flags.to(agree->device())};
  agree->allReduceSum(v);
  const at::Tensor sum = v[0].cpu();
  release_ = true;
  for (size_t t = 0; t < present.size(); ++t) {
    const float f = sum[int64_t(t)].item<float>();
    release_ &= f == 0.0f || f == float(world_);
  }
  sentBytes_ = 4 * int64_t(present.size());
  // Stage 3 gathers a unit before its backward only where every rank runs
  // the same backward; a step whose ranks' tasks differ (a library caller's)
  // holds the parameters whole instead, as stage 2 holds its gradients.
  stepKeepsWhole_ = !release_ && !units_.empty();
  if (stepKeepsWhole_)
    gatherUnits(0, int64_t(units_.size()) - 1);
}

void ZeroOptimizer::addToShard(int64_t i, const at::Tensor &flat) {
  const int64_t lo = rank_ * shard_, hi = std::min(total_, lo + shard_);
  const int64_t a = std::max(lo, offset_[i]);
  const int64_t e = std::min(hi, offset_[i] + params_[i].numel());
  if (a >= e)
    return;
  if (!gradShard_.defined())
    gradShard_ = at::zeros({shard_}, options_);
  gradShard_.narrow(0, a - lo, e - a)
      .add_(flat.narrow(0, a - offset_[i], e - a).to(gradShard_.device()));
}

void ZeroOptimizer::reduceBucket(const std::vector<int64_t> &params) {
  if (params.empty())
    return;
  int64_t n = 0;
  for (int64_t i : params)
    n += params_[i].numel();
  at::Tensor buf;
  const at::Tensor &p0 = params_[params.front()];
  const at::Tensor &only = p0.grad();
  // A large 16-bit weight's gradient is summed in its 16 bits (as
  // ZeRO-Offload reduces) — decided by the parameter, not by whether this
  // rank has a gradient, so every rank sums the same bytes.
  const bool in16 = params.size() == 1 && p0.scalar_type() != at::kFloat &&
                    p0.numel() >= ZeroLayout::bucketValues(total_, world_);
  if (in16) {
    buf = only.defined() ? only.reshape({-1}).contiguous()
                         : at::zeros({n}, p0.options().requires_grad(false));
  } else if (params.size() == 1 && only.defined() && only.is_contiguous() &&
             only.scalar_type() == at::kFloat) {
    // Summed in place, nothing beside it.
    buf = only.view({-1});
  } else {
    // fp32 whatever the gradients' dtypes (a bucket may hold 16-bit
    // weights' and fp32 norms').
    buf = at::empty({n}, params_[params.front()]
                             .options()
                             .dtype(at::kFloat)
                             .requires_grad(false));
    int64_t off = 0;
    for (int64_t i : params) {
      const int64_t k = params_[i].numel();
      const at::Tensor &g = params_[i].grad();
      if (g.defined())
        buf.narrow(0, off, k).copy_(g.reshape({-1}));
      else
        buf.narrow(0, off, k).zero_();
      params_[i].mutable_grad() = at::Tensor();
      off += k;
    }
  }
  if (comm_ && comm_->active()) {
    std::vector<at::Tensor> one{buf};
    comm_->allReduceSum(one);
  }
  int64_t off = 0;
  for (int64_t i : params) {
    addToShard(i, buf.narrow(0, off, params_[i].numel()));
    params_[i].mutable_grad() = at::Tensor();
    off += params_[i].numel();
  }
  sentBytes_ += int64_t(buf.element_size()) * n;
}

void ZeroOptimizer::finishInFlight() {
  if (!inFlight_.buf.defined())
    return;
  InFlight f = std::move(inFlight_);
  inFlight_ = InFlight();
  comm_->wait(f.ticket);
  for (auto [i, off] : f.params)
    addToShard(i, f.buf.narrow(0, off, params_[i].numel()));
  // A bucket done with is freed (made again when it fills next): the plan
  // holds one bucket filling and one sum in flight, not two buckets beside
  // a large gradient's sum.
  if (f.bucket >= 0 && f.bucket != current_)
    releaseBuckets_[f.bucket] = at::Tensor();
}

void ZeroOptimizer::startSum(at::Tensor buf,
                             std::vector<std::pair<int64_t, int64_t>> params,
                             int bucket) {
  // One sum in flight at a time (the plan's one beside the release's
  // bucket): the one before is finished first.
  finishInFlight();
  const int64_t ticket =
      comm_ && comm_->active() ? comm_->allReduceSumAsync(buf) : 0;
  sentBytes_ += int64_t(buf.element_size()) * buf.numel();
  inFlight_ = InFlight{ticket, std::move(buf), std::move(params), bucket};
}

void ZeroOptimizer::flushPending() {
  if (pending_.empty())
    return;
  startSum(releaseBuckets_[current_].narrow(0, 0, pendingValues_),
           std::move(pending_), current_);
  // The other buffer's sum was finished by startSum.
  current_ ^= 1;
  pending_.clear();
  pendingValues_ = 0;
}

void ZeroOptimizer::release(int64_t i) {
  at::NoGradGuard noGrad;
  // Every rank makes its run at the first release, whether or not the
  // parameter is in it: the ranks hold alike (and the plan says so).
  if (!gradShard_.defined())
    gradShard_ = at::zeros({shard_}, options_);
  released_[i] = true;
  signature_ = (signature_ * 31 + i + 1) % kSignatureModulus;
  ++signatureCount_;
  // Stage 3: a unit whose every gradient is made has run its backward.
  if (!units_.empty() && unitOf_[i] >= 0) {
    Unit &u = units_[unitOf_[i]];
    if (++u.released == u.params && u.gathered)
      allocateUnit(u, false);
  }
  // Each sum runs while the backward goes on (DeepSpeed's overlap_comm):
  // begun here, finished when the next must begin or the backward ends.
  const int64_t bucket = ZeroLayout::bucketValues(total_, world_);
  const at::Tensor g = params_[i].grad();
  const int64_t n = params_[i].numel();
  if (n >= bucket) {
    // Alone, in place (a 16-bit weight's in its 16 bits, as ZeRO-Offload
    // reduces); freed when its sum is done.
    at::Tensor buf =
        g.is_contiguous() ? g.view({-1}) : g.reshape({-1}).contiguous();
    params_[i].mutable_grad() = at::Tensor();
    startSum(std::move(buf), {{i, 0}});
    return;
  }
  // DeepSpeed's IPG bucket: copied into one bucket of fp32 (whatever the
  // gradient's dtype) and freed at once; the bucket's sum begins when the
  // next would not fit, into the other bucket then.
  if (pendingValues_ + n > bucket)
    flushPending();
  at::Tensor &into = releaseBuckets_[current_];
  if (!into.defined())
    into = at::empty({bucket},
                     g.options().dtype(at::kFloat).requires_grad(false));
  into.narrow(0, pendingValues_, n).copy_(g.reshape({-1}));
  params_[i].mutable_grad() = at::Tensor();
  pending_.push_back({i, pendingValues_});
  pendingValues_ += n;
}

void ZeroOptimizer::endRelease() {
  flushPending();
  finishInFlight();
  releaseBuckets_[0] = releaseBuckets_[1] = at::Tensor();
  current_ = 0;
}

void ZeroOptimizer::endBackward() {
  for (Unit &u : units_) {
    u.released = 0;
    u.hooked = false;
  }
  if (!release_)
    return; // stage 3: every unit stays whole to the step's end
  freeGathered();
  at::NoGradGuard noGrad;
  endRelease();
  std::vector<at::Tensor> v{
      at::tensor(std::vector<float>{float(signatureCount_), float(signature_)},
                 at::kFloat)
          .to(comm_->device())};
  comm_->allReduceSum(v);
  const at::Tensor sum = v[0].cpu();
  if (sum[0].item<float>() != float(world_ * signatureCount_) ||
      sum[1].item<float>() != float(world_ * signature_))
    throw std::runtime_error(
        "ZeRO stage 2: the ranks made their parameters' gradients in a "
        "different order (their models' graphs differ), so their released "
        "gradients cannot be summed; train with budget { zero = 1 }");
  sentBytes_ += 8;
  signatureCount_ = signature_ = 0;
}

int64_t ZeroOptimizer::sumGradients() {
  if (stage_ < 2)
    throw std::logic_error("mtprt: sumGradients is ZeRO stage 2's exchange");
  at::NoGradGuard noGrad;
  endRelease();
  agreeOnGradients();
  // What is still held (a head's gradients, every gradient of a step that
  // did not release): summed in layout order, a bucket at a time, each
  // bucket's gradients freed as it is done.
  const int64_t bucket = ZeroLayout::bucketValues(total_, world_);
  std::vector<int64_t> run;
  int64_t runValues = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!held_[i])
      continue;
    if (params_[i].numel() >= bucket) {
      reduceBucket(run);
      run.clear();
      runValues = 0;
      reduceBucket({int64_t(i)});
      continue;
    }
    // A run is summed before the next would take it past one bucket (the
    // plan's one bucket at the exchange).
    if (runValues + params_[i].numel() > bucket) {
      reduceBucket(run);
      run.clear();
      runValues = 0;
    }
    run.push_back(int64_t(i));
    runValues += params_[i].numel();
  }
  reduceBucket(run);
  if (!gradShard_.defined())
    gradShard_ = at::zeros({shard_}, options_);
  if (world_ > 1)
    gradShard_.div_(double(world_));
  release_ = false;
  for (at::Tensor &p : params_)
    p.mutable_grad() = at::Tensor();
  return sentBytes_ + 4 * int64_t(params_.size());
}

bool ZeroOptimizer::finite() {
  double bad = 0;
  if (stage_ >= 2) {
    if (gradShard_.defined())
      bad = at::isfinite(gradShard_).all().item<bool>() ? 0 : 1;
  } else {
    // A 16-bit gradient folded after its micro-batch is checked in its sum.
    for (const Segment &s : segments_) {
      const at::Tensor &g = params_[s.param].grad();
      const at::Tensor &f = folded_[size_t(s.param)];
      if ((g.defined() && !at::isfinite(g).all().item<bool>()) ||
          (f.defined() && !at::isfinite(f).all().item<bool>())) {
        bad = 1;
        break;
      }
    }
  }
  return noRankBad(bad);
}

bool ZeroOptimizer::noRankBad(double bad) {
  if (comm_ && comm_->active()) {
    std::vector<at::Tensor> flag{
        at::full({1}, bad, at::TensorOptions().dtype(at::kFloat))
            .to(comm_->device())};
    comm_->allReduceSum(flag);
    bad = flag[0].cpu().item<double>();
  }
  return bad == 0;
}

int64_t ZeroOptimizer::step(const std::vector<double> &lr) {
  at::NoGradGuard noGrad;
  // The owners' broadcasts of the last update read what this one writes.
  settleParameters();
  // A 16-bit gradient made after the last fold joins its sum (else the sum
  // would stand for it alone).
  if (std::any_of(folded_.begin(), folded_.end(),
                  [](const at::Tensor &t) { return t.defined(); }))
    foldHalfGradients();
  if (stage_ < 2) // the exchange left every rank the same gradients
    for (size_t i = 0; i < params_.size(); ++i)
      has_[i] = params_[i].grad().defined() || folded_[i].defined();
  for (size_t i = 0; i < params_.size(); ++i)
    if (has_[i])
      ++steps_[i];
  struct Lists {
    std::vector<at::Tensor> params, grads, avgs, sqs;
    std::vector<double> steps;
  };
  std::map<int64_t, Lists> byGroup;
  const int64_t groups = groupOf_.empty() ? 0 : groupOf_.back() + 1;
  if (int64_t(lr.size()) < groups)
    throw std::invalid_argument("mtprt: ZeRO step: " +
                                std::to_string(lr.size()) +
                                " learning rates for " +
                                std::to_string(groups) + " groups");
  // The offload beside the next forward: the jobs in the order the forward
  // reads them (stages 0–2: the broadcasts' items; stage 3: the whole
  // parameters, then unit by unit), each item's or unit's count of them
  // kept. Beside a GPU the host's cores are free while it computes; on the
  // CPU only those the forward's threads leave (sharing them slows both:
  // measured 1.7x the wall time at two threads on two cores).
  const bool overlap =
      offload_ && (deferred_ || !units_.empty()) &&
      (updateBeside_ ? *updateBeside_
                     : pinned_ || 2 * at::get_num_threads() <= physicalCores());
  std::unique_ptr<HostUpdate> update;
  if (offload_) {
    update = std::make_unique<HostUpdate>();
    const int64_t bucket = ZeroLayout::bucketValues(total_, world_);
    if (!masters_.defined())
      update->hostParam = hostPoolTensor(bucket, at::kFloat, pinned_);
    update->hostGrad = hostPoolTensor(bucket, at::kFloat, pinned_);
  }
  std::vector<int64_t> segmentOf(params_.size(), -1);
  for (size_t k = 0; k < segments_.size(); ++k)
    segmentOf[size_t(segments_[k].param)] = int64_t(k);
  auto addJob = [&](int64_t i) {
    if (segmentOf[size_t(i)] < 0 || !has_[size_t(i)])
      return;
    const Segment &s = segments_[size_t(segmentOf[size_t(i)])];
    update->jobs.push_back(
        {i,
         units_.empty() ? flatParam(s.param).narrow(0, s.begin, s.length)
                        : paramShard_.narrow(0, s.shardOffset, s.length),
         gradientOf(s), s.shardOffset, lr[s.group], double(steps_[s.param]),
         isHalf_[size_t(i)] ? halfScale_ : 1.0});
  };
  if (overlap && !units_.empty()) {
    // Stage 3: a unit's gather (its runs from their owners) waits for its
    // jobs; the whole parameters go first, broadcast by this step.
    for (size_t i = 0; i < params_.size(); ++i)
      if (unitOf_[i] < 0)
        addJob(int64_t(i));
    wholeJobs_ = update->jobs.size();
    std::vector<std::vector<int64_t>> ofUnit(units_.size());
    for (size_t i = 0; i < params_.size(); ++i)
      if (unitOf_[i] >= 0)
        ofUnit[size_t(unitOf_[i])].push_back(int64_t(i));
    unitJobs_.assign(units_.size(), 0);
    for (size_t u = 0; u < units_.size(); ++u) {
      for (int64_t i : ofUnit[u])
        addJob(i);
      unitJobs_[u] = update->jobs.size();
    }
  } else if (overlap) {
    itemJobs_.clear();
    for (int64_t i : ungrouped_) {
      addJob(i);
      itemJobs_.push_back(update->jobs.size());
    }
    for (const Group &g : groups_) {
      for (int64_t i : g.own)
        addJob(i);
      itemJobs_.push_back(update->jobs.size());
    }
  } else if (offload_) {
    for (const Segment &s : segments_)
      addJob(s.param);
  }
  for (const Segment &s : segments_) {
    if (!has_[s.param] || offload_)
      continue;
    Lists &l = byGroup[s.group];
    l.params.push_back(units_.empty()
                           ? flatParam(s.param).narrow(0, s.begin, s.length)
                           : paramShard_.narrow(0, s.shardOffset, s.length));
    l.grads.push_back(gradientOf(s));
    l.avgs.push_back(expAvg_.narrow(0, s.shardOffset, s.length));
    l.sqs.push_back(expAvgSq_.narrow(0, s.shardOffset, s.length));
    l.steps.push_back(double(steps_[s.param]));
  }
  for (auto &[g, l] : byGroup) {
    at::Tensor steps =
        at::tensor(l.steps, at::TensorOptions().dtype(at::kFloat))
            .to(l.params.front().device());
    std::vector<at::Tensor> stepList = steps.unbind(0);
    at::_fused_adamw_(l.params, l.grads, l.avgs, l.sqs, /*max_exp_avg_sqs=*/{},
                      stepList, lr[g], hyper_.beta1, hyper_.beta2,
                      hyper_.weightDecay, hyper_.eps, /*amsgrad=*/false,
                      /*maximize=*/false);
  }
  if (update && !overlap) {
    for (const HostUpdate::Job &j : update->jobs)
      updateOnHost(j.lr, j.values, j.grad, j.shardOffset, j.step,
                   update->hostParam, update->hostGrad, j.unscale);
    update.reset();
  }
  if (update) {
    // The jobs hold the gradients they read; each is let go once updated.
    HostUpdate *u = update.get();
#ifdef MTPRT_TORCH_CUDA
    if (pinned_) {
      u->produced = std::make_unique<at::cuda::CUDAEvent>();
      u->produced->record(
          at::cuda::getCurrentCUDAStream(params_.front().get_device()));
    }
#endif
    u->before = beforeHostUpdate_;
    u->thread = std::thread([this, u] {
      // ATen sets this thread's intra-op count from the process's at its
      // first parallel op (the driver changes it only with no update in
      // flight: Driver's --threads auto settles first).
      at::NoGradGuard noGrad;
      size_t j = 0;
      try {
#ifdef MTPRT_TORCH_CUDA
        // The copies (each synchronous) on a side stream, behind the
        // backward that made the gradients, beside the forward's kernels.
        std::optional<c10::cuda::CUDAStreamGuard> onSide;
        if (u->produced) {
          auto side = at::cuda::getStreamFromPool(
              /*isHighPriority=*/false, params_.front().get_device());
          u->produced->block(side);
          onSide.emplace(side);
        }
#endif
        for (; j < u->jobs.size(); ++j) {
          HostUpdate::Job &job = u->jobs[j];
          if (u->before)
            u->before(job.param);
          updateOnHost(job.lr, job.values, job.grad, job.shardOffset, job.step,
                       u->hostParam, u->hostGrad, job.unscale);
          job.values = job.grad = at::Tensor();
          std::lock_guard<std::mutex> lock(u->mutex);
          ++u->done;
          u->cv.notify_all();
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(u->mutex);
        u->error = std::current_exception();
        u->done = u->jobs.size();
        u->cv.notify_all();
      }
      // The buckets back to the pool (nothing else reads them).
      u->hostParam = u->hostGrad = at::Tensor();
    });
    hostUpdate_ = std::move(update);
  }
  // The gradients are spent before the broadcasts begin (the host update's
  // jobs hold those they have yet to read).
  byGroup.clear();
  halfScale_ = 1.0;
  gradShard_ = at::Tensor();
  folded_.assign(params_.size(), at::Tensor());
  for (at::Tensor &p : params_)
    p.mutable_grad() = at::Tensor();
  if (world_ <= 1) {
    // Nothing to broadcast: the items only wait for the host update.
    begunItems_ = hostUpdate_ ? 0 : numItems();
    return 0;
  }
  if (!units_.empty()) {
    // Stage 3: the sharded units are gathered at their next use (what is
    // whole now is stale); the parameters kept whole on every rank take
    // their updated values from their runs' owners.
    stepKeepsWhole_ = false;
    freeGathered();
    // What this rank contributed to the step's gathers, and to these.
    int64_t sent = gatherSent_;
    gatherSent_ = 0;
    if (hostUpdate_)
      awaitHostUpdate(wholeJobs_);
    for (size_t i = 0; i < params_.size(); ++i)
      if (unitOf_[i] < 0 && has_[i])
        sent += fillFromRuns(comm_, rank_, shard_, offset_[i],
                             offset_[i] + params_[i].numel(), paramShard_,
                             flatParam(int64_t(i)));
    return sent;
  }
  // Stages 1–2: each parameter's parts broadcast by their owners into the
  // parameter itself on every rank (no buffer: the owner's part holds its
  // new values — a 16-bit one its masters cut, as a receiver would cut
  // them), in the order the next forward reads them, each once its values
  // are updated. Every parameter, updated or not: the ranks begin the same
  // broadcasts whatever their gradients said.
  int64_t sent = 0;
  const int64_t lo = rank_ * shard_, hi = lo + shard_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t a = std::max(lo, offset_[i]);
    const int64_t e = std::min(hi, offset_[i] + params_[i].numel());
    if (a < e)
      sent += (e - a) * int64_t(params_[i].element_size());
  }
  if (!deferred_) {
    for (size_t i = 0; i < params_.size(); ++i)
      fillFromRuns(comm_, rank_, shard_, offset_[i],
                   offset_[i] + params_[i].numel(), at::Tensor(),
                   flatParam(int64_t(i)), &paramTickets_);
    settleParameters();
    return sent * (world_ - 1);
  }
  begunItems_ = 0;
  paramEnd_.assign(params_.size(), 0);
  // Without a host update every value is updated: all begun now. With one,
  // the forward begins them as it goes (awaitGroup) — at points of the
  // program, not of the update's progress, so every rank issues its
  // collectives in the same order.
  if (!hostUpdate_)
    beginItems(numItems());
  return sent * (world_ - 1);
}

void ZeroOptimizer::beginItem(size_t k) {
  auto begin = [&](int64_t i) {
    fillFromRuns(comm_, rank_, shard_, offset_[i],
                 offset_[i] + params_[i].numel(), at::Tensor(), flatParam(i),
                 &paramTickets_);
    paramEnd_[size_t(i)] = ticketsBegun();
  };
  if (k < ungrouped_.size()) {
    begin(ungrouped_[k]);
    if (k + 1 == ungrouped_.size())
      restEnd_ = ticketsBegun();
    return;
  }
  if (k == 0) // no ungrouped parameters
    restEnd_ = ticketsBegun();
  const Group &g = groups_[k - ungrouped_.size()];
  if (!g.flat.defined()) {
    for (int64_t i : g.own)
      begin(i);
    return;
  }
  // One broadcast per owner where the group's parameters share a buffer.
  fillFromRuns(comm_, rank_, shard_, g.begin, g.end, at::Tensor(), g.flat,
               &paramTickets_);
  for (int64_t i : g.own)
    paramEnd_[size_t(i)] = ticketsBegun();
}

void ZeroOptimizer::beginItems(size_t upTo) {
  upTo = std::min(upTo, numItems());
  for (; begunItems_ < upTo; ++begunItems_) {
    if (hostUpdate_)
      awaitHostUpdate(itemJobs_[begunItems_]);
    // At one rank (the offload alone) the items only order the update.
    if (world_ > 1)
      beginItem(begunItems_);
  }
}

void ZeroOptimizer::awaitHostUpdate(size_t jobs) {
  if (!hostUpdate_)
    return;
  HostUpdate &u = *hostUpdate_;
  {
    std::unique_lock<std::mutex> lock(u.mutex);
    u.cv.wait(lock, [&] { return u.done >= std::min(jobs, u.jobs.size()); });
    if (!u.error && u.done < u.jobs.size())
      return;
  }
  // Every job done, or one failed (the thread has returned): joined.
  u.thread.join();
  std::exception_ptr error = u.error;
  hostUpdate_.reset();
  if (error) {
    // The run ends here; nothing waits for broadcasts of stale values.
    begunItems_ = numItems();
    std::rethrow_exception(error);
  }
}

int64_t ZeroOptimizer::hostUpdatesInFlight() const {
  if (!hostUpdate_)
    return 0;
  std::lock_guard<std::mutex> lock(hostUpdate_->mutex);
  return int64_t(hostUpdate_->jobs.size() - hostUpdate_->done);
}

void ZeroOptimizer::setForwardOrder(
    const std::vector<std::vector<at::Tensor>> &groups) {
  settleParameters();
  deferred_ = false;
  groups_.clear();
  ungrouped_.clear();
  begunItems_ = 0;
  if ((world_ <= 1 && !offload_) || stage_ >= 3)
    return;
  at::NoGradGuard noGrad;
  std::unordered_map<const c10::TensorImpl *, int64_t> index;
  for (size_t i = 0; i < params_.size(); ++i)
    index.emplace(params_[i].unsafeGetTensorImpl(), int64_t(i));
  // Each parameter is broadcast with the first group that reads it.
  std::vector<bool> listed(params_.size(), false);
  for (const std::vector<at::Tensor> &group : groups) {
    Group g;
    for (const at::Tensor &p : group) {
      auto it = index.find(p.unsafeGetTensorImpl());
      if (it == index.end())
        continue; // not updated here (frozen, or another optimizer's)
      g.reads.push_back(it->second);
      if (!listed[it->second]) {
        listed[it->second] = true;
        g.own.push_back(it->second);
      }
    }
    groups_.push_back(std::move(g));
  }
  for (size_t i = 0; i < params_.size(); ++i)
    if (!listed[i])
      ungrouped_.push_back(int64_t(i));
  // A group whose own parameters are a run of the layout, all fp32, gets
  // them as views of one buffer (FSDP's flat parameter): one broadcast per
  // owner instead of one per parameter and owner.
  for (Group &g : groups_) {
    if (world_ <= 1)
      break;
    std::vector<int64_t> own = g.own;
    std::sort(own.begin(), own.end());
    if (own.size() < 2 || own.back() - own.front() + 1 != int64_t(own.size()) ||
        std::any_of(own.begin(), own.end(), [&](int64_t i) {
          return params_[i].scalar_type() != at::kFloat;
        }))
      continue;
    g.begin = offset_[own.front()];
    g.end = offset_[own.back()] + params_[own.back()].numel();
    g.flat = viewsOfOneBuffer(
        params_, offset_, own,
        params_[own.front()].options().requires_grad(false));
  }
  // Nothing of an update in flight yet.
  begunItems_ = numItems();
  paramEnd_.assign(params_.size(), 0);
  deferred_ = true;
}

void ZeroOptimizer::waitParameterTickets(size_t upTo) {
  upTo = std::min(upTo > ticketBase_ ? upTo - ticketBase_ : 0,
                  paramTickets_.size());
  while (paramWaited_ < upTo) {
    const int64_t t = paramTickets_[paramWaited_++];
    try {
      comm_->wait(t);
    } catch (...) {
      // The run ends here: the rest are not waited for, each up to its
      // timeout behind a lost peer (a work holds its tensors, so what it
      // writes into outlives this).
      ticketBase_ += paramTickets_.size();
      paramTickets_.clear();
      paramWaited_ = 0;
      begunItems_ = numItems();
      throw;
    }
  }
  if (paramWaited_ >= paramTickets_.size()) {
    ticketBase_ += paramTickets_.size();
    paramTickets_.clear();
    paramWaited_ = 0;
  }
}

void ZeroOptimizer::awaitGroup(int64_t g) {
  if (!inFlight())
    return;
  if (g < 0 || g >= int64_t(groups_.size()))
    return settleParameters();
  // Group g's values updated and their broadcasts begun — and beyond one
  // rank the next group's too, so that its broadcasts run beside this
  // unit's compute.
  beginItems(ungrouped_.size() + size_t(g) + (world_ > 1 ? 2 : 1));
  if (hostUpdate_ && hostUpdatesInFlight() == 0)
    awaitHostUpdate(size_t(-1));
  if (world_ <= 1)
    return;
  // What it reads (some first read by an earlier group) and what no group
  // lists.
  size_t wait = restEnd_;
  for (int64_t i : groups_[size_t(g)].reads)
    wait = std::max(wait, paramEnd_[size_t(i)]);
  waitParameterTickets(wait);
}

std::function<void(int64_t)>
ZeroOptimizer::beforeRead(std::vector<int64_t> groupOf) {
  std::shared_ptr<ZeroOptimizer *> owner = self_;
  return [owner, groupOf = std::move(groupOf)](int64_t key) {
    ZeroOptimizer *z = *owner;
    if (!z || !z->inFlight())
      return;
    z->awaitGroup(
        key >= 0 && key < int64_t(groupOf.size()) ? groupOf[size_t(key)] : -1);
  };
}

void ZeroOptimizer::settleParameters() {
  awaitHostUpdate(size_t(-1));
  beginItems(numItems());
  if (!paramTickets_.empty())
    waitParameterTickets(ticketsBegun());
}

std::vector<at::Tensor> ZeroOptimizer::state() {
  settleParameters();
  at::Tensor layout = at::tensor(
      std::vector<int64_t>{stage_, world_, total_, shard_}, at::kLong);
  at::Tensor steps = at::tensor(steps_, at::kLong);
  return {layout, steps, expAvg_, expAvgSq_};
}

void ZeroOptimizer::loadState(const std::vector<at::Tensor> &s) {
  settleParameters();
  auto describe = [](int64_t stage, int64_t world, int64_t total) {
    return "ZeRO stage " + std::to_string(stage) + " over " +
           std::to_string(world) + " rank(s), " + std::to_string(total) +
           " values";
  };
  if (s.size() != 4 || s[0].numel() != 4 || s[0].scalar_type() != at::kLong)
    throw std::runtime_error("its ZeRO state is malformed (" +
                             std::to_string(s.size()) + " tensors)");
  at::Tensor layout = s[0].cpu();
  auto l = layout.accessor<int64_t, 1>();
  if (l[1] != world_ || l[2] != total_ || l[3] != shard_)
    throw std::runtime_error(
        "its optimizer state is sharded as " + describe(l[0], l[1], l[2]) +
        ", this run as " + describe(stage_, world_, total_) +
        ": resume with the world size and plan it was trained with");
  if (s[1].numel() != int64_t(steps_.size()) ||
      s[1].scalar_type() != at::kLong || s[2].numel() != shard_ ||
      s[3].numel() != shard_ || s[2].scalar_type() != at::kFloat ||
      s[3].scalar_type() != at::kFloat)
    throw std::runtime_error("its ZeRO state's tensors do not match the "
                             "model's parameters");
  at::Tensor steps = s[1].cpu().contiguous();
  for (size_t i = 0; i < steps_.size(); ++i) {
    const int64_t v = steps.data_ptr<int64_t>()[i];
    if (v < 0)
      throw std::runtime_error("its ZeRO state has a negative step count");
    steps_[i] = v;
  }
  at::NoGradGuard noGrad;
  expAvg_.copy_(s[2].reshape({-1}));
  expAvgSq_.copy_(s[3].reshape({-1}));
}

void ZeroOptimizer::loadWhole(const std::vector<int64_t> &steps,
                              const at::Tensor &avg, const at::Tensor &sq) {
  settleParameters();
  if (steps.size() != steps_.size() || avg.numel() != total_ ||
      sq.numel() != total_)
    throw std::runtime_error(
        "its optimizer state has " + std::to_string(steps.size()) +
        " parameters and " + std::to_string(avg.numel()) +
        " values, the model " + std::to_string(steps_.size()) + " and " +
        std::to_string(total_));
  for (int64_t v : steps)
    if (v < 0)
      throw std::runtime_error("its optimizer state has a negative step count");
  steps_ = steps;
  at::NoGradGuard noGrad;
  const int64_t lo = rank_ * shard_;
  const int64_t n = std::max<int64_t>(0, std::min(shard_, total_ - lo));
  expAvg_.zero_();
  expAvgSq_.zero_();
  if (n > 0) {
    expAvg_.narrow(0, 0, n).copy_(avg.reshape({-1}).narrow(0, lo, n));
    expAvgSq_.narrow(0, 0, n).copy_(sq.reshape({-1}).narrow(0, lo, n));
  }
}

//===--- Stage 3 ----------------------------------------------------------===//

void ZeroOptimizer::shardParameters(
    const std::vector<std::vector<at::Tensor>> &units) {
  if (stage_ < 3 || world_ <= 1 || !comm_ || !comm_->active())
    throw std::logic_error(
        "mtprt: shardParameters needs ZeRO stage 3 over more than one rank");
  if (!units_.empty())
    throw std::logic_error("mtprt: shardParameters: already sharded");
  if (masters_.defined())
    throw std::logic_error("mtprt: shardParameters with 16-bit weights");
  at::NoGradGuard noGrad;
  std::unordered_map<const void *, int64_t> index;
  for (size_t i = 0; i < params_.size(); ++i)
    index[params_[i].unsafeGetTensorImpl()] = int64_t(i);
  unitOf_.assign(params_.size(), -1);
  std::vector<Unit> made(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    Unit &unit = made[u];
    std::vector<int64_t> mine;
    for (const at::Tensor &p : units[u]) {
      auto it = index.find(p.unsafeGetTensorImpl());
      if (it == index.end() || unitOf_[it->second] >= 0)
        throw std::logic_error("mtprt: shardParameters: unit " +
                               std::to_string(u) +
                               " has a parameter the optimizer does not "
                               "update, or another unit's");
      unitOf_[it->second] = int64_t(u);
      mine.push_back(it->second);
    }
    std::sort(mine.begin(), mine.end());
    for (size_t k = 1; k < mine.size(); ++k)
      if (mine[k] != mine[0] + int64_t(k))
        throw std::logic_error(
            "mtprt: shardParameters: unit " + std::to_string(u) +
            "'s parameters are not a run of the optimizer's layout");
    if (mine.empty())
      continue;
    unit.params = int64_t(mine.size());
    unit.begin = offset_[mine.front()];
    unit.end = offset_[mine.back()] + params_[mine.back()].numel();
  }
  // Every rank's run of the values, then each unit's parameters made views
  // of its flat buffer, freed.
  paramShard_ = at::empty({shard_}, options_);
  gather(rank_ * shard_, rank_ * shard_ + shard_, paramShard_);
  for (size_t u = 0; u < made.size(); ++u) {
    Unit &unit = made[u];
    if (unit.params == 0)
      continue;
    std::vector<int64_t> run;
    for (size_t i = 0; i < params_.size(); ++i)
      if (unitOf_[i] == int64_t(u))
        run.push_back(int64_t(i));
    unit.flat = viewsOfOneBuffer(params_, offset_, run, options_);
    unit.gathered = true;
    gatheredBytes_ += 4 * (unit.end - unit.begin);
    allocateUnit(unit, false);
  }
  units_ = std::move(made);
}

void ZeroOptimizer::settle(Unit &unit) {
  // Every broadcast waited for, even past a failed one (the others may
  // still write into the buffer); the first failure is rethrown.
  std::vector<int64_t> tickets = std::move(unit.tickets);
  unit.tickets.clear();
  std::exception_ptr failed;
  for (int64_t t : tickets)
    try {
      comm_->wait(t);
    } catch (...) {
      if (!failed)
        failed = std::current_exception();
    }
  if (failed)
    std::rethrow_exception(failed);
}

void ZeroOptimizer::allocateUnit(Unit &unit, bool allocate) {
  if (unit.gathered == allocate || unit.params == 0)
    return;
  if (!allocate)
    settle(unit);
  c10::StorageImpl *s = unit.flat.storage().unsafeGetStorageImpl();
  const int64_t bytes = 4 * (unit.end - unit.begin);
  if (allocate) {
    s->set_data_ptr_noswap(s->allocator()->allocate(size_t(bytes)));
    s->set_nbytes(size_t(bytes));
    gatheredBytes_ += bytes;
  } else {
    // Every parameter of the unit is a view of this storage: freeing it
    // frees them (their autograd-saved references included).
    s->set_data_ptr_noswap(at::DataPtr(nullptr, s->device()));
    s->set_nbytes(0);
    gatheredBytes_ -= bytes;
  }
  unit.gathered = allocate;
}

void ZeroOptimizer::gatherUnits(int64_t first, int64_t last) {
  if (units_.empty())
    return;
  at::NoGradGuard noGrad;
  first = std::max<int64_t>(first, 0);
  last = std::min<int64_t>(last, int64_t(units_.size()) - 1);
  for (int64_t u = first; u <= last; ++u) {
    Unit &unit = units_[u];
    if (unit.gathered)
      settle(unit);
    if (unit.gathered || unit.params == 0)
      continue;
    if (hostUpdate_) // this rank's run of it updated
      awaitHostUpdate(unitJobs_[size_t(u)]);
    allocateUnit(unit, true);
    gatherSent_ += fillFromRuns(comm_, rank_, shard_, unit.begin, unit.end,
                                paramShard_, unit.flat);
  }
}

void ZeroOptimizer::prefetchUnit(int64_t u) {
  if (u < 0 || u >= int64_t(units_.size()))
    return;
  Unit &unit = units_[u];
  if (unit.gathered || unit.params == 0)
    return;
  at::NoGradGuard noGrad;
  if (hostUpdate_)
    awaitHostUpdate(unitJobs_[size_t(u)]);
  allocateUnit(unit, true);
  // Begun, one broadcast per owning rank, in the same order on every rank.
  gatherSent_ += fillFromRuns(comm_, rank_, shard_, unit.begin, unit.end,
                              paramShard_, unit.flat, &unit.tickets);
}

void ZeroOptimizer::gatherForward(int64_t first, int64_t last, int64_t next) {
  gatherUnits(first, last);
  if (release_ && *prefetch_ && !stepKeepsWhole_ && wholeDepth_ == 0)
    prefetchUnit(next);
}

void ZeroOptimizer::freeGathered() {
  for (Unit &u : units_)
    allocateUnit(u, false);
}

void ZeroOptimizer::forwardDone(int64_t first, int64_t last,
                                const at::Tensor &out, bool backwardReads) {
  if (units_.empty() || !release_)
    return;
  for (int64_t u = std::max<int64_t>(first, 0);
       u <= std::min<int64_t>(last, int64_t(units_.size()) - 1); ++u) {
    allocateUnit(units_[u], false);
    units_[u].hooked = backwardReads && out.requires_grad();
  }
  if (!out.requires_grad())
    return;
  // The gradient of `out` is whole once every unit above has run its
  // backward (the backbone is a chain): those are freed here — in a
  // partial backward (the cosine probe), which releases no gradient, this
  // is what frees them — and these gathered.
  // The one below is begun here too (FSDP's backward prefetch) when its
  // own hook will gather it: it arrives while these run their backward.
  std::shared_ptr<ZeroOptimizer *> owner = self_;
  std::shared_ptr<bool> on = gatherHooks_, prefetch = prefetch_;
  const_cast<at::Tensor &>(out).register_hook(
      [owner, on, prefetch, first, last, backwardReads](const at::Tensor &) {
        ZeroOptimizer *z = *owner;
        if (!z || !*on)
          return;
        for (int64_t u = last + 1; u < int64_t(z->units_.size()); ++u)
          z->allocateUnit(z->units_[u], false);
        if (backwardReads)
          z->gatherUnits(first, last);
        const int64_t below = first - 1;
        if (*prefetch && below >= 0 && below < int64_t(z->units_.size()) &&
            z->units_[below].hooked)
          z->prefetchUnit(below);
      });
}

void ZeroOptimizer::gatherAll() {
  settleParameters();
  if (masters_.defined()) {
    if (wholeDepth_++ > 0)
      return;
    at::NoGradGuard noGrad;
    for (int64_t i : half_) {
      at::Tensor p = params_[i];
      halfKept_.push_back(p.detach());
      p.set_data(wholeFromRuns(masters_, i).view(p.sizes()).to(p.device()));
    }
    return;
  }
  if (units_.empty())
    return;
  ++wholeDepth_;
  gatherUnits(0, int64_t(units_.size()) - 1);
}

void ZeroOptimizer::freeAll() {
  if (masters_.defined()) {
    if (wholeDepth_ <= 0 || --wholeDepth_ > 0)
      return;
    at::NoGradGuard noGrad;
    for (size_t k = 0; k < half_.size(); ++k) {
      at::Tensor p = params_[half_[k]];
      p.set_data(halfKept_[k]);
    }
    halfKept_.clear();
    return;
  }
  if (units_.empty())
    return;
  if (--wholeDepth_ <= 0) {
    wholeDepth_ = 0;
    if (!stepKeepsWhole_)
      freeGathered();
  }
}

std::function<void(int64_t, bool, int64_t)> ZeroOptimizer::aroundUnit() {
  std::shared_ptr<ZeroOptimizer *> owner = self_;
  return [owner](int64_t u, bool before, int64_t next) {
    ZeroOptimizer *z = *owner;
    if (!z || z->units_.empty() || u < 0 || u >= int64_t(z->units_.size()))
      return;
    if (before) {
      z->gatherUnits(u, u);
      // Every rank runs the same pass: the same gathers in the same order.
      // Two units whole at a time (the evaluation's plan counts them).
      if (next >= 0 && z->wholeDepth_ == 0 && !z->stepKeepsWhole_)
        z->prefetchUnit(next);
    } else if (z->wholeDepth_ == 0 && !z->stepKeepsWhole_)
      z->allocateUnit(z->units_[u], false);
  };
}

bool ZeroOptimizer::runFinite() {
  settleParameters();
  return noRankBad(paramShard_.defined() &&
                   !at::isfinite(paramShard_).all().item<bool>());
}

int64_t ZeroOptimizer::indexOf(const at::Tensor &param) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].unsafeGetTensorImpl() == param.unsafeGetTensorImpl())
      return int64_t(i);
  return -1;
}

void ZeroOptimizer::copyIntoRun(at::Tensor run, int64_t i,
                                const at::Tensor &values) const {
  const at::Tensor flat = values.reshape({-1}).to(run.device());
  const int64_t lo = rank_ * shard_, hi = std::min(total_, lo + shard_);
  const int64_t a = std::max(lo, offset_[i]);
  const int64_t e = std::min(hi, offset_[i] + params_[i].numel());
  if (a < e)
    run.narrow(0, a - lo, e - a).copy_(flat.narrow(0, a - offset_[i], e - a));
}

at::Tensor ZeroOptimizer::wholeFromRuns(const at::Tensor &run, int64_t i) {
  const int64_t n = params_[i].numel();
  if (world_ <= 1)
    return run.narrow(0, offset_[i], n).clone();
  at::Tensor whole = at::empty(
      {n}, at::TensorOptions().dtype(at::kFloat).device(comm_->device()));
  fillFromRuns(comm_, rank_, shard_, offset_[i], offset_[i] + n, run, whole);
  return whole;
}

at::Tensor ZeroOptimizer::hostValues(const at::Tensor &param) {
  at::NoGradGuard noGrad;
  settleParameters();
  if (masters_.defined()) {
    // Outside gatherAll a 16-bit parameter's values are its master's.
    const int64_t i = indexOf(param);
    if (i >= 0 && param.scalar_type() != at::kFloat)
      return wholeFromRuns(masters_, i).view(param.sizes()).to(at::kCPU);
    return param.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  }
  const int64_t i = units_.empty() ? -1 : indexOf(param);
  if (i < 0 || unitOf_[i] < 0 || units_[unitOf_[i]].gathered)
    return param.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  return wholeFromRuns(paramShard_, i).view(param.sizes()).to(at::kCPU);
}

void ZeroOptimizer::setValues(const at::Tensor &param,
                              const at::Tensor &values) {
  at::NoGradGuard noGrad;
  settleParameters();
  if (masters_.defined()) {
    if (wholeDepth_ > 0)
      throw std::logic_error(
          "mtprt: setValues while the masters are held in the parameters");
    // The device's (cut to its dtype) and this rank's run of the masters.
    param.detach().copy_(values);
    if (const int64_t i = indexOf(param); i >= 0)
      copyIntoRun(masters_, i, values);
    return;
  }
  const int64_t i = units_.empty() ? -1 : indexOf(param);
  // A whole one (a head, a frozen layer) in place; every one of the layout
  // in this rank's run too, which the update reads.
  if (i < 0 || unitOf_[i] < 0 || units_[unitOf_[i]].gathered)
    param.detach().copy_(values);
  if (i < 0)
    return;
  copyIntoRun(paramShard_, i, values);
}

} // namespace mtprt
