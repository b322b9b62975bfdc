//===- DistributedNccl.cpp - the NCCL process group for CUDA tensors ------===//
//
// Its own translation unit: ProcessGroupNCCL.hpp is large and needs nccl.h
// (the wheel's nvidia/nccl headers, which match the NCCL torch was built
// with). Compiled only with MTPRT_TORCH_CUDA.
//
//===----------------------------------------------------------------------===//

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <chrono>

namespace mtprt::detail {

c10::intrusive_ptr<c10d::Backend>
makeNcclBackend(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                int world, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world,
                                                     options);
}

} // namespace mtprt::detail
