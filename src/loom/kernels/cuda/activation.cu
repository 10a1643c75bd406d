// Pointwise activation CUDA kernels: SwiGLU (f32, and bf16 storage with f32 arithmetic) and
// tanh-approximate GELU, forward and backward (kernels/cpu/activation.cc's twins).
//
// The same formulas as the CPU, through the logistic s(z) = 1/(1+e^-z) and never tanh:
// 0.5*(1 + tanh(u)) = s(2u) and 1 - tanh(u)^2 = 4 s(2u) (1-s(2u)), which stays accurate in
// relative terms where 1 + tanh(u) would cancel (x << 0). Does not fuse the gate/up split.
// Each kernel moves 4 elements per access when every pointer is so aligned (common.cuh's load4 /
// store4), then the tail one by one, with the same arithmetic per element.
// Invariant: elementwise (grid-stride over n); bf16 results are rounded to nearest even once.
#include <type_traits>

#include "loom/kernels/cuda/common.cuh"

namespace loom::kernels::cuda {

namespace {

constexpr float kGeluK = 0.79788456080286535588f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// y = g * s(g) * u
__device__ __forceinline__ float swiglu_y(float g, float u) { return g * sigmoid(g) * u; }

// dg = dy*u*s*(1 + g*(1-s)), du = dy*g*s
__device__ __forceinline__ void swiglu_grads(float dy, float g, float u, float* dg, float* du) {
  const float s = sigmoid(g);
  *dg = dy * u * (s * (1.0f + g * (1.0f - s)));
  *du = dy * (g * s);
}

// 2u = 2k*x*(1 + c*x^2)
__device__ __forceinline__ float gelu_2u(float x) {
  return (2.0f * kGeluK) * x * (kGeluC * x * x + 1.0f);
}

// y = x * s(2u)
__device__ __forceinline__ float gelu_y(float x) { return x * sigmoid(gelu_2u(x)); }

// dx = dy * (s + 2*x*s*(1-s)*du/dx), s = s(2u), du/dx = k*(1 + 3c*x^2)
__device__ __forceinline__ float gelu_dx(float dy, float x) {
  const float s = sigmoid(gelu_2u(x));
  const float dudx = kGeluK * ((3.0f * kGeluC) * x * x + 1.0f);
  return dy * (s + 2.0f * x * s * (1.0f - s) * dudx);
}

// The pointwise functions of two inputs, for binary_kernel.
struct SwigluY {
  __device__ float operator()(float g, float u) const { return swiglu_y(g, u); }
};
struct GeluDx {
  __device__ float operator()(float dy, float x) const { return gelu_dx(dy, x); }
};

// Elem is float or bf16 (loaded as f32, stored rounded to nearest even).
// kVec: elements [0, 4*(n/4)) 4 per access, then the tail; else one by one.
// y = F()(a, b), elementwise.
template <class Elem, bool kVec, class F>
__global__ void binary_kernel(const Elem* a, const Elem* b, Elem* y, int64_t n) {
  const F f;
  const int64_t n4 = kVec ? n / 4 : 0;
  for (int64_t i = grid_start(); i < n4; i += grid_step()) {
    const F4 x = load4(a, i), z = load4(b, i);
    F4 r;
    for (int j = 0; j < 4; ++j) r.v[j] = f(x.v[j], z.v[j]);
    store4(y, i, r);
  }
  for (int64_t i = 4 * n4 + grid_start(); i < n; i += grid_step())
    y[i] = from_f32<Elem>(f(to_f32(a[i]), to_f32(b[i])));
}

template <class Elem, bool kVec>
__global__ void swiglu_bwd_kernel(const Elem* dy, const Elem* g, const Elem* u, Elem* dg, Elem* du,
                                  int64_t n) {
  const int64_t n4 = kVec ? n / 4 : 0;
  for (int64_t i = grid_start(); i < n4; i += grid_step()) {
    const F4 d = load4(dy, i), a = load4(g, i), b = load4(u, i);
    F4 rg, ru;
    for (int j = 0; j < 4; ++j) swiglu_grads(d.v[j], a.v[j], b.v[j], &rg.v[j], &ru.v[j]);
    store4(dg, i, rg);
    store4(du, i, ru);
  }
  for (int64_t i = 4 * n4 + grid_start(); i < n; i += grid_step()) {
    float fdg, fdu;
    swiglu_grads(to_f32(dy[i]), to_f32(g[i]), to_f32(u[i]), &fdg, &fdu);
    dg[i] = from_f32<Elem>(fdg);
    du[i] = from_f32<Elem>(fdu);
  }
}

template <bool kVec>
__global__ void gelu_fwd_kernel(const float* x, float* y, int64_t n) {
  const int64_t n4 = kVec ? n / 4 : 0;
  for (int64_t i = grid_start(); i < n4; i += grid_step()) {
    F4 r = load4(x, i);
    for (float& v : r.v) v = gelu_y(v);
    store4(y, i, r);
  }
  for (int64_t i = 4 * n4 + grid_start(); i < n; i += grid_step()) y[i] = gelu_y(x[i]);
}

// Launches kernel<kVec = every pointer 4-element aligned> over n elements, 4 per thread when so.
template <class Elem, class... P>
void launch4(void (*vec)(P...), void (*one)(P...), std::initializer_list<const void*> ptrs,
             int64_t n, Stream s, std::type_identity_t<P>... args) {
  if (aligned(4 * int64_t(sizeof(Elem)), ptrs))
    vec<<<blocks_for((n + 3) / 4), kThreads, 0, s>>>(args...);
  else
    one<<<blocks_for(n), kThreads, 0, s>>>(args...);
}

}  // namespace

// g (n), u (n) -> y (n) = g * s(g) * u
void swiglu_fwd(const float* g, const float* u, float* y, int64_t n, Stream s) {
  launch4<float>(binary_kernel<float, true, SwigluY>, binary_kernel<float, false, SwigluY>,
                 {g, u, y}, n, s, g, u, y, n);
  check_launch("swiglu_fwd");
}

// dy, g, u (n) -> dg (n), du (n)
void swiglu_bwd(const float* dy, const float* g, const float* u, float* dg, float* du, int64_t n,
                Stream s) {
  launch4<float>(swiglu_bwd_kernel<float, true>, swiglu_bwd_kernel<float, false>,
                 {dy, g, u, dg, du}, n, s, dy, g, u, dg, du, n);
  check_launch("swiglu_bwd");
}

void swiglu_fwd_bf16(const bf16* g, const bf16* u, bf16* y, int64_t n, Stream s) {
  launch4<bf16>(binary_kernel<bf16, true, SwigluY>, binary_kernel<bf16, false, SwigluY>, {g, u, y},
                n, s, g, u, y, n);
  check_launch("swiglu_fwd_bf16");
}

void swiglu_bwd_bf16(const bf16* dy, const bf16* g, const bf16* u, bf16* dg, bf16* du, int64_t n,
                     Stream s) {
  launch4<bf16>(swiglu_bwd_kernel<bf16, true>, swiglu_bwd_kernel<bf16, false>, {dy, g, u, dg, du},
                n, s, dy, g, u, dg, du, n);
  check_launch("swiglu_bwd_bf16");
}

// x (n) -> y (n) = x * s(2u), u = k*(x + c*x^3)
void gelu_fwd(const float* x, float* y, int64_t n, Stream s) {
  launch4<float>(gelu_fwd_kernel<true>, gelu_fwd_kernel<false>, {x, y}, n, s, x, y, n);
  check_launch("gelu_fwd");
}

// dy (n), x (n) -> dx (n)
void gelu_bwd(const float* dy, const float* x, float* dx, int64_t n, Stream s) {
  launch4<float>(binary_kernel<float, true, GeluDx>, binary_kernel<float, false, GeluDx>,
                 {dy, x, dx}, n, s, dy, x, dx, n);
  check_launch("gelu_bwd");
}

}  // namespace loom::kernels::cuda
