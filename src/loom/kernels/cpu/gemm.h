// GEMM through oneDNN, f32 and bf16 (AVX512-BF16 / AMX where the CPU has them).
//
//   C (batch, M, N) = op(A) (batch, M, K) x op(B) (batch, K, N), op = transpose when ta / tb.
// A is stored (batch,M,K) or, when ta, (batch,K,M); B is (batch,K,N) or, when tb, (batch,N,K).
// a_dtype == b_dtype in {f32, bf16}; c_dtype in {f32, bf16}, but bf16 only with bf16 inputs
// (oneDNN 2.6 has no f32 x f32 -> bf16 matmul); accumulation is always f32. When accumulate is set,
// C += result (used for gradient accumulation), else C is overwritten.
//
// Primitives are created once per GemmDesc and cached (creating one costs far more than a small
// GEMM). The cache is per thread; kernels are called from one executor thread.
#pragma once

#include <cstdint>
#include <iosfwd>

#include "loom/core/dtype.h"

namespace loom::kernels::cpu {

struct GemmDesc {
  int64_t batch = 1, M = 0, N = 0, K = 0;
  bool ta = false, tb = false;
  DType ab_dtype = DType::f32;
  DType c_dtype = DType::f32;
  bool accumulate = false;
  bool operator==(const GemmDesc&) const = default;
};

// Prints e.g. "gemm{batch=1 M=7 N=13 K=33 ta=0 tb=1 ab=bf16 c=f32 accumulate=0}".
std::ostream& operator<<(std::ostream& os, const GemmDesc& d);

void gemm(const GemmDesc& d, const void* a, const void* b, void* c);

// Plain triple loop, for tests (reads/writes the same layouts; accumulates in double).
void gemm_ref(const GemmDesc& d, const void* a, const void* b, void* c);

}  // namespace loom::kernels::cpu
