// Plain reference loops for every kernel in kernels.h: the textbook definition, one loop per
// formula, templated on the scalar S (float or double) so tests can run them in f64 and compare
// the fast kernels against them.
//
// Not fast, not threaded, not used to train: only by tests and the f64 reference evaluator.
// Argument meanings, shapes and overwrite rules are exactly those of the fast kernel of the same
// name in kernels.h; ids stay int32_t; casts and transpose work on stored bits, so not templated.
// Invariant: every accumulation runs in S in index order. (The textbook GELU cancels in 1 + tanh
// for x < -5, so there even f64 is only accurate in absolute terms, ~1e-16.)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <vector>

#include "loom/core/dtype.h"

namespace loom::kernels::cpu::ref {

// ---- embedding ----

// ids (N), table (V,C) -> out (N,C)
template <class S>
void embedding_fwd(const int32_t* ids, const S* table, S* out, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = table[int64_t(ids[n]) * C + c];
}

// dout (N,C) -> dtable (V,C), overwritten; rows added in n order.
template <class S>
void embedding_bwd(const int32_t* ids, const S* dout, S* dtable, int64_t N, int64_t V, int64_t C) {
  for (int64_t i = 0; i < V * C; ++i) dtable[i] = S(0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) dtable[int64_t(ids[n]) * C + c] += dout[n * C + c];
}

// ---- RMSNorm ----

// x (N,C), w (C) -> y (N,C), rstd (N)
template <class S>
void rmsnorm_fwd(const S* x, const S* w, S* y, S* rstd, int64_t N, int64_t C, S eps) {
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    S ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const S r = S(1) / std::sqrt(ss / S(C) + eps);
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = xr[c] * r * w[c];
    rstd[n] = r;
  }
}

// dy (N,C), x (N,C), w (C), rstd (N) -> dx (N,C), dw (C) overwritten.
//   dx = rstd * (w*dy - xhat * mean(w*dy*xhat)), xhat = x*rstd;  dw = sum_n dy*xhat
template <class S>
void rmsnorm_bwd(const S* dy, const S* x, const S* w, const S* rstd, S* dx, S* dw, int64_t N,
                 int64_t C) {
  for (int64_t c = 0; c < C; ++c) dw[c] = S(0);
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    const S* dyr = dy + n * C;
    const S r = rstd[n];
    S dot = 0;  // sum_c w*dy*xhat
    for (int64_t c = 0; c < C; ++c) dot += w[c] * dyr[c] * xr[c] * r;
    const S mdot = dot / S(C);
    for (int64_t c = 0; c < C; ++c) {
      const S xhat = xr[c] * r;
      dx[n * C + c] = r * (w[c] * dyr[c] - xhat * mdot);
      dw[c] += dyr[c] * xhat;
    }
  }
}

// ---- LayerNorm ----

// x (N,C), w (C), b (C) -> y (N,C), mean (N), rstd (N)
template <class S>
void layernorm_fwd(const S* x, const S* w, const S* b, S* y, S* mean, S* rstd, int64_t N, int64_t C,
                   S eps) {
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    S m = 0;
    for (int64_t c = 0; c < C; ++c) m += xr[c];
    m /= S(C);
    S var = 0;
    for (int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
    var /= S(C);
    const S r = S(1) / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = (xr[c] - m) * r * w[c] + b[c];
    mean[n] = m;
    rstd[n] = r;
  }
}

// -> dx (N,C), dw (C), db (C) overwritten.
//   dxhat = dy*w;  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat*xhat))
template <class S>
void layernorm_bwd(const S* dy, const S* x, const S* w, const S* mean, const S* rstd, S* dx, S* dw,
                   S* db, int64_t N, int64_t C) {
  for (int64_t c = 0; c < C; ++c) dw[c] = db[c] = S(0);
  for (int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    const S* dyr = dy + n * C;
    const S m = mean[n], r = rstd[n];
    S sum_d = 0, sum_dx = 0;
    for (int64_t c = 0; c < C; ++c) {
      const S xhat = (xr[c] - m) * r;
      sum_d += dyr[c] * w[c];
      sum_dx += dyr[c] * w[c] * xhat;
    }
    const S mean_d = sum_d / S(C), mean_dx = sum_dx / S(C);
    for (int64_t c = 0; c < C; ++c) {
      const S xhat = (xr[c] - m) * r;
      dx[n * C + c] = r * (dyr[c] * w[c] - mean_d - xhat * mean_dx);
      dw[c] += dyr[c] * xhat;
      db[c] += dyr[c];
    }
  }
}

// ---- RoPE (rotate-half) ----

// x (B,T,NH,HS) -> y (B,T,NH,HS), position = t. y may alias x.
template <class S>
void rope(const S* x, S* y, int64_t B, int64_t T, int64_t NH, int64_t HS, S theta, int sign) {
  const int64_t half = HS / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < NH; ++h) {
        const int64_t o = ((b * T + t) * NH + h) * HS;
        for (int64_t i = 0; i < half; ++i) {
          const S freq = std::pow(theta, -S(2 * i) / S(HS));
          const S a = S(sign) * S(t) * freq;
          const S x0 = x[o + i], x1 = x[o + i + half];
          y[o + i] = x0 * std::cos(a) - x1 * std::sin(a);
          y[o + i + half] = x1 * std::cos(a) + x0 * std::sin(a);
        }
      }
}

// ---- SwiGLU ----

template <class S>
S sigmoid(S v) {
  return S(1) / (S(1) + std::exp(-v));
}

// g (n), u (n) -> y (n) = g*sigmoid(g)*u
template <class S>
void swiglu_fwd(const S* g, const S* u, S* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] * sigmoid(g[i]) * u[i];
}

// dsilu/dg = s + g*s*(1-s)
template <class S>
void swiglu_bwd(const S* dy, const S* g, const S* u, S* dg, S* du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const S s = sigmoid(g[i]);
    dg[i] = dy[i] * u[i] * (s + g[i] * s * (S(1) - s));
    du[i] = dy[i] * g[i] * s;
  }
}

// ---- GELU (tanh approximation) ----

template <class S>
void gelu_fwd(const S* x, S* y, int64_t n) {
  const S k = std::sqrt(S(2) / std::numbers::pi_v<S>);
  for (int64_t i = 0; i < n; ++i) {
    const S v = x[i];
    y[i] = S(0.5) * v * (S(1) + std::tanh(k * (v + S(0.044715) * v * v * v)));
  }
}

template <class S>
void gelu_bwd(const S* dy, const S* x, S* dx, int64_t n) {
  const S k = std::sqrt(S(2) / std::numbers::pi_v<S>);
  for (int64_t i = 0; i < n; ++i) {
    const S v = x[i];
    const S th = std::tanh(k * (v + S(0.044715) * v * v * v));
    const S du = k * (S(1) + S(3) * S(0.044715) * v * v);
    dx[i] = dy[i] * (S(0.5) * (S(1) + th) + S(0.5) * v * (S(1) - th * th) * du);
  }
}

// ---- cross-entropy ----

// logits (N,V), targets (N) -> loss[0] = mean_n (logsumexp(row) - row[target]),
// dlogits (N,V) = (softmax - onehot) / N. dlogits may alias logits.
template <class S>
void cross_entropy(const S* logits, const int32_t* targets, S* loss, S* dlogits, int64_t N,
                   int64_t V) {
  S total = 0;
  for (int64_t n = 0; n < N; ++n) {
    const S* x = logits + n * V;
    S m = x[0];
    for (int64_t v = 1; v < V; ++v) m = std::max(m, x[v]);
    S sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(x[v] - m);
    total += m + std::log(sum) - x[targets[n]];
    for (int64_t v = 0; v < V; ++v)  // reads x[v] before writing dlogits[v]: alias-safe
      dlogits[n * V + v] = (std::exp(x[v] - m) / sum - S(v == targets[n])) / S(N);
  }
  loss[0] = total / S(N);
}

// ---- elementwise ----

template <class S>
void add(const S* a, const S* b, S* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

// a (N,C), b (C) -> y (N,C)
template <class S>
void add_bias(const S* a, const S* b, S* y, int64_t N, int64_t C) {
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < C; ++c) y[r * C + c] = a[r * C + c] + b[c];
}

template <class S>
void mul(const S* a, const S* b, S* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
}

template <class S>
void scale(const S* a, S s, S* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] * s;
}

template <class S>
void mul_scalar(const S* a, const S* s, S* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] * s[0];
}

inline void cast_f32_bf16(const float* x, bf16* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

inline void cast_bf16_f32(const bf16* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
}

// ---- reductions ----

template <class S>
void sum(const S* x, S* y, int64_t n) {
  S s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  y[0] = s;
}

template <class S>
void sumsq(const S* x, S* y, int64_t n) {
  S s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  y[0] = s;
}

// x (N,C) -> y (C)
template <class S>
void sum_rows(const S* x, S* y, int64_t N, int64_t C) {
  for (int64_t c = 0; c < C; ++c) y[c] = S(0);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < C; ++c) y[c] += x[r * C + c];
}

// ---- layout ----

// y.shape[i] = x.shape[perm[i]]: for every output multi-index o, y[o] = x[i] with i[perm[k]] =
// o[k].
inline void transpose(const void* x, void* y, const int64_t* dims, const int* perm, int rank,
                      int elem) {
  std::vector<int64_t> in_stride(rank, 1), out_dims(rank), idx(rank, 0);
  for (int k = rank - 2; k >= 0; --k) in_stride[k] = in_stride[k + 1] * dims[k + 1];
  int64_t total = 1;
  for (int k = 0; k < rank; ++k) {
    out_dims[k] = dims[perm[k]];
    total *= out_dims[k];
  }
  for (int64_t o = 0; o < total; ++o) {
    int64_t src = 0;
    for (int k = 0; k < rank; ++k) src += idx[k] * in_stride[perm[k]];
    std::memcpy(static_cast<char*>(y) + o * elem, static_cast<const char*>(x) + src * elem, elem);
    for (int k = rank - 1; k >= 0; --k) {  // odometer over the output index
      if (++idx[k] < out_dims[k]) break;
      idx[k] = 0;
    }
  }
}

// x (N, sum sizes) -> ys[i] (N, sizes[i])
template <class S>
void split_last(const S* x, S* const* ys, const int64_t* sizes, int k, int64_t N) {
  int64_t width = 0;
  for (int i = 0; i < k; ++i) width += sizes[i];
  for (int64_t r = 0; r < N; ++r) {
    int64_t off = 0;
    for (int i = 0; i < k; ++i) {
      for (int64_t c = 0; c < sizes[i]; ++c) ys[i][r * sizes[i] + c] = x[r * width + off + c];
      off += sizes[i];
    }
  }
}

// xs[i] (N, sizes[i]) -> y (N, sum sizes)
template <class S>
void concat_last(const S* const* xs, S* y, const int64_t* sizes, int k, int64_t N) {
  int64_t width = 0;
  for (int i = 0; i < k; ++i) width += sizes[i];
  for (int64_t r = 0; r < N; ++r) {
    int64_t off = 0;
    for (int i = 0; i < k; ++i) {
      for (int64_t c = 0; c < sizes[i]; ++c) y[r * width + off + c] = xs[i][r * sizes[i] + c];
      off += sizes[i];
    }
  }
}

// ---- optimizer ----

// hyper = {lr, bc1 = 1 - beta1^t, bc2 = 1 - beta2^t}; p, m, v (n) updated in place.
template <class S>
void adamw(S* p, const S* g, S* m, S* v, const S* hyper, const S* gscale, int64_t n, S beta1,
           S beta2, S eps, S wd) {
  const S lr = hyper[0], bc1 = hyper[1], bc2 = hyper[2];
  for (int64_t i = 0; i < n; ++i) {
    const S gi = g[i] * gscale[0];
    m[i] = beta1 * m[i] + (S(1) - beta1) * gi;
    v[i] = beta2 * v[i] + (S(1) - beta2) * gi * gi;
    const S mhat = m[i] / bc1, vhat = v[i] / bc2;
    p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
  }
}

// total (1) -> norm (1) = sqrt(total), coef (1) = min(1, max_norm / (norm + 1e-6)), 1 if max_norm
// <= 0
template <class S>
void clip_coef(const S* total, S* coef, S* norm, S max_norm) {
  norm[0] = std::sqrt(total[0]);
  coef[0] = max_norm > S(0) ? std::min(S(1), max_norm / (norm[0] + S(1e-6))) : S(1);
}

// ---- Mixture-of-Experts (ops/moe.cc defines each) ----

// logits (B,T,E) -> gates (B,T,K), experts, slots (B,T,K), prob_sum (E), z_sum (1), routed, kept
// (E)
template <class S>
void moe_router(const S* logits, S* gates, int32_t* experts, int32_t* slots, S* prob_sum, S* z_sum,
                S* routed, S* kept, int64_t B, int64_t T, int64_t E, int64_t K, int64_t cap) {
  for (int64_t e = 0; e < E; ++e) prob_sum[e] = routed[e] = kept[e] = S(0);
  z_sum[0] = S(0);
  std::vector<bool> taken(static_cast<size_t>(E));
  for (int64_t n = 0; n < B * T; ++n) {
    const S* l = logits + n * E;
    S m = l[0];
    for (int64_t e = 1; e < E; ++e) m = std::max(m, l[e]);
    S z = 0;
    for (int64_t e = 0; e < E; ++e) z += std::exp(l[e] - m);
    for (int64_t e = 0; e < E; ++e) prob_sum[e] += std::exp(l[e] - m) / z;
    const S lse = m + std::log(z);
    z_sum[0] += lse * lse;
    std::fill(taken.begin(), taken.end(), false);
    for (int64_t k = 0; k < K; ++k) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!taken[size_t(e)] && (best < 0 || l[e] > l[best])) best = e;
      taken[size_t(best)] = true;
      experts[n * K + k] = int32_t(best);
      routed[best] += S(1);
    }
    S gz = 0;
    for (int64_t k = 0; k < K; ++k) gz += std::exp(l[experts[n * K + k]] - l[experts[n * K]]);
    for (int64_t k = 0; k < K; ++k)
      gates[n * K + k] = std::exp(l[experts[n * K + k]] - l[experts[n * K]]) / gz;
  }
  std::vector<int64_t> fill(static_cast<size_t>(E));
  for (int64_t b = 0; b < B; ++b) {
    std::fill(fill.begin(), fill.end(), 0);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t i = (b * T + t) * K + k, e = experts[i];
        slots[i] = fill[size_t(e)] < cap ? int32_t(fill[size_t(e)]++) : -1;
        if (slots[i] >= 0) kept[e] += S(1);
      }
  }
}

// -> dlogits (B,T,E), overwritten
template <class S>
void moe_router_bwd(const S* logits, const S* gates, const int32_t* experts, const S* dgates,
                    const S* dprob_sum, S dz_sum, S* dlogits, int64_t B, int64_t T, int64_t E,
                    int64_t K) {
  for (int64_t n = 0; n < B * T; ++n) {
    const S* l = logits + n * E;
    S* dl = dlogits + n * E;
    S m = l[0];
    for (int64_t e = 1; e < E; ++e) m = std::max(m, l[e]);
    S z = 0;
    for (int64_t e = 0; e < E; ++e) z += std::exp(l[e] - m);
    const S lse = m + std::log(z);
    S pd = 0;
    for (int64_t e = 0; e < E; ++e) pd += std::exp(l[e] - lse) * dprob_sum[e];
    for (int64_t e = 0; e < E; ++e) {
      const S p = std::exp(l[e] - lse);
      dl[e] = p * (dprob_sum[e] - pd) + dz_sum * S(2) * lse * p;
    }
    S gd = 0;
    for (int64_t k = 0; k < K; ++k) gd += gates[n * K + k] * dgates[n * K + k];
    for (int64_t k = 0; k < K; ++k)
      dl[experts[n * K + k]] += gates[n * K + k] * (dgates[n * K + k] - gd);
  }
}

// x (B,T,C) -> xe (E,B,S,C), overwritten; gates may be null (weight 1)
template <class S>
void moe_dispatch(const S* x, const int32_t* experts, const int32_t* slots, const S* gates, S* xe,
                  int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t cap) {
  for (int64_t i = 0; i < E * B * cap * C; ++i) xe[i] = S(0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t i = (b * T + t) * K + k;
        if (slots[i] < 0) continue;
        const S g = gates ? gates[i] : S(1);
        for (int64_t c = 0; c < C; ++c)
          xe[((experts[i] * B + b) * cap + slots[i]) * C + c] = g * x[(b * T + t) * C + c];
      }
}

// ye (E,B,S,C) -> y (B,T,C), overwritten; gates may be null
template <class S>
void moe_combine(const S* ye, const int32_t* experts, const int32_t* slots, const S* gates, S* y,
                 int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t cap) {
  (void)E;
  for (int64_t i = 0; i < B * T * C; ++i) y[i] = S(0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t i = (b * T + t) * K + k;
        if (slots[i] < 0) continue;
        const S g = gates ? gates[i] : S(1);
        for (int64_t c = 0; c < C; ++c)
          y[(b * T + t) * C + c] += g * ye[((experts[i] * B + b) * cap + slots[i]) * C + c];
      }
}

// ye (E,B,S,C), y (B,T,C) -> dg (B,T,K), overwritten
template <class S>
void moe_gate_grad(const S* ye, const S* y, const int32_t* experts, const int32_t* slots, S* dg,
                   int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t cap) {
  (void)E;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t i = (b * T + t) * K + k;
        S s = 0;
        if (slots[i] >= 0)
          for (int64_t c = 0; c < C; ++c)
            s += ye[((experts[i] * B + b) * cap + slots[i]) * C + c] * y[(b * T + t) * C + c];
        dg[i] = s;
      }
}

}  // namespace loom::kernels::cpu::ref
