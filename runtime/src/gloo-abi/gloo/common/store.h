// gloo's store interface (gloo::IStore), declared for DistributedGloo.cpp:
// see ../../README.md. Its virtual functions in gloo's order, since the
// vtable of libtorch's GlooStore begins with them. Declarations only: no
// body here can stand in for libtorch's.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#define GLOO_SHARED_STORE

namespace gloo {

class IStore {
public:
  virtual ~IStore();
  virtual void set(const std::string &key, const std::vector<char> &data) = 0;
  virtual std::vector<char> get(const std::string &key) = 0;
  virtual std::vector<char> wait_get(const std::string &key,
                                     const std::chrono::milliseconds &timeout);
  virtual void wait(const std::vector<std::string> &keys,
                    const std::chrono::milliseconds &timeout) = 0;
  virtual bool has_v2_support() = 0;
  virtual std::vector<std::vector<char>>
  multi_get(const std::vector<std::string> &keys) = 0;
  virtual void multi_set(const std::vector<std::string> &keys,
                         const std::vector<std::vector<char>> &values) = 0;
  virtual void append(const std::string &key,
                      const std::vector<char> &value) = 0;
  virtual int64_t add(const std::string &key, int64_t value) = 0;
};

} // namespace gloo
