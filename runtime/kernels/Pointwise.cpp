//===- Pointwise.cpp - which pointwise kernels this CPU runs --------------===//

#include "mtprt/kernels/Pointwise.h"

#include <string>

namespace mtprt::kernels {

const PointwiseCpu &pointwiseTableDEFAULT();
#ifdef MTPRT_HAVE_AVX2_KERNELS
const PointwiseCpu &pointwiseTableAVX2();
#endif
#ifdef MTPRT_HAVE_AVX512_KERNELS
const PointwiseCpu &pointwiseTableAVX512();
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

bool cpuHasAvx512() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

const PointwiseCpu &pointwiseCpu() {
#ifdef MTPRT_HAVE_AVX512_KERNELS
  if (cpuHasAvx512())
    return pointwiseTableAVX512();
#endif
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
#ifdef MTPRT_HAVE_AVX512_KERNELS
  if (name == "avx512" && cpuHasAvx512())
    return &pointwiseTableAVX512();
#endif
  return nullptr;
}

const char *pointwiseCpuIsa() {
#ifdef MTPRT_HAVE_AVX512_KERNELS
  if (cpuHasAvx512())
    return "avx512";
#endif
#ifdef MTPRT_HAVE_AVX2_KERNELS
  if (cpuHasAvx2Fma())
    return "avx2";
#endif
  return "default";
}

} // namespace mtprt::kernels
