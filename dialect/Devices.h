//===- Devices.h - device presets -------------------------------*- C++ -*-===//
//
// What a `device = NAME` in a spec's budget means: memory, bandwidths and
// peak throughput. The frontend resolves a preset into the budget op's
// explicit fields; the cost model reads the rest. Every field can be
// overridden in the spec.
//
//===----------------------------------------------------------------------===//

#ifndef MTPC_DIALECT_DEVICES_H
#define MTPC_DIALECT_DEVICES_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>

namespace mtp {

struct DevicePreset {
  llvm::StringLiteral name;
  /// Device memory in bytes.
  int64_t memoryBytes;
  /// Default headroom a plan leaves free (docs/contracts.md#headroom: 2 GiB on GPUs, 0 on cpu).
  int64_t headroomBytes;
  /// Device memory bandwidth, bytes/s.
  double memoryBandwidth;
  /// Host link bandwidth per direction, bytes/s (PCIe x16 theoretical).
  int64_t linkBandwidth;
  /// Peak dense FLOP/s for fp32 (no TF32), bf16 and fp16 matrix math.
  double fp32Flops, bf16Flops, fp16Flops;
  bool isGpu;
  /// Seconds one kernel costs however small: a GPU's launch, a CPU op's
  /// dispatch through ATen. What an update of many small tensors is made of.
  double kernelLatency;
  /// Between devices of one node (the collectives' bus), bytes/s per
  /// direction, and the seconds each message step costs however small
  /// (CostModel::collectiveSeconds).
  double interconnectBandwidth, messageLatency;
  /// The seconds of one message step of a broadcast (a tree's level), where
  /// the library's broadcast costs less than its other collectives' steps
  /// (gloo on loopback); messageLatency elsewhere.
  double broadcastLatency;
};

/// All presets, in the order the docs list them.
llvm::ArrayRef<DevicePreset> devicePresets();
/// The preset called `name`, or null.
const DevicePreset *lookupDevicePreset(llvm::StringRef name);

/// Whether one fused scaled-dot-product-attention kernel can run attention
/// with `dropout` on a GPU or the CPU: the flash / memory-efficient CUDA
/// kernels take dropout, the flash CPU kernel does not (LibTorch's CPU
/// dispatch falls back to its math path, which keeps a float dropout noise
/// tensor: mtp's own math path with a one-byte mask is then leaner).
inline bool fusedAttentionServes(bool gpu, double dropout) {
  return gpu || dropout == 0.0;
}

/// Whether the runtime's fused norm and GELU kernels serve a model trained
/// with (`autocast`) or without 16-bit autocast: they are fp32 kernels, and
/// under autocast the linears' 16-bit copies are what is kept anyway.
inline bool fusedPointwiseServes(bool autocast) { return !autocast; }

} // namespace mtp

#endif // MTPC_DIALECT_DEVICES_H
