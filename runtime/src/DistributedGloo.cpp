//===- DistributedGloo.cpp - the gloo process group for CPU tensors -------===//
//
// The one translation unit that includes c10d's ProcessGroupGloo.hpp, as
// DistributedNccl.cpp is for NCCL. That header includes gloo's own headers,
// which the torch wheel does not ship; this file is compiled against the
// declarations in gloo-abi/ (gloo's interface at the commit the pinned torch
// was built from: gloo-abi/README.md) or, where configured, against real
// gloo headers (MTPRT_GLOO_INCLUDE_DIR). Nothing of gloo's is defined here:
// every gloo and ProcessGroupGloo function this file uses is libtorch's
// (runtime/cmake/CheckGlooObject.cmake checks this file's object).
//
//===----------------------------------------------------------------------===//

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

namespace mtprt::detail {

c10::intrusive_ptr<c10d::Backend>
makeGlooBackend(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                int world, std::chrono::milliseconds timeout,
                const std::string &masterAddr) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // Bind where the master is reachable from: loopback for a one-machine
  // run, the host's address (or GLOO_SOCKET_IFNAME) otherwise.
  if (const char *ifname = std::getenv("GLOO_SOCKET_IFNAME");
      ifname && *ifname)
    options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  else if (masterAddr == "127.0.0.1" || masterAddr == "localhost")
    options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  else
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world,
                                                     options);
}

} // namespace mtprt::detail
