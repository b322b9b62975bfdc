//===- BlockQuantCpu.cpp - 8-bit block quantization, CPU twin -------------===//

#include "mtprt/kernels/BlockQuant.h"

#include <algorithm>
#include <cmath>

namespace mtprt::kernels {

void blockQuantizeCpu(const float *values, int64_t n, int64_t block,
                      int8_t *codes, float *scales) {
  for (int64_t b = 0, nb = numBlocks(n, block); b < nb; ++b) {
    const int64_t lo = b * block, hi = std::min(n, lo + block);
    float absmax = 0.f;
    for (int64_t i = lo; i < hi; ++i)
      absmax = std::max(absmax, std::fabs(values[i]));
    const float scale = absmax / 127.5f;
    scales[b] = scale;
    for (int64_t i = lo; i < hi; ++i) {
      // Same expression as the CUDA kernel, so both round identically.
      const float q = scale > 0.f ? std::nearbyint(values[i] / scale) : 0.f;
      codes[i] = static_cast<int8_t>(std::clamp(q, -127.f, 127.f));
    }
  }
}

void blockDequantizeCpu(const int8_t *codes, const float *scales, int64_t n,
                        int64_t block, float *values) {
  for (int64_t i = 0; i < n; ++i)
    values[i] = static_cast<float>(codes[i]) * scales[i / block];
}

} // namespace mtprt::kernels
