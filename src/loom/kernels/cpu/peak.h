// This CPU's arithmetic peak, measured: loops of independent vector FMAs (f32) and AVX512-BF16 dot
// products (bf16), 12 accumulators to hide their latency, best of 5. The denominators of model FLOP
// utilisation (bench/fma_peak, docs/benchmarks.md) and the device peak `loom calibrate` writes.
#pragma once

namespace loom::kernels {

// GFLOP/s (a multiply-add counts 2) on `threads` OpenMP threads, `iters` loop trips each. bf16:
// 0 where the build has no AVX512-BF16.
double fma_peak_gflops(int threads, long iters, bool bf16);
// Whether this build has the AVX512-BF16 loop (fma_peak_gflops(..., true) measures something).
bool has_bf16_peak();

}  // namespace loom::kernels
