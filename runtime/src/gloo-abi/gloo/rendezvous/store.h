// gloo's rendezvous store, the base class of libtorch's
// c10d::ProcessGroupGloo::GlooStore, declared for DistributedGloo.cpp: see
// ../../README.md. Its vtable is IStore's followed by the one function it
// adds, wait(keys); GLOO_STORE_HAS_STORE_V2 makes ProcessGroupGloo.hpp
// declare GlooStore's overrides of the v2 functions, as it did when libtorch
// was built. Declarations only.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "gloo/common/error.h"
#include "gloo/common/store.h"

#define GLOO_STORE_HAS_STORE_V2 1

namespace gloo::rendezvous {

class Store : public IStore {
public:
  ~Store() override;
  void set(const std::string &key, const std::vector<char> &data) override = 0;
  std::vector<char> get(const std::string &key) override = 0;
  virtual void wait(const std::vector<std::string> &keys) = 0;
  void wait(const std::vector<std::string> &keys,
            const std::chrono::milliseconds &timeout) override;
  bool has_v2_support() override;
  std::vector<std::vector<char>>
  multi_get(const std::vector<std::string> &keys) override;
  void multi_set(const std::vector<std::string> &keys,
                 const std::vector<std::vector<char>> &values) override;
  void append(const std::string &key, const std::vector<char> &data) override;
  int64_t add(const std::string &key, int64_t value) override;
};

} // namespace gloo::rendezvous
