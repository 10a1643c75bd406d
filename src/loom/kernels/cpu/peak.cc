#include "loom/kernels/cpu/peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "loom/core/clock.h"

namespace loom::kernels {

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
using Vec = __m512;
inline Vec splat(float x) { return _mm512_set1_ps(x); }
inline Vec fma(Vec a, Vec m, Vec c) { return _mm512_fmadd_ps(a, m, c); }
#elif defined(__FMA__)
constexpr int kLanes = 8;
using Vec = __m256;
inline Vec splat(float x) { return _mm256_set1_ps(x); }
inline Vec fma(Vec a, Vec m, Vec c) { return _mm256_fmadd_ps(a, m, c); }
#else
constexpr int kLanes = 1;
using Vec = float;
inline Vec splat(float x) { return x; }
inline Vec fma(Vec a, Vec m, Vec c) { return a * m + c; }
#endif

// The sum of a vector's lanes (copied out: GCC 12 warns in _mm512_reduce_add_ps); its value only
// keeps the loop from being optimised away.
float sum(Vec v) {
  float lanes[kLanes];
  std::memcpy(lanes, &v, sizeof v);
  float s = 0;
  for (float l : lanes) s += l;
  return s;
}

}  // namespace

bool has_bf16_peak() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

double fma_peak_gflops(int threads, long iters, bool bf16) {
  if (bf16 && !has_bf16_peak()) return 0;
  double best = 0;
  volatile float keep = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      Vec a[12];
      for (int i = 0; i < 12; ++i) a[i] = splat(1.0f + float(i) * 1e-3f);
      const Vec m = splat(0.999999f), c = splat(1e-7f);
#if defined(__AVX512BF16__)
      const __m512bh x = _mm512_cvtne2ps_pbh(m, c), y = _mm512_cvtne2ps_pbh(c, c);
      if (bf16) {
        for (long it = 0; it < iters; ++it)
          for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, y);  // 32 multiply-adds
      } else
#endif
      {
        for (long it = 0; it < iters; ++it)
          for (int i = 0; i < 12; ++i) a[i] = fma(a[i], m, c);
      }
      for (int i = 0; i < 12; ++i) sink += sum(a[i]);
    }
    const double s = seconds_since(t0);
    const double flops = double(threads) * double(iters) * 12 * (bf16 ? 2 * kLanes : kLanes) * 2;
    best = std::max(best, flops / s / 1e9);
    keep = keep + sink;
  }
  return best;
}

}  // namespace loom::kernels
