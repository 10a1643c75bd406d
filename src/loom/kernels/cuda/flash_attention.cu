// Causal grouped-query attention for bf16 on the tensor cores (flash_attention.h), after the
// flash-attention-2 algorithm (Dao 2023): tiles of 64 queries and 64 keys in shared memory, the
// scores of a tile never written to global memory, an online softmax in the forward and the
// scores made again from the saved log-sum-exp in the backward.
//
// Layouts as kernels.h's attention_fwd/attention_bwd: q, o (B,T,NH,HS); k, v (B,T,NKV,HS); lse
// (B,NH,T) f32; query head h reads kv head h / (NH/NKV). A block has 4 warps; each warp owns 16
// rows of its block's 64-row tile and multiplies with nvcuda::wmma (16x16x16 bf16 fragments, f32
// accumulation); the softmax runs in f32 on the scores staged in shared memory, lane l holding row
// l/2 and every second column from l%2. Like flash-attention, the probabilities (and in the
// backward dS) are rounded to bf16 before they are multiplied with V (dO, Q, K); everything else
// accumulates in f32, and outputs are rounded to nearest even once.
//
//   forward   one block per (query tile, b*NH + h), over the key tiles up to the diagonal:
//             S = Q K^T, m and l updated online, O = O * exp(m_old - m) + P V; lse = m + log l.
//   dk, dv    one block per (key tile, b*NKV + g), over the group's query heads in order and the
//             query tiles from the diagonal on: S^T = K Q^T, dP^T = V dO^T, P = exp(S - lse),
//             dS = P (dP - D), dV += P^T dO, dK += dS^T Q (scaled at the end).
//   dq        one block per (query tile, b*NH + h), over the key tiles up to the diagonal: the same
//             P and dS, dQ += dS K.
// dq is its own pass so that no two blocks add into one output: no atomics, every sum in an order
// fixed by the shape (a run repeats bit for bit).
#include <mma.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "loom/kernels/cuda/common.cuh"
#include "loom/kernels/cuda/flash_attention.h"
#include "loom/kernels/cuda/flash_mma.cuh"

namespace loom::kernels::cuda {
namespace {

using namespace nvcuda;
using bf = __nv_bfloat16;

constexpr int kTile = 64;  // rows of a block's tile and of every inner tile
constexpr int kWarps = 4;  // each warp owns 16 rows
constexpr int kFlashThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Shared-memory strides, padded against bank conflicts; every fragment's first element stays
// 32-byte aligned (wmma's requirement): a bf16 tile row is D + 8 elements, a warp's f32 scratch
// row max(64, D) + 4, a warp's bf16 probability row 64 + 8.
template <int D>
struct Ld {
  static constexpr int tile = D + 8;
  static constexpr int scratch = (D > kTile ? D : kTile) + 4;
  static constexpr int prob = kTile + 8;
  static constexpr size_t tile_bytes = size_t(kTile) * tile * 2;
  static constexpr size_t scratch_bytes = size_t(kWarps) * 16 * scratch * 4;
  static constexpr size_t prob_bytes = size_t(kWarps) * 16 * prob * 2;
  static_assert(tile_bytes % 128 == 0 && scratch_bytes % 128 == 0 && prob_bytes % 128 == 0);
};

struct Args {
  const bf* q;
  const bf* k;
  const bf* v;
  const bf* dout;
  const float* lse_in;
  const float* D;
  bf* o;
  float* lse;
  bf* dq;
  bf* dk;
  bf* dv;
  int64_t T, NH, NKV;
  float scale;
};

// Rows [row0, row0 + 64) of one head (src: its row 0; rows ld_src apart) into a tile; rows at or
// past T are zeros.
template <int D>
__device__ __forceinline__ void load_tile(bf* dst, const bf* src, int64_t row0, int64_t T,
                                          int64_t ld_src) {
  constexpr int kVec = D / 8;  // 16-byte pieces per row
  for (int i = threadIdx.x; i < kTile * kVec; i += kFlashThreads) {
    const int r = i / kVec, c = (i % kVec) * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row0 + r < T) val = *reinterpret_cast<const uint4*>(src + (row0 + r) * ld_src + c);
    *reinterpret_cast<uint4*>(dst + r * Ld<D>::tile + c) = val;
  }
}

// C (16 x 16n) = A (16 x 16k, row-major at a) times B, B read as the transpose of the rows at b
// (col_major: element (kk, n) at b[n * ldb + kk]), stored to c (row-major, ldc).
template <int K, int N>
__device__ __forceinline__ void mul_bt(const bf* a, int lda, const bf* b, int ldb, float* c,
                                       int ldc) {
  FragC acc[N / 16];
#pragma unroll
  for (int n = 0; n < N / 16; ++n) wmma::fill_fragment(acc[n], 0.f);
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + kk * 16, lda);
#pragma unroll
    for (int n = 0; n < N / 16; ++n) {
      FragBCol fb;
      wmma::load_matrix_sync(fb, b + n * 16 * ldb + kk * 16, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
#pragma unroll
  for (int n = 0; n < N / 16; ++n)
    wmma::store_matrix_sync(c + n * 16, acc[n], ldc, wmma::mem_row_major);
}

// acc (16 x 16n) += A (16 x 64, row-major at a) times B (64 x 16n, row-major at b).
template <int N>
__device__ __forceinline__ void mul_add(const bf* a, int lda, const bf* b, int ldb,
                                        FragC (&acc)[N / 16]) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + kk * 16, lda);
#pragma unroll
    for (int n = 0; n < N / 16; ++n) {
      FragBRow fb;
      wmma::load_matrix_sync(fb, b + kk * 16 * ldb + n * 16, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// A warp's 16 x D f32 accumulators times `scale`, rounded to bf16 into rows row0 + [0,16) of one
// head of dst (rows ld_dst apart, rows at or past T skipped), through the warp's scratch.
template <int D>
__device__ __forceinline__ void store_rows(FragC (&acc)[D / 16], float* scratch, bf* dst,
                                           int64_t row0, int64_t T, int64_t ld_dst, float scale) {
  constexpr int ld = Ld<D>::scratch;
#pragma unroll
  for (int n = 0; n < D / 16; ++n)
    wmma::store_matrix_sync(scratch + n * 16, acc[n], ld, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % 32;
  for (int i = lane; i < 16 * D; i += 32) {
    const int r = i / D, c = i % D;
    if (row0 + r < T)
      dst[(row0 + r) * ld_dst + c] = __float2bfloat16_rn(scale * scratch[r * ld + c]);
  }
  __syncwarp();
}

template <int D>
__global__ void __launch_bounds__(kFlashThreads) flash_fwd_kernel(Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  using L = Ld<D>;
  bf* qs = reinterpret_cast<bf*>(smem);
  bf* ks = reinterpret_cast<bf*>(smem + L::tile_bytes);
  bf* vs = reinterpret_cast<bf*>(smem + 2 * L::tile_bytes);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* ss = reinterpret_cast<float*>(smem + 3 * L::tile_bytes) + w * 16 * L::scratch;
  bf* ps = reinterpret_cast<bf*>(smem + 3 * L::tile_bytes + L::scratch_bytes) + w * 16 * L::prob;

  const int64_t tiles = (a.T + kTile - 1) / kTile;
  const int64_t q0 = (tiles - 1 - blockIdx.x) * kTile;  // the longest rows first
  const int64_t bh = blockIdx.y, b = bh / a.NH, h = bh % a.NH, g = h / (a.NH / a.NKV);
  const int64_t ldq = a.NH * D, ldk = a.NKV * D;
  const bf* kb = a.k + (b * a.T * a.NKV + g) * D;
  const bf* vb = a.v + (b * a.T * a.NKV + g) * D;
  load_tile<D>(qs, a.q + (b * a.T * a.NH + h) * D, q0, a.T, ldq);

  const int r = lane / 2, half = lane % 2;  // this lane's row of the warp's 16, its columns' parity
  const int64_t t = q0 + w * 16 + r;
  const float sl2 = a.scale * kLog2e;  // scores in log2 units
  float m = -INFINITY, l = 0.f;
  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;

  for (int64_t k0 = 0; k0 <= q0; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous K and V
    load_tile<D>(ks, kb, k0, a.T, ldk);
    load_tile<D>(vs, vb, k0, a.T, ldk);
    __syncthreads();
    mul_bt<D, kTile>(qs + w * 16 * L::tile, L::tile, ks, L::tile, ss, L::scratch);
    __syncwarp();
    // online softmax of row r: every key k0 <= j <= t (and j < T; key k0 always is)
    float x[kTile / 2];
    float mx = m;
#pragma unroll
    for (int i = 0; i < kTile / 2; ++i) {
      const int c = half + 2 * i;
      const int64_t j = k0 + c;
      x[i] = (j <= t && j < a.T) ? ss[r * L::scratch + c] * sl2 : -INFINITY;
      mx = fmaxf(mx, x[i]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float alpha = exp2f(m - mx);
    float rs = 0.f;
#pragma unroll
    for (int i = 0; i < kTile / 2; ++i) {
      const bf p = __float2bfloat16_rn(exp2f(x[i] - mx));
      rs += __bfloat162float(p);
      ps[r * L::prob + half + 2 * i] = p;
    }
    rs += __shfl_xor_sync(0xffffffffu, rs, 1);
    l = l * alpha + rs;
    m = mx;
    __syncwarp();
    FragC pv[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(pv[n], 0.f);
    mul_add<D>(ps, L::prob, vs, L::tile, pv);
#pragma unroll
    for (int n = 0; n < D / 16; ++n)
      wmma::store_matrix_sync(ss + n * 16, pv[n], L::scratch, wmma::mem_row_major);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = o[i] * alpha + ss[r * L::scratch + half + 2 * i];
    __syncwarp();
  }
  if (t < a.T) {
    const float inv = 1.f / l;
    bf* orow = a.o + ((b * a.T + t) * a.NH + h) * D;
#pragma unroll
    for (int i = 0; i < D / 2; ++i) orow[half + 2 * i] = __float2bfloat16_rn(o[i] * inv);
    if (half == 0) a.lse[bh * a.T + t] = (m + log2f(l)) / kLog2e;
  }
}

template <int D>
__global__ void __launch_bounds__(kFlashThreads) flash_dkv_kernel(Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  using L = Ld<D>;
  bf* ks = reinterpret_cast<bf*>(smem);
  bf* vs = reinterpret_cast<bf*>(smem + L::tile_bytes);
  bf* qs = reinterpret_cast<bf*>(smem + 2 * L::tile_bytes);
  bf* dos = reinterpret_cast<bf*>(smem + 3 * L::tile_bytes);
  unsigned char* rest = smem + 4 * L::tile_bytes;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* ss = reinterpret_cast<float*>(rest) + w * 16 * L::scratch;
  float* dps = reinterpret_cast<float*>(rest + L::scratch_bytes) + w * 16 * L::scratch;
  bf* ps = reinterpret_cast<bf*>(rest + 2 * L::scratch_bytes) + w * 16 * L::prob;
  bf* dss = reinterpret_cast<bf*>(rest + 2 * L::scratch_bytes + L::prob_bytes) + w * 16 * L::prob;
  float* lse_s = reinterpret_cast<float*>(rest + 2 * L::scratch_bytes + 2 * L::prob_bytes);
  float* d_s = lse_s + kTile;

  const int64_t k0 = int64_t(blockIdx.x) * kTile;
  const int64_t bg = blockIdx.y, b = bg / a.NKV, g = bg % a.NKV, G = a.NH / a.NKV;
  const int64_t ldq = a.NH * D, ldk = a.NKV * D;
  load_tile<D>(ks, a.k + (b * a.T * a.NKV + g) * D, k0, a.T, ldk);
  load_tile<D>(vs, a.v + (b * a.T * a.NKV + g) * D, k0, a.T, ldk);

  const int r = lane / 2, half = lane % 2;  // this lane's key of the warp's 16, its columns' parity
  const int64_t j = k0 + w * 16 + r;
  const float sl2 = a.scale * kLog2e;
  FragC dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.f);
    wmma::fill_fragment(dv[n], 0.f);
  }
  for (int64_t h = g * G; h < (g + 1) * G; ++h) {
    const bf* qh = a.q + (b * a.T * a.NH + h) * D;
    const bf* doh = a.dout + (b * a.T * a.NH + h) * D;
    const float* lse_h = a.lse_in + (b * a.NH + h) * a.T;
    const float* D_h = a.D + (b * a.NH + h) * a.T;
    for (int64_t q0 = k0; q0 < a.T; q0 += kTile) {
      __syncthreads();  // every warp is done with the previous Q, dO, lse and D
      load_tile<D>(qs, qh, q0, a.T, ldq);
      load_tile<D>(dos, doh, q0, a.T, ldq);
      for (int i = threadIdx.x; i < kTile; i += kFlashThreads) {
        const bool in = q0 + i < a.T;
        lse_s[i] = in ? lse_h[q0 + i] * kLog2e : 0.f;
        d_s[i] = in ? D_h[q0 + i] : 0.f;
      }
      __syncthreads();
      // S^T (keys x queries) = K Q^T, dP^T = V dO^T
      mul_bt<D, kTile>(ks + w * 16 * L::tile, L::tile, qs, L::tile, ss, L::scratch);
      mul_bt<D, kTile>(vs + w * 16 * L::tile, L::tile, dos, L::tile, dps, L::scratch);
      __syncwarp();
#pragma unroll 8
      for (int i = 0; i < kTile / 2; ++i) {
        const int c = half + 2 * i;
        const int64_t t = q0 + c;
        float p = 0.f, ds = 0.f;
        if (t >= j && t < a.T && j < a.T) {
          p = exp2f(ss[r * L::scratch + c] * sl2 - lse_s[c]);
          ds = p * (dps[r * L::scratch + c] - d_s[c]);
        }
        ps[r * L::prob + c] = __float2bfloat16_rn(p);
        dss[r * L::prob + c] = __float2bfloat16_rn(ds);
      }
      __syncwarp();
      mul_add<D>(ps, L::prob, dos, L::tile, dv);  // dV += P^T dO
      mul_add<D>(dss, L::prob, qs, L::tile, dk);  // dK += dS^T Q
    }
  }
  const int64_t row0 = k0 + w * 16;
  store_rows<D>(dk, ss, a.dk + (b * a.T * a.NKV + g) * D, row0, a.T, ldk, a.scale);
  store_rows<D>(dv, ss, a.dv + (b * a.T * a.NKV + g) * D, row0, a.T, ldk, 1.f);
}

template <int D>
__global__ void __launch_bounds__(kFlashThreads) flash_dq_kernel(Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  using L = Ld<D>;
  bf* qs = reinterpret_cast<bf*>(smem);
  bf* dos = reinterpret_cast<bf*>(smem + L::tile_bytes);
  bf* ks = reinterpret_cast<bf*>(smem + 2 * L::tile_bytes);
  bf* vs = reinterpret_cast<bf*>(smem + 3 * L::tile_bytes);
  unsigned char* rest = smem + 4 * L::tile_bytes;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* ss = reinterpret_cast<float*>(rest) + w * 16 * L::scratch;
  float* dps = reinterpret_cast<float*>(rest + L::scratch_bytes) + w * 16 * L::scratch;
  bf* dss = reinterpret_cast<bf*>(rest + 2 * L::scratch_bytes) + w * 16 * L::prob;

  const int64_t tiles = (a.T + kTile - 1) / kTile;
  const int64_t q0 = (tiles - 1 - blockIdx.x) * kTile;  // the longest rows first
  const int64_t bh = blockIdx.y, b = bh / a.NH, h = bh % a.NH, g = h / (a.NH / a.NKV);
  const int64_t ldq = a.NH * D, ldk = a.NKV * D;
  const bf* kb = a.k + (b * a.T * a.NKV + g) * D;
  const bf* vb = a.v + (b * a.T * a.NKV + g) * D;
  load_tile<D>(qs, a.q + (b * a.T * a.NH + h) * D, q0, a.T, ldq);
  load_tile<D>(dos, a.dout + (b * a.T * a.NH + h) * D, q0, a.T, ldq);

  const int r = lane / 2, half = lane % 2;
  const int64_t t = q0 + w * 16 + r;
  const float sl2 = a.scale * kLog2e;
  const float lse_t = t < a.T ? a.lse_in[bh * a.T + t] * kLog2e : 0.f;
  const float D_t = t < a.T ? a.D[bh * a.T + t] : 0.f;
  FragC dq[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq[n], 0.f);
  for (int64_t k0 = 0; k0 <= q0; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous K and V
    load_tile<D>(ks, kb, k0, a.T, ldk);
    load_tile<D>(vs, vb, k0, a.T, ldk);
    __syncthreads();
    mul_bt<D, kTile>(qs + w * 16 * L::tile, L::tile, ks, L::tile, ss, L::scratch);    // S
    mul_bt<D, kTile>(dos + w * 16 * L::tile, L::tile, vs, L::tile, dps, L::scratch);  // dP
    __syncwarp();
#pragma unroll 8
    for (int i = 0; i < kTile / 2; ++i) {
      const int c = half + 2 * i;
      const int64_t j = k0 + c;
      float ds = 0.f;
      if (j <= t && j < a.T && t < a.T) {
        const float p = exp2f(ss[r * L::scratch + c] * sl2 - lse_t);
        ds = p * (dps[r * L::scratch + c] - D_t);
      }
      dss[r * L::prob + c] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    mul_add<D>(dss, L::prob, ks, L::tile, dq);  // dQ += dS K
  }
  store_rows<D>(dq, ss, a.dq + (b * a.T * a.NH + h) * D, q0 + w * 16, a.T, ldq, a.scale);
}

// ---- the register-level kernels (flash_mma.cuh): lane 4 grp + qd holds rows grp and grp + 8 of
// its warp's 16, columns 2 qd, 2 qd + 1 of every 8 ----

template <int D>
__global__ void __launch_bounds__(kFlashThreads) mma_fwd_kernel(Args a) {
  using namespace flash_mma;
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = Ld<D>::tile;
  bf* qs = reinterpret_cast<bf*>(smem);
  bf* ks = qs + kTile * ld;
  bf* vs = ks + kTile * ld;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane >> 2, qd = lane & 3;
  const int64_t tiles = (a.T + kTile - 1) / kTile;
  const int64_t q0 = (tiles - 1 - blockIdx.x) * kTile;  // the longest rows first
  const int64_t bh = blockIdx.y, b = bh / a.NH, h = bh % a.NH, g = h / (a.NH / a.NKV);
  const int64_t ldq = a.NH * D, ldk = a.NKV * D;
  const bf* kb = a.k + (b * a.T * a.NKV + g) * D;
  const bf* vb = a.v + (b * a.T * a.NKV + g) * D;
  load_tile<D>(qs, a.q + (b * a.T * a.NH + h) * D, q0, a.T, ldq);
  __syncthreads();
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) load_a(qa[kc], qs, ld, w * 16, kc * 16);

  const int64_t t0 = q0 + w * 16 + grp, t1 = t0 + 8;  // this lane's two rows
  const float sl2 = a.scale * kLog2e;                 // scores in log2 units
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  for (int64_t k0 = 0; k0 <= q0; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous K and V
    load_tile<D>(ks, kb, k0, a.T, ldk);
    load_tile<D>(vs, vb, k0, a.T, ldk);
    __syncthreads();
    float s[kTile / 8][4];
#pragma unroll
    for (int j = 0; j < kTile / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc)
#pragma unroll
      for (int j = 0; j < kTile / 8; ++j) {
        uint32_t b0, b1;
        load_bt(b0, b1, ks, ld, j * 8, kc * 16);
        mma(s[j], qa[kc], b0, b1);
      }
    // online softmax: keys k0 <= col <= t (and col < T; key k0 always is)
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int j = 0; j < kTile / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t col = k0 + j * 8 + 2 * qd + (e & 1), t = e < 2 ? t0 : t1;
        const float x = (col <= t && col < a.T) ? s[j][e] * sl2 : -INFINITY;
        s[j][e] = x;
        if (e < 2)
          mx0 = fmaxf(mx0, x);
        else
          mx1 = fmaxf(mx1, x);
      }
    mx0 = quad_max(mx0);
    mx1 = quad_max(mx1);
    const float al0 = exp2f(m0 - mx0), al1 = exp2f(m1 - mx1);
    float rs0 = 0.f, rs1 = 0.f;
    uint32_t pa[kTile / 16][4];
#pragma unroll
    for (int j = 0; j < kTile / 8; ++j) {
      const uint32_t top = pack(exp2f(s[j][0] - mx0), exp2f(s[j][1] - mx0));
      const uint32_t bot = pack(exp2f(s[j][2] - mx1), exp2f(s[j][3] - mx1));
      rs0 += lo_f32(top) + hi_f32(top);  // the rounded probabilities, as multiplied
      rs1 += lo_f32(bot) + hi_f32(bot);
      pa[j / 2][(j % 2) * 2] = top;
      pa[j / 2][(j % 2) * 2 + 1] = bot;
    }
    l0 = l0 * al0 + quad_sum(rs0);
    l1 = l1 * al1 + quad_sum(rs1);
    m0 = mx0;
    m1 = mx1;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= al0;
      o[n][1] *= al0;
      o[n][2] *= al1;
      o[n][3] *= al1;
    }
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk)
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        uint32_t b0, b1;
        load_b(b0, b1, vs, ld, kk * 16, n * 8);
        mma(o[n], pa[kk], b0, b1);
      }
  }
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    o[n][0] *= inv0;
    o[n][1] *= inv0;
    o[n][2] *= inv1;
    o[n][3] *= inv1;
  }
  const int64_t row0 = q0 + w * 16;
  store_c<D / 8>(o, a.o + ((b * a.T + row0) * a.NH + h) * D, ldq, a.T - row0, 1.f);
  if (qd == 0) {
    if (t0 < a.T) a.lse[bh * a.T + t0] = (m0 + log2f(l0)) / kLog2e;
    if (t1 < a.T) a.lse[bh * a.T + t1] = (m1 + log2f(l1)) / kLog2e;
  }
}

template <int D>
__global__ void __launch_bounds__(kFlashThreads) mma_dq_kernel(Args a) {
  using namespace flash_mma;
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = Ld<D>::tile;
  bf* qs = reinterpret_cast<bf*>(smem);
  bf* dos = qs + kTile * ld;
  bf* ks = dos + kTile * ld;
  bf* vs = ks + kTile * ld;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane >> 2, qd = lane & 3;
  const int64_t tiles = (a.T + kTile - 1) / kTile;
  const int64_t q0 = (tiles - 1 - blockIdx.x) * kTile;  // the longest rows first
  const int64_t bh = blockIdx.y, b = bh / a.NH, h = bh % a.NH, g = h / (a.NH / a.NKV);
  const int64_t ldq = a.NH * D, ldk = a.NKV * D;
  const bf* kb = a.k + (b * a.T * a.NKV + g) * D;
  const bf* vb = a.v + (b * a.T * a.NKV + g) * D;
  load_tile<D>(qs, a.q + (b * a.T * a.NH + h) * D, q0, a.T, ldq);
  load_tile<D>(dos, a.dout + (b * a.T * a.NH + h) * D, q0, a.T, ldq);
  __syncthreads();
  uint32_t qa[D / 16][4], da[D / 16][4];
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    load_a(qa[kc], qs, ld, w * 16, kc * 16);
    load_a(da[kc], dos, ld, w * 16, kc * 16);
  }
  const int64_t t0 = q0 + w * 16 + grp, t1 = t0 + 8;
  const float sl2 = a.scale * kLog2e;
  const float lse0 = t0 < a.T ? a.lse_in[bh * a.T + t0] * kLog2e : 0.f;
  const float lse1 = t1 < a.T ? a.lse_in[bh * a.T + t1] * kLog2e : 0.f;
  const float D0 = t0 < a.T ? a.D[bh * a.T + t0] : 0.f;
  const float D1 = t1 < a.T ? a.D[bh * a.T + t1] : 0.f;
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
  for (int64_t k0 = 0; k0 <= q0; k0 += kTile) {
    __syncthreads();  // every warp is done with the previous K and V
    load_tile<D>(ks, kb, k0, a.T, ldk);
    load_tile<D>(vs, vb, k0, a.T, ldk);
    __syncthreads();
    float s[kTile / 8][4], dp[kTile / 8][4];
#pragma unroll
    for (int j = 0; j < kTile / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc)
#pragma unroll
      for (int j = 0; j < kTile / 8; ++j) {
        uint32_t b0, b1;
        load_bt(b0, b1, ks, ld, j * 8, kc * 16);  // S = Q K^T
        mma(s[j], qa[kc], b0, b1);
        load_bt(b0, b1, vs, ld, j * 8, kc * 16);  // dP = dO V^T
        mma(dp[j], da[kc], b0, b1);
      }
    uint32_t dsa[kTile / 16][4];
#pragma unroll
    for (int j = 0; j < kTile / 8; ++j) {
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t col = k0 + j * 8 + 2 * qd + (e & 1), t = e < 2 ? t0 : t1;
        ds[e] = 0.f;
        if (col <= t && col < a.T && t < a.T) {
          const float p = exp2f(s[j][e] * sl2 - (e < 2 ? lse0 : lse1));
          ds[e] = p * (dp[j][e] - (e < 2 ? D0 : D1));
        }
      }
      dsa[j / 2][(j % 2) * 2] = pack(ds[0], ds[1]);
      dsa[j / 2][(j % 2) * 2 + 1] = pack(ds[2], ds[3]);
    }
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk)
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        uint32_t b0, b1;
        load_b(b0, b1, ks, ld, kk * 16, n * 8);  // dQ += dS K
        mma(dq[n], dsa[kk], b0, b1);
      }
  }
  const int64_t row0 = q0 + w * 16;
  store_c<D / 8>(dq, a.dq + ((b * a.T + row0) * a.NH + h) * D, ldq, a.T - row0, a.scale);
}

template <int D>
__global__ void __launch_bounds__(kFlashThreads) mma_dkv_kernel(Args a) {
  using namespace flash_mma;
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = Ld<D>::tile;
  bf* ks = reinterpret_cast<bf*>(smem);
  bf* vs = ks + kTile * ld;
  bf* qs = vs + kTile * ld;
  bf* dos = qs + kTile * ld;
  float* lse_s = reinterpret_cast<float*>(dos + kTile * ld);
  float* d_s = lse_s + kTile;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane >> 2, qd = lane & 3;
  const int64_t k0 = int64_t(blockIdx.x) * kTile;
  const int64_t bg = blockIdx.y, b = bg / a.NKV, g = bg % a.NKV, G = a.NH / a.NKV;
  const int64_t ldq = a.NH * D, ldk = a.NKV * D;
  load_tile<D>(ks, a.k + (b * a.T * a.NKV + g) * D, k0, a.T, ldk);
  load_tile<D>(vs, a.v + (b * a.T * a.NKV + g) * D, k0, a.T, ldk);
  const int64_t j0 = k0 + w * 16 + grp, j1 = j0 + 8;  // this lane's two keys
  const float sl2 = a.scale * kLog2e;
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;
  for (int64_t h = g * G; h < (g + 1) * G; ++h) {
    const bf* qh = a.q + (b * a.T * a.NH + h) * D;
    const bf* doh = a.dout + (b * a.T * a.NH + h) * D;
    const float* lse_h = a.lse_in + (b * a.NH + h) * a.T;
    const float* D_h = a.D + (b * a.NH + h) * a.T;
    for (int64_t q0 = k0; q0 < a.T; q0 += kTile) {
      __syncthreads();  // every warp is done with the previous Q, dO, lse and D
      load_tile<D>(qs, qh, q0, a.T, ldq);
      load_tile<D>(dos, doh, q0, a.T, ldq);
      for (int i = threadIdx.x; i < kTile; i += kFlashThreads) {
        const bool in = q0 + i < a.T;
        lse_s[i] = in ? lse_h[q0 + i] * kLog2e : 0.f;
        d_s[i] = in ? D_h[q0 + i] : 0.f;
      }
      __syncthreads();
      // S^T (keys x queries) = K Q^T, dP^T = V dO^T
      float st[kTile / 8][4], dpt[kTile / 8][4];
#pragma unroll
      for (int j = 0; j < kTile / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] = dpt[j][e] = 0.f;
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) {
        uint32_t ka[4], va[4];
        load_a(ka, ks, ld, w * 16, kc * 16);
        load_a(va, vs, ld, w * 16, kc * 16);
#pragma unroll
        for (int j = 0; j < kTile / 8; ++j) {
          uint32_t b0, b1;
          load_bt(b0, b1, qs, ld, j * 8, kc * 16);
          mma(st[j], ka, b0, b1);
          load_bt(b0, b1, dos, ld, j * 8, kc * 16);
          mma(dpt[j], va, b0, b1);
        }
      }
      uint32_t pa[kTile / 16][4], dsa[kTile / 16][4];
#pragma unroll
      for (int j = 0; j < kTile / 8; ++j) {
        float p[4], ds[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = j * 8 + 2 * qd + (e & 1);
          const int64_t t = q0 + c, key = e < 2 ? j0 : j1;
          p[e] = ds[e] = 0.f;
          if (t >= key && t < a.T && key < a.T) {
            p[e] = exp2f(st[j][e] * sl2 - lse_s[c]);
            ds[e] = p[e] * (dpt[j][e] - d_s[c]);
          }
        }
        pa[j / 2][(j % 2) * 2] = pack(p[0], p[1]);
        pa[j / 2][(j % 2) * 2 + 1] = pack(p[2], p[3]);
        dsa[j / 2][(j % 2) * 2] = pack(ds[0], ds[1]);
        dsa[j / 2][(j % 2) * 2 + 1] = pack(ds[2], ds[3]);
      }
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk)
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          uint32_t b0, b1;
          load_b(b0, b1, dos, ld, kk * 16, n * 8);  // dV += P^T dO
          mma(dv[n], pa[kk], b0, b1);
          load_b(b0, b1, qs, ld, kk * 16, n * 8);  // dK += dS^T Q
          mma(dk[n], dsa[kk], b0, b1);
        }
    }
  }
  const int64_t row0 = k0 + w * 16;
  bf* dkb = a.dk + ((b * a.T + row0) * a.NKV + g) * D;
  bf* dvb = a.dv + ((b * a.T + row0) * a.NKV + g) * D;
  store_c<D / 8>(dk, dkb, ldk, a.T - row0, a.scale);
  store_c<D / 8>(dv, dvb, ldk, a.T - row0, 1.f);
}

template <int D>
constexpr size_t fwd_smem() {
  return 3 * Ld<D>::tile_bytes + Ld<D>::scratch_bytes + Ld<D>::prob_bytes;
}
template <int D>
constexpr size_t bwd_smem() {
  return 4 * Ld<D>::tile_bytes + 2 * Ld<D>::scratch_bytes + 2 * Ld<D>::prob_bytes +
         2 * kTile * sizeof(float);
}

// Dynamic shared memory beyond 48 KB is opted into once per kernel, at its first launch (a step's
// first run, before a CUDA graph captures any).
template <auto Kernel>
void launch(size_t smem, dim3 grid, CUstream_st* s, const Args& a, const char* name) {
  static const bool opted = [&] {
    check(int(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem))),
          name);
    return true;
  }();
  (void)opted;
  Kernel<<<grid, kFlashThreads, smem, s>>>(a);
  check_launch(name);
}

// Which kernels run: mma.sync (the default), wmma (LOOM_CUDA_ATTENTION=wmma), or none (=row:
// attention.cu's row kernels).
enum class Kind { mma, wmma, row };
Kind kind() {
  static const Kind k = [] {
    const char* v = std::getenv("LOOM_CUDA_ATTENTION");
    if (v != nullptr && std::strcmp(v, "row") == 0) return Kind::row;
    if (v != nullptr && std::strcmp(v, "wmma") == 0) return Kind::wmma;
    return Kind::mma;
  }();
  return k;
}

template <int D>
void fwd(const Args& a, int64_t B, CUstream_st* s) {
  const dim3 grid(unsigned((a.T + kTile - 1) / kTile), unsigned(B * a.NH));
  if (kind() == Kind::wmma)
    launch<flash_fwd_kernel<D>>(fwd_smem<D>(), grid, s, a, "flash_attention_fwd (wmma)");
  else
    launch<mma_fwd_kernel<D>>(3 * Ld<D>::tile_bytes, grid, s, a, "flash_attention_fwd");
}

template <int D>
void bwd(const Args& a, int64_t B, CUstream_st* s) {
  const unsigned tiles = unsigned((a.T + kTile - 1) / kTile);
  const dim3 kv(tiles, unsigned(B * a.NKV)), qgrid(tiles, unsigned(B * a.NH));
  if (kind() == Kind::wmma) {
    launch<flash_dkv_kernel<D>>(bwd_smem<D>(), kv, s, a, "flash_attention_dkv (wmma)");
    launch<flash_dq_kernel<D>>(bwd_smem<D>(), qgrid, s, a, "flash_attention_dq (wmma)");
  } else {
    launch<mma_dkv_kernel<D>>(4 * Ld<D>::tile_bytes + 2 * kTile * sizeof(float), kv, s, a,
                              "flash_attention_dkv");
    launch<mma_dq_kernel<D>>(4 * Ld<D>::tile_bytes, qgrid, s, a, "flash_attention_dq");
  }
}

}  // namespace

bool flash_attention_fits(int64_t B, int64_t NH, int64_t HS, const void* const* ptrs, int n) {
  if (kind() == Kind::row) return false;
  if (HS != 32 && HS != 64 && HS != 128) return false;
  if (B * NH > 65535) return false;
  for (int i = 0; i < n; ++i)
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) return false;
  return true;
}

void flash_attention_fwd(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                         int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, float scale,
                         CUstream_st* s) {
  Args a{};
  a.q = reinterpret_cast<const bf*>(q);
  a.k = reinterpret_cast<const bf*>(k);
  a.v = reinterpret_cast<const bf*>(v);
  a.o = reinterpret_cast<bf*>(o);
  a.lse = lse;
  a.T = T;
  a.NH = NH;
  a.NKV = NKV;
  a.scale = scale;
  if (HS == 32)
    fwd<32>(a, B, s);
  else if (HS == 64)
    fwd<64>(a, B, s);
  else
    fwd<128>(a, B, s);
}

void flash_attention_bwd(const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                         const float* lse, const float* D, bf16* dq, bf16* dk, bf16* dv, int64_t B,
                         int64_t T, int64_t NH, int64_t NKV, int64_t HS, float scale,
                         CUstream_st* s) {
  Args a{};
  a.q = reinterpret_cast<const bf*>(q);
  a.k = reinterpret_cast<const bf*>(k);
  a.v = reinterpret_cast<const bf*>(v);
  a.dout = reinterpret_cast<const bf*>(dout);
  a.lse_in = lse;
  a.D = D;
  a.dq = reinterpret_cast<bf*>(dq);
  a.dk = reinterpret_cast<bf*>(dk);
  a.dv = reinterpret_cast<bf*>(dv);
  a.T = T;
  a.NH = NH;
  a.NKV = NKV;
  a.scale = scale;
  if (HS == 32)
    bwd<32>(a, B, s);
  else if (HS == 64)
    bwd<64>(a, B, s);
  else
    bwd<128>(a, B, s);
}

}  // namespace loom::kernels::cuda
