// The warp-level tensor-core pieces of flash_attention.cu (included there only): each warp
// multiplies with mma.sync m16n8k16 (bf16 in, f32 accumulators), whose fragment layouts are fixed
// by the PTX ISA, so the softmax runs on the accumulators in place and a 16 x 16 block of
// probabilities is an A operand without a trip through shared memory. (A first version on
// nvcuda::wmma staged every score and accumulator through shared memory: 214 ms against 180 for
// the 1B Llama's step on an H200.)
//
// Fragment layouts (lane = 4 * grp + qd; PTX ISA, "mma.m16n8k16"):
//   A 16x16 (row-major): a0 (grp, 2qd..2qd+1), a1 (grp+8, same), a2 (grp, 8+2qd..), a3 (grp+8,
//   8+2qd..) B 16x8:              b0 (k 2qd..2qd+1, n grp), b1 (k 8+2qd.., n grp) C 16x8 (f32): c0,
//   c1 (grp, 2qd..2qd+1), c2, c3 (grp+8, same)
// So the C tiles 2kk and 2kk+1 of a 16 x 64 score block are, packed to bf16 pairs, exactly the A
// fragment kk of the probabilities (16 x 16 keys): (c0c1, c2c3) of tile 2kk, then of tile 2kk+1.
// A B operand that is the transpose of a row-major tile (B[k][n] = t[n][k]) loads with two 32-bit
// shared loads; one that is a row-major tile itself (B[k][n] = t[k][n]) with ldmatrix .trans.
// With rows D + 8 elements apart every such access is free of bank conflicts.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace loom::kernels::cuda::flash_mma {

using bf = __nv_bfloat16;

__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to nearest even into a bf16 pair (lo in the low half: the lower column).
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float lo_f32(uint32_t p) { return __uint_as_float(p << 16); }
__device__ __forceinline__ float hi_f32(uint32_t p) { return __uint_as_float(p & 0xffff0000u); }

__device__ __forceinline__ uint32_t lds32(const bf* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// A fragment of the 16 x 16 block at (r0, k0) of a row-major tile t (rows ld apart).
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf* t, int ld, int r0, int k0) {
  const int lane = threadIdx.x & 31, grp = lane >> 2, qd = lane & 3;
  const bf* p = t + (r0 + grp) * ld + k0 + 2 * qd;
  a[0] = lds32(p);
  a[1] = lds32(p + 8 * ld);
  a[2] = lds32(p + 8);
  a[3] = lds32(p + 8 * ld + 8);
}

// B fragment (k0..k0+15, n0..n0+7) of B = t^T: B[k][n] = t[n][k].
__device__ __forceinline__ void load_bt(uint32_t& b0, uint32_t& b1, const bf* t, int ld, int n0,
                                        int k0) {
  const int lane = threadIdx.x & 31, grp = lane >> 2, qd = lane & 3;
  const bf* p = t + (n0 + grp) * ld + k0 + 2 * qd;
  b0 = lds32(p);
  b1 = lds32(p + 8);
}

// B fragment (k0..k0+15, n0..n0+7) of B = t: B[k][n] = t[k][n] (ldmatrix, transposed).
__device__ __forceinline__ void load_b(uint32_t& b0, uint32_t& b1, const bf* t, int ld, int k0,
                                       int n0) {
  const int lane = threadIdx.x & 31;
  const bf* p = t + (k0 + (lane & 15)) * ld + n0;
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(b0), "=r"(b1)
               : "r"(addr));
}

// c += a times the 16 x 8 block of B at (k0, n0): mma_bt for B = t^T, mma_b for B = t.
__device__ __forceinline__ void mma_bt(float (&c)[4], const uint32_t (&a)[4], const bf* t, int ld,
                                       int n0, int k0) {
  uint32_t b0, b1;
  load_bt(b0, b1, t, ld, n0, k0);
  mma(c, a, b0, b1);
}
__device__ __forceinline__ void mma_b(float (&c)[4], const uint32_t (&a)[4], const bf* t, int ld,
                                      int k0, int n0) {
  uint32_t b0, b1;
  load_b(b0, b1, t, ld, k0, n0);
  mma(c, a, b0, b1);
}

template <int N>
__device__ __forceinline__ void zero(float (&c)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
}

// Rows grp (c0, c1) and grp + 8 (c2, c3) of C tiles, times r0 and r1.
template <int N>
__device__ __forceinline__ void scale_rows(float (&c)[N][4], float r0, float r1) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
    c[n][0] *= r0;
    c[n][1] *= r0;
    c[n][2] *= r1;
    c[n][3] *= r1;
  }
}

// C tile j of a 16 x 16K block, packed (top: row grp's pair, bot: row grp + 8's), as its part of
// the block's A fragment j / 2 (see the layouts above).
template <int K>
__device__ __forceinline__ void put_a(uint32_t (&a)[K][4], int j, uint32_t top, uint32_t bot) {
  a[j / 2][(j % 2) * 2] = top;
  a[j / 2][(j % 2) * 2 + 1] = bot;
}

// Sum and max over the 4 lanes that share a row (lanes 4 grp .. 4 grp + 3), same bits in each.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// Row r (0..15) of a warp's accumulators, scaled and rounded to bf16, to dst[r * ld_dst + col]:
// acc[n] is the C tile of columns 8n..8n+7; rows at or past `rows` skipped.
template <int N8>
__device__ __forceinline__ void store_c(const float (&acc)[N8][4], bf* dst, int64_t ld_dst,
                                        int64_t rows, float scale) {
  const int lane = threadIdx.x & 31, grp = lane >> 2, qd = lane & 3;
#pragma unroll
  for (int n = 0; n < N8; ++n) {
    const int col = 8 * n + 2 * qd;
    if (grp < rows)
      *reinterpret_cast<uint32_t*>(dst + grp * ld_dst + col) =
          pack(scale * acc[n][0], scale * acc[n][1]);
    if (grp + 8 < rows)
      *reinterpret_cast<uint32_t*>(dst + (grp + 8) * ld_dst + col) =
          pack(scale * acc[n][2], scale * acc[n][3]);
  }
}

}  // namespace loom::kernels::cuda::flash_mma
