// AdamW (decoupled weight decay) update in place, and the gradient-clipping coefficient, as CUDA
// kernels (kernels/cpu/adamw.cc's twins, with the same f32 operations in the same order).
//
// adamw is one fused elementwise pass over p, g, m, v; the step's scalars (lr, the bias
// corrections) and the clipping scale are GPU tensors, read in the kernel, so a schedule can change
// them without the host. clip_coef is a single thread. Neither computes the gradient norm (that
// is sumsq of each gradient, added by the caller).
// Invariant: elementwise, so the result does not depend on the launch shape (nor on whether 4
// elements move per access).
#include "loom/kernels/cuda/common.cuh"

namespace loom::kernels::cuda {

namespace {

struct AdamW {
  float lr, bc1, bc2, gs, beta1, beta2, eps, wd;
  // one element: p, m, v updated from g
  __device__ __forceinline__ void operator()(float& p, float g, float& m, float& v) const {
    const float gi = g * gs;
    m = beta1 * m + (1.0f - beta1) * gi;
    v = beta2 * v + (1.0f - beta2) * gi * gi;
    p = p - lr * ((m / bc1) / (sqrtf(v / bc2) + eps) + wd * p);
  }
};

// p, g, m, v (n); hyper (3) = {lr, bc1, bc2}; gscale (1). kWide: 4 elements per access (every
// pointer 16-byte aligned), then the tail one by one.
template <bool kWide>
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, const float* hyper,
                             const float* gscale, int64_t n, float beta1, float beta2, float eps,
                             float wd) {
  const AdamW op{hyper[0], hyper[1], hyper[2], gscale[0], beta1, beta2, eps, wd};
  int64_t done = 0;
  if constexpr (kWide) {
    done = n / 4 * 4;
    for (int64_t i = grid_start(); i < n / 4; i += grid_step()) {
      float4 pi = reinterpret_cast<float4*>(p)[i], mi = reinterpret_cast<float4*>(m)[i],
             vi = reinterpret_cast<float4*>(v)[i];
      const float4 gi = reinterpret_cast<const float4*>(g)[i];
      op(pi.x, gi.x, mi.x, vi.x);
      op(pi.y, gi.y, mi.y, vi.y);
      op(pi.z, gi.z, mi.z, vi.z);
      op(pi.w, gi.w, mi.w, vi.w);
      reinterpret_cast<float4*>(p)[i] = pi;
      reinterpret_cast<float4*>(m)[i] = mi;
      reinterpret_cast<float4*>(v)[i] = vi;
    }
  }
  for (int64_t i = done + grid_start(); i < n; i += grid_step()) op(p[i], g[i], m[i], v[i]);
}

// total (1) -> norm (1), coef (1)
__global__ void clip_coef_kernel(const float* total, float* coef, float* norm, float max_norm) {
  const float nrm = sqrtf(total[0]);
  norm[0] = nrm;
  coef[0] = max_norm > 0.0f ? fminf(1.0f, max_norm / (nrm + 1e-6f)) : 1.0f;
}

}  // namespace

// p, g, m, v (n); hyper (3) = {lr, 1 - beta1^t, 1 - beta2^t}; gscale (1).
//   g' = g*gscale;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2
//   p -= lr * ((m/bc1) / (sqrt(v/bc2) + eps) + wd*p)
void adamw(float* p, const float* g, float* m, float* v, const float* hyper, const float* gscale,
           int64_t n, float beta1, float beta2, float eps, float wd, Stream s) {
  if (n <= 0) return;
  if (aligned(16, {p, g, m, v}))
    adamw_kernel<true><<<blocks_for((n + 3) / 4), kThreads, 0, s>>>(p, g, m, v, hyper, gscale, n,
                                                                    beta1, beta2, eps, wd);
  else
    adamw_kernel<false>
        <<<blocks_for(n), kThreads, 0, s>>>(p, g, m, v, hyper, gscale, n, beta1, beta2, eps, wd);
  check_launch("adamw");
}

// total (1) -> norm (1) = sqrt(total); coef (1) = min(1, max_norm / (norm + 1e-6)), or 1 when
// max_norm <= 0 (clipping off). f32 throughout, as torch computes it.
void clip_coef(const float* total, float* coef, float* norm, float max_norm, Stream s) {
  clip_coef_kernel<<<1, 1, 0, s>>>(total, coef, norm, max_norm);
  check_launch("clip_coef");
}

}  // namespace loom::kernels::cuda
