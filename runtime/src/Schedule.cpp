//===- Schedule.cpp - the rule a schedule follows -------------------------===//
//
// Torch-free: the trainer checks a step's schedule with it, and the plan
// loader (and so `mtpc inspect` and the fuzz targets) the plan's decisions.
//
//===----------------------------------------------------------------------===//

#include "mtprt/Config.h"

#include <set>
#include <stdexcept>

namespace mtprt {

namespace {
[[noreturn]] void bad(const std::string &field, const std::string &why) {
  throw std::invalid_argument("mtprt: " + field + ": " + why);
}
} // namespace

void validateSchedule(const Schedule &s, int64_t layers,
                      const std::vector<HeadConfig> &heads) {
  const int64_t units = 2 * layers + 1, numHeads = int64_t(heads.size());
  std::set<int64_t> taps;
  for (const HeadConfig &h : heads)
    taps.insert(2 * h.tap); // the unit whose output is the tap
  std::vector<bool> used(static_cast<size_t>(units), false);
  for (size_t i = 0; i < s.regions.size(); ++i) {
    const auto &r = s.regions[i];
    const std::string f = "Schedule.regions[" + std::to_string(i) + "]";
    if (r.first < 0 || r.second >= units || r.first > r.second)
      bad(f, "must be a unit range [first, last] within [0, " +
                 std::to_string(units - 1) + "]");
    for (int64_t u = r.first; u <= r.second; ++u) {
      if (used[u])
        bad(f, "overlaps another region at unit " + std::to_string(u));
      used[u] = true;
      if (u < r.second && taps.count(u))
        bad(f, "contains a head's tap (unit " + std::to_string(u) +
                   ") before its end; end the region at the tap");
    }
  }
  for (size_t i = 0; i < s.offloadHeadList.size(); ++i)
    if (s.offloadHeadList[i] < 0 || s.offloadHeadList[i] >= numHeads)
      bad("Schedule.offloadHeadList[" + std::to_string(i) + "]",
          "head " + std::to_string(s.offloadHeadList[i]) + " out of range");
  // Offloaded and tensor-grain units: backbone units outside regions, and
  // each unit one or the other.
  auto blockUnit = [&](const char *list, size_t i, int64_t u,
                       const char *inRegion) {
    const std::string f =
        std::string("Schedule.") + list + "[" + std::to_string(i) + "]";
    if (u < 1 || u >= units)
      bad(f, "must be a backbone unit within [1, " + std::to_string(units - 1) +
                 "], got " + std::to_string(u));
    if (used[u])
      bad(f, "unit " + std::to_string(u) + " is inside a checkpoint region" +
                 inRegion);
    return f;
  };
  for (size_t i = 0; i < s.offloadUnits.size(); ++i)
    blockUnit("offloadUnits", i, s.offloadUnits[i],
              "; offload its boundary instead");
  std::set<int64_t> offloaded(s.offloadUnits.begin(), s.offloadUnits.end());
  for (size_t i = 0; i < s.partialUnits.size(); ++i) {
    const int64_t u = s.partialUnits[i];
    const std::string f = blockUnit("partialUnits", i, u,
                                    ", which recomputes it whole");
    if (offloaded.count(u))
      bad(f, "unit " + std::to_string(u) +
                 " is offloaded too; a block is kept, recomputed (whole or its "
                 "projections) or offloaded");
  }
  if (s.prefetchAhead < 0)
    bad("Schedule.prefetchAhead", "must be >= 0");
  std::vector<bool> seen(heads.size(), false);
  for (size_t i = 0; i < s.headOrder.size(); ++i) {
    const int64_t h = s.headOrder[i];
    if (h < 0 || h >= numHeads || seen[h])
      bad("Schedule.headOrder[" + std::to_string(i) + "]",
          "must be a permutation of the head indices");
    seen[h] = true;
  }
  if (!s.headOrder.empty() && static_cast<int64_t>(s.headOrder.size()) != numHeads)
    bad("Schedule.headOrder", "must list every head once (or be empty)");
}

} // namespace mtprt
