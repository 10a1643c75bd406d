// Reductions: sum and sum of squares of a whole tensor, and the column sums of a matrix.
//
// sum/sumsq: each fixed block of detail::kElemBlock elements is summed in f64 (8-lane vector
// partial sums, then the lanes), the block sums are added in block order in f64, and the total is
// rounded once to f32. sum_rows: each block of detail::kRowBlock rows writes an f32 partial row;
// partials are added in block order in f64 (detail::sum_partials). No pairwise or Kahan summation.
// Invariant: the summation tree depends only on n (or N,C), never on the thread count.
#include <vector>

#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

using detail::for_blocks;
using detail::kElemBlock;
using detail::kRowBlock;

namespace {

// x (n) -> sum of x (kSquare: of x^2), in f64 with 8-lane vector partial sums.
template <bool kSquare>
double block_sum(const float* x, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    s += kSquare ? v * v : v;
  }
  return s;
}

// x (n) -> y[0] = sum of x (kSquare: of x^2).
template <bool kSquare>
void sum_impl(const float* x, float* y, int64_t n) {
  const int64_t nb = detail::num_blocks(n, kElemBlock);
  std::vector<double> partials(static_cast<size_t>(nb));  // (nb)
  double* const part = partials.data();
  for_blocks(n, kElemBlock, [&](int64_t i0, int64_t i1) {
    part[i0 / kElemBlock] = block_sum<kSquare>(x + i0, i1 - i0);
  });
  double total = 0;
  for (int64_t b = 0; b < nb; ++b) total += part[b];
  y[0] = float(total);
}

// x (rows,C) -> p (C) = column sums, rows added in order.
void block_sum_rows(const float* x, float* p, int64_t rows, int64_t C) {
  for (int64_t c = 0; c < C; ++c) p[c] = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) p[c] += xr[c];
  }
}

}  // namespace

// x (n) -> y (1)
void sum(const float* x, float* y, int64_t n) { sum_impl<false>(x, y, n); }

// x (n) -> y (1)
void sumsq(const float* x, float* y, int64_t n) { sum_impl<true>(x, y, n); }

// x (N,C) -> y (C), overwritten
void sum_rows(const float* x, float* y, int64_t N, int64_t C) {
  const int64_t nb = detail::num_blocks(N, kRowBlock);
  std::vector<float> partials(size_t(nb * C));  // (nb,C)
  float* const part = partials.data();
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    block_sum_rows(x + r0 * C, part + (r0 / kRowBlock) * C, r1 - r0, C);
  });
  detail::sum_partials(part, nb, C, y);
}

}  // namespace loom::kernels::cpu
