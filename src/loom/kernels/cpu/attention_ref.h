// Plain reference for causal grouped-query attention (attention.h), for tests only.
//
// It materialises the (T,T) score matrix of one (b,h) at a time and loops in the most obvious
// order; it is templated on the scalar S so tests can run it in f64 (finite differences) or f32. It
// is not fast, not threaded, and not what the engine runs.
//
// Same layouts and meanings as attention.h: q (B,T,NH,HS), k and v (B,T,NKV,HS), o (B,T,NH,HS),
// lse (B,NH,T) with lse = log sum_{j<=t} exp(scale * q_t.k_j); query head h reads kv head h /
// (NH/NKV). Invariant: the softmax of row t only ever sees keys j <= t.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace loom::kernels::cpu::ref {

template <class S>
void attention_fwd(const S* q, const S* k, const S* v, S* o, S* lse, int64_t B, int64_t T,
                   int64_t NH, int64_t NKV, int64_t HS, S scale) {
  const int64_t G = NH / NKV;  // query heads per kv head
  std::vector<S> p(T * T);     // (T,T) probabilities of one (b,h); upper triangle unused
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / G;
      for (int64_t t = 0; t < T; ++t) {
        const S* qt = q + ((b * T + t) * NH + h) * HS;
        S mx = -std::numeric_limits<S>::infinity();
        for (int64_t j = 0; j <= t; ++j) {
          const S* kj = k + ((b * T + j) * NKV + g) * HS;
          S s = 0;
          for (int64_t d = 0; d < HS; ++d) s += qt[d] * kj[d];
          p[t * T + j] = s * scale;
          mx = std::max(mx, p[t * T + j]);
        }
        S sum = 0;
        for (int64_t j = 0; j <= t; ++j) {
          p[t * T + j] = std::exp(p[t * T + j] - mx);
          sum += p[t * T + j];
        }
        lse[(b * NH + h) * T + t] = mx + std::log(sum);
        S* ot = o + ((b * T + t) * NH + h) * HS;
        for (int64_t d = 0; d < HS; ++d) ot[d] = 0;
        for (int64_t j = 0; j <= t; ++j) {
          const S* vj = v + ((b * T + j) * NKV + g) * HS;
          const S pj = p[t * T + j] / sum;
          for (int64_t d = 0; d < HS; ++d) ot[d] += pj * vj[d];
        }
      }
    }
  }
}

// dout (B,T,NH,HS) -> dq (B,T,NH,HS), dk and dv (B,T,NKV,HS), all overwritten. o and lse are the
// forward's outputs. With P_tj = exp(scale q_t.k_j - lse_t) and D_t = dout_t . o_t:
//   dv_j += sum_t P_tj dout_t,  dS_tj = P_tj (dout_t . v_j - D_t),
//   dq_t += scale sum_j dS_tj k_j,  dk_j += scale sum_t dS_tj q_t.
template <class S>
void attention_bwd(const S* dout, const S* q, const S* k, const S* v, const S* o, const S* lse,
                   S* dq, S* dk, S* dv, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                   S scale) {
  const int64_t G = NH / NKV;
  std::fill(dq, dq + B * T * NH * HS, S(0));
  std::fill(dk, dk + B * T * NKV * HS, S(0));
  std::fill(dv, dv + B * T * NKV * HS, S(0));
  std::vector<S> p(T * T), ds(T * T);  // (T,T) each, lower triangle used
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / G;
      for (int64_t t = 0; t < T; ++t) {
        const S* qt = q + ((b * T + t) * NH + h) * HS;
        const S* dot = dout + ((b * T + t) * NH + h) * HS;
        const S* ot = o + ((b * T + t) * NH + h) * HS;
        S D = 0;
        for (int64_t d = 0; d < HS; ++d) D += dot[d] * ot[d];
        for (int64_t j = 0; j <= t; ++j) {
          const S* kj = k + ((b * T + j) * NKV + g) * HS;
          const S* vj = v + ((b * T + j) * NKV + g) * HS;
          S s = 0, dp = 0;
          for (int64_t d = 0; d < HS; ++d) {
            s += qt[d] * kj[d];
            dp += dot[d] * vj[d];
          }
          p[t * T + j] = std::exp(s * scale - lse[(b * NH + h) * T + t]);
          ds[t * T + j] = p[t * T + j] * (dp - D);
        }
      }
      for (int64_t t = 0; t < T; ++t) {
        const S* qt = q + ((b * T + t) * NH + h) * HS;
        const S* dot = dout + ((b * T + t) * NH + h) * HS;
        S* dqt = dq + ((b * T + t) * NH + h) * HS;
        for (int64_t j = 0; j <= t; ++j) {
          const S* kj = k + ((b * T + j) * NKV + g) * HS;
          S* dkj = dk + ((b * T + j) * NKV + g) * HS;
          S* dvj = dv + ((b * T + j) * NKV + g) * HS;
          const S pj = p[t * T + j], dsj = ds[t * T + j];
          for (int64_t d = 0; d < HS; ++d) {
            dvj[d] += pj * dot[d];
            dqt[d] += scale * dsj * kj[d];
            dkj[d] += scale * dsj * qt[d];
          }
        }
      }
    }
  }
}

}  // namespace loom::kernels::cpu::ref
