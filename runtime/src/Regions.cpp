//===- Regions.cpp - checkpoint regions, offload and prefetch -------------===//

#include "mtprt/torch/Regions.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#ifdef MTPRT_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

namespace mtprt {

//===----------------------------------------------------------------------===//
// Checkpoint regions
//===----------------------------------------------------------------------===//

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// The CPU generator's state (and, for a CUDA device, that device's), saved
/// so that a recompute draws what the forward drew.
struct RandomState {
  at::Tensor cpu, cuda;
  int cudaDevice = -1;

  static RandomState capture(const at::Device &device) {
    RandomState r;
    at::Generator cpuGen = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(cpuGen.mutex());
      r.cpu = cpuGen.get_state();
    }
#ifdef MTPRT_TORCH_CUDA
    if (device.is_cuda()) {
      r.cudaDevice = device.has_index() ? device.index()
                                        : at::cuda::current_device();
      at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(r.cudaDevice);
      std::lock_guard<std::mutex> lock(gen.mutex());
      r.cuda = gen.get_state();
    }
#endif
    return r;
  }

  /// Sets the generators to this state; returns the state they had.
  RandomState swapIn() const {
    RandomState was;
    at::Generator cpuGen = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(cpuGen.mutex());
      was.cpu = cpuGen.get_state();
      cpuGen.set_state(cpu);
    }
#ifdef MTPRT_TORCH_CUDA
    if (cudaDevice >= 0) {
      at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(cudaDevice);
      std::lock_guard<std::mutex> lock(gen.mutex());
      was.cudaDevice = cudaDevice;
      was.cuda = gen.get_state();
      gen.set_state(cuda);
    }
#endif
    return was;
  }
};

/// The autocast state a forward ran under, replayed by its recompute so the
/// re-created tensors are the bits (and dtypes) the forward made.
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpuDtype = at::kBFloat16, cudaDtype = at::kHalf;

  static AutocastState capture() {
    AutocastState a;
    a.cpu = at::autocast::is_autocast_enabled(at::kCPU);
    a.cuda = at::autocast::is_autocast_enabled(at::kCUDA);
    a.cpuDtype = at::autocast::get_autocast_dtype(at::kCPU);
    a.cudaDtype = at::autocast::get_autocast_dtype(at::kCUDA);
    return a;
  }
  void set() const {
    at::autocast::set_autocast_enabled(at::kCPU, cpu);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda);
    at::autocast::set_autocast_dtype(at::kCPU, cpuDtype);
    at::autocast::set_autocast_dtype(at::kCUDA, cudaDtype);
  }
  /// f() under this state, the caller's restored after (a throw too); the
  /// casts it cached (weights) are dropped where the caller had autocast
  /// off — the backward — so they are transients of the recompute.
  template <typename F> auto run(F f) const {
    const AutocastState callers = capture();
    set();
    struct Restore {
      const AutocastState &callers;
      ~Restore() {
        callers.set();
        if (!callers.cpu && !callers.cuda)
          at::autocast::clear_cache();
      }
    } restore{callers};
    return f();
  }
};

/// Holds the region's callable in the autograd context.
struct RegionHolder : torch::CustomClassHolder {
  RegionFn fn;
  variable_list params;
  RandomState rng;
  AutocastState autocast;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static variable_list forward(AutogradContext *ctx,
                               c10::intrusive_ptr<RegionHolder> holder,
                               const at::Tensor &x, at::TensorList params) {
    // RNG and autocast state at entry, replayed by the recompute.
    holder->rng = RandomState::capture(x.device());
    holder->autocast = AutocastState::capture();
    at::Tensor out = holder->fn(x);
    ctx->save_for_backward({x});
    ctx->saved_data["region"] = c10::IValue::make_capsule(holder);
    ctx->saved_data["nparams"] = static_cast<int64_t>(params.size());
    return {out};
  }

  static variable_list backward(AutogradContext *ctx, variable_list gradOut) {
    auto holder = c10::static_intrusive_pointer_cast<RegionHolder>(
        ctx->saved_data["region"].toCapsule());
    at::Tensor x = ctx->get_saved_variables()[0];
    at::Tensor xd = x.detach().set_requires_grad(x.requires_grad());

    // Replay with the entry RNG state, then give the caller's stream back.
    const RandomState callers = holder->rng.swapIn();
    at::Tensor out;
    {
      at::AutoGradMode grad(true);
      out = holder->autocast.run([&] { return holder->fn(xd); });
    }
    callers.swapIn();

    // Inputs of the inner graph whose gradients this backward needs: x, then
    // the parameters. A partial backward (autograd::grad to some inputs, as
    // the cosine probe's) asks only for some: the rest are not computed.
    const int64_t nparams = ctx->saved_data["nparams"].toInt();
    variable_list inputs;
    std::vector<int64_t> slot; // position in the returned list
    if (xd.requires_grad() && ctx->needs_input_grad(0)) {
      inputs.push_back(xd);
      slot.push_back(1);
    }
    const variable_list &ps = holder->params;
    for (int64_t i = 0; i < nparams; ++i)
      if (ps[i].requires_grad() && ctx->needs_input_grad(1 + i)) {
        inputs.push_back(ps[i]);
        slot.push_back(2 + i);
      }
    variable_list result(2 + nparams);
    if (!inputs.empty() && out.requires_grad()) {
      variable_list grads = torch::autograd::grad({out}, inputs, {gradOut[0]},
                                                  /*retain_graph=*/false,
                                                  /*create_graph=*/false,
                                                  /*allow_unused=*/true);
      for (size_t i = 0; i < grads.size(); ++i)
        result[slot[i]] = grads[i];
    }
    return result;
  }
};

} // namespace

at::Tensor checkpoint(const RegionFn &fn, const at::Tensor &x,
                      const std::vector<at::Tensor> &params) {
  auto holder = c10::make_intrusive<RegionHolder>();
  holder->fn = fn;
  holder->params = params;
  return CheckpointFunction::apply(holder, x, at::TensorList(params))[0];
}

//===----------------------------------------------------------------------===//
// Host pool
//===----------------------------------------------------------------------===//

namespace {

std::atomic<int64_t> hostPoolCurrent{0};

/// Freed host buffers, kept for reuse: offloaded shapes repeat every step, and
/// cudaHostAlloc costs milliseconds (and synchronizes) per call. Never shrinks
/// on its own; releaseHostPoolCache() returns the idle buffers.
struct HostCache {
  std::mutex mutex;
  std::multimap<int64_t, void *> idle[2]; // [pinned]
  int64_t reserved = 0;

  static HostCache &get() {
    static auto *cache = new HostCache; // leaked: buffers may outlive statics
    return *cache;
  }

  void *take(int64_t bytes, bool pinned) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      // Reuse the smallest idle buffer that fits and wastes at most half.
      auto it = idle[pinned].lower_bound(bytes);
      if (it != idle[pinned].end() && it->first <= 2 * bytes) {
        void *p = it->second;
        sizes[p] = it->first;
        idle[pinned].erase(it);
        return p;
      }
    }
    void *p = nullptr;
#ifdef MTPRT_TORCH_CUDA
    if (pinned && cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess)
      throw std::runtime_error("mtprt: offload: cudaHostAlloc of " +
                               std::to_string(bytes) + " bytes failed");
#endif
    if (!pinned && !(p = std::malloc(bytes > 0 ? bytes : 1)))
      throw std::runtime_error("mtprt: offload: host pool allocation of " +
                               std::to_string(bytes) + " bytes failed");
    std::lock_guard<std::mutex> lock(mutex);
    sizes[p] = bytes;
    reserved += bytes;
    return p;
  }

  void give(void *p, bool pinned) {
    std::lock_guard<std::mutex> lock(mutex);
    idle[pinned].emplace(sizes.at(p), p);
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    for (int pinned = 0; pinned < 2; ++pinned) {
      for (auto &[bytes, p] : idle[pinned]) {
        reserved -= bytes;
        sizes.erase(p);
#ifdef MTPRT_TORCH_CUDA
        if (pinned) {
          cudaFreeHost(p);
          continue;
        }
#endif
        std::free(p);
      }
      idle[pinned].clear();
    }
  }

  std::unordered_map<void *, int64_t> sizes; ///< capacity of every buffer
};

/// A host-pool buffer shaped like `like` (contiguous). Outside the CPU
/// tracking allocator; pinned when the source is on a CUDA device.
at::Tensor hostBuffer(const at::Tensor &like,
                      const std::shared_ptr<std::atomic<int64_t>> &peak) {
  const int64_t bytes =
      like.numel() * static_cast<int64_t>(like.element_size());
  const bool pinned = like.is_cuda();
  void *ptr = HostCache::get().take(bytes, pinned);
  int64_t now = hostPoolCurrent.fetch_add(bytes) + bytes;
  int64_t seen = peak->load();
  while (now > seen && !peak->compare_exchange_weak(seen, now)) {
  }
  auto deleter = [bytes, pinned](void *p) {
    hostPoolCurrent.fetch_sub(bytes);
    HostCache::get().give(p, pinned);
  };
  return at::from_blob(
      ptr, like.sizes(), deleter,
      at::TensorOptions().dtype(like.dtype()).device(at::kCPU));
}

} // namespace

at::Tensor hostPoolTensor(int64_t numel, at::ScalarType dtype, bool pinned) {
  const int64_t bytes = numel * int64_t(c10::elementSize(dtype));
  void *ptr = HostCache::get().take(bytes, pinned);
  hostPoolCurrent.fetch_add(bytes);
  auto deleter = [bytes, pinned](void *p) {
    hostPoolCurrent.fetch_sub(bytes);
    HostCache::get().give(p, pinned);
  };
  return at::from_blob(ptr, {numel}, deleter,
                       at::TensorOptions().dtype(dtype).device(at::kCPU));
}

int64_t hostPoolReservedBytes() {
  HostCache &c = HostCache::get();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.reserved;
}

void releaseHostPoolCache() { HostCache::get().release(); }

int64_t hostPoolBytes() { return hostPoolCurrent.load(); }

//===----------------------------------------------------------------------===//
// Offloader
//===----------------------------------------------------------------------===//

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// One saved tensor under an offload scope.
struct Entry {
  enum class State { Kept, Offloading, OnHost, Fetching, Fetched };
  State state = State::Kept;
  std::string group;
  int64_t bytes = 0;
  at::Tensor device;  ///< until the offload copy completes (or kept)
  at::Tensor host;    ///< the host-pool copy
  at::Tensor fetched; ///< the device copy a prefetch brought back
  at::Device origin = at::kCPU;
  /// Saved variables sharing this copy (e.g. log-probabilities saved by both
  /// log_softmax and nll_loss), and how many have yet to unpack this round.
  int64_t users = 1, unpacksLeft = 1;
  /// Weak, so a freed and reused allocation never matches a new tensor.
  c10::weak_intrusive_ptr<c10::StorageImpl> storage{
      c10::intrusive_ptr<c10::StorageImpl>()};
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
#ifdef MTPRT_TORCH_CUDA
  std::shared_ptr<at::cuda::CUDAEvent> offloaded, ready;
#endif
};

} // namespace

struct Offloader::Impl {
  OffloadOptions options;
  mutable std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::function<void()>> queue;
  bool busy = false, stopping = false;
  std::thread worker;
  std::map<std::string, std::vector<std::weak_ptr<Entry>>> groups;
  OffloadStats counters;
  std::shared_ptr<std::atomic<int64_t>> hostPeak =
      std::make_shared<std::atomic<int64_t>>(0);
  std::vector<OffloadRecord> records;

  Impl() {
    worker = std::thread([this] { run(); });
  }
  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    changed.notify_all();
    worker.join();
  }

  void run() {
    at::NoGradGuard noGrad;
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      changed.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty())
        return;
      auto task = std::move(queue.front());
      queue.pop_front();
      busy = true;
      lock.unlock();
      task();
      lock.lock();
      busy = false;
      changed.notify_all();
    }
  }

  void submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      queue.push_back(std::move(task));
    }
    changed.notify_all();
  }

  std::atomic<double> copyDelayS{0.0};
  void delay() const {
    const double d = copyDelayS.load();
    if (d > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(d));
  }

  std::shared_ptr<Entry> pack(std::shared_ptr<Entry> e, const at::Tensor &t,
                              bool keep);
  void startFetch(const std::shared_ptr<Entry> &e); // mutex held
  at::Tensor unpack(const std::shared_ptr<Entry> &e);
};

namespace {

struct ScopeFrame {
  std::shared_ptr<Offloader::Impl> impl;
  std::string group;
  std::vector<at::Tensor> keep;
};
thread_local std::vector<ScopeFrame> scopeStack;

class OffloadHooks final : public torch::autograd::SavedVariableHooks {
public:
  OffloadHooks(std::shared_ptr<Offloader::Impl> impl, std::string group,
               const std::vector<at::Tensor> *keep)
      : impl_(std::move(impl)), entry_(std::make_shared<Entry>()), keep_(keep) {
    entry_->group = std::move(group);
  }
  void call_pack_hook(const at::Tensor &tensor) override {
    // keep_ is only read here, while the scope (and its frame) is alive.
    bool kept = false;
    for (const at::Tensor &k : *keep_)
      kept |= k.defined() && tensor.storage().is_alias_of(k.storage());
    keep_ = nullptr;
    entry_ = impl_->pack(entry_, tensor, kept);
  }
  at::Tensor call_unpack_hook() override { return impl_->unpack(entry_); }

private:
  std::shared_ptr<Offloader::Impl> impl_;
  std::shared_ptr<Entry> entry_;
  const std::vector<at::Tensor> *keep_;
};

thread_local std::vector<std::shared_ptr<Recomputed::Impl>> recomputeStack;
std::unique_ptr<torch::autograd::SavedVariableHooks>
recomputeHooks(std::shared_ptr<Recomputed::Impl> impl);

/// The autograd engine with C++ default saved-tensor hooks.
class HookingEngine final : public torch::autograd::Engine {
public:
  static Engine &get() {
    static HookingEngine engine;
    return engine;
  }
  std::unique_ptr<torch::autograd::SavedVariableHooks>
  get_default_saved_variable_hooks() override {
    // A block recomputed at tensor grain is never offloaded too: its scope
    // is the only one alive while it runs.
    if (!recomputeStack.empty())
      return recomputeHooks(recomputeStack.back());
    if (scopeStack.empty())
      return nullptr;
    const ScopeFrame &top = scopeStack.back();
    return std::make_unique<OffloadHooks>(top.impl, top.group, &top.keep);
  }
};

void installHookingEngine() {
  static std::once_flag once;
  std::call_once(once, [] {
    torch::autograd::set_default_engine_stub(&HookingEngine::get);
  });
}

} // namespace

std::shared_ptr<Entry> Offloader::Impl::pack(std::shared_ptr<Entry> e,
                                             const at::Tensor &t, bool keep) {
  at::Tensor data = t.detach();
  e->origin = data.device();
  e->bytes = data.numel() * static_cast<int64_t>(data.element_size());
  // Parameters live on the device anyway (W.t() too); tiny tensors are not
  // worth a copy. Tensors without grad (dropout masks, ids) are activations
  // like any other.
  const auto isParameter = [](const at::TensorBase &v) {
    return v.requires_grad() && v.is_leaf();
  };
  const bool parameter = isParameter(t) || (t.is_view() && isParameter(t._base()));
  if (keep || parameter || e->bytes < options.minBytes) {
    e->state = Entry::State::Kept;
    e->device = data;
    return e;
  }
  e->storage = data.storage().getWeakStorageImpl();
  e->sizes = data.sizes().vec();
  e->strides = data.strides().vec();
  e->offset = data.storage_offset();
  {
    // The same tensor saved twice in a group shares one copy.
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto &weak : groups[e->group])
      if (auto other = weak.lock())
        if (other->state != Entry::State::Kept &&
            other->storage.lock().get() ==
                data.storage().unsafeGetStorageImpl() &&
            other->sizes == e->sizes && other->strides == e->strides &&
            other->offset == e->offset) {
          other->users += 1;
          other->unpacksLeft += 1;
          return other;
        }
  }
  e->host = hostBuffer(data, hostPeak);
  {
    std::lock_guard<std::mutex> lock(mutex);
    e->state = Entry::State::Offloading;
    counters.offloadedTensors += 1;
    counters.offloadedBytes += e->bytes;
    groups[e->group].push_back(e);
  }
#ifdef MTPRT_TORCH_CUDA
  if (data.is_cuda()) {
    // Copy on a low-priority side stream after the producer; the caching
    // allocator may reuse the device block once that copy is done.
    auto compute = at::cuda::getCurrentCUDAStream(data.get_device());
    auto side = at::cuda::getStreamFromPool(/*isHighPriority=*/false,
                                            data.get_device());
    at::cuda::CUDAEvent produced;
    produced.record(compute);
    produced.block(side);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      e->host.copy_(data, /*non_blocking=*/true);
    }
    c10::cuda::CUDACachingAllocator::recordStream(data.storage().data_ptr(),
                                                  side);
    e->offloaded = std::make_shared<at::cuda::CUDAEvent>();
    e->offloaded->record(side);
    std::lock_guard<std::mutex> lock(mutex);
    e->state = Entry::State::OnHost;
    return e;
  }
#endif
  e->device = data;
  submit([this, e] {
    delay();
    e->host.copy_(e->device);
    at::Tensor drop;
    {
      std::lock_guard<std::mutex> lock(mutex);
      drop = std::move(e->device);
      if (e->state == Entry::State::Offloading)
        e->state = Entry::State::OnHost;
    }
    drop.reset(); // frees the device copy (outside the lock)
  });
  return e;
}

void Offloader::Impl::startFetch(const std::shared_ptr<Entry> &e) {
  if (e->state != Entry::State::Offloading && e->state != Entry::State::OnHost)
    return;
  e->state = Entry::State::Fetching;
#ifdef MTPRT_TORCH_CUDA
  if (e->origin.is_cuda()) {
    auto side = at::cuda::getStreamFromPool(false, e->origin.index());
    c10::cuda::CUDAStreamGuard guard(side);
    e->offloaded->block(side);
    e->fetched =
        at::empty(e->host.sizes(), e->host.options().device(e->origin));
    e->fetched.copy_(e->host, /*non_blocking=*/true);
    e->ready = std::make_shared<at::cuda::CUDAEvent>();
    e->ready->record(side);
    return;
  }
#endif
  // The queue is FIFO, so this runs after the entry's offload copy.
  queue.push_back([this, e] {
    delay();
    at::Tensor t =
        at::empty(e->host.sizes(), e->host.options().device(e->origin));
    t.copy_(e->host);
    std::lock_guard<std::mutex> lock(mutex);
    e->fetched = std::move(t);
    e->state = Entry::State::Fetched;
  });
  changed.notify_all();
}

at::Tensor Offloader::Impl::unpack(const std::shared_ptr<Entry> &e) {
  if (e->state == Entry::State::Kept)
    return e->device;
  const auto start = Clock::now();
  OffloadRecord rec{e->group, e->bytes, false, 0.0};
  at::Tensor out;
#ifdef MTPRT_TORCH_CUDA
  if (e->origin.is_cuda()) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      startFetch(e); // no-op when prefetched
    }
    rec.hit = e->ready->query();
    if (!rec.hit)
      e->ready->synchronize(); // measures the wait; the stream wait follows
    auto compute = at::cuda::getCurrentCUDAStream(e->origin.index());
    e->ready->block(compute);
    out = e->fetched;
    c10::cuda::CUDACachingAllocator::recordStream(out.storage().data_ptr(),
                                                  compute);
    std::lock_guard<std::mutex> lock(mutex);
    if (--e->unpacksLeft == 0) {
      e->fetched.reset();
      e->unpacksLeft = e->users;
      e->state = Entry::State::OnHost;
    }
    rec.waitS = rec.hit ? 0.0 : seconds(start, Clock::now());
    (rec.hit ? counters.hits : counters.misses) += 1;
    counters.waitS += rec.waitS;
    records.push_back(rec);
    return out;
  }
#endif
  std::unique_lock<std::mutex> lock(mutex);
  rec.hit = e->state == Entry::State::Fetched;
  if (!rec.hit) {
    startFetch(e);
    changed.wait(lock, [&] { return e->state == Entry::State::Fetched; });
    rec.waitS = seconds(start, Clock::now());
  }
  out = e->fetched;
  // The device copy is dropped once every saved variable sharing it has
  // unpacked; the host copy stays until they die (a retained graph may unpack
  // again, then fetched at use).
  if (--e->unpacksLeft == 0) {
    e->fetched.reset();
    e->unpacksLeft = e->users;
    e->state = Entry::State::OnHost;
  }
  (rec.hit ? counters.hits : counters.misses) += 1;
  counters.waitS += rec.waitS;
  records.push_back(rec);
  return out;
}

Offloader::Offloader(OffloadOptions options) : impl_(std::make_shared<Impl>()) {
  if (options.copyDelayS < 0)
    throw std::invalid_argument(
        "mtprt: OffloadOptions.copyDelayS must be >= 0");
  impl_->options = options;
  impl_->copyDelayS = options.copyDelayS;
  impl_->hostPeak->store(hostPoolBytes());
  installHookingEngine();
}

Offloader::~Offloader() { synchronize(); }

Offloader::Scope::Scope(Offloader &offloader, std::string group,
                        std::vector<at::Tensor> keep) {
  scopeStack.push_back({offloader.impl_, std::move(group), std::move(keep)});
}

Offloader::Scope::~Scope() { scopeStack.pop_back(); }

namespace {
/// The entries of `group` — or, where no group has that name, of every
/// "group/<micro-batch>" (the trainer names a unit's offloaded tensors per
/// micro-batch: "unit5/2"; the API's "unit5" means all of them). The
/// caller holds the mutex.
std::vector<std::weak_ptr<Entry>>
groupEntries(const std::map<std::string, std::vector<std::weak_ptr<Entry>>> &groups,
             const std::string &group) {
  if (auto it = groups.find(group); it != groups.end())
    return it->second;
  std::vector<std::weak_ptr<Entry>> out;
  const std::string prefix = group + "/";
  for (auto it = groups.lower_bound(prefix);
       it != groups.end() && it->first.rfind(prefix, 0) == 0; ++it)
    out.insert(out.end(), it->second.begin(), it->second.end());
  return out;
}
} // namespace

void Offloader::prefetch(const std::string &group) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (const auto &weak : groupEntries(impl_->groups, group))
    if (auto e = weak.lock())
      impl_->startFetch(e);
}

void Offloader::waitOffloaded(const std::string &group) {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  for (const auto &weak : groupEntries(impl_->groups, group)) {
    auto e = weak.lock();
    if (!e)
      continue;
#ifdef MTPRT_TORCH_CUDA
    if (e->origin.is_cuda()) {
      e->offloaded->synchronize();
      continue;
    }
#endif
    impl_->changed.wait(lock,
                        [&] { return e->state != Entry::State::Offloading; });
  }
}

void Offloader::synchronize() {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->changed.wait(lock,
                      [&] { return impl_->queue.empty() && !impl_->busy; });
}

void Offloader::setCopyDelay(double seconds) {
  if (seconds < 0)
    throw std::invalid_argument("mtprt: copy delay must be >= 0");
  impl_->copyDelayS = seconds;
}

OffloadStats Offloader::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  OffloadStats s = impl_->counters;
  s.hostBytes = hostPoolBytes();
  s.hostPeakBytes = std::max(impl_->hostPeak->load(), s.hostBytes);
  return s;
}

std::vector<OffloadRecord> Offloader::records() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->records;
}

void Offloader::resetStats() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->counters = {};
  impl_->records.clear();
  impl_->hostPeak->store(hostPoolBytes());
  for (auto it = impl_->groups.begin(); it != impl_->groups.end();) {
    auto &v = it->second;
    v.erase(std::remove_if(
                v.begin(), v.end(),
                [](const std::weak_ptr<Entry> &w) { return w.expired(); }),
            v.end());
    it = v.empty() ? impl_->groups.erase(it) : std::next(it);
  }
}

//===----------------------------------------------------------------------===//
// Tensor grain
//===----------------------------------------------------------------------===//

namespace {
std::atomic<int64_t> recomputeRuns{0};
} // namespace

struct Recomputed::Impl {
  Fn fn;
  RandomState rng;
  AutocastState autocast;
  std::mutex mutex;
  /// Per registered tensor: its storage (weak: a freed and reused allocation
  /// never matches), the saved uses that hold it, the unpacks left this
  /// round, and the re-created tensor while some are left.
  struct Slot {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage{
        c10::intrusive_ptr<c10::StorageImpl>()};
    int64_t users = 0, left = 0;
    at::Tensor recomputed;
    /// Its version at registration: a saved use of a tensor written in place
    /// since would re-create what it was, not what it is.
    int64_t version = 0;
  };
  std::vector<Slot> slots;

  int find(const at::Tensor &t) {
    if (!t.has_storage())
      return -1;
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].storage.lock().get() == t.storage().unsafeGetStorageImpl()) {
        if (t._version() != slots[i].version)
          throw std::logic_error(
              "mtprt: a tensor-grain block saves a projection output that "
              "was written in place after it was made; it cannot be "
              "re-created (run the block kept)");
        slots[i].users += 1;
        slots[i].left += 1;
        return static_cast<int>(i);
      }
    return -1;
  }

  at::Tensor unpack(int i, at::IntArrayRef sizes, at::IntArrayRef strides,
                    int64_t offset) {
    std::lock_guard<std::mutex> lock(mutex);
    Slot &slot = slots[i];
    if (!slot.recomputed.defined()) {
      // One re-run re-creates every registered tensor still to be unpacked.
      std::vector<at::Tensor> outs;
      {
        at::NoGradGuard noGrad;
        const RandomState callers = rng.swapIn();
        try {
          outs = autocast.run(fn);
        } catch (...) {
          callers.swapIn();
          throw;
        }
        callers.swapIn();
      }
      recomputeRuns += 1;
      if (outs.size() != slots.size())
        throw std::logic_error(
            "mtprt: tensor-grain recompute returned " +
            std::to_string(outs.size()) + " tensors for " +
            std::to_string(slots.size()) + " registered");
      for (size_t j = 0; j < slots.size(); ++j)
        if (slots[j].left > 0 && !slots[j].recomputed.defined())
          slots[j].recomputed = outs[j];
    }
    at::Tensor out = slot.recomputed.as_strided(sizes, strides, offset);
    if (--slot.left <= 0) {
      slot.recomputed.reset();
      slot.left = slot.users; // a retained graph unpacks again
    }
    return out;
  }
};

namespace {

class RecomputeHooks final : public torch::autograd::SavedVariableHooks {
public:
  explicit RecomputeHooks(std::shared_ptr<Recomputed::Impl> impl)
      : impl_(std::move(impl)) {}
  void call_pack_hook(const at::Tensor &tensor) override {
    index_ = impl_->find(tensor);
    if (index_ < 0) {
      kept_ = tensor.detach();
      return;
    }
    sizes_ = tensor.sizes().vec();
    strides_ = tensor.strides().vec();
    offset_ = tensor.storage_offset();
  }
  at::Tensor call_unpack_hook() override {
    if (index_ < 0)
      return kept_;
    return impl_->unpack(index_, sizes_, strides_, offset_);
  }

private:
  std::shared_ptr<Recomputed::Impl> impl_;
  int index_ = -1;
  at::Tensor kept_;
  std::vector<int64_t> sizes_, strides_;
  int64_t offset_ = 0;
};

std::unique_ptr<torch::autograd::SavedVariableHooks>
recomputeHooks(std::shared_ptr<Recomputed::Impl> impl) {
  return std::make_unique<RecomputeHooks>(std::move(impl));
}

} // namespace

Recomputed::Recomputed(Fn recompute, const at::Device &device)
    : impl_(std::make_shared<Impl>()) {
  impl_->fn = std::move(recompute);
  impl_->rng = RandomState::capture(device);
  impl_->autocast = AutocastState::capture();
  installHookingEngine();
}

void Recomputed::add(const at::Tensor &t) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Impl::Slot slot;
  slot.storage = t.storage().getWeakStorageImpl();
  slot.version = t._version();
  impl_->slots.push_back(std::move(slot));
}

Recomputed::Scope::Scope(Recomputed &recomputed) {
  recomputeStack.push_back(recomputed.impl_);
}

Recomputed::Scope::~Scope() { recomputeStack.pop_back(); }

int64_t Recomputed::runs() { return recomputeRuns.load(); }

} // namespace mtprt
