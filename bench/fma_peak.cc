// Measures this CPU's f32 FMA peak and bf16 dot-product peak (GFLOP/s) on 1 thread and on all
// OpenMP threads: loops of independent AVX-512 FMAs / AVX512-BF16 dot products (12 accumulators
// hide the latency). Prints one JSON line. These are the denominators of model FLOP utilisation in
// docs/benchmarks.md, measured rather than assumed. Build: g++ -O3 -march=native -fopenmp.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

template <bool kBf16>
static double run(int threads, long iters) {
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      __m512 a[12];
      for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
      const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
#ifdef __AVX512BF16__
      const __m512bh x = _mm512_cvtne2ps_pbh(m, c), y = _mm512_cvtne2ps_pbh(c, c);
#endif
      for (long it = 0; it < iters; ++it)
        for (int i = 0; i < 12; ++i) {
#ifdef __AVX512BF16__
          if constexpr (kBf16)
            a[i] = _mm512_dpbf16_ps(a[i], x, y);  // 32 multiply-adds
          else
#endif
            a[i] = _mm512_fmadd_ps(a[i], m, c);  // 16 multiply-adds
        }
      // (stored and summed by hand: GCC 12 warns falsely inside _mm512_reduce_add_ps)
      alignas(64) float lanes[16];
      for (int i = 0; i < 12; ++i) {
        _mm512_store_ps(lanes, a[i]);
        for (float l : lanes) sink += l;
      }
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double flops = double(threads) * iters * 12 * (kBf16 ? 32 : 16) * 2;
    best = std::max(best, flops / s / 1e9);
    if (sink == 42.0f) std::printf(" ");
  }
  return best;
}

int main() {
  int n = omp_get_max_threads();
  double one = run<false>(1, 20000000), all = run<false>(n, 20000000);
  double bone = 0, ball = 0;
#ifdef __AVX512BF16__
  bone = run<true>(1, 20000000);
  ball = run<true>(n, 20000000);
#endif
  std::printf(
      "{\"f32_fma_peak_gflops_1_thread\":%.1f,\"f32_fma_peak_gflops\":%.1f,"
      "\"bf16_dot_peak_gflops_1_thread\":%.1f,\"bf16_dot_peak_gflops\":%.1f,\"threads\":%d}\n",
      one, all, bone, ball, n);
}
