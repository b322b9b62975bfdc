// gloo's transport types, for DistributedGloo.cpp: see ../../README.md.
// ProcessGroupGloo.hpp holds them only through smart pointers, so they stay
// incomplete here.
#pragma once
#include "gloo/context.h"

namespace gloo::transport {
class Buffer;
class Device;
class Pair;
class UnboundBuffer;
} // namespace gloo::transport
