//===- PointwiseVec.h - the pointwise kernels over at::vec ------*- C++ -*-===//
//
// The CPU bodies of mtprt/kernels/Pointwise.h, templated on the row width
// (W = 0: the runtime's `width`; W > 0: a compile-time constant, which
// `mtpc build` uses with the spec's hidden size). Include from one
// translation unit per instruction set, with CPU_CAPABILITY (and, for AVX2,
// CPU_CAPABILITY_AVX2 and -mavx2 -mfma) defined as ATen's own kernels are:
// only ATen's header-only vector types are used; exp and erf come from the
// SLEEF that libtorch_cpu exports.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_KERNELS_POINTWISEVEC_H
#define MTPRT_KERNELS_POINTWISEVEC_H

#include "mtprt/kernels/Pointwise.h"

#include <ATen/cpu/vec/vec.h>

#include <cmath>

namespace mtprt::kernels::vec {
// One namespace per instruction set, as ATen's kernels: the copies differ.
inline namespace CPU_CAPABILITY {

using V = at::vec::Vectorized<float>;
constexpr int64_t kLanes = V::size();

inline float sumLanes(const V &v) {
  alignas(64) float lanes[kLanes];
  v.store(lanes);
  float s = 0.f;
  for (int64_t i = 0; i < kLanes; ++i)
    s += lanes[i];
  return s;
}

/// Loads the `n - i` (< kLanes) last elements, zero-filled.
inline V loadTail(const float *p, int64_t i, int64_t n) {
  return V::loadu(p + i, static_cast<int>(n - i));
}

/// y = (x - mu) * rs * w + b over one row: the forward and the recompute
/// share it, so the recompute reproduces the forward's output bit for bit.
inline void affineRow(const float *xr, float mu, float rs, const float *w,
                      const float *b, float *yr, int64_t n) {
  const int64_t body = n - n % kLanes;
  const V vmu(mu), vrs(rs);
  for (int64_t i = 0; i < body; i += kLanes) {
    V xhat = (V::loadu(xr + i) - vmu) * vrs;
    at::vec::fmadd(xhat, V::loadu(w + i), V::loadu(b + i)).store(yr + i);
  }
  for (int64_t i = body; i < n; ++i)
    yr[i] = std::fma((xr[i] - mu) * rs, w[i], b[i]);
}

template <int64_t W>
void normForward(const float *x, const float *w, const float *b, float *y,
                 float *mean, float *rstd, int64_t rows, int64_t width,
                 float eps) {
  const int64_t n = W ? W : width;
  const int64_t body = n - n % kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * n;
    float *yr = y + r * n;
    // Two passes (mean, then the centred squares): as accurate as ATen's.
    V acc(0.f);
    for (int64_t i = 0; i < body; i += kLanes)
      acc = acc + V::loadu(xr + i);
    if (body < n)
      acc = acc + loadTail(xr, body, n);
    const float mu = sumLanes(acc) / static_cast<float>(n);
    const V vmu(mu);
    V sq(0.f);
    for (int64_t i = 0; i < body; i += kLanes) {
      V c = V::loadu(xr + i) - vmu;
      sq = at::vec::fmadd(c, c, sq);
    }
    float tail = 0.f;
    for (int64_t i = body; i < n; ++i)
      tail += (xr[i] - mu) * (xr[i] - mu);
    const float var = (sumLanes(sq) + tail) / static_cast<float>(n);
    const float rs = 1.f / std::sqrt(var + eps);
    mean[r] = mu;
    rstd[r] = rs;
    affineRow(xr, mu, rs, w, b, yr, n);
  }
}

template <int64_t W>
void normRecompute(const float *x, const float *mean, const float *rstd,
                   const float *w, const float *b, float *y, int64_t rows,
                   int64_t width) {
  const int64_t n = W ? W : width;
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * n;
    float *yr = y + r * n;
    affineRow(xr, mean[r], rstd[r], w, b, yr, n);
  }
}

template <int64_t W>
void normBackward(const float *x, const float *mean, const float *rstd,
                  const float *w, const float *dy, float *dx, float *dw,
                  float *db, int64_t rows, int64_t width) {
  const int64_t n = W ? W : width;
  const int64_t body = n - n % kLanes;
  const float inv = 1.f / static_cast<float>(n);
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * n, *dyr = dy + r * n;
    float *dxr = dx + r * n;
    const float mu = mean[r], rs = rstd[r];
    const V vmu(mu), vrs(rs);
    // g = dy * w; s1 = Σ g, s2 = Σ g * xhat; dw += dy * xhat, db += dy.
    V s1(0.f), s2(0.f);
    for (int64_t i = 0; i < body; i += kLanes) {
      V xhat = (V::loadu(xr + i) - vmu) * vrs;
      V d = V::loadu(dyr + i);
      V g = d * V::loadu(w + i);
      s1 = s1 + g;
      s2 = at::vec::fmadd(g, xhat, s2);
      at::vec::fmadd(d, xhat, V::loadu(dw + i)).store(dw + i);
      (V::loadu(db + i) + d).store(db + i);
    }
    float t1 = 0.f, t2 = 0.f;
    for (int64_t i = body; i < n; ++i) {
      const float xhat = (xr[i] - mu) * rs, g = dyr[i] * w[i];
      t1 += g;
      t2 += g * xhat;
      dw[i] += dyr[i] * xhat;
      db[i] += dyr[i];
    }
    const float m1 = (sumLanes(s1) + t1) * inv, m2 = (sumLanes(s2) + t2) * inv;
    const V vm1(m1), vm2(m2);
    for (int64_t i = 0; i < body; i += kLanes) {
      V xhat = (V::loadu(xr + i) - vmu) * vrs;
      V g = V::loadu(dyr + i) * V::loadu(w + i);
      ((g - vm1 - xhat * vm2) * vrs).store(dxr + i);
    }
    for (int64_t i = body; i < n; ++i) {
      const float xhat = (xr[i] - mu) * rs;
      dxr[i] = (dyr[i] * w[i] - m1 - xhat * m2) * rs;
    }
  }
}

inline void geluForward(const float *u, float *g, int64_t n) {
  const V half(0.5f), one(1.f), rsqrt2(static_cast<float>(M_SQRT1_2));
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    V x = V::loadu(u + i);
    (x * half * (one + (x * rsqrt2).erf())).store(g + i);
  }
  if (i < n) {
    V x = loadTail(u, i, n);
    (x * half * (one + (x * rsqrt2).erf())).store(g + i, static_cast<int>(n - i));
  }
}

inline void geluBackward(const float *u, const float *dg, float *du,
                         int64_t n) {
  // GELU'(u) = Φ(u) + u φ(u), as ATen's gelu_backward computes it.
  const V half(0.5f), one(1.f), rsqrt2(static_cast<float>(M_SQRT1_2)),
      beta(static_cast<float>(M_2_SQRTPI * M_SQRT1_2 * 0.5)), mhalf(-0.5f);
  auto step = [&](V x, V d) {
    V cdf = half * (one + (x * rsqrt2).erf());
    V pdf = beta * (mhalf * x * x).exp();
    return d * at::vec::fmadd(x, pdf, cdf);
  };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    step(V::loadu(u + i), V::loadu(dg + i)).store(du + i);
  if (i < n)
    step(loadTail(u, i, n), loadTail(dg, i, n))
        .store(du + i, static_cast<int>(n - i));
}

/// The kernel table of one width.
template <int64_t W> PointwiseCpu table() {
  PointwiseCpu t;
  t.normForward = normForward<W>;
  t.normRecompute = normRecompute<W>;
  t.normBackward = normBackward<W>;
  t.geluForward = geluForward;
  t.geluBackward = geluBackward;
  return t;
}

} // namespace CPU_CAPABILITY
} // namespace mtprt::kernels::vec

#endif // MTPRT_KERNELS_POINTWISEVEC_H
