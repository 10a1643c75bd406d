// bf16 causal grouped-query attention through cuDNN's fused SDPA (cudnn_attention.cc): what
// attention.cu's attention_fwd<bf16> and attention_bwd<bf16> run when attention_kernels() picks
// cuDNN, with their contract (kernels.h, kernels/cpu/attention.h): q, o (B,T,NH,HS); k, v
// (B,T,NKV,HS); lse (B,NH,T) f32, the natural-log log-sum-exp of the scaled scores, which is what
// cuDNN calls the softmax statistics. Internal to kernels/cuda.
#pragma once

#include <cstdint>

#include "loom/core/dtype.h"

struct CUstream_st;

namespace loom::kernels::cuda {

// Whether attention_kernels() (kernels.h) has bf16 attention try cuDNN first: `automatic` where
// libcudnn opens ($LOOM_CUDNN, else "libcudnn.so.9" through the loader's search path; tried
// once), `cudnn` always, and where cuDNN does not open an error naming why.
bool use_cudnn_attention();

// Each returns false, having done nothing, where cuDNN does not support the shape (head size not a
// multiple of 8 or above 128, pointers not 16-byte aligned, or cuDNN's own check): the caller runs
// its own kernels instead. A failure after cuDNN took the shape throws, naming cuDNN's message.
// The backward is cuDNN's deterministic algorithm: a step repeats bit for bit.
bool cudnn_attention_fwd(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                         int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, float scale,
                         CUstream_st* s);
bool cudnn_attention_bwd(const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                         const bf16* o, const float* lse, bf16* dq, bf16* dk, bf16* dv, int64_t B,
                         int64_t T, int64_t NH, int64_t NKV, int64_t HS, float scale,
                         CUstream_st* s);

}  // namespace loom::kernels::cuda
