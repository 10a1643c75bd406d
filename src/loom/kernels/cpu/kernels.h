// CPU kernels for every Loom op except GEMM (gemm.h) and attention (attention.h).
//
// Dimension letters, used in every kernel file: B batch, T time, C channels, NH heads, NKV
// key/value heads, HS head size, V vocab, L layers, N rows (= B*T when a kernel does not care), n
// elements.
//
// Each kernel has a plain reference loop (namespace ref, templated on the scalar so tests can run
// it in f64) beside the fast one. Fast kernels are vectorised (the compiler auto-vectorises plain
// loops on contiguous rows; AVX-512 intrinsics only where that does not suffice) and threaded with
// OpenMP over fixed row ranges. Invariant: a reduction's summation order never depends on the
// thread count, so results are bit-identical for any number of threads (parity tests rely on it).
// All pointers are contiguous row-major; outputs never alias inputs unless stated.
#pragma once

#include <cstdint>

#include "loom/core/dtype.h"
#include "loom/kernels/gemm_desc.h"

namespace loom::kernels::cpu {

// ---- embedding ----
// ids (N) in [0,V), table (V,C) -> out (N,C); an id of -1 gives a zero row (and adds nothing in the
// backward): a vocabulary-parallel rank's id outside its block
void embedding_fwd(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C);
// dout (N,C) -> dtable (V,C): dtable is overwritten (zeros where no id hits), rows summed in id
// order.
void embedding_bwd(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t V,
                   int64_t C);

// ---- RMSNorm: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps) ----
// x (N,C), w (C) -> y (N,C), rstd (N)
void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C,
                 float eps);
// dy (N,C) -> dx (N,C), dw (C) (overwritten)
void rmsnorm_bwd(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                 float* dw, int64_t N, int64_t C);

// ---- LayerNorm with bias: y = (x - mean) * rstd * w + b ----
void layernorm_fwd(const float* x, const float* w, const float* b, float* y, float* mean,
                   float* rstd, int64_t N, int64_t C, float eps);
// -> dx (N,C), dw (C), db (C) (overwritten)
void layernorm_bwd(const float* dy, const float* x, const float* w, const float* mean,
                   const float* rstd, float* dx, float* dw, float* db, int64_t N, int64_t C);

// ---- RoPE, Hugging Face rotate-half convention ----
// x (B,T,NH,HS) -> y (B,T,NH,HS). For position t and i < HS/2, freq = theta^(-2i/HS), a = t*freq:
//   y[i]      = x[i]*cos(a) - x[i+HS/2]*sin(a)
//   y[i+HS/2] = x[i+HS/2]*cos(a) + x[i]*sin(a)
// sign = -1 rotates by -a (the inverse, which is also the VJP). y may alias x. Row t of x is at
// position t0 + t (t0 > 0: the new tokens of a decode step); the angles of a position do not depend
// on t0, so a row rotated at t0 equals the same row of a rotation from 0, bit for bit.
void rope(const float* x, float* y, int64_t B, int64_t T, int64_t NH, int64_t HS, float theta,
          int sign, int64_t t0 = 0);

// ---- SwiGLU: y = silu(g) * u, silu(g) = g * sigmoid(g) ----
void swiglu_fwd(const float* g, const float* u, float* y, int64_t n);
void swiglu_bwd(const float* dy, const float* g, const float* u, float* dg, float* du, int64_t n);
// bf16 storage, f32 arithmetic (mixed precision keeps the MLP's gate/up activations in bf16).
void swiglu_fwd_bf16(const bf16* g, const bf16* u, bf16* y, int64_t n);
void swiglu_bwd_bf16(const bf16* dy, const bf16* g, const bf16* u, bf16* dg, bf16* du, int64_t n);

// ---- GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ----
void gelu_fwd(const float* x, float* y, int64_t n);
void gelu_bwd(const float* dy, const float* x, float* dx, int64_t n);

// ---- cross-entropy fused with its gradient ----
// logits (N,V), targets (N) -> loss (scalar, sum over N / rows), dlogits (N,V) = (softmax - onehot)
// / rows, where rows = N unless given (a shard of a batch divides by the whole batch's row count).
// Accumulates in f32 (f64 for the sum over rows). dlogits may alias logits.
void cross_entropy(const float* logits, const int32_t* targets, float* loss, float* dlogits,
                   int64_t N, int64_t V, int64_t rows = 0);
// Vocabulary-parallel (ops/loss.cc): this rank's block of V columns, targets relative to it (-1
// outside). stats (N,3) = per row max, sum of exp(x - max), x_t (0 for -1).
void softmax_stats(const float* logits, const int32_t* targets, float* stats, int64_t N, int64_t V);
// stats (K,N,3): every block's softmax_stats. loss = sum over rows whose target is in this block
// of (logsumexp - x_t), / rows; dlogits = (exp(x - logsumexp) - onehot) / rows (may alias logits).
void cross_entropy_split(const float* logits, const int32_t* targets, const float* stats, int64_t K,
                         float* loss, float* dlogits, int64_t N, int64_t V, int64_t rows = 0);

// ---- elementwise ----
void add(const float* a, const float* b, float* y, int64_t n);  // y = a + b
// a (N,C) + b (C) broadcast over rows
void add_bias(const float* a, const float* b, float* y, int64_t N, int64_t C);
void mul(const float* a, const float* b, float* y, int64_t n);
void scale(const float* a, float s, float* y, int64_t n);
// y = a * s[0], s a scalar tensor
void mul_scalar(const float* a, const float* s, float* y, int64_t n);
void cast_f32_bf16(const float* x, bf16* y, int64_t n);  // round to nearest even
void cast_bf16_f32(const bf16* x, float* y, int64_t n);

// ---- reductions (fixed blocking, thread-count independent) ----
void sum(const float* x, float* y, int64_t n);                  // y[0] = sum x
void sumsq(const float* x, float* y, int64_t n);                // y[0] = sum x^2
void sum_rows(const float* x, float* y, int64_t N, int64_t C);  // (N,C) -> (C), y overwritten

// ---- layout ----
// x with shape dims[0..rank) permuted by perm: y.shape[i] = x.shape[perm[i]]. elem = element bytes.
void transpose(const void* x, void* y, const int64_t* dims, const int* perm, int rank, int elem);
// x (N, sum(sizes)) split along the last dim into k outputs (N, sizes[i]); concat is the inverse.
// elem = element bytes (4: f32, 2: bf16).
void split_last(const void* x, void* const* ys, const int64_t* sizes, int k, int64_t N, int elem);
void concat_last(const void* const* xs, void* y, const int64_t* sizes, int k, int64_t N, int elem);

// ---- Mixture-of-Experts (moe.cc; ops/moe.cc defines each) ----
// Shapes: logits (B,T,E); gates, experts, slots (B,T,K); the expert layout (E,B,S,C) with S
// slots per expert and sequence; the token layout (B,T,C).
// -> gates, experts, slots, prob_sum (E), z_sum (1), routed (E), kept (E), all overwritten
void moe_router(const float* logits, float* gates, int32_t* experts, int32_t* slots,
                float* prob_sum, float* z_sum, float* routed, float* kept, int64_t B, int64_t T,
                int64_t E, int64_t K, int64_t S);
// -> dlogits (B,T,E), overwritten
void moe_router_bwd(const float* logits, const float* gates, const int32_t* experts,
                    const float* dgates, const float* dprob_sum, float dz_sum, float* dlogits,
                    int64_t B, int64_t T, int64_t E, int64_t K);
// X is float or bf16; gates may be null (weight 1). Outputs overwritten.
template <class X>  // x (B,T,C) -> xe (E,B,S,C)
void moe_dispatch(const X* x, const int32_t* experts, const int32_t* slots, const float* gates,
                  X* xe, int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t S);
template <class X>  // ye (E,B,S,C) -> y (B,T,C)
void moe_combine(const X* ye, const int32_t* experts, const int32_t* slots, const float* gates,
                 float* y, int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t S);
template <class X, class Y>  // ye (E,B,S,C), y (B,T,C) -> dg (B,T,K)
void moe_gate_grad(const X* ye, const Y* y, const int32_t* experts, const int32_t* slots, float* dg,
                   int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t S);

// grouped_matmul (kernels/gemm_desc.h's GroupedGemm). Rows of `a` past the last nonzero one of each
// (e,g) block of S rows are skipped (their products are 0); each expert's other rows are packed
// into one matrix, rounded up to 16 rows, for one GEMM.
using kernels::GroupedGemm;
void grouped_gemm(const GroupedGemm& d, const void* a, const void* b, void* c);

// ---- AdamW (decoupled weight decay), in place ----
// hyper = {lr, 1 - beta1^t, 1 - beta2^t}; g is multiplied by gscale[0] (gradient clipping) first.
//   g' = g*gscale; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2
//   p -= lr * ( (m/bc1) / (sqrt(v/bc2) + eps) + wd * p )
void adamw(float* p, const float* g, float* m, float* v, const float* hyper, const float* gscale,
           int64_t n, float beta1, float beta2, float eps, float wd);
// total = sum of squared gradient norms (scalar) -> norm = sqrt(total), coef = min(1,
// max_norm/(norm+1e-6)) (max_norm <= 0: coef = 1)
void clip_coef(const float* total, float* coef, float* norm, float max_norm);

}  // namespace loom::kernels::cpu
