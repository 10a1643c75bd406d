// Mixture-of-Experts routing, dispatch and combine (ops/moe.cc defines each; reference.h has the
// plain loops).
//
// Threads own disjoint outputs: tokens for the router's per-token work and for combine, sequences
// for the slot assignment and dispatch (a sequence's slots are its own). The router's sums over
// tokens run in token order in f64 after the parallel part, so every result is independent of the
// thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "loom/kernels/cpu/gemm.h"
#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

using detail::for_blocks;
using detail::from_f32;
using detail::to_f32;

namespace {

// One token's softmax statistics and top-k: probs (E) written, returns logsumexp.
float route_token(const float* l, int64_t E, int64_t K, float* probs, float* gates,
                  int32_t* experts) {
  float m = l[0];
  for (int64_t e = 1; e < E; ++e) m = std::max(m, l[e]);
  double z = 0;
  for (int64_t e = 0; e < E; ++e) z += std::exp(double(l[e] - m));
  const double lse = double(m) + std::log(z);
  for (int64_t e = 0; e < E; ++e) probs[e] = float(std::exp(double(l[e]) - lse));
  // top-k by repeated argmax (K is small); ties keep the lower index
  for (int64_t k = 0; k < K; ++k) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t j = 0; j < k; ++j) taken |= experts[j] == e;
      if (!taken && (best < 0 || l[e] > l[best])) best = e;
    }
    experts[k] = int32_t(best);
  }
  double gz = 0;
  for (int64_t k = 0; k < K; ++k) gz += std::exp(double(l[experts[k]] - l[experts[0]]));
  for (int64_t k = 0; k < K; ++k)
    gates[k] = float(std::exp(double(l[experts[k]] - l[experts[0]])) / gz);
  return float(lse);
}

}  // namespace

void moe_router(const float* logits, float* gates, int32_t* experts, int32_t* slots,
                float* prob_sum, float* z_sum, float* routed, float* kept, int64_t B, int64_t T,
                int64_t E, int64_t K, int64_t S) {
  const int64_t N = B * T;
  std::vector<float> probs(size_t(N * E)), lse(static_cast<size_t>(N));
  float* P = probs.data();
  float* L = lse.data();
  for_blocks(N, detail::rows_per_block(E * 8), [=](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      L[n] = route_token(logits + n * E, E, K, P + n * E, gates + n * K, experts + n * K);
  });
  std::vector<double> ps(size_t(E), 0.0), rt(size_t(E), 0.0), kp(size_t(E), 0.0);
  double z = 0;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t e = 0; e < E; ++e) ps[size_t(e)] += P[n * E + e];
    z += double(L[n]) * double(L[n]);
    for (int64_t k = 0; k < K; ++k) rt[size_t(experts[n * K + k])] += 1;
  }
  // slots: per sequence, choice-major
  for_blocks(B, 1, [=](int64_t b0, int64_t b1) {
    std::vector<int32_t> fill(static_cast<size_t>(E));
    for (int64_t b = b0; b < b1; ++b) {
      std::fill(fill.begin(), fill.end(), 0);
      for (int64_t k = 0; k < K; ++k)
        for (int64_t t = 0; t < T; ++t) {
          const int64_t i = (b * T + t) * K + k;
          int32_t& f = fill[size_t(experts[i])];
          slots[i] = f < S ? f++ : -1;
        }
    }
  });
  for (int64_t i = 0; i < N * K; ++i)
    if (slots[i] >= 0) kp[size_t(experts[i])] += 1;
  for (int64_t e = 0; e < E; ++e) {
    prob_sum[e] = float(ps[size_t(e)]);
    routed[e] = float(rt[size_t(e)]);
    kept[e] = float(kp[size_t(e)]);
  }
  z_sum[0] = float(z);
}

void moe_router_bwd(const float* logits, const float* gates, const int32_t* experts,
                    const float* dgates, const float* dprob_sum, float dz_sum, float* dlogits,
                    int64_t B, int64_t T, int64_t E, int64_t K) {
  for_blocks(B * T, detail::rows_per_block(E * 8), [=](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* l = logits + n * E;
      float* dl = dlogits + n * E;
      float m = l[0];
      for (int64_t e = 1; e < E; ++e) m = std::max(m, l[e]);
      double z = 0;
      for (int64_t e = 0; e < E; ++e) z += std::exp(double(l[e] - m));
      const double lse = double(m) + std::log(z);
      double pd = 0;
      for (int64_t e = 0; e < E; ++e) pd += std::exp(double(l[e]) - lse) * dprob_sum[e];
      for (int64_t e = 0; e < E; ++e) {
        const double p = std::exp(double(l[e]) - lse);
        dl[e] = float(p * (dprob_sum[e] - pd) + double(dz_sum) * 2 * lse * p);
      }
      double gd = 0;
      for (int64_t k = 0; k < K; ++k) gd += double(gates[n * K + k]) * dgates[n * K + k];
      for (int64_t k = 0; k < K; ++k)
        dl[experts[n * K + k]] += float(gates[n * K + k] * (dgates[n * K + k] - gd));
    }
  });
}

template <class X>
void moe_dispatch(const X* x, const int32_t* experts, const int32_t* slots, const float* gates,
                  X* xe, int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t S) {
  // each sequence b writes only xe[:, b]: threads own sequences
  for_blocks(B, 1, [=](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t e = 0; e < E; ++e)
        std::memset(static_cast<void*>(xe + (e * B + b) * S * C), 0, size_t(S * C) * sizeof(X));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < K; ++k) {
          const int64_t i = (b * T + t) * K + k;
          if (slots[i] < 0) continue;
          const X* src = x + (b * T + t) * C;
          X* dst = xe + ((experts[i] * B + b) * S + slots[i]) * C;
          if (!gates) {
            std::memcpy(static_cast<void*>(dst), src, size_t(C) * sizeof(X));
            continue;
          }
          const float g = gates[i];
          for (int64_t c = 0; c < C; ++c) dst[c] = from_f32<X>(g * to_f32(src[c]));
        }
    }
  });
}

template <class X>
void moe_combine(const X* ye, const int32_t* experts, const int32_t* slots, const float* gates,
                 float* y, int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t S) {
  (void)E;
  for_blocks(B * T, detail::rows_per_block(C * K), [=](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      float* dst = y + n * C;
      std::memset(dst, 0, size_t(C) * sizeof(float));
      const int64_t b = n / T;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t i = n * K + k;
        if (slots[i] < 0) continue;
        const float g = gates ? gates[i] : 1.0f;
        const X* src = ye + ((experts[i] * B + b) * S + slots[i]) * C;
        for (int64_t c = 0; c < C; ++c) dst[c] += g * to_f32(src[c]);
      }
    }
  });
}

template <class X, class Y>
void moe_gate_grad(const X* ye, const Y* y, const int32_t* experts, const int32_t* slots, float* dg,
                   int64_t B, int64_t T, int64_t C, int64_t E, int64_t K, int64_t S) {
  (void)E;
  for_blocks(B * T, detail::rows_per_block(C * K), [=](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t b = n / T;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t i = n * K + k;
        float s = 0;
        if (slots[i] >= 0) {
          const X* a = ye + ((experts[i] * B + b) * S + slots[i]) * C;
          const Y* v = y + n * C;
          for (int64_t c = 0; c < C; ++c) s += to_f32(a[c]) * to_f32(v[c]);
        }
        dg[i] = s;
      }
    }
  });
}

namespace {

// Rows [0, n) of `rows` (S rows of `width` elements) hold every nonzero row: the last nonzero
// one's index + 1 (0 when all are zero).
int64_t live_rows(const void* rows, int64_t S, int64_t width, size_t elem) {
  int64_t last = -1;
  for (int64_t r = S - 1; r >= 0 && last < 0; --r) {
    bool zero = true;
    if (elem == 4) {
      const uint32_t* p = static_cast<const uint32_t*>(rows) + r * width;
      for (int64_t i = 0; i < width && zero; ++i) zero = (p[i] & 0x7fffffffu) == 0;
    } else {
      const uint16_t* p = static_cast<const uint16_t*>(rows) + r * width;
      for (int64_t i = 0; i < width && zero; ++i) zero = (p[i] & 0x7fffu) == 0;
    }
    if (!zero) last = r;
  }
  return last + 1;
}

}  // namespace

void grouped_gemm(const GroupedGemm& d, const void* a, const void* b, void* c) {
  const size_t ea = dtype_size(d.ab_dtype), ec = dtype_size(d.c_dtype);
  auto A = static_cast<const char*>(a);
  auto Bp = static_cast<const char*>(b);
  auto Cp = static_cast<char*>(c);
  GemmDesc g;
  g.ab_dtype = d.ab_dtype;
  g.c_dtype = d.c_dtype;
  // Each expert's filled rows of all its sequences are packed into one matrix (rounded up to 16
  // zero rows), so an expert runs one GEMM over about T k / E * B rows instead of B short ones
  // (oneDNN's bf16 kernels lose much of their rate below ~100 rows).
  const int64_t width_a = d.ta ? d.M : d.K;  // a's row length
  thread_local std::vector<char> pa, pb, pc;
  std::vector<int64_t> rows(size_t(d.G));
  for (int64_t e = 0; e < d.E; ++e) {
    int64_t total = 0;
    for (int64_t j = 0; j < d.G; ++j) {
      const char* ab = A + size_t((e * d.G + j) * d.S * width_a) * ea;
      rows[size_t(j)] = live_rows(ab, d.S, width_a, ea);
      total += rows[size_t(j)];
    }
    const int64_t packed = (total + 15) / 16 * 16;
    // pack a's filled rows (and, for ta, b's) into pa (pb), zero-padded to `packed` rows
    auto pack = [&](const char* src, int64_t width, std::vector<char>& dst) {
      dst.resize(size_t(packed * width) * ea);
      int64_t at = 0;
      for (int64_t j = 0; j < d.G; ++j) {
        const size_t n = size_t(rows[size_t(j)] * width) * ea;
        std::memcpy(dst.data() + size_t(at * width) * ea,
                    src + size_t((e * d.G + j) * d.S * width) * ea, n);
        at += rows[size_t(j)];
      }
      std::memset(dst.data() + size_t(at * width) * ea, 0, size_t((packed - at) * width) * ea);
    };
    if (!d.ta) {
      char* ce = Cp + size_t(e * d.G * d.S * d.N) * ec;
      if (total == 0) {
        std::memset(ce, 0, size_t(d.G * d.S * d.N) * ec);
        continue;
      }
      pack(A, d.K, pa);
      pc.resize(size_t(packed * d.N) * ec);
      g.M = packed;
      g.N = d.N;
      g.K = d.K;
      g.tb = d.tb;
      gemm(g, pa.data(), Bp + size_t(e * d.N * d.K) * ea, pc.data());
      int64_t at = 0;  // unpack: each sequence's rows back to its block, zeros after them
      for (int64_t j = 0; j < d.G; ++j) {
        char* cb = ce + size_t(j * d.S * d.N) * ec;
        const int64_t r = rows[size_t(j)];
        std::memcpy(cb, pc.data() + size_t(at * d.N) * ec, size_t(r * d.N) * ec);
        std::memset(cb + size_t(r * d.N) * ec, 0, size_t((d.S - r) * d.N) * ec);
        at += r;
      }
      continue;
    }
    // ta: c[e] = a[e]^T b[e] over the packed rows
    char* ce = Cp + size_t(e * d.M * d.N) * ec;
    if (total == 0) {
      std::memset(ce, 0, size_t(d.M * d.N) * ec);
      continue;
    }
    pack(A, d.M, pa);
    pack(Bp, d.N, pb);
    g.M = d.M;
    g.N = d.N;
    g.K = packed;
    g.ta = true;
    gemm(g, pa.data(), pb.data(), ce);
  }
}

template void moe_dispatch<float>(const float*, const int32_t*, const int32_t*, const float*,
                                  float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
template void moe_dispatch<bf16>(const bf16*, const int32_t*, const int32_t*, const float*, bf16*,
                                 int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
template void moe_combine<float>(const float*, const int32_t*, const int32_t*, const float*, float*,
                                 int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
template void moe_combine<bf16>(const bf16*, const int32_t*, const int32_t*, const float*, float*,
                                int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
#define LOOM_GATE_GRAD(X, Y)                                                                    \
  template void moe_gate_grad<X, Y>(const X*, const Y*, const int32_t*, const int32_t*, float*, \
                                    int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
LOOM_GATE_GRAD(float, float)
LOOM_GATE_GRAD(float, bf16)
LOOM_GATE_GRAD(bf16, float)
LOOM_GATE_GRAD(bf16, bf16)
#undef LOOM_GATE_GRAD

}  // namespace loom::kernels::cpu
