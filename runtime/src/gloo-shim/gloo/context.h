// See README.md: declarations for c10d/ProcessGroupGloo.hpp only. The one
// member its inline code names (never called by mtprt).
#pragma once
#include <chrono>
namespace gloo {
class Context {
public:
  void setTimeout(std::chrono::milliseconds timeout);
};
} // namespace gloo
