#include "loom/kernels/cpu/gemv.h"

#include <algorithm>
#include <vector>

#include "loom/kernels/cpu/vec16.h"

namespace loom::kernels::cpu {

namespace {

using namespace vec16;

// Rows of B (tb) or columns of y (not tb) per parallel block: a fixed size, so the blocks and
// hence the results never depend on the thread count.
constexpr int64_t kRowsPerBlock = 64;
constexpr int64_t kColsPerBlock = 256;

// x (K) as f32, 16 lanes at a time, the tail zero-padded to a multiple of 16, in the calling
// thread's buffer (kept between calls: a decode step makes hundreds, no allocation each).
template <class W>
const float* widen(const W* x, int64_t K) {
  thread_local std::vector<float> w;
  w.assign(size_t((K + 15) / 16 * 16), 0.f);
  for (int64_t k = 0; k < K; k += 16) vstore(w.data() + k, vload_n(x + k, K - k));
  return w.data();
}

// Rows ahead of the four being read that the loop asks the memory for (the hardware prefetcher
// alone left a bf16 weight read at 11-17 GB/s of this machine's 21).
constexpr int64_t kAhead = 8;
inline void prefetch(const void* p) {
#ifdef __AVX512F__
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
#else
  __builtin_prefetch(p);
#endif
}

template <class Y>
void store(Y* y, int64_t n, float v) {
  y[n] = detail::from_f32<Y>(v);
}

// y[n0:n1) = B[n0:n1, :] · x: four rows at a time, each with its own 16-lane accumulator.
template <class W, class Y>
void rows_dot(const float* x, const W* b, int64_t K, int64_t n0, int64_t n1, Y* y) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    const W* r = b + n * K;
    V16 a0 = vset1(0.f), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t k = 0; k < K; k += 16) {
      const V16 xv = vload(x + k);
      const int64_t m = K - k;
      prefetch(r + kAhead * K + k);
      prefetch(r + (kAhead + 2) * K + k);
      a0 = vfma(vload_n(r + k, m), xv, a0);
      a1 = vfma(vload_n(r + K + k, m), xv, a1);
      a2 = vfma(vload_n(r + 2 * K + k, m), xv, a2);
      a3 = vfma(vload_n(r + 3 * K + k, m), xv, a3);
    }
    store(y, n, vsum(a0));
    store(y, n + 1, vsum(a1));
    store(y, n + 2, vsum(a2));
    store(y, n + 3, vsum(a3));
  }
  for (; n < n1; ++n) {
    const W* r = b + n * K;
    V16 a = vset1(0.f);
    for (int64_t k = 0; k < K; k += 16) a = vfma(vload_n(r + k, K - k), vload(x + k), a);
    store(y, n, vsum(a));
  }
}

// y[c0:c1) = Σ_k x[k] B[k, c0:c1): the block's sums stay in 16 registers' worth of f32.
template <class W, class Y>
void cols_axpy(const float* x, const W* b, int64_t N, int64_t K, int64_t c0, int64_t c1, Y* y) {
  constexpr int kLanes = int(kColsPerBlock / 16);
  V16 acc[kLanes];
  for (V16& a : acc) a = vset1(0.f);
  const int64_t width = c1 - c0;
  for (int64_t k = 0; k < K; ++k) {
    const W* r = b + k * N + c0;
    const V16 xv = vset1(x[k]);
    for (int l = 0; l < kLanes && l * 16 < width; ++l)
      acc[l] = vfma(vload_n(r + l * 16, width - l * 16), xv, acc[l]);
  }
  float out[kColsPerBlock];
  for (int l = 0; l < kLanes; ++l) vstore(out + l * 16, acc[l]);
  for (int64_t c = 0; c < width; ++c) store(y, c0 + c, out[c]);
}

template <class W, class Y>
void gemv(int64_t N, int64_t K, bool tb, const W* x, const W* b, Y* y) {
  const float* xp = widen(x, K);
  if (tb)
    detail::for_blocks(N, kRowsPerBlock,
                       [=](int64_t n0, int64_t n1) { rows_dot(xp, b, K, n0, n1, y); });
  else
    detail::for_blocks(N, kColsPerBlock,
                       [=](int64_t c0, int64_t c1) { cols_axpy(xp, b, N, K, c0, c1, y); });
}

}  // namespace

void gemv(int64_t N, int64_t K, bool tb, DType ab_dtype, const void* x, const void* b, void* y,
          DType y_dtype) {
  if (ab_dtype == DType::f32)
    gemv(N, K, tb, static_cast<const float*>(x), static_cast<const float*>(b),
         static_cast<float*>(y));
  else if (y_dtype == DType::bf16)
    gemv(N, K, tb, static_cast<const bf16*>(x), static_cast<const bf16*>(b), static_cast<bf16*>(y));
  else
    gemv(N, K, tb, static_cast<const bf16*>(x), static_cast<const bf16*>(b),
         static_cast<float*>(y));
}

}  // namespace loom::kernels::cpu
