// Shared by the CUDA kernel files: bf16 loads/stores matching core/dtype.h's rounding, launch
// sizing, and fixed-order block reductions (no atomics: results depend on the shape only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "loom/core/dtype.h"
#include "loom/kernels/cuda/cuda_check.h"
#include "loom/kernels/cuda/kernels.h"

namespace loom::kernels::cuda {

// loom::bf16 and __nv_bfloat16 are both 16 stored bits; conversions round to nearest even.
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __uint_as_float(uint32_t(x.bits) << 16); }
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  return bf16{__bfloat16_as_ushort(h)};
}

// Four consecutive elements as one access (f32: 16 bytes, bf16: 8), widened to f32 / rounded back
// as to_f32 / from_f32 do one by one. p + 4*i must be so aligned.
struct F4 {
  float v[4];
};
__device__ __forceinline__ F4 load4(const float* p, int64_t i) {
  const float4 x = reinterpret_cast<const float4*>(p)[i];
  return {{x.x, x.y, x.z, x.w}};
}
__device__ __forceinline__ F4 load4(const bf16* p, int64_t i) {
  const uint2 x = reinterpret_cast<const uint2*>(p)[i];
  return {{__uint_as_float(x.x << 16), __uint_as_float(x.x & 0xffff0000u),
           __uint_as_float(x.y << 16), __uint_as_float(x.y & 0xffff0000u)}};
}
__device__ __forceinline__ void store4(float* p, int64_t i, const F4& x) {
  reinterpret_cast<float4*>(p)[i] = make_float4(x.v[0], x.v[1], x.v[2], x.v[3]);
}
__device__ __forceinline__ void store4(bf16* p, int64_t i, const F4& x) {
  auto bits = [](float f) { return uint32_t(from_f32<bf16>(f).bits); };
  reinterpret_cast<uint2*>(p)[i] =
      make_uint2(bits(x.v[0]) | bits(x.v[1]) << 16, bits(x.v[2]) | bits(x.v[3]) << 16);
}

// Whether every pointer is `bytes`-aligned (the condition of the kernels that move 4 elements per
// access).
inline bool aligned(int64_t bytes, std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (reinterpret_cast<uintptr_t>(p) % uintptr_t(bytes) != 0) return false;
  return true;
}

constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

// Grid-stride loops over int64 indices: for (i = grid_start(); i < n; i += grid_step()).
__device__ __forceinline__ int64_t grid_start() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_step() { return int64_t(gridDim.x) * blockDim.x; }

// Sum of v over the block's threads, in a fixed order (warp shuffles, then warp 0 over the warps'
// partials); every thread gets the result. blockDim.x must be a multiple of 32 (<= 1024).
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// block_sum in f64, for the reductions whose CPU twin adds in f64 (sum, sumsq, partial columns,
// cross-entropy's mean over rows).
__device__ __forceinline__ double block_sum_f64(double v) {
  __shared__ double partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum of x (n) by one block, in f64: thread j adds x[j], x[j + blockDim.x], ... in order, then
// block_sum_f64. Every thread gets the result; the order depends on n and blockDim.x only.
__device__ __forceinline__ double block_sum_f64(const double* x, int64_t n) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  return block_sum_f64(s);
}

// Column sums over rows, in two fixed stages (no atomics): stage 1 writes one f32 partial row
// (chunks, C) per chunk of column_chunk_rows(N) rows, rows added in order; stage 2 adds the
// partials of column c in chunk order in f64. The CPU kernels block by 64 rows the same way; very
// tall inputs get longer chunks so that the partials stay under 256 rows.
inline int64_t column_chunk_rows(int64_t N) {
  const int64_t tall = (N + 255) / 256;
  return tall > 64 ? tall : 64;
}
inline int64_t column_chunks(int64_t N) {
  const int64_t rows = column_chunk_rows(N);
  return (N + rows - 1) / rows;
}
// Stage 2 for column c: partials (chunks, C) -> their f32-rounded f64 sum.
__device__ __forceinline__ float sum_partial_column(const float* partials, int64_t chunks,
                                                    int64_t C, int64_t c) {
  double s = 0;
#pragma unroll 8  // the loads issue ahead of the adds, which stay in order
  for (int64_t b = 0; b < chunks; ++b) s += partials[b * C + c];
  return float(s);
}

// Scratch memory ordered on a stream: allocated with cudaMallocAsync on s, released with
// cudaFreeAsync on s when the object goes out of scope, so after every kernel queued on s in
// between. Used where a kernel needs per-block partials and the interface gives no workspace.
// bytes = 0 allocates nothing (get() is null).
class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t s) : s_(s) {
    note_scratch(int64_t(bytes));
    if (bytes > 0) check(cudaMallocAsync(&p_, bytes, s), "cudaMallocAsync (kernel scratch)");
  }
  ~StreamScratch() {
    if (p_ != nullptr) (void)cudaFreeAsync(p_, s_);  // a destructor must not throw
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  template <class T>
  T* get() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  cudaStream_t s_;
};

}  // namespace loom::kernels::cuda
