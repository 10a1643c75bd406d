// Rotary position embedding, Hugging Face rotate-half convention, position = t0 + index along T.
//
// Two phases: (1) a (T, HS/2) table of cos/sin of the angles t*freq_i, computed in f64 and
// rounded to f32; (2) the rotation of every (b,t,h) row with that table. Does not take position
// ids (positions are always t0..t0+T-1) and does not cache the table across calls.
// Invariant: angles are exact to ~1e-15 rad, so the only f32 error is the rounding of cos/sin and
// of the rotation itself; rope(+1) followed by rope(-1) returns x to within a few ulp.
//
// Table method: within each fixed block of kTBlock positions (blocks of absolute positions, aligned
// to multiples of kTBlock whatever t0 is, so a position's entry never depends on t0), cos/sin are
// evaluated directly at the block's first position and advanced by the angle-addition recurrence
//   c' = c*cos(f) - s*sin(f),  s' = s*cos(f) + c*sin(f)
// in f64 (error grows by ~1e-16 per step, so < 2e-15 after 15 steps), which costs a few FMAs per
// entry instead of a libm sin and cos.
#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

using detail::for_blocks;

namespace {

// cos_t, sin_t (t1-from, half) for positions [from,t1): direct at the block start a <= from, then
// the angle-addition recurrence (entries before `from` are computed, not stored). freq, step_c,
// step_s (half): sign*theta^(-2i/HS) and its cos/sin.
void angle_table(const double* freq, const double* step_c, const double* step_s, float* cos_t,
                 float* sin_t, int64_t a, int64_t from, int64_t t1, int64_t half) {
  std::vector<double> c(half), s(half);
  for (int64_t i = 0; i < half; ++i) {
    c[i] = std::cos(double(a) * freq[i]);
    s[i] = std::sin(double(a) * freq[i]);
  }
  for (int64_t t = a; t < t1; ++t) {
    const bool keep = t >= from;
    float* ct = cos_t + (keep ? t - from : 0) * half;
    float* st = sin_t + (keep ? t - from : 0) * half;
    double* cp = c.data();
    double* sp = s.data();
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      if (keep) {
        ct[i] = float(cp[i]);
        st[i] = float(sp[i]);
      }
      const double cn = cp[i] * step_c[i] - sp[i] * step_s[i];
      sp[i] = sp[i] * step_c[i] + cp[i] * step_s[i];
      cp[i] = cn;
    }
  }
}

// One (b,t) row of NH heads: x, y (NH,HS); ct, st (HS/2). Both halves are loaded before either is
// stored, so y == x is safe (and omp simd asserts there is no dependence between i's).
void rotate_row(const float* x, float* y, const float* ct, const float* st, int64_t NH,
                int64_t HS) {
  const int64_t half = HS / 2;
  for (int64_t h = 0; h < NH; ++h) {
    const float* xr = x + h * HS;
    float* yr = y + h * HS;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float x0 = xr[i], x1 = xr[i + half];
      yr[i] = x0 * ct[i] - x1 * st[i];
      yr[i + half] = x1 * ct[i] + x0 * st[i];
    }
  }
}

}  // namespace

// x (B,T,NH,HS) -> y (B,T,NH,HS); y may alias x.
void rope(const float* x, float* y, int64_t B, int64_t T, int64_t NH, int64_t HS, float theta,
          int sign, int64_t t0) {
  LOOM_CHECK(HS % 2 == 0) << "rope: head size " << HS << " is odd";
  LOOM_CHECK(sign == 1 || sign == -1) << "rope: sign " << sign;
  LOOM_CHECK(t0 >= 0) << "rope: first position " << t0;
  const int64_t half = HS / 2;

  // freq (half), its rotation step cos/sin (half), all in f64.
  std::vector<double> freq(half), step_c(half), step_s(half);
  for (int64_t i = 0; i < half; ++i) {
    freq[i] = double(sign) * std::pow(double(theta), -double(2 * i) / double(HS));
    step_c[i] = std::cos(freq[i]);
    step_s[i] = std::sin(freq[i]);
  }

  // Phase 1: cos_t, sin_t (T, half) for positions t0..t0+T-1, by absolute blocks of kTBlock.
  std::vector<float> cos_t(size_t(T * half)), sin_t(size_t(T * half));
  float* const ct = cos_t.data();
  float* const st = sin_t.data();
  constexpr int64_t kTBlock = 16;
  const int64_t first = t0 / kTBlock * kTBlock;  // the block holding t0
  for_blocks(t0 + T - first, kTBlock, [&](int64_t b0, int64_t b1) {
    const int64_t a = first + b0, from = std::max(a, t0);
    angle_table(freq.data(), step_c.data(), step_s.data(), ct + (from - t0) * half,
                st + (from - t0) * half, a, from, first + b1, half);
  });

  // Phase 2: rotate each (b,t) row of NH heads.
  const int64_t row = NH * HS;
  for_blocks(B * T, detail::rows_per_block(row), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % T;
      rotate_row(x + r * row, y + r * row, ct + t * half, st + t * half, NH, HS);
    }
  });
}

}  // namespace loom::kernels::cpu
