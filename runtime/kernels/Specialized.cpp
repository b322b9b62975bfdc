//===- Specialized.cpp - the registry of specialized kernels --------------===//

#include "mtprt/kernels/Specialized.h"

#include <atomic>

namespace mtprt::kernels {
namespace {
Specialized registered;
std::atomic<int64_t> launches{0};
} // namespace

void setSpecialized(const Specialized &kernels) { registered = kernels; }
const Specialized &specialized() { return registered; }
int64_t specializedLaunches() { return launches.load(); }
void countSpecializedLaunch() { launches.fetch_add(1); }

} // namespace mtprt::kernels
