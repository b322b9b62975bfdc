//===- PointwiseCpu.cpp - the generic-width pointwise kernels -------------===//
//
// Compiled once per instruction set (runtime/kernels/CMakeLists.txt):
// CPU_CAPABILITY=DEFAULT, AVX2 (-mavx2 -mfma) and AVX512 (-mavx512f/bw/vl/dq);
// each defines its table in its own namespace.
//
//===----------------------------------------------------------------------===//

#include "mtprt/kernels/PointwiseVec.h"

#define MTPRT_CAT2(a, b) a##b
#define MTPRT_CAT(a, b) MTPRT_CAT2(a, b)

namespace mtprt::kernels {
const PointwiseCpu &MTPRT_CAT(pointwiseTable, CPU_CAPABILITY)() {
  static const PointwiseCpu t = vec::table<0>();
  return t;
}
} // namespace mtprt::kernels
