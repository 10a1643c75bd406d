// One row times a weight: y (1,N) = x (1,K) · Bᵀ, B stored (N,K) (`tb`, nn.Linear's layout), or
// x · B, B stored (K,N) (GPT-2's Conv1D); x and B both f32 or both bf16, y f32 (or bf16 from bf16)
// — the matmuls of a decode step, which gemm() sends here (gemm.cc). Such a product reads B once
// and does two FLOPs a weight, so memory decides its time. On an Intel Xeon with AMX, oneDNN 2.6's
// matmul at M = 1 streams a plain-layout B at 9–16 GB/s where the machine streams about 22
// (bench/gemm_bench --decode: its bf16 kernels repack B on every call, and packing B once still
// leaves bf16 at 13–16); this loop reads each row of B once, a few rows ahead prefetched, at 16–25.
//
// Numerics: every product of two bf16 values is exact in f32; each output sums its products in f32
// in a fixed order (16 lanes over k, lanes added as a tree), whatever the thread count. Outputs are
// split over threads in fixed blocks, so the result is bit-identical for any number of threads.
// Not here: M > 1 and accumulation into y (oneDNN's).
#pragma once

#include <cstdint>

#include "loom/core/dtype.h"

namespace loom::kernels::cpu {

// x (K) and b ((N,K) when tb else (K,N)) in ab_dtype (f32 or bf16); y (N) in y_dtype (f32, or
// bf16 when ab_dtype is bf16).
void gemv(int64_t N, int64_t K, bool tb, DType ab_dtype, const void* x, const void* b, void* y,
          DType y_dtype);

}  // namespace loom::kernels::cpu
