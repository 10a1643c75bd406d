// AdamW (decoupled weight decay) update in place, and the gradient-clipping coefficient, as CUDA
// kernels (kernels/cpu/adamw.cc's twins, with the same f32 operations in the same order).
//
// adamw is one fused elementwise pass over p, g, m, v; the step's scalars (lr, the bias
// corrections) and the clipping scale are GPU tensors, read in the kernel, so a schedule can change
// them without the host. clip_coef is a single thread. Neither computes the gradient norm (that
// is sumsq of each gradient, added by the caller).
// Invariant: elementwise, so the result does not depend on the launch shape.
#include "loom/kernels/cuda/common.cuh"

namespace loom::kernels::cuda {

namespace {

// p, g, m, v (n); hyper (3) = {lr, bc1, bc2}; gscale (1)
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, const float* hyper,
                             const float* gscale, int64_t n, float beta1, float beta2, float eps,
                             float wd) {
  const float lr = hyper[0], bc1 = hyper[1], bc2 = hyper[2], gs = gscale[0];
  for (int64_t i = grid_start(); i < n; i += grid_step()) {
    const float gi = g[i] * gs;
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i];
    p[i] = pi - lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * pi);
  }
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
  adamw_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, g, m, v, hyper, gscale, n, beta1, beta2, eps,
                                                  wd);
  check_launch("adamw");
}

// total (1) -> norm (1) = sqrt(total); coef (1) = min(1, max_norm / (norm + 1e-6)), or 1 when
// max_norm <= 0 (clipping off). f32 throughout, as torch computes it.
void clip_coef(const float* total, float* coef, float* norm, float max_norm, Stream s) {
  clip_coef_kernel<<<1, 1, 0, s>>>(total, coef, norm, max_norm);
  check_launch("clip_coef");
}

}  // namespace loom::kernels::cuda
