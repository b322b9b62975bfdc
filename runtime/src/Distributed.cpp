//===- Distributed.cpp - c10d process groups, GSC gradient exchange -------===//

#include "mtprt/torch/Distributed.h"

#include "mtprt/kernels/BlockQuant.h"
#include "mtprt/kernels/Specialized.h"

// No gloo here: the gloo process group is made in DistributedGloo.cpp.
#include <atomic>
#include <chrono>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#if defined(MTPRT_TORCH_CUDA) && defined(MTPRT_HAVE_CUDA_KERNELS)
#include <ATen/cuda/CUDAContext.h>
#endif

#include <c10/util/Logging.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

namespace mtprt {

namespace detail {
// DistributedGloo.cpp: the one translation unit that sees gloo's headers.
c10::intrusive_ptr<c10d::Backend>
makeGlooBackend(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                int world, std::chrono::milliseconds timeout,
                const std::string &masterAddr);
#ifdef MTPRT_HAVE_NCCL
c10::intrusive_ptr<c10d::Backend>
makeNcclBackend(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                int world, std::chrono::milliseconds timeout);
#endif
} // namespace detail

namespace {

int envInt(const char *name, int fallback, int lo, int hi) {
  const char *v = std::getenv(name);
  if (!v || !*v)
    return fallback;
  char *end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end || x < lo || x > hi)
    throw std::invalid_argument(std::string("mtprt: environment variable ") +
                                name + "='" + v + "' is not an integer in [" +
                                std::to_string(lo) + ", " + std::to_string(hi) +
                                "]");
  return static_cast<int>(x);
}

/// An exception's message on one line: LibTorch's without its backtrace,
/// line breaks folded.
std::string oneLine(const std::exception &e) {
  const auto *c10 = dynamic_cast<const c10::Error *>(&e);
  std::string m = c10 ? c10->what_without_backtrace() : e.what();
  while (!m.empty() && (m.back() == '\n' || m.back() == ' '))
    m.pop_back();
  for (size_t i = 0; (i = m.find('\n', i)) != std::string::npos;)
    m.replace(i, 1, "; ");
  return m;
}

/// Quiets c10's own log lines (the TCPStore's connect errors and retry
/// warnings, a line per attempt) while a rank joins: a failed join is
/// reported once, as the exception. TORCH_CPP_LOG_LEVEL, when the user sets
/// it, wins.
class QuietC10Log {
public:
  QuietC10Log() : active_(!std::getenv("TORCH_CPP_LOG_LEVEL")) {
    if (active_) {
      saved_ = FLAGS_caffe2_log_level;
      FLAGS_caffe2_log_level = 3; // FATAL only
    }
  }
  /// Leaves the level quiet: the join was abandoned and its thread may
  /// still retry, while the process reports its error and exits.
  void keep() { active_ = false; }
  ~QuietC10Log() {
    if (active_)
      FLAGS_caffe2_log_level = saved_;
  }

private:
  bool active_;
  int saved_ = 0;
};

} // namespace

DistOptions distOptionsFromEnv(DistOptions d) {
  d.rank = envInt("RANK", d.rank, 0, 1 << 20);
  d.worldSize = envInt("WORLD_SIZE", d.worldSize, 1, 1 << 20);
  if (const char *a = std::getenv("MASTER_ADDR"); a && *a)
    d.masterAddr = a;
  d.masterPort = envInt("MASTER_PORT", d.masterPort, 1, 65535);
  return d;
}

//===----------------------------------------------------------------------===//
// Communicator
//===----------------------------------------------------------------------===//

struct Communicator::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  /// Sends in flight: peer, tag, the work and its tensor (send returns
  /// before they finish).
  struct Send {
    int peer, tag;
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor tensor;
  };
  std::vector<Send> sends;
  /// Collectives begun and not yet waited for (broadcastAsync's tickets).
  struct Started {
    c10::intrusive_ptr<c10d::Work> work;
    const char *op;
  };
  std::unordered_map<int64_t, Started> started;
  int64_t nextTicket = 1;
};

Communicator::Communicator(const DistOptions &o, bool serveStore)
    : options_(o), impl_(std::make_unique<Impl>()) {
  if (o.worldSize < 1)
    throw std::invalid_argument("mtprt: world size must be >= 1, got " +
                                std::to_string(o.worldSize));
  if (o.rank < 0 || o.rank >= o.worldSize)
    throw std::invalid_argument("mtprt: rank " + std::to_string(o.rank) +
                                " is not in [0, " +
                                std::to_string(o.worldSize) + ")");
  if (o.masterPort < 1 || o.masterPort > 65535)
    throw std::invalid_argument("mtprt: master port " +
                                std::to_string(o.masterPort) +
                                " is not in [1, 65535]");
  if (o.worldSize == 1 && !o.alwaysGroup)
    return; // docs/contracts.md#compression-gsc: at world size 1 the collective does nothing
  const bool cuda = o.device.rfind("cuda", 0) == 0;
#ifndef MTPRT_HAVE_NCCL
  if (cuda)
    throw std::invalid_argument("mtprt: device " + o.device +
                                " needs the NCCL process group, and this "
                                "runtime was built without LibTorch-CUDA");
#endif
  const std::chrono::milliseconds timeout(int64_t(o.timeoutS) * 1000);
  const std::string where = o.masterAddr + ":" + std::to_string(o.masterPort);
  const std::string who = "mtprt: rank " + std::to_string(o.rank) + " of " +
                          std::to_string(o.worldSize) +
                          " could not join the process group at " + where;
  // The join runs on a thread of its own and the constructor waits for it
  // up to the timeout: c10d's TCPStore retries a connect that timed out once
  // more (about twice the timeout in all), and a master that accepted the
  // connection but never answers (a stopped process) leaves its ping
  // waiting forever. An abandoned join keeps its thread, blocked, until the
  // process exits with this error.
  struct Join {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
    c10::intrusive_ptr<c10d::Store> store;
    c10::intrusive_ptr<c10d::Backend> backend;
  };
  auto join = std::make_shared<Join>();
  QuietC10Log quiet;
  std::thread([join, o, serveStore, timeout, cuda] {
    c10::intrusive_ptr<c10d::Store> store;
    c10::intrusive_ptr<c10d::Backend> backend;
    std::exception_ptr error;
    try {
      c10d::TCPStoreOptions so;
      so.port = static_cast<uint16_t>(o.masterPort);
      so.isServer = serveStore && o.rank == 0;
      so.waitWorkers = false;
      so.timeout = timeout;
      store = c10::make_intrusive<c10d::TCPStore>(o.masterAddr, so);
      if (!o.group.empty())
        store = c10::make_intrusive<c10d::PrefixStore>(o.group, store);
#ifdef MTPRT_HAVE_NCCL
      if (cuda)
        backend = detail::makeNcclBackend(store, o.rank, o.worldSize, timeout);
#else
      (void)cuda;
#endif
      if (!backend)
        backend = detail::makeGlooBackend(store, o.rank, o.worldSize, timeout,
                                          o.masterAddr);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(join->m);
    join->store = std::move(store);
    join->backend = std::move(backend);
    join->error = error;
    join->done = true;
    join->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(join->m);
  if (!join->cv.wait_for(lock, timeout, [&] { return join->done; })) {
    quiet.keep();
    throw std::runtime_error(who + ": no answer within the " +
                             std::to_string(o.timeoutS) +
                             " s timeout (--timeout)");
  }
  if (join->error) {
    try {
      std::rethrow_exception(join->error);
    } catch (const std::exception &e) {
      throw std::runtime_error(who + " (timeout " + std::to_string(o.timeoutS) +
                               " s): " + oneLine(e));
    }
  }
  impl_->store = std::move(join->store);
  impl_->backend = std::move(join->backend);
}

Communicator::~Communicator() = default;

namespace {

/// Waits for a collective and for the backend to let go of it: gloo's worker
/// thread drops its reference to the work — and with it the work's tensors —
/// only after the waiter is woken, so without this the buffers of a
/// collective could outlive their last use by a moment, nondeterministically
/// adding to whatever the step allocates next (docs/cost-model.md, "The
/// gradient exchange").
/// (NCCL's watchdog keeps its works for a polling interval: there, and on
/// CUDA memory, only the wait.)
void finish(const c10::intrusive_ptr<c10d::Backend> &backend,
            c10::intrusive_ptr<c10d::Work> work) {
  work->wait();
  if (backend->getBackendName() != "gloo")
    return;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (work.use_count() > 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
}

} // namespace

bool Communicator::active() const { return static_cast<bool>(impl_->backend); }

at::Device Communicator::device() const {
  return options_.device.rfind("cuda", 0) == 0 ? at::Device(options_.device)
                                               : at::Device(at::kCPU);
}

std::string Communicator::backendName() const {
  return impl_->backend ? impl_->backend->getBackendName() : "none";
}

namespace {
/// A collective's failure (a rank died, hung past the timeout, or the
/// network failed) as one line naming the operation and this rank.
[[noreturn]] void collectiveFailed(const DistOptions &o, const char *op,
                                   const std::exception &e) {
  throw std::runtime_error(
      "mtprt: rank " + std::to_string(o.rank) + " of " +
      std::to_string(o.worldSize) + ": the " + op +
      " failed (another rank died or stopped answering within the " +
      std::to_string(o.timeoutS) +
      " s timeout, or the network failed): " + oneLine(e));
}

/// Every communicator's time blocked in a collective, a receive or a send's
/// wait, in this process (the `comm_s` metric).
std::atomic<int64_t> gBusyNs{0};
struct Busy {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~Busy() {
    gBusyNs.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count(),
                      std::memory_order_relaxed);
  }
};
} // namespace

double Communicator::busySeconds() {
  return double(gBusyNs.load(std::memory_order_relaxed)) * 1e-9;
}

void Communicator::allReduceSum(std::vector<at::Tensor> &tensors) {
  if (!impl_->backend)
    return;
  const Busy busy;
  try {
    for (at::Tensor &t : tensors) {
      std::vector<at::Tensor> one{t};
      finish(impl_->backend, impl_->backend->allreduce(one));
    }
  } catch (const std::exception &e) {
    collectiveFailed(options_, "all-reduce", e);
  }
}

std::vector<at::Tensor> Communicator::allGather(const at::Tensor &t) {
  if (!impl_->backend)
    return {t};
  const Busy busy;
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < worldSize(); ++r)
    out[0].push_back(at::empty_like(t));
  std::vector<at::Tensor> in{t.contiguous()};
  try {
    finish(impl_->backend, impl_->backend->allgather(out, in));
  } catch (const std::exception &e) {
    collectiveFailed(options_, "all-gather", e);
  }
  return out[0];
}

void Communicator::allGatherInto(at::Tensor &out, const at::Tensor &t) {
  if (!impl_->backend) {
    out.copy_(t.reshape({-1}));
    return;
  }
  const Busy busy;
  // One flat output the backend writes into: the list form has gloo gather
  // into a flat buffer of its own and copy out of it (twice the bytes).
  at::Tensor in = t.contiguous();
  try {
    finish(impl_->backend, impl_->backend->_allgather_base(out, in));
  } catch (const std::exception &e) {
    collectiveFailed(options_, "all-gather", e);
  }
}

void Communicator::broadcast(at::Tensor &t, int root) {
  if (!impl_->backend)
    return;
  const Busy busy;
  std::vector<at::Tensor> one{t};
  c10d::BroadcastOptions bo;
  bo.rootRank = root;
  try {
    finish(impl_->backend, impl_->backend->broadcast(one, bo));
  } catch (const std::exception &e) {
    collectiveFailed(options_, "broadcast", e);
  }
}

int64_t Communicator::broadcastAsync(at::Tensor &t, int root) {
  if (!impl_->backend)
    return 0;
  std::vector<at::Tensor> one{t};
  c10d::BroadcastOptions bo;
  bo.rootRank = root;
  try {
    const int64_t ticket = impl_->nextTicket++;
    impl_->started.emplace(
        ticket, Impl::Started{impl_->backend->broadcast(one, bo), "broadcast"});
    return ticket;
  } catch (const std::exception &e) {
    collectiveFailed(options_, "broadcast", e);
  }
}

int64_t Communicator::allReduceSumAsync(at::Tensor &t) {
  if (!impl_->backend)
    return 0;
  std::vector<at::Tensor> one{t};
  try {
    const int64_t ticket = impl_->nextTicket++;
    impl_->started.emplace(
        ticket, Impl::Started{impl_->backend->allreduce(one), "all-reduce"});
    return ticket;
  } catch (const std::exception &e) {
    collectiveFailed(options_, "all-reduce", e);
  }
}

void Communicator::wait(int64_t ticket) {
  auto it = impl_->started.find(ticket);
  if (it == impl_->started.end()) {
    if (ticket != 0) // 0: begun without a process group, nothing to wait
      throw std::logic_error("mtprt: Communicator::wait: ticket " +
                             std::to_string(ticket) +
                             " was never begun or was waited for already");
    return;
  }
  Impl::Started started = std::move(it->second);
  impl_->started.erase(it);
  const Busy busy;
  try {
    finish(impl_->backend, std::move(started.work));
  } catch (const std::exception &e) {
    collectiveFailed(options_, started.op, e);
  }
}

void Communicator::send(const at::Tensor &t, int peer, int tag) {
  if (!impl_->backend)
    throw std::logic_error("mtprt: send without a process group");
  std::vector<at::Tensor> one{t.contiguous()};
  try {
    impl_->sends.push_back(
        {peer, tag, impl_->backend->send(one, peer, tag), one[0]});
  } catch (const std::exception &e) {
    collectiveFailed(options_, "send", e);
  }
}

void Communicator::recv(at::Tensor &t, int peer, int tag) {
  if (!impl_->backend)
    throw std::logic_error("mtprt: recv without a process group");
  const Busy busy;
  std::vector<at::Tensor> one{t};
  try {
    // The tensor is the caller's (no buffer of gloo's to outlive it): the
    // wait alone.
    impl_->backend->recv(one, peer, tag)->wait();
  } catch (const std::exception &e) {
    collectiveFailed(options_, "receive", e);
  }
}

void Communicator::waitSends() {
  const Busy busy;
  try {
    for (auto &s : impl_->sends)
      s.work->wait();
  } catch (const std::exception &e) {
    impl_->sends.clear();
    collectiveFailed(options_, "send", e);
  }
  impl_->sends.clear();
}

void Communicator::waitSend(int peer, int tag) {
  const Busy busy;
  auto &sends = impl_->sends;
  for (auto it = sends.begin(); it != sends.end(); ++it)
    if (it->peer == peer && it->tag == tag) {
      try {
        it->work->wait();
      } catch (const std::exception &e) {
        sends.erase(it);
        collectiveFailed(options_, "send", e);
      }
      sends.erase(it);
      return;
    }
}

void Communicator::reapSends() {
  auto &sends = impl_->sends;
  sends.erase(std::remove_if(sends.begin(), sends.end(),
                             [](const Communicator::Impl::Send &s) {
                               return s.work->isCompleted() &&
                                      s.work->isSuccess();
                             }),
              sends.end());
}

void Communicator::barrier() {
  if (!impl_->backend)
    return;
  const Busy busy;
  try {
    finish(impl_->backend, impl_->backend->barrier());
  } catch (const std::exception &e) {
    collectiveFailed(options_, "barrier", e);
  }
}

struct StoreServer::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

StoreServer::StoreServer(int port, int timeoutS)
    : impl_(std::make_unique<Impl>()) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = std::chrono::milliseconds(int64_t(timeoutS) * 1000);
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  } catch (const std::exception &e) {
    throw std::runtime_error("mtprt: cannot serve the rendezvous store on "
                             "127.0.0.1:" +
                             std::to_string(port) + ": " + oneLine(e));
  }
}

StoreServer::~StoreServer() = default;

int StoreServer::port() const { return impl_->store->getPort(); }

const char *const kLauncherBeatKey = "mtprt/launcher/beat";

void StoreServer::beat() { impl_->store->add(kLauncherBeatKey, 1); }

//===----------------------------------------------------------------------===//
// LauncherWatch
//===----------------------------------------------------------------------===//

struct LauncherWatch::State {
  std::mutex m;
  std::condition_variable cv;
  bool stop = false, pollerDone = false;
  int64_t last = -1;                              ///< the counter as last read
  std::chrono::steady_clock::time_point advanced; ///< when it last moved
  std::string error; ///< the store's failure, if any
  std::thread poller, checker;
  int timeoutS = 120;
};

LauncherWatch::LauncherWatch(const std::string &addr, int port, int timeoutS,
                             std::function<void(const std::string &)> lost)
    : state_(std::make_shared<State>()) {
  using Clock = std::chrono::steady_clock;
  std::shared_ptr<State> st = state_;
  st->advanced = Clock::now();
  st->timeoutS = timeoutS;
  const std::chrono::milliseconds interval(
      std::clamp<int64_t>(int64_t(timeoutS) * 1000 / 4, 50, 1000));
  // The poller may block inside a store call (a stopped launcher answers
  // nothing); the checker never does, and decides.
  st->poller = std::thread([st, addr, port, timeoutS, interval] {
    try {
      c10d::TCPStoreOptions so;
      so.port = static_cast<uint16_t>(port);
      so.isServer = false;
      so.waitWorkers = false;
      so.timeout = std::chrono::milliseconds(int64_t(timeoutS) * 1000);
      auto store = c10::make_intrusive<c10d::TCPStore>(addr, so);
      std::unique_lock<std::mutex> lock(st->m);
      while (!st->stop) {
        lock.unlock();
        const int64_t v = store->add(kLauncherBeatKey, 0);
        lock.lock();
        if (v != st->last) {
          st->last = v;
          st->advanced = Clock::now();
        }
        st->cv.wait_for(lock, interval, [&] { return st->stop; });
      }
    } catch (const std::exception &e) {
      std::lock_guard<std::mutex> lock(st->m);
      st->error = oneLine(e);
    }
    std::lock_guard<std::mutex> lock(st->m);
    st->pollerDone = true;
    st->cv.notify_all();
  });
  st->checker = std::thread([st, timeoutS, interval, lost] {
    std::unique_lock<std::mutex> lock(st->m);
    while (!st->stop) {
      st->cv.wait_for(lock, interval, [&] { return st->stop; });
      if (st->stop)
        return;
      std::string why;
      if (!st->error.empty())
        why = "stopped answering on its store (" + st->error + ")";
      else if (Clock::now() - st->advanced > std::chrono::seconds(timeoutS))
        why = "has sent no heartbeat for " + std::to_string(timeoutS) +
              " s (it is stopped, hung or gone; --timeout)";
      if (!why.empty()) {
        lock.unlock();
        lost(why);
        return;
      }
    }
  });
}

LauncherWatch::~LauncherWatch() {
  State &st = *state_;
  {
    std::lock_guard<std::mutex> lock(st.m);
    st.stop = true;
    st.cv.notify_all();
  }
  st.checker.join();
  // A poller blocked on a launcher that stopped answering is left to the
  // process's exit.
  bool done;
  {
    std::unique_lock<std::mutex> lock(st.m);
    done = st.cv.wait_for(lock, std::chrono::seconds(st.timeoutS),
                          [&] { return st.pollerDone; });
  }
  if (done)
    st.poller.join();
  else
    st.poller.detach();
}

//===----------------------------------------------------------------------===//
// GSC encoding
//===----------------------------------------------------------------------===//

GscLayout gscLayout(int64_t n, const GscOptions &o) {
  if (!(o.topK > 0 && o.topK <= 1))
    throw std::invalid_argument("mtprt: compression top-k fraction must be in "
                                "(0, 1], got " +
                                std::to_string(o.topK));
  if (o.block < 1)
    throw std::invalid_argument("mtprt: compression block must be >= 1");
  GscLayout l;
  l.n = n;
  l.k = n == 0 ? 0
               : std::min<int64_t>(
                     n, std::max<int64_t>(
                            1, static_cast<int64_t>(std::ceil(o.topK * n))));
  l.blocks = kernels::numBlocks(l.k, o.block);
  const int64_t bitmapBytes = (n + 7) / 8;
  l.bitmap = bitmapBytes < 4 * l.k;
  l.indexBytes = l.bitmap ? bitmapBytes : 4 * l.k;
  l.bytes = 4 * l.blocks + l.indexBytes + l.k;
  return l;
}

namespace {

at::Tensor bitWeights(const at::Device &d) {
  return at::tensor({1, 2, 4, 8, 16, 32, 64, 128}, at::kByte).to(d);
}

bool onCudaKernels(const at::Tensor &t) {
#if defined(MTPRT_TORCH_CUDA) && defined(MTPRT_HAVE_CUDA_KERNELS)
  return t.is_cuda();
#else
  (void)t;
  return false;
#endif
}

} // namespace

at::Tensor gscEncode(const at::Tensor &values, const GscOptions &o) {
  const GscLayout l = gscLayout(values.numel(), o);
  at::Tensor payload = at::empty({l.bytes}, values.options().dtype(at::kByte));
  gscEncodeInto(values, o, payload);
  return payload;
}

void gscEncodeInto(const at::Tensor &values, const GscOptions &o,
                   at::Tensor payload) {
  if (!values.is_cpu() && !onCudaKernels(values)) { // no kernel for the device
    at::Tensor p = gscEncode(values.cpu(), o);
    payload.copy_(p);
    return;
  }
  at::Tensor v = values.to(at::kFloat).contiguous().view({-1});
  const GscLayout l = gscLayout(v.numel(), o);
  if (payload.scalar_type() != at::kByte || payload.dim() != 1 ||
      payload.numel() != l.bytes || !payload.is_contiguous())
    throw std::invalid_argument(
        "mtprt: GSC payload buffer of " + std::to_string(payload.numel()) +
        " bytes cannot hold " + std::to_string(l.bytes));
  payload.zero_();
  if (l.k == 0)
    return;
  // Top-k by |g|: exactly k positions, so every rank's payload for the bucket
  // has the same size. Ascending order makes the bitmap and indices agree.
  // (Transients, docs/cost-model.md: |v| and topk's values and positions;
  // then the sort's; then the kept values beside the positions.)
  at::Tensor idx = std::get<1>(at::topk(v.abs(), l.k, 0, true, false));
  idx = std::get<0>(at::sort(idx));
  at::Tensor kept = v.index_select(0, idx);
  at::Tensor scales = payload.narrow(0, 0, 4 * l.blocks).view(at::kFloat);
  at::Tensor codes =
      payload.narrow(0, 4 * l.blocks + l.indexBytes, l.k).view(at::kChar);
  if (onCudaKernels(v)) {
#if defined(MTPRT_TORCH_CUDA) && defined(MTPRT_HAVE_CUDA_KERNELS)
    const kernels::Specialized &sk = kernels::specialized();
    void *stream = at::cuda::getCurrentCUDAStream().stream();
    int err;
    if (sk.quantBlock == o.block && sk.blockQuantizeCuda) {
      kernels::countSpecializedLaunch();
      err = sk.blockQuantizeCuda(kept.data_ptr<float>(), l.k,
                                 codes.data_ptr<int8_t>(),
                                 scales.data_ptr<float>(), stream);
    } else {
      err = kernels::blockQuantizeCuda(
          kept.data_ptr<float>(), l.k, o.block, codes.data_ptr<int8_t>(),
          scales.data_ptr<float>(), stream);
    }
    if (err)
      throw std::runtime_error("mtprt: CUDA blockQuantize failed: " +
                               std::to_string(err));
#endif
  } else if (const kernels::Specialized &sk = kernels::specialized();
             sk.quantBlock == o.block && sk.blockQuantizeCpu) {
    // The program's quantizer, specialized with its spec's block.
    kernels::countSpecializedLaunch();
    sk.blockQuantizeCpu(kept.data_ptr<float>(), l.k, codes.data_ptr<int8_t>(),
                        scales.data_ptr<float>());
  } else {
    kernels::blockQuantizeCpu(kept.data_ptr<float>(), l.k, o.block,
                              codes.data_ptr<int8_t>(),
                              scales.data_ptr<float>());
  }
  at::Tensor index = payload.narrow(0, 4 * l.blocks, l.indexBytes);
  if (l.bitmap) {
    // One byte per position, then each byte's eight packed in place (the
    // bits are distinct, so or-ing the weighted columns is their sum): no
    // integer widening of the whole bucket.
    at::Tensor bits = at::zeros({l.indexBytes * 8}, index.options());
    bits.index_fill_(0, idx, 1);
    at::Tensor rows = bits.view({-1, 8}).mul_(bitWeights(v.device()));
    index.copy_(rows.select(1, 0));
    for (int64_t j = 1; j < 8; ++j)
      index.bitwise_or_(rows.select(1, j));
  } else {
    index.view(at::kInt).copy_(idx);
  }
}

namespace {

/// The kept positions (int64, ascending for a bitmap) and dequantized values
/// of a payload on a kernel device. Positions first: a bitmap's one byte per
/// position is gone before the values exist.
std::pair<at::Tensor, at::Tensor>
decodeKept(const at::Tensor &p, const GscLayout &l, const GscOptions &o) {
  const int64_t n = l.n;
  at::Tensor index = p.narrow(0, 4 * l.blocks, l.indexBytes);
  at::Tensor idx;
  if (l.bitmap)
    idx = index.unsqueeze(1)
              .bitwise_and(bitWeights(p.device()))
              .view({-1})
              .narrow(0, 0, n)
              .nonzero()
              .view({-1});
  else
    idx = index.view(at::kInt).to(at::kLong);
  if (idx.numel() != l.k || (!l.bitmap && (idx.min().item<int64_t>() < 0 ||
                                           idx.max().item<int64_t>() >= n)))
    throw std::invalid_argument("mtprt: corrupt GSC payload (positions)");
  at::Tensor scales = p.narrow(0, 0, 4 * l.blocks).view(at::kFloat);
  at::Tensor codes =
      p.narrow(0, 4 * l.blocks + l.indexBytes, l.k).view(at::kChar);
  at::Tensor vals = at::empty({l.k}, p.options().dtype(at::kFloat));
  if (onCudaKernels(p)) {
#if defined(MTPRT_TORCH_CUDA) && defined(MTPRT_HAVE_CUDA_KERNELS)
    const kernels::Specialized &sk = kernels::specialized();
    void *stream = at::cuda::getCurrentCUDAStream().stream();
    int err;
    if (sk.quantBlock == o.block && sk.blockDequantizeCuda) {
      kernels::countSpecializedLaunch();
      err = sk.blockDequantizeCuda(codes.data_ptr<int8_t>(),
                                   scales.data_ptr<float>(), l.k,
                                   vals.data_ptr<float>(), stream);
    } else {
      err = kernels::blockDequantizeCuda(
          codes.data_ptr<int8_t>(), scales.data_ptr<float>(), l.k, o.block,
          vals.data_ptr<float>(), stream);
    }
    if (err)
      throw std::runtime_error("mtprt: CUDA blockDequantize failed: " +
                               std::to_string(err));
#endif
  } else if (const kernels::Specialized &sk = kernels::specialized();
             sk.quantBlock == o.block && sk.blockDequantizeCpu) {
    kernels::countSpecializedLaunch();
    sk.blockDequantizeCpu(codes.data_ptr<int8_t>(), scales.data_ptr<float>(),
                          l.k, vals.data_ptr<float>());
  } else {
    kernels::blockDequantizeCpu(codes.data_ptr<int8_t>(),
                                scales.data_ptr<float>(), l.k, o.block,
                                vals.data_ptr<float>());
  }
  return {idx, vals};
}

void checkPayload(const at::Tensor &payload, const GscLayout &l) {
  if (payload.scalar_type() != at::kByte || payload.dim() != 1 ||
      payload.numel() != l.bytes)
    throw std::invalid_argument(
        "mtprt: GSC payload of " + std::to_string(payload.numel()) +
        " bytes does not encode " + std::to_string(l.n) + " values (expected " +
        std::to_string(l.bytes) + ")");
}

/// target[i] += alpha · decoded[i] at the kept positions only (the others
/// would add zero): no dense decoded copy of the bucket. alpha is 1 or -1,
/// so the results equal adding or subtracting the dense decode bit for bit.
void decodeAdd(const at::Tensor &payload, const GscLayout &l,
               const GscOptions &o, at::Tensor target, double alpha) {
  checkPayload(payload, l);
  if (l.k == 0)
    return;
  if (!payload.is_cpu() && !onCudaKernels(payload)) {
    target.add_(gscDecode(payload.cpu(), l.n, o).to(target.device()), alpha);
    return;
  }
  auto [idx, vals] = decodeKept(payload.contiguous(), l, o);
  target.index_add_(0, idx, vals, alpha);
}

} // namespace

at::Tensor gscDecode(const at::Tensor &payload, int64_t n,
                     const GscOptions &o) {
  const GscLayout l = gscLayout(n, o);
  checkPayload(payload, l);
  if (!payload.is_cpu() && !onCudaKernels(payload))
    return gscDecode(payload.cpu(), n, o).to(payload.device());
  at::Tensor p = payload.contiguous();
  at::Tensor out = at::zeros({n}, p.options().dtype(at::kFloat));
  if (l.k == 0)
    return out;
  auto [idx, vals] = decodeKept(p, l, o);
  out.index_copy_(0, idx, vals);
  return out;
}

//===----------------------------------------------------------------------===//
// GradExchange
//===----------------------------------------------------------------------===//

GradExchange::GradExchange(Communicator *comm, bool compress, GscOptions o)
    : comm_(comm), compress_(compress), options_(o) {
  gscLayout(1, o); // validates the knobs
  if (!(o.decay >= 0 && o.decay <= 1))
    throw std::invalid_argument("mtprt: compression decay must be in [0, 1]");
  if (o.bucket < 1)
    throw std::invalid_argument("mtprt: compression bucket must be >= 1");
}

GradExchange::Result GradExchange::sum(at::Tensor &flat) {
  Result r;
  if (!comm_ || !comm_->active())
    return r;
  const int64_t n = flat.numel();
  r.bytesSentUncompressed = 4 * n;
  if (!compress_) {
    std::vector<at::Tensor> one{flat};
    comm_->allReduceSum(one);
    r.bytesSent = 4 * n;
    return r;
  }
  if (!residual_.defined() || residual_.numel() != n)
    residual_ = at::zeros({n}, flat.options());
  if (keepOwnDecoded)
    lastOwnDecoded = at::zeros({n}, flat.options());
  const int world = comm_->worldSize();
  // One bucket at a time, so only one bucket's payloads and transients are
  // ever live (docs/cost-model.md, "The gradient exchange"). g_in = g +
  // decay·r is formed in the residual's own storage; subtracting this rank's
  // decoded payload leaves the new residual there (the dropped values and the
  // quantization error alike) — the same bits as g_in − decode(payload).
  for (int64_t lo = 0; lo < n; lo += options_.bucket) {
    const int64_t len = std::min(options_.bucket, n - lo);
    const GscLayout l = gscLayout(len, options_);
    at::Tensor gin = residual_.narrow(0, lo, len);
    gin.mul_(options_.decay).add_(flat.narrow(0, lo, len));
    // Each rank's slot padded to 4 bytes, so its fp32 scales stay aligned
    // in the gathered buffer.
    const int64_t slot = (l.bytes + 3) / 4 * 4;
    at::Tensor mine = at::zeros({slot}, flat.options().dtype(at::kByte));
    at::Tensor payload = mine.narrow(0, 0, l.bytes);
    gscEncodeInto(gin, options_, payload);
    if (keepOwnDecoded)
      decodeAdd(payload, l, options_, lastOwnDecoded.narrow(0, lo, len), 1.0);
    decodeAdd(payload, l, options_, gin, -1.0);
    r.bytesSent += l.bytes;
    at::Tensor all = at::empty({world * slot}, mine.options());
    comm_->allGatherInto(all, mine);
    payload = mine = at::Tensor();
    // Every rank sums the same decoded payloads in rank order: identical bits.
    at::Tensor sum = flat.narrow(0, lo, len);
    sum.zero_();
    for (int rank = 0; rank < world; ++rank)
      decodeAdd(all.narrow(0, rank * slot, l.bytes), l, options_, sum, 1.0);
  }
  return r;
}

void GradExchange::prepare(const std::vector<at::Tensor> &params) {
  if (!compress_ || !comm_ || !comm_->active())
    return;
  int64_t n = 0;
  for (const at::Tensor &p : params)
    n += p.numel();
  if (!residual_.defined() || residual_.numel() != n)
    residual_ = at::zeros(
        {n}, at::TensorOptions().dtype(at::kFloat).device(comm_->device()));
}

void GradExchange::carryResidual(const std::vector<at::Tensor> &before,
                                 const std::vector<at::Tensor> &after) {
  if (!residual_.defined())
    return;
  std::unordered_map<const void *, int64_t> offset;
  int64_t n = 0;
  for (const at::Tensor &p : before) {
    offset[p.unsafeGetTensorImpl()] = n;
    n += p.numel();
  }
  if (n != residual_.numel()) // not this layout's: sum() starts afresh
    return;
  int64_t m = 0;
  for (const at::Tensor &p : after)
    m += p.numel();
  at::Tensor next = at::zeros({m}, residual_.options());
  int64_t pos = 0;
  for (const at::Tensor &p : after) {
    if (auto it = offset.find(p.unsafeGetTensorImpl()); it != offset.end())
      next.narrow(0, pos, p.numel())
          .copy_(residual_.narrow(0, it->second, p.numel()));
    pos += p.numel();
  }
  residual_ = next;
}

GradExchange::Result
GradExchange::averageGradients(const std::vector<at::Tensor> &params) {
  if (!comm_ || !comm_->active())
    return {};
  // Which parameters have a gradient on some rank (a task whose labels are
  // missing everywhere leaves its head untouched, as on one process).
  at::Tensor has = at::empty({int64_t(params.size())}, at::kFloat);
  // (Filled on the CPU, moved to the collectives' device below.)
  // One fp32 buffer, each gradient copied in (a 16-bit one cast on the
  // way: no fp32 copy of it beside the buffer).
  int64_t n = 0;
  for (const at::Tensor &p : params)
    n += p.numel();
  at::Tensor flat = at::empty(
      {n}, at::TensorOptions().dtype(at::kFloat).device(comm_->device()));
  int64_t from = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor &g = params[i].grad();
    has[i] = g.defined() ? 1.0 : 0.0;
    at::Tensor part = flat.narrow(0, from, params[i].numel());
    if (g.defined())
      part.copy_(g.reshape({-1}));
    else
      part.zero_();
    from += params[i].numel();
  }
  std::vector<at::Tensor> flags{has.to(comm_->device())};
  comm_->allReduceSum(flags);
  has = flags[0].cpu();
  Result r = sum(flat);
  r.bytesSent += 4 * has.numel();
  r.bytesSentUncompressed += 4 * has.numel();
  flat.div_(comm_->worldSize());
  int64_t off = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i];
    const int64_t len = p.numel();
    const at::Tensor avg = flat.narrow(0, off, len).view(p.sizes());
    off += len;
    if (has[i].item<float>() == 0.0f)
      continue;
    // copy_ casts and moves in place (a 16-bit gradient: no fp32 copy).
    if (p.grad().defined())
      p.mutable_grad().copy_(avg);
    else
      p.mutable_grad() = avg.to(p.device(), p.scalar_type(),
                                /*non_blocking=*/false, /*copy=*/true);
  }
  return r;
}

} // namespace mtprt
