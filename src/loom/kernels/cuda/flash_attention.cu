// Causal grouped-query attention for bf16 on the tensor cores (flash_attention.h), after the
// flash-attention-2 algorithm (Dao 2023): tiles of 64 queries and 64 keys in shared memory, the
// scores of a tile never written to global memory, an online softmax in the forward and the
// scores made again from the saved log-sum-exp in the backward.
//
// Layouts as kernels.h's attention_fwd/attention_bwd: q, o (B,T,NH,HS); k, v (B,T,NKV,HS); lse
// (B,NH,T) f32; query head h reads kv head h / (NH/NKV). A block has 4 warps; each warp owns 16
// rows of its block's 64-row tile and multiplies with mma.sync m16n8k16 (flash_mma.cuh: bf16 in,
// f32 accumulators), the scores, probabilities and accumulators held in registers throughout;
// lane 4 grp + qd holds rows grp and grp + 8 of its warp's 16, columns 2 qd and 2 qd + 1 of every
// 8. Like flash-attention, the probabilities (and in the backward dS) are rounded to bf16 before
// they are multiplied with V (dO, Q, K); everything else accumulates in f32, and outputs are
// rounded to nearest even once. The tiles streamed through a block (K and V; in dk/dv Q and dO)
// are double-buffered: cp.async copies the next while the tensor cores work on the current.
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
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "loom/kernels/cuda/common.cuh"
#include "loom/kernels/cuda/flash_attention.h"
#include "loom/kernels/cuda/flash_mma.cuh"

namespace loom::kernels::cuda {
namespace {

using namespace flash_mma;

constexpr int kTile = 64;  // rows of a block's tile and of every inner tile
constexpr int kWarps = 4;  // each warp owns 16 rows
constexpr int kFlashThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

// A tile's rows are D + 8 elements apart in shared memory: 16-byte aligned rows whose fragment
// loads (flash_mma.cuh) hit 32 distinct banks.
template <int D>
struct Tile {
  static constexpr int ld = D + 8;
  static constexpr size_t bytes = size_t(kTile) * ld * 2;
  static_assert(bytes % 128 == 0);
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

// Rows [row0, row0 + 64) of one head (src: its row 0; rows ld_src apart) into a tile, by cp.async
// (16 bytes a copy; a row at or past T is zero-filled by a copy of no source bytes). The copies
// join the thread's current group: commit() closes it, wait<N>() waits until at most N groups
// are still in flight.
template <int D>
__device__ __forceinline__ void load_tile(bf* dst, const bf* src, int64_t row0, int64_t T,
                                          int64_t ld_src) {
  constexpr int kVec = D / 8;  // 16-byte pieces per row
  for (int i = threadIdx.x; i < kTile * kVec; i += kFlashThreads) {
    const int r = i / kVec, c = (i % kVec) * 8;
    const bool in = row0 + r < T;
    const bf* from = in ? src + (row0 + r) * ld_src + c : src;  // a valid address either way
    const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst + r * Tile<D>::ld + c));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from),
                 "r"(in ? 16 : 0));
  }
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Double buffering: queue(it + 1) copies iteration it + 1's tiles into the buffer no warp reads any
// more (the caller's barrier ended iteration it - 1), then this waits until iteration it's copies
// have landed; the caller's __syncthreads makes them every thread's.
template <class Queue>
__device__ __forceinline__ void prefetch(int64_t it, int64_t n, const Queue& queue) {
  if (it + 1 < n) {
    queue(it + 1);
    commit();
    wait<1>();
  } else {
    wait<0>();
  }
}

// The key tile at row k0 of one kv head (kb, vb: its row 0) into buffer `to`: K, then V.
template <int D>
__device__ __forceinline__ void load_kv(bf* to, const bf* kb, const bf* vb, int64_t k0, int64_t T,
                                        int64_t ldk) {
  load_tile<D>(to, kb, k0, T, ldk);
  load_tile<D>(to + kTile * Tile<D>::ld, vb, k0, T, ldk);
}

// The query tile of a forward or dq block: rows q0.. of query head h of sequence b (blockIdx.y =
// b NH + h), the longest rows first, reading kv head g.
template <int D>
struct QueryTile {
  int64_t q0, bh, b, h, ldq, ldk;
  const bf *kb, *vb;  // row 0 of kv head g
  __device__ explicit QueryTile(const Args& a) {
    const int64_t tiles = (a.T + kTile - 1) / kTile;
    q0 = (tiles - 1 - blockIdx.x) * kTile;
    bh = blockIdx.y;
    b = bh / a.NH;
    h = bh % a.NH;
    const int64_t g = h / (a.NH / a.NKV);
    ldq = a.NH * D;
    ldk = a.NKV * D;
    kb = a.k + (b * a.T * a.NKV + g) * D;
    vb = a.v + (b * a.T * a.NKV + g) * D;
  }
  // row 0 of this query head of a (B,T,NH,D) tensor (q, o, dO, dq)
  template <class T>
  __device__ T* head(T* x, const Args& a) const {
    return x + (b * a.T * a.NH + h) * D;
  }
};

template <int D>
__global__ void __launch_bounds__(kFlashThreads) mma_fwd_kernel(Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = Tile<D>::ld;
  bf* qs = reinterpret_cast<bf*>(smem);
  bf* kv_buf = qs + kTile * ld;  // [2][K, V]: the key tile in use and the next
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane >> 2, qd = lane & 3;
  const QueryTile<D> qt(a);
  load_tile<D>(qs, qt.head(a.q, a), qt.q0, a.T, qt.ldq);
  load_kv<D>(kv_buf, qt.kb, qt.vb, 0, a.T, qt.ldk);
  commit();
  uint32_t qa[D / 16][4];

  const int64_t t0 = qt.q0 + w * 16 + grp, t1 = t0 + 8;  // this lane's two rows
  const float sl2 = a.scale * kLog2e;                    // scores in log2 units
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  float o[D / 8][4];
  zero(o);

  const int64_t n_k = qt.q0 / kTile + 1;  // key tiles up to the diagonal
  for (int64_t it = 0; it < n_k; ++it) {
    const int64_t k0 = it * kTile;
    const bf* ks = kv_buf + (it & 1) * 2 * kTile * ld;
    const bf* vs = ks + kTile * ld;
    prefetch(it, n_k, [&](int64_t next) {  // into the other buffer
      load_kv<D>(kv_buf + (next & 1) * 2 * kTile * ld, qt.kb, qt.vb, k0 + kTile, a.T, qt.ldk);
    });
    __syncthreads();  // this tile (and Q) landed for every thread
    if (it == 0) {
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) load_a(qa[kc], qs, ld, w * 16, kc * 16);
    }
    float s[kTile / 8][4];
    zero(s);
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc)
#pragma unroll
      for (int j = 0; j < kTile / 8; ++j) mma_bt(s[j], qa[kc], ks, ld, j * 8, kc * 16);
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
      put_a(pa, j, top, bot);
    }
    l0 = l0 * al0 + quad_sum(rs0);
    l1 = l1 * al1 + quad_sum(rs1);
    m0 = mx0;
    m1 = mx1;
    scale_rows(o, al0, al1);
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk)
#pragma unroll
      for (int n = 0; n < D / 8; ++n) mma_b(o[n], pa[kk], vs, ld, kk * 16, n * 8);
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  scale_rows(o, 1.f / l0, 1.f / l1);
  const int64_t row0 = qt.q0 + w * 16;
  store_c<D / 8>(o, a.o + ((qt.b * a.T + row0) * a.NH + qt.h) * D, qt.ldq, a.T - row0, 1.f);
  if (qd == 0) {
    if (t0 < a.T) a.lse[qt.bh * a.T + t0] = (m0 + log2f(l0)) / kLog2e;
    if (t1 < a.T) a.lse[qt.bh * a.T + t1] = (m1 + log2f(l1)) / kLog2e;
  }
}

template <int D>
__global__ void __launch_bounds__(kFlashThreads) mma_dq_kernel(Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = Tile<D>::ld;
  bf* qs = reinterpret_cast<bf*>(smem);
  bf* dos = qs + kTile * ld;
  bf* kv_buf = dos + kTile * ld;  // [2][K, V]: the key tile in use and the next
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane >> 2, qd = lane & 3;
  const QueryTile<D> qt(a);
  load_tile<D>(qs, qt.head(a.q, a), qt.q0, a.T, qt.ldq);
  load_tile<D>(dos, qt.head(a.dout, a), qt.q0, a.T, qt.ldq);
  load_kv<D>(kv_buf, qt.kb, qt.vb, 0, a.T, qt.ldk);
  commit();
  uint32_t qa[D / 16][4], da[D / 16][4];
  const int64_t t0 = qt.q0 + w * 16 + grp, t1 = t0 + 8;
  const float sl2 = a.scale * kLog2e;
  const float lse0 = t0 < a.T ? a.lse_in[qt.bh * a.T + t0] * kLog2e : 0.f;
  const float lse1 = t1 < a.T ? a.lse_in[qt.bh * a.T + t1] * kLog2e : 0.f;
  const float D0 = t0 < a.T ? a.D[qt.bh * a.T + t0] : 0.f;
  const float D1 = t1 < a.T ? a.D[qt.bh * a.T + t1] : 0.f;
  float dq[D / 8][4];
  zero(dq);
  const int64_t n_k = qt.q0 / kTile + 1;  // key tiles up to the diagonal
  for (int64_t it = 0; it < n_k; ++it) {
    const int64_t k0 = it * kTile;
    const bf* ks = kv_buf + (it & 1) * 2 * kTile * ld;
    const bf* vs = ks + kTile * ld;
    prefetch(it, n_k, [&](int64_t next) {  // into the other buffer
      load_kv<D>(kv_buf + (next & 1) * 2 * kTile * ld, qt.kb, qt.vb, k0 + kTile, a.T, qt.ldk);
    });
    __syncthreads();  // this tile (and Q, dO) landed for every thread
    if (it == 0) {
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) {
        load_a(qa[kc], qs, ld, w * 16, kc * 16);
        load_a(da[kc], dos, ld, w * 16, kc * 16);
      }
    }
    float s[kTile / 8][4], dp[kTile / 8][4];
    zero(s);
    zero(dp);
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc)
#pragma unroll
      for (int j = 0; j < kTile / 8; ++j) {
        mma_bt(s[j], qa[kc], ks, ld, j * 8, kc * 16);   // S = Q K^T
        mma_bt(dp[j], da[kc], vs, ld, j * 8, kc * 16);  // dP = dO V^T
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
      put_a(dsa, j, pack(ds[0], ds[1]), pack(ds[2], ds[3]));
    }
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk)
#pragma unroll
      for (int n = 0; n < D / 8; ++n) mma_b(dq[n], dsa[kk], ks, ld, kk * 16, n * 8);  // dQ += dS K
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  const int64_t row0 = qt.q0 + w * 16;
  store_c<D / 8>(dq, a.dq + ((qt.b * a.T + row0) * a.NH + qt.h) * D, qt.ldq, a.T - row0, a.scale);
}

template <int D>
__global__ void __launch_bounds__(kFlashThreads) mma_dkv_kernel(Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int ld = Tile<D>::ld;
  bf* ks = reinterpret_cast<bf*>(smem);
  bf* vs = ks + kTile * ld;
  bf* qd_buf = vs + kTile * ld;  // [2][Q, dO]: the query tile in use and the next
  float* ld_buf = reinterpret_cast<float*>(qd_buf + 4 * kTile * ld);  // [2][lse, D]
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane >> 2, qd = lane & 3;
  const int64_t k0 = int64_t(blockIdx.x) * kTile;
  const int64_t bg = blockIdx.y, b = bg / a.NKV, g = bg % a.NKV, G = a.NH / a.NKV;
  const int64_t ldq = a.NH * D, ldk = a.NKV * D;
  const int64_t j0 = k0 + w * 16 + grp, j1 = j0 + 8;  // this lane's two keys
  const float sl2 = a.scale * kLog2e;
  // iteration it: query head g G + it / n_q, query tile k0 + (it % n_q) 64 (the diagonal on)
  const int64_t n_q = (a.T - k0 + kTile - 1) / kTile, n_it = G * n_q;
  auto fetch = [&](int64_t it) {  // Q, dO (cp.async) and lse, D of iteration it into its buffer
    const int64_t h = g * G + it / n_q, q0 = k0 + it % n_q * kTile;
    bf* qs = qd_buf + (it & 1) * 2 * kTile * ld;
    load_tile<D>(qs, a.q + (b * a.T * a.NH + h) * D, q0, a.T, ldq);
    load_tile<D>(qs + kTile * ld, a.dout + (b * a.T * a.NH + h) * D, q0, a.T, ldq);
    float* lse_s = ld_buf + (it & 1) * 2 * kTile;
    for (int i = threadIdx.x; i < kTile; i += kFlashThreads) {
      const bool in = q0 + i < a.T;
      lse_s[i] = in ? a.lse_in[(b * a.NH + h) * a.T + q0 + i] * kLog2e : 0.f;
      lse_s[kTile + i] = in ? a.D[(b * a.NH + h) * a.T + q0 + i] : 0.f;
    }
  };
  load_tile<D>(ks, a.k + (b * a.T * a.NKV + g) * D, k0, a.T, ldk);
  load_tile<D>(vs, a.v + (b * a.T * a.NKV + g) * D, k0, a.T, ldk);
  fetch(0);
  commit();
  float dk[D / 8][4], dv[D / 8][4];
  zero(dk);
  zero(dv);
  for (int64_t it = 0; it < n_it; ++it) {
    const int64_t q0 = k0 + it % n_q * kTile;
    const bf* qs = qd_buf + (it & 1) * 2 * kTile * ld;
    const bf* dos = qs + kTile * ld;
    const float* lse_s = ld_buf + (it & 1) * 2 * kTile;
    const float* d_s = lse_s + kTile;
    prefetch(it, n_it, fetch);
    __syncthreads();  // this iteration's tiles (and K, V) landed for every thread
    // S^T (keys x queries) = K Q^T, dP^T = V dO^T
    float st[kTile / 8][4], dpt[kTile / 8][4];
    zero(st);
    zero(dpt);
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
      uint32_t ka[4], va[4];
      load_a(ka, ks, ld, w * 16, kc * 16);
      load_a(va, vs, ld, w * 16, kc * 16);
#pragma unroll
      for (int j = 0; j < kTile / 8; ++j) {
        mma_bt(st[j], ka, qs, ld, j * 8, kc * 16);
        mma_bt(dpt[j], va, dos, ld, j * 8, kc * 16);
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
      put_a(pa, j, pack(p[0], p[1]), pack(p[2], p[3]));
      put_a(dsa, j, pack(ds[0], ds[1]), pack(ds[2], ds[3]));
    }
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk)
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        mma_b(dv[n], pa[kk], dos, ld, kk * 16, n * 8);  // dV += P^T dO
        mma_b(dk[n], dsa[kk], qs, ld, kk * 16, n * 8);  // dK += dS^T Q
      }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  const int64_t row0 = k0 + w * 16;
  bf* dkb = a.dk + ((b * a.T + row0) * a.NKV + g) * D;
  bf* dvb = a.dv + ((b * a.T + row0) * a.NKV + g) * D;
  store_c<D / 8>(dk, dkb, ldk, a.T - row0, a.scale);
  store_c<D / 8>(dv, dvb, ldk, a.T - row0, 1.f);
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

template <int D>
void fwd(const Args& a, int64_t B, CUstream_st* s) {
  const dim3 grid(unsigned((a.T + kTile - 1) / kTile), unsigned(B * a.NH));
  launch<mma_fwd_kernel<D>>(5 * Tile<D>::bytes, grid, s, a, "flash_attention_fwd");
}

template <int D>
void bwd(const Args& a, int64_t B, CUstream_st* s) {
  const unsigned tiles = unsigned((a.T + kTile - 1) / kTile);
  launch<mma_dkv_kernel<D>>(6 * Tile<D>::bytes + 4 * kTile * sizeof(float),
                            dim3(tiles, unsigned(B * a.NKV)), s, a, "flash_attention_dkv");
  launch<mma_dq_kernel<D>>(6 * Tile<D>::bytes, dim3(tiles, unsigned(B * a.NH)), s, a,
                           "flash_attention_dq");
}

}  // namespace

bool flash_attention_fits(int64_t B, int64_t NH, int64_t HS, const void* const* ptrs, int n) {
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
