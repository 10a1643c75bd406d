// GEMM through oneDNN (one row times a weight: gemv.h), f32 and bf16 (AVX512-BF16 / AMX where the
// CPU has them), as a GemmDesc (kernels/gemm_desc.h) describes it; c_dtype bf16 only with bf16
// inputs (oneDNN 2.6 has no f32 x f32 -> bf16 matmul).
//
// Primitives are created once per GemmDesc and cached (creating one costs far more than a small
// GEMM). The cache is per thread; kernels are called from one executor thread.
#pragma once

#include <cstdint>
#include <iosfwd>

#include "loom/core/dtype.h"
#include "loom/kernels/gemm_desc.h"

namespace loom::kernels {
// Prints e.g. "gemm{batch=1 M=7 N=13 K=33 ta=0 tb=1 ab=bf16 c=f32 accumulate=0}".
std::ostream& operator<<(std::ostream& os, const GemmDesc& d);
}  // namespace loom::kernels

namespace loom::kernels::cpu {

using kernels::GemmDesc;

void gemm(const GemmDesc& d, const void* a, const void* b, void* c);

// Plain triple loop, for tests (reads/writes the same layouts; accumulates in double).
void gemm_ref(const GemmDesc& d, const void* a, const void* b, void* c);

}  // namespace loom::kernels::cpu
