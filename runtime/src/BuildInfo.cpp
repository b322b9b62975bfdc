//===- BuildInfo.cpp - what this runtime was built with -------------------===//

#include "mtprt/BuildInfo.h"

namespace mtprt {

const char *torchVersion() { return MTPRT_TORCH_VERSION; }

bool cudaKernelsBuilt() {
#ifdef MTPRT_CUDA_KERNELS_BUILT
  return true;
#else
  return false;
#endif
}

bool torchCudaBuilt() {
#ifdef MTPRT_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

} // namespace mtprt
