//===- BuildInfo.h - what this runtime was built with -----------*- C++ -*-===//

#ifndef MTPRT_BUILDINFO_H
#define MTPRT_BUILDINFO_H

namespace mtprt {
/// LibTorch version the runtime was compiled against (e.g. "2.11.0").
const char *torchVersion();
/// Whether the CUDA kernels were compiled (nvcc found, not disabled).
bool cudaKernelsBuilt();
/// Whether the LibTorch-CUDA parts were built (wheel CUDA == toolkit CUDA).
bool torchCudaBuilt();
} // namespace mtprt

#endif // MTPRT_BUILDINFO_H
