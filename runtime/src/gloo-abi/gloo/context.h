// gloo::Context, declared for DistributedGloo.cpp: see ../../README.md.
// ProcessGroupGloo.hpp's inline setTimeout calls a member, so the class is
// complete here, with gloo's data members in gloo's order; no virtual
// functions. Declarations only.
#pragma once
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace gloo {

namespace transport {
class Context;
class Device;
class Pair;
class RemoteKey;
class UnboundBuffer;
} // namespace transport

class Context {
public:
  Context(int rank, int size, int base = 2);
  ~Context();

  const int rank;
  const int size;
  int base;

  std::shared_ptr<transport::Device> &getDevice();
  std::unique_ptr<transport::Pair> &getPair(int i);
  std::unique_ptr<transport::UnboundBuffer> createUnboundBuffer(void *ptr,
                                                                size_t size);
  int nextSlot(int numToSkip = 1);
  void closeConnections();
  void setTimeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds getTimeout() const;
  std::unique_ptr<transport::RemoteKey>
  deserializeRemoteKey(const std::string &serialized);

protected:
  std::shared_ptr<transport::Device> device_;
  std::shared_ptr<transport::Context> transportContext_;
  int slot_;
  std::chrono::milliseconds timeout_;
};

} // namespace gloo
