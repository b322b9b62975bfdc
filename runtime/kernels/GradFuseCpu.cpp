//===- GradFuseCpu.cpp - mask–clip–weight–accumulate, CPU twin ------------===//

#include "mtprt/kernels/GradFuse.h"

#include <algorithm>
#include <cmath>

namespace mtprt::kernels {

float clipWeightScale(double norm, double maxNorm, double alpha) {
  double s = alpha;
  if (maxNorm > 0 && norm > maxNorm)
    s *= maxNorm / norm;
  return static_cast<float>(s);
}

void maskBinsCpu(float *spectrum, int64_t rows, int64_t bins, int64_t keep) {
  if (keep >= bins)
    return;
  for (int64_t r = 0; r < rows; ++r)
    std::fill(spectrum + 2 * (r * bins + keep), spectrum + 2 * (r + 1) * bins,
              0.f);
}

double sumSquaresCpu(const float *x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i)
    s += static_cast<double>(x[i]) * x[i];
  return s;
}

void scaleAccumulateCpu(const float *g, int64_t n, float scale, float *acc) {
  for (int64_t i = 0; i < n; ++i)
    acc[i] += scale * g[i];
}

} // namespace mtprt::kernels
