// See README.md: declarations for c10d/ProcessGroupGloo.hpp only.
#pragma once
