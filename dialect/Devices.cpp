//===- Devices.cpp - device presets ---------------------------------------===//
//
// Figures from the vendors' data sheets (SXM parts; dense, no sparsity).
// "A100_32GB" is the source documents' device: an A100 with 32 GiB usable.
// PCIe 4.0 x16 carries 32 GB/s per direction, PCIe 5.0 x16 64 GB/s.
// Between GPUs, NVLink 3 (A100) 300 GB/s per direction, NVLink 4 (H100,
// H200) 450 GB/s; NCCL's measured bus bandwidth reaches ~75-80% of them,
// which `interconnect` in the budget (or a measured figure) sets.
//
//===----------------------------------------------------------------------===//

#include "dialect/Devices.h"

using namespace mtp;

static constexpr int64_t GiB = int64_t(1) << 30;

static const DevicePreset kPresets[] = {
    // name         memory      headroom  HBM B/s   link B/s  fp32    bf16     fp16   gpu  kernel
    {"A100_32GB", 32 * GiB, 2 * GiB, 1.555e12, 32000000000, 19.5e12, 312e12,
     312e12, true, 4e-6, 300e9, 10e-6, 10e-6},
    {"A100_40GB", 40 * GiB, 2 * GiB, 1.555e12, 32000000000, 19.5e12, 312e12,
     312e12, true, 4e-6, 300e9, 10e-6, 10e-6},
    {"A100_80GB", 80 * GiB, 2 * GiB, 2.039e12, 32000000000, 19.5e12, 312e12,
     312e12, true, 4e-6, 300e9, 10e-6, 10e-6},
    {"H100_80GB", 80 * GiB, 2 * GiB, 3.35e12, 64000000000, 67e12, 989e12,
     989e12, true, 4e-6, 450e9, 10e-6, 10e-6},
    {"H200_141GB", 141 * GiB, 2 * GiB, 4.8e12, 64000000000, 67e12, 989e12,
     989e12, true, 4e-6, 450e9, 10e-6, 10e-6},
    // A CPU "device": offload copies stay in the same RAM (memcpy speed).
    // Compute and bandwidth of one modern core (AVX-512 FMA GEMMs at
    // ~150 GFLOP/s, a ~15 GB/s stream): a step on one thread; set
    // peak_tflops and hbm_bandwidth for more, or measure (mtpc profile).
    // Processes on one host exchange over gloo on loopback TCP: ~1.5 GB/s
    // and ~1 ms a message on this project's 2-core machine (2 and 4
    // processes, 1-16 MB all-reduces and sends); a broadcast's step ~0.15
    // ms (4 KiB at 2 processes: 0.15 ms; docs/cost-model.md).
    {"cpu", 16 * GiB, 0, 15e9, 10000000000, 150e9, 75e9, 75e9, false, 2e-6,
     1.5e9, 1e-3, 0.15e-3},
};

llvm::ArrayRef<DevicePreset> mtp::devicePresets() { return kPresets; }

const DevicePreset *mtp::lookupDevicePreset(llvm::StringRef name) {
  for (const DevicePreset &preset : kPresets)
    if (preset.name == name)
      return &preset;
  return nullptr;
}
