// Softmax cross-entropy over the last dim, fused with its gradient.
//
// Per row, three passes (the row is in L1/L2 after the first):
//   m = max_v x_v;  e_v = exp(x_v - m) stored into dlogits while summing s = sum_v e_v;
//   dlogits = e_v / (s*N) - onehot(t) / N;  loss_n = m + log(s) - x_t.
// The first two passes are AVX-512 intrinsics (the vectorised detail::exp_f32x16), with a scalar
// fallback for other builds. If dlogits is null only the loss is computed (evaluation).
// Does not do label smoothing, ignore-index or class weights.
// Invariant: each row is computed by one thread in a fixed order, and the mean over rows is an f64
// sum of the per-row losses in row order, so the result is bit-identical for any thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

using detail::exp_f32;

namespace {

struct MaxSum {
  float m, s;  // max_v x_v, sum_v exp(x_v - m)
};

// The row's max and sum of exponentials; e_v = exp(x_v - m) stored into d unless it is null.
MaxSum max_sumexp(const float* x, float* d, int64_t V) {
#ifdef __AVX512F__
  // 16 lanes with a masked tail; lane partials are combined in lane order.
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 vm = neg_inf;
  for (int64_t v = 0; v < V; v += 16)
    vm = _mm512_maskz_max_ps(0xffff, vm,
                             _mm512_mask_loadu_ps(neg_inf, detail::tail_mask(V - v), x + v));
  const float m = detail::max_lanes(vm);
  const __m512 mv = _mm512_set1_ps(m);
  __m512 vs = _mm512_setzero_ps();
  for (int64_t v = 0; v < V; v += 16) {
    const __mmask16 k = detail::tail_mask(V - v);
    const __m512 e = detail::exp_f32x16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + v), mv));
    if (d != nullptr) _mm512_mask_storeu_ps(d + v, k, e);
    vs = _mm512_mask_add_ps(vs, k, vs, e);
  }
  const float s = detail::sum_lanes(vs);
#else
  // The same 16 partial sums (element v into lane v % 16, lanes added in order), so a build with
  // FMA but no AVX-512 gives the same bits; written so it does not depend on the loop being
  // vectorised.
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t v = 0; v < V; ++v) m = x[v] > m ? x[v] : m;
  float lane[16] = {};
  for (int64_t v0 = 0; v0 < V; v0 += 16) {
    const int64_t w = V - v0 < 16 ? V - v0 : 16;
    for (int64_t j = 0; j < w; ++j) {
      const float e = exp_f32(x[v0 + j] - m);
      if (d != nullptr) d[v0 + j] = e;
      lane[j] += e;
    }
  }
  float s = 0;
  for (float l : lane) s += l;
#endif
  return {m, s};
}

// d_v = exp(x_v - m) * k over the row (d may equal x).
void scaled_exp(const float* x, float* d, int64_t V, float m, float k) {
#ifdef __AVX512F__
  const __m512 mv = _mm512_set1_ps(m), kv = _mm512_set1_ps(k);
  for (int64_t v = 0; v < V; v += 16) {
    const __mmask16 t = detail::tail_mask(V - v);
    const __m512 e = detail::exp_f32x16(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, x + v), mv));
    _mm512_mask_storeu_ps(d + v, t, _mm512_mul_ps(e, kv));
  }
#else
  for (int64_t v = 0; v < V; ++v) d[v] = exp_f32(x[v] - m) * k;
#endif
}

// One row: x (V) -> d (V) = (softmax(x) - onehot(t)) * inv_n (skipped when d is null);
// returns logsumexp(x) - x[t]. d may equal x.
double cross_entropy_row(const float* x, int32_t t, float* d, int64_t V, float inv_n) {
  const float xt = x[t];  // read before d (possibly x itself) is written
  const auto [m, s] = max_sumexp(x, d, V);
  if (d != nullptr) {
    const float k = inv_n / s;
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) d[v] *= k;
    d[t] -= inv_n;
  }
  return double(m) + std::log(double(s)) - double(xt);
}

// The mean over `rows` (N when <= 0) of row_loss(n, 1/rows) for n < N: rows on the threads, their
// losses summed in f64 in row order (the same bits for any thread count).
template <class RowLoss>
float mean_row_loss(int64_t N, int64_t rows, RowLoss row_loss) {
  if (rows <= 0) rows = N;
  std::vector<double> rl(static_cast<size_t>(N));  // (N)
  const float inv_n = 1.0f / float(rows);
  detail::for_blocks(N, 1, [&](int64_t n, int64_t) { rl[size_t(n)] = row_loss(n, inv_n); });
  double total = 0;
  for (double l : rl) total += l;
  return float(total / double(rows));
}

}  // namespace

// logits (N,V), targets (N) -> loss (1), dlogits (N,V) (may alias logits, may be null).
void cross_entropy(const float* logits, const int32_t* targets, float* loss, float* dlogits,
                   int64_t N, int64_t V, int64_t rows) {
  for (int64_t n = 0; n < N; ++n)
    LOOM_CHECK(targets[n] >= 0 && targets[n] < V)
        << "cross_entropy: targets[" << n << "] = " << targets[n] << " outside [0," << V << ")";
  loss[0] = mean_row_loss(N, rows, [&](int64_t n, float inv_n) {
    return cross_entropy_row(logits + n * V, targets[n], dlogits ? dlogits + n * V : nullptr, V,
                             inv_n);
  });
}

void softmax_stats(const float* logits, const int32_t* targets, float* stats, int64_t N,
                   int64_t V) {
  detail::for_blocks(N, 1, [&](int64_t n, int64_t) {
    const float* x = logits + n * V;
    const auto [m, s] = max_sumexp(x, nullptr, V);
    stats[3 * n] = m;
    stats[3 * n + 1] = s;
    stats[3 * n + 2] = targets[n] >= 0 ? x[targets[n]] : 0.f;
  });
}

void cross_entropy_split(const float* logits, const int32_t* targets, const float* stats, int64_t K,
                         float* loss, float* dlogits, int64_t N, int64_t V, int64_t rows) {
  loss[0] = mean_row_loss(N, rows, [&](int64_t n, float inv_n) {
    // the blocks' statistics, combined in block order (the same on every rank)
    float M = -std::numeric_limits<float>::infinity();
    for (int64_t k = 0; k < K; ++k) M = std::max(M, stats[(k * N + n) * 3]);
    double S = 0, xt = 0;
    for (int64_t k = 0; k < K; ++k) {
      const float* st = stats + (k * N + n) * 3;
      S += double(st[1]) * std::exp(double(st[0]) - double(M));
      xt += double(st[2]);
    }
    const int32_t t = targets[n];
    if (dlogits != nullptr) {
      // in cross_entropy_row's form: exp(x - M) scaled by inv_n / S
      float* d = dlogits + n * V;
      scaled_exp(logits + n * V, d, V, M, inv_n / float(S));
      if (t >= 0) d[t] -= inv_n;
    }
    return t >= 0 ? double(M) + std::log(S) - xt : 0.0;
  });
}

}  // namespace loom::kernels::cpu
