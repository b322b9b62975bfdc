//===- DistributedGloo.cpp - the gloo process group for CPU tensors -------===//
//
// The one translation unit that includes c10d's ProcessGroupGloo.hpp, as
// DistributedNccl.cpp is for NCCL. That header includes gloo's own headers,
// which the torch wheel does not ship; this file is compiled against the
// declarations in gloo-abi/ (gloo's interface at the commit the pinned torch
// was built from: gloo-abi/README.md) or, where configured, against real
// gloo headers (MTPRT_GLOO_INCLUDE_DIR). Nothing of gloo's is defined here:
// every gloo and ProcessGroupGloo function this file uses is libtorch's
// (runtime/cmake/CheckGlooObject.cmake checks this file's object), and
// GlooBackend.DeclarationsMatchLibTorch checks the declarations against the
// library's GlooStore.
//
//===----------------------------------------------------------------------===//

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
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

/// Calls every virtual function of gloo::rendezvous::Store, as declared here,
/// on the store libtorch's ProcessGroupGloo made (its GlooStore over an
/// in-memory c10d store): a declaration out of step with the library's vtable
/// calls the wrong function and the round trip shows it. Returns "" when all
/// agree, else what did not. For the runtime's tests.
std::string glooStoreRoundTrip() {
  auto c10dStore = c10::make_intrusive<c10d::HashStore>();
  auto options =
      c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
  options->devices.push_back(
      c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto group =
      c10::make_intrusive<c10d::ProcessGroupGloo>(c10dStore, 0, 1, options);
  ::gloo::rendezvous::Store &s = *group->_getStore();

  std::string bad;
  auto expect = [&](bool ok, const char *what) {
    if (!ok)
      bad += std::string(bad.empty() ? "" : "; ") + what;
  };
  auto bytes = [](const std::string &x) {
    return std::vector<char>(x.begin(), x.end());
  };
  auto text = [](const std::vector<uint8_t> &x) {
    return std::string(x.begin(), x.end());
  };
  const std::chrono::milliseconds shortWait(2000);

  s.set("mtprt/a", bytes("one"));
  expect(c10dStore->check({"mtprt/a"}) &&
             text(c10dStore->get("mtprt/a")) == "one",
         "set");
  c10dStore->set("mtprt/b", std::vector<uint8_t>{'t', 'w', 'o'});
  expect(s.get("mtprt/b") == bytes("two"), "get");
  s.wait({"mtprt/a", "mtprt/b"}, shortWait); // returns: both are there
  s.wait({"mtprt/a", "mtprt/b"});
#ifdef GLOO_SHARED_STORE
  expect(s.wait_get("mtprt/b", shortWait) == bytes("two"), "wait_get");
#endif
#ifdef GLOO_STORE_HAS_STORE_V2
  expect(s.has_v2_support() == c10dStore->hasExtendedApi(), "has_v2_support");
  if (c10dStore->hasExtendedApi()) {
    s.multi_set({"mtprt/c", "mtprt/d"}, {bytes("3"), bytes("4")});
    expect(text(c10dStore->get("mtprt/c")) == "3" &&
               text(c10dStore->get("mtprt/d")) == "4",
           "multi_set");
    const auto got = s.multi_get({"mtprt/a", "mtprt/d"});
    expect(got.size() == 2 && got[0] == bytes("one") && got[1] == bytes("4"),
           "multi_get");
    s.append("mtprt/a", bytes("+"));
    expect(text(c10dStore->get("mtprt/a")) == "one+", "append");
    expect(s.add("mtprt/n", 5) == 5 && s.add("mtprt/n", 2) == 7, "add");
  }
#endif
  return bad;
}

namespace {
/// The vtable slot of a virtual member function, from its pointer to member
/// (Itanium C++ ABI: 1 + the slot's byte offset in the vtable).
template <typename F> std::ptrdiff_t slotOf(F f) {
  struct {
    std::ptrdiff_t ptr, adj;
  } rep;
  static_assert(sizeof(F) == sizeof(rep), "an Itanium pointer to member");
  std::memcpy(&rep, &f, sizeof rep);
  return (rep.ptr - 1) / std::ptrdiff_t(sizeof(void *));
}
} // namespace

/// The size of GlooStore's vtable as the gloo headers this file was
/// compiled with make it: its offset to top and typeinfo, then a slot for
/// each virtual function up to the last of gloo::rendezvous::Store's
/// (GlooStore adds none). The runtime's tests compare it with the vtable
/// libtorch exports.
std::size_t glooStoreVtableBytes() {
  using S = ::gloo::rendezvous::Store;
  using Keys = const std::vector<std::string> &;
  const std::ptrdiff_t slots[] = {
    slotOf(&S::set),
    slotOf(&S::get),
    slotOf(static_cast<void (S::*)(Keys)>(&S::wait)),
    slotOf(static_cast<void (S::*)(Keys, const std::chrono::milliseconds &)>(
        &S::wait)),
#ifdef GLOO_SHARED_STORE
    slotOf(&S::wait_get),
#endif
#ifdef GLOO_STORE_HAS_STORE_V2
    slotOf(&S::has_v2_support),
    slotOf(&S::multi_get),
    slotOf(&S::multi_set),
    slotOf(&S::append),
    slotOf(&S::add),
#endif
  };
  std::ptrdiff_t last = 0;
  for (std::ptrdiff_t slot : slots)
    last = std::max(last, slot);
  return std::size_t(2 + last + 1) * sizeof(void *);
}

} // namespace mtprt::detail
