// Measures this CPU's f32 FMA peak (GFLOP/s) on 1 thread and on all OpenMP threads: a loop of
// independent AVX-512 FMAs (12 accumulators hide the FMA latency). Prints one JSON line. It is the
// denominator of model FLOP utilisation in docs/benchmarks.md, measured rather than assumed.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

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
      for (long it = 0; it < iters; ++it)
        for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
      for (int i = 0; i < 12; ++i) sink += _mm512_reduce_add_ps(a[i]);
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double flops = double(threads) * iters * 12 * 16 * 2;
    best = std::max(best, flops / s / 1e9);
    if (sink == 42.0f) std::printf(" ");
  }
  return best;
}

int main() {
  int n = omp_get_max_threads();
  double one = run(1, 20000000), all = run(n, 20000000);
  std::printf("{\"fma_peak_gflops_1_thread\":%.1f,\"fma_peak_gflops\":%.1f,\"threads\":%d}\n", one, all,
              n);
}
