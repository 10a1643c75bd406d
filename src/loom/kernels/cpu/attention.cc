// Fast causal grouped-query attention on CPU (see attention.h for the contract): flash-style blocks
// with an online softmax, AVX-512 micro-kernels (plain loops elsewhere), OpenMP over fixed work
// items.
//
// It does not store the (T,T) score matrix, take locks or atomics, or special-case shapes: any HS
// (padded to a multiple of 16 inside the scratch) and any T (the last block is partial) work.
// Invariant: every output element is produced by exactly one work item, whose arithmetic order is
// fixed by the shape alone, so results are bit-identical for any number of threads.
//
// Layout trick. Scores are computed transposed, S^T (Bc,Br): one row per key, the 16 lanes of a
// vector along queries. Then the softmax statistics (max, sum, lse, D) are per-lane vectors, the
// causal mask is a lane prefix, and every product is the one micro-kernel C (M,N) (+)= A (M,K) B
// (K,N) with A read by scalar broadcasts through arbitrary strides (so reading A transposed is
// free) and B read as rows of 16-float vectors:
//   fwd  S^T (Bc,Br)  = K_j (Bc,HS) . Q_i^T (HS,Br)
//        O_i (Br,HS)  = alpha * O_i + P (Br,Bc) . V_j (Bc,HS)      P read out of S^T's storage
//   bwd  S^T = K_j . Q_i^T,  dP^T (Bc,Br) = V_j . dO_i^T (HS,Br)
//        dV_j (Bc,HS) += P^T . dO_i,  dK_j += dS^T . Q_i,  dQ_i (Br,HS) += dS . K_j
// Only Q_i^T and dO_i^T need a real transpose (16x16 in registers), once per query block. f32
// inputs with HS % 16 == 0 are read in place; otherwise rows are converted to f32 scratch first.
//
// Worked example of the causal band, Br = Bc = 64, query block i0 = 64, key block j0 = 64
// (diagonal): key row m needs queries i >= m, so the S^T rows m..m+5 are computed from lane
// floor16(m) on, the softmax pass sets lanes i < m to -inf (P = 0), and P.V for query row i stops
// at key i. Off-diagonal blocks (j0 + Bc <= i0) are computed whole.
//
// Scores are kept in log2 units: Q^T is pre-multiplied by scale*log2(e), so P = exp2(S - m) forward
// and P = exp2(S - lse*log2(e)) backward; lse = (m + log2 l) * ln 2.
//
// Scratch per thread: a few (64,HSp) blocks, plus (T,HSp) f32 rows for k and v (forward: only when
// they are not f32 already) and for the dk and dv accumulators (backward).
//
// FLOPs per (b,h), with n = T(T+1)/2 causal pairs: forward 4*HS*n (S, P.V), backward 10*HS*n
// (S recomputed, dP, dV, dK, dQ); exps not counted.
#include "loom/kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>

#include "loom/core/error.h"
#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/vec16.h"

namespace loom::kernels::cpu {
namespace {

constexpr int64_t kBr = 64;                  // query rows per block (multiple of 16: lanes of S^T)
constexpr int64_t kBc = 64;                  // keys per block
constexpr int64_t kFree = int64_t(1) << 40;  // "no causal bound" for the band offsets below
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

using detail::from_f32;
using detail::to_f32;
using namespace vec16;

// ---- the one micro-kernel ----
// One tile of C (IR rows, NV*16 columns) over k in [k0,k1):
//   C(m,:) = init(m) + sum_k A(m,k) * B(k,:),   A(m,k) = a[m*sam + k*sak],  B(k,:) = b + k*ldb,
// init(m) = 0 (load_c false), C(m,:) (load_c, rs null) or rs[m] * C(m,:) (load_c, rs given).
// IR = 6, NV = 4 keeps 24 accumulators, 4 B vectors and a broadcast in the 32 zmm registers.
template <int IR, int NV>
inline void tile(float* c, int64_t ldc, const float* rs, bool load_c, const float* a, int64_t sam,
                 int64_t sak, const float* b, int64_t ldb, int64_t k0, int64_t k1) {
  V16 acc[IR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < IR; ++m) {
    const V16 s = vset1(rs ? rs[m] : 1.f);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      acc[m][v] = load_c ? vload(c + m * ldc + 16 * v) : vset1(0.f);
      if (load_c && rs) acc[m][v] = vmul(acc[m][v], s);
    }
  }
  for (int64_t k = k0; k < k1; ++k) {
    const float* bk = b + k * ldb;
    const float* ak = a + k * sak;
    V16 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = vload(bk + 16 * v);
#pragma GCC unroll 8
    for (int m = 0; m < IR; ++m) {
      const V16 am = vset1(ak[m * sam]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = vfma(am, bv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < IR; ++m) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) vstore(c + m * ldc + 16 * v, acc[m][v]);
  }
}

// The row group's tiles across columns [n0, N), 4 vectors at a time.
template <int IR>
void tile_row(float* c, int64_t ldc, const float* rs, bool load_c, const float* a, int64_t sam,
              int64_t sak, const float* b, int64_t ldb, int64_t n0, int64_t N, int64_t k0,
              int64_t k1) {
  for (int64_t n = n0; n < N; n += 64) {
    switch (std::min<int64_t>(4, (N - n) / 16)) {
      case 4:
        tile<IR, 4>(c + n, ldc, rs, load_c, a, sam, sak, b + n, ldb, k0, k1);
        break;
      case 3:
        tile<IR, 3>(c + n, ldc, rs, load_c, a, sam, sak, b + n, ldb, k0, k1);
        break;
      case 2:
        tile<IR, 2>(c + n, ldc, rs, load_c, a, sam, sak, b + n, ldb, k0, k1);
        break;
      default:
        tile<IR, 1>(c + n, ldc, rs, load_c, a, sam, sak, b + n, ldb, k0, k1);
        break;
    }
  }
}

// C (M,N) (+)= A (M,K) B (K,N) over a causal band, N a multiple of 16. Rows go in groups of 6 (the
// last ones in 4, 2, 1). For the group m..m+ir-1 the kernel runs over k in [m + klo, m + ir + khi)
// and columns [floor16(m + nlo), N), clamped to [0,K) and [0,N); kFree means unbounded. Entries
// outside the band are either never needed (their P is 0) or left stale for the caller's mask.
void band_mm(float* c, int64_t ldc, const float* rs, bool load_c, const float* a, int64_t sam,
             int64_t sak, const float* b, int64_t ldb, int64_t M, int64_t N, int64_t K, int64_t klo,
             int64_t khi, int64_t nlo) {
  for (int64_t m = 0; m < M;) {
    const int64_t left = M - m;
    const int ir = left >= 6 ? 6 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
    const int64_t k0 = std::clamp(m + klo, int64_t(0), K);
    const int64_t k1 = std::clamp(m + ir + khi, k0, K);
    const int64_t n0 = std::clamp(m + nlo, int64_t(0), N) / 16 * 16;
    float* cm = c + m * ldc;
    const float* am = a + m * sam;
    const float* rsm = rs ? rs + m : nullptr;
    switch (ir) {
      case 6:
        tile_row<6>(cm, ldc, rsm, load_c, am, sam, sak, b, ldb, n0, N, k0, k1);
        break;
      case 4:
        tile_row<4>(cm, ldc, rsm, load_c, am, sam, sak, b, ldb, n0, N, k0, k1);
        break;
      case 2:
        tile_row<2>(cm, ldc, rsm, load_c, am, sam, sak, b, ldb, n0, N, k0, k1);
        break;
      default:
        tile_row<1>(cm, ldc, rsm, load_c, am, sam, sak, b, ldb, n0, N, k0, k1);
        break;
    }
    m += ir;
  }
}

// ---- moving rows between Elem tensors and f32 scratch ----
// Rows [0,n) of src (row stride ld, HS wide) as f32 rows of stride *ld_out: the tensor itself when
// it already is f32 with HS a multiple of 16, else converted into buf (n,HSp) with zero padding
// columns. Kernels never read past row n or column HSp of what this returns.
template <class Elem>
const float* f32_rows(const Elem* src, int64_t ld, int64_t n, int64_t HS, int64_t HSp, float* buf,
                      int64_t* ld_out) {
  if constexpr (std::is_same_v<Elem, float>) {
    if (HS == HSp) {
      *ld_out = ld;
      return src;
    }
  }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t e = 0; e < HSp; e += 16)
      vstore(buf + r * HSp + e, vload_n(src + r * ld + e, HS - e));
  *ld_out = HSp;
  return buf;
}

// dst (HSp,R) <- the transpose of rows [0,n) of src (row stride ld, HS wide) times mul, zero
// padded; R a multiple of 16. Done in 16x16 blocks in registers.
template <class Elem>
void load_cols(float* dst, int64_t R, int64_t HSp, const Elem* src, int64_t ld, int64_t n,
               int64_t HS, float mul) {
  const V16 vm = vset1(mul);
  for (int64_t r0 = 0; r0 < R; r0 += 16) {
    for (int64_t e0 = 0; e0 < HSp; e0 += 16) {
      V16 blk[16];
      for (int64_t x = 0; x < 16; ++x) {
        blk[x] = r0 + x < n ? vmul(vload_n(src + (r0 + x) * ld + e0, HS - e0), vm) : vset1(0.f);
      }
      transpose16(blk);
      for (int64_t x = 0; x < 16; ++x) vstore(dst + (e0 + x) * R + r0, blk[x]);
    }
  }
}

// Rows [0,n) of dst (row stride ld, HS wide) <- src (n,HSp) times rs[r] (or 1), rounded to Elem.
template <class Elem>
void store_rows(Elem* dst, int64_t ld, const float* src, int64_t HSp, int64_t n, int64_t HS,
                const float* rs) {
  for (int64_t r = 0; r < n; ++r) {
    const V16 s = vset1(rs ? rs[r] : 1.f);
    for (int64_t e = 0; e < HS; e += 16)
      vstore_n(dst + r * ld + e, vmul(vload(src + r * HSp + e), s), HS - e);
  }
}

// 64-byte aligned f32 scratch of one thread, zeroed, carved into named pieces.
class Scratch {
 public:
  explicit Scratch(int64_t n)
      : buf_(new (std::align_val_t(64)) float[round_up(n, 16)]()), used_(0) {}
  ~Scratch() { ::operator delete[](buf_, std::align_val_t(64)); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* take(int64_t n) {
    float* p = buf_ + used_;
    used_ += round_up(n, 16);
    return p;
  }

 private:
  float* buf_;
  int64_t used_;
};

// ---- forward ----
// One query block [i0, i0+nq) of one head against keys [0, i0+nq). q and o point at (b, t=0, h),
// row stride ldq; kf and vf are the head's keys and values as f32 rows (strides ldk, ldv); lse at
// (b, h, t=0).
template <class Elem>
void fwd_block(const Elem* q, Elem* o, int64_t ldq, const float* kf, int64_t ldk, const float* vf,
               int64_t ldv, float* lse, int64_t T, int64_t HS, int64_t HSp, int64_t i0, float scale,
               float* qt, float* st, float* oacc, float* mrow, float* lrow, float* alpha) {
  const int64_t nq = std::min(kBr, T - i0);
  const int64_t nvq = (nq + 15) / 16;  // vectors of 16 queries
  const float inf = std::numeric_limits<float>::infinity();
  // qt (HSp,Br): queries times scale*log2(e), transposed; oacc (Br,HSp) = 0, m = -inf, l = 0.
  load_cols(qt, kBr, HSp, q + i0 * ldq, ldq, nq, HS, scale * kLog2e);
  std::fill(oacc, oacc + kBr * HSp, 0.f);
  std::fill(mrow, mrow + kBr, -inf);
  std::fill(lrow, lrow + kBr, 0.f);
  for (int64_t j0 = 0; j0 < i0 + nq; j0 += kBc) {
    const int64_t nk = std::min(kBc, T - j0);
    const float* kb = kf + j0 * ldk;  // (nk,HS)
    const float* vb = vf + j0 * ldv;  // (nk,HS)
    // st (Bc,Br) = kb qt: key row m needs queries i >= m + j0 - i0.
    band_mm(st, kBr, nullptr, false, kb, ldk, 1, qt, kBr, nk, nvq * 16, HS, -kFree, kFree, j0 - i0);
    // Online softmax, one vector of 16 queries at a time. On the diagonal, lanes of queries before
    // the key are set to -inf first (that also covers what band_mm skipped).
    const bool diag = j0 + nk - 1 > i0;
    for (int64_t vq = 0; vq < nvq; ++vq) {
      float* col = st + 16 * vq;
      const V16 m_old = vload(mrow + 16 * vq);
      V16 mx = m_old;
      for (int64_t j = 0; j < nk; ++j) {
        V16 s = vload(col + j * kBr);
        if (diag) {
          s = vfill_below(s, j0 + j - i0 - 16 * vq, -inf);
          vstore(col + j * kBr, s);
        }
        mx = vmax(mx, s);
      }
      V16 sum = vset1(0.f);
      for (int64_t j = 0; j < nk; ++j) {
        const V16 p = vexp2(vsub(vload(col + j * kBr), mx));
        vstore(col + j * kBr, p);
        sum = vadd(sum, p);
      }
      const V16 al = vexp2(vsub(m_old, mx));  // 0 on the first block (m_old = -inf)
      vstore(lrow + 16 * vq, vfma(vload(lrow + 16 * vq), al, sum));
      vstore(mrow + 16 * vq, mx);
      vstore(alpha + 16 * vq, al);
    }
    // oacc (Br,HSp) = alpha * oacc + P vb, P(i,j) = st[j*Br + i]; query i needs keys j <= i + i0 -
    // j0.
    band_mm(oacc, HSp, alpha, true, st, 1, kBr, vb, ldv, nq, HSp, nk, -kFree, i0 - j0, -kFree);
  }
  for (int64_t i = 0; i < nq; ++i) {
    lse[i0 + i] = (mrow[i] + std::log2(lrow[i])) * kLn2;
    alpha[i] = 1.f / lrow[i];
  }
  store_rows(o + i0 * ldq, ldq, oacc, HSp, nq, HS, alpha);
}

// ---- backward ----
// Everything for query block [i0, i0+nq) of one head: its dq rows are written here, its dk and dv
// contributions added to dkacc and dvacc (the kv head's T rows, f32, stride HSp). dout, q, o and dq
// point at (b, t=0, h), row stride ldq; kf, vf as in fwd_block; lse at (b, h, t=0).
template <class Elem>
void bwd_block(const Elem* dout, const Elem* q, const Elem* o, Elem* dq, int64_t ldq,
               const float* kf, int64_t ldk, const float* vf, int64_t ldv, const float* lse,
               int64_t T, int64_t HS, int64_t HSp, int64_t i0, float scale, float* qt, float* dot,
               float* qbuf, float* dobuf, float* st, float* dpt, float* dqacc, float* lse2,
               float* drow, float* dkacc, float* dvacc) {
  const int64_t nq = std::min(kBr, T - i0);
  const int64_t nvq = (nq + 15) / 16;
  load_cols(qt, kBr, HSp, q + i0 * ldq, ldq, nq, HS, scale * kLog2e);  // (HSp,Br)
  load_cols(dot, kBr, HSp, dout + i0 * ldq, ldq, nq, HS, 1.f);         // (HSp,Br)
  int64_t ldr, lddo;
  const float* qr = f32_rows(q + i0 * ldq, ldq, nq, HS, HSp, qbuf, &ldr);        // (nq,HS)
  const float* dor = f32_rows(dout + i0 * ldq, ldq, nq, HS, HSp, dobuf, &lddo);  // (nq,HS)
  std::fill(dqacc, dqacc + kBr * HSp, 0.f);
  // lse2 = lse * log2(e) and D = dO . O per query; padding lanes 0 (their dO^T is 0, so dS is 0).
  for (int64_t i = 0; i < kBr; ++i) {
    lse2[i] = 0.f;
    drow[i] = 0.f;
    if (i >= nq) continue;
    lse2[i] = lse[i0 + i] * kLog2e;
    V16 d = vset1(0.f);
    for (int64_t e = 0; e < HS; e += 16)
      d = vfma(vload_n(dor + i * lddo + e, HS - e), vload_n(o + (i0 + i) * ldq + e, HS - e), d);
    drow[i] = vsum(d);
  }
  const V16 vscale = vset1(scale);
  for (int64_t j0 = 0; j0 < i0 + nq; j0 += kBc) {
    const int64_t nk = std::min(kBc, T - j0);
    const float* kb = kf + j0 * ldk;  // (nk,HS)
    const float* vb = vf + j0 * ldv;  // (nk,HS)
    // st = S^T (Bc,Br) and dpt = dP^T (Bc,Br), over the causal band.
    band_mm(st, kBr, nullptr, false, kb, ldk, 1, qt, kBr, nk, nvq * 16, HS, -kFree, kFree, j0 - i0);
    band_mm(dpt, kBr, nullptr, false, vb, ldv, 1, dot, kBr, nk, nvq * 16, HS, -kFree, kFree,
            j0 - i0);
    // st <- P = exp2(S - lse2), dpt <- scale * dS = scale * P (dP - D); masked entries exactly 0.
    const bool diag = j0 + nk - 1 > i0;
    for (int64_t j = 0; j < nk; ++j) {
      for (int64_t vq = 0; vq < nvq; ++vq) {
        float* ps = st + j * kBr + 16 * vq;
        float* pd = dpt + j * kBr + 16 * vq;
        V16 p = vexp2(vsub(vload(ps), vload(lse2 + 16 * vq)));
        V16 ds = vmul(vmul(p, vsub(vload(pd), vload(drow + 16 * vq))), vscale);
        if (diag) {
          const int64_t c = j0 + j - i0 - 16 * vq;
          p = vfill_below(p, c, 0.f);
          ds = vfill_below(ds, c, 0.f);
        }
        vstore(ps, p);
        vstore(pd, ds);
      }
    }
    // dV_j += P^T dO_i and dK_j += dS^T Q_i: key row m needs queries i >= m + j0 - i0.
    band_mm(dvacc + j0 * HSp, HSp, nullptr, true, st, kBr, 1, dor, lddo, nk, HSp, nq, j0 - i0,
            kFree, -kFree);
    band_mm(dkacc + j0 * HSp, HSp, nullptr, true, dpt, kBr, 1, qr, ldr, nk, HSp, nq, j0 - i0, kFree,
            -kFree);
    // dQ_i += dS K_j: query row i needs keys j <= i + i0 - j0.
    band_mm(dqacc, HSp, nullptr, true, dpt, 1, kBr, kb, ldk, nq, HSp, nk, -kFree, i0 - j0, -kFree);
  }
  store_rows(dq + i0 * ldq, ldq, dqacc, HSp, nq, HS, nullptr);
}

void check_shape(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS) {
  LOOM_CHECK(B >= 0 && T >= 0 && NH > 0 && NKV > 0 && HS > 0 && NH % NKV == 0)
      << "attention: B=" << B << " T=" << T << " NH=" << NH << " NKV=" << NKV << " HS=" << HS;
}

}  // namespace

template <class Elem>
void attention_fwd(const Elem* q, const Elem* k, const Elem* v, Elem* o, float* lse, int64_t B,
                   int64_t T, int64_t NH, int64_t NKV, int64_t HS, float scale) {
  check_shape(B, T, NH, NKV, HS);
  if (B == 0 || T == 0) return;
  const int64_t G = NH / NKV;
  const int64_t HSp = round_up(HS, 16);
  const int64_t nqb = (T + kBr - 1) / kBr;
  // Work item = (b, h, query blocks p and nqb-1-p): under the causal mask every item costs about
  // the same, so a static schedule balances.
  const int64_t npair = (nqb + 1) / 2;
  const int64_t items = B * NH * npair;
  const int64_t conv = std::is_same_v<Elem, float> && HS == HSp ? 0 : T * HSp;  // see f32_rows
#pragma omp parallel
  {
    Scratch s(HSp * kBr + kBc * kBr + kBr * HSp + 3 * kBr + 2 * conv + 128);
    float* qt = s.take(HSp * kBr);    // (HSp,Br)
    float* st = s.take(kBc * kBr);    // (Bc,Br)
    float* oacc = s.take(kBr * HSp);  // (Br,HSp)
    float* mrow = s.take(kBr);
    float* lrow = s.take(kBr);
    float* alpha = s.take(kBr);
    float* kbuf = s.take(conv);  // (T,HSp) keys as f32, when k is not already
    float* vbuf = s.take(conv);  // (T,HSp)
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t bh = it / npair, p = it % npair;
      const int64_t b = bh / NH, h = bh % NH, g = h / G;
      const int64_t tk = std::min(T, (nqb - p) * kBr);  // keys the later block needs
      int64_t ldk, ldv;
      const float* kf = f32_rows(k + (b * T * NKV + g) * HS, NKV * HS, tk, HS, HSp, kbuf, &ldk);
      const float* vf = f32_rows(v + (b * T * NKV + g) * HS, NKV * HS, tk, HS, HSp, vbuf, &ldv);
      const int64_t blocks[2] = {p, nqb - 1 - p};
      for (int x = 0; x < (blocks[0] == blocks[1] ? 1 : 2); ++x) {
        fwd_block(q + (b * T * NH + h) * HS, o + (b * T * NH + h) * HS, NH * HS, kf, ldk, vf, ldv,
                  lse + (b * NH + h) * T, T, HS, HSp, blocks[x] * kBr, scale, qt, st, oacc, mrow,
                  lrow, alpha);
      }
    }
  }
}

template <class Elem>
void attention_bwd(const Elem* dout, const Elem* q, const Elem* k, const Elem* v, const Elem* o,
                   const float* lse, Elem* dq, Elem* dk, Elem* dv, int64_t B, int64_t T, int64_t NH,
                   int64_t NKV, int64_t HS, float scale) {
  check_shape(B, T, NH, NKV, HS);
  if (B == 0 || T == 0) return;
  const int64_t G = NH / NKV;
  const int64_t HSp = round_up(HS, 16);
  // Work item = (b, kv head g): it owns dk and dv of g (accumulated in f32 over the G query heads
  // and all query blocks, in a fixed order) and the dq rows of those query heads. No two items
  // write the same element, so there are no atomics and the result does not depend on the thread
  // count.
  const int64_t items = B * NKV;
  const bool conv = !(std::is_same_v<Elem, float> && HS == HSp);  // see f32_rows
#pragma omp parallel
  {
    Scratch s(2 * HSp * kBr + (conv ? 2 * kBr * HSp : 0) + 2 * kBc * kBr + kBr * HSp + 2 * kBr +
              (conv ? 4 : 2) * T * HSp + 128);
    float* qt = s.take(HSp * kBr);                // (HSp,Br) Q^T * scale*log2(e)
    float* dot = s.take(HSp * kBr);               // (HSp,Br) dO^T
    float* qbuf = s.take(conv ? kBr * HSp : 0);   // (Br,HSp) Q as f32, when q is not already
    float* dobuf = s.take(conv ? kBr * HSp : 0);  // (Br,HSp) dO as f32, when dout is not already
    float* st = s.take(kBc * kBr);                // (Bc,Br) S^T, then P^T
    float* dpt = s.take(kBc * kBr);               // (Bc,Br) dP^T, then scale * dS^T
    float* dqacc = s.take(kBr * HSp);             // (Br,HSp)
    float* lse2 = s.take(kBr);
    float* drow = s.take(kBr);
    float* kbuf = s.take(conv ? T * HSp : 0);  // (T,HSp) keys as f32, when k is not already
    float* vbuf = s.take(conv ? T * HSp : 0);  // (T,HSp)
    float* dkacc = s.take(T * HSp);            // (T,HSp)
    float* dvacc = s.take(T * HSp);            // (T,HSp)
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t b = it / NKV, g = it % NKV;
      int64_t ldk, ldv;
      const float* kf = f32_rows(k + (b * T * NKV + g) * HS, NKV * HS, T, HS, HSp, kbuf, &ldk);
      const float* vf = f32_rows(v + (b * T * NKV + g) * HS, NKV * HS, T, HS, HSp, vbuf, &ldv);
      std::fill(dkacc, dkacc + T * HSp, 0.f);
      std::fill(dvacc, dvacc + T * HSp, 0.f);
      for (int64_t h = g * G; h < (g + 1) * G; ++h) {
        const int64_t off = (b * T * NH + h) * HS;
        for (int64_t i0 = 0; i0 < T; i0 += kBr) {
          bwd_block(dout + off, q + off, o + off, dq + off, NH * HS, kf, ldk, vf, ldv,
                    lse + (b * NH + h) * T, T, HS, HSp, i0, scale, qt, dot, qbuf, dobuf, st, dpt,
                    dqacc, lse2, drow, dkacc, dvacc);
        }
      }
      store_rows(dk + (b * T * NKV + g) * HS, NKV * HS, dkacc, HSp, T, HS, nullptr);
      store_rows(dv + (b * T * NKV + g) * HS, NKV * HS, dvacc, HSp, T, HS, nullptr);
    }
  }
}

template void attention_fwd<float>(const float*, const float*, const float*, float*, float*,
                                   int64_t, int64_t, int64_t, int64_t, int64_t, float);
template void attention_fwd<bf16>(const bf16*, const bf16*, const bf16*, bf16*, float*, int64_t,
                                  int64_t, int64_t, int64_t, int64_t, float);
template void attention_bwd<float>(const float*, const float*, const float*, const float*,
                                   const float*, const float*, float*, float*, float*, int64_t,
                                   int64_t, int64_t, int64_t, int64_t, float);
template void attention_bwd<bf16>(const bf16*, const bf16*, const bf16*, const bf16*, const bf16*,
                                  const float*, bf16*, bf16*, bf16*, int64_t, int64_t, int64_t,
                                  int64_t, int64_t, float);

}  // namespace loom::kernels::cpu
