//===- Pointwise.cpp - which pointwise kernels this CPU runs --------------===//

#include "mtprt/kernels/Pointwise.h"

#include <string>

namespace mtprt::kernels {

const PointwiseCpu &pointwiseTableDEFAULT();
#ifdef MTPRT_HAVE_AVX2_KERNELS
const PointwiseCpu &pointwiseTableAVX2();
#endif

bool cpuHasAvx2Fma() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

const PointwiseCpu &pointwiseCpu() {
#ifdef MTPRT_HAVE_AVX2_KERNELS
  if (cpuHasAvx2Fma())
    return pointwiseTableAVX2();
#endif
  return pointwiseTableDEFAULT();
}

const PointwiseCpu *pointwiseCpuFor(const char *isa) {
  const std::string name = isa;
  if (name == "default")
    return &pointwiseTableDEFAULT();
#ifdef MTPRT_HAVE_AVX2_KERNELS
  if (name == "avx2" && cpuHasAvx2Fma())
    return &pointwiseTableAVX2();
#endif
  return nullptr;
}

const char *pointwiseCpuIsa() {
#ifdef MTPRT_HAVE_AVX2_KERNELS
  if (cpuHasAvx2Fma())
    return "avx2";
#endif
  return "default";
}

} // namespace mtprt::kernels
