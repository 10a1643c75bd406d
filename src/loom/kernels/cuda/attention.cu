// Causal grouped-query attention on the GPU (kernels.h: attention_fwd, attention_bwd), the device
// twin of kernels/cpu/attention.cc with the same contract (kernels/cpu/attention.h):
//   q (B,T,NH,HS), k and v (B,T,NKV,HS), o (B,T,NH,HS), lse (B,NH,T) f32; query head h reads kv
//   head h / (NH/NKV); lse_t = log sum_{j<=t} exp(scale q_t.k_j). Elem is float or bf16; all
//   arithmetic is f32 and bf16 outputs are rounded to nearest even once.
//
// Forward: one block per (b,h,t) row (attention_row.cuh). Backward, with P_tj = exp(scale q_t.k_j -
// lse_t) recomputed and D_t = dO_t.O_t:
//   1. D (B,NH,T): one warp per row, into stream-ordered scratch.
//   2. dq: one block per (b,h,t) row: dS_tj = P_tj (dO_t.v_j - D_t) for j <= t in chunks of keys,
//      dq_t = scale sum_j dS_tj k_j (thread d owns element d).
//   3. dk, dv: one block per (b, kv head g, key j): over the group's query heads h (in order) and
//      queries t >= j (in order), dv_j = sum P_tj dO_t, dk_j = scale sum dS_tj q_t.
// Every output element is written by one thread in a fixed order: no atomics, bit-repeatable.
//
// Not fast: scores are recomputed three times (fwd, dq, dk/dv) and rows are re-read from L2 per
// query or key. bf16 with HS 32, 64 or 128 runs flash_attention.cu's tensor-core kernels instead
// (flash_attention_fits); these row kernels take f32 (the parity tests' exact path) and the rest.
// HS <= kAttnMaxHS (256).
#include <type_traits>

#include "loom/kernels/cuda/attention_row.cuh"
#include "loom/kernels/cuda/cudnn_attention.h"
#include "loom/kernels/cuda/flash_attention.h"

namespace loom::kernels::cuda {
namespace {

struct AttnShape {
  int64_t B, T, NH, NKV;
  int HS;
  float scale;
};

// Row r of (B,NH,T) (the lse layout) -> element offset of (b, t, h) in the (B,T,NH,HS) layout.
__device__ __forceinline__ int64_t qrow_offset(const AttnShape& p, int64_t r) {
  const int64_t b = r / (p.NH * p.T), h = r / p.T % p.NH, t = r % p.T;
  return ((b * p.T + t) * p.NH + h) * p.HS;
}

template <class Elem>
__global__ void __launch_bounds__(kAttnThreads)
    attention_fwd_kernel(const Elem* q, const Elem* k, const Elem* v, Elem* o, float* lse,
                         AttnShape p) {
  __shared__ float qs[kAttnMaxHS];
  __shared__ float ps[kAttnChunk];
  const int64_t rows = p.B * p.NH * p.T, ld = p.NKV * p.HS;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // r = (b, h, t) of lse
    const int64_t b = r / (p.NH * p.T), h = r / p.T % p.NH, t = r % p.T;
    const int64_t kv = b * p.T * ld + h / (p.NH / p.NKV) * p.HS;  // (b, 0, g, 0)
    const int64_t off = qrow_offset(p, r);
    attend_row(q + off, k + kv, v + kv, ld, t + 1, p.HS, p.scale, o + off, lse + r, qs, ps);
  }
}

// D (B,NH,T) = dO . O per row, one warp per row.
template <class Elem>
__global__ void attention_d_kernel(const Elem* dout, const Elem* o, float* D, AttnShape p) {
  const int64_t rows = p.B * p.NH * p.T;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    const int64_t off = qrow_offset(p, r);
    float s = 0.f;
    for (int d = lane; d < p.HS; d += 32) s = fmaf(to_f32(dout[off + d]), to_f32(o[off + d]), s);
    s = warp_sum(s);
    if (lane == 0) D[r] = s;
  }
}

// dq (B,T,NH,HS), one block per (b,h,t) row.
template <class Elem>
__global__ void __launch_bounds__(kAttnThreads)
    attention_dq_kernel(const Elem* dout, const Elem* q, const Elem* k, const Elem* v,
                        const float* lse, const float* D, Elem* dq, AttnShape p) {
  __shared__ float qs[kAttnMaxHS];
  __shared__ float dos[kAttnMaxHS];
  __shared__ float dss[kAttnChunk];  // dS_tj of the chunk's keys
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t rows = p.B * p.NH * p.T, ld = p.NKV * p.HS;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t b = r / (p.NH * p.T), h = r / p.T % p.NH, t = r % p.T;
    const int64_t kv = b * p.T * ld + h / (p.NH / p.NKV) * p.HS;  // (b, 0, g, 0)
    const Elem* kb = k + kv;                                      // key j at kb + j * ld
    const Elem* vb = v + kv;
    const int64_t off = qrow_offset(p, r);
    __syncthreads();  // the previous row may still read qs, dos
    for (int d = tid; d < p.HS; d += kAttnThreads) {
      qs[d] = to_f32(q[off + d]);
      dos[d] = to_f32(dout[off + d]);
    }
    __syncthreads();
    const float lse_t = lse[r], D_t = D[r];
    float acc[kAttnPerThread] = {};
    for (int64_t c0 = 0; c0 <= t; c0 += kAttnChunk) {
      const int cn = int(t + 1 - c0 < kAttnChunk ? t + 1 - c0 : kAttnChunk);
      for (int j = warp; j < cn; j += kAttnWarps) {
        const float s = warp_dot(qs, kb + (c0 + j) * ld, p.HS);
        const float dp = warp_dot(dos, vb + (c0 + j) * ld, p.HS);
        if (lane == 0) dss[j] = expf(s * p.scale - lse_t) * (dp - D_t);
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kAttnPerThread; ++i) {
        const int d = tid + i * kAttnThreads;
        if (d >= p.HS) continue;
        const Elem* kd = kb + c0 * ld + d;
        float a = acc[i];
        for (int j = 0; j < cn; ++j) a = fmaf(dss[j], to_f32(kd[j * ld]), a);
        acc[i] = a;
      }
      __syncthreads();  // the next chunk overwrites dss
    }
#pragma unroll
    for (int i = 0; i < kAttnPerThread; ++i) {
      const int d = tid + i * kAttnThreads;
      if (d < p.HS) dq[off + d] = from_f32<Elem>(p.scale * acc[i]);
    }
  }
}

// dk, dv (B,T,NKV,HS), one block per (b,j,g) row: sums over the group's query heads and t >= j.
template <class Elem>
__global__ void __launch_bounds__(kAttnThreads)
    attention_dkv_kernel(const Elem* dout, const Elem* q, const Elem* k, const Elem* v,
                         const float* lse, const float* D, Elem* dk, Elem* dv, AttnShape p) {
  __shared__ float ks[kAttnMaxHS];
  __shared__ float vs[kAttnMaxHS];
  __shared__ float pp[kAttnChunk];   // P_tj of the chunk's queries
  __shared__ float dss[kAttnChunk];  // dS_tj
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t rows = p.B * p.T * p.NKV, G = p.NH / p.NKV, ldq = p.NH * p.HS;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // r = (b, j, g) of dk
    const int64_t b = r / (p.T * p.NKV), j = r / p.NKV % p.T, g = r % p.NKV;
    const int64_t off = r * p.HS;
    __syncthreads();  // the previous row may still read ks, vs
    for (int d = tid; d < p.HS; d += kAttnThreads) {
      ks[d] = to_f32(k[off + d]);
      vs[d] = to_f32(v[off + d]);
    }
    __syncthreads();
    float dk_acc[kAttnPerThread] = {}, dv_acc[kAttnPerThread] = {};
    for (int64_t h = g * G; h < (g + 1) * G; ++h) {
      const int64_t qh = (b * p.T * p.NH + h) * p.HS;  // (b, 0, h, 0): query t at qh + t * ldq
      const float* lse_h = lse + (b * p.NH + h) * p.T;
      const float* D_h = D + (b * p.NH + h) * p.T;
      for (int64_t t0 = j; t0 < p.T; t0 += kAttnChunk) {
        const int cn = int(p.T - t0 < kAttnChunk ? p.T - t0 : kAttnChunk);
        for (int c = warp; c < cn; c += kAttnWarps) {
          const int64_t t = t0 + c;
          const float s = warp_dot(ks, q + qh + t * ldq, p.HS);
          const float dp = warp_dot(vs, dout + qh + t * ldq, p.HS);
          if (lane == 0) {
            const float pr = expf(s * p.scale - lse_h[t]);
            pp[c] = pr;
            dss[c] = pr * (dp - D_h[t]);
          }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kAttnPerThread; ++i) {
          const int d = tid + i * kAttnThreads;
          if (d >= p.HS) continue;
          const Elem* qd = q + qh + t0 * ldq + d;
          const Elem* dod = dout + qh + t0 * ldq + d;
          float ak = dk_acc[i], av = dv_acc[i];
          for (int c = 0; c < cn; ++c) {
            av = fmaf(pp[c], to_f32(dod[c * ldq]), av);
            ak = fmaf(dss[c], to_f32(qd[c * ldq]), ak);
          }
          dk_acc[i] = ak;
          dv_acc[i] = av;
        }
        __syncthreads();  // the next chunk overwrites pp, dss
      }
    }
#pragma unroll
    for (int i = 0; i < kAttnPerThread; ++i) {
      const int d = tid + i * kAttnThreads;
      if (d >= p.HS) continue;
      dk[off + d] = from_f32<Elem>(p.scale * dk_acc[i]);
      dv[off + d] = from_f32<Elem>(dv_acc[i]);
    }
  }
}

void check_shape(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, const char* what) {
  if (B < 0 || T < 0 || NH <= 0 || NKV <= 0 || NH % NKV != 0 || HS <= 0 || HS > kAttnMaxHS)
    check(int(cudaErrorInvalidValue), what);
}

}  // namespace

template <class Elem>
void attention_fwd(const Elem* q, const Elem* k, const Elem* v, Elem* o, float* lse, int64_t B,
                   int64_t T, int64_t NH, int64_t NKV, int64_t HS, float scale, Stream s) {
  check_shape(B, T, NH, NKV, HS, "attention_fwd: bad shape (NH % NKV != 0 or HS > 256)");
  if (B == 0 || T == 0) return;
  if constexpr (std::is_same_v<Elem, bf16>) {
    if (use_cudnn_attention() && cudnn_attention_fwd(q, k, v, o, lse, B, T, NH, NKV, HS, scale, s))
      return;
    const void* ptrs[] = {q, k, v, o, lse};
    if (attention_kernels() != AttentionKernels::row && flash_attention_fits(B, NH, HS, ptrs, 5))
      return flash_attention_fwd(q, k, v, o, lse, B, T, NH, NKV, HS, scale, s);
  }
  const AttnShape p{B, T, NH, NKV, int(HS), scale};
  attention_fwd_kernel<Elem><<<attn_grid(B * NH * T), kAttnThreads, 0, s>>>(q, k, v, o, lse, p);
  check_launch("attention_fwd_kernel");
}

template <class Elem>
void attention_bwd(const Elem* dout, const Elem* q, const Elem* k, const Elem* v, const Elem* o,
                   const float* lse, Elem* dq, Elem* dk, Elem* dv, int64_t B, int64_t T, int64_t NH,
                   int64_t NKV, int64_t HS, float scale, Stream s) {
  check_shape(B, T, NH, NKV, HS, "attention_bwd: bad shape (NH % NKV != 0 or HS > 256)");
  if (B == 0 || T == 0) return;
  if constexpr (std::is_same_v<Elem, bf16>) {
    if (use_cudnn_attention() &&
        cudnn_attention_bwd(dout, q, k, v, o, lse, dq, dk, dv, B, T, NH, NKV, HS, scale, s))
      return;
  }
  const AttnShape p{B, T, NH, NKV, int(HS), scale};
  const int64_t rows = B * NH * T;
  void* scratch = nullptr;
  note_scratch(rows * int64_t(sizeof(float)));
  check(int(cudaMallocAsync(&scratch, size_t(rows) * sizeof(float), s)), "attention_bwd: D");
  float* D = static_cast<float*>(scratch);
  attention_d_kernel<Elem><<<blocks_for(rows * 32), kThreads, 0, s>>>(dout, o, D, p);
  check_launch("attention_d_kernel");
  if constexpr (std::is_same_v<Elem, bf16>) {
    const void* ptrs[] = {dout, q, k, v, dq, dk, dv};
    if (attention_kernels() != AttentionKernels::row && flash_attention_fits(B, NH, HS, ptrs, 7)) {
      flash_attention_bwd(dout, q, k, v, lse, D, dq, dk, dv, B, T, NH, NKV, HS, scale, s);
      check(int(cudaFreeAsync(scratch, s)), "attention_bwd: free D");
      return;
    }
  }
  attention_dq_kernel<Elem><<<attn_grid(rows), kAttnThreads, 0, s>>>(dout, q, k, v, lse, D, dq, p);
  check_launch("attention_dq_kernel");
  attention_dkv_kernel<Elem>
      <<<attn_grid(B * T * NKV), kAttnThreads, 0, s>>>(dout, q, k, v, lse, D, dk, dv, p);
  check_launch("attention_dkv_kernel");
  check(int(cudaFreeAsync(scratch, s)), "attention_bwd: free D");
}

template void attention_fwd<float>(const float*, const float*, const float*, float*, float*,
                                   int64_t, int64_t, int64_t, int64_t, int64_t, float, Stream);
template void attention_fwd<bf16>(const bf16*, const bf16*, const bf16*, bf16*, float*, int64_t,
                                  int64_t, int64_t, int64_t, int64_t, float, Stream);
template void attention_bwd<float>(const float*, const float*, const float*, const float*,
                                   const float*, const float*, float*, float*, float*, int64_t,
                                   int64_t, int64_t, int64_t, int64_t, float, Stream);
template void attention_bwd<bf16>(const bf16*, const bf16*, const bf16*, const bf16*, const bf16*,
                                  const float*, bf16*, bf16*, bf16*, int64_t, int64_t, int64_t,
                                  int64_t, int64_t, float, Stream);

}  // namespace loom::kernels::cuda
