// AdamW (decoupled weight decay) update in place, and the gradient-clipping coefficient.
//
// adamw is one fused elementwise pass over p, g, m, v in f32; the step's scalars (lr and the bias
// corrections) arrive as a tensor so a schedule can change them without rebuilding the program.
// clip_coef turns the summed squared gradient norm into torch.nn.utils.clip_grad_norm_'s coefficient.
// Neither computes the norm itself (that is sumsq over each gradient, added up by the caller).
// Invariant: elementwise, so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

// p, g, m, v (n); hyper (3) = {lr, 1 - beta1^t, 1 - beta2^t}; gscale (1).
//   g' = g*gscale;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2
//   p -= lr * ((m/bc1) / (sqrt(v/bc2) + eps) + wd*p)
void adamw(float* p, const float* g, float* m, float* v, const float* hyper, const float* gscale,
           int64_t n, float beta1, float beta2, float eps, float wd) {
  const float lr = hyper[0], bc1 = hyper[1], bc2 = hyper[2];
  const float gs = gscale[0];
  // One element; also the tail and the non-AVX-512 build.
  auto step = [&](int64_t i) {
    const float gi = g[i] * gs;
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * ((mi / bc1) / (std::sqrt(vi / bc2) + eps) + wd * p[i]);
  };
  detail::for_blocks(n, detail::kElemBlock, [&](int64_t i0, int64_t i1) {
    int64_t i = i0;
#ifdef __AVX512F__
    // Intrinsics because std::sqrt keeps a scalar errno path that stops auto-vectorisation (without
    // -fno-math-errno). Same operations in the same order as step(); the tail of each block is fixed
    // by the block size, so which elements take which path never depends on the thread count.
    const __m512 vgs = _mm512_set1_ps(gs), vb1 = _mm512_set1_ps(beta1), vb2 = _mm512_set1_ps(beta2);
    const __m512 va1 = _mm512_set1_ps(1.0f - beta1), va2 = _mm512_set1_ps(1.0f - beta2);
    const __m512 vbc1 = _mm512_set1_ps(bc1), vbc2 = _mm512_set1_ps(bc2);
    const __m512 veps = _mm512_set1_ps(eps), vwd = _mm512_set1_ps(wd), vlr = _mm512_set1_ps(lr);
    for (; i + 16 <= i1; i += 16) {
      const __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), vgs);
      const __m512 mi = _mm512_add_ps(_mm512_mul_ps(vb1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(va1, gi));
      const __m512 vi = _mm512_add_ps(_mm512_mul_ps(vb2, _mm512_loadu_ps(v + i)),
                                      _mm512_mul_ps(_mm512_mul_ps(va2, gi), gi));
      _mm512_storeu_ps(m + i, mi);
      _mm512_storeu_ps(v + i, vi);
      const __m512 pi = _mm512_loadu_ps(p + i);
      const __m512 den = _mm512_add_ps(_mm512_maskz_sqrt_ps(0xffff, _mm512_div_ps(vi, vbc2)), veps);
      const __m512 upd = _mm512_add_ps(_mm512_div_ps(_mm512_div_ps(mi, vbc1), den), _mm512_mul_ps(vwd, pi));
      _mm512_storeu_ps(p + i, _mm512_sub_ps(pi, _mm512_mul_ps(vlr, upd)));
    }
#endif
    for (; i < i1; ++i) step(i);
  });
}

// total (1) -> norm (1) = sqrt(total); coef (1) = min(1, max_norm / (norm + 1e-6)), or 1 when
// max_norm <= 0 (clipping off). f32 throughout, as torch computes it.
void clip_coef(const float* total, float* coef, float* norm, float max_norm) {
  const float nrm = std::sqrt(total[0]);
  norm[0] = nrm;
  coef[0] = max_norm > 0.0f ? std::min(1.0f, max_norm / (nrm + 1e-6f)) : 1.0f;
}

}  // namespace loom::kernels::cpu
