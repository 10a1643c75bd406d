// Pointwise activations: SwiGLU and tanh-approximate GELU, forward and backward.
//
// Both are written through the logistic function s(z) = 1/(1+e^-z), never through tanh:
// 0.5*(1 + tanh(u)) = s(2u) and 1 - tanh(u)^2 = 4 s(2u) (1-s(2u)). That keeps the result accurate
// in relative terms where 1 + tanh(u) would cancel (x << 0). The math of each element is one
// template run on a float or on 16 lanes (__m512, masked tail); AVX-512 builds use the 16-lane
// form because exp does not auto-vectorise well (see detail::exp_f32x16).
// Does not fuse the gate/up split (g and u are separate tensors).
// Invariant: elementwise over blocks of detail::kElemBlock; no result depends on the thread count.
#include <algorithm>

#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

using detail::for_blocks;
using detail::kElemBlock;

namespace {

constexpr float kGeluK = 0.79788456080286535588f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

inline float sigmoid(float x) { return detail::sigmoid_f32(x); }
#ifdef __AVX512F__
inline __m512 sigmoid(__m512 x) { return detail::sigmoid_f32x16(x); }
inline __m512 load(__mmask16 k, const float* p) { return _mm512_maskz_loadu_ps(k, p); }
inline void store(__mmask16 k, float* p, __m512 v) { _mm512_mask_storeu_ps(p, k, v); }
#endif

// ---- element math; V is float or __m512 (gcc vector arithmetic, scalars broadcast) ----

template <class V>
V swiglu_y(V g, V u) {
  return g * sigmoid(g) * u;
}

// dg = dy*u*s*(1 + g*(1-s)), du = dy*g*s
template <class V>
void swiglu_grads(V dy, V g, V u, V* dg, V* du) {
  const V s = sigmoid(g);
  *dg = dy * u * (s * (1.0f + g * (1.0f - s)));
  *du = dy * (g * s);
}

// 2u = 2k*x*(1 + c*x^2)
template <class V>
V gelu_2u(V x) {
  return (2.0f * kGeluK) * x * (kGeluC * x * x + 1.0f);
}

template <class V>
V gelu_y(V x) {
  return x * sigmoid(gelu_2u(x));
}

// dx = dy * (s + 2*x*s*(1-s)*du/dx), s = s(2u), du/dx = k*(1 + 3c*x^2)
template <class V>
V gelu_dx(V dy, V x) {
  const V s = sigmoid(gelu_2u(x));
  const V dudx = kGeluK * ((3.0f * kGeluC) * x * x + 1.0f);
  return dy * (s + 2.0f * x * s * (1.0f - s) * dudx);
}

// ---- loops over one block ----

void swiglu_fwd_block(const float* g, const float* u, float* y, int64_t n) {
#ifdef __AVX512F__
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = detail::tail_mask(n - i);
    store(k, y + i, swiglu_y(load(k, g + i), load(k, u + i)));
  }
#else
  for (int64_t i = 0; i < n; ++i) y[i] = swiglu_y(g[i], u[i]);
#endif
}

void swiglu_bwd_block(const float* dy, const float* g, const float* u, float* dg, float* du,
                      int64_t n) {
#ifdef __AVX512F__
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = detail::tail_mask(n - i);
    __m512 vdg, vdu;
    swiglu_grads(load(k, dy + i), load(k, g + i), load(k, u + i), &vdg, &vdu);
    store(k, dg + i, vdg);
    store(k, du + i, vdu);
  }
#else
  for (int64_t i = 0; i < n; ++i) swiglu_grads(dy[i], g[i], u[i], dg + i, du + i);
#endif
}

void gelu_fwd_block(const float* x, float* y, int64_t n) {
#ifdef __AVX512F__
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = detail::tail_mask(n - i);
    store(k, y + i, gelu_y(load(k, x + i)));
  }
#else
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_y(x[i]);
#endif
}

void gelu_bwd_block(const float* dy, const float* x, float* dx, int64_t n) {
#ifdef __AVX512F__
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = detail::tail_mask(n - i);
    store(k, dx + i, gelu_dx(load(k, dy + i), load(k, x + i)));
  }
#else
  for (int64_t i = 0; i < n; ++i) dx[i] = gelu_dx(dy[i], x[i]);
#endif
}

}  // namespace

// g (n), u (n) -> y (n) = g * s(g) * u
void swiglu_fwd(const float* g, const float* u, float* y, int64_t n) {
  for_blocks(n, kElemBlock,
             [&](int64_t i0, int64_t i1) { swiglu_fwd_block(g + i0, u + i0, y + i0, i1 - i0); });
}

// dy (n) -> dg (n), du (n)
void swiglu_bwd(const float* dy, const float* g, const float* u, float* dg, float* du, int64_t n) {
  for_blocks(n, kElemBlock, [&](int64_t i0, int64_t i1) {
    swiglu_bwd_block(dy + i0, g + i0, u + i0, dg + i0, du + i0, i1 - i0);
  });
}

// x (n) -> y (n) = x * s(2u), u = k*(x + c*x^3)
void gelu_fwd(const float* x, float* y, int64_t n) {
  for_blocks(n, kElemBlock,
             [&](int64_t i0, int64_t i1) { gelu_fwd_block(x + i0, y + i0, i1 - i0); });
}

// dy (n), x (n) -> dx (n)
void gelu_bwd(const float* dy, const float* x, float* dx, int64_t n) {
  for_blocks(n, kElemBlock,
             [&](int64_t i0, int64_t i1) { gelu_bwd_block(dy + i0, x + i0, dx + i0, i1 - i0); });
}

// bf16 variants: each thread converts a chunk to f32 on the stack, runs the f32 block kernel, and
// rounds the results back (nearest even). Chunks are fixed-size, so results do not depend on
// threads.
namespace {
constexpr int64_t kBf16Chunk = 2048;
void to_f32(const bf16* x, float* y, int64_t n) { detail::cast_bf16_f32_block(x, y, n); }
void to_bf16(const float* x, bf16* y, int64_t n) { detail::cast_f32_bf16_block(x, y, n); }
}  // namespace

void swiglu_fwd_bf16(const bf16* g, const bf16* u, bf16* y, int64_t n) {
  const int64_t chunks = (n + kBf16Chunk - 1) / kBf16Chunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    alignas(64) float fg[kBf16Chunk], fu[kBf16Chunk], fy[kBf16Chunk];
    const int64_t i0 = c * kBf16Chunk, m = std::min(kBf16Chunk, n - i0);
    to_f32(g + i0, fg, m);
    to_f32(u + i0, fu, m);
    swiglu_fwd_block(fg, fu, fy, m);
    to_bf16(fy, y + i0, m);
  }
}

void swiglu_bwd_bf16(const bf16* dy, const bf16* g, const bf16* u, bf16* dg, bf16* du, int64_t n) {
  const int64_t chunks = (n + kBf16Chunk - 1) / kBf16Chunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    alignas(64) float fdy[kBf16Chunk], fg[kBf16Chunk], fu[kBf16Chunk], fdg[kBf16Chunk],
        fdu[kBf16Chunk];
    const int64_t i0 = c * kBf16Chunk, m = std::min(kBf16Chunk, n - i0);
    to_f32(dy + i0, fdy, m);
    to_f32(g + i0, fg, m);
    to_f32(u + i0, fu, m);
    swiglu_bwd_block(fdy, fg, fu, fdg, fdu, m);
    to_bf16(fdg, dg + i0, m);
    to_bf16(fdu, du + i0, m);
  }
}

}  // namespace loom::kernels::cpu
