// See README.md: declarations for c10d/ProcessGroupGloo.hpp only.
#pragma once
namespace gloo::transport {
class Device;
class UnboundBuffer;
} // namespace gloo::transport
