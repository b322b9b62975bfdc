//===- Distributed.h - process groups and compressed collectives -*- C++
//-*-===//
//
// Data parallelism over LibTorch's c10d: a process group (gloo on CPU; NCCL
// would serve CUDA tensors) joined through a TCPStore rendezvous, and the
// gradient exchange of docs/techniques.md C10 / docs/contracts.md#compression-gsc: plain
// all-reduce, or top-k + 8-bit block quantization with error feedback, the
// payloads all-gathered through the process group, decoded and summed locally
// in fp32.
//
// Internal API (LibTorch).
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_DISTRIBUTED_H
#define MTPRT_TORCH_DISTRIBUTED_H

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mtprt {

/// Where this process sits in a run.
struct DistOptions {
  int rank = 0;
  int worldSize = 1;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  /// Joining (the TCPStore and the process group together) and every
  /// collective give up after this long (--timeout).
  int timeoutS = 120;
  /// "cpu": gloo; "cuda[:N]": NCCL (built with MTPRT_TORCH_CUDA only).
  std::string device = "cpu";
  /// Make the group even at world size 1 (device checks of the collective
  /// path on a one-GPU machine); normally world size 1 has none.
  bool alwaysGroup = false;
  /// A sub-group (a pipeline stage's data-parallel replicas): its name
  /// prefixes its keys in the world's store, which it joins as a client;
  /// rank and worldSize are then within the group.
  std::string group;
};

/// `defaults` overridden by the standard launcher variables RANK, WORLD_SIZE,
/// MASTER_ADDR and MASTER_PORT where they are set (torchrun, SLURM wrappers).
/// Throws std::invalid_argument naming the variable when one is malformed.
DistOptions distOptionsFromEnv(DistOptions defaults);

/// A c10d process group: TCPStore rendezvous at masterAddr:masterPort (rank 0
/// serves it unless `serveStore` is false because a launcher already does),
/// then ProcessGroupGloo. World size 1 makes no store and no group.
///
/// Errors are one line each, std::runtime_error, without LibTorch's
/// backtrace: a join that has not finished after timeoutS (c10d's own
/// TCPStore retries a connect for up to twice its timeout, and waits for a
/// master that accepted but never answers forever) names the master and the
/// timeout; a failed collective names the operation and this rank.
class Communicator {
public:
  explicit Communicator(const DistOptions &options, bool serveStore = true);
  ~Communicator();
  Communicator(const Communicator &) = delete;
  Communicator &operator=(const Communicator &) = delete;

  int rank() const { return options_.rank; }
  int worldSize() const { return options_.worldSize; }
  /// A process group exists (world size > 1, or alwaysGroup).
  bool active() const;
  /// Where tensors handed to the collectives must live.
  at::Device device() const;
  /// "gloo", "nccl" or "none".
  std::string backendName() const;

  /// In place: every tensor becomes the sum over ranks.
  void allReduceSum(std::vector<at::Tensor> &tensors);
  /// Every rank's `t` (same shape and dtype on every rank), in rank order.
  std::vector<at::Tensor> allGather(const at::Tensor &t);
  /// Every rank's `t` into `out` (world size × t.numel() elements of t's
  /// dtype, contiguous), in rank order, with no buffer of the backend's own.
  void allGatherInto(at::Tensor &out, const at::Tensor &t);
  void broadcast(at::Tensor &t, int root);
  /// Begins `t`'s broadcast from `root` and returns at once (ZeRO 3's
  /// prefetch): `t` must stay alive and untouched until wait(ticket), which
  /// every started ticket must get. Collectives match by the order they
  /// are issued in, so every rank starts the same ones in the same order.
  /// Without a process group: 0, and wait(0) does nothing.
  int64_t broadcastAsync(at::Tensor &t, int root);
  /// Begins `t`'s in-place sum over the ranks and returns at once (ZeRO
  /// 2's release overlapped with the backward), as broadcastAsync.
  int64_t allReduceSumAsync(at::Tensor &t);
  /// Finishes what broadcastAsync or allReduceSumAsync began (its time
  /// counts as busySeconds); a failure is the collective's error. Each
  /// ticket once (another wait is a std::logic_error).
  void wait(int64_t ticket);
  void barrier();
  /// Point to point (pipeline stages): `t` to rank `peer` under `tag`,
  /// returning at once; the tensor is held until waitSends().
  void send(const at::Tensor &t, int peer, int tag);
  /// Waits for `t` (shape and dtype as sent) from rank `peer` under `tag`.
  void recv(at::Tensor &t, int peer, int tag);
  /// Waits for every send begun.
  void waitSends();
  /// Waits for the send to `peer` under `tag` (and lets go of its tensor).
  void waitSend(int peer, int tag);
  /// Lets go of the sends that have finished, without waiting.
  void reapSends();

  /// Seconds every communicator of this process has spent blocked in
  /// collectives, receives and sends' waits so far (a step's `comm_s` is
  /// the difference across it).
  static double busySeconds();

private:
  DistOptions options_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A TCPStore server a launcher hosts for the processes it starts (port 0:
/// the system picks a free one); they join with serveStore = false.
class StoreServer {
public:
  explicit StoreServer(int port = 0, int timeoutS = 120);
  ~StoreServer();
  int port() const;
  /// One heartbeat: advances the counter a LauncherWatch reads.
  void beat();

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A rank's watch on the launcher that serves its store: a thread reads the
/// launcher's heartbeat counter (StoreServer::beat) every interval; when the
/// counter has not advanced for timeoutS, or the store stops answering (a
/// stopped, hung or vanished launcher), `lost` is called once, from the
/// watch's thread, with a one-line reason (the driver prints it and exits).
class LauncherWatch {
public:
  LauncherWatch(const std::string &masterAddr, int masterPort, int timeoutS,
                std::function<void(const std::string &)> lost);
  ~LauncherWatch();
  LauncherWatch(const LauncherWatch &) = delete;
  LauncherWatch &operator=(const LauncherWatch &) = delete;

private:
  struct State;
  std::shared_ptr<State> state_;
};

/// The key StoreServer::beat advances.
extern const char *const kLauncherBeatKey;

/// GSC knobs (docs/techniques.md C10 defaults).
struct GscOptions {
  double topK = 0.15;       ///< kept fraction of each bucket, by |g|
  int64_t block = 256;      ///< values per quantization block
  double decay = 0.8;       ///< residual feedback: g_in = g + decay · r
  int64_t bucket = 1 << 20; ///< values per bucket
};

/// The encoding of one bucket of n values: k = ceil(topK · n) kept values,
/// their positions as k int32 indices or an n-bit bitmap (whichever is
/// smaller), then k int8 codes and numBlocks(k, block) fp32 scales. Layout of
/// the byte payload: [scales][indices or bitmap][codes]. Every rank encodes a
/// bucket to the same number of bytes, so payloads all-gather as equal-sized
/// byte tensors.
struct GscLayout {
  int64_t n = 0, k = 0, blocks = 0;
  bool bitmap = false;
  int64_t indexBytes = 0, bytes = 0;
};
GscLayout gscLayout(int64_t n, const GscOptions &options);
/// Encodes a flat fp32 bucket (CPU or CUDA) into a uint8 payload.
at::Tensor gscEncode(const at::Tensor &values, const GscOptions &options);
/// The same into `payload` (uint8, contiguous, gscLayout(values.numel()).bytes
/// long).
void gscEncodeInto(const at::Tensor &values, const GscOptions &options,
                   at::Tensor payload);
/// Decodes a payload of an n-value bucket to n fp32 values (zeros where not
/// kept), on the payload's device.
at::Tensor gscDecode(const at::Tensor &payload, int64_t n,
                     const GscOptions &options);

/// The gradient exchange of one data-parallel step.
class GradExchange {
public:
  /// compress = false: plain all-reduce. `comm` may be null (world size 1).
  GradExchange(Communicator *comm, bool compress, GscOptions options = {});

  struct Result {
    int64_t bytesSent = 0;             ///< this rank's contribution
    int64_t bytesSentUncompressed = 0; ///< the same gradients as fp32
  };
  /// Replaces each defined gradient by the mean over ranks (undefined ones
  /// count as zeros on every rank and are written back as zeros only where
  /// another rank had one). World size 1: nothing happens, nothing counted.
  Result averageGradients(const std::vector<at::Tensor> &params);
  /// Creates the error-feedback residual (zeros, one value per parameter
  /// element) before the first step, as AdamW's moments are, so the first
  /// step holds what every later one does (the plan's peak counts it). Does
  /// nothing uncompressed or at world size 1.
  void prepare(const std::vector<at::Tensor> &params);
  /// The parameters changed from `before` to `after` (npd(regroup)'s split
  /// adds adapter copies): each parameter in both keeps its residual, a new
  /// one starts at zero (the shared adapter's unsent part stays with it, not
  /// counted twice). Nothing to do without a residual.
  void carryResidual(const std::vector<at::Tensor> &before,
                     const std::vector<at::Tensor> &after);
  /// The collective itself on one flat fp32 vector: the sum over ranks
  /// (compressed: Σ_rank decode(encode(g + decay·r))), residual updated.
  Result sum(at::Tensor &flat);

  bool compressed() const { return compress_; }
  const GscOptions &options() const { return options_; }
  /// Error-feedback state (flat, fp32; undefined before the first step).
  at::Tensor &residual() { return residual_; }
  /// With keepOwnDecoded (tests): this rank's decoded payload of the last
  /// compressed call. Off in training: it would hold another copy of every
  /// gradient through the step.
  bool keepOwnDecoded = false;
  at::Tensor lastOwnDecoded;

private:
  Communicator *comm_;
  bool compress_;
  GscOptions options_;
  at::Tensor residual_;
};

} // namespace mtprt

#endif // MTPRT_TORCH_DISTRIBUTED_H
