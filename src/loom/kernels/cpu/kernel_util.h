// Internals shared by the fast CPU kernels (kernels.h): the fixed block sizes, the block-parallel
// loop, a vectorisable expf, and the ordered sum of per-block partials.
//
// Not part of the kernel API: include it only from src/loom/kernels/cpu/*.cc.
// Invariant: every block size here is a constant or a function of the tensor shape, never of the
// thread count, and partials are combined in block order, so reductions are bit-identical for any
// number of OpenMP threads.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "loom/core/dtype.h"
#include "loom/kernels/cpu/simd.h"

namespace loom::kernels::cpu::detail {

// An element of an f32 or bf16 tensor as f32, and back (bf16 rounds to nearest even): the one
// pair kernels templated on the element type read and write through.
inline float to_f32(float x) { return x; }
inline float to_f32(bf16 x) { return bf16_to_f32(x); }
template <class Elem>
inline Elem from_f32(float x);
template <>
inline float from_f32<float>(float x) {
  return x;
}
template <>
inline bf16 from_f32<bf16>(float x) {
  return f32_to_bf16(x);
}

// Elements per block for elementwise kernels and sum/sumsq (64 KiB of f32: large enough that the
// OpenMP fork is amortised, small enough that 2 cores get many blocks).
constexpr int64_t kElemBlock = int64_t(1) << 14;
// Rows per block for reductions over rows (dw, db, sum_rows): each block writes one partial row.
constexpr int64_t kRowBlock = 64;

// Rows per block for row-wise kernels with no cross-row reduction: about kElemBlock elements.
inline int64_t rows_per_block(int64_t C) {
  return std::max<int64_t>(1, kElemBlock / std::max<int64_t>(C, 1));
}

inline int64_t num_blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

// Calls fn(begin, end) for the fixed blocks [b*block, min(n,(b+1)*block)) of [0,n), in parallel
// when there is more than one block. Which thread runs a block never affects what the block
// computes. Keep fn a thin call into a plain function that takes pointers and sizes by value: gcc
// 12 does not hoist loads of by-reference lambda captures out of `omp simd` loops and falls back to
// gathers.
template <class F>
inline void for_blocks(int64_t n, int64_t block, F&& fn) {
  const int64_t nb = num_blocks(n, block);
#pragma omp parallel for schedule(static) if (nb > 1)
  for (int64_t b = 0; b < nb; ++b) fn(b * block, std::min(n, (b + 1) * block));
}

// partials (nb, ld) -> out (C) = sum over b of partials[b, 0:C), in f64, b in order. C <= 512.
inline void sum_partial_columns(const float* partials, int64_t nb, int64_t ld, int64_t C,
                                float* out) {
  double acc[512] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const float* pb = partials + b * ld;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) acc[c] += pb[c];
  }
  for (int64_t c = 0; c < C; ++c) out[c] = float(acc[c]);
}

// partials (nb,C) -> out (C) = sum over b in [0,nb), added in block order in f64.
inline void sum_partials(const float* partials, int64_t nb, int64_t C, float* out) {
  for_blocks(C, 512, [&](int64_t c0, int64_t c1) {
    sum_partial_columns(partials + c0, nb, C, c1 - c0, out + c0);
  });
}

// a*b + c, fused (one rounding) where the target has FMA; a library fma would be far slower than
// the unfused form on targets without it.
inline float fmadd(float a, float b, float c) {
#ifdef __FMA__
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// e^x in f32, branchless so that a loop calling it auto-vectorises. Error < 1 ulp for normal
// results (0.94 ulp worst over [-104, 89]); e^x > FLT_MAX gives +inf, small results underflow
// gradually to 0, NaN gives NaN.
//
// Method: x = n*ln2 + r with n = round(x/ln2), |r| <= ln2/2; r is formed with ln2 split in two
// (Cody-Waite) so it is exact to f32 rounding. e^r is its degree-7 Taylor polynomial (truncation
// 0.347^8/8! < 6e-9 relative, under 0.1 ulp). 2^n is applied as 2^(n>>1) * 2^(n-(n>>1)), two
// exponent field constructions, so n from -150 (denormal results) to 128 (overflow to inf) stays
// representable.
// Example: x = 1: n = 1, r = 1 - ln2 = 0.3069, e^r = 1.3591, result 1.3591 * 2 = 2.7183.
inline float exp_f32(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // 15 significant bits: n*kLn2Hi is exact
  constexpr float kLn2Lo = 1.42860682030941723212e-6f;
  constexpr float kShift = 12582912.0f;      // 1.5 * 2^23: adding it rounds to an integer
  x = x < -104.0f ? -104.0f : x;             // e^-104 < half the smallest denormal: result 0
  x = x > 89.0f ? 89.0f : x;                 // e^89 > FLT_MAX: result inf
  const float t = fmadd(x, kLog2e, kShift);  // low mantissa bits of t hold n (two's complement)
  const float n = t - kShift;
  const int32_t ni = int32_t(std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kShift));
  float r = fmadd(n, -kLn2Hi, x);
  r = fmadd(n, -kLn2Lo, r);
  float p = 1.0f / 5040.0f;
  p = fmadd(p, r, 1.0f / 720.0f);
  p = fmadd(p, r, 1.0f / 120.0f);
  p = fmadd(p, r, 1.0f / 24.0f);
  p = fmadd(p, r, 1.0f / 6.0f);
  p = fmadd(p, r, 0.5f);
  p = fmadd(p, r, 1.0f);
  p = fmadd(p, r, 1.0f);
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  const float s1 = std::bit_cast<float>(uint32_t(n1 + 127) << 23);
  const float s2 = std::bit_cast<float>(uint32_t(n2 + 127) << 23);
  return p * s1 * s2;
}

// 1 / (1 + e^-x), accurate in relative terms for both signs (no 1 - tiny cancellation).
inline float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

#ifdef __AVX512F__
// exp_f32 on 16 lanes, used where gcc's vectorisation of exp_f32 is poor (it constant-folds the
// clamped lanes into blends: ~45 instructions per vector instead of ~16). The same operations in
// the same order, so the same result bits: scalef applies 2^n with one rounding (gradual underflow,
// overflow to inf), exactly as the two exponent multiplies do.
inline __m512 exp_f32x16(__m512 x) {
  // The maskz_ forms with all lanes set are the plain instructions; gcc 12's headers make the
  // unmasked forms warn (-Wmaybe-uninitialized on their _mm512_undefined_ps).
  constexpr __mmask16 kAll = 0xffff;
  const __m512 shift = _mm512_set1_ps(12582912.0f);
  // min/max with the constant first: a NaN in x is returned unchanged.
  x = _mm512_maskz_max_ps(kAll, _mm512_set1_ps(-104.0f),
                          _mm512_maskz_min_ps(kAll, _mm512_set1_ps(89.0f), x));
  const __m512 n =
      _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shift), shift);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(kAll, p, n);
}

inline __m512 sigmoid_f32x16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp_f32x16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

// Sum of the 16 lanes, added in lane order.
inline float sum_lanes(__m512 v) {
  alignas(64) float lane[16];
  _mm512_store_ps(lane, v);
  float s = 0;
  for (float l : lane) s += l;
  return s;
}

// Largest of the 16 lanes.
inline float max_lanes(__m512 v) {
  alignas(64) float lane[16];
  _mm512_store_ps(lane, v);
  float m = lane[0];
  for (float l : lane) m = l > m ? l : m;
  return m;
}

// Lanes [0, min(left,16)) set: the mask for a 16-lane step with `left` elements remaining.
inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
}
#endif

// Bit-identical to loom::f32_to_bf16, written without the branch so it vectorises (integer
// add/shift/compare/blend and a 32->16 narrowing store). Not _mm512_cvtneps_pbh: that instruction
// treats denormal inputs as zero, which f32_to_bf16 does not.
inline void cast_f32_bf16_block(const float* x, bf16* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(x[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x40u;
    y[i].bits = uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

inline void cast_bf16_f32_block(const bf16* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = std::bit_cast<float>(uint32_t(x[i].bits) << 16);
}

}  // namespace loom::kernels::cpu::detail
