// One query row of causal attention, shared by attention.cu (the forward) and cached_attention.cu
// (the decode step), so that a prefill from an empty cache runs the very same arithmetic as the
// forward and matches it bit for bit.
//
// A block of kAttnThreads threads handles a row: warps score keys (one key per warp at a time,
// lanes across the head dimension, a fixed shuffle tree), thread d owns output element d (and d +
// kAttnThreads). Keys stream in chunks of kAttnChunk with an online softmax (running max m, sum
// l, accumulators rescaled by exp(m_old - m_new)), so shared memory does not grow with T.
//
// Not a flash kernel: keys and values are re-read from global memory (L2) for every query row.
// Invariant: the arithmetic order depends on the shape only; no atomics.
#pragma once

#include "loom/kernels/cuda/common.cuh"

namespace loom::kernels::cuda {

constexpr int kAttnThreads = 128;  // 4 warps per row
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kAttnMaxHS = 256;                            // head sizes supported
constexpr int kAttnPerThread = kAttnMaxHS / kAttnThreads;  // output elements per thread
constexpr int kAttnChunk = 1024;                           // keys (or queries) per smem chunk

// Sum over the warp by an xor butterfly: every lane gets the same bits (a + b == b + a).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Dot product of x (f32, HS, shared memory) with row y (HS) of Elem, by one warp; all lanes get it.
template <class Elem>
__device__ __forceinline__ float warp_dot(const float* x, const Elem* y, int HS) {
  const int lane = threadIdx.x & 31;
  float s = 0.f;
  for (int d = lane; d < HS; d += 32) s = fmaf(x[d], to_f32(y[d]), s);
  return warp_sum(s);
}

// o (HS) = sum_j softmax_j(scale * q.k_j) v_j over keys j in [0,n) (n >= 1), k and v rows of
// stride ld; *lse = log sum_j exp(scale * q.k_j) unless lse is null. All kAttnThreads threads of
// the block call it; qs (kAttnMaxHS floats) and ps (kAttnChunk floats) are the block's shared
// memory.
template <class Elem>
__device__ void attend_row(const Elem* q, const Elem* k, const Elem* v, int64_t ld, int64_t n,
                           int HS, float scale, Elem* o, float* lse, float* qs, float* ps) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  __syncthreads();  // qs and ps may still be read for the block's previous row
  for (int d = tid; d < HS; d += kAttnThreads) qs[d] = to_f32(q[d]);
  __syncthreads();
  float m = -INFINITY, l = 0.f;
  float acc[kAttnPerThread] = {};
  for (int64_t c0 = 0; c0 < n; c0 += kAttnChunk) {
    const int cn = int(n - c0 < kAttnChunk ? n - c0 : kAttnChunk);
    for (int j = warp; j < cn; j += kAttnWarps) {
      const float dot = warp_dot(qs, k + (c0 + j) * ld, HS);
      if (lane == 0) ps[j] = dot * scale;
    }
    __syncthreads();
    float cm = -INFINITY;
    for (int j = tid; j < cn; j += kAttnThreads) cm = fmaxf(cm, ps[j]);
    const float m_new = fmaxf(m, block_max(cm));
    float cs = 0.f;
    for (int j = tid; j < cn; j += kAttnThreads) {
      const float p = expf(ps[j] - m_new);
      ps[j] = p;
      cs += p;
    }
    cs = block_sum(cs);                   // its barriers also publish the ps[] writes above
    const float alpha = expf(m - m_new);  // 0 for the first chunk (m = -inf)
    l = fmaf(l, alpha, cs);
    m = m_new;
#pragma unroll
    for (int i = 0; i < kAttnPerThread; ++i) {
      const int d = tid + i * kAttnThreads;
      if (d >= HS) continue;
      float a = acc[i] * alpha;
      const Elem* vd = v + c0 * ld + d;
      for (int j = 0; j < cn; ++j) a = fmaf(ps[j], to_f32(vd[j * ld]), a);
      acc[i] = a;
    }
    __syncthreads();  // the next chunk overwrites ps
  }
  const float inv = 1.f / l;
#pragma unroll
  for (int i = 0; i < kAttnPerThread; ++i) {
    const int d = tid + i * kAttnThreads;
    if (d < HS) o[d] = from_f32<Elem>(acc[i] * inv);
  }
  if (lse && tid == 0) *lse = m + logf(l);
}

// Grid size for a loop over `rows` blocks (blockIdx.x, blockIdx.x + gridDim.x, ...).
inline unsigned attn_grid(int64_t rows) {
  return unsigned(rows < (int64_t(1) << 30) ? rows : (int64_t(1) << 30));
}

}  // namespace loom::kernels::cuda
