// Causal grouped-query attention on the tensor cores for bf16 (flash_attention.cu): what
// attention.cu's attention_fwd<bf16> and attention_bwd<bf16> run when flash_attention_fits, with
// the same contract (kernels.h, kernels/cpu/attention.h). Internal to kernels/cuda.
#pragma once

#include <cstdint>

#include "loom/core/dtype.h"

struct CUstream_st;

namespace loom::kernels::cuda {

// Whether the tensor-core kernels take this shape: HS 32, 64 or 128, every pointer 16-byte aligned,
// and B * NH within a grid's y dimension (kernels.h's attention_kernels() picks whether they are
// tried).
bool flash_attention_fits(int64_t B, int64_t NH, int64_t HS, const void* const* ptrs, int n);

void flash_attention_fwd(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                         int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, float scale,
                         CUstream_st* s);
// D (B,NH,T) = rowsum(dO * O), computed by the caller.
void flash_attention_bwd(const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                         const float* lse, const float* D, bf16* dq, bf16* dk, bf16* dv, int64_t B,
                         int64_t T, int64_t NH, int64_t NKV, int64_t HS, float scale,
                         CUstream_st* s);

}  // namespace loom::kernels::cuda
