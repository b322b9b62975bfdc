//===- Adapters.h - NPD gated per-task adapters (D13) -----------*- C++ -*-===//
//
// `strategy { adapters = ... }`: every task gets its own bottleneck adapter
// on what its head reads (the tap; a classify head's first token), mixed in
// by a gate of the task and the input (docs/techniques.md D13):
//
//   u = up(relu(down(x)))                 down: H -> r, up: r -> H (zero-init)
//   g = σ(a_t + w_t ⊙ mean_seq(x))        a_t, w_t ∈ R^H, one gate per channel
//   y = g·x + (1 − g)·(x + u) = x + (1 − g)·u
//
// — the source's y = g(x)·f_base(x) + (1 − g(x))·f_adapter(x) with f_base the
// backbone's output at the tap and f_adapter a residual bottleneck on it. The
// up-projection starts at zero, so a fresh adapter is the identity and
// training starts from the plain head's function. The gate-separation loss
// pushes the tasks' gates apart: with G_t the batch mean of task t's gate,
// separation · mean over pairs i < j of cos(G_i, G_j) is added to the loss
// (its gradient reaches the gates' own parameters only; the source's code
// divides the upper triangle's sum by T², a constant the weight absorbs).
//
// The adapter and its gate are the task's head's parameters (trained,
// clipped and checkpointed with it). With `share = T` (npd(share = T)) tasks
// whose declared correlation reaches T (transitively: `correlate` pairs, as
// task-granular checkpointing groups them) read one adapter, the group's
// first task's (in forward order), which holds it among its head's
// parameters; every task keeps its own gate, and each member's backward adds
// its part to the shared adapter's gradient. Tasks below T — in conflict —
// keep isolated adapters (D14's "isolated adapter groups"). One definition
// for the compiler (which plans them) and the runtime. Torch-free and
// LLVM-free.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_ADAPTERS_H
#define MTPRT_ADAPTERS_H

#include "mtprt/Limits.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace mtprt {

struct AdapterConfig {
  /// The bottleneck width r; 0: about kSourceShare of the backbone's
  /// parameters per task (bottleneckFor).
  int64_t bottleneck = 0;
  /// Weight of the gate-separation loss (ours: the source names none).
  double separation = 0.1;
  /// The correlation at which tasks share an adapter (none: each its own).
  std::optional<double> share;
  /// Per task (the plan's head order): the task whose adapter it reads —
  /// itself, or its group's first. Empty: every task its own.
  std::vector<int64_t> owner;
  /// npd(share = T, regroup = N): every N steps (and at every phase's end)
  /// each group's members' gradients on their shared adapter are measured
  /// and the group splits where they no longer reach T (regroupedOwners);
  /// 0: the groups stay as the spec formed them.
  int64_t regroup = 0;

  /// The groups after a measurement: `cos[i][j]` the cosine of heads i's
  /// and j's gradients on the adapter they share (NaN where unmeasured: a
  /// task without labels in the batch). Members stay together where a chain
  /// of pairs at `threshold` or more joins them (transitively, as the spec's
  /// groups form); a part of a group leaves its holder only on evidence —
  /// some measured pair between it and the holder's part, all below the
  /// threshold — so a task measured against nobody, or only against others
  /// that leave, stays (and a holder without labels in the batch keeps its
  /// group). Groups only split — a task never drops the adapter
  /// it trained for another's — so each new group's first member (in
  /// forward order) holds a copy of the old adapter, and the old owner keeps
  /// its own.
  static std::vector<int64_t>
  regroupedOwners(const std::vector<int64_t> &owner,
                  const std::vector<std::vector<double>> &cos,
                  double threshold) {
    const size_t n = owner.size();
    std::vector<int64_t> root(n);
    for (size_t i = 0; i < n; ++i)
      root[i] = int64_t(i);
    auto find = [&](int64_t i) {
      while (root[size_t(i)] != i)
        i = root[size_t(i)] = root[size_t(root[size_t(i)])];
      return i;
    };
    auto join = [&](int64_t a, int64_t b) {
      a = find(a), b = find(b);
      root[size_t(std::max(a, b))] = std::min(a, b);
    };
    auto at = [&](size_t i, size_t j) {
      return i < cos.size() && j < cos[i].size()
                 ? cos[i][j]
                 : std::numeric_limits<double>::quiet_NaN();
    };
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < n; ++j)
        if (j != i && owner[j] == owner[i] && at(i, j) >= threshold)
          join(int64_t(i), int64_t(j));
    // Parts with no measured pair to their holder's part (as the threshold
    // formed it) rejoin it: one pass over the parts as they stand, so the
    // order they are looked at in does not matter.
    std::vector<int64_t> part(n);
    for (size_t i = 0; i < n; ++i)
      part[i] = find(int64_t(i));
    std::vector<bool> evidence(n, false); // per part root
    for (size_t k = 0; k < n; ++k)
      for (size_t j = 0; j < n; ++j)
        if (part[k] != part[j] && part[j] == part[size_t(owner[k])] &&
            !std::isnan(at(k, j)))
          evidence[size_t(part[k])] = true;
    for (size_t i = 0; i < n; ++i)
      if (part[i] != part[size_t(owner[i])] && !evidence[size_t(part[i])])
        join(int64_t(i), owner[i]);
    // The union keeps each component's lowest index as its root: the old
    // owner for its own component, the first member for a new one.
    std::vector<int64_t> out(n);
    for (size_t i = 0; i < n; ++i)
      out[i] = find(int64_t(i));
    return out;
  }

  int64_t ownerOf(int64_t task) const {
    return owner.empty() ? task : owner[size_t(task)];
  }

  /// Why `owner` cannot serve `tasks` tasks; empty when it can. The plan
  /// reader and the model ask this one rule: each task reads its own
  /// adapter or an earlier task's that reads its own (a group's first).
  std::string ownerProblem(size_t tasks) const {
    if (owner.empty())
      return {};
    if (owner.size() != tasks)
      return "has " + std::to_string(owner.size()) + " entries for " +
             std::to_string(tasks) + " heads";
    for (size_t i = 0; i < owner.size(); ++i) {
      const int64_t o = owner[i];
      if (o < 0 || o > int64_t(i) || (o != int64_t(i) && owner[size_t(o)] != o))
        return "head " + std::to_string(i) + " reads head " +
               std::to_string(o) +
               "'s adapter, which is not an earlier head's own";
    }
    return {};
  }

  /// Why `next` (owners per task) is not a split of these groups; empty
  /// when it is: a valid ownership (ownerProblem) in which every task reads
  /// an adapter of its own group — groups only split. Model::splitAdapters
  /// and a checkpoint's resume ask this one rule.
  std::string splitProblem(const std::vector<int64_t> &next,
                           size_t tasks) const {
    AdapterConfig split = *this;
    split.owner = next;
    if (std::string why = split.ownerProblem(tasks); !why.empty())
      return why;
    for (size_t h = 0; h < tasks; ++h)
      if (ownerOf(split.ownerOf(int64_t(h))) != ownerOf(int64_t(h)))
        return "head " + std::to_string(h) +
               " would join another group (head " +
               std::to_string(split.ownerOf(int64_t(h))) +
               "'s): groups only split";
    return {};
  }

  /// The source's "about 0.1% of the parameters" per adapter.
  static constexpr double kSourceShare = 1e-3;

  /// Parameters of one task's adapter and gate at hidden `h`, bottleneck r:
  /// down (h·r + r), up (r·h + h), the gate's a and w (2h).
  static int64_t parameters(int64_t h, int64_t r) {
    return adapterParameters(h, r) + gateParameters(h);
  }
  /// The bottleneck's alone (down and up): what a group of tasks shares.
  static int64_t adapterParameters(int64_t h, int64_t r) {
    return h * r + r + r * h + h;
  }
  /// The gate's (a and w): every task's own.
  static int64_t gateParameters(int64_t h) { return 2 * h; }
  /// The bottleneck this config gives a backbone of `backboneParameters`
  /// at hidden `h`: the explicit one, else the width whose adapter is
  /// nearest kSourceShare of the backbone, in [1, h].
  int64_t bottleneckFor(int64_t h, int64_t backboneParameters) const {
    if (bottleneck > 0)
      return bottleneck;
    const double r = (kSourceShare * double(backboneParameters) - 3.0 * h) /
                     (2.0 * h + 1.0);
    return std::clamp<int64_t>(int64_t(std::nearbyint(r)), 1, std::max<int64_t>(h, 1));
  }
};

namespace limits {
inline constexpr Range kAdapterBottleneck{1, int64_t(1) << 20};
inline constexpr RealRange kAdapterSeparation{0.0, 1e6};
inline constexpr RealRange kAdapterShare{-1.0, 1.0};
inline constexpr Range kAdapterRegroup{1, int64_t(1) << 40};
} // namespace limits

} // namespace mtprt

#endif // MTPRT_ADAPTERS_H
