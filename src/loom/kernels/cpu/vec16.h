// A 16-lane f32 vector for the attention kernels (attention.cc): AVX-512 where the build has it,
// plain loops elsewhere, the same results either way. vload_n / vstore_n move the first n lanes
// (0 <= n <= 16) from or to f32 or bf16 memory (bf16 by round-to-nearest-even, NaN kept,
// bit-identical to f32_to_bf16); lanes past n load as 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "loom/core/dtype.h"
#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/simd.h"

namespace loom::kernels::cpu::vec16 {

using detail::from_f32;
using detail::to_f32;

#ifdef __AVX512F__
using V16 = __m512;
inline V16 vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, V16 a) { _mm512_storeu_ps(p, a); }
inline V16 vset1(float x) { return _mm512_set1_ps(x); }
inline V16 vadd(V16 a, V16 b) { return _mm512_add_ps(a, b); }
inline V16 vsub(V16 a, V16 b) { return _mm512_sub_ps(a, b); }
inline V16 vmul(V16 a, V16 b) { return _mm512_mul_ps(a, b); }
inline V16 vfma(V16 a, V16 b, V16 c) { return _mm512_fmadd_ps(a, b, c); }  // a*b + c
inline V16 vmax(V16 a, V16 b) { return _mm512_max_ps(a, b); }
inline float vsum(V16 a) { return _mm512_reduce_add_ps(a); }
inline __mmask16 first_n(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}
inline V16 vload_n(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first_n(n), p); }
inline V16 vload_n(const bf16* p, int64_t n) {
  const __m256i h = _mm256_maskz_loadu_epi16(first_n(n), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline void vstore_n(float* p, V16 a, int64_t n) { _mm512_mask_storeu_ps(p, first_n(n), a); }
inline void vstore_n(bf16* p, V16 a, int64_t n) {
  const __m512i u = _mm512_castps_si512(a);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i bias =
      _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(hi, _mm512_set1_epi32(1)));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  _mm256_mask_storeu_epi16(p, first_n(n), _mm512_cvtepi32_epi16(r));
}
// lanes l < c take `fill` (c <= 0: none, c >= 16: all)
inline V16 vfill_below(V16 a, int64_t c, float fill) {
  if (c <= 0) return a;
  const __mmask16 keep = c >= 16 ? __mmask16(0) : __mmask16(0xffffu << c);
  return _mm512_mask_blend_ps(keep, _mm512_set1_ps(fill), a);
}
// 2^x: x = n + f with n = round(x), |f| <= 1/2; 2^f by a degree-6 polynomial fitted for relative
// error on [-1/2,1/2] (2e-9, below f32 rounding), then scaled by 2^n. x <= -200 gives exactly 0.
inline V16 vexp2(V16 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-200.f));
  const V16 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const V16 f = _mm512_sub_ps(x, n);
  V16 p = _mm512_set1_ps(1.535336202e-04f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887465e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437359e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472029e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}
// In-register transpose of a 16x16 block: r[i] lane j <-> r[j] lane i.
inline void transpose16(V16 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);      // per 128-bit lane: a0 b0 a1 b1
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);  // a2 b2 a3 b3
  }
  for (int i = 0; i < 16; i += 4) {  // rows i..i+3, column c of each 128-bit lane in u[i+c]
    u[i + 0] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int c = 0; c < 4; ++c) {  // u[4q+c] holds rows 4q..4q+3 of columns c, c+4, c+8, c+12
    const __m512 a = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);       // cols c, c+8 of rows 0..7
    const __m512 b = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);       // cols c+4, c+12
    const __m512 d = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);  // rows 8..15
    const __m512 e = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
    r[c] = _mm512_shuffle_f32x4(a, d, 0x88);
    r[c + 8] = _mm512_shuffle_f32x4(a, d, 0xdd);
    r[c + 4] = _mm512_shuffle_f32x4(b, e, 0x88);
    r[c + 12] = _mm512_shuffle_f32x4(b, e, 0xdd);
  }
}
#else
struct V16 {
  float x[16];
};
inline V16 vload(const float* p) {
  V16 r;
  std::memcpy(r.x, p, sizeof r.x);
  return r;
}
inline void vstore(float* p, V16 a) { std::memcpy(p, a.x, sizeof a.x); }
inline V16 vset1(float x) {
  V16 r;
  for (float& e : r.x) e = x;
  return r;
}
#define LOOM_V16_BINARY(name, expr)       \
  inline V16 name(V16 a, V16 b) {         \
    V16 r;                                \
    for (int l = 0; l < 16; ++l) {        \
      const float x = a.x[l], y = b.x[l]; \
      r.x[l] = (expr);                    \
    }                                     \
    return r;                             \
  }
LOOM_V16_BINARY(vadd, x + y)
LOOM_V16_BINARY(vsub, x - y)
LOOM_V16_BINARY(vmul, x* y)
LOOM_V16_BINARY(vmax, x > y ? x : y)
#undef LOOM_V16_BINARY
inline V16 vfma(V16 a, V16 b, V16 c) {
  for (int l = 0; l < 16; ++l) c.x[l] = std::fma(a.x[l], b.x[l], c.x[l]);
  return c;
}
inline float vsum(V16 a) {
  float s = 0.f;
  for (float e : a.x) s += e;
  return s;
}
template <class Elem>
inline V16 vload_n(const Elem* p, int64_t n) {
  V16 r = vset1(0.f);
  for (int64_t l = 0; l < 16 && l < n; ++l) r.x[l] = to_f32(p[l]);
  return r;
}
template <class Elem>
inline void vstore_n(Elem* p, V16 a, int64_t n) {
  for (int64_t l = 0; l < 16 && l < n; ++l) p[l] = from_f32<Elem>(a.x[l]);
}
inline V16 vfill_below(V16 a, int64_t c, float fill) {
  for (int64_t l = 0; l < 16 && l < c; ++l) a.x[l] = fill;
  return a;
}
inline V16 vexp2(V16 a) {
  for (float& e : a.x) e = std::exp2(std::max(e, -200.f));
  return a;
}
inline void transpose16(V16 r[16]) {
  for (int i = 0; i < 16; ++i)
    for (int j = i + 1; j < 16; ++j) std::swap(r[i].x[j], r[j].x[i]);
}
#endif

}  // namespace loom::kernels::cpu::vec16
