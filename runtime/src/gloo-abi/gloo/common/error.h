// Included by ProcessGroupGloo.hpp, which names nothing from it (see
// ../../README.md).
#pragma once
