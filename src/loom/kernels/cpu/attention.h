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

// Attention over a key/value cache, for incremental decoding (cached_attention.cc): Tn new tokens
// at positions start..start+Tn-1 of B sequences. k and v (B,Tn,NKV,HS) are first written into the
// caches kc and vc (B,S,NKV,HS) at those positions; then query i of q (B,Tn,NH,HS) attends to cache
// positions 0..start+i, and o (B,Tn,NH,HS) is overwritten. Cache positions >= start+Tn are neither
// read nor written. Throws loom::Error when start < 0 or start + Tn > S.
// With start = 0 the new tokens are their own keys: o is attention_fwd's (same kernel, same
// rounding), so a prefill equals the full forward over those tokens.
template <class Elem>
void cached_attention(const Elem* q, const Elem* k, const Elem* v, Elem* kc, Elem* vc, Elem* o,
                      int64_t B, int64_t Tn, int64_t S, int64_t start, int64_t NH, int64_t NKV,
                      int64_t HS, float scale);

}  // namespace loom::kernels::cpu
