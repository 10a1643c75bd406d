// Measures this CPU's f32 FMA peak and bf16 dot-product peak (GFLOP/s) on 1 thread and on all
// OpenMP threads (kernels/cpu/peak.h). Prints one JSON line. These are the denominators of model
// FLOP utilisation in docs/benchmarks.md, measured rather than assumed.
#include <omp.h>

#include <cstdio>

#include "loom/kernels/cpu/peak.h"

int main() {
  using loom::kernels::fma_peak_gflops;
  const int n = omp_get_max_threads();
  const long iters = 20000000;
  std::printf(
      "{\"f32_fma_peak_gflops_1_thread\":%.1f,\"f32_fma_peak_gflops\":%.1f,"
      "\"bf16_dot_peak_gflops_1_thread\":%.1f,\"bf16_dot_peak_gflops\":%.1f,\"threads\":%d}\n",
      fma_peak_gflops(1, iters, false), fma_peak_gflops(n, iters, false),
      fma_peak_gflops(1, iters, true), fma_peak_gflops(n, iters, true), n);
}
