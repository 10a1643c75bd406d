// AdamW (decoupled weight decay) update in place, and the gradient-clipping coefficient.
//
// adamw is one fused elementwise pass over p, g, m, v in f32; the step's scalars (lr and the bias
// corrections) arrive as a tensor so a schedule can change them without rebuilding the program.
// clip_coef turns the summed squared gradient norm into torch.nn.utils.clip_grad_norm_'s
// coefficient. Neither computes the norm (that is sumsq of each gradient, added by the caller).
// Invariant: elementwise, so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "loom/kernels/cpu/kernel_util.h"
#include "loom/kernels/cpu/kernels.h"

namespace loom::kernels::cpu {

namespace {

// The scalars of one step.
struct Step {
  float lr, bc1, bc2, gscale, beta1, beta2, eps, wd;
};

// p, g, m, v (n): one AdamW step on a block.
void adamw_block(float* p, const float* g, float* m, float* v, int64_t n, Step s) {
  int64_t i = 0;
#ifdef __AVX512F__
  // Intrinsics because std::sqrt keeps a scalar errno path that stops auto-vectorisation (without
  // -fno-math-errno). The same operations in the same order as the scalar loop below, which takes
  // the tail; which elements form the tail is fixed by the block size, not by the thread count.
  const __m512 gs = _mm512_set1_ps(s.gscale), b1 = _mm512_set1_ps(s.beta1);
  const __m512 b2 = _mm512_set1_ps(s.beta2), a1 = _mm512_set1_ps(1.0f - s.beta1);
  const __m512 a2 = _mm512_set1_ps(1.0f - s.beta2), bc1 = _mm512_set1_ps(s.bc1);
  const __m512 bc2 = _mm512_set1_ps(s.bc2), eps = _mm512_set1_ps(s.eps);
  const __m512 wd = _mm512_set1_ps(s.wd), lr = _mm512_set1_ps(s.lr);
  for (; i + 16 <= n; i += 16) {
    const __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), gs);
    const __m512 mi =
        _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(a1, gi));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
                                    _mm512_mul_ps(_mm512_mul_ps(a2, gi), gi));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    const __m512 pi = _mm512_loadu_ps(p + i);
    // maskz_ with all lanes: plain vsqrtps without gcc 12's -Wmaybe-uninitialized in the header.
    const __m512 den = _mm512_add_ps(_mm512_maskz_sqrt_ps(0xffff, _mm512_div_ps(vi, bc2)), eps);
    const __m512 upd =
        _mm512_add_ps(_mm512_div_ps(_mm512_div_ps(mi, bc1), den), _mm512_mul_ps(wd, pi));
    _mm512_storeu_ps(p + i, _mm512_sub_ps(pi, _mm512_mul_ps(lr, upd)));
  }
#endif
  for (; i < n; ++i) {
    const float gi = g[i] * s.gscale;
    const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * gi;
    const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= s.lr * ((mi / s.bc1) / (std::sqrt(vi / s.bc2) + s.eps) + s.wd * p[i]);
  }
}

}  // namespace

// p, g, m, v (n); hyper (3) = {lr, 1 - beta1^t, 1 - beta2^t}; gscale (1).
//   g' = g*gscale;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2
//   p -= lr * ((m/bc1) / (sqrt(v/bc2) + eps) + wd*p)
void adamw(float* p, const float* g, float* m, float* v, const float* hyper, const float* gscale,
           int64_t n, float beta1, float beta2, float eps, float wd) {
  const Step s{hyper[0], hyper[1], hyper[2], gscale[0], beta1, beta2, eps, wd};
  detail::for_blocks(n, detail::kElemBlock, [&](int64_t i0, int64_t i1) {
    adamw_block(p + i0, g + i0, m + i0, v + i0, i1 - i0, s);
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
