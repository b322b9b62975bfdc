//===- Regions.h - checkpoint regions, offload and prefetch -----*- C++ -*-===//
//
// Checkpoint regions: a custom autograd function that runs a range of units
// without keeping their interior, saves only the boundary input (and the RNG
// state), and recomputes the interior in backward so dropout matches.
//
// Offload: C++ saved-tensor hooks. LibTorch routes default saved-tensor hooks
// through the autograd engine (only Python's engine installs any), so mtprt
// installs an engine whose default hooks come from a thread-local stack of
// OffloadScopes: while a scope is alive, every tensor an op saves for
// backward is copied to the host pool and its device copy dropped; before
// the backward use it is brought back (prefetched ahead on request, else
// fetched at use) and each use is recorded as a hit (ready) or a miss (the
// step waited, and how long).
//
// Tensor grain: the same engine's hooks, from a RecomputeScope: a saved
// tensor registered with Recomputed::add is not kept but re-created in the
// backward from what the block keeps (its input), once for every registered
// tensor, at the first unpack; every other saved tensor is kept as usual.
//
// CPU: host-pool buffers are malloc'd outside the tracking allocator (so not
// device bytes) and copies run on one worker thread, with an optional
// artificial delay per copy. CUDA (MTPRT_TORCH_CUDA): pinned buffers, copies
// on a low-priority stream, events, a wait at use.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_TORCH_REGIONS_H
#define MTPRT_TORCH_REGIONS_H

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mtprt {

using RegionFn = std::function<at::Tensor(const at::Tensor &)>;

/// Runs `fn(x)` as a checkpoint region. `params` must list every tensor
/// requiring grad that fn reads besides x (the region's parameters): their
/// gradients are returned through the autograd graph, so both backward() and
/// autograd::grad() see them. Saves x only; an OffloadScope around the call
/// offloads it. The CPU (and CUDA, where x lives there) RNG state at entry is
/// restored for the recompute.
at::Tensor checkpoint(const RegionFn &fn, const at::Tensor &x,
                      const std::vector<at::Tensor> &params);

/// A block's recomputable tensors (Decision::Partial). `recompute` returns
/// them all again, in the order add() registered them, from what the block
/// keeps; it runs without grad, with the CPU (and CUDA) random state of
/// construction replayed, the first time the backward unpacks any of them,
/// and each re-created tensor is dropped once its saved uses have unpacked
/// it (a retained graph recomputes again). While a Scope is alive, a tensor
/// an op saves that is (a view of) a registered one keeps only its shape.
class Recomputed {
public:
  using Fn = std::function<std::vector<at::Tensor>()>;
  /// `device`: where the block runs (whose random state is replayed).
  Recomputed(Fn recompute, const at::Device &device);
  /// The next of recompute's outputs (its registration index is the count
  /// of earlier add()s). Must run before an op saves it.
  void add(const at::Tensor &t);

  class Scope {
  public:
    explicit Scope(Recomputed &recomputed);
    ~Scope();
    Scope(const Scope &) = delete;
    Scope &operator=(const Scope &) = delete;
  };

  /// Times the recompute ran (over every Recomputed), for tests.
  static int64_t runs();

  struct Impl;

private:
  std::shared_ptr<Impl> impl_;
};

struct OffloadOptions {
  /// Artificial delay added to every copy (seconds), to test late prefetches.
  double copyDelayS = 0.0;
  /// Saved tensors smaller than this stay on the device (not worth a copy),
  /// as do parameters (leaves requiring grad, and views of them).
  int64_t minBytes = 4096;
};

/// One offloaded tensor's backward use.
struct OffloadRecord {
  std::string group;
  int64_t bytes = 0;
  bool hit = false;   ///< the prefetch had completed before the use
  double waitS = 0.0; ///< time the use waited for the copy back
};

struct OffloadStats {
  int64_t offloadedTensors = 0, offloadedBytes = 0;
  int64_t hits = 0, misses = 0;
  double waitS = 0.0;
  int64_t hostBytes = 0, hostPeakBytes = 0;
  double hitRate() const {
    return hits + misses ? static_cast<double>(hits) / (hits + misses) : 1.0;
  }
};

class Offloader {
public:
  explicit Offloader(OffloadOptions options = {});
  ~Offloader();
  Offloader(const Offloader &) = delete;
  Offloader &operator=(const Offloader &) = delete;

  /// While alive (on this thread), tensors saved for backward go to `group`,
  /// except those sharing storage with `keep` (e.g. a head's tap activation,
  /// which the backbone keeps on the device anyway: copying it would only add
  /// a second device copy at the backward).
  class Scope {
  public:
    Scope(Offloader &offloader, std::string group,
          std::vector<at::Tensor> keep = {});
    ~Scope();
    Scope(const Scope &) = delete;
    Scope &operator=(const Scope &) = delete;
  };

  /// Starts bringing every offloaded tensor of `group` back (async).
  void prefetch(const std::string &group);
  /// Blocks until every offload copy of `group` has finished (its device
  /// copies are then freed).
  void waitOffloaded(const std::string &group);
  /// Blocks until no copy is queued or running.
  void synchronize();

  void setCopyDelay(double seconds);
  OffloadStats stats() const;
  std::vector<OffloadRecord> records() const;
  /// Clears counters and records; the host-pool peak restarts at the current
  /// level.
  void resetStats();

  struct Impl;

private:
  std::shared_ptr<Impl> impl_;
};

/// Host-pool bytes currently held by offloaded tensors of every Offloader
/// and by the optimizer's offloaded state (not device bytes).
int64_t hostPoolBytes();
/// A flat host-pool tensor (outside the CPU tracking allocator; pinned for
/// copies to and from a CUDA device), uninitialized.
at::Tensor hostPoolTensor(int64_t numel, at::ScalarType dtype, bool pinned);
/// Host memory the pool has allocated, in use or idle (freed buffers are kept
/// for reuse: offloaded shapes repeat every step and pinned allocation is
/// slow).
int64_t hostPoolReservedBytes();
/// Returns the idle host-pool buffers to the system.
void releaseHostPoolCache();

} // namespace mtprt

#endif // MTPRT_TORCH_REGIONS_H
