// RMSNorm and LayerNorm, forward and backward, over the last dim C of x (N,C).
//
// Rows are independent in the forward and in dx; the weight gradients dw (and db) sum over rows.
// Those sums are split into fixed blocks of detail::kRowBlock rows: each block writes a partial
// (C) row and the partials are added in block order, in f64 (detail::sum_partials). Row
// statistics are accumulated in f32 with 16-lane vector sums; no Welford (C is a few thousand).
// Invariant: results are bit-identical for any thread count (no sum depends on which thread ran).
#include <cmath>
#include <vector>

#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

using detail::for_blocks;
using detail::kRowBlock;

namespace {

// ---- one row / one block of rows; see the public kernels below for the formulas ----

// x, y (C): y = x * rstd * w; returns rstd.
float rmsnorm_row(const float* x, const float* w, float* y, int64_t C, float eps) {
  float ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t c = 0; c < C; ++c) ss += x[c] * x[c];
  const float r = 1.0f / std::sqrt(ss / float(C) + eps);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) y[c] = x[c] * r * w[c];
  return r;
}

// rows of (C) -> dx rows, and pdw (C) = sum over these rows of dy*xhat (overwritten).
void rmsnorm_bwd_rows(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                      float* pdw, int64_t rows, int64_t C) {
  for (int64_t c = 0; c < C; ++c) pdw[c] = 0;
  for (int64_t n = 0; n < rows; ++n) {
    const float* xr = x + n * C;
    const float* dyr = dy + n * C;
    float* dxr = dx + n * C;
    const float r = rstd[n];
    float dot = 0;  // sum_c w*dy*x
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < C; ++c) dot += w[c] * dyr[c] * xr[c];
    // rstd * xhat * mean(w*dy*xhat) = x * rstd^3 * dot / C
    const float k = r * r * r * dot / float(C);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      dxr[c] = r * w[c] * dyr[c] - k * xr[c];
      pdw[c] += dyr[c] * (xr[c] * r);
    }
  }
}

// x, y (C): y = (x - mean) * rstd * w + b; writes mean and rstd.
void layernorm_row(const float* x, const float* w, const float* b, float* y, float* mean,
                   float* rstd, int64_t C, float eps) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < C; ++c) s += x[c];
  const float m = s / float(C);
  float ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t c = 0; c < C; ++c) ss += (x[c] - m) * (x[c] - m);
  const float r = 1.0f / std::sqrt(ss / float(C) + eps);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * r * w[c] + b[c];
  *mean = m;
  *rstd = r;
}

// rows of (C) -> dx rows; pdw, pdb (C) = sums over these rows of dy*xhat and dy (overwritten).
void layernorm_bwd_rows(const float* dy, const float* x, const float* w, const float* mean,
                        const float* rstd, float* dx, float* pdw, float* pdb, int64_t rows,
                        int64_t C) {
  for (int64_t c = 0; c < C; ++c) pdw[c] = pdb[c] = 0;
  for (int64_t n = 0; n < rows; ++n) {
    const float* xr = x + n * C;
    const float* dyr = dy + n * C;
    float* dxr = dx + n * C;
    const float m = mean[n], r = rstd[n];
    float sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (int64_t c = 0; c < C; ++c) {
      const float g = dyr[c] * w[c];
      sum_g += g;
      sum_gx += g * ((xr[c] - m) * r);
    }
    const float mean_g = sum_g / float(C), mean_gx = sum_gx / float(C);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (xr[c] - m) * r;
      dxr[c] = r * (dyr[c] * w[c] - mean_g - xhat * mean_gx);
      pdw[c] += dyr[c] * xhat;
      pdb[c] += dyr[c];
    }
  }
}

}  // namespace

// ---- RMSNorm ----

// x (N,C), w (C) -> y (N,C), rstd (N)
void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C,
                 float eps) {
  for_blocks(N, detail::rows_per_block(C), [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) rstd[n] = rmsnorm_row(x + n * C, w, y + n * C, C, eps);
  });
}

// dy (N,C), x (N,C), w (C), rstd (N) -> dx (N,C), dw (C) overwritten.
//   xhat = x*rstd;  dx = rstd*(w*dy - xhat*mean(w*dy*xhat));  dw = sum_n dy*xhat
void rmsnorm_bwd(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                 float* dw, int64_t N, int64_t C) {
  const int64_t nb = detail::num_blocks(N, kRowBlock);
  std::vector<float> partials(size_t(nb * C));  // (nb,C): dw summed over each row block
  float* const part = partials.data();
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    rmsnorm_bwd_rows(dy + r0 * C, x + r0 * C, w, rstd + r0, dx + r0 * C,
                     part + (r0 / kRowBlock) * C, r1 - r0, C);
  });
  detail::sum_partials(part, nb, C, dw);
}

// ---- LayerNorm ----

// x (N,C), w (C), b (C) -> y (N,C), mean (N), rstd (N). Variance is two-pass (the row is in L1).
void layernorm_fwd(const float* x, const float* w, const float* b, float* y, float* mean,
                   float* rstd, int64_t N, int64_t C, float eps) {
  for_blocks(N, detail::rows_per_block(C), [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n)
      layernorm_row(x + n * C, w, b, y + n * C, mean + n, rstd + n, C, eps);
  });
}

// dy, x (N,C), w (C), mean, rstd (N) -> dx (N,C), dw (C), db (C) overwritten.
//   xhat = (x-mean)*rstd;  g = dy*w;  dx = rstd*(g - mean(g) - xhat*mean(g*xhat))
//   dw = sum_n dy*xhat;  db = sum_n dy
void layernorm_bwd(const float* dy, const float* x, const float* w, const float* mean,
                   const float* rstd, float* dx, float* dw, float* db, int64_t N, int64_t C) {
  const int64_t nb = detail::num_blocks(N, kRowBlock);
  std::vector<float> partials(size_t(2 * nb * C));  // (nb,C) for dw, then (nb,C) for db
  float* const pdw = partials.data();
  float* const pdb = partials.data() + nb * C;
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    const int64_t b = r0 / kRowBlock;
    layernorm_bwd_rows(dy + r0 * C, x + r0 * C, w, mean + r0, rstd + r0, dx + r0 * C, pdw + b * C,
                       pdb + b * C, r1 - r0, C);
  });
  detail::sum_partials(pdw, nb, C, dw);
  detail::sum_partials(pdb, nb, C, db);
}

}  // namespace loom::kernels::cpu
