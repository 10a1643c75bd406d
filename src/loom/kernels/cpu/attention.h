// Causal self-attention with grouped-query heads, flash-style: the (T,T) score matrix is never
// stored; each query block streams over key blocks with an online softmax, and the backward
// recomputes scores from q, k and the saved log-sum-exp.
//
// q (B,T,NH,HS), k and v (B,T,NKV,HS) with NH % NKV == 0 (query head h reads kv head h / (NH/NKV)),
// o (B,T,NH,HS), lse (B,NH,T) in f32: lse = log sum_j exp(scale * q.k_j) over j <= t.
// Elem is float or loom::bf16; everything inside (scores, softmax, accumulators) is f32.
#pragma once

#include <cstdint>

#include "loom/core/dtype.h"

namespace loom::kernels::cpu {

template <class Elem>
void attention_fwd(const Elem* q, const Elem* k, const Elem* v, Elem* o, float* lse, int64_t B,
                   int64_t T, int64_t NH, int64_t NKV, int64_t HS, float scale);

// do (B,T,NH,HS) -> dq (B,T,NH,HS), dk and dv (B,T,NKV,HS), all overwritten.
template <class Elem>
void attention_bwd(const Elem* dout, const Elem* q, const Elem* k, const Elem* v, const Elem* o,
                   const float* lse, Elem* dq, Elem* dk, Elem* dv, int64_t B, int64_t T, int64_t NH,
                   int64_t NKV, int64_t HS, float scale);

}  // namespace loom::kernels::cpu
