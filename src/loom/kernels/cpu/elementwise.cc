// Elementwise kernels: add, add_bias, mul, scale, mul_scalar, and the f32 <-> bf16 casts.
//
// Plain loops over fixed blocks of detail::kElemBlock elements (add_bias: whole rows); the compiler
// vectorises every loop. No broadcasting beyond add_bias's row vector, no type promotion.
// Invariant: y[i] depends only on the inputs at i (and b[c] / s[0]), so results are thread-count
// independent; y == a (exactly in place) is safe in every loop here, partial overlap is not.
#include <bit>

#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

using detail::cast_bf16_f32_block;
using detail::cast_f32_bf16_block;
using detail::for_blocks;
using detail::kElemBlock;

namespace {

// ---- one block each ----

void add_block(const float* a, const float* b, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void mul_block(const float* a, const float* b, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
}

void scale_block(const float* a, float s, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] * s;
}

// a (rows,C), b (C) -> y (rows,C)
void add_bias_rows(const float* a, const float* b, float* y, int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = a + r * C;
    float* yr = y + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = ar[c] + b[c];
  }
}

}  // namespace

// a, b (n) -> y (n) = a + b
void add(const float* a, const float* b, float* y, int64_t n) {
  for_blocks(n, kElemBlock,
             [&](int64_t i0, int64_t i1) { add_block(a + i0, b + i0, y + i0, i1 - i0); });
}

// a (N,C), b (C) -> y (N,C) = a + b broadcast over rows
void add_bias(const float* a, const float* b, float* y, int64_t N, int64_t C) {
  for_blocks(N, detail::rows_per_block(C),
             [&](int64_t r0, int64_t r1) { add_bias_rows(a + r0 * C, b, y + r0 * C, r1 - r0, C); });
}

// a, b (n) -> y (n) = a * b
void mul(const float* a, const float* b, float* y, int64_t n) {
  for_blocks(n, kElemBlock,
             [&](int64_t i0, int64_t i1) { mul_block(a + i0, b + i0, y + i0, i1 - i0); });
}

// a (n) -> y (n) = a * s
void scale(const float* a, float s, float* y, int64_t n) {
  for_blocks(n, kElemBlock,
             [&](int64_t i0, int64_t i1) { scale_block(a + i0, s, y + i0, i1 - i0); });
}

// a (n), s (1) -> y (n) = a * s[0]
void mul_scalar(const float* a, const float* s, float* y, int64_t n) { scale(a, s[0], y, n); }

// x (n) -> y (n), round to nearest even; NaN -> quiet NaN keeping the sign and top payload bits.
void cast_f32_bf16(const float* x, bf16* y, int64_t n) {
  for_blocks(n, kElemBlock,
             [&](int64_t i0, int64_t i1) { cast_f32_bf16_block(x + i0, y + i0, i1 - i0); });
}

// x (n) -> y (n), exact
void cast_bf16_f32(const bf16* x, float* y, int64_t n) {
  for_blocks(n, kElemBlock,
             [&](int64_t i0, int64_t i1) { cast_bf16_f32_block(x + i0, y + i0, i1 - i0); });
}

}  // namespace loom::kernels::cpu
