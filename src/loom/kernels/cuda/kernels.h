// CUDA kernels for every Loom op (sm_90a). Each function is the device twin of the CPU kernel of
// the same name (kernels/cpu/kernels.h, gemm.h, attention.h): the same arguments, shapes, overwrite
// and aliasing rules and the same arithmetic (f32 accumulation, bf16 stored as round-to-nearest-
// even), with every pointer in GPU memory and one more argument, the stream the work is queued on.
// Functions return once the work is queued; a launch error throws loom::Error (cuda_check.h).
//
// Scalars the CPU kernels take by value but the IR holds in a tensor (a decode step's first
// position, AdamW's hyper-parameters, a router's z-loss gradient, mul_scalar's factor) are read on
// the GPU from that tensor: nothing here copies to or from the host or synchronises.
//
// Determinism: no float atomics; every reduction (sums, norms' weight gradients, the embedding's
// gradient, cross-entropy's loss, the router's statistics) runs in a fixed order that depends on
// the shape only, so a run repeats bit for bit (resume parity relies on it).
//
// Plain C++: this header needs no CUDA header (the stream is CUstream_st*), so the dispatch table
// (runtime/cuda/) and tests compile with the host compiler.
#pragma once

#include <cstdint>

#include "loom/core/dtype.h"
#include "loom/kernels/gemm_desc.h"

struct CUstream_st;

namespace loom::kernels::cuda {

using Stream = CUstream_st*;

// ---- embedding ----
void embedding_fwd(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C,
                   Stream s);
// dtable overwritten; each row sums its ids' rows of dout in n order (no atomics).
void embedding_bwd(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t V,
                   int64_t C, Stream s);

// ---- norms ----
void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C,
                 float eps, Stream s);
void rmsnorm_bwd(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                 float* dw, int64_t N, int64_t C, Stream s);
void layernorm_fwd(const float* x, const float* w, const float* b, float* y, float* mean,
                   float* rstd, int64_t N, int64_t C, float eps, Stream s);
void layernorm_bwd(const float* dy, const float* x, const float* w, const float* mean,
                   const float* rstd, float* dx, float* dw, float* db, int64_t N, int64_t C,
                   Stream s);

// ---- RoPE ----
// t0 (GPU, one int32) may be null: positions start at 0. y may alias x.
void rope(const float* x, float* y, int64_t B, int64_t T, int64_t NH, int64_t HS, float theta,
          int sign, const int32_t* t0, Stream s);

// ---- activations ----
void swiglu_fwd(const float* g, const float* u, float* y, int64_t n, Stream s);
void swiglu_bwd(const float* dy, const float* g, const float* u, float* dg, float* du, int64_t n,
                Stream s);
void swiglu_fwd_bf16(const bf16* g, const bf16* u, bf16* y, int64_t n, Stream s);
void swiglu_bwd_bf16(const bf16* dy, const bf16* g, const bf16* u, bf16* dg, bf16* du, int64_t n,
                     Stream s);
void gelu_fwd(const float* x, float* y, int64_t n, Stream s);
void gelu_bwd(const float* dy, const float* x, float* dx, int64_t n, Stream s);

// ---- cross-entropy fused with its gradient (never materialises the probabilities apart from
// dlogits itself); loss is a GPU scalar. dlogits may alias logits. rows = 0: N.
void cross_entropy(const float* logits, const int32_t* targets, float* loss, float* dlogits,
                   int64_t N, int64_t V, int64_t rows, Stream s);

// ---- elementwise ----
void add(const float* a, const float* b, float* y, int64_t n, Stream s);
void add_bias(const float* a, const float* b, float* y, int64_t N, int64_t C, Stream s);
void mul(const float* a, const float* b, float* y, int64_t n, Stream s);
void scale(const float* a, float k, float* y, int64_t n, Stream s);
void mul_scalar(const float* a, const float* k, float* y, int64_t n, Stream s);  // k: GPU scalar
void cast_f32_bf16(const float* x, bf16* y, int64_t n, Stream s);
void cast_bf16_f32(const bf16* x, float* y, int64_t n, Stream s);
// y (n) = value; elem 4 (f32) or 2 (bf16, value rounded)
void fill(void* y, float value, int64_t n, int elem, Stream s);
// y (rows, T) of int32 = t0[0] + t (t0 null: 0)
void positions(int32_t* y, int64_t rows, int64_t T, const int32_t* t0, Stream s);
void broadcast_scalar(const float* x, float* y, int64_t n, Stream s);              // y = x[0]
void broadcast_rows(const float* x, float* y, int64_t rows, int64_t C, Stream s);  // y[r] = x
// Device-to-device copy of bytes (memmove semantics not needed: never overlapping unless equal).
void copy(void* y, const void* x, int64_t bytes, Stream s);

// ---- reductions (fixed order) ----
void sum(const float* x, float* y, int64_t n, Stream s);
void sumsq(const float* x, float* y, int64_t n, Stream s);
void sum_rows(const float* x, float* y, int64_t N, int64_t C, Stream s);

// ---- layout ----
void transpose(const void* x, void* y, const int64_t* dims, const int* perm, int rank, int elem,
               Stream s);  // dims and perm on the host
void split_last(const void* x, void* const* ys, const int64_t* sizes, int k, int64_t N, int elem,
                Stream s);  // ys (GPU pointers) and sizes on the host
void concat_last(const void* const* xs, void* y, const int64_t* sizes, int k, int64_t N, int elem,
                 Stream s);

// ---- GEMM (kernels/gemm_desc.h: f32 runs in full f32 arithmetic, no TF32) ----
using kernels::GemmDesc;
using kernels::GroupedGemm;
// Through cuBLASLt (cublaslt.cc, opened at run time; LOOM_CUDA_GEMM=tiled: gemm_tiled instead).
void gemm(const GemmDesc& d, const void* a, const void* b, void* c, Stream s);
// The plain tiled kernel (gemm.cu): what the GPU tests compare cuBLASLt's results with.
void gemm_tiled(const GemmDesc& d, const void* a, const void* b, void* c, Stream s);

// grouped_matmul
void grouped_gemm(const GroupedGemm& d, const void* a, const void* b, void* c, Stream s);

// ---- attention (kernels/cpu/attention.h); Elem float or bf16, f32 inside ----
// Which kernels bf16 attention runs (f32 always runs the row kernels, the parity tests' exact
// path): cuDNN's fused SDPA (cudnn_attention.cc) where libcudnn opens and takes the shape, else
// Loom's tensor-core kernels (flash_attention.cu) for head sizes 32, 64, 128, else the row
// kernels (attention.cu). `automatic` is that order; `cudnn` is an error where cuDNN does not
// open; `flash` and `row` skip what comes before. LOOM_CUDA_ATTENTION=cudnn|flash|row sets the
// process's choice (default automatic); the GPU tests switch it to check each against the CPU.
enum class AttentionKernels { automatic, cudnn, flash, row };
void set_attention_kernels(AttentionKernels k);
AttentionKernels attention_kernels();
template <class Elem>
void attention_fwd(const Elem* q, const Elem* k, const Elem* v, Elem* o, float* lse, int64_t B,
                   int64_t T, int64_t NH, int64_t NKV, int64_t HS, float scale, Stream s);
template <class Elem>
void attention_bwd(const Elem* dout, const Elem* q, const Elem* k, const Elem* v, const Elem* o,
                   const float* lse, Elem* dq, Elem* dk, Elem* dv, int64_t B, int64_t T, int64_t NH,
                   int64_t NKV, int64_t HS, float scale, Stream s);
// start: GPU int32. Positions past S are not checked on the GPU (the caller checks on the host).
template <class Elem>
void cached_attention(const Elem* q, const Elem* k, const Elem* v, Elem* kc, Elem* vc, Elem* o,
                      int64_t B, int64_t Tn, int64_t S, const int32_t* start, int64_t NH,
                      int64_t NKV, int64_t HS, float scale, Stream s);

// ---- Mixture-of-Experts (kernels/cpu/kernels.h's contracts) ----
void moe_router(const float* logits, float* gates, int32_t* experts, int32_t* slots,
                float* prob_sum, float* z_sum, float* routed, float* kept, int64_t B, int64_t T,
                int64_t E, int64_t K, int64_t S, Stream s);
// dz_sum: GPU scalar
void moe_router_bwd(const float* logits, const float* gates, const int32_t* experts,
                    const float* dgates, const float* dprob_sum, const float* dz_sum,
                    float* dlogits, int64_t B, int64_t T, int64_t E, int64_t K, Stream s);
template <class X>
void moe_dispatch(const X* x, const int32_t* experts, const int32_t* slots, const float* gates,
                  X* xe, int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t S,
                  Stream s);
template <class X>
void moe_combine(const X* ye, const int32_t* experts, const int32_t* slots, const float* gates,
                 float* y, int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t S,
                 Stream s);
template <class X, class Y>
void moe_gate_grad(const X* ye, const Y* y, const int32_t* experts, const int32_t* slots, float* dg,
                   int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t S, Stream s);

// ---- optimizer ----
// hyper = {lr, 1 - beta1^t, 1 - beta2^t} and gscale (one float): GPU tensors.
void adamw(float* p, const float* g, float* m, float* v, const float* hyper, const float* gscale,
           int64_t n, float beta1, float beta2, float eps, float wd, Stream s);
void clip_coef(const float* total, float* coef, float* norm, float max_norm, Stream s);

}  // namespace loom::kernels::cuda
